"""Codecs on DiLoCo's and Streaming DiLoCo's pseudo-gradients, over random delivery orders.

Every rank averages the values its peers decode, its own pseudo-gradient included, so
the replicas stay bit-equal after each sync with every codec; error feedback keeps, per
sender, everything sent plus the residual equal to everything produced; with codec none
DiLoCo is, bit for bit, the sequential float64-rank-order reference.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from akocore.codecs import codec_named
from akocore.messages import Kind, Partial
from akocore.optim import NesterovSGD, PlainSGD
from akocore.schemes import SchemeSpec, build_nodes
from akocore.schemes.diloco_sync import ChunkState
from tests.scheme_harness import drive

LOSSY = ("fp16", "bf16", "int8", "topk:0.3")
LR = 0.25
CASES = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])

runs = st.fixed_dictionaries({
    "workers": st.integers(2, 4),
    "length": st.integers(3, 40),
    "seed": st.integers(0, 2**31),
    "fragments": st.integers(1, 3),
    "window": st.integers(1, 3),
    "overlap": st.integers(0, 2),
    "cycles": st.integers(1, 3),
    "duplicate_prob": st.sampled_from([0.0, 0.2]),
})


def _theta0(length: int) -> np.ndarray:
    return np.linspace(-1, 1, length).astype(np.float32)


def _streaming(case: dict, codec: str) -> tuple[list, int, int]:
    """Streaming DiLoCo nodes of `case`, its length and rounds (a whole number of cycles)."""
    length = max(case["length"], case["fragments"])
    overlap = min(case["overlap"], case["window"] - 1)
    inner_steps = case["fragments"] * case["window"]
    options = (("inner_steps", inner_steps), ("outer_lr", 0.7), ("outer_momentum", 0.9),
               ("fragments", case["fragments"]), ("overlap_steps", overlap))
    spec = SchemeSpec("streaming-diloco", case["workers"], options=options, codec=codec)
    nodes = build_nodes(spec, length, _theta0(length), PlainSGD(LR))
    return nodes, length, inner_steps * case["cycles"]


def _record_pseudo_gradients(nodes: list) -> dict[int, list[tuple[Partial, Partial]]]:
    """Per rank, (as produced, as sent) for every pseudo-gradient message it codes."""
    seen: dict[int, list[tuple[Partial, Partial]]] = {node.rank: [] for node in nodes}
    for node in nodes:
        def coded(message: Partial, node=node, code=node.coded) -> Partial:
            sent = code(message)
            if message.kind == Kind.PSEUDO and message.length:
                produced = Partial(**{f: getattr(message, f) for f in (
                    "kind", "sender", "round", "part", "p", "offset", "length")},
                    values=message.values.copy())
                seen[node.rank].append((produced, sent))
            return sent
        node.coded = coded
    return seen


@pytest.mark.parametrize("codec", LOSSY)
@CASES
@given(case=runs)
def test_replicas_hold_equal_anchors_after_each_sync_with_a_lossy_codec(
        codec: str, case: dict) -> None:
    nodes, length, rounds = _streaming(case, codec)
    sync_anchors: dict[int, list[np.ndarray]] = {node.rank: [] for node in nodes}
    for node in nodes:  # the anchor right after every applied sync, per rank
        def apply(sync, node=node, inner=node._apply) -> None:
            inner(sync)
            sync_anchors[node.rank].append(node.anchor.copy())
        node._apply = apply
    drive(nodes, {r: rounds for r in range(len(nodes))}, seed=case["seed"], length=length,
          duplicate_prob=case["duplicate_prob"])
    syncs = case["cycles"] * case["fragments"]
    assert all(len(anchors) == syncs for anchors in sync_anchors.values())
    for rank in sync_anchors:
        for got, want in zip(sync_anchors[rank], sync_anchors[0], strict=True):
            np.testing.assert_array_equal(got, want)
    last = nodes[0]._slice((rounds // case["window"] - 1) % case["fragments"])
    for node in nodes[1:]:  # the fragment synced last took the global value everywhere
        np.testing.assert_array_equal(node.params[last], nodes[0].params[last])


@pytest.mark.parametrize("codec", LOSSY)
@CASES
@given(case=runs)
def test_everything_sent_plus_the_residual_equals_every_pseudo_gradient_produced(
        codec: str, case: dict) -> None:
    nodes, length, rounds = _streaming(case, codec)
    seen = _record_pseudo_gradients(nodes)
    drive(nodes, {r: rounds for r in range(len(nodes))}, seed=case["seed"], length=length,
          duplicate_prob=case["duplicate_prob"])
    for node in nodes:
        produced = np.zeros(length, np.float64)
        sent = np.zeros(length, np.float64)
        for made, coded in seen[node.rank]:
            assert coded.codec == codec_named(codec).name and coded.payload is not None
            assert len(coded.payload) == codec_named(codec).encoded_bytes(coded.length)
            window = slice(made.offset, made.offset + made.length)
            produced[window] += made.values
            sent[window] += coded.values
        # all-reduce: each sync codes every non-empty chunk of its fragment once
        chunks = sum(len(ChunkState(node._chunk_bounds(k)).chunks())
                     for k in range(case["fragments"]))
        assert len(seen[node.rank]) == case["cycles"] * chunks
        residual = node.encoder.residual.astype(np.float64) + node.encoder.withdrawn
        scale = max(1.0, float(np.abs(produced).max()))
        np.testing.assert_allclose(sent + residual, produced, rtol=0, atol=1e-5 * scale)


@pytest.mark.parametrize("codec", LOSSY)
def test_a_lossy_codec_changes_what_diloco_averages(codec: str) -> None:
    """The codec is really on the pseudo-gradients: the coded run differs from the plain
    one, and the sync averaged the decoded own value (not the produced one)."""
    case = {"workers": 3, "length": 30, "seed": 7, "fragments": 1, "window": 2,
            "overlap": 0, "cycles": 2, "duplicate_prob": 0.0}
    plain, length, rounds = _streaming(case, "none")
    coded, _, _ = _streaming(case, codec)
    for nodes in (plain, coded):
        drive(nodes, {r: rounds for r in range(3)}, seed=7, length=length, duplicate_prob=0,
              grad_scale=0.37)
    assert not np.array_equal(plain[0].anchor, coded[0].anchor)
    assert all(np.any(node.encoder.withdrawn) for node in coded)  # held back at the end


@CASES
@given(workers=st.integers(2, 4), length=st.integers(2, 30), inner_steps=st.integers(1, 3),
       syncs=st.integers(0, 3), seed=st.integers(0, 2**31),
       duplicate_prob=st.sampled_from([0.0, 0.2]))
def test_diloco_without_a_codec_is_the_sequential_reference_bit_for_bit(
        workers: int, length: int, inner_steps: int, syncs: int, seed: int,
        duplicate_prob: float) -> None:
    options = (("inner_steps", inner_steps), ("outer_lr", 0.7), ("outer_momentum", 0.9))
    nodes = build_nodes(SchemeSpec("diloco", workers, options=options, codec="none"), length,
                        _theta0(length), PlainSGD(LR))
    assert all(node.encoder is None for node in nodes)
    log = drive(nodes, {r: inner_steps * syncs for r in range(workers)}, seed=seed,
                length=length, duplicate_prob=duplicate_prob)
    anchor = _theta0(length)
    local = [anchor.copy() for _ in range(workers)]
    outer = NesterovSGD(0.7, 0.9)
    state = outer.init(anchor)
    for t in range(inner_steps * syncs):
        local = [PlainSGD(LR).apply(w, None, log.gradients[i][t])[0] for i, w in enumerate(local)]
        if (t + 1) % inner_steps == 0:
            total = np.zeros(length, np.float64)
            for w in local:  # rank order, float64, as every replica sums
                total += (anchor - w).astype(np.float32)
            anchor, state = outer.apply(anchor, state, (total / workers).astype(np.float32))
            local = [anchor.copy() for _ in range(workers)]
    for node in nodes:
        np.testing.assert_array_equal(node.params, local[0])
        np.testing.assert_array_equal(node.anchor, anchor)
