"""Ako's SSP gate and lag on their fast path (no final round known, no peer suspended)
agree with the masked minimum over the gated peers in every state, and the p vector is
checked once per node as strictly as before."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from akocore import ssp
from akocore.partition import PartitionError
from akocore.schemes import AkoWorker
from akocore.schemes.base import Replica


def reference_may_start_and_lag(node: AkoWorker, round_: int) -> tuple[bool, int]:
    """The gate as a masked minimum: peers not this rank, not done with their final
    round, not suspended."""
    gated = [j for j in node.peers if j not in node.suspended
             and node.log.contiguous[j] < node.final_round.get(j, math.inf)]
    rounds = [int(node.log.contiguous[j]) for j in gated]
    lag = 0 if round_ <= 0 or not rounds else max(0, round_ - 1 - min(rounds))
    return ssp.may_start(round_, rounds, node.staleness), lag


@settings(max_examples=300, deadline=None)
@given(workers=st.integers(1, 9), data=st.data())
def test_gate_and_lag_equal_the_masked_minimum(workers: int, data: st.DataObject) -> None:
    rank = data.draw(st.integers(0, workers - 1))
    staleness = data.draw(st.sampled_from([0.0, 1.0, 3.0, math.inf]))
    node = AkoWorker(rank, workers, 64, (2,) * workers, replica=Replica(None, None),
                     staleness=staleness)
    for j in node.peers:
        node.log.contiguous[j] = data.draw(st.integers(-1, 12))
        if data.draw(st.booleans()) and data.draw(st.booleans()):
            node.final_round[j] = data.draw(st.integers(0, 12))
            node._final[j] = node.final_round[j]
        if data.draw(st.integers(0, 3)) == 0:
            node.suspended.add(j)
    for round_ in range(-1, 16):
        expected_start, expected_lag = reference_may_start_and_lag(node, round_)
        assert node.may_start(round_) == expected_start, (round_, node.log.contiguous)
        assert node.lag(round_) == expected_lag, (round_, node.log.contiguous)


@pytest.mark.parametrize("bad", [0, -1, 65, 2.5, "2"])
def test_a_p_that_does_not_fit_is_refused_by_every_node(bad: object) -> None:
    p_of = [2, bad, 2]
    for rank in range(3):
        with pytest.raises(PartitionError):
            AkoWorker(rank, 3, 64, p_of, replica=Replica(None, None))  # type: ignore[arg-type]


def test_numpy_and_python_p_vectors_give_the_same_ints() -> None:
    from_numpy = AkoWorker(0, 3, 64, np.array([4, 8, 64]), replica=Replica(None, None))
    from_list = AkoWorker(0, 3, 64, [4, 8, 64], replica=Replica(None, None))
    assert from_numpy.p_of == from_list.p_of == (4, 8, 64)
    assert all(type(p) is int for p in from_numpy.p_of)
    assert from_numpy.peers == (1, 2)
