"""Catch-up in one go: a folded message (one message summing a range of a sender's rounds)
is recorded as that range, exactly once, by the delivery log and the ako node."""

from __future__ import annotations

import numpy as np
import pytest

from akocore.messages import Kind, Partial
from akocore.optim import PlainSGD
from akocore.partition import partition_slice
from akocore.schemes import AkoWorker, Replica, SchemeError
from akocore.ssp import DeliveryLog

LENGTH, P = 9, 3


def node() -> AkoWorker:
    replica = Replica(np.zeros(LENGTH, np.float32), PlainSGD(1))
    return AkoWorker(0, 2, LENGTH, (P, P), replica=replica, staleness=0)


def grad(round_: int, value: float = 1.0) -> Partial:
    part = (round_ + 1) % P
    start, stop = partition_slice(LENGTH, P, part)
    return Partial(Kind.GRAD, 1, round_, part, P, start, stop - start,
                   np.full(stop - start, value, np.float32))


def folded(first: int, last: int, values: np.ndarray, *, final: bool = False) -> Partial:
    return Partial(Kind.GRAD, 1, last, 0, P, 0, values.size, values, final=final,
                   first_round=first)


def test_a_range_is_recorded_whole_and_a_second_copy_is_a_duplicate() -> None:
    log = DeliveryLog([1], lambda sender, round_: 1, size=2)
    assert log.record_range(1, 0, 99) == list(range(100))
    assert int(log.contiguous[1]) == 99 and not log.has_pending[1]
    assert log.record_range(1, 0, 99) == []
    assert log.record_range(1, 50, 120) == list(range(100, 121))


def test_a_range_ahead_of_the_contiguous_rounds_waits_for_the_hole_then_joins() -> None:
    log = DeliveryLog([1], lambda sender, round_: 1, size=2)
    assert log.record_range(1, 5, 9) == [5, 6, 7, 8, 9]
    assert int(log.contiguous[1]) == -1 and log.has_pending[1]
    assert log.held_rounds(1, 0, 10) == [5, 6, 7, 8, 9]
    assert log.record_range(1, 0, 6) == [0, 1, 2, 3, 4]
    assert int(log.contiguous[1]) == 9 and not log.has_pending[1]


def test_the_node_takes_a_folded_message_once_and_the_gate_opens() -> None:
    worker = node()
    values = np.arange(LENGTH, dtype=np.float32)
    assert not worker.may_start(501)
    assert worker.receive(folded(0, 500, values)).accepted
    assert worker.may_start(501) and int(worker.log.contiguous[1]) == 500
    assert not worker.receive(folded(0, 500, values)).accepted  # a re-send
    np.testing.assert_array_equal(worker.inbox, values)


def test_a_folded_message_after_single_rounds_adds_only_its_values_once() -> None:
    worker = node()
    worker.receive(grad(0, 2.0))
    values = np.ones(LENGTH, np.float32)
    assert worker.receive(folded(1, 3, values, final=True)).accepted
    assert worker.peer_done(1)
    expected = np.ones(LENGTH, np.float32)
    start, stop = partition_slice(LENGTH, P, 1)
    expected[start:stop] += 2.0
    np.testing.assert_array_equal(worker.inbox, expected)


@pytest.mark.parametrize("bad", [
    dict(part=1), dict(first_round=7), dict(p=2)])
def test_a_malformed_folded_message_is_refused(bad: dict[str, int]) -> None:
    fields = dict(kind=Kind.GRAD, sender=1, round=5, part=0, p=P, offset=0, length=LENGTH,
                  values=np.zeros(LENGTH, np.float32), first_round=2)
    fields.update(bad)
    with pytest.raises(SchemeError):
        node().receive(Partial(**fields))  # type: ignore[arg-type]


def test_a_worker_far_behind_every_peer_skips_to_them_in_one_message_losing_nothing() -> None:
    behind = node()  # rank 0; rank 1 is 500 rounds ahead
    ahead_values = np.arange(LENGTH, dtype=np.float32)
    behind.receive(folded(0, 499, ahead_values))
    (first,) = behind.local_step(0, np.ones(LENGTH, np.float32))
    assert behind.catch_up_round(1) == 500
    (send,) = behind.skip_rounds(500)
    message = send.message
    assert (message.rounds_from, message.round, message.length) == (1, 499, 0)
    assert behind.next_round == 500 and behind.catch_up_round(500) == 500
    peer = AkoWorker(1, 2, LENGTH, (P, P), staleness=0,
                     replica=Replica(np.zeros(LENGTH, np.float32), PlainSGD(1)))
    peer.receive(first.message)
    peer.receive(message)
    assert int(peer.log.contiguous[0]) == 499
    assert behind.unsent is not None and float(behind.unsent.sum()) > 0  # still owed


def test_a_worker_within_the_staleness_bound_does_not_skip() -> None:
    worker = node()
    worker.receive(folded(0, 0, np.zeros(LENGTH, np.float32)))
    assert worker.catch_up_round(0) == 0 and worker.catch_up_round(1) == 1
