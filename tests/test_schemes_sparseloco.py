"""SparseLoCo's invariants, over random delivery orders and duplicated deliveries.

- Error feedback is exact bookkeeping: for every pseudo-gradient a worker codes, the
  accumulator after plus what it sent equals the pseudo-gradient plus beta times the
  accumulator before (bit for bit in float32: e' = fl(x - decoded), x = fl(delta +
  fl(beta e)); with beta = 1, everything sent plus the accumulator equals everything
  produced, to float32 rounding); each chunk sends at most its k values.
- With k = 100% and 32-bit values SparseLoCo is DiLoCo with outer momentum 0 at the same
  outer learning rate, bit for bit (the codec is then lossless: decoded == x, e stays 0).
- Every replica applies the same outer update: the anchors are bit-equal after each sync.
- A lost member: the survivors apply the sync without it once suspended.

Mutation these tests catch (checked once by hand): in `ChunkedTopKCodec.encode_decoded`
dropping the decay (or not subtracting the decoded values from the accumulator, i.e.
`Codec.encode_decoded` returning `x` as the residual) fails
test_error_feedback_bookkeeping_is_exact_per_sync; averaging the produced own delta instead
of the decoded one fails test_every_replica_applies_the_same_outer_update.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from akocore.codecs import codec_named
from akocore.codecs.chunked_topk import ChunkedTopKCodec
from akocore.messages import Kind, Partial
from akocore.optim import NesterovSGD, PlainSGD
from akocore.schemes import SchemeSpec, build_nodes
from akocore.schemes.registry import scheme_named, wire_codec
from akocore.schemes.sparseloco import SPARSELOCO, SparseLocoSettings
from akocore.settings.normalise import ConfigError
from akocore.settings.schema import ExchangeConfig
from tests.scheme_harness import drive

LR = 0.25
CASES = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])

runs = st.fixed_dictionaries({
    "workers": st.integers(2, 4),
    "length": st.integers(1, 60),
    "seed": st.integers(0, 2**31),
    "inner_steps": st.integers(1, 3),
    "syncs": st.integers(0, 3),
    "chunk": st.integers(1, 20),
    "fraction": st.sampled_from([0.05, 0.25, 0.5, 1.0]),
    "bits": st.sampled_from([2, 4, 8, 32]),
    "decay": st.sampled_from([1.0, 0.95, 0.5, 0.0]),
    "duplicate_prob": st.sampled_from([0.0, 0.2]),
})


def _theta0(length: int) -> np.ndarray:
    return np.linspace(-1, 1, length).astype(np.float32)


def _nodes(case: dict, **changed: float) -> list:
    knobs = {"inner_steps": case["inner_steps"], "sparseloco_chunk": case["chunk"],
             "sparseloco_topk_fraction": case["fraction"], "sparseloco_bits": case["bits"],
             "sparseloco_error_decay": case["decay"], "sparseloco_outer_lr": 0.7, **changed}
    spec = SchemeSpec("sparseloco", case["workers"], options=tuple(knobs.items()))
    return build_nodes(spec, case["length"], _theta0(case["length"]), PlainSGD(LR))


def _drive(nodes: list, case: dict, grad_scale: float = 1.0):
    rounds = case["inner_steps"] * case["syncs"]
    return drive(nodes, {r: rounds for r in range(len(nodes))}, seed=case["seed"],
                 length=case["length"], duplicate_prob=case["duplicate_prob"],
                 grad_scale=grad_scale)


def _record(nodes: list) -> dict[int, list[tuple[np.ndarray, np.ndarray, np.ndarray, Partial]]]:
    """Per rank, for every pseudo-gradient it codes: (produced, accumulator before,
    accumulator after, the message as sent)."""
    seen: dict[int, list] = {node.rank: [] for node in nodes}
    for node in nodes:
        def coded(message: Partial, node=node, code=node.coded) -> Partial:
            if message.kind != Kind.PSEUDO or not message.length:
                return code(message)
            window = slice(message.offset, message.offset + message.length)
            before = node.encoder.residual[window].copy()
            produced = message.values.copy()
            sent = code(message)
            seen[node.rank].append((produced, before, node.encoder.residual[window].copy(),
                                    sent))
            return sent
        node.coded = coded
    return seen


@CASES
@given(case=runs)
def test_error_feedback_bookkeeping_is_exact_per_sync(case: dict) -> None:
    nodes = _nodes(case)
    seen = _record(nodes)
    _drive(nodes, case)
    codec = codec_named(wire_codec(SchemeSpec("sparseloco", 2, options=(
        ("sparseloco_chunk", case["chunk"]), ("sparseloco_topk_fraction", case["fraction"]),
        ("sparseloco_bits", case["bits"]), ("sparseloco_error_decay", case["decay"])))))
    assert isinstance(codec, ChunkedTopKCodec)
    beta = np.float32(case["decay"])
    for node in nodes:
        assert len(seen[node.rank]) == case["syncs"]
        for produced, before, after, sent in seen[node.rank]:
            assert sent.codec == codec.name and len(sent.payload) == codec.encoded_bytes(
                sent.length)
            x = produced + (beta * before).astype(np.float32)
            np.testing.assert_array_equal(after, (x - sent.values).astype(np.float32))
            np.testing.assert_array_equal(codec.decode(sent.payload, sent.length),
                                          sent.values)
            for start in range(0, sent.length, case["chunk"]):  # at most k per chunk
                piece = sent.values[start:start + case["chunk"]]
                assert np.count_nonzero(piece) <= codec.kept_in(piece.size)


@CASES
@given(case=runs)
def test_without_decay_everything_sent_plus_the_accumulator_is_everything_produced(
        case: dict) -> None:
    case = {**case, "decay": 1.0}
    nodes = _nodes(case)
    seen = _record(nodes)
    _drive(nodes, case)
    for node in nodes:
        produced = np.zeros(case["length"], np.float64)
        sent = np.zeros(case["length"], np.float64)
        for made, _, _, message in seen[node.rank]:
            produced += made
            sent += message.values
        kept = node.encoder.residual.astype(np.float64) + node.encoder.withdrawn
        scale = max(1.0, float(np.abs(produced).max(initial=0.0)))
        np.testing.assert_allclose(sent + kept, produced, rtol=0, atol=1e-5 * scale)


@CASES
@given(case=runs)
def test_every_replica_applies_the_same_outer_update(case: dict) -> None:
    nodes = _nodes(case)
    anchors: dict[int, list[np.ndarray]] = {node.rank: [] for node in nodes}
    for node in nodes:
        def apply(sync, node=node, inner=node._apply) -> None:
            inner(sync)
            anchors[node.rank].append(node.anchor.copy())
        node._apply = apply
    _drive(nodes, case, grad_scale=0.37)
    assert all(len(held) == case["syncs"] for held in anchors.values())
    for rank in anchors:
        for got, want in zip(anchors[rank], anchors[0], strict=True):
            np.testing.assert_array_equal(got, want)
    for node in nodes[1:]:  # the run ends on a sync: every replica holds the anchor
        np.testing.assert_array_equal(node.params, nodes[0].params)


def _reference_diloco(theta0: np.ndarray, grads: dict[int, list[np.ndarray]], h: int,
                      rounds: int, outer_lr: float) -> tuple[np.ndarray, np.ndarray]:
    """Sequential DiLoCo with outer momentum 0, summing deltas in rank order in float64
    (tests/test_diloco_codecs.py pins DiLoCo to this reference bit for bit)."""
    workers = len(grads)
    anchor = theta0.copy()
    local = [anchor.copy() for _ in range(workers)]
    outer = NesterovSGD(outer_lr, 0.0)
    state = outer.init(anchor)
    for t in range(rounds):
        local = [PlainSGD(LR).apply(w, None, grads[i][t])[0] for i, w in enumerate(local)]
        if (t + 1) % h == 0:
            total = np.zeros(theta0.size, np.float64)
            for w in local:
                total += (anchor - w).astype(np.float32)
            anchor, state = outer.apply(anchor, state, (total / workers).astype(np.float32))
            local = [anchor.copy() for _ in range(workers)]
    return local[0], anchor


@CASES
@given(case=runs)
def test_with_every_value_at_32_bits_it_is_diloco_without_outer_momentum_bit_for_bit(
        case: dict) -> None:
    case = {**case, "fraction": 1.0, "bits": 32}
    nodes = _nodes(case)
    log = _drive(nodes, case)
    rounds = case["inner_steps"] * case["syncs"]
    params, anchor = _reference_diloco(_theta0(case["length"]), log.gradients,
                                       case["inner_steps"], rounds, 0.7)
    for node in nodes:
        np.testing.assert_array_equal(node.params, params)
        np.testing.assert_array_equal(node.anchor, anchor)
        assert not np.any(node.encoder.residual)


def _lockstep(nodes: list, grads: list[list[np.ndarray]]) -> None:
    """Every worker steps round t with grads[t][rank], then every message is delivered."""
    for t, per_rank in enumerate(grads):
        sends = [send for node in nodes for send in node.local_step(t, per_rank[node.rank])]
        while sends:
            send = sends.pop(0)
            for dest in send.dests:
                sends.extend(nodes[dest].receive(send.message).effects)


def test_with_every_value_at_32_bits_it_is_the_diloco_scheme_itself() -> None:
    """The same gradients through the diloco scheme (outer momentum 0, all-reduce) and
    through sparseloco at k = 100%, 32 bits: the same parameters, bit for bit."""
    n, length, h = 3, 50, 2
    rng = np.random.default_rng(3)
    grads = [[rng.standard_normal(length).astype(np.float32) for _ in range(n)]
             for _ in range(3 * h)]
    diloco = build_nodes(SchemeSpec("diloco", n, inner_steps=h, outer_lr=0.7,
                                    outer_momentum=0.0), length, _theta0(length), PlainSGD(LR))
    sparse = build_nodes(SchemeSpec("sparseloco", n, inner_steps=h, sparseloco_outer_lr=0.7,
                                    sparseloco_topk_fraction=1.0, sparseloco_bits=32,
                                    sparseloco_chunk=7), length, _theta0(length), PlainSGD(LR))
    _lockstep(diloco, grads)
    _lockstep(sparse, grads)
    for a, b in zip(diloco, sparse, strict=True):
        np.testing.assert_array_equal(a.params, b.params)
        np.testing.assert_array_equal(a.anchor, b.anchor)
    lossy = build_nodes(SchemeSpec("sparseloco", n, inner_steps=h, sparseloco_outer_lr=0.7,
                                   sparseloco_chunk=7), length, _theta0(length), PlainSGD(LR))
    _lockstep(lossy, grads)
    assert not np.array_equal(lossy[0].anchor, diloco[0].anchor)  # the codec is really on


def test_a_lost_member_leaves_the_survivors_syncing_without_it() -> None:
    """Rank 2 never sends its pseudo-gradient: once suspended, ranks 0 and 1 apply the sync
    with the mean of their two decoded deltas, equal on both; rank 2's accumulator (what
    it had not sent) is lost with it."""
    length = 40
    nodes = build_nodes(SchemeSpec("sparseloco", 3, inner_steps=1, sparseloco_chunk=10,
                                   sparseloco_topk_fraction=0.2), length, _theta0(length),
                        PlainSGD(LR))
    rng = np.random.default_rng(0)
    own = [node.local_step(0, rng.standard_normal(length).astype(np.float32))
           for node in nodes[:2]]
    for rank, sends in enumerate(own):
        for send in sends:
            assert send.dests == tuple(p for p in range(3) if p != rank)
            nodes[1 - rank].receive(send.message)
    assert [node.waiting_on(1) for node in nodes[:2]] == [[2], [2]]
    for node in nodes[:2]:
        node.suspend_peer(2)
        assert node.may_start(1)
    decoded = [sends[0].message.values for sends in own]
    expected = _theta0(length) - np.float32(1.0) * (
        (decoded[0].astype(np.float64) + decoded[1]) / 2).astype(np.float32)
    for node in nodes[:2]:
        np.testing.assert_array_equal(node.anchor, expected.astype(np.float32))
        np.testing.assert_array_equal(node.params, node.anchor)


def test_a_pseudo_gradient_that_reached_one_survivor_only_is_averaged_there_alone() -> None:
    """Rank 2's payload reached rank 0, not rank 1, before rank 2 was lost: rank 0 averages
    three decoded deltas, rank 1 two, so their anchors differ from then on (as DiLoCo's
    all-to-all sync; akorun's anchor re-sync is what brings them together)."""
    length = 12
    nodes = build_nodes(SchemeSpec("sparseloco", 3, inner_steps=1, sparseloco_chunk=4,
                                   sparseloco_bits=32, sparseloco_topk_fraction=1.0),
                        length, _theta0(length), PlainSGD(LR))
    sends = [node.local_step(0, np.full(length, rank + 1, np.float32))
             for rank, node in enumerate(nodes)]
    for rank in (0, 1):
        nodes[1 - rank].receive(sends[rank][0].message)
    nodes[0].receive(sends[2][0].message)
    nodes[1].suspend_peer(2)
    assert nodes[0].may_start(1) and nodes[1].may_start(1)
    deltas = [LR * (rank + 1) for rank in range(3)]
    np.testing.assert_allclose(nodes[0].anchor, _theta0(length) - np.mean(deltas), atol=1e-6)
    np.testing.assert_allclose(nodes[1].anchor, _theta0(length) - np.mean(deltas[:2]),
                               atol=1e-6)


def test_the_scheme_names_its_codec_and_refuses_another() -> None:
    exchange = ExchangeConfig(scheme="sparseloco", inner_steps=4)
    assert wire_codec(exchange) == "ctopk:0.015625:4096:2:0.95"
    assert wire_codec(ExchangeConfig(scheme="diloco", codec="int8")) == "int8"
    assert scheme_named("sparseloco").variant_label(exchange) == \
        "sparseloco H=4 k=1.56%/4096 2-bit"
    assert SPARSELOCO.staleness_bound(exchange, p_max=1, ssp=0) == 3.0
    assert SPARSELOCO.period_rounds(exchange) == 4
    with pytest.raises(ConfigError, match=r"exchange.codec: got 'int8', expected none"):
        ExchangeConfig(scheme="sparseloco", codec="int8")
    with pytest.raises(ValueError, match="codec: got 'int8'"):
        SchemeSpec("sparseloco", 2, codec="int8")


@pytest.mark.parametrize(("key", "value"), [
    ("sparseloco_bits", 3), ("sparseloco_topk_fraction", 0), ("sparseloco_chunk", 70000),
    ("sparseloco_error_decay", 1.5), ("sparseloco_outer_lr", 0)])
def test_knobs_out_of_range_are_refused_with_the_key_named(key: str, value: float) -> None:
    with pytest.raises(ConfigError, match=f"exchange.{key}: got"):
        ExchangeConfig(scheme="sparseloco", **{key: value})


def test_the_plan_grid_is_k_and_bits_and_every_value_is_accepted() -> None:
    exchange = ExchangeConfig(scheme="sparseloco")
    grid = SPARSELOCO.plan_grid(exchange)
    assert set(grid) == {"sparseloco_topk_fraction", "sparseloco_bits"}
    labels = set()
    for key, values in grid.items():
        for value in values:
            changed = ExchangeConfig(scheme="sparseloco", **{key: value})
            SPARSELOCO.check_exchange(changed)
            labels.add(SPARSELOCO.label(changed))
    assert len(labels) == 3 and SPARSELOCO.label(exchange) not in labels
    assert SparseLocoSettings().codec().ratio(1 << 20) < 0.011  # > 90x less than float32
