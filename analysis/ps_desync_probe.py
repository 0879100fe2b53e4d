"""Why asynchronous PS workers drift apart on the netns testbed: a raw-TCP twin.

The twin has akorun's async PS round at s = 0 and nothing else: each worker
computes (a sleep), pushes one message of `--message-bytes` to the server on a
persistent connection, and waits for the server's answer of the same size
(the parameters) before its next round; the server answers every push as soon
as it has arrived, on a thread per worker (no ordering between workers). Every
worker starts round 0 at the same instant (a shared CLOCK_MONOTONIC deadline),
so any drift comes from the network. The nodes are the testbed's (akorun's
NetnsTestbed and plan_shaping: htb uplink and downlink per node, drop-tail
bfifo leaves of 100 ms).

Variants isolate the cause: `--server-queue per-worker` gives the server's
uplink one htb leaf (and bfifo) per worker, so its answers to different
workers are served round robin instead of from one shared drop-tail queue;
`--cc` sets the TCP congestion control in every namespace. `--share` instead
measures how two messages share one queue (one sender to two receivers, and
two senders to one), the second started an offset after the first.
Prints one JSON record: per-worker round times, the phase gap between
workers' answer arrivals, and how much of each round two answers overlapped.

Needs root, `ip` and `tc`; every name carries this process's id, and the
namespaces are deleted in a finally block. One command reruns the evidence
of docs/design/ps-desync.md: ``sudo python -m analysis.ps_desync_probe --all``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, replace

import numpy as np

from akocore.hosttools.shaping import burst_bytes, plan_shaping, queue_limit_bytes
from akocore.settings.schema import NetworkConfig
from akorun.launching.testbed.delayline import DelaySchedule
from akorun.launching.testbed.delaypath import DelayLineProcess, RankPort, plan_delay_path
from akorun.launching.testbed.netns import (
    SUBNET,
    SUBNET_PREFIX,
    NetnsTestbed,
    TestbedNames,
    missing_requirements,
)

PORT = 7171
START_DELAY_S = 1.5

# server N_WORKERS BYTES: answer each push of BYTES with BYTES, a thread per worker.
# worker HOST BYTES ROUNDS COMPUTE_S START_AT: the round loop; prints a JSON list of
# [push_start, answer_done] monotonic times per round.
_PEER = r"""
import json, socket, sys, threading, time
def recv_exact(sock, n, buf):
    view = memoryview(buf); got = 0
    while got < n:
        k = sock.recv_into(view[got:n])
        if not k:
            raise EOFError
        got += k
mode = sys.argv[1]
if mode == "server":
    workers, size = int(sys.argv[2]), int(sys.argv[3])
    listener = socket.socket(); listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("0.0.0.0", int(sys.argv[4]))); listener.listen(workers)
    print("ready", flush=True)
    payload = bytes(size)
    def serve(conn):
        buf = bytearray(size)
        try:
            while True:
                recv_exact(conn, size, buf)
                conn.sendall(payload)
        except (EOFError, OSError):
            pass
    threads = []
    for _ in range(workers):
        conn, _ = listener.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        t = threading.Thread(target=serve, args=(conn,)); t.start(); threads.append(t)
    for t in threads:
        t.join()
elif mode == "worker":
    host, size, rounds = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    compute_s, start_at, port = float(sys.argv[5]), float(sys.argv[6]), int(sys.argv[7])
    sock = socket.create_connection((host, port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    payload = bytes(size); buf = bytearray(size); times = []
    while time.monotonic() < start_at:
        time.sleep(0.0005)
    for _ in range(rounds):
        time.sleep(compute_s)
        pushed = time.monotonic()
        sock.sendall(payload)
        recv_exact(sock, size, buf)
        times.append([pushed, time.monotonic()])
    print(json.dumps(times), flush=True)
elif mode == "sink":  # sink PORT CONNECTIONS BYTES: arrival time of every message, per sender
    conns, size = int(sys.argv[3]), int(sys.argv[4])
    listener = socket.socket(); listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("0.0.0.0", int(sys.argv[2]))); listener.listen(conns)
    print("ready", flush=True)
    done = {}
    def drain(conn, who):
        buf = bytearray(size); done[who] = []
        try:
            while True:
                recv_exact(conn, size, buf); done[who].append(time.monotonic())
        except (EOFError, OSError):
            pass
    threads = []
    for _ in range(conns):
        conn, addr = listener.accept()
        t = threading.Thread(target=drain, args=(conn, addr[0])); t.start(); threads.append(t)
    for t in threads:
        t.join()
    print(json.dumps(done), flush=True)
else:  # source BYTES SCHEDULE: [[host, port, start_at], ...], one connection per host
    size, schedule = int(sys.argv[2]), json.loads(sys.argv[3])
    socks = {}
    for host, port, _ in schedule:
        if host not in socks:
            socks[host] = socket.create_connection((host, port))
    payload = bytes(size)
    def send(sock, at):
        while time.monotonic() < at:
            time.sleep(0.0002)
        sock.sendall(payload)
    threads = [threading.Thread(target=send, args=(socks[h], at)) for h, _, at in schedule]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for sock in socks.values():
        sock.close()
"""


def _testbed_up(names: TestbedNames, nodes: int, rate_bps: float,
                one_way_s: float) -> tuple[NetnsTestbed, DelayLineProcess | None]:
    """The testbed's namespaces and tc plan for `nodes` at `rate_bps`; with `one_way_s`
    > 0 the hub routes every packet through the testbed's delay line (as `akorun launch
    --testbed netns --latency`), which the caller stops."""
    testbed = NetnsTestbed(names)
    line = None
    try:
        testbed.up(bridged=one_way_s <= 0)
        if one_way_s > 0:
            ports = [RankPort(rank=r, namespace=names.namespace(r), device=names.device(r),
                              hub_port=names.bridge_port(r), address=names.address(r))
                     for r in range(nodes)]
            plan = plan_delay_path(names.hub, names.tun, ports, SUBNET, SUBNET_PREFIX)
            testbed.apply(plan.before_line)
            matrix = [[0.0 if i == j else one_way_s for j in range(nodes)]
                      for i in range(nodes)]
            line = DelayLineProcess(names.hub, names.tun, DelaySchedule.from_matrix(
                [names.address(r) for r in range(nodes)], matrix, 0.0))
            line.start()
            testbed.apply(plan.after_line)
        testbed.apply(plan_shaping(NetworkConfig(bandwidth_bps=(rate_bps,)),
                                   [names.node(r) for r in range(nodes)],
                                   downlink=True).commands)
    except BaseException:
        if line is not None:
            line.stop()
        testbed.down()
        raise
    return testbed, line


def _start_peer(names: TestbedNames, children: list[subprocess.Popen[str]], rank: int,
                *args: str) -> subprocess.Popen[str]:
    """Start the probe's peer script in rank's namespace; `children` keeps it for cleanup."""
    child = subprocess.Popen(["ip", "netns", "exec", names.namespace(rank),
                              sys.executable, "-c", _PEER, *args],
                             stdout=subprocess.PIPE, text=True)
    children.append(child)
    return child


@dataclass(frozen=True)
class TwinResult:
    label: str
    round_time_s: tuple[float, ...]  # per worker, mean of rounds after the first 10%
    answer_gap_s: tuple[float, ...]  # per round: spread of the workers' answer arrivals
    overlap_fraction: float  # of answer time, the share while another answer was under way
    push_start_s: tuple[tuple[float, ...], ...]  # per worker, relative to the shared start
    # packets dropped by the server's uplink qdiscs (its answers) and downlink (pushes)
    server_drops: tuple[int, int] = (0, 0)

    def to_json(self) -> dict[str, object]:
        return {"label": self.label, "round_time_s": list(self.round_time_s),
                "answer_gap_s": list(self.answer_gap_s),
                "overlap_fraction": self.overlap_fraction,
                "server_drops": list(self.server_drops),
                "push_start_s": [list(x) for x in self.push_start_s]}


def _sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, text=True)


def _per_worker_leaf(namespace: str, device: str, address: str, *, classid: str,
                     rate_bps: float, leaves: int) -> None:
    """An htb leaf (guaranteed rate / leaves, ceiling rate) with its own drop-tail bfifo for
    the packets to `address`: htb serves its leaves by equal quanta, so answers to
    different workers share the uplink packet by packet (no sfq/fq on this kernel)."""
    burst = f"{burst_bytes(rate_bps)}b"
    _sh("tc", "-n", namespace, "class", "add", "dev", device, "parent", "1:1", "classid",
        classid, "htb", "rate", f"{round(rate_bps / leaves)}bit", "ceil",
        f"{round(rate_bps)}bit", "burst", burst, "cburst", burst, "quantum", "1514")
    _sh("tc", "-n", namespace, "qdisc", "add", "dev", device, "parent", classid, "handle",
        classid.split(":")[1] + ":", "bfifo", "limit", str(queue_limit_bytes(rate_bps)))
    _sh("tc", "-n", namespace, "filter", "add", "dev", device, "parent", "1:", "protocol",
        "ip", "prio", "1", "u32", "match", "ip", "dst", f"{address}/32", "flowid", classid)


def run_twin(*, workers: int, rate_bps: float, message_bytes: int, rounds: int,
             compute_s: float, server_queue: str, cc: str,
             one_way_s: float = 0.0) -> TwinResult:
    """One twin run on a fresh testbed of workers + 1 namespaces (the last is the server)."""
    nodes = workers + 1
    names = TestbedNames.for_pid(os.getpid(), nodes)
    testbed, line = _testbed_up(names, nodes, rate_bps, one_way_s)
    children: list[subprocess.Popen[str]] = []
    try:
        server = names.node(workers)
        if server_queue == "per-worker":  # round robin between the answers to each worker
            for worker in range(workers):
                _per_worker_leaf(server.namespace, server.device, names.node(worker).address,
                                 classid=f"1:{20 + worker}", rate_bps=rate_bps,
                                 leaves=workers + 1)
        if cc != "default":
            for rank in range(nodes):
                _sh("ip", "netns", "exec", names.namespace(rank), "sysctl", "-qw",
                    f"net.ipv4.tcp_congestion_control={cc}")

        def peer(rank: int, *args: str) -> subprocess.Popen[str]:
            return _start_peer(names, children, rank, *args)

        srv = peer(workers, "server", str(workers), str(message_bytes), str(PORT))
        assert srv.stdout is not None
        if srv.stdout.readline().strip() != "ready":
            raise RuntimeError("the twin's server did not start")
        start_at = time.monotonic() + START_DELAY_S
        procs = [peer(w, "worker", server.address, str(message_bytes), str(rounds),
                      str(compute_s), repr(start_at), str(PORT)) for w in range(workers)]
        times = []
        for proc in procs:
            out, _ = proc.communicate(timeout=rounds * 5.0 + 30)
            times.append(np.array(json.loads(out.strip().splitlines()[-1])))
        srv.wait(timeout=30)
        drops = (_dropped(server.namespace, server.device),
                 _dropped(server.hub_namespace, server.bridge_port))
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
        if line is not None:
            line.stop()
        testbed.down()
    rtt = f" rtt={2e3 * one_way_s:g}ms" if one_way_s > 0 else ""
    result = summarise(f"{workers}w {rate_bps / 1e6:g} Mbit/s queue={server_queue} cc={cc}"
                       f"{rtt}",
                       times, start_at)
    return replace(result, server_drops=drops)


def _dropped(namespace: str, device: str) -> int:
    """Packets the qdiscs of `device` dropped (tc -s: every "dropped N" added up)."""
    out = subprocess.run(("tc", "-n", namespace, "-s", "qdisc", "show", "dev", device),
                         capture_output=True, text=True, check=True).stdout
    return sum(int(m) for m in re.findall(r"dropped (\d+)", out))


def summarise(label: str, times: list[np.ndarray], start_at: float) -> TwinResult:
    """Round times, answer-arrival spread and answer overlap from [push, answer] times."""
    rounds = min(len(t) for t in times)
    skip = max(1, rounds // 10)
    round_time = tuple(float(np.mean(np.diff(t[skip - 1:rounds, 1]))) for t in times)
    done = np.array([t[:rounds, 1] for t in times])
    gap = tuple(float(x) for x in done.max(axis=0) - done.min(axis=0))
    # an answer is under way from the push's arrival at the server (about a message time
    # after the push started) to its own arrival: approximate with [push end, done]
    # where push end = done - (done - pushed) / 2 (push and answer take equal time alone)
    spans = [np.stack([(t[:rounds, 0] + t[:rounds, 1]) / 2, t[:rounds, 1]], axis=1)
             for t in times]
    overlap = total = 0.0
    for i, own in enumerate(spans):
        others = [s for j, s in enumerate(spans) if j != i]
        for a, b in own[skip:]:
            total += b - a
            covered = 0.0
            for other in others:
                starts, ends = other[:, 0], other[:, 1]
                covered = max(covered, float(np.sum(np.clip(np.minimum(ends, b)
                                                             - np.maximum(starts, a), 0, None))))
            overlap += min(covered, b - a)
    return TwinResult(label, round_time, gap, overlap / total if total else 0.0,
                      tuple(tuple(float(x) for x in t[:rounds, 0] - start_at) for t in times))


@dataclass(frozen=True)
class ShareResult:
    """Two messages through one shared queue, the second `offset_s` after the first."""

    direction: str  # "one sender" (server's uplink) or "two senders" (server's downlink)
    offset_s: float
    first_done_s: float  # after the first message's start
    second_done_s: float
    leader_share: float  # of the rate while both were under way, what the first message got
    # how much later the second message ended than right behind the first at full rate
    # (strict FIFO, no loss: 0; a queued message's loss recovery shows here)
    second_extra_s: float = 0.0

    def to_json(self) -> dict[str, object]:
        return {"direction": self.direction, "offset_s": self.offset_s,
                "first_done_s": self.first_done_s, "second_done_s": self.second_done_s,
                "leader_share": self.leader_share, "second_extra_s": self.second_extra_s}


def leader_share(first_done_s: float, offset_s: float, message_bytes: int,
                 goodput_bps: float) -> float:
    """The share of the link the first message got while both were under way: it sent
    alone for offset_s, then the rest of its bytes at share x goodput. 1 = strict FIFO,
    0.5 = fair (max-min)."""
    alone_bytes = min(message_bytes, goodput_bps / 8 * offset_s)
    shared_s = first_done_s - offset_s
    if shared_s <= 0:
        return 1.0
    return min(1.0, (message_bytes - alone_bytes) * 8 / (goodput_bps * shared_s))


def run_share(*, rate_bps: float, message_bytes: int, offsets_s: tuple[float, ...],
              repeats: int, goodput_fraction: float,
              one_way_s: float = 0.0) -> list[ShareResult]:
    """On a 3-node testbed: node 2 sends one message to each of nodes 0 and 1 (its uplink
    shared), and nodes 0 and 1 each send one to node 2 (its downlink shared), the second
    message `offset` after the first, over connections warmed by earlier messages."""
    names = TestbedNames.for_pid(os.getpid(), 3)
    children: list[subprocess.Popen[str]] = []
    alone_s = message_bytes * 8 / (rate_bps * goodput_fraction)
    spacing_s = 4 * alone_s + max(offsets_s) + 8 * one_way_s
    trials = [(offset, order) for offset in offsets_s for order in (0, 1)] * repeats
    results: list[ShareResult] = []
    testbed, line = _testbed_up(names, 3, rate_bps, one_way_s)
    try:

        def peer(rank: int, *args: str) -> subprocess.Popen[str]:
            return _start_peer(names, children, rank, *args)

        addr = [names.node(r).address for r in range(3)]
        sinks = [peer(0, "sink", str(PORT), "1", str(message_bytes)),
                 peer(1, "sink", str(PORT), "1", str(message_bytes)),
                 peer(2, "sink", str(PORT), "2", str(message_bytes))]
        for sink in sinks:
            assert sink.stdout is not None
            if sink.stdout.readline().strip() != "ready":
                raise RuntimeError("a sink did not start")
        t0 = time.monotonic() + START_DELAY_S
        warm = 4  # messages each way, one at a time, before the trials
        starts: list[tuple[float, float, int]] = []  # (first start, offset, leader node)
        out_sched: list[list[object]] = []  # node 2 -> 0, 1
        in_sched: dict[int, list[list[object]]] = {0: [], 1: []}  # node 0/1 -> 2
        at = t0
        for _ in range(warm):
            for node in (0, 1):
                out_sched.append([addr[node], PORT, at])
                in_sched[node].append([addr[2], PORT, at + alone_s * 1.5])
                at += 3 * alone_s
        for offset, order in trials:
            first, second = (0, 1) if order == 0 else (1, 0)
            out_sched += [[addr[first], PORT, at], [addr[second], PORT, at + offset]]
            in_sched[first].append([addr[2], PORT, at + spacing_s / 2])
            in_sched[second].append([addr[2], PORT, at + spacing_s / 2 + offset])
            starts.append((at, offset, first))
            at += spacing_s
        sources = [peer(2, "source", str(message_bytes), json.dumps(out_sched)),
                   peer(0, "source", str(message_bytes), json.dumps(in_sched[0])),
                   peer(1, "source", str(message_bytes), json.dumps(in_sched[1]))]
        for source in sources:
            source.wait(timeout=at - time.monotonic() + 60)
        arrived = []
        for sink in sinks:
            out, _ = sink.communicate(timeout=60)
            arrived.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
        if line is not None:
            line.stop()
        testbed.down()
    goodput = rate_bps * goodput_fraction
    at_node = [next(iter(arrived[0].values())), next(iter(arrived[1].values()))]
    at_server = {0: arrived[2][addr[0]], 1: arrived[2][addr[1]]}
    for k, (start, offset, first) in enumerate(starts):
        second = 1 - first
        for direction, done_first, done_second, begin in (
                ("one sender", at_node[first][warm + k], at_node[second][warm + k], start),
                ("two senders", at_server[first][warm + k], at_server[second][warm + k],
                 start + spacing_s / 2)):
            # the one-way delay is in both arrival times: take it out of the shares
            first_s, second_s = done_first - begin - one_way_s, done_second - begin - one_way_s
            results.append(ShareResult(direction, offset, first_s, second_s,
                                       leader_share(first_s, offset, message_bytes, goodput),
                                       second_s - max(first_s, offset) - alone_s))
    return results


VARIANTS = (("bfifo", "default"), ("per-worker", "default"), ("bfifo", "reno"),
            ("per-worker", "reno"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.ps_desync_probe",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rate-mbps", type=float, default=100.0)
    parser.add_argument("--message-bytes", type=int, default=498572)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--compute-ms", type=float, default=6.0)
    parser.add_argument("--server-queue", choices=("bfifo", "per-worker"), default="bfifo")
    parser.add_argument("--cc", default="default",
                        help="default | bbr | reno (those a namespace may set)")
    parser.add_argument("--all", action="store_true",
                        help="every variant: bfifo or per-worker x default (bbr here) "
                             "or reno congestion control")
    parser.add_argument("--share", action="store_true",
                        help="instead: how two messages share one queue, the second "
                             "--offsets-ms after the first")
    parser.add_argument("--offsets-ms", default="0,2,5,10,20")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--goodput-fraction", type=float, default=0.927,
                        help="the host calibration's goodput fraction (for the shares)")
    parser.add_argument("--rtt-ms", type=float, default=0.0,
                        help="round trip of every pair, half each way, held by the testbed's "
                             "delay line (default 0: bridged, no latency)")
    parser.add_argument("--json", help="write the records here")
    args = parser.parse_args(argv)
    one_way_s = args.rtt_ms / 2e3
    why = missing_requirements()
    if why is not None:
        print(f"ps_desync_probe: {why}", file=sys.stderr)
        return 2
    if args.share:
        offsets = tuple(float(x) / 1e3 for x in args.offsets_ms.split(","))
        shares = run_share(rate_bps=args.rate_mbps * 1e6, message_bytes=args.message_bytes,
                           offsets_s=offsets, repeats=args.repeats,
                           goodput_fraction=args.goodput_fraction, one_way_s=one_way_s)
        for direction in ("one sender", "two senders"):
            for offset in offsets:
                mine = [r for r in shares if r.direction == direction and r.offset_s == offset]
                print(f"{direction}, offset {1e3 * offset:g} ms: first done "
                      f"{1e3 * np.median([r.first_done_s for r in mine]):.1f} ms, second "
                      f"{1e3 * np.median([r.second_done_s for r in mine]):.1f} ms, leader "
                      f"share {np.median([r.leader_share for r in mine]):.2f}, second's "
                      f"extra {1e3 * np.median([r.second_extra_s for r in mine]):.1f} ms "
                      f"(median of {len(mine)})")
        if args.json:
            _write(args.json, [r.to_json() for r in shares])
        return 0
    variants = VARIANTS if args.all else ((args.server_queue, args.cc),)
    records = []
    for queue, cc in variants:
        result = run_twin(workers=args.workers, rate_bps=args.rate_mbps * 1e6,
                          message_bytes=args.message_bytes, rounds=args.rounds,
                          compute_s=args.compute_ms / 1e3, server_queue=queue, cc=cc,
                          one_way_s=one_way_s)
        gaps = np.array(result.answer_gap_s)
        print(f"{result.label}: round {1e3 * np.mean(result.round_time_s):.1f} ms "
              f"(per worker {', '.join(f'{1e3 * r:.1f}' for r in result.round_time_s)}); "
              f"answer spread round 0: {1e3 * gaps[0]:.1f} ms, median "
              f"{1e3 * np.median(gaps):.1f} ms; answers overlapping: "
              f"{100 * result.overlap_fraction:.0f}%; server drops (uplink, downlink): "
              f"{result.server_drops}")
        records.append(result.to_json())
    if args.json:
        _write(args.json, records)
    return 0


def _write(path: str, records: list[dict[str, object]]) -> None:
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    with open(path, "w", encoding="utf-8") as handle:
        json.dump({"uptime": uptime, "runs": records}, handle, indent=1)


if __name__ == "__main__":
    sys.exit(main())
