"""`akosim calibrate --netns-rate RATE`: the goodput fraction of a real tc-shaped link.

Two network namespaces joined by a veth pair, each end's egress shaped by
`tc tbf` to RATE (what the netns testbed does per node). One bulk TCP
connection runs each way at once (both directions loaded, so the ACKs of one
direction share the line with the data of the other, as in an all-to-all
round); each receiver counts the bytes that arrive during a window after a
warm-up. The goodput fraction is the received rate over RATE, averaged over
both directions: `TcpParameters.measured_goodput_fraction`.

Needs root and the `ip` and `tc` commands; names carry this process's id, and
everything created is deleted in a finally block. The two ends run as
``ip netns exec NS python -c ...`` children (this module's `_PEER` script).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass

from akocore.cli_support import UsageError

ADDRESS_A, ADDRESS_B = "10.213.77.1", "10.213.77.2"
PORT = 5201
WARMUP_S = 1.0
STARTUP_TIMEOUT_S = 30.0

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
    if os.geteuid() != 0:
        return "needs root (network namespaces and tc)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"needs the {tool} command (iproute2)"
    return None


def _run(*command: str) -> None:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise UsageError(f"--netns-rate: {' '.join(command)} failed: "
                         f"{(done.stderr.strip().splitlines() or ['?'])[-1]}")


def measure_shaped_goodput(rate_bps: float, measure_s: float = 3.0) -> ShapedGoodput:
    """Goodput / rate of one connection each way over a tbf-shaped veth pair."""
    why = netns_available()
    if why is not None:
        raise UsageError(f"--netns-rate: {why}")
    tag = f"tcpm{os.getpid() % 100000}"
    ns_a, ns_b, veth_a, veth_b = f"{tag}a", f"{tag}b", f"{tag}x", f"{tag}y"
    burst_bytes = max(32 * 1024, int(rate_bps / 8 / 100))  # >= 10 ms at the rate
    children: list[subprocess.Popen[str]] = []
    try:
        _run("ip", "netns", "add", ns_a)
        _run("ip", "netns", "add", ns_b)
        _run("ip", "link", "add", veth_a, "type", "veth", "peer", "name", veth_b)
        _run("ip", "link", "set", veth_a, "netns", ns_a)
        _run("ip", "link", "set", veth_b, "netns", ns_b)
        for ns, dev, address in ((ns_a, veth_a, ADDRESS_A), (ns_b, veth_b, ADDRESS_B)):
            _run("ip", "-n", ns, "addr", "add", f"{address}/24", "dev", dev)
            _run("ip", "-n", ns, "link", "set", dev, "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            _run("tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf", "rate",
                 f"{int(rate_bps)}bit", "burst", str(burst_bytes), "latency", "100ms")

        def peer(ns: str, *args: str) -> subprocess.Popen[str]:
            child = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", _PEER,
                                      *args], stdout=subprocess.PIPE, text=True)
            children.append(child)
            return child

        span = f"{measure_s}"
        sinks = [peer(ns_b, "sink", str(PORT), str(WARMUP_S), span),
                 peer(ns_a, "sink", str(PORT), str(WARMUP_S), span)]
        for sink in sinks:
            assert sink.stdout is not None
            if sink.stdout.readline().strip() != "ready":
                raise UsageError("--netns-rate: a probe end did not start")
        seconds = str(WARMUP_S + measure_s + 2.0)
        sources = [peer(ns_a, "source", ADDRESS_B, str(PORT), seconds),
                   peer(ns_b, "source", ADDRESS_A, str(PORT), seconds)]
        fractions = []
        for sink in sinks:
            out, _ = sink.communicate(timeout=WARMUP_S + measure_s + STARTUP_TIMEOUT_S)
            figures = json.loads(out.strip().splitlines()[-1])
            if figures["seconds"] <= 0:
                raise UsageError("--netns-rate: no traffic measured")
            fractions.append(figures["bytes"] * 8 / figures["seconds"] / rate_bps)
        for source in sources:
            source.wait(timeout=STARTUP_TIMEOUT_S)
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
        for ns in (ns_a, ns_b):  # deleting a namespace deletes its veth end
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    a_to_b, b_to_a = fractions
    return ShapedGoodput(rate_bps, min((a_to_b + b_to_a) / 2, 1.0), (a_to_b, b_to_a))
