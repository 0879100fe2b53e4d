"""`akosim calibrate --netns-rate RATE`: the goodput fraction of a real tc-shaped link.

Two network namespaces joined by a veth pair, each end's egress shaped by
`tc tbf` to RATE (what the netns testbed does per node). One bulk TCP
connection runs each way at once (both directions loaded, so the ACKs of one
direction share the line with the data of the other, as in an all-to-all
round); each receiver counts the bytes that arrive during a window after a
warm-up. The goodput fraction is the received rate over RATE, averaged over
both directions (the median of three passes): `TcpParameters.
measured_goodput_fraction`.

`measure_flow_sharing` shapes the pair as the netns testbed shapes a node
(htb, drop-tail bfifo of 100 ms) and runs an all-to-all's round pattern
through it: k = 1..4 connections each way, each sending one message at the
same instant every round, the next round when all are answered. What k flows
carry over what one flow carries is `TcpParameters.flow_sharing_efficiency`.

Needs root and the `ip` and `tc` commands; the commands are the testbed's own
(akocore.hosttools); names carry this process's id, and everything created is
deleted in a finally block. The two ends run as
``ip netns exec NS python -c ...`` children (this module's `_PEER` script).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from akocore.cli_support import UsageError
from akocore.hosttools.netns_commands import (
    address_up,
    missing_requirements,
    namespace_add,
    namespace_delete,
    veth_pair,
)
from akocore.hosttools.shaping import egress_tree, tbf_root

ADDRESS_A, ADDRESS_B = "10.213.77.1", "10.213.77.2"
PORT = 5201
WARMUP_S = 1.0
STARTUP_TIMEOUT_S = 30.0
MAX_FLOWS = 4  # the most flows one port of the testbed carries at once (4 workers)
ROUND_MESSAGE_BYTES = 512 * 1024  # one message per flow per round (a fixed probe size)
ROUNDS = 8  # per pass
PASSES = 3

# sink PORT WARMUP MEASURE: print "ready", accept one connection, count the bytes received
# from WARMUP s after the first byte for MEASURE s, print {"bytes": B, "seconds": S}.
# source HOST PORT SECONDS: send zeros for SECONDS.
_PEER = r"""
import json, socket, sys, time
mode = sys.argv[1]
if mode == "sink":
    port, warm, span = int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", port)); server.listen(1)
    print("ready", flush=True)
    conn, _ = server.accept()
    buf = bytearray(1 << 20)
    first = None; counted = 0; start = end = None
    while True:
        n = conn.recv_into(buf)
        if not n:
            break
        now = time.perf_counter()
        if first is None:
            first = now
        if start is None and now - first >= warm:
            start = now
        elif start is not None:
            counted += n
            end = now
            if now - start >= span:
                break
    print(json.dumps({"bytes": counted, "seconds": (end - start) if end else 0.0}), flush=True)
elif mode == "round-sink":
    import threading
    port, flows, size, rounds = (int(x) for x in sys.argv[2:6])
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", port)); server.listen(flows)
    print("ready", flush=True)
    conns = [server.accept()[0] for _ in range(flows)]
    def serve(conn):
        buf = bytearray(1 << 20)
        for _ in range(rounds):
            got = 0
            while got < size:
                n = conn.recv_into(buf, min(len(buf), size - got))
                if not n:
                    return
                got += n
            conn.sendall(b"k")
    threads = [threading.Thread(target=serve, args=(c,)) for c in conns]
    for t in threads: t.start()
    for t in threads: t.join()
    print("{}", flush=True)
elif mode == "round-source":
    import threading
    host, (port, flows, size, rounds) = sys.argv[2], (int(x) for x in sys.argv[3:7])
    conns = [socket.create_connection((host, port)) for _ in range(flows)]
    for c in conns:
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    payload = bytes(size)
    start, done = threading.Barrier(flows + 1), threading.Barrier(flows + 1)
    def send(conn):
        for _ in range(rounds):
            start.wait(); conn.sendall(payload); conn.recv(1); done.wait()
    threads = [threading.Thread(target=send, args=(c,)) for c in conns]
    for t in threads: t.start()
    times = []
    for _ in range(rounds):
        began = time.perf_counter(); start.wait(); done.wait()
        times.append(time.perf_counter() - began)
    for t in threads: t.join()
    print(json.dumps({"round_s": times}), flush=True)
else:
    host, port, seconds = sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    sock = socket.create_connection((host, port))
    chunk = bytes(1 << 16); stop = time.perf_counter() + seconds
    try:
        while time.perf_counter() < stop:
            sock.sendall(chunk)
    except OSError:
        pass
"""


@dataclass(frozen=True)
class ShapedGoodput:
    rate_bps: float
    fraction: float  # mean of both directions
    fractions: tuple[float, float]  # a -> b, b -> a


def netns_available() -> str | None:
    """None when the probe can run here, else why not (one line)."""
    return missing_requirements(os.geteuid(), lambda tool: shutil.which(tool) is not None)


def _run(command: tuple[str, ...]) -> None:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise UsageError(f"--netns-rate: {' '.join(command)} failed: "
                         f"{(done.stderr.strip().splitlines() or ['?'])[-1]}")


@contextmanager
def _shaped_pair(rate_bps: float, testbed_queues: bool) -> Iterator[tuple[str, str]]:
    """Two namespaces joined by a veth pair, each end's egress shaped to `rate_bps`:
    tc tbf, or with `testbed_queues` the netns testbed's tree for an uplink
    (akocore.hosttools.shaping.egress_tree: htb root and default leaf, burst 1 ms at the
    rate and at least two frames, a drop-tail bfifo of 100 ms at the rate and at least
    128 KiB). Yields the namespace names; deletes both on exit."""
    why = netns_available()
    if why is not None:
        raise UsageError(f"--netns-rate: {why}")
    tag = f"tcpm{os.getpid() % 100000}"
    ns_a, ns_b, veth_a, veth_b = f"{tag}a", f"{tag}b", f"{tag}x", f"{tag}y"
    try:
        _run(namespace_add(ns_a))
        _run(namespace_add(ns_b))
        _run(veth_pair(veth_a, ns_a, veth_b, ns_b))
        for ns, dev, address in ((ns_a, veth_a, ADDRESS_A), (ns_b, veth_b, ADDRESS_B)):
            for command in address_up(ns, dev, address):
                _run(command)
            for command in (egress_tree(ns, dev, rate_bps) if testbed_queues
                            else [tbf_root(ns, dev, rate_bps)]):
                _run(command)
        yield ns_a, ns_b
    finally:
        for ns in (ns_a, ns_b):  # deleting a namespace deletes its veth end
            subprocess.run(namespace_delete(ns), capture_output=True)


class _Peers:
    """The probe's children (this module's `_PEER` script inside a namespace)."""

    def __init__(self) -> None:
        self.children: list[subprocess.Popen[str]] = []

    def start(self, ns: str, *args: str) -> subprocess.Popen[str]:
        child = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", _PEER,
                                  *args], stdout=subprocess.PIPE, text=True)
        self.children.append(child)
        return child

    @staticmethod
    def ready(child: subprocess.Popen[str]) -> None:
        assert child.stdout is not None
        if child.stdout.readline().strip() != "ready":
            raise UsageError("--netns-rate: a probe end did not start")

    def close(self) -> None:
        for child in self.children:
            if child.poll() is None:
                child.kill()
                child.wait()
        self.children.clear()


def _bulk_both_ways(peers: _Peers, ns_a: str, ns_b: str, rate_bps: float, measure_s: float,
                    port: int) -> tuple[float, float]:
    """Goodput / rate of one bulk connection each way at once: (a -> b, b -> a)."""
    span = f"{measure_s}"
    sinks = [peers.start(ns_b, "sink", str(port), str(WARMUP_S), span),
             peers.start(ns_a, "sink", str(port), str(WARMUP_S), span)]
    for sink in sinks:
        peers.ready(sink)
    seconds = str(WARMUP_S + measure_s + 2.0)
    sources = [peers.start(ns_a, "source", ADDRESS_B, str(port), seconds),
               peers.start(ns_b, "source", ADDRESS_A, str(port), seconds)]
    fractions = []
    for sink in sinks:
        out, _ = sink.communicate(timeout=WARMUP_S + measure_s + STARTUP_TIMEOUT_S)
        figures = json.loads(out.strip().splitlines()[-1])
        if figures["seconds"] <= 0:
            raise UsageError("--netns-rate: no traffic measured")
        fractions.append(figures["bytes"] * 8 / figures["seconds"] / rate_bps)
    for source in sources:
        source.wait(timeout=STARTUP_TIMEOUT_S)
    return fractions[0], fractions[1]


def measure_shaped_goodput(rate_bps: float, measure_s: float = 3.0,
                           passes: int = PASSES) -> ShapedGoodput:
    """Goodput / rate of one connection each way over a tbf-shaped veth pair: the pass
    with the median mean of `passes` (a starved probe process on a loaded host reads
    low once in a while)."""
    peers = _Peers()
    results = []
    with _shaped_pair(rate_bps, testbed_queues=False) as (ns_a, ns_b):
        try:
            for attempt in range(passes):
                results.append(_bulk_both_ways(peers, ns_a, ns_b, rate_bps, measure_s,
                                               PORT + 100 + attempt))
                peers.close()
        finally:
            peers.close()
    a_to_b, b_to_a = sorted(results, key=sum)[len(results) // 2]
    return ShapedGoodput(rate_bps, min((a_to_b + b_to_a) / 2, 1.0), (a_to_b, b_to_a))


@dataclass(frozen=True)
class FlowSharing:
    """k connections through one shaped port, each moving one message per round."""

    rate_bps: float
    message_bytes: int
    rounds: int  # per pass
    passes: int
    carried_fractions: tuple[float, ...]  # k = 1, 2, ...: k x message bits / rate / round

    @property
    def efficiencies(self) -> tuple[float, ...]:
        """What k competing flows carry over what one flow carries in the same pattern
        (1 for k = 1: a single flow's goodput is the goodput fraction's business)."""
        one = self.carried_fractions[0]
        return tuple(min(1.0, c / one) for c in self.carried_fractions)


def _round_pattern(peers: _Peers, ns_a: str, ns_b: str, rate_bps: float, flows: int,
                   message_bytes: int, rounds: int, port: int) -> float:
    """The carried fraction of `flows` connections each way, one message per round."""
    figures = (str(flows), str(message_bytes), str(rounds + 2))
    sinks = [peers.start(ns_b, "round-sink", str(port), *figures),
             peers.start(ns_a, "round-sink", str(port), *figures)]
    for sink in sinks:
        peers.ready(sink)
    sources = [peers.start(ns_a, "round-source", ADDRESS_B, str(port), *figures),
               peers.start(ns_b, "round-source", ADDRESS_A, str(port), *figures)]
    fractions = []
    for source in sources:
        out, _ = source.communicate(timeout=STARTUP_TIMEOUT_S + 60 * rounds)
        times = json.loads(out.strip().splitlines()[-1])["round_s"][2:]
        fractions.append(flows * message_bytes * 8 / rate_bps / statistics.median(times))
    peers.close()
    return sum(fractions) / len(fractions)


def measure_flow_sharing(rate_bps: float, max_flows: int = MAX_FLOWS,
                         message_bytes: int = ROUND_MESSAGE_BYTES, rounds: int = ROUNDS,
                         passes: int = PASSES) -> FlowSharing:
    """The round pattern of an all-to-all through one port shaped as the testbed does:
    k = 1..`max_flows` connections from one namespace to the other (and as many back,
    both directions loaded), each sending `message_bytes` at the same instant every
    round and the next round when all are answered. A round's carried fraction is
    k x message bits over the rate and the round's wall time (median over `rounds`,
    two more first: connection warm-up); the k = 1..max_flows sequence runs `passes`
    times, so every k sees the same machine load, and each k keeps its median."""
    peers = _Peers()
    carried: list[list[float]] = [[] for _ in range(max_flows)]
    with _shaped_pair(rate_bps, testbed_queues=True) as (ns_a, ns_b):
        try:
            port = PORT
            for _ in range(passes):
                for flows in range(1, max_flows + 1):
                    port += 1
                    carried[flows - 1].append(_round_pattern(
                        peers, ns_a, ns_b, rate_bps, flows, message_bytes, rounds, port))
        finally:
            peers.close()
    return FlowSharing(rate_bps, message_bytes, rounds, passes,
                       tuple(statistics.median(c) for c in carried))
