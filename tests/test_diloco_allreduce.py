"""DiLoCo's all-reduce sync: the same model as the all-to-all, a ring's bytes, and a group
that re-forms among the survivors when a chunk's owner is lost.

Over random delivery orders, delays and duplicates both syncs give the sequential
reference bit for bit; each worker sends 2(n-1)/n of the fragment per sync with the
all-reduce against (n-1) copies with the all-to-all; when a member is suspended during a
sync, the next live rank reduces the chunk it owned, the survivors re-send that chunk to
it, and every survivor applies the same anchor.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from akocore.messages import Kind, Partial, Send
from akocore.optim import NesterovSGD, PlainSGD
from akocore.schemes import SchemeSpec, build_nodes
from akocore.schemes.diloco_sync import chunk_bounds, owners_of
from tests.scheme_harness import drive

LR = 0.25
SYNCS = ("allreduce", "all-to-all")
CASES = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _theta0(length: int) -> np.ndarray:
    return np.linspace(-1, 1, length).astype(np.float32)


def _nodes(workers: int, length: int, outer_sync: str, **options: object) -> list:
    spec = SchemeSpec("diloco", workers, options=tuple(
        {"inner_steps": 2, "outer_lr": 0.7, "outer_momentum": 0.9, "outer_sync": outer_sync,
         **options}.items()))
    return build_nodes(spec, length, _theta0(length), PlainSGD(LR))


@pytest.mark.parametrize("outer_sync", SYNCS)
@CASES
@given(workers=st.integers(2, 6), length=st.integers(1, 40), syncs=st.integers(0, 3),
       seed=st.integers(0, 2**31), duplicate_prob=st.sampled_from([0.0, 0.3]))
def test_both_syncs_are_the_sequential_reference_bit_for_bit(
        outer_sync: str, workers: int, length: int, syncs: int, seed: int,
        duplicate_prob: float) -> None:
    length = max(length, 1)
    nodes = _nodes(workers, length, outer_sync)
    log = drive(nodes, {r: 2 * syncs for r in range(workers)}, seed=seed, length=length,
                duplicate_prob=duplicate_prob)
    anchor = _theta0(length)
    local = [anchor.copy() for _ in range(workers)]
    outer = NesterovSGD(0.7, 0.9)
    state = outer.init(anchor)
    for t in range(2 * syncs):
        local = [PlainSGD(LR).apply(w, None, log.gradients[i][t])[0] for i, w in enumerate(local)]
        if (t + 1) % 2 == 0:
            total = np.zeros(length, np.float64)
            for w in local:
                total += (anchor - w).astype(np.float32)
            anchor, state = outer.apply(anchor, state, (total / workers).astype(np.float32))
            local = [anchor.copy() for _ in range(workers)]
    for node in nodes:
        np.testing.assert_array_equal(node.params, local[0])
    assert log.duplicates_dropped == log.duplicates_sent


def _bytes_per_sync(outer_sync: str, workers: int, length: int) -> list[int]:
    """Bytes each worker hands to the network over one sync (timing-only nodes)."""
    spec = SchemeSpec("diloco", workers, options=(("inner_steps", 1),
                                                  ("outer_sync", outer_sync)))
    nodes = build_nodes(spec, length, None, None)
    sent = [0] * workers
    queue: list[Send] = []

    def post(rank: int, effects: list[Send] | tuple[Send, ...]) -> None:
        for send in effects:
            sent[rank] += send.message.nbytes * len(send.dests)
            queue.append(send)

    for node in nodes:
        post(node.rank, node.local_step(0, None))
    while queue:
        send = queue.pop(0)
        for dest in send.dests:
            post(dest, nodes[dest].receive(send.message).effects)
    assert all(node.may_start(1) for node in nodes)  # the sync was applied everywhere
    return sent


@pytest.mark.parametrize("workers", [2, 3, 8, 64])
def test_the_all_reduce_sends_a_rings_bytes_and_the_all_to_all_n_minus_1_copies(
        workers: int) -> None:
    length = 6_400
    fragment_bytes = 4 * length
    ring = 2 * (workers - 1) / workers * fragment_bytes
    for sent in _bytes_per_sync("allreduce", workers, length):
        assert sent == pytest.approx(ring, rel=0.01)
    assert _bytes_per_sync("all-to-all", workers, length) == [
        (workers - 1) * fragment_bytes] * workers


def test_the_owner_of_a_chunk_is_its_rank_or_the_next_live_one() -> None:
    assert owners_of([True, True, True, True])[1] == 1
    assert owners_of([True, False, True, True])[1] == 2
    assert owners_of([True, False, True, False])[3] == 0
    np.testing.assert_array_equal(chunk_bounds(10, 13, 4), [10, 10, 11, 12, 13])


def _deliver(nodes: list, sends: list[Send], lost: set[int]) -> None:
    """Deliver `sends` and what they cause in order; nothing reaches or leaves `lost`."""
    queue = list(sends)
    while queue:
        send = queue.pop(0)
        if send.message.sender in lost:
            continue
        for dest in send.dests:
            if dest not in lost:
                queue.extend(nodes[dest].receive(send.message).effects)


@pytest.mark.parametrize("lost", [0, 1, 2])
def test_a_lost_owner_is_replaced_and_the_survivors_apply_the_same_anchor(lost: int) -> None:
    """3 workers, H = 1, outer SGD lr 1: rank `lost` computes its step but none of its
    messages arrive and it hears nothing. Once the others suspend it, the next live rank
    reduces the chunk it owned (the survivors re-send that chunk), and both survivors
    hold theta0 - lr * mean of their own gradients."""
    length = 9
    theta0 = _theta0(length)
    nodes = _nodes(3, length, "allreduce", inner_steps=1, outer_lr=1.0, outer_momentum=0.0)
    grads = [np.full(length, r + 1, np.float32) for r in range(3)]
    survivors = [r for r in range(3) if r != lost]
    sends = [send for r in range(3) for send in nodes[r].local_step(0, grads[r])]
    _deliver(nodes, sends, {lost})
    for r in survivors:
        assert not nodes[r].may_start(1)
        assert lost in nodes[r].waiting_on(1)
    for r in survivors:
        nodes[r].suspend_peer(lost)
    due = [send for r in survivors for send in nodes[r].take_effects()]
    assert any(send.message.kind == Kind.PSEUDO for send in due)  # the re-sent chunk
    _deliver(nodes, due, {lost})
    expected = theta0 - LR * (grads[survivors[0]] + grads[survivors[1]]) / 2
    for r in survivors:
        assert nodes[r].may_start(1)
        np.testing.assert_allclose(nodes[r].params, expected, rtol=1e-6)
    np.testing.assert_array_equal(nodes[survivors[0]].anchor, nodes[survivors[1]].anchor)


def test_a_mean_from_a_second_owner_is_dropped_so_no_chunk_mixes_two_means() -> None:
    """A survivor can get a chunk's mean from its owner and, later, from a successor that
    suspended the owner: the first mean wins, the second is taken and ignored."""
    length = 6
    node = _nodes(3, length, "allreduce", inner_steps=1, outer_lr=1.0, outer_momentum=0.0)[0]
    node.local_step(0, np.zeros(length, np.float32))
    bounds = chunk_bounds(0, length, 3)

    def message(kind: Kind, sender: int, chunk: int, value: float, count: int) -> Partial:
        start, stop = int(bounds[chunk]), int(bounds[chunk + 1])
        part = chunk if kind == Kind.PSEUDO else 3 + chunk
        return Partial(kind, sender, 0, part, count, start, stop - start,
                       np.full(stop - start, value, np.float32))

    for sender in (1, 2):  # the deltas of chunk 0, which rank 0 owns
        node.receive(message(Kind.PSEUDO, sender, 0, 0.0, 3))
    node.receive(message(Kind.PSEUDO_MEAN, 1, 1, 0.5, 3))  # chunk 1 from its owner
    assert node.receive(message(Kind.PSEUDO_MEAN, 2, 1, 9.0, 2)).accepted  # then a successor
    node.receive(message(Kind.PSEUDO_MEAN, 2, 2, 0.0, 3))
    assert node.may_start(1)
    chunk1 = slice(int(bounds[1]), int(bounds[2]))
    np.testing.assert_allclose(node.params[chunk1], _theta0(length)[chunk1] - 0.5)


def test_a_mean_a_lost_owner_gave_some_survivors_is_adopted_by_its_successor() -> None:
    """4 workers; rank 1 owns chunk 1, sends its mean to rank 0 only, then is lost. Rank 0
    forwards that mean to the successor (rank 2) instead of its delta, rank 2 adopts it
    and sends it on: every survivor applies the same mean, rank 1's contribution in."""
    length = 8
    nodes = _nodes(4, length, "allreduce", inner_steps=1, outer_lr=1.0, outer_momentum=0.0)
    grads = [np.full(length, r + 1, np.float32) for r in range(4)]
    sends = [send for r in range(4) for send in nodes[r].local_step(0, grads[r])]
    queue = list(sends)
    while queue:  # rank 1's mean reaches rank 0 alone; everything else flows
        send = queue.pop(0)
        for dest in send.dests:
            if send.message.sender == 1 and send.message.kind == Kind.PSEUDO_MEAN \
                    and dest != 0:
                continue
            queue.extend(nodes[dest].receive(send.message).effects)
    assert nodes[0].may_start(1) and not nodes[2].may_start(1)
    for r in (0, 2, 3):
        nodes[r].suspend_peer(1)
    _deliver(nodes, [s for r in (0, 2, 3) for s in nodes[r].take_effects()], {1})
    expected = _theta0(length) - LR * sum(grads) / 4  # rank 1's delta counted everywhere
    for r in (0, 2, 3):
        assert nodes[r].may_start(1)
        np.testing.assert_allclose(nodes[r].params, expected, rtol=1e-6)
    np.testing.assert_array_equal(nodes[2].anchor, nodes[0].anchor)
    np.testing.assert_array_equal(nodes[3].anchor, nodes[0].anchor)


def test_ranks_whose_anchors_differ_end_the_run_with_one_line_naming_them() -> None:
    """akorun's finish compares the digest of each peer's agreed state (diloco: the anchor)
    that ran as many rounds: a different one is a failure naming the ranks."""
    from types import SimpleNamespace

    from akorun.runtime.lifecycle.finishing import Finisher

    here = {"rank": 0, "rounds": 20, "agreed_sha256": "a" * 64}
    finisher = SimpleNamespace(
        rank=0, waiter=SimpleNamespace(scheme="diloco"),
        liveness=SimpleNamespace(agreed={1: (20, "a" * 64), 2: (20, "b" * 64),
                                         3: (10, "c" * 64)}))
    (line,) = Finisher._disagreements(finisher, here)  # type: ignore[arg-type]
    assert "rank 0 and rank(s) [2] ran 20 rounds" in line and "diloco anchors" in line
    finisher.liveness.agreed = {1: (20, "a" * 64), 3: (10, "c" * 64)}
    assert Finisher._disagreements(finisher, here) == []  # type: ignore[arg-type]


@pytest.mark.parametrize("rank,peers,confirmed,left,passes", [
    (0, [1, 2], {1}, {}, True),          # two of three
    (2, [0, 1], {}, {}, False),          # alone of three: the other side may have gone on
    (0, [1, 2, 3], {3}, {}, True),       # half, holding the lowest rank
    (1, [0, 2, 3], {2}, {}, False),      # the other half
    (1, [0], {}, {}, False),             # the higher of two, alone
    (0, [1], {}, {}, True),              # the lower of two, alone
    (1, [0, 2], {}, {0: "left"}, True),   # the lowest of the two that joined
    (2, [0, 1], {}, {0: "left"}, False),  # the other of the two that joined
    (0, [], {}, {}, True),               # a run of one
])
def test_a_rank_whose_anchor_no_majority_confirmed_fails_so_two_sides_never_both_pass(
        rank: int, peers: list[int], confirmed: set[int], left: dict[int, str],
        passes: bool) -> None:
    from types import SimpleNamespace

    from akorun.runtime.lifecycle.finishing import Finisher

    here = {"rank": rank, "rounds": 20, "agreed_sha256": "a" * 64}
    agreed = {j: (20, "a" * 64 if j in confirmed else "b" * 64) for j in peers}
    finisher = SimpleNamespace(rank=rank, peers=peers, waiter=SimpleNamespace(scheme="diloco"),
                               liveness=SimpleNamespace(agreed=agreed, left_peers=left))
    lines = Finisher._unconfirmed(finisher, here)  # type: ignore[arg-type]
    assert (lines == []) == passes, lines
    if not passes:
        assert lines[0].startswith("no majority holds this model") and "diloco" in lines[0]


def test_the_anchor_is_the_agreed_state_once_no_sync_is_pending() -> None:
    nodes = _nodes(2, 4, "allreduce", inner_steps=1)
    sends = nodes[0].local_step(0, np.ones(4, np.float32))
    assert nodes[0].agreed_state() is None  # a sync in flight
    _deliver(nodes, [*sends, *nodes[1].local_step(0, np.ones(4, np.float32))], set())
    assert nodes[0].may_start(1)
    np.testing.assert_array_equal(nodes[0].agreed_state(), nodes[1].agreed_state())


@pytest.mark.parametrize("outer_sync", SYNCS)
def test_a_sync_a_done_peer_ended_without_this_rank_fails_the_rank_instead_of_hanging(
        outer_sync: str) -> None:
    """Rank 1 said done after a last sync it ran without rank 0 (it had suspended it):
    rank 0's part of that sync never comes. Rank 0's drain stops waiting for a peer that
    said done (it flushed all it owed), and the rank ends exit 1 naming the sync."""
    import asyncio
    from types import SimpleNamespace

    from akorun.errors import RunError
    from akorun.runtime.lifecycle.finishing import Finisher
    from akorun.testing import one_rank_context

    nodes = _nodes(2, 4, outer_sync, inner_steps=1)
    node = nodes[0]
    node.local_step(0, np.ones(4, np.float32))  # rank 1's part never arrives
    assert node.unfinished() is not None and "after round 0" in node.unfinished()
    assert nodes[1].unfinished() is None  # nothing begun there
    waited: list[bool] = []

    async def until(predicate, timeout_s=None):  # the real Waiter polls; one look here
        waited.append(bool(predicate()))
        return waited[-1]

    async def nothing(*_args, **_kwargs):
        return None

    liveness = SimpleNamespace(clock=lambda: 0.0, left_peers={}, last_new_s={},
                               done_peers={1}, agreed={}, given_up_here=None,
                               is_done=lambda peer: True)
    context = one_rank_context(
        0, [1], phase=SimpleNamespace(to=lambda phase: None), grace_s=1.0,  # type: ignore[arg-type]
        role=SimpleNamespace(node=node, trains=True, can_continue_without=lambda j: True))
    finisher = Finisher(
        context, waiter=SimpleNamespace(until=until, lost_peers=set(), hard_stop=False, cause=None,
                               scheme="diloco", lose=lambda peers: None),
        outbox=SimpleNamespace(dispatch=nothing, flush=nothing), liveness=liveness,
        training=SimpleNamespace(faults=SimpleNamespace(at_end=nothing), rounds_done=1,
                                 nonfinite=None),
        evaluator=SimpleNamespace(final=nothing), checkpoints=SimpleNamespace(write=nothing),
        results=SimpleNamespace(write=lambda: None, out_dir="out"))
    control = SimpleNamespace(call=nothing)
    with pytest.raises(RunError, match="never completed here: no part from rank"):
        asyncio.run(finisher.finish(control))  # type: ignore[arg-type]
    assert waited[0]  # drained at once: the done peer owes nothing
