"""Round trips and a bulk transfer through the testbed's delay line, measured once.

`DelayedPair` builds two ranks' namespaces routed through the delay line with the
testbed's own code (akorun.launching.testbed: netns, delaypath, shaping), every NIC
shaped by tc htb; `measure` takes, on one pair, the TCP connect time, one-byte TCP
request/answer times, the kernel's own smallest TCP RTT (tcpi_min_rtt), ICMP echo
times and a bulk TCP transfer, and returns them as a `DelayLineSample`. The test
(tests/test_testbed_delay.py) asserts the bounds scheduling noise cannot cross on
it; the benchmark (tests/bench/bench_testbed.py) reports its figures. Needs root,
`ip`, `tc`, network namespaces and /dev/net/tun (`missing` says what is not there).
"""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from akocore.hosttools.shaping import plan_shaping
from akorun.launching.testbed import delaypath, netns
from akorun.launching.testbed.delayline import DelaySchedule
from akorun.launching.testbed.netns import SUBNET, SUBNET_PREFIX, NetnsTestbed, entered
from akorun.launching.testbed.probe import measure_transfer

TCPI_MIN_RTT_OFFSET = 148  # struct tcp_info: tcpi_min_rtt (microseconds)
ECHO_PORT = 7100
SAMPLES = 15  # round trips of each kind


def missing() -> str:
    """What this machine lacks for a delayed pair ("" when nothing)."""
    reason = netns.missing_requirements()
    if reason:
        return f"the netns testbed {reason}"
    if not os.path.exists("/dev/net/tun"):
        return "the delay line needs /dev/net/tun"
    return ""


class DelayedPair:
    """Two ranks' namespaces routed through the delay line, every NIC shaped to
    `rate_bps` (raises akorun.errors.UsageError where the kernel refuses)."""

    def __init__(self, one_way_s: float, rate_bps: float) -> None:
        from akocore.settings.toml_io import config_from_dict

        self.testbed = NetnsTestbed(netns.TestbedNames.for_pid(os.getpid(), 2))
        names = self.testbed.names
        self.testbed.up(bridged=False)
        self.line: delaypath.DelayLineProcess | None = None
        try:
            ports = [delaypath.RankPort(rank=r, namespace=names.namespace(r),
                                        device=names.device(r), hub_port=names.bridge_port(r),
                                        address=names.address(r)) for r in range(2)]
            path = delaypath.plan_delay_path(names.hub, names.tun, ports, SUBNET, SUBNET_PREFIX)
            self.testbed.apply(path.before_line)
            cfg = config_from_dict({"cluster": {"workers": 2},
                                    "network": {"bandwidth": f"{rate_bps / 1e6:g}mbps"}})
            plan = plan_shaping(cfg.network, [names.node(r) for r in range(2)], downlink=True)
            self.testbed.apply(plan.commands)
            schedule = DelaySchedule.from_matrix([names.address(0), names.address(1)],
                                                 [[0.0, one_way_s], [one_way_s, 0.0]])
            self.line = delaypath.DelayLineProcess(names.hub, names.tun, schedule)
            self.line.start()
            self.testbed.apply(path.after_line)
        except BaseException:
            self.close()
            raise
        self.names = names

    def close(self) -> dict[str, Any] | None:
        """Stop the line and remove the namespaces; the line's statistics."""
        try:
            return self.line.stop() if self.line is not None else None
        finally:
            self.line = None
            self.testbed.down()


@dataclass(frozen=True)
class DelayLineSample:
    """One pair's measurements (seconds, bytes, bits/s) and the line's statistics."""

    one_way_s: float
    rate_bps: float
    connect_s: float  # TCP connect (SYN, SYN-ACK)
    answers_s: tuple[float, ...]  # one-byte TCP request/answer
    kernel_min_rtt_s: float  # the kernel's smallest RTT sample of that connection
    pings_s: tuple[float, ...]  # ICMP echo
    bulk_bytes: int
    bulk_s: float  # the receiver's time from its first byte to its last
    bulk_outer_s: float  # from before the transfer's sockets were made until it returned
    line: dict[str, Any] | None  # the delay line's statistics

    @property
    def rtt_s(self) -> float:
        """The configured round trip: twice the one-way delay."""
        return 2 * self.one_way_s

    def figures(self) -> dict[str, Any]:
        """The measurements as one JSON line."""
        return {"rtt_ms": self.rtt_s * 1e3, "rate_mbps": self.rate_bps / 1e6,
                "ping_median_ms": float(np.median(self.pings_s)) * 1e3,
                "tcp_answer_median_ms": float(np.median(self.answers_s)) * 1e3,
                "tcp_connect_ms": self.connect_s * 1e3,
                "tcp_kernel_min_rtt_ms": self.kernel_min_rtt_s * 1e3,
                "tcp_answer_min_ms": min(self.answers_s) * 1e3,
                "bulk_mb": self.bulk_bytes / 1e6,
                "bulk_fraction_of_shaped": self.bulk_bytes * 8 / self.bulk_s / self.rate_bps,
                "line": self.line, "load": os.getloadavg()[0]}


def measure(one_way_s: float, rate_bps: float) -> DelayLineSample:
    """Build a pair, measure it, take it down (also on failure)."""
    pair = DelayedPair(one_way_s, rate_bps)
    try:
        names = pair.names
        server = _echo_server(names.namespace(1), names.address(1), ECHO_PORT)
        try:
            connect_s, answers, kernel_rtt_s = _tcp_rtts_s(names.namespace(0),
                                                           names.address(1), ECHO_PORT)
        finally:
            server.close()
        pings = _icmp_rtts_s(names.namespace(0), names.address(1))
        nbytes = int(rate_bps / 8 * max(2.0, 80 * one_way_s))  # several seconds of slow start
        started_s = time.perf_counter()
        transfer = measure_transfer(names.namespace(0), names.namespace(1), names.address(1),
                                    nbytes, port=ECHO_PORT + 1, timeout_s=120.0)
        outer_s = time.perf_counter() - started_s
    finally:
        stats = pair.close()
    return DelayLineSample(one_way_s, rate_bps, connect_s, tuple(answers), kernel_rtt_s,
                           tuple(pings), transfer.nbytes, transfer.seconds, outer_s, stats)


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


def _tcp_rtts_s(namespace: str, address: str, port: int) -> tuple[float, list[float], float]:
    """The TCP connect time (SYN, SYN-ACK), SAMPLES one-byte request/answer times, and the
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
        for _ in range(SAMPLES):
            start = time.perf_counter()
            client.sendall(b"x")
            client.recv(64)
            answers.append(time.perf_counter() - start)
        info = client.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
        (min_rtt_us,) = struct.unpack_from("I", info, TCPI_MIN_RTT_OFFSET)
    return connect_s, answers, min_rtt_us * 1e-6


def _icmp_rtts_s(namespace: str, address: str) -> list[float]:
    """SAMPLES ICMP echo round trips from a raw socket (root)."""
    with entered(namespace):
        sock = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    rtts = []
    with sock:
        sock.settimeout(5.0)
        for seq in range(SAMPLES):
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
