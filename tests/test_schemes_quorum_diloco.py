"""Quorum DiLoCo invariants, driven through the randomised harness, and its faults.

Over random delivery orders, delays and duplicated deliveries: with a quorum of every
worker it is DiLoCo bit for bit (any grace); whatever the quorum and grace, every
replica applies the same syncs (the same contributions, bit-equal anchors), and every
pseudo-gradient a worker sent is in exactly one sync (none lost, none counted twice).
At the node level: with one worker silent the others go on syncing at the quorum
(DiLoCo waits), and the member that returns applies the syncs it missed and ends with
the same anchor.

A mutation these tests catch: each replica taking the contributions *it* holds when it
applies a sync instead of the decider's contributor set (`_progress` taking
``self._ready()`` in place of the decision's mask) fails the DiLoCo equality, the equal
anchors and the exactly-once accounting.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from akocore.messages import Partial, Send
from akocore.optim import PlainSGD
from akocore.schemes import SchemeSpec, build_nodes
from akocore.schemes.quorum_diloco import EVERYONE, QUORUM_DILOCO, majority
from akocore.schemes.registry import scheme_named
from akocore.settings.normalise import ConfigError
from akocore.settings.schema import ExchangeConfig
from akocore.settings.toml_io import parse_toml_text
from tests.scheme_harness import Deadlock, drive
from tests.test_schemes_diloco import LR, SLOW, _theta0, cases


def _nodes(scheme: str, workers: int, length: int, codec: str = "none",
           **options: float) -> list:
    spec = SchemeSpec(scheme, workers, codec=codec, options=tuple(options.items()))
    return build_nodes(spec, length, _theta0(length), PlainSGD(LR))


def _replay(nodes: list, grads: dict[int, list[np.ndarray]], *, seed: int,
            duplicate_prob: float) -> None:
    """drive's random delivery, duplicates and gate, with given gradients per round."""
    rng = random.Random(seed)
    in_flight: list[tuple[int, Partial]] = []
    done = {r: 0 for r in grads}

    def post(effects: list[Send] | tuple[Send, ...]) -> None:
        in_flight.extend((dest, send.message) for send in effects for dest in send.dests)

    while True:
        actions = [("finish" if done[r] == len(grads[r]) else "step", r) for r in grads
                   if not nodes[r].finished
                   and (done[r] == len(grads[r]) or nodes[r].may_start(done[r]))]
        actions.extend(("deliver", i) for i in range(len(in_flight)))
        if not actions:
            break
        kind, arg = rng.choice(actions)
        if kind == "step":
            post(nodes[arg].local_step(done[arg], grads[arg][done[arg]]))
            done[arg] += 1
        elif kind == "finish":
            post(nodes[arg].finish(done[arg]))
        else:
            dest, msg = in_flight[arg]
            if rng.random() >= duplicate_prob:
                in_flight[arg] = in_flight[-1]
                in_flight.pop()
            post(nodes[dest].receive(msg).effects)
    assert all(node.finished and node.drained() for node in nodes)
    for node in nodes:
        node.settle()


@SLOW
@given(case=cases, inner_steps=st.integers(1, 4), syncs=st.integers(0, 3),
       grace=st.integers(0, 3), everyone=st.sampled_from(["n", "all"]),
       momentum=st.sampled_from([0.0, 0.9]))
def test_with_a_quorum_of_everyone_it_is_diloco_bit_for_bit(
        case: dict, inner_steps: int, syncs: int, grace: int, everyone: str,
        momentum: float) -> None:
    n, length = case["workers"], case["length"]
    rounds = inner_steps * syncs
    knobs = {"inner_steps": inner_steps, "outer_lr": 0.7, "outer_momentum": momentum}
    quorum = n if everyone == "n" else EVERYONE
    ours = _nodes("quorum-diloco", n, length, quorum_min=quorum,
                  quorum_grace_steps=min(grace, inner_steps - 1), **knobs)
    log = drive(ours, {r: rounds for r in range(n)}, seed=case["seed"], length=length,
                duplicate_prob=case["duplicate_prob"])
    diloco = _nodes("diloco", n, length, **knobs)
    _replay(diloco, log.gradients, seed=case["seed"] + 1,
            duplicate_prob=case["duplicate_prob"])
    for mine, theirs in zip(ours, diloco, strict=True):
        assert mine.anchor.tobytes() == theirs.anchor.tobytes()
        assert mine.params.tobytes() == theirs.params.tobytes()
        assert mine.syncs_done == theirs.syncs_done == syncs


def _mixed_run(case: dict, inner_steps: int, quorum: int, grace: int, rounds: list[int],
               codec: str = "none") -> tuple[list, dict[int, int]]:
    n, length = case["workers"], case["length"]
    nodes = _nodes("quorum-diloco", n, length, codec, inner_steps=inner_steps,
                   quorum_min=quorum, quorum_grace_steps=min(grace, inner_steps - 1))
    per_rank = {r: rounds[r] for r in range(n)}
    drive(nodes, per_rank, seed=case["seed"], length=length,
          duplicate_prob=case["duplicate_prob"])
    return nodes, per_rank


mixed = {"case": cases, "inner_steps": st.integers(1, 4), "quorum": st.integers(0, 5),
         "grace": st.integers(0, 3),
         "rounds": st.lists(st.integers(0, 12), min_size=5, max_size=5)}


@SLOW
@given(**mixed, codec=st.sampled_from(["none", "int8", "topk:0.5"]))
def test_every_replica_applies_the_same_syncs_and_holds_the_same_anchor(
        case: dict, inner_steps: int, quorum: int, grace: int, rounds: list[int],
        codec: str) -> None:
    """Also with a codec on the pseudo-gradients: each worker averages the value its
    peers decode of its own."""
    nodes, _ = _mixed_run(case, inner_steps, quorum, grace, rounds, codec)
    for node in nodes[1:]:
        assert node.included == nodes[0].included
        assert node.anchor.tobytes() == nodes[0].anchor.tobytes()
        assert node.agreed_state() is not None


@SLOW
@given(**mixed)
def test_every_pseudo_gradient_sent_is_in_exactly_one_sync(
        case: dict, inner_steps: int, quorum: int, grace: int, rounds: list[int]) -> None:
    nodes, per_rank = _mixed_run(case, inner_steps, quorum, grace, rounds)
    taken = [key for sync in nodes[0].included for key in sync]
    sent = {(r, m) for r, total in per_rank.items() for m in range(total // inner_steps)}
    assert len(taken) == len(set(taken))  # none counted twice
    assert set(taken) == sent  # none lost
    assert all(node.points == per_rank[node.rank] // inner_steps for node in nodes)
    q = min(quorum or majority(case["workers"]), case["workers"])
    # a sync takes a quorum unless fewer workers were left to wait for
    assert all(len(sync) >= 1 for sync in nodes[0].included)
    if all(total == rounds[0] for total in per_rank.values()) and rounds[0] >= inner_steps:
        assert len(nodes[0].included[0]) >= q


def _deliver(nodes: list, in_flight: list[tuple[int, Partial]], silent: set[int],
             held: list[tuple[int, Partial]]) -> None:
    """Deliver every message (what arrives at a silent rank waits in `held`)."""
    while in_flight:
        dest, msg = in_flight.pop(0)
        if dest in silent:
            held.append((dest, msg))
            continue
        in_flight.extend((d, s.message) for s in nodes[dest].receive(msg).effects
                         for d in s.dests)


def _run_ranks(nodes: list, ranks: list[int], rounds: int, silent: set[int],
               held: list[tuple[int, Partial]], next_round: dict[int, int]) -> None:
    """Step `ranks` in turn up to `rounds` while their gates open (deliveries instant)."""
    rng = np.random.default_rng(0)
    progress = True
    while progress:
        progress = False
        for r in ranks:
            node = nodes[r]
            if next_round[r] < rounds and node.may_start(next_round[r]):
                grad = rng.integers(-8, 9, node.length).astype(np.float32) / 8
                sends = node.local_step(next_round[r], grad)
                next_round[r] += 1
                _deliver(nodes, [(d, s.message) for s in sends for d in s.dests], silent,
                         held)
                progress = True


@pytest.mark.parametrize("scheme", ["quorum-diloco", "diloco"])
def test_with_one_worker_silent_the_others_go_on_syncing_at_the_quorum(scheme: str) -> None:
    nodes = _nodes(scheme, 3, 6, inner_steps=2)
    held: list[tuple[int, Partial]] = []
    done = {0: 0, 1: 0, 2: 0}
    _run_ranks(nodes, [0, 1], 8, {2}, held, done)
    if scheme == "diloco":  # DiLoCo waits for the silent member at its first sync
        assert done == {0: 2, 1: 2, 2: 0} and nodes[0].syncs_done == 0
        assert 2 in nodes[0].waiting_on(2)
        return
    assert done == {0: 8, 1: 8, 2: 0}  # 4 syncs of a quorum of 2 without rank 2
    assert nodes[0].syncs_done == nodes[1].syncs_done == 4
    assert nodes[0].included == [((0, m), (1, m)) for m in range(4)]
    # rank 2 returns: it holds what its peers sent meanwhile, applies the 4 syncs in
    # order, and its own pseudo-gradient joins the next sync decided after it arrives
    _deliver(nodes, held, set(), [])
    assert nodes[2].syncs_done == 4
    assert nodes[2].anchor.tobytes() == nodes[0].anchor.tobytes()
    _run_ranks(nodes, [0, 1, 2], 12, set(), held, done)
    assert done[0] == done[1] == 12 and done[2] >= 2
    for rank in (0, 1, 2):  # the others stop; rank 2 catches up alone, then stops
        _run_ranks(nodes, [rank], 12, set(), held, done)
        _deliver(nodes, [(d, s.message) for s in nodes[rank].finish(12) for d in s.dests],
                 set(), [])
    assert all(node.drained() for node in nodes)
    assert (2, 0) in {key for sync in nodes[0].included for key in sync}
    for node in nodes[1:]:
        assert node.anchor.tobytes() == nodes[0].anchor.tobytes()


def test_a_silent_decider_stalls_the_sync_until_it_is_suspended() -> None:
    """Only the decider's silence stalls a sync: after the peer timeout suspends it the
    next rank decides, and the survivors go on."""
    nodes = _nodes("quorum-diloco", 3, 6, inner_steps=2)
    held: list[tuple[int, Partial]] = []
    done = {0: 0, 1: 0, 2: 0}
    _run_ranks(nodes, [1, 2], 8, {0}, held, done)
    assert done == {0: 0, 1: 2, 2: 2} and nodes[1].waiting_on(2) == [0]
    for rank in (1, 2):
        nodes[rank].suspend_peer(0)
        _deliver(nodes, [(d, s.message) for s in nodes[rank].take_effects()
                         for d in s.dests], {0}, held)
    _run_ranks(nodes, [1, 2], 8, {0}, held, done)
    assert done == {0: 0, 1: 8, 2: 8} and nodes[1].syncs_done == nodes[2].syncs_done == 4
    assert nodes[1].anchor.tobytes() == nodes[2].anchor.tobytes()


def test_knobs_out_of_range_are_refused_with_the_key_named() -> None:
    with pytest.raises(ValueError, match=r"exchange.quorum_grace_steps: got 2, expected"):
        SchemeSpec("quorum-diloco", 3, inner_steps=2, quorum_grace_steps=2)
    with pytest.raises(ConfigError, match=r"exchange.quorum_min: got -1"):
        parse_toml_text("[exchange.quorum]\nquorum_min = -1\n")
    with pytest.raises(ConfigError, match=r"exchange.quorum_grace_steps: got 10"):
        parse_toml_text('[exchange]\nscheme = "quorum-diloco"\n[exchange.quorum]\n'
                        "quorum_grace_steps = 10\n")


def test_label_bound_and_grid_come_from_the_scheme() -> None:
    exchange = ExchangeConfig(scheme="quorum-diloco", inner_steps=5, quorum_grace_steps=1)
    assert scheme_named("quorum-diloco") is QUORUM_DILOCO
    assert QUORUM_DILOCO.variant_label(exchange) == "quorum-diloco H=5 q=majority g=1"
    assert QUORUM_DILOCO.staleness_bound(exchange, p_max=1, ssp=0.0) == 10.0
    assert QUORUM_DILOCO.period_rounds(exchange) == 5
    assert QUORUM_DILOCO.plan_grid(exchange) == {"quorum_min": (EVERYONE,)}
    table = parse_toml_text('[exchange]\nscheme = "quorum-diloco"\n[exchange.quorum]\n'
                            "quorum_min = 2\n")
    assert QUORUM_DILOCO.label(table.exchange) == "H=10 q=2 g=0"


def test_timing_only_nodes_run_the_same_gate() -> None:
    """Without parameters (akosim's timing) the nodes decide and drain alike."""
    spec = SchemeSpec("quorum-diloco", 4, inner_steps=3, quorum_min=2, quorum_grace_steps=1)
    nodes = build_nodes(spec, 8, None, None)
    try:
        drive(nodes, {0: 9, 1: 9, 2: 6, 3: 9}, seed=5, length=8)
    except Deadlock as error:  # pragma: no cover - the failure message is the point
        raise AssertionError(str(error)) from None
    assert all(node.syncs_done == nodes[0].syncs_done for node in nodes)
    assert sum(len(sync) for sync in nodes[0].included) == 3 + 3 + 2 + 3


def test_a_decision_for_more_than_32_workers_spans_one_message_per_32_ranks() -> None:
    spec = SchemeSpec("quorum-diloco", 40, inner_steps=1, quorum_min=39)
    nodes = build_nodes(spec, 4, _theta0(4), PlainSGD(LR))
    drive(nodes, {r: 2 for r in range(40)}, seed=3, length=4, duplicate_prob=0.0)
    assert all(node.included == nodes[0].included for node in nodes)
    assert all(node.anchor.tobytes() == nodes[0].anchor.tobytes() for node in nodes)
    assert sorted(key for sync in nodes[0].included for key in sync) == [
        (r, m) for r in range(40) for m in range(2)]
    assert any(35 in {r for r, _ in sync} for sync in nodes[0].included)
