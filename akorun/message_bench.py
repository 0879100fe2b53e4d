"""``akorun measure-messages``: akorun's per-message software cost, measured on loopback.

This module owns the microbenchmark and its subcommand. It starts the real server
(akorun.server) on 127.0.0.1 with a host that verifies, decodes and applies what
arrives (adds it into a gradient buffer, as a node applies a partition), and sends it
messages from a real `PeerSender` lane, one at a time, sizes from 1 kB to a few MB.
Each sample is the time from before the sender encodes the message (wire header and
BLAKE3 digest) to the acknowledged answer: sealing, the data path (akorun.datapath; HTTP
with ``AKORUN_PARTIALS_OVER=http``) on both sides, the receiver's seal check, body
hashing, decode, apply and the sealed answer. On loopback without
emulation the wire itself costs next to nothing, so this is the software cost that a
real network adds its transfer time to. `akocore.message_cost.fit_message_cost` fits
``fixed_s + per_byte_s * bytes`` and the command writes the `MessageCost` record
(akocore.message_cost) that ``akosim calibrate`` reads.

The sizes are timed round-robin (one message of each size per repetition), so a
change of machine load during the run spreads over every size instead of tilting the
fit. Progress goes to stderr; user mistakes exit 2 with one line.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import platform
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from akocore.hostinfo import cpu_fingerprint
from akocore.message_cost import MessageCost, MessageSample, fit_message_cost
from akocore.messages import Kind, Partial
from akorun.errors import UsageError
from akorun.wire import HEADER_SIZE

DEFAULT_SIZES_BYTES = (1_000, 10_000, 100_000, 1_000_000, 4_000_000)
DEFAULT_REPETITIONS = 30
WARMUP_MESSAGES = 3  # per size, untimed: first connection, first buffers, first hash lane
_SECRET = b"measure-messages: loopback only!"

MEASURE_EPILOG = """\
examples:
  akorun measure-messages --out message-cost.json
  akorun measure-messages --out quick.json --repetitions 5 --sizes 1kB,100kB,2MB

Sends messages one at a time to a server on 127.0.0.1 (no emulation), times each
from encode to the acknowledged answer, and fits fixed_s + per_byte_s * bytes.
The file is an akocore.message_cost.MessageCost record (kind "message_cost");
`akosim calibrate` runs this command and reads it. Run it on a quiet machine.
"""


def host_fingerprint() -> str:
    """CPU model, logical cores, machine type and Python: what the cost rests on."""
    return f"{cpu_fingerprint()} Python {platform.python_version()}"


def _applying_sink() -> Any:
    """A SinkHost that also adds each body into a gradient buffer (a node's apply)."""
    from akorun.testing import SinkHost

    class ApplyingSink(SinkHost):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__(_SECRET, uuid.uuid4().bytes, bytes(8), max_body_bytes=1 << 28)
            self.gradient = np.zeros(0, np.float32)

        async def on_partial(self, partial: Partial, nbytes: int) -> bool:
            values = partial.values
            if values is not None and values.size:
                if self.gradient.size < values.size:
                    self.gradient = np.zeros(values.size, np.float32)
                self.gradient[:values.size] += values
            self.arrivals.clear()  # keep nothing per message
            return await super().on_partial(partial, nbytes)

    return ApplyingSink()


async def measure(sizes_bytes: Sequence[int], repetitions: int,
                  progress: Callable[[str], None] = lambda line: None) -> list[MessageSample]:
    """Time `repetitions` messages of each size (wire bytes), round-robin over sizes."""
    from akorun.client import make_session
    from akorun.cluster import free_ports
    from akorun.keys import PARTIAL_PATH, PartialSealer
    from akorun.metrics import PeerCounters
    from akorun.sender import Outcome, Outgoing, PeerSender
    from akorun.server import Server

    host = _applying_sink()
    (port,) = free_ports(1)
    server = Server(host, max_concurrent_reads=4)
    await server.start("127.0.0.1", port)
    session = make_session(peers=1)
    signer = host.peer_signer(0)
    sender = PeerSender(host.rank, f"http://127.0.0.1:{port}{PARTIAL_PATH}", session,
                        counters=PeerCounters(), window=1,
                        sealer=PartialSealer(signer, PARTIAL_PATH))
    rng = np.random.default_rng(0)
    lengths = [max(1, (size - HEADER_SIZE) // 4) for size in sizes_bytes]
    payloads = [rng.standard_normal(length).astype(np.float32) for length in lengths]
    samples: list[MessageSample] = []
    round_ = 0

    async def one(values: np.ndarray) -> tuple[int, float]:
        nonlocal round_
        round_ += 1
        start_s = time.perf_counter()
        partial = Partial(Kind.GRAD, 0, round_, 0, 1, 0, values.size, values)
        data = signer.encode(partial)
        outcome = await sender.attempt(Outgoing(data, Kind.GRAD, round_, 0))
        elapsed_s = time.perf_counter() - start_s
        if outcome is not Outcome.DELIVERED:
            raise RuntimeError(f"the loopback server answered {outcome.value} to a "
                               f"{len(data)}-byte message")
        return len(data), elapsed_s

    try:
        for values in payloads:
            for _ in range(WARMUP_MESSAGES):
                await one(values)
        for repetition in range(repetitions):
            for values in payloads:
                nbytes, elapsed_s = await one(values)
                samples.append(MessageSample(nbytes, elapsed_s))
            progress(f"measure-messages: repetition {repetition + 1}/{repetitions}")
    finally:
        await session.close()
        await server.close()
    return samples


def message_cost(samples: Sequence[MessageSample], repetitions: int) -> MessageCost:
    fixed_s, per_byte_s = fit_message_cost(samples)
    measured_at = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    return MessageCost(fixed_s, per_byte_s, tuple(samples), host_fingerprint(), measured_at,
                       repetitions)


# ------------------------------------------------------------------------ the subcommand


def _sizes(text: str) -> tuple[int, ...]:
    from akocore.units import UnitError, parse_size

    sizes = []
    for item in text.split(","):
        try:
            size = parse_size(item.strip())
        except (UnitError, ValueError):
            raise UsageError(f"--sizes: got {item.strip()!r}, expected sizes such as "
                             f"1kB,100kB,2MB") from None
        if not HEADER_SIZE + 4 <= size <= 256_000_000:
            raise UsageError(f"--sizes: {item.strip()!r} is outside {HEADER_SIZE + 4} B to "
                             f"256 MB")
        sizes.append(size)
    if len(set(sizes)) < 2:
        raise UsageError("--sizes: give at least two different sizes (the fit needs a slope)")
    return tuple(sorted(set(sizes)))


def add_parser(commands: Any, formatter_class: Any) -> None:
    """The ``measure-messages`` subcommand, under `commands` (akorun.cli)."""
    sub = commands.add_parser(
        "measure-messages", help="measure akorun's per-message software cost on loopback",
        description="Time messages of several sizes through akorun's real sender and "
                    "server on 127.0.0.1 (no emulation) and fit fixed_s + per_byte_s * bytes.",
        epilog=MEASURE_EPILOG, formatter_class=formatter_class)
    sub.add_argument("--out", metavar="FILE.json", required=True,
                     help="where to write the MessageCost record")
    sub.add_argument("--repetitions", metavar="N", default=str(DEFAULT_REPETITIONS),
                     help=f"timed messages per size (default {DEFAULT_REPETITIONS})")
    sub.add_argument("--sizes", metavar="SIZE,...",
                     default=",".join(f"{s}B" for s in DEFAULT_SIZES_BYTES),
                     help="message sizes on the wire (default 1kB,10kB,100kB,1MB,4MB)")
    sub.set_defaults(handler=cmd_measure_messages)


def cmd_measure_messages(args: argparse.Namespace) -> int:
    try:
        repetitions = int(args.repetitions)
    except ValueError:
        repetitions = 0
    if repetitions < 1:
        raise UsageError(f"--repetitions: got {args.repetitions!r}, expected a whole "
                         f"number >= 1")
    sizes = _sizes(args.sizes)
    out = Path(args.out)
    if not out.parent.is_dir():
        raise UsageError(f"--out: directory {str(out.parent)!r} does not exist")

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    progress(f"measure-messages: {len(sizes)} sizes x {repetitions} messages on loopback")
    samples = asyncio.run(measure(sizes, repetitions, progress))
    record = message_cost(samples, repetitions)
    out.write_text(json.dumps(record.to_json(), indent=1) + "\n", encoding="utf-8")
    progress(f"measure-messages: fixed {record.fixed_s * 1e3:.3f} ms + "
             f"{record.per_byte_s * 1e9:.3f} ns/B (1 MB: {record.cost_s(1e6) * 1e3:.2f} ms) "
             f"-> {out}")
    return 0


# ------------------------------------------------- side by side with a blocking socket
#
# ``python -m akorun.message_bench``: 4 MiB messages from this process to a receiver in
# another process over loopback, through a blocking socket (``sendall`` into
# ``recv_into`` on a preallocated buffer), akorun's data path (akorun.datapath) and its
# HTTP path, in turn within one run and repeated, so a busy moment of the machine hits
# every path alike. Security is on for both akorun paths (seal per attempt, body digest
# checked by the receiver, tagged answer checked by the sender).

STREAM_MESSAGES = 24
STREAM_MESSAGE_BYTES = 4 * 1024 * 1024
ROUND_TRIPS = 20
_PATHS = ("socket", "datapath", "http")


def _usage() -> tuple[float, int]:
    """(CPU seconds, minor page faults) of this process so far."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime, usage.ru_minflt


def _socket_receiver(port: int, ready: Any, report: Any, count: int, nbytes: int,
                     ack_each: bool) -> None:
    import socket

    buffer = bytearray(nbytes)
    view = memoryview(buffer)
    with socket.create_server(("127.0.0.1", port)) as server:
        ready.set()
        connection, _ = server.accept()
        with connection:
            start = _usage()
            for _ in range(count):
                filled = 0
                while filled < nbytes:
                    got = connection.recv_into(view[filled:], nbytes - filled)
                    if not got:
                        return
                    filled += got
                if ack_each:
                    connection.sendall(b"k")
            if not ack_each:
                connection.sendall(b"k")
            end = _usage()
    report.put((end[0] - start[0], end[1] - start[1]))


def _akorun_receiver(port: int, ready: Any, report: Any, count: int) -> None:
    from akorun.server import Server
    from akorun.testing import SinkHost

    async def main() -> None:
        host = SinkHost(_SECRET, _BENCH_RUN, bytes(8), max_body_bytes=1 << 28)
        server = Server(host)
        await server.start("127.0.0.1", port)
        ready.set()
        while not host.arrivals:  # the warm-up message
            await asyncio.sleep(0.001)
        start = _usage()
        while len(host.arrivals) < count:
            await asyncio.sleep(0.001)
        end = _usage()
        report.put((end[0] - start[0], end[1] - start[1]))
        await asyncio.sleep(0.2)
        await server.close()

    asyncio.run(main())


_BENCH_RUN = uuid.UUID(int=7).bytes


def _spawn(target: Any, *args: Any) -> Any:
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    ready = context.Event()
    report = context.Queue()
    process = context.Process(target=target, args=(args[0], ready, report, *args[1:]),
                              daemon=True)
    process.start()
    if not ready.wait(60):
        raise RuntimeError("the receiver did not start")
    return process, report


RECEIVER_USAGE: list[tuple[float, int]] = []  # (CPU s, minor faults) of each run's receiver


def _join(process: Any, report: Any) -> None:
    import queue

    try:
        RECEIVER_USAGE.append(report.get(timeout=30))
    except queue.Empty:
        pass
    process.join(10)


def _bench_partials(count: int, nbytes: int) -> list[Partial]:
    length = (nbytes - HEADER_SIZE) // 4
    rng = np.random.default_rng(1)
    return [Partial(Kind.GRAD, 0, round_, 0, 1, 0, length,
                    rng.standard_normal(length).astype(np.float32)) for round_ in range(count)]


def _encode(partial: Partial) -> bytes:
    from akorun.wire import encode_bytes

    return encode_bytes(partial, run_id=_BENCH_RUN, config_hash=bytes(8))


def socket_seconds(messages: Sequence[bytes], *, ack_each: bool) -> list[float]:
    """Seconds per message (ack_each: each sent alone and acknowledged) or, else, one
    figure: seconds for the whole stream."""
    import socket

    from akorun.cluster import free_ports

    (port,) = free_ports(1)
    process, report = _spawn(_socket_receiver, port, len(messages), len(messages[0]),
                             ack_each)
    times: list[float] = []
    try:
        with socket.create_connection(("127.0.0.1", port)) as connection:
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            start_s = time.perf_counter()
            for data in messages:
                connection.sendall(data)
                if ack_each:
                    assert connection.recv(1) == b"k"
                    now_s = time.perf_counter()
                    times.append(now_s - start_s)
                    start_s = now_s
            if not ack_each:
                assert connection.recv(1) == b"k"
                times.append(time.perf_counter() - start_s)
    finally:
        _join(process, report)
    return times


def akorun_seconds(messages: Sequence[bytes], *, data_path: bool, ack_each: bool,
                   partials: Sequence[Partial] | None = None) -> list[float]:
    """As `socket_seconds`, through PeerSender -> Server, security on. With `partials`
    (stream only), each message is encoded in a thread inside the timed loop, as a
    worker's outbox does, so the sender's body digest is timed too."""
    from akorun.client import ControlClient, make_session
    from akorun.cluster import free_ports
    from akorun.keys import PARTIAL_PATH, PartialSealer, RunKeys, Signer
    from akorun.metrics import PeerCounters
    from akorun.sender import Outcome, Outgoing, PeerSender

    (port,) = free_ports(1)
    process, report = _spawn(_akorun_receiver, port, len(messages) + 1)
    url = f"http://127.0.0.1:{port}"

    async def main() -> list[float]:
        session = make_session(peers=1)
        signer = Signer(RunKeys.from_secret(_SECRET, _BENCH_RUN, 0, 2, bytes(8)))
        failed = await ControlClient(session, signer, [url, url]).discover(1)
        assert failed is None, failed
        sender = PeerSender(1, url + PARTIAL_PATH, session, counters=PeerCounters(),
                            maxsize=len(messages) + 1, data_path=data_path,
                            sealer=PartialSealer(signer, PARTIAL_PATH))
        times: list[float] = []
        try:
            warm_partial = Partial(Kind.GRAD, 0, 10**6, 0, 1, 0, 1, np.ones(1, np.float32))
            warm = await sender.attempt(Outgoing(_encode(warm_partial), Kind.GRAD, 10**6, 0))
            assert warm is Outcome.DELIVERED, warm
            if ack_each:
                for round_, data in enumerate(messages):
                    start_s = time.perf_counter()
                    outcome = await sender.attempt(Outgoing(data, Kind.GRAD, round_, 0))
                    times.append(time.perf_counter() - start_s)
                    assert outcome is Outcome.DELIVERED, outcome
                return times
            sender.start()
            start_s = time.perf_counter()
            for round_, data in enumerate(messages):
                if partials is not None:
                    data = await asyncio.to_thread(_encode, partials[round_])
                await sender.put(Outgoing(data, Kind.GRAD, round_, 0))
            await sender.wait(lambda: sender.idle, poll_s=0.001)
            return [time.perf_counter() - start_s]
        finally:
            await sender.stop()
            await session.close()

    try:
        return asyncio.run(main())
    finally:
        _join(process, report)


def compare(repetitions: int, progress: Callable[[str], None]) -> dict[str, Any]:
    """Stream MB/s and one message's round trip per path, paths in turn, `repetitions`
    times; every figure of every repetition, and the ratios to the socket per repetition."""
    partials = _bench_partials(STREAM_MESSAGES, STREAM_MESSAGE_BYTES)
    messages = [_encode(partial) for partial in partials]
    total_bytes = sum(map(len, messages))
    stream: dict[str, list[float]] = {path: [] for path in (*_PATHS, "datapath_encoding")}
    trip: dict[str, list[float]] = {path: [] for path in _PATHS}
    receiver_cpu_ms: dict[str, list[float]] = {path: [] for path in _PATHS}
    receiver_faults: dict[str, list[float]] = {path: [] for path in _PATHS}
    for repetition in range(repetitions):
        for path in _PATHS:
            RECEIVER_USAGE.clear()
            if path == "socket":
                seconds = socket_seconds(messages, ack_each=False)[0]
                trips = socket_seconds(messages[:ROUND_TRIPS], ack_each=True)
            else:
                data_path = path == "datapath"
                seconds = akorun_seconds(messages, data_path=data_path, ack_each=False)[0]
                trips = akorun_seconds(messages[:ROUND_TRIPS], data_path=data_path,
                                       ack_each=True)
                if data_path:
                    stream["datapath_encoding"].append(total_bytes / 1e6 / akorun_seconds(
                        messages, data_path=True, ack_each=False, partials=partials)[0])
            stream[path].append(total_bytes / 1e6 / seconds)
            if RECEIVER_USAGE:  # the first run is the stream's: per message
                cpu_s, faults = RECEIVER_USAGE[0]
                receiver_cpu_ms[path].append(cpu_s * 1e3 / len(messages))
                receiver_faults[path].append(faults / len(messages))
            trip[path].append(float(np.median(trips)))
        progress(f"message_bench: repetition {repetition + 1}/{repetitions}: " + ", ".join(
            f"{path} {stream[path][-1]:.0f} MB/s" for path in stream))
    ratios = {path: [a / b for a, b in zip(stream[path], stream["socket"], strict=True)]
              for path in stream if path != "socket"}
    trip_ratios = {path: [a / b for a, b in zip(trip[path], trip["socket"], strict=True)]
                   for path in trip if path != "socket"}
    return {"message_bytes": len(messages[0]), "stream_messages": STREAM_MESSAGES,
            "round_trips": ROUND_TRIPS, "stream_mb_per_s": stream,
            "stream_ratio_to_socket": ratios, "round_trip_s": trip,
            "round_trip_over_socket": trip_ratios,
            "receiver_cpu_ms_per_message": receiver_cpu_ms,
            "receiver_minor_faults_per_message": receiver_faults, "host": host_fingerprint()}


def _summary(result: dict[str, Any]) -> str:
    lines = [f"{result['message_bytes'] / 2**20:.2f} MiB messages on loopback, "
             f"{len(result['stream_mb_per_s']['socket'])} repetitions (median [min-max])"]

    def spread(values: list[float], scale: float = 1.0, form: str = ".2f") -> str:
        return (f"{np.median(values) * scale:{form}} [{min(values) * scale:{form}}-"
                f"{max(values) * scale:{form}}]")

    for path, values in result["stream_mb_per_s"].items():
        ratio = result["stream_ratio_to_socket"].get(path)
        lines.append(f"  stream {path:18s} {spread(values, form='.0f')} MB/s"
                     + (f"  ratio to socket {spread(ratio)}" if ratio else ""))
    for path, values in result["round_trip_s"].items():
        ratio = result["round_trip_over_socket"].get(path)
        lines.append(f"  round trip {path:14s} {spread(values, 1e3)} ms"
                     + (f"  x socket {spread(ratio)}" if ratio else ""))
    for path, values in result["receiver_cpu_ms_per_message"].items():
        faults = result["receiver_minor_faults_per_message"][path]
        if values:
            lines.append(f"  receiver per message {path:8s} {spread(values)} ms CPU, "
                         f"{spread(faults, form='.0f')} minor page faults")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m akorun.message_bench",
        description="4 MiB messages over loopback: a blocking socket, akorun's data path and "
                    "its HTTP path side by side (stream MB/s, one message's round trip).")
    parser.add_argument("--repetitions", type=int, default=3, metavar="N")
    parser.add_argument("--out", metavar="FILE.json", help="also write every figure here")
    args = parser.parse_args(argv)
    if args.repetitions < 1:
        print(f"--repetitions: got {args.repetitions}, expected >= 1", file=sys.stderr)
        return 2
    result = compare(args.repetitions, lambda line: print(line, file=sys.stderr, flush=True))
    print(_summary(result))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
