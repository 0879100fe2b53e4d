"""akorun.memory_bound: the stated per-rank memory, term by term as documented
(docs/reference/memory.md): the relay term is the relay's own bound, O(D) in n at
p = n - 1; optimizer state and unbounded staleness add what the formula says."""

from __future__ import annotations

import math

import pytest

from akorun.memory_bound import AKORUN_VECTORS, RUNTIME_BYTES, memory_bound, outgoing_messages
from akorun.runtime.recovery.relay import relay_bound_bytes
from akorun.transport.wire import HEADER_SIZE

D = 27_350_016


def test_the_terms_follow_the_formula() -> None:
    bound = memory_bound(length=D, p_of=[2, 2, 2], rank=1, staleness=0, optimizer="sgd",
                         workload_bytes=1_500_000_000)
    message = 4 * D // 2
    assert bound.vectors_bytes == AKORUN_VECTORS * 4 * D
    assert bound.relay_bytes == relay_bound_bytes(D, [2, 2, 2], 1, staleness=0) \
        == 2 * 2 * message
    assert bound.outgoing_bytes == 4 * (HEADER_SIZE + 2 * message)  # 2 s + p + 2 = 4
    assert bound.incoming_bytes == 6 * message  # max(4, 3 (n - 1)) reads
    assert bound.total_bytes == (1_500_000_000 + bound.vectors_bytes + bound.relay_bytes
                                 + bound.outgoing_bytes + bound.incoming_bytes + RUNTIME_BYTES)
    assert bound.text().startswith(f"{bound.total_bytes / 1e6:.0f} MB (workload 1500, ")


def test_adam_adds_two_state_vectors_each_with_its_copy() -> None:
    def vectors(optimizer: str) -> int:
        return memory_bound(length=D, p_of=[4] * 3, rank=0, staleness=1, optimizer=optimizer,
                            workload_bytes=0).vectors_bytes

    assert vectors("adam") - vectors("sgd") == 4 * 4 * D
    assert vectors("momentum") - vectors("sgd") == 2 * 4 * D
    with pytest.raises(ValueError, match="optimizer 'lbfgs'"):
        vectors("lbfgs")


def test_the_relay_term_stays_o_of_d_as_n_grows_at_p_from_n_minus_1() -> None:
    relay = {n: memory_bound(length=D, p_of=[n - 1] * n, rank=0, staleness=0,
                             optimizer="sgd", workload_bytes=0).relay_bytes
             for n in (3, 9, 65)}
    assert max(relay.values()) <= 8 * D + 8 * 64  # (2 s + 2) x 4 D, + rounding
    budget = memory_bound(length=D, p_of=[64] * 65, rank=0, staleness=0, optimizer="sgd",
                          workload_bytes=0, budget_bytes=10**12).relay_bytes
    assert budget >= 64 * 8 * D  # two gradients per peer, the old default


def test_unbounded_staleness_or_a_long_queue_counts_every_queued_message() -> None:
    assert outgoing_messages(4, math.inf, 64) == 64
    assert outgoing_messages(4, 1, 64) == 8
    assert outgoing_messages(64, 10, 16) == 16
