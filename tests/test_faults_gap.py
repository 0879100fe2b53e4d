"""No permanent gap after a suspension: what a suspended peer's full queue folds comes back.

`OwedGap` alone (the folded rounds given back as one message summing them,
one per range of consecutive rounds, the final marker kept) and a
`PeerSender` on loopback whose receiver answers 503 while the peer is
suspended: the oldest messages fold, and once the peer is back every round
arrives exactly once with the same total of values.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import numpy as np
import pytest

from akocore.messages import Kind, Partial
from akocore.partition import partition_slice
from akorun.launching.cluster import free_ports
from akorun.metrics import PeerCounters
from akorun.testing import SinkHost
from akorun.transport.keys import PARTIAL_PATH, PartialSealer
from akorun.transport.sender import Outgoing, OwedGap, PeerSender, RetryPolicy
from akorun.transport.server import Server

pytestmark = pytest.mark.timeout(60)

SECRET = b"faults gap test secret, 32 bytes"
RUN = uuid.uuid4().bytes
WIRE_HASH = bytes.fromhex("8899aabbccddeeff")
LENGTH, P = 9, 3


def grad(round_: int, *, final: bool = False) -> Partial:
    part = round_ % P
    start, stop = partition_slice(LENGTH, P, part)
    values = np.arange(start, stop, dtype=np.float32) + round_ * 10.0
    return Partial(Kind.GRAD, 0, round_, part, P, start, stop - start, values, final)


def total(messages: list[Partial]) -> np.ndarray:
    out = np.zeros(LENGTH, np.float64)
    for m in messages:
        if m.values is not None and m.length:
            out[m.offset:m.offset + m.length] += m.values
    return out


def test_a_gap_gives_back_every_folded_round_in_one_message_with_the_same_sum() -> None:
    folded = [grad(r) for r in range(3, 11)]
    gap = OwedGap()
    for m in folded:
        gap.fold(m)
    assert len(gap) == 1 and gap.highest_round == 10 and gap.oldest_round() == 3
    out = gap.take()
    assert len(gap) == 0 and gap.oldest_round() is None
    assert (out.rounds_from, out.round, out.part, out.offset, out.length) == (3, 10, 0, 0, LENGTH)
    np.testing.assert_allclose(total([out]), total(folded))
    assert out.folded and not out.final


def test_rounds_that_skip_come_back_as_one_message_per_range_the_sum_in_the_first() -> None:
    folded = [grad(r) for r in (3, 4, 5, 8, 9)]
    gap = OwedGap()
    for m in folded:
        gap.fold(m)
    assert len(gap) == 2
    first, second = gap.take(), gap.take()
    assert (first.rounds_from, first.round, second.rounds_from, second.round) == (3, 5, 8, 9)
    assert second.length == 0
    np.testing.assert_allclose(total([first, second]), total(folded))


def test_a_folded_final_marker_makes_the_folded_message_final() -> None:
    gap = OwedGap()
    regular = Partial(Kind.GRAD, 0, 4, 0, 1, 0, LENGTH, np.ones(LENGTH, np.float32))
    marker = Partial(Kind.GRAD, 0, 5, 0, 1, 0, 0, np.zeros(0, np.float32), True)
    gap.fold(regular)
    gap.fold(marker)
    out = gap.take()
    assert (out.rounds_from, out.round, out.length, out.final) == (4, 5, LENGTH, True)
    np.testing.assert_array_equal(out.values, np.ones(LENGTH))


def test_a_folded_message_survives_the_wire() -> None:
    from akorun.transport.wire import decode, encode_bytes

    gap = OwedGap()
    for m in [grad(r) for r in range(3, 11)]:
        gap.fold(m)
    out = gap.take()
    back = decode(encode_bytes(out, run_id=RUN, config_hash=WIRE_HASH), run_id=RUN,
                  config_hash=WIRE_HASH)
    assert (back.rounds_from, back.round, back.part, back.final) == (3, 10, 0, False)
    np.testing.assert_array_equal(back.values, out.values)


class ValueHost(SinkHost):
    """A sink that records every new partial's values and refuses (503) while `closed`."""

    def __init__(self) -> None:
        super().__init__(SECRET, RUN, WIRE_HASH)
        self.closed = True
        self.received: list[Partial] = []

    def not_accepting(self) -> str | None:
        return "rejoining" if self.closed else None

    async def on_partial(self, partial: Partial, nbytes: int) -> bool:
        accepted = await super().on_partial(partial, nbytes)
        if accepted:
            self.received.append(partial)
        return accepted


def test_a_suspended_peers_full_queue_folds_and_everything_arrives_once_it_is_back() -> None:
    host = ValueHost()
    signer = host.peer_signer(0)  # rank 0 of the run, knowing the host's session
    encode = signer.encode
    sent = [grad(r) for r in range(20)]
    suspended = [True]

    async def main() -> PeerSender:
        import aiohttp

        from akorun.transport.client import make_session

        (port,) = free_ports(1)
        server = Server(host, max_concurrent_reads=4)
        await server.start("127.0.0.1", port)
        session: aiohttp.ClientSession = make_session(peers=1)
        sender = PeerSender(1, f"http://127.0.0.1:{port}/v1/partial", session,
                            counters=PeerCounters(), maxsize=3,
                            policy=RetryPolicy(first_delay_s=0.001, max_delay_s=0.01),
                            is_suspended=lambda: suspended[0], encode=encode,
                            sealer=PartialSealer(signer, PARTIAL_PATH))
        try:
            sender.start()
            for m in sent:  # would block forever without folding (the peer is away)
                await asyncio.wait_for(sender.put(Outgoing(
                    encode(m), m.kind, m.round, m.part, m.final, partial=m)), 5)
            assert len(sender.gap) > 0 and sender.dropped_until >= 0
            assert sender.acked_through < sender.gap.oldest_round()  # type: ignore[operator]
            suspended[0] = False
            host.closed = False
            sender.notify()
            await asyncio.wait_for(sender.wait(lambda: sender.idle), 20)
            return sender
        finally:
            await sender.stop()
            await session.close()
            await server.close()

    sender = asyncio.run(main())
    rounds = sorted(r for m in host.received for r in range(m.rounds_from, m.round + 1))
    assert rounds == list(range(20))
    assert any(m.folded for m in host.received)
    np.testing.assert_allclose(total(host.received), total(sent), rtol=1e-6)
    assert sender.counters.send_dropped["overflow"] > 0  # taken out of the queue, folded
    assert sender.acked_round == 19


def test_a_restart_forgets_the_gap(tmp_path: Any) -> None:
    gap = OwedGap()
    gap.fold(grad(1))
    gap.clear()
    assert len(gap) == 0 and gap.oldest_round() is None and not gap.folded


def test_a_folded_skip_folds_in_as_its_whole_range() -> None:
    gap = OwedGap()
    gap.fold(grad(3))
    gap.fold(Partial(Kind.GRAD, 0, 9, 0, P, 0, 0, np.zeros(0, np.float32), first_round=4))
    gap.fold(grad(10))
    assert len(gap) == 1
    out = gap.take()
    assert (out.rounds_from, out.round) == (3, 10)
    np.testing.assert_allclose(total([out]), total([grad(3), grad(10)]))
