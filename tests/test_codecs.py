"""Codecs: each codec's payload, error feedback's conservation, and the codec on a
scheme's sends (exactly once for the decoded values: replicas equal after a drain)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from akocore.codecs import codec_named
from akocore.codecs.int8 import CHUNK
from akocore.messages import Kind, Partial
from akocore.optim import PlainSGD
from akocore.schemes import SchemeSpec, build_nodes
from akocore.settings.normalise import ConfigError
from akocore.settings.schema import ExchangeConfig
from tests.scheme_harness import drive

LOSSY = ("fp16", "bf16", "int8", "topk:0.25", "topk:0.01", "ctopk:0.1:64:2", "ctopk:0.3:50:32")
ALL = ("none", *LOSSY)
LR = 0.25

vectors = st.integers(0, 3000).flatmap(lambda n: st.builds(
    lambda seed, scale: (np.random.default_rng(seed).standard_normal(n) * scale).astype(
        np.float32), st.integers(0, 2**31), st.sampled_from([1e-6, 1e-2, 1.0, 300.0])))


@pytest.mark.parametrize("name", ALL)
@settings(max_examples=40, deadline=None)
@given(x=vectors)
def test_payload_has_the_announced_size_and_decodes_to_length(name: str, x: np.ndarray) -> None:
    codec = codec_named(name)
    payload, residual = codec.encode(x)
    assert len(payload) == codec.encoded_bytes(x.shape[0])
    decoded = codec.decode(payload, x.shape[0])
    assert decoded.dtype == np.float32 and decoded.shape == x.shape
    np.testing.assert_allclose(decoded + residual, x, rtol=1e-6, atol=1e-6 * (np.abs(x).max(
        initial=0.0)))


def test_none_is_lossless_and_the_casts_keep_their_precision() -> None:
    x = (np.random.default_rng(0).standard_normal(5000) * 10).astype(np.float32)
    assert np.array_equal(codec_named("none").decode(codec_named("none").encode(x)[0], 5000), x)
    for name, rel in (("fp16", 2.0**-11), ("bf16", 2.0**-8)):
        codec = codec_named(name)
        got = codec.decode(codec.encode(x)[0], x.size)
        assert np.all(np.abs(got - x) <= rel * np.abs(x) + 1e-30), name
    big = np.array([1e6, -1e6, 3.0], np.float32)  # beyond fp16: clipped, never inf
    payload, residual = codec_named("fp16").encode(big)
    assert np.all(np.isfinite(codec_named("fp16").decode(payload, 3)))
    np.testing.assert_allclose(residual[:2], [1e6 - 65504, -(1e6 - 65504)])


def test_int8_error_is_at_most_half_a_step_of_each_chunks_own_scale() -> None:
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.standard_normal(CHUNK) * 100, rng.standard_normal(CHUNK + 7) * 0.01])
    x = x.astype(np.float32)
    codec = codec_named("int8")
    got = codec.decode(codec.encode(x)[0], x.size)
    for start in range(0, x.size, CHUNK):
        chunk = slice(start, start + CHUNK)
        step = np.abs(x[chunk]).max() / 127
        assert np.abs(got[chunk] - x[chunk]).max() <= step * 0.5 + 1e-6 * step
    assert codec.encoded_bytes(2 * CHUNK + 7) == 2 * CHUNK + 7 + 4 * 3


def test_topk_sends_exactly_the_largest_magnitudes() -> None:
    x = np.array([0.1, -5.0, 0.2, 3.0, -0.3, 0.0, 4.0, 0.05], np.float32)
    codec = codec_named("topk:0.3")  # ceil(0.3 * 8) = 3
    payload, residual = codec.encode(x)
    got = codec.decode(payload, 8)
    assert np.flatnonzero(got).tolist() == [1, 3, 6]
    assert got[[1, 3, 6]].tolist() == [-5.0, 3.0, 4.0]
    assert np.array_equal(residual + got, x)
    assert len(payload) == 3 * 8


@pytest.mark.parametrize("name", LOSSY)
@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31), steps=st.integers(1, 12), length=st.integers(1, 2500))
def test_error_feedback_sent_plus_residual_equals_everything_produced(
        name: str, seed: int, steps: int, length: int) -> None:
    codec = codec_named(name)
    rng = np.random.default_rng(seed)
    produced = np.zeros(length, np.float64)
    sent = np.zeros(length, np.float64)
    residual = np.zeros(length, np.float32)
    for _ in range(steps):
        x = (rng.standard_normal(length) * rng.choice([1e-3, 1.0, 50.0])).astype(np.float32)
        produced += x
        payload, residual = codec.encode(x, residual)
        sent += codec.decode(payload, length)
    np.testing.assert_allclose(sent + residual, produced, rtol=1e-5,
                               atol=1e-5 * np.abs(produced).max())


@pytest.mark.parametrize("name", ["int8", "topk:0.5", "fp16"])
def test_a_payload_no_sender_could_produce_is_refused(name: str) -> None:
    codec = codec_named(name)
    payload = bytearray(codec.encode(np.arange(1, 9, dtype=np.float32))[0])
    with pytest.raises(ValueError):
        codec.decode(bytes(payload[:-1]), 8)
    if name.startswith("topk"):
        payload[0:4] = (99).to_bytes(4, "little")  # index outside the vector
        with pytest.raises(ValueError):
            codec.decode(bytes(payload), 8)
    if name == "int8":
        payload[0:4] = np.float32(-1).tobytes()  # a negative scale
        with pytest.raises(ValueError):
            codec.decode(bytes(payload), 8)


@pytest.mark.parametrize("text", ["int4", "topk", "topk:0", "topk:1.5", "topk:x", ""])
def test_exchange_codec_names_what_is_allowed(text: str) -> None:
    with pytest.raises(ConfigError, match="none, fp16, bf16, int8 or topk:FRACTION"):
        ExchangeConfig(codec=text)


def test_exchange_codec_is_read_in_one_canonical_form() -> None:
    assert ExchangeConfig(codec=" TopK:0.010 ").codec == "topk:0.01"
    assert ExchangeConfig().codec == "none"


def test_a_coded_message_counts_its_encoded_bytes() -> None:
    msg = Partial(Kind.GRAD, 0, 0, 0, 1, 0, 4096)
    assert msg.nbytes == 4 * 4096
    for name in LOSSY:
        coded = Partial(Kind.GRAD, 0, 0, 0, 1, 0, 4096, codec=name)
        assert coded.nbytes == codec_named(name).encoded_bytes(4096)
    assert Partial(Kind.GRAD, 0, 0, 0, 1, 0, 4096, codec="topk:0.01").nbytes == 41 * 8


def withdrawn(nodes: list) -> np.ndarray:
    return sum(node.encoder.withdrawn for node in nodes if node.encoder is not None
               and node.encoder.withdrawn is not None)


def total(gradients: dict[int, list[np.ndarray]], length: int) -> np.ndarray:
    out = np.zeros(length, np.float64)
    for grads in gradients.values():
        for grad in grads:
            out += grad
    return out


@pytest.mark.parametrize("name", LOSSY)
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workers=st.integers(2, 4), length=st.integers(4, 40), p=st.integers(1, 4),
       staleness=st.sampled_from([0, 2, math.inf]), rounds=st.integers(0, 6),
       seed=st.integers(0, 2**31))
def test_ako_with_a_codec_applies_the_same_decoded_sum_on_every_replica(
        name: str, workers: int, length: int, p: int, staleness: float, rounds: int,
        seed: int) -> None:
    """Exactly once for the decoded values: after a drain every replica equals
    theta0 - lr/n * (all gradients - what error feedback never sent)."""
    spec = SchemeSpec("ako", workers, (min(p, length),), staleness, codec=name)
    theta0 = np.linspace(-1, 1, length).astype(np.float32)
    nodes = build_nodes(spec, length, theta0, PlainSGD(LR))
    log = drive(nodes, {w: rounds for w in range(workers)}, seed=seed, length=length,
                duplicate_prob=0.2)
    want = theta0 - LR / workers * (total(log.gradients, length) - withdrawn(nodes))
    for node in nodes:
        np.testing.assert_allclose(node.params, want, rtol=1e-5, atol=1e-4)
    assert log.duplicates_dropped == log.duplicates_sent


@pytest.mark.parametrize("name", ["int8", "topk:0.3"])
@settings(max_examples=15, deadline=None)
@given(workers=st.integers(2, 4), length=st.integers(6, 30), rounds=st.integers(0, 5),
       seed=st.integers(0, 2**31))
def test_allreduce_and_ps_with_a_codec_keep_replicas_equal(
        name: str, workers: int, length: int, rounds: int, seed: int) -> None:
    theta0 = np.ones(length, np.float32)
    nodes = build_nodes(SchemeSpec("allreduce", workers, codec=name), length, theta0,
                        PlainSGD(LR))
    log = drive(nodes, {w: rounds for w in range(workers)}, seed=seed, length=length)
    want = theta0 - LR / workers * (total(log.gradients, length) - withdrawn(nodes))
    for node in nodes:
        np.testing.assert_allclose(node.params, want, rtol=1e-5, atol=1e-4)
    spec = SchemeSpec("ps", workers + 1, (1,), 0, ps_servers=1, codec=name)
    nodes = build_nodes(spec, length, theta0, PlainSGD(LR))
    log = drive(nodes, {w: rounds for w in range(workers)}, seed=seed, length=length)
    want = theta0 - LR / workers * (total(log.gradients, length) - withdrawn(nodes))
    for node in nodes:
        np.testing.assert_allclose(node.params, want, rtol=1e-5, atol=1e-4)


def test_parameters_never_pass_through_the_codec() -> None:
    spec = SchemeSpec("ps", 3, (1,), 0, ps_servers=1, codec="int8")
    nodes = build_nodes(spec, 8, np.ones(8, np.float32), PlainSGD(LR))
    sends = nodes[0].local_step(0, np.ones(8, np.float32))
    assert [send.message.codec for send in sends] == ["int8"]
    receipt = nodes[2].receive(sends[0].message)
    receipt = nodes[2].receive(nodes[1].local_step(0, np.ones(8, np.float32))[0].message)
    assert receipt.effects and {e.message.kind for e in receipt.effects} == {Kind.PARAMS}
    assert all(e.message.codec == "none" for e in receipt.effects)


@pytest.mark.parametrize("name", LOSSY)
def test_a_non_finite_gradient_is_sent_as_non_finite_not_a_crash(name: str) -> None:
    """The receiver refuses non-finite values (as without a codec); encoding never raises."""
    x = np.array([1.0, np.nan, 2.0, np.inf] * 8, np.float32)
    codec = codec_named(name)
    payload, decoded, _ = codec.encode_decoded(x)
    assert not np.all(np.isfinite(codec.decode(payload, x.size)))
    assert not np.all(np.isfinite(decoded))


def test_without_a_codec_nodes_are_left_as_the_scheme_built_them() -> None:
    nodes = build_nodes(SchemeSpec("ako", 2, (1,)), 4, np.zeros(4, np.float32), PlainSGD(LR))
    assert all(node.encoder is None and "local_step" not in vars(node) for node in nodes)
    sends = nodes[0].local_step(0, np.ones(4, np.float32))
    assert sends[0].message.codec == "none" and sends[0].message.payload is None


def test_a_stateful_optimizer_is_never_stepped_on_the_last_residual() -> None:
    class Stateful(PlainSGD):
        linear = False  # as momentum or Adam: a take-back would be a step of its own

    optimizer = Stateful(LR)
    nodes = build_nodes(SchemeSpec("ako", 2, (1,), codec="topk:0.25"), 8,
                        np.zeros(8, np.float32), optimizer)
    drive(nodes, {0: 3, 1: 3}, seed=1, length=8)
    for node in nodes:
        assert node.encoder.residual is not None and not np.any(node.encoder.residual)
        assert np.any(node.encoder.withdrawn)  # dropped, not applied
    linear = build_nodes(SchemeSpec("ako", 2, (1,), codec="topk:0.25"), 8,
                         np.zeros(8, np.float32), PlainSGD(LR))
    drive(linear, {0: 3, 1: 3}, seed=1, length=8)
    np.testing.assert_allclose(linear[0].params, linear[1].params, rtol=1e-6)
    assert not np.allclose(nodes[0].params, nodes[1].params)
