"""``akorun measure-messages``: akorun's per-message software cost, measured on loopback.

This module owns the microbenchmark and its subcommand. It starts the real server
(akorun.transport.server) on 127.0.0.1 with a host that verifies, decodes and applies what
arrives (adds it into a gradient buffer, as a node applies a partition), and sends it
messages from a real `PeerSender` lane, one at a time, sizes from 1 kB to a few MB.
Each sample is the time from before the sender encodes the message (wire header and
BLAKE3 digest) to the acknowledged answer: sealing, the data path (akorun.transport.datapath; HTTP
with ``AKORUN_PARTIALS_OVER=http``) on both sides, the receiver's seal check, body
hashing, decode, apply and the sealed answer. On loopback without
emulation the wire itself costs next to nothing, so this is the software cost that a
real network adds its transfer time to. `akocore.records.message_cost.fit_message_cost` fits
``fixed_s + per_byte_s * bytes`` and the command writes the `MessageCost` record
(akocore.records.message_cost) that ``akosim calibrate`` reads.

The sizes are timed round-robin (one message of each size per repetition), so a
change of machine load during the run spreads over every size instead of tilting the
fit. Progress goes to stderr; user mistakes exit 2 with one line.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
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
from akocore.records.message_cost import MessageCost, MessageSample, fit_message_cost
from akorun.errors import UsageError
from akorun.transport.wire import HEADER_SIZE

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
The file is an akocore.records.message_cost.MessageCost record (kind "message_cost");
`akosim calibrate` runs this command and reads it. Run it on a quiet machine.
"""


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
    from akorun.launching.cluster import free_ports
    from akorun.metrics import PeerCounters
    from akorun.transport.client import make_session
    from akorun.transport.keys import PARTIAL_PATH, PartialSealer
    from akorun.transport.sender import Outcome, Outgoing, PeerSender
    from akorun.transport.server import Server

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
    """The ``measure-messages`` subcommand, under `commands` (akorun.launching.commands)."""
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


if __name__ == "__main__":  # the side-by-side comparison (akorun.speed_bench)
    from akorun.speed_bench import main

    sys.exit(main())
