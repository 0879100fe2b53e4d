"""`akosim calibrate`: measure the TCP model's parameters on this host, once.

Never from a run being predicted: everything here is a microbenchmark.

- Loopback TCP (always): the round trip of a 1-byte ping-pong (the host
  stack's share of every RTT, `base_rtt_s`), bulk goodput (the stack's
  ceiling), and transfers of 64 KiB, 1 MiB and 8 MiB on a fresh connection
  (connect included) and on a warm one, each the median of a few repeats.
  The server is a `socketserver.ThreadingTCPServer` on 127.0.0.1; a request is
  an 8-byte length and that many bytes, answered by one byte once all arrived.
- The kernel's TCP settings: the largest autotuned receive buffer
  (net.ipv4.tcp_rmem, of which Linux advertises about half as window:
  `window_bytes`) and whether slow start restarts after idle (a note).
- akorun's per-message software cost without network time: the command
  ``akorun measure-messages --out F`` run as a subprocess (akosim never
  imports akorun), or a file given with ``--message-cost F``; when neither is
  available the cost is recorded as not measured (0).

- With ``--netns-rate RATE`` (root): the goodput fraction of a tc-shaped veth
  pair between two namespaces, both directions loaded, and the flow sharing
  efficiency of 1-4 connections through one port shaped as the netns testbed
  shapes it, each moving one message per round (akosim.calibration.netns_probe). Without
  it the fraction stays the documented frame arithmetic
  (akocore.records.host_calibration.wire_goodput_fraction): loopback has no line rate,
  and sharing costs nothing.
"""

from __future__ import annotations

import argparse
import shutil
import socket
import socketserver
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

from akocore.cli_support import UsageError
from akocore.records.host_calibration import HostCalibration, TcpParameters, TransferTiming
from akosim.calibration.host_calibration_io import (
    cache_file,
    host_fingerprint,
    read_message_cost,
    write_host_calibration,
)

HEADER = struct.Struct("!Q")
TRANSFER_SIZES_BYTES = (64 * 1024, 1024 * 1024, 8 * 1024 * 1024)
BULK_BYTES = 64 * 1024 * 1024
CHUNK_BYTES = 1 << 20
MEASURE_MESSAGES_TIMEOUT_S = 600.0

DESCRIPTION = ("Measure the TCP-aware network model's parameters on this host once (loopback "
               "TCP round trip and transfers, the kernel's window, akorun's per-message "
               "software cost) and cache them for akosim predict and --network-model tcp.")
EPILOG = """\
examples:
  akosim calibrate                       measure, cache for this host, print what was measured
  akosim calibrate --out host.json       write the record to a file instead of the cache
  akosim calibrate --message-cost m.json take akorun's per-message cost from a file
  akosim predict RUN_DIR --host-calibration host.json
"""


class _Handler(socketserver.StreamRequestHandler):
    """Read (8-byte length, payload) requests; answer each with one byte."""

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def handle(self) -> None:
        while True:
            header = self.rfile.read(HEADER.size)
            if len(header) < HEADER.size:
                return
            (remaining,) = HEADER.unpack(header)
            while remaining:
                chunk = self.rfile.read1(min(remaining, CHUNK_BYTES))
                if not chunk:
                    return
                remaining -= len(chunk)
            self.wfile.write(b"k")
            self.wfile.flush()


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


@contextmanager
def loopback_server() -> Iterator[tuple[str, int]]:
    server = _Server(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, name="akosim-calibrate", daemon=True)
    thread.start()
    try:
        host, port = server.server_address[:2]
        yield str(host), int(port)
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _connect(address: tuple[str, int]) -> socket.socket:
    sock = socket.create_connection(address)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _exchange(sock: socket.socket, payload: memoryview) -> None:
    sock.sendall(HEADER.pack(len(payload)))
    if len(payload):
        sock.sendall(payload)
    if sock.recv(1) != b"k":
        raise OSError("the calibration server closed the connection")


def _median_s(repeats: int, fn: Callable[[], None]) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def measure_loopback(repeats: int = 5, ping_count: int = 200,
                     sizes: tuple[int, ...] = TRANSFER_SIZES_BYTES,
                     bulk_bytes: int = BULK_BYTES) -> tuple[float, float,
                                                            tuple[TransferTiming, ...]]:
    """(median RTT s, bulk goodput bit/s, fresh and warm transfer timings) on loopback."""
    buffer = memoryview(bytearray(max(max(sizes), bulk_bytes, 1)))
    with loopback_server() as address:
        with _connect(address) as sock:
            _exchange(sock, buffer[:0])  # warm the path and the server's thread
            rtt_s = _median_s(ping_count, lambda: _exchange(sock, buffer[:0]))
            bulk_s = _median_s(max(repeats // 2, 1), lambda: _exchange(sock, buffer[:bulk_bytes]))
            warm = {size: _median_s(repeats, partial(_exchange, sock, buffer[:size]))
                    for size in sizes}

        def fresh_transfer(size: int) -> None:
            with _connect(address) as fresh:
                _exchange(fresh, buffer[:size])

        timings = tuple(TransferTiming(size, _median_s(repeats, partial(fresh_transfer, size)),
                                       warm[size])
                        for size in sizes)
    return rtt_s, bulk_bytes * 8 / bulk_s, timings


def kernel_window_bytes() -> tuple[float | None, str]:
    """Half the largest autotuned receive buffer (what Linux advertises), and a note."""
    try:
        fields = Path("/proc/sys/net/ipv4/tcp_rmem").read_text().split()
        rmem_max = float(fields[2])
    except (OSError, IndexError, ValueError):
        return None, "window: net.ipv4.tcp_rmem not readable, default 4 MiB kept"
    return rmem_max / 2, (f"window_bytes: half of net.ipv4.tcp_rmem max {rmem_max:.0f} B "
                          f"(Linux advertises about half its receive buffer)")


def slow_start_after_idle_note() -> str:
    try:
        value = Path("/proc/sys/net/ipv4/tcp_slow_start_after_idle").read_text().strip()
    except OSError:
        return "tcp_slow_start_after_idle: not readable"
    return (f"tcp_slow_start_after_idle = {value}; pooled connections are modelled warm after "
            f"their first message either way (research: disabling it changed nothing)")


def akorun_message_cost(akorun: str | None) -> tuple[tuple[float, float] | None, str]:
    """Run ``akorun measure-messages --out F``: ((fixed_s, per_byte_s) | None, note)."""
    if akorun is None:
        return None, "message cost: not measured (no akorun command on PATH)"
    with tempfile.TemporaryDirectory(prefix="akosim-calibrate-") as folder:
        out = Path(folder) / "message-cost.json"
        try:
            done = subprocess.run([akorun, "measure-messages", "--out", str(out)],
                                  capture_output=True, text=True,
                                  timeout=MEASURE_MESSAGES_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as error:
            return None, f"message cost: not measured (akorun measure-messages: {error})"
        if done.returncode != 0 or not out.exists():
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            return None, (f"message cost: not measured (akorun measure-messages exited "
                          f"{done.returncode}: {last})")
        cost = read_message_cost(out)
    return (cost.fixed_s, cost.per_byte_s), "message cost: akorun measure-messages"


def calibrate(*, message_cost: str | None = None, measure_messages: bool = True,
              repeats: int = 5, sizes: tuple[int, ...] = TRANSFER_SIZES_BYTES,
              bulk_bytes: int = BULK_BYTES, netns_rate_bps: float | None = None,
              netns_seconds: float = 3.0, netns_passes: int | None = None,
              netns_sharing_rounds: int | None = None) -> HostCalibration:
    """Measure this host and return the record (nothing written)."""
    rtt_s, bulk_bps, timings = measure_loopback(repeats, sizes=sizes, bulk_bytes=bulk_bytes)
    params = replace(TcpParameters(), base_rtt_s=rtt_s)
    measured = ["base_rtt_s"]
    notes = [f"base_rtt_s: median 1-byte ping-pong over loopback TCP ({rtt_s * 1e6:.0f} us)"]
    window, note = kernel_window_bytes()
    notes.append(note)
    if window is not None:
        params = replace(params, window_bytes=window)
        measured.append("window_bytes")
    notes.append(slow_start_after_idle_note())
    cost: tuple[float, float] | None = None
    if message_cost:
        figures = read_message_cost(message_cost)
        cost = (figures.fixed_s, figures.per_byte_s)
        notes.append(f"message cost: from {message_cost}")
    elif measure_messages:
        cost, note = akorun_message_cost(shutil.which("akorun"))
        notes.append(note)
    else:
        notes.append("message cost: not measured (--no-message-cost)")
    if cost is not None:
        params = replace(params, message_fixed_s=cost[0], message_per_byte_s=cost[1])
        measured += ["message_fixed_s", "message_per_byte_s"]
    shaped_rate_bps = None
    if netns_rate_bps:
        from akosim.calibration.netns_probe import measure_flow_sharing, measure_shaped_goodput

        passes = {} if netns_passes is None else {"passes": netns_passes}
        shaped = measure_shaped_goodput(netns_rate_bps, netns_seconds, **passes)
        shaped_rate_bps = shaped.rate_bps
        params = replace(params, measured_goodput_fraction=shaped.fraction)
        measured.append("measured_goodput_fraction")
        notes.append(f"goodput fraction: {100 * shaped.fraction:.1f}% of a tc tbf "
                     f"{netns_rate_bps / 1e6:g} Mbit/s veth pair between two namespaces, one "
                     f"connection each way at once ({100 * shaped.fractions[0]:.1f}% and "
                     f"{100 * shaped.fractions[1]:.1f}%)")
        rounds = {} if netns_sharing_rounds is None else {"rounds": netns_sharing_rounds}
        sharing = measure_flow_sharing(netns_rate_bps, **passes, **rounds)
        params = replace(params, flow_sharing_efficiency=sharing.efficiencies)
        measured.append("flow_sharing_efficiency")
        notes.append(
            "flow sharing: k = 1.." + str(len(sharing.efficiencies)) + " connections through "
            f"one port shaped as the netns testbed does (htb, drop-tail bfifo of 100 ms), "
            f"both ways, each moving {sharing.message_bytes // 1024} KiB per round "
            f"({sharing.passes} passes of {sharing.rounds} rounds, medians) carried "
            + ", ".join(f"{100 * c:.1f}%" for c in sharing.carried_fractions)
            + " of the rate; over one flow's: "
            + ", ".join(f"{e:.3f}" for e in sharing.efficiencies))
    else:
        notes.append("goodput fraction: from frame sizes (loopback has no line rate; "
                     "--netns-rate measures a shaped link)")
        notes.append("flow sharing: not measured (--netns-rate measures it); no loss from "
                     "sharing a link")
    return HostCalibration(
        tcp=params, host=host_fingerprint(),
        measured_at=datetime.now(UTC).isoformat(timespec="seconds"),
        measured=tuple(measured), notes=tuple(notes), loopback_rtt_s=rtt_s,
        loopback_goodput_bps=bulk_bps, transfers=timings, shaped_rate_bps=shaped_rate_bps)


def add_calibrate_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--out", metavar="FILE.json",
        help="write the host calibration here instead of the user's cache directory")
    add("--message-cost", metavar="FILE.json",
        help="akorun's per-message software cost from this file (what `akorun "
             "measure-messages --out` writes) instead of running that command")
    add("--no-message-cost", action="store_true",
        help="do not run akorun measure-messages (the cost is recorded as not measured)")
    add("--netns-rate", metavar="RATE",
        help="also measure the goodput fraction on a veth pair between two network "
             "namespaces shaped by tc tbf to RATE, e.g. 20mbps, and the flow sharing "
             "efficiency of 1-4 connections through one port shaped as the netns "
             "testbed does (needs root, ip and tc)")
    add("--repeats", type=int, default=5, metavar="N",
        help="timed repeats per transfer (median; default 5)")


def calibrate_command(args: argparse.Namespace) -> int:
    if args.repeats < 1:
        raise UsageError(f"--repeats: got {args.repeats}, expected >= 1")
    if args.message_cost:
        read_message_cost(args.message_cost)  # a bad file fails before minutes of measuring
    netns_rate_bps = None
    if args.netns_rate:
        from akocore.units import UnitError, parse_bandwidth, refuse_bare_number
        from akosim.calibration.netns_probe import netns_available

        try:
            refuse_bare_number(f"--netns-rate {args.netns_rate}", args.netns_rate, "mbps")
            netns_rate_bps = parse_bandwidth(args.netns_rate)
        except UnitError as error:
            raise UsageError(str(error)) from None
        why = netns_available()
        if why is not None:
            raise UsageError(f"--netns-rate: {why}")
    print("akosim: calibrating the TCP model on this host (loopback TCP, kernel settings, "
          "akorun's per-message cost)...", file=sys.stderr, flush=True)
    record = calibrate(message_cost=args.message_cost, measure_messages=not args.no_message_cost,
                       repeats=args.repeats, netns_rate_bps=netns_rate_bps)
    target = Path(args.out) if args.out else cache_file()
    try:
        write_host_calibration(record, target)
    except OSError as error:
        raise UsageError(f"--out: cannot write {target} ({error})") from None
    print(f"akosim: loopback RTT {record.tcp.base_rtt_s * 1e6:.0f} us, bulk goodput "
          f"{(record.loopback_goodput_bps or 0) / 1e9:.1f} Gbit/s")
    for timing in record.transfers:
        print(f"akosim: {timing.size_bytes / 1024:.0f} KiB: fresh connection "
              f"{timing.fresh_s * 1e3:.2f} ms, warm {timing.warm_s * 1e3:.2f} ms")
    for note in record.notes:
        print(f"akosim: {note}")
    print(f"akosim: {record.provenance()}")
    print(f"wrote {target}")
    return 0
