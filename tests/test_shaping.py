"""akorun.transport.emulated_links: token-bucket pacing, shared uplink, latency and paced
body chunks.

Exact timing is checked on `VirtualClockLoop`, an event loop whose clock jumps
to the next timer instead of sleeping, so these tests are exact and instant.
Tests on a real loop only assert lower bounds, which a busy machine cannot break.
Async code runs through `asyncio.Runner` / `asyncio.run` (no pytest-asyncio).
"""

from __future__ import annotations

import asyncio
import math
import selectors
import socket
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import numpy as np
import pytest

from akocore.messages import Kind, Partial
from akorun.transport import wire
from akorun.transport.emulated_links import PIECE_BYTES, DownlinkShaper, LinkShaper, SerialLink

T = TypeVar("T")

MBIT = 1e6


class _JumpingSelector(selectors.DefaultSelector):
    """Polls instead of blocking; a wait with nothing ready advances the loop's clock."""

    def __init__(self, advance: Callable[[float], None]) -> None:
        super().__init__()
        self._advance = advance

    def select(self, timeout: float | None = None) -> list[tuple[Any, int]]:
        if timeout is None:  # nothing scheduled: only I/O can wake us
            return super().select(None)
        events = super().select(0)
        if not events and timeout > 0:
            self._advance(timeout)
        return events


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """An event loop on virtual time: sleeps take no wall time and are exact."""

    def __init__(self) -> None:
        self._virtual_s = 0.0
        super().__init__(_JumpingSelector(self._advance))

    def _advance(self, seconds: float) -> None:
        self._virtual_s += seconds

    def time(self) -> float:
        return self._virtual_s


def run_virtual(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    with asyncio.Runner(loop_factory=VirtualClockLoop) as runner:
        return runner.run(main())


def now() -> float:
    return asyncio.get_running_loop().time()


async def timed(awaitable: Awaitable[object]) -> float:
    start = now()
    await awaitable
    return now() - start


# --- SerialLink ------------------------------------------------------------


def test_virtual_clock_loop_sleeps_exactly_and_instantly() -> None:
    async def main() -> float:
        await asyncio.sleep(3600)
        return now()

    assert run_virtual(main) == 3600


def test_serial_link_takes_nbytes_over_rate_and_serialises_reservations() -> None:
    async def main() -> tuple[float, float]:
        wire = SerialLink(8 * MBIT)  # 1e6 bytes/s
        first = await timed(wire.send(1_000_000))
        second = await timed(wire.send(500_000))
        return first, second

    assert run_virtual(main) == pytest.approx((1.0, 0.5), abs=1e-9)


def test_serial_link_gives_no_credit_for_idle_time() -> None:
    # a link idle for a whole compute phase still takes its full time for the next message
    async def main() -> float:
        wire = SerialLink(8 * MBIT)
        await wire.send(1000)
        await asyncio.sleep(0.5)
        return await timed(wire.send(100_000))

    assert run_virtual(main) == pytest.approx(0.1, abs=1e-9)


def test_serial_link_chains_from_the_virtual_end_so_timer_lateness_is_not_lost() -> None:
    wire = SerialLink(8 * MBIT)
    end = wire.reserve(0.0, 100_000)
    assert end == pytest.approx(0.1)
    # the sender woke 30 ms late but chains from the virtual end: no bandwidth lost
    assert wire.reserve(end, 100_000) == pytest.approx(0.2)
    # a transmission ready while the wire is busy waits for it
    assert wire.reserve(0.05, 100_000) == pytest.approx(0.3)


def test_serial_link_rejects_nonsense_parameters() -> None:
    for rate in (0.0, -1.0, math.nan):
        with pytest.raises(ValueError, match="rate_bps"):
            SerialLink(rate)
    with pytest.raises(ValueError, match="nbytes"):
        SerialLink(MBIT).reserve(0.0, -1)


def test_real_loop_pacing_of_1_mb_at_8_mbit_takes_at_least_1_s() -> None:
    async def main() -> float:
        return await timed(LinkShaper(8 * MBIT).pace(1, 1_000_000))

    assert asyncio.run(main()) >= 1.0 - 1e-3  # exactly 1 s of wire time; never less


def _admit_times(downlink_bps: float, sender_bps: float, arrivals: list[tuple[float, int]],
                 wire_s: float | None = None) -> list[float]:
    """Finish time of each (arrival time, bytes) message through one DownlinkShaper."""
    async def main() -> list[float]:
        shaper = DownlinkShaper(downlink_bps, lambda _sender: sender_bps)
        loop = asyncio.get_running_loop()
        start = loop.time()
        finished: list[float] = [0.0] * len(arrivals)

        async def one(index: int, at_s: float, nbytes: int) -> None:
            await asyncio.sleep(at_s)
            await shaper.admit(index, nbytes, wire_s)
            finished[index] = loop.time() - start

        await asyncio.gather(*(one(i, t, b) for i, (t, b) in enumerate(arrivals)))
        return finished

    return run_virtual(main)


def test_downlink_does_not_delay_one_message_from_a_slower_or_equal_sender() -> None:
    # 100 kB from a 8 Mbit/s sender took 0.1 s to arrive; the 8 Mbit/s downlink kept up
    assert _admit_times(8 * MBIT, 8 * MBIT, [(0.1, 100_000)]) == pytest.approx([0.1], abs=1e-9)
    assert _admit_times(16 * MBIT, 8 * MBIT, [(0.1, 100_000)]) == pytest.approx([0.1], abs=1e-9)


def test_incast_of_k_messages_finishes_when_the_fluid_model_says() -> None:
    # three senders at 8 Mbit/s start 100 kB each at t=0 towards a 12 Mbit/s downlink:
    # the fluid model delivers the last byte at 3 x 100 kB / 1.5e6 B/s = 0.2 s
    finished = _admit_times(12 * MBIT, 8 * MBIT, [(0.1, 100_000)] * 3)
    assert max(finished) == pytest.approx(0.2, abs=1e-9)
    assert sorted(finished)[0] == pytest.approx(0.1, abs=1e-9)


def test_messages_slowed_by_their_senders_shared_uplinks_are_not_held_again() -> None:
    # three 100 kB messages that each took 0.3 s on the wire (their senders' uplinks were
    # shared three ways) arrive together: a 8 Mbit/s downlink carried all 300 kB meanwhile
    together = [(0.3, 100_000)] * 3
    assert _admit_times(8 * MBIT, 8 * MBIT, together, wire_s=0.3) == pytest.approx(
        [0.3, 0.3, 0.3], abs=1e-9)
    # without the sender's report, each is assumed to have come at the link's full rate
    assert max(_admit_times(8 * MBIT, 8 * MBIT, together)) == pytest.approx(0.5, abs=1e-9)


def test_held_messages_share_the_downlink_equally() -> None:
    # two 100 kB messages from unshaped senders, no credit: both through at 0.2 s (fair
    # share, as akosim's flows), not one at 0.1 s and the other at 0.2 s (FIFO)
    assert _admit_times(8 * MBIT, math.inf, [(0.0, 100_000)] * 2) == pytest.approx(
        [0.2, 0.2], abs=1e-9)
    # a later, smaller message gets its share at once
    finished = _admit_times(8 * MBIT, math.inf, [(0.0, 100_000), (0.05, 10_000)])
    assert finished == pytest.approx([0.11, 0.07], abs=1e-9)


def test_a_cancelled_held_message_gives_its_share_back() -> None:
    async def main() -> float:
        shaper = DownlinkShaper(8 * MBIT, lambda _sender: math.inf)
        loop = asyncio.get_running_loop()
        kept = asyncio.create_task(shaper.admit(0, 100_000))
        dropped = asyncio.create_task(shaper.admit(1, 100_000))
        await asyncio.sleep(0.05)  # each got 25 kB through
        dropped.cancel()
        await kept
        return loop.time()

    assert run_virtual(main) == pytest.approx(0.05 + 75_000 / 1e6, abs=1e-9)


def test_downlink_idle_time_is_not_banked_beyond_one_message() -> None:
    # after 10 s idle, two messages arriving together still share the downlink
    finished = _admit_times(8 * MBIT, 8 * MBIT,
                            [(0.1, 100_000), (10.1, 100_000), (10.1, 100_000)])
    assert finished[0] == pytest.approx(0.1, abs=1e-9)
    assert max(finished) == pytest.approx(10.2, abs=1e-9)


def test_downlink_rejects_a_non_positive_rate() -> None:
    with pytest.raises(ValueError, match="downlink_bps"):
        DownlinkShaper(0.0, lambda _sender: MBIT)


def test_infinite_rate_never_sleeps(monkeypatch: pytest.MonkeyPatch) -> None:
    async def no_sleep(delay: float) -> None:
        raise AssertionError(f"slept {delay} s")

    monkeypatch.setattr(asyncio, "sleep", no_sleep)  # what akorun.transport.emulated_links awaits

    async def main() -> float:
        shaper = LinkShaper(math.inf)
        downlink = DownlinkShaper(math.inf, lambda _sender: MBIT)
        start = now()
        for _ in range(3):
            await shaper.pace(1, 10**9)
            await shaper.transfer(2, 10**9)
            await downlink.admit(1, 10**9)
        return now() - start

    assert run_virtual(main) == 0.0


# --- LinkShaper ------------------------------------------------------------


def test_shared_uplink_makes_two_destinations_share_its_rate_piece_by_piece() -> None:
    async def main() -> list[float]:
        shaper = LinkShaper(8 * MBIT)

        async def send(dest: int) -> float:
            await shaper.pace(dest, 1_000_000)
            return now()

        return list(await asyncio.gather(send(1), send(2)))

    ends = run_virtual(main)
    assert max(ends) == pytest.approx(2.0, abs=1e-9)
    # interleaved piece by piece: neither got the whole uplink first
    assert min(ends) >= 2.0 - PIECE_BYTES / 1e6 - 1e-9


def test_a_link_cap_and_the_uplink_pace_a_piece_together_not_one_after_the_other() -> None:
    # link 2 Mbit/s under an 8 Mbit/s uplink: 500 kB takes 2 s, not 2 s + 0.5 s
    async def main() -> float:
        return await timed(LinkShaper(8 * MBIT, link_bps={1: 2 * MBIT}).pace(1, 500_000))

    assert run_virtual(main) == pytest.approx(2.0, abs=1e-9)


def test_a_queued_message_continues_where_the_previous_one_ended() -> None:
    # a message ready at t=0 behind another starts at the previous one's virtual end,
    # however late its lane woke up
    async def main() -> float:
        shaper = LinkShaper(8 * MBIT)
        await shaper.pace(1, 100_000, ready_s=0.0)
        await asyncio.sleep(0.03)  # the lane is late
        await shaper.pace(1, 100_000, ready_s=0.0)
        return now()

    assert run_virtual(main) == pytest.approx(0.2, abs=1e-9)


def test_real_loop_shared_uplink_takes_at_least_the_sum_over_the_rate() -> None:
    async def main() -> float:
        shaper = LinkShaper(8 * MBIT)
        return await timed(asyncio.gather(shaper.pace(1, 250_000), shaper.pace(2, 250_000)))

    assert asyncio.run(main()) >= 0.5 - 1e-3


def test_link_cap_slows_its_destination_and_leaves_the_rest_to_others() -> None:
    async def main() -> dict[int, float]:
        shaper = LinkShaper(8 * MBIT, link_bps={1: 2 * MBIT})
        ends: dict[int, float] = {}

        async def send(dest: int, nbytes: int) -> None:
            await shaper.pace(dest, nbytes)
            ends[dest] = now()

        await asyncio.gather(send(1, 500_000), send(2, 1_500_000))
        return ends

    ends = run_virtual(main)
    # dest 1 is held to 250 kB/s by its link; queueing for the busy uplink adds at most
    # about one piece of delay to its last piece
    link_bound_s = 500_000 / 250e3
    assert link_bound_s - 1e-9 <= ends[1] <= link_bound_s + 2 * PIECE_BYTES / 1e6
    # the uplink as a whole still moves 1 MB/s: dest 2 finishes when both are through
    assert ends[2] == pytest.approx(2.0, abs=PIECE_BYTES / 1e6)


def test_link_rates_and_latencies_may_be_functions() -> None:
    shaper = LinkShaper(MBIT, link_bps=lambda dest: dest * MBIT, latency_s=lambda dest: dest / 1000)
    assert shaper.link(3).rate_bps == 3 * MBIT
    assert shaper.link(3) is shaper.link(3)
    assert shaper.latency_of(5) == 0.005
    table = LinkShaper(MBIT, link_bps={1: 5 * MBIT}, latency_s={1: 0.02})
    assert table.link(2).unlimited and table.latency_of(2) == 0.0
    with pytest.raises(ValueError, match="latency"):
        LinkShaper(MBIT, latency_s={1: -1.0}).latency_of(1)


def test_transfer_charges_latency_after_the_bytes() -> None:
    async def main() -> float:
        shaper = LinkShaper(8 * MBIT, latency_s={1: 0.05})
        return await timed(shaper.transfer(1, 100_000))

    assert run_virtual(main) == pytest.approx(0.1 + 0.05, abs=1e-9)


async def collect(chunks: Any) -> list[tuple[float, bytes]]:
    return [(now(), bytes(chunk)) async for chunk in chunks]


def test_chunks_yield_head_then_the_whole_body_in_order_as_zero_copy_slices() -> None:
    body = np.arange(100_000, dtype="<f4")
    view = body.data.cast("B")

    async def main() -> list[memoryview]:
        shaper = LinkShaper(math.inf)
        return [chunk async for chunk in shaper.chunks(7, view, 4096, head=b"HEAD")]

    chunks = run_virtual(main)
    assert bytes(chunks[0]) == b"HEAD"
    assert b"".join(chunks[1:]) == body.tobytes()
    assert all(len(chunk) == 4096 for chunk in chunks[1:-1])
    assert all(chunk.obj is body for chunk in chunks[1:])


def test_chunks_are_paced_and_the_last_one_waits_for_the_latency() -> None:
    async def main() -> list[tuple[float, bytes]]:
        shaper = LinkShaper(8 * MBIT, latency_s={1: 0.05})
        return await collect(shaper.chunks(1, bytes(200_000), 50_000))

    times = [t for t, _ in run_virtual(main)]
    # 50 kB per 50 ms; then the latency
    assert times[0] == pytest.approx(0.05, abs=1e-9)
    transfer_end_s = 200_000 / 1e6
    assert times[-1] == pytest.approx(transfer_end_s + 0.05, abs=1e-9)
    assert times == sorted(times)


def test_latency_does_not_hold_the_uplink_for_other_messages() -> None:
    async def main() -> tuple[float, float]:
        shaper = LinkShaper(8 * MBIT, latency_s={1: 1.0})
        slow = asyncio.create_task(collect(shaper.chunks(1, bytes(50_000))))
        await asyncio.sleep(0)
        other = await timed(shaper.transfer(2, 100_000))
        return other, (await slow)[-1][0]

    other, slow_end = run_virtual(main)
    # the uplink was free during dest 1's latency: only its 50 ms of bytes came first
    assert other == pytest.approx(0.15, abs=1e-9)
    assert slow_end == pytest.approx(1.05, abs=1e-9)


def test_empty_body_still_takes_the_latency() -> None:
    async def main() -> float:
        shaper = LinkShaper(MBIT, latency_s={1: 0.25})
        return await timed(collect(shaper.chunks(1, b"")))

    assert run_virtual(main) == pytest.approx(0.25, abs=1e-9)


# --- paced chunks as an aiohttp streaming body ------------------------------


def test_paced_chunks_stream_a_wire_message_through_aiohttp() -> None:
    """A real POST: the server streams into a preallocated buffer and verifies as it reads."""
    from aiohttp import ClientSession, web

    run_id, config_hash = bytes(range(16)), bytes(8)
    values = np.random.default_rng(0).standard_normal(100_000).astype("<f4")
    partial = Partial(Kind.GRAD, sender=1, round=4, part=0, p=2, offset=0, length=values.size,
                      values=values)  # fmt: skip
    received: list[Partial] = []

    async def push(request: web.Request) -> web.Response:
        head = await request.content.readexactly(wire.HEADER_SIZE)
        try:
            header = wire.decode_header(
                head,
                max_body_bytes=1 << 20,
                body_nbytes=(request.content_length or 0) - wire.HEADER_SIZE,
            )
            wire.check_run(header, run_id, config_hash)
            buffer = np.empty(header.length, dtype="<f4")
            into = buffer.data.cast("B")
            verifier = wire.BodyHasher()
            filled = 0
            async for chunk in request.content.iter_chunked(32 * 1024):
                into[filled : filled + len(chunk)] = chunk
                verifier.update(chunk)
                filled += len(chunk)
            verifier.check(header.digest)
        except wire.WireError as err:
            return web.Response(status=int(err.status), text=err.reason)
        received.append(wire.to_partial(header, buffer))
        return web.Response(status=int(wire.Status.OK))

    async def main() -> tuple[int, float]:
        app = web.Application()
        app.router.add_post("/v1/grad", push)
        runner = web.AppRunner(app)
        await runner.setup()
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        site = web.TCPSite(runner, "127.0.0.1", port)
        await site.start()
        try:
            header, body = wire.encode(partial, run_id=run_id, config_hash=config_hash)
            shaper = LinkShaper(32 * MBIT)  # 4 MB/s
            start = now()
            async with ClientSession() as session:
                async with session.post(
                    f"http://127.0.0.1:{port}/v1/grad",
                    data=shaper.chunks(0, body, head=header),
                    headers={"Content-Length": str(len(header) + len(body))},
                ) as response:
                    await response.read()
                    return response.status, now() - start
        finally:
            await runner.cleanup()

    status, elapsed_s = asyncio.run(main())
    assert status == 200
    assert elapsed_s >= (wire.HEADER_SIZE + values.nbytes) / 4e6 - 1e-3
    (got,) = received
    assert got.key == partial.key and got.values is not None
    np.testing.assert_array_equal(got.values, values)
