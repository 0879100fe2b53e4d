"""akorun's transfer speed beside a blocking socket's: ``python -m akorun.message_bench``.

This module owns the side-by-side comparison. 4 MiB messages go from this process to
a receiver in another process over loopback through a blocking socket (``sendall``
into ``recv_into`` on a preallocated buffer), akorun's data path (akorun.transport.datapath),
pipelined as a worker sends (``datapath``) and one request at a time
(``datapath_serial``), and its HTTP path, in turn within one run and repeated, so a
busy moment of the machine hits every path alike. Security is on for both akorun paths (a seal per
attempt, the body digest checked by the receiver, the tagged answer checked by the
sender). Reported: stream MB/s and its ratio to the socket, one message's round trip
(sent alone, acknowledged), and CPU seconds and page faults per message on each side,
which a loaded machine disturbs far less than wall-clock figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from akocore.hostinfo import host_fingerprint
from akocore.messages import Kind, Partial
from akorun.transport.wire import HEADER_SIZE

_SECRET = b"measure-messages: loopback only!"
STREAM_MESSAGES = 24
STREAM_MESSAGE_BYTES = 4 * 1024 * 1024
ROUND_TRIPS = 20
# the data path pipelined (several requests in flight on one connection, the default)
# and one request at a time (``datapath_serial``: what pipelining gains, same run)
_PATHS = ("socket", "datapath", "datapath_serial", "http")


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
    from akorun.testing import SinkHost
    from akorun.transport.server import Server

    async def main() -> None:
        host: Any = SinkHost(_SECRET, _BENCH_RUN, bytes(8), max_body_bytes=1 << 28)
        arrived = asyncio.Event()  # set by each arrival: no polling loop shares the server's
        sink = host.on_partial

        async def on_partial(partial: Partial, nbytes: int) -> bool:
            arrived.set()
            return bool(await sink(partial, nbytes))

        host.on_partial = on_partial
        server = Server(host)
        await server.start("127.0.0.1", port)
        ready.set()
        await arrived.wait()  # the warm-up message
        start = _usage()
        while len(host.arrivals) < count:
            arrived.clear()
            await arrived.wait()
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
SENDER_CPU_S: list[float] = []  # the sending process's CPU seconds of each timed run


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
    from akorun.transport.wire import encode_bytes

    return encode_bytes(partial, run_id=_BENCH_RUN, config_hash=bytes(8))


def socket_seconds(messages: Sequence[bytes], *, ack_each: bool) -> list[float]:
    """Seconds per message (ack_each: each sent alone and acknowledged) or, else, one
    figure: seconds for the whole stream."""
    import socket

    from akorun.launching.cluster import free_ports

    (port,) = free_ports(1)
    process, report = _spawn(_socket_receiver, port, len(messages), len(messages[0]),
                             ack_each)
    times: list[float] = []
    try:
        with socket.create_connection(("127.0.0.1", port)) as connection:
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            cpu_start_s = _usage()[0]
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
            SENDER_CPU_S.append(_usage()[0] - cpu_start_s)
    finally:
        _join(process, report)
    return times


def akorun_seconds(messages: Sequence[bytes], *, data_path: bool, ack_each: bool,
                   partials: Sequence[Partial] | None = None,
                   window: int | None = None) -> list[float]:
    """As `socket_seconds`, through PeerSender -> Server, security on. With `partials`
    (stream only), each message is encoded in a thread inside the timed loop, as a
    worker's outbox does, so the sender's body digest is timed too. `window`: requests
    in flight to the peer (None: the sender's default)."""
    from akorun.launching.cluster import free_ports
    from akorun.metrics import PeerCounters
    from akorun.transport.client import ControlClient, make_session
    from akorun.transport.keys import PARTIAL_PATH, PartialSealer, RunKeys, Signer
    from akorun.transport.sender import Outcome, Outgoing, PeerSender

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
                            window=window, sealer=PartialSealer(signer, PARTIAL_PATH))
        times: list[float] = []
        try:
            warm_partial = Partial(Kind.GRAD, 0, 10**6, 0, 1, 0, 1, np.ones(1, np.float32))
            warm = await sender.attempt(Outgoing(_encode(warm_partial), Kind.GRAD, 10**6, 0))
            assert warm is Outcome.DELIVERED, warm
            cpu_start_s = _usage()[0]
            if ack_each:
                for round_, data in enumerate(messages):
                    start_s = time.perf_counter()
                    outcome = await sender.attempt(Outgoing(data, Kind.GRAD, round_, 0))
                    times.append(time.perf_counter() - start_s)
                    assert outcome is Outcome.DELIVERED, outcome
                SENDER_CPU_S.append(_usage()[0] - cpu_start_s)
                return times
            sender.start()
            start_s = time.perf_counter()
            for round_, data in enumerate(messages):
                if partials is not None:
                    data = await asyncio.to_thread(_encode, partials[round_])
                await sender.put(Outgoing(data, Kind.GRAD, round_, 0))
            await sender.wait(lambda: sender.idle)  # woken by each delivery, no 1 ms polling
            elapsed_s = time.perf_counter() - start_s
            SENDER_CPU_S.append(_usage()[0] - cpu_start_s)
            return [elapsed_s]
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
    sender_cpu_ms: dict[str, list[float]] = {path: [] for path in _PATHS}
    for repetition in range(repetitions):
        for path in _PATHS:
            RECEIVER_USAGE.clear()
            SENDER_CPU_S.clear()
            if path == "socket":
                seconds = socket_seconds(messages, ack_each=False)[0]
                trips = socket_seconds(messages[:ROUND_TRIPS], ack_each=True)
            else:
                data_path = path != "http"
                window = 1 if path == "datapath_serial" else None
                seconds = akorun_seconds(messages, data_path=data_path, ack_each=False,
                                         window=window)[0]
                trips = akorun_seconds(messages[:ROUND_TRIPS], data_path=data_path,
                                       ack_each=True, window=window)
                if path == "datapath":
                    stream["datapath_encoding"].append(total_bytes / 1e6 / akorun_seconds(
                        messages, data_path=True, ack_each=False, partials=partials)[0])
            stream[path].append(total_bytes / 1e6 / seconds)
            if RECEIVER_USAGE:  # the first run is the stream's: per message
                cpu_s, faults = RECEIVER_USAGE[0]
                receiver_cpu_ms[path].append(cpu_s * 1e3 / len(messages))
                receiver_faults[path].append(faults / len(messages))
            if SENDER_CPU_S:
                sender_cpu_ms[path].append(SENDER_CPU_S[0] * 1e3 / len(messages))
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
            "receiver_minor_faults_per_message": receiver_faults,
            "sender_cpu_ms_per_message": sender_cpu_ms, "host": host_fingerprint()}


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
            lines.append(f"  receiver per message {path:15s} {spread(values)} ms CPU, "
                         f"{spread(faults, form='.0f')} minor page faults")
    for path, values in result["sender_cpu_ms_per_message"].items():
        if values:
            lines.append(f"  sender per message   {path:15s} {spread(values)} ms CPU "
                         f"(pre-encoded messages)")
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
