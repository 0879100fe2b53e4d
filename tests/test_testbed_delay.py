"""The testbed's delay line: latency without netem, measured through real kernel TCP.

The first tests need nothing (the schedule, the routes planned, the loop on a
SOCK_SEQPACKET pair standing in for the TUN device). The tests marked netns
need root, `ip`, `tc`, network namespaces and /dev/net/tun, and are skipped
with the reason otherwise: they build two namespaces routed through the delay
line with the testbed's own code, shape them with tc htb, and measure the
round trip (TCP connect, a one-byte request/answer, ICMP echo) and a bulk TCP
transfer. RTT within 10 % of the configured value is asserted (the measured
excess is a fraction of a millisecond, so that is a behaviour, not a timing
race); the bulk rate's fraction of the shaped rate is a figure (printed, and
appended as a JSON line to the file TESTBED_FIGURES names), not a pass/fail
threshold. To rerun the figures:
TESTBED_FIGURES=figures.jsonl pytest -s tests/test_testbed_delay.py -k rtt_and_rate
"""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from akocore.results import RunResult
from akocore.testbed_record import TESTBED_RECORD_FILE
from akocore.testbed_record import TestbedRecord as Record
from akorun.errors import UsageError
from akorun.launch.testbed import delaypath, netns
from akorun.launch.testbed.delayline import VNET_HDR_BYTES, DelayLine, DelaySchedule, pair_of
from akorun.launch.testbed.netns import SUBNET, SUBNET_PREFIX, NetnsTestbed, entered
from akorun.launch.testbed.probe import measure_transfer
from akorun.launch.testbed.runner import DELAY_LINE_FILE
from akorun.launch.testbed.shaping import plan_shaping
from akorun.testing import REPO_ROOT, child_test_env

A, B = "10.77.0.1", "10.77.0.2"


def _packet(src: str, dst: str, payload: bytes = b"") -> bytes:
    ip = bytes([0x45, 0]) + struct.pack("!H", 20 + len(payload)) + bytes(8) + \
        socket.inet_aton(src) + socket.inet_aton(dst)
    return bytes(VNET_HDR_BYTES) + ip + payload


# ------------------------------------------------------------------ pure parts


def test_the_schedule_delays_each_ordered_pair_and_keeps_a_pairs_order() -> None:
    schedule = DelaySchedule.from_matrix([A, B], [[0.0, 0.01], [0.03, 0.0]], jitter_s=0.004)
    pair = pair_of(_packet(A, B))
    back = pair_of(_packet(B, A))
    assert pair is not None and back is not None
    assert schedule.release_s(pair, 1.0, 0.0, 0.5) == pytest.approx(1.01)
    assert schedule.release_s(back, 1.0, 0.0, 0.5) == pytest.approx(1.03)
    assert schedule.release_s(pair, 1.0, 0.0, 0.0) == pytest.approx(1.006)  # -jitter
    assert schedule.release_s(pair, 1.0, 0.0, 1.0) == pytest.approx(1.014)  # +jitter
    assert schedule.release_s(pair, 1.0, 1.02, 0.0) == 1.02  # never before the previous one
    assert schedule.release_s((pair[0], socket.inet_aton("10.9.9.9")), 1.0, 0.0, 0.5) is None
    assert pair_of(bytes(VNET_HDR_BYTES) + bytes([0x60]) + bytes(40)) is None  # IPv6
    assert DelaySchedule.from_json(json.loads(json.dumps(schedule.to_json()))) == schedule


def test_the_line_holds_every_packet_its_delay_and_keeps_their_order() -> None:
    ours, line_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    stop_r, stop_w = os.pipe()
    schedule = DelaySchedule.from_matrix([A, B], [[0.0, 0.02], [0.05, 0.0]])
    line = DelayLine(line_end.fileno(), schedule)
    line_end.setblocking(False)
    thread = threading.Thread(target=line.run, args=(stop_r,), daemon=True)
    thread.start()
    sent: dict[bytes, float] = {}
    for k in range(5):
        for src, dst in ((A, B), (B, A)):
            packet = _packet(src, dst, bytes([k]) * 100)
            sent[packet] = time.monotonic()
            ours.send(packet)
    ours.send(bytes(VNET_HDR_BYTES) + bytes([0x60]) + bytes(40))  # not IPv4: dropped
    ours.settimeout(5.0)
    back = []
    for _ in range(10):
        packet = ours.recv(4096)
        back.append((packet, time.monotonic()))
    os.write(stop_w, b"x")
    thread.join(5.0)
    for packet, arrived in back:
        delay = 0.02 if packet[VNET_HDR_BYTES + 12:VNET_HDR_BYTES + 16] == \
            socket.inet_aton(A) else 0.05
        assert arrived - sent[packet] >= delay
    forward = [p[-1] for p, _ in back if pair_of(p) == pair_of(_packet(A, B))]
    assert forward == [0, 1, 2, 3, 4]
    assert [pair_of(p) for p, _ in back][:5] == [pair_of(_packet(A, B))] * 5  # 20 ms first
    assert line.stats.packets == 10 and line.stats.dropped_foreign == 1
    assert line.stats.bytes == 10 * 120
    ours.close()
    line_end.close()


def test_the_routes_send_every_rank_to_rank_packet_through_the_tun_device() -> None:
    ports = [delaypath.RankPort(rank=r, namespace=f"n{r}", device=f"r{r}", hub_port=f"p{r}",
                                address=f"10.77.0.{r + 1}") for r in range(2)]
    plan = delaypath.plan_delay_path("hub", "tun", ports, SUBNET, SUBNET_PREFIX)
    commands = [" ".join(c) for c in plan.before_line + plan.after_line]
    assert [c[:6] for c in plan.after_line][0] == ("ip", "-n", "hub", "link", "set", "tun")
    assert not any("tun" in c and " up" in c for c in map(" ".join, plan.before_line))
    assert "ip -n hub rule add pref 100 iif tun lookup main" in commands
    assert "ip -n hub route add default dev tun table 200" in commands
    assert "ip -n n1 route add 10.77.0.0/24 via 10.77.0.254 dev r1" in commands
    assert (f"ip -n n1 neigh add 10.77.0.254 lladdr {delaypath.hub_mac(1)} dev r1 nud "
            f"permanent") in commands
    assert (f"ip -n hub neigh add 10.77.0.2 lladdr {delaypath.rank_mac(1)} dev p1 nud "
            f"permanent") in commands
    assert delaypath.rank_mac(258) == "02:77:00:00:01:02"


def test_the_line_load_is_each_uplink_or_its_pair_caps_where_smaller() -> None:
    caps = np.array([[np.inf, 40e6, 40e6], [40e6, np.inf, 40e6], [40e6, 40e6, np.inf]])
    assert delaypath.line_load_bps(np.array([1e9] * 3), caps) == 240e6
    assert delaypath.line_load_bps(np.array([20e6] * 3), caps) == 60e6
    with pytest.raises(UsageError, match="at most 1000 Mbit/s"):
        delaypath.check_delay(np.full((3, 3), 0.02), 1.2e9, 0.0)
    delaypath.check_delay(np.array([[0.0, 0.0], [0.02, 0.0]]), 100e6, 0.002)  # zeros allowed


# ------------------------------------------------------------------ on the kernel


def _requirements() -> None:
    missing = netns.missing_requirements()
    if missing:
        pytest.skip(f"the netns testbed {missing}")
    if not os.path.exists("/dev/net/tun"):
        pytest.skip("the delay line needs /dev/net/tun")


ONE_WAY_S = (0.005, 0.025, 0.05)  # RTT 10, 50, 100 ms
RATES_BPS = (5e6, 50e6)


def _figure(line: dict[str, object]) -> None:
    print(json.dumps(line))
    target = os.environ.get("TESTBED_FIGURES")
    if target:
        with open(target, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(line) + "\n")


class _Pair:
    """Two ranks' namespaces routed through the delay line, built by the testbed's code."""

    def __init__(self, one_way_s: float, rate_bps: float) -> None:
        self.testbed = NetnsTestbed(netns.TestbedNames.for_pid(os.getpid(), 2))
        names = self.testbed.names
        self.testbed.up(bridged=False)
        ports = [delaypath.RankPort(rank=r, namespace=names.namespace(r),
                                    device=names.device(r), hub_port=names.bridge_port(r),
                                    address=names.address(r)) for r in range(2)]
        path = delaypath.plan_delay_path(names.hub, names.tun, ports, SUBNET, SUBNET_PREFIX)
        self.testbed.apply(path.before_line)
        from akocore.config import config_from_dict
        cfg = config_from_dict({"cluster": {"workers": 2},
                                "network": {"bandwidth": f"{rate_bps / 1e6:g}mbps"}})
        plan = plan_shaping(cfg.network, [names.node(r) for r in range(2)], downlink=True)
        self.testbed.apply(plan.commands)
        schedule = DelaySchedule.from_matrix([names.address(0), names.address(1)],
                                             [[0.0, one_way_s], [one_way_s, 0.0]])
        self.line = delaypath.DelayLineProcess(names.hub, names.tun, schedule)
        self.line.start()
        self.testbed.apply(path.after_line)
        self.names = names

    def close(self) -> dict[str, object] | None:
        try:
            return self.line.stop()
        finally:
            self.testbed.down()


@pytest.fixture
def pair_factory() -> Iterator[list[_Pair]]:
    _requirements()
    made: list[_Pair] = []
    yield made
    for pair in made:
        pair.close()


def _echo_server(namespace: str, address: str, port: int) -> socket.socket:
    with entered(namespace):
        server = socket.create_server((address, port))

    def serve() -> None:
        while True:
            try:
                connection, _ = server.accept()
            except OSError:
                return
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with connection:
                while data := connection.recv(64):
                    connection.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    return server


TCPI_MIN_RTT_OFFSET = 148  # struct tcp_info: tcpi_min_rtt (microseconds)


def _tcp_rtts_s(namespace: str, address: str,
                port: int, count: int) -> tuple[float, list[float], float]:
    """The TCP connect time (SYN, SYN-ACK), `count` one-byte request/answer times, and the
    kernel's own smallest RTT sample of the connection (TCP_INFO tcpi_min_rtt)."""
    with entered(namespace):
        client = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    with client:
        client.settimeout(10.0)
        start = time.perf_counter()
        client.connect((address, port))
        connect_s = time.perf_counter() - start
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        answers = []
        for _ in range(count):
            start = time.perf_counter()
            client.sendall(b"x")
            client.recv(64)
            answers.append(time.perf_counter() - start)
        info = client.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
        (min_rtt_us,) = struct.unpack_from("I", info, TCPI_MIN_RTT_OFFSET)
    return connect_s, answers, min_rtt_us * 1e-6


def _icmp_rtts_s(namespace: str, address: str, count: int) -> list[float]:
    """ICMP echo round trips from a raw socket (root)."""
    with entered(namespace):
        sock = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    rtts = []
    with sock:
        sock.settimeout(5.0)
        for seq in range(count):
            header = struct.pack("!BBHHH", 8, 0, 0, 0x77, seq) + bytes(16)
            checksum = _inet_checksum(header)
            packet = header[:2] + struct.pack("!H", checksum) + header[4:]
            start = time.perf_counter()
            sock.sendto(packet, (address, 0))
            while True:
                reply = sock.recv(2048)
                icmp = reply[(reply[0] & 0x0F) * 4:]
                if icmp[0] == 0 and struct.unpack("!HH", icmp[4:8]) == (0x77, seq):
                    break
            rtts.append(time.perf_counter() - start)
    return rtts


def _inet_checksum(data: bytes) -> int:
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    total = (total >> 16) + (total & 0xFFFF)
    total += total >> 16
    return ~total & 0xFFFF


@pytest.mark.netns
@pytest.mark.solo
@pytest.mark.timeout(600)
@pytest.mark.parametrize("rate_bps", RATES_BPS)
def test_rtt_and_rate_through_the_delay_line(pair_factory: list[_Pair], rate_bps: float) -> None:
    """Measured RTT within 10 % of twice the one-way delay, at each grid rate: the median
    ICMP echo, the kernel's own TCP RTT (tcpi_min_rtt) and the fastest one-byte TCP
    request/answer (an answer also waits for the test's threads to be scheduled, so its
    median, recorded, can carry the machine's load). The bulk TCP rate is a figure."""
    for one_way_s in ONE_WAY_S:
        try:
            pair = _Pair(one_way_s, rate_bps)
        except UsageError as error:
            pytest.skip(f"the kernel refused the delayed testbed: {error}")
        pair_factory.append(pair)
        names = pair.names
        rtt_s = 2 * one_way_s
        port = 7100
        server = _echo_server(names.namespace(1), names.address(1), port)
        try:
            connect_s, answers, kernel_rtt_s = _tcp_rtts_s(names.namespace(0),
                                                           names.address(1), port, 15)
        finally:
            server.close()
        pings = _icmp_rtts_s(names.namespace(0), names.address(1), 15)
        nbytes = int(rate_bps / 8 * max(2.0, 40 * rtt_s))  # several seconds of slow start
        transfer = measure_transfer(names.namespace(0), names.namespace(1), names.address(1),
                                    nbytes, port=port + 1, timeout_s=120.0)
        stats = pair.close()
        pair_factory.remove(pair)
        figure = {"figure": "delay_line", "rtt_ms": rtt_s * 1e3, "rate_mbps": rate_bps / 1e6,
                  "ping_median_ms": float(np.median(pings)) * 1e3,
                  "tcp_answer_median_ms": float(np.median(answers)) * 1e3,
                  "tcp_connect_ms": connect_s * 1e3, "tcp_kernel_min_rtt_ms": kernel_rtt_s * 1e3,
                  "tcp_answer_min_ms": min(answers) * 1e3,
                  "bulk_mb": nbytes / 1e6,
                  "bulk_fraction_of_shaped": transfer.rate_bps / rate_bps,
                  "line": stats, "load": os.getloadavg()[0]}
        _figure(figure)
        assert float(np.median(pings)) == pytest.approx(rtt_s, rel=0.1), figure
        assert kernel_rtt_s == pytest.approx(rtt_s, rel=0.1), figure
        assert min(answers) == pytest.approx(rtt_s, rel=0.1), figure
        assert connect_s >= rtt_s  # one round trip at least (a connect may pay a wake-up)
        assert stats is not None and stats["packets"] > 0 and stats["write_errors"] == 0


@pytest.mark.netns
@pytest.mark.timeout(400)
def test_a_launch_with_latency_and_jitter_ends_with_equal_replicas_and_records_the_delays(
        tmp_path: Path) -> None:
    _requirements()
    out = tmp_path / "run"
    command = [sys.executable, "-m", "akorun", "launch", "--testbed", "netns", "--workers", "3",
               "--bandwidth", "20mbps", "--latency", "10ms,20ms,5ms", "--testbed-jitter", "2ms",
               "--workload", "digits-mlp", "--optimizer", "sgd", "--lr", "0.05", "--rounds", "8",
               "--set", "train.eval_every=1000", "--quiet", "--out", str(out)]
    done = subprocess.run(command, cwd=REPO_ROOT, env=child_test_env(), capture_output=True,
                          text=True, timeout=380, check=False)
    if "testbed: `" in done.stderr:
        pytest.skip(f"the kernel refused the testbed: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    record = Record.from_json(json.loads((out / TESTBED_RECORD_FILE).read_text()))
    assert record.latency_matrix_s == ((0.0, 0.01, 0.02), (0.01, 0.0, 0.005),
                                       (0.02, 0.005, 0.0))
    assert record.bridge == "" and record.delay_device and record.latency_ignored_s == 0.0
    assert record.delay_jitter_s == 0.002
    result = RunResult.from_json(json.loads((out / "result.json").read_text()))
    assert all(r.rounds == 8 and not r.failed for r in result.per_worker)
    assert result.max_relative_difference is not None
    assert result.max_relative_difference <= 1e-5
    stats = json.loads((out / DELAY_LINE_FILE).read_text())
    assert stats["packets"] > 0 and stats["write_errors"] == 0
    assert not [n for n in netns.namespaces() if n.startswith(record.tag)]
