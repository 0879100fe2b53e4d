"""The testbed's delay stage: a userspace delay line on a TUN device (no netem needed).

This kernel has no netem, so tc cannot hold a packet. Instead the hub
namespace routes every rank-to-rank packet into one TUN device
(akorun.launching.testbed.delaypath plans the routes) and this process, started inside
the hub, reads each packet, holds it for its pair's one-way delay (plus
optional jitter) and writes it back into the same device, from where the
kernel forwards it to the destination rank. TCP stays end to end between the
ranks' kernels; shaping stays in tc.

How it keeps up in Python: the device is opened with a virtio-net header and
TSO/checksum offloads (TUNSETOFFLOAD), so the kernel hands over whole GSO
packets (up to 64 KiB) rather than 1500-byte frames: a few hundred to a few
thousand reads a second at 5-100 Mbit/s. One loop: `select` (microsecond
timeout) on the TUN fd, drain up to `READ_BATCH` packets per wake-up, a heap
of release times, write every packet that is due. Per pair the release times
never go backwards (jitter does not reorder a pair's packets, so TCP sees no
spurious reordering).

`DelaySchedule` (pure) maps (source, destination) IPv4 addresses to the
delay; `DelayLine` is the loop; `main` is the process
(`python -m akorun.launching.testbed.delayline --device NAME --spec FILE`): it prints
``ready`` once attached and, on SIGTERM/SIGINT, one JSON line of statistics
(`LineStats`: packets, bytes, how late the timer released them, CPU seconds).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import heapq
import json
import os
import random
import resource
import select
import signal
import socket
import struct
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

TUNSETIFF = 0x400454CA
TUNSETOFFLOAD = 0x400454D0
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
IFF_VNET_HDR = 0x4000
TUN_F_CSUM = 0x01
TUN_F_TSO4 = 0x02
TUN_F_TSO6 = 0x04
VNET_HDR_BYTES = 10  # struct virtio_net_hdr, the TUN default
READ_BYTES = VNET_HDR_BYTES + 65536 + 256
READ_BATCH = 64  # packets read per wake-up at most, before due packets are written
IDLE_WAKE_S = 0.5
FOREIGN_HEADS_KEPT = 4
LATE_BUCKETS_S = (50e-6, 100e-6, 200e-6, 500e-6, 1e-3, 2e-3, 5e-3, 10e-3)


@dataclass(frozen=True)
class DelaySchedule:
    """One-way delay (and jitter) per ordered pair of IPv4 addresses (pure)."""

    delays_s: dict[tuple[bytes, bytes], float]
    jitter_s: float = 0.0

    @classmethod
    def from_matrix(cls, addresses: Sequence[str], matrix_s: Sequence[Sequence[float]],
                    jitter_s: float = 0.0) -> DelaySchedule:
        packed = [socket.inet_aton(a) for a in addresses]
        delays = {(packed[i], packed[j]): float(matrix_s[i][j])
                  for i in range(len(packed)) for j in range(len(packed)) if i != j}
        return cls(delays, jitter_s)

    def to_json(self) -> dict[str, Any]:
        return {"jitter_s": self.jitter_s,
                "pairs": [[socket.inet_ntoa(s), socket.inet_ntoa(d), delay]
                          for (s, d), delay in sorted(self.delays_s.items())]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DelaySchedule:
        return cls({(socket.inet_aton(s), socket.inet_aton(d)): float(delay)
                    for s, d, delay in data["pairs"]}, float(data.get("jitter_s", 0.0)))

    def release_s(self, pair: tuple[bytes, bytes], arrival_s: float, last_release_s: float,
                  draw: float) -> float | None:
        """When a packet of `pair` that arrived at `arrival_s` leaves (None: not a testbed
        pair). `draw` in [0, 1) picks the jitter (uniform in +-jitter_s); never before the
        pair's previous release, so a pair's packets keep their order."""
        delay_s = self.delays_s.get(pair)
        if delay_s is None:
            return None
        if self.jitter_s > 0:
            delay_s = max(0.0, delay_s + (2.0 * draw - 1.0) * self.jitter_s)
        return max(arrival_s + delay_s, last_release_s)


def pair_of(packet: bytes) -> tuple[bytes, bytes] | None:
    """(source, destination) IPv4 address of a packet read with a virtio-net header."""
    if len(packet) < VNET_HDR_BYTES + 20 or packet[VNET_HDR_BYTES] >> 4 != 4:
        return None
    return (packet[VNET_HDR_BYTES + 12:VNET_HDR_BYTES + 16],
            packet[VNET_HDR_BYTES + 16:VNET_HDR_BYTES + 20])


@dataclass
class LineStats:
    """What the delay line did: counts, timer lateness, CPU."""

    packets: int = 0
    bytes: int = 0
    dropped_foreign: int = 0  # not IPv4 between two testbed addresses
    foreign_heads: list[str] = field(default_factory=list)  # the first few, as hex
    write_errors: int = 0
    held_max: int = 0  # most packets held at once
    late_max_s: float = 0.0  # worst release after the due time
    late_sum_s: float = 0.0
    late_le_s: dict[str, int] = field(default_factory=dict)  # bucket upper bound -> count
    wakeups: int = 0
    cpu_s: float = 0.0
    wall_s: float = 0.0

    @property
    def late_mean_s(self) -> float:
        return self.late_sum_s / self.packets if self.packets else 0.0

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "late_mean_s": self.late_mean_s}


def open_tun(device: str) -> int:
    """Attach to the persistent TUN `device` (made with vnet_hdr) with TSO/checksum
    offloads; the non-blocking fd."""
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    try:
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", device.encode(),
                                               IFF_TUN | IFF_NO_PI | IFF_VNET_HDR))
        fcntl.ioctl(fd, TUNSETOFFLOAD, TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6)
    except OSError:
        os.close(fd)
        raise
    return fd


class DelayLine:
    """Reads packets from a TUN fd, holds each for its pair's delay, writes it back."""

    def __init__(self, fd: int, schedule: DelaySchedule, *, seed: int = 0) -> None:
        self.fd = fd
        self.schedule = schedule
        self.stats = LineStats(late_le_s={f"{b:g}": 0 for b in LATE_BUCKETS_S} | {"inf": 0})
        self._heap: list[tuple[float, int, bytes]] = []
        self._last_release: dict[tuple[bytes, bytes], float] = {}
        self._seq = 0
        self._random = random.Random(seed)
        self.running = True

    def _read_some(self) -> None:
        heap, schedule, last = self._heap, self.schedule, self._last_release
        jitter = schedule.jitter_s > 0
        for _ in range(READ_BATCH):
            try:
                packet = os.read(self.fd, READ_BYTES)
            except BlockingIOError:
                return
            now = time.monotonic()
            pair = pair_of(packet)
            release = None if pair is None else schedule.release_s(
                pair, now, last.get(pair, 0.0), self._random.random() if jitter else 0.5)
            if release is None:
                self.stats.dropped_foreign += 1
                if len(self.stats.foreign_heads) < FOREIGN_HEADS_KEPT:
                    self.stats.foreign_heads.append(
                        packet[VNET_HDR_BYTES:VNET_HDR_BYTES + 40].hex())
                continue
            assert pair is not None
            last[pair] = release
            self._seq += 1
            heapq.heappush(heap, (release, self._seq, packet))
            if len(heap) > self.stats.held_max:
                self.stats.held_max = len(heap)

    def _write_due(self) -> None:
        heap, stats = self._heap, self.stats
        now = time.monotonic()
        while heap and heap[0][0] <= now:
            release, _, packet = heapq.heappop(heap)
            try:
                os.write(self.fd, packet)
            except OSError:
                stats.write_errors += 1
                continue
            late = now - release
            stats.packets += 1
            stats.bytes += len(packet) - VNET_HDR_BYTES
            stats.late_sum_s += late
            stats.late_max_s = max(stats.late_max_s, late)
            for bound in LATE_BUCKETS_S:
                if late <= bound:
                    stats.late_le_s[f"{bound:g}"] += 1
                    break
            else:
                stats.late_le_s["inf"] += 1
            now = time.monotonic()

    def run(self, stop_fd: int | None = None) -> LineStats:
        """Loop until `running` is cleared (a signal handler) or `stop_fd` is readable."""
        start_wall, start_cpu = time.monotonic(), _cpu_s()
        watched = [self.fd] if stop_fd is None else [self.fd, stop_fd]
        heap = self._heap
        while self.running:
            self._write_due()
            timeout = IDLE_WAKE_S if not heap else max(0.0, heap[0][0] - time.monotonic())
            try:
                readable, _, _ = select.select(watched, [], [], timeout)
            except InterruptedError:
                continue
            self.stats.wakeups += 1
            if stop_fd is not None and stop_fd in readable:
                break
            if self.fd in readable:
                self._read_some()
        self.stats.cpu_s = _cpu_s() - start_cpu
        self.stats.wall_s = time.monotonic() - start_wall
        return self.stats


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def raise_priority() -> str:
    """Run the line ahead of the ranks' compute: SCHED_FIFO when allowed, else nice -10;
    which one it got."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
        return "SCHED_FIFO 10"
    except (OSError, AttributeError):
        pass
    try:
        os.nice(-10)
        return "nice -10"
    except OSError:
        return "default"


def die_with_parent() -> None:
    """Have the kernel SIGTERM this process when its parent (the launcher) dies, so a
    killed launcher leaves no line running."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if os.getppid() == 1:
            os.kill(os.getpid(), signal.SIGTERM)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m akorun.launching.testbed.delayline",
                                     description="Hold every packet of a TUN device for its "
                                                 "pair's one-way delay and write it back.")
    parser.add_argument("--device", required=True, help="the persistent TUN device (vnet_hdr)")
    parser.add_argument("--spec", required=True,
                        help="file (or - for stdin) with DelaySchedule.to_json: pairs, jitter")
    parser.add_argument("--stats", type=Path, default=None,
                        help="also write the statistics JSON here on exit")
    parser.add_argument("--priority", choices=("raise", "keep"), default="raise")
    args = parser.parse_args(argv)
    die_with_parent()
    text = sys.stdin.read() if args.spec == "-" else Path(args.spec).read_text(encoding="utf-8")
    schedule = DelaySchedule.from_json(json.loads(text))
    fd = open_tun(args.device)
    priority = raise_priority() if args.priority == "raise" else "default"
    line = DelayLine(fd, schedule)

    def stop(signum: int, frame: Any) -> None:
        line.running = False

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"ready {priority}", flush=True)
    stats = line.run()
    text = json.dumps({**stats.to_json(), "priority": priority})
    print(text, flush=True)
    if args.stats is not None:
        args.stats.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
