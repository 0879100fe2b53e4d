"""akosim charges a codec's exact encoded bytes and its CPU: bytes per round scale by
the codec's ratio on each scheme's coded messages, and the codec's encode/decode time
lengthens a round."""

from __future__ import annotations

from dataclasses import replace

import pytest

from akocore.codecs import codec_named
from akocore.settings.schema import (
    ClusterConfig,
    ExchangeConfig,
    NetworkConfig,
    RunConfig,
    TrainConfig,
)
from akosim.planning.compute import ComputeModel
from akosim.sim.engine import StopRule
from akosim.sim.scenario import Setup, Variant, simulate

N, LENGTH, ROUNDS = 4, 8192, 12


def setup(codec: str, bandwidth: str = "40mbps") -> Setup:
    config = RunConfig(cluster=ClusterConfig(workers=N),
                       network=NetworkConfig(bandwidth_bps=bandwidth, latency_s="1ms"),
                       exchange=ExchangeConfig(codec=codec),
                       train=TrainConfig(batch_size=32, rounds=ROUNDS))
    return Setup(config, LENGTH, ComputeModel(0.01), 32, StopRule(rounds=ROUNDS))


def coded_share(codec: str, length: int) -> float:
    return codec_named(codec).encoded_bytes(length) / (4 * length)


@pytest.mark.parametrize("codec", ["fp16", "bf16", "int8", "topk:0.01"])
def test_bytes_per_round_scale_by_the_codecs_ratio(codec: str) -> None:
    cases = [
        (Variant("ako", p_of=(2,)), coded_share(codec, LENGTH // 2), 1e-9),  # every partial
        (Variant("ps", ps_servers=1), coded_share(codec, LENGTH), 1e-9),  # pushes coded
        # ring: reduce-scatter steps coded, all-gather steps (sums being shared) not; the
        # timeline's counter may miss part of the last round's forwarded chunks (as
        # tests/test_closed_form.py says), so within one round's share of the total
        (Variant("allreduce"), (coded_share(codec, LENGTH // N) + 1) / 2, 1 / ROUNDS),
    ]
    for variant, share, rel in cases:
        plain = simulate(setup("none"), variant).bytes_sent_per_worker_per_round
        coded = simulate(setup(codec), variant).bytes_sent_per_worker_per_round
        assert coded / plain == pytest.approx(share, rel=rel), variant.scheme


def test_the_codecs_cpu_lengthens_each_round() -> None:
    """fp16 and bf16 put the same bytes on the wire: their rounds differ by exactly
    the difference of their CPU charges."""
    variant = Variant("ako", p_of=(2,))
    fp16 = simulate(setup("fp16"), variant).round_time_s
    bf16 = simulate(setup("bf16"), variant).round_time_s
    cpu = codec_named("fp16").cpu_s(LENGTH // 2) - codec_named("bf16").cpu_s(LENGTH // 2)
    assert cpu > 0
    assert fp16 - bf16 == pytest.approx(cpu, rel=1e-6)
    # the ring encodes each of its n - 1 reduce steps before it forwards it
    ring = Variant("allreduce")
    fp16 = simulate(setup("fp16"), ring).round_time_s
    bf16 = simulate(setup("bf16"), ring).round_time_s
    chunk = LENGTH // N
    cpu = codec_named("fp16").cpu_s(chunk) - codec_named("bf16").cpu_s(chunk)
    assert fp16 - bf16 == pytest.approx((N - 1) * cpu, rel=1e-6)


def scheme_setup(codec: str, scheme: str, **knobs: int) -> Setup:
    plain = setup(codec)
    exchange = ExchangeConfig(scheme=scheme, codec=codec, **knobs)
    return replace(plain, config=replace(plain.config, exchange=exchange))


DILOCO_CASES = [("diloco", {"inner_steps": 4}, 1),
                ("streaming-diloco", {"inner_steps": 4, "fragments": 2, "overlap_steps": 1}, 2)]


@pytest.mark.parametrize("codec", ["fp16", "int8", "topk:0.01"])
@pytest.mark.parametrize(("scheme", "knobs", "fragments"), DILOCO_CASES)
def test_diloco_pseudo_gradient_bytes_per_round_scale_by_the_codecs_ratio(
        codec: str, scheme: str, knobs: dict, fragments: int) -> None:
    """Every sync all-reduces one fragment's pseudo-gradient in N chunks, each coded on its
    way to its owner and its mean coded on the way back (the final marker is empty)."""
    plain = simulate(scheme_setup("none", scheme, **knobs), Variant(scheme))
    coded = simulate(scheme_setup(codec, scheme, **knobs), Variant(scheme))
    share = coded_share(codec, LENGTH // fragments // N)
    assert coded.bytes_sent_per_worker_per_round / plain.bytes_sent_per_worker_per_round \
        == pytest.approx(share, rel=1e-9)


@pytest.mark.parametrize(("scheme", "knobs", "fragments"), DILOCO_CASES)
def test_diloco_rounds_carry_the_codecs_cpu_once_per_sync(
        scheme: str, knobs: dict, fragments: int) -> None:
    """fp16 and bf16 weigh the same: the rounds differ by the CPU difference of one
    fragment's encode and decode, once per window of H / P rounds: N - 1 chunks coded
    before they leave for their owners, then the owner's mean; with an overlapped inner
    step (Streaming DiLoCo, tau = 1) the mean's coding runs beside that step."""
    times = {codec: simulate(scheme_setup(codec, scheme, **knobs), Variant(scheme)).round_time_s
             for codec in ("fp16", "bf16")}
    chunk = LENGTH // fragments
    cpu = codec_named("fp16").cpu_s(chunk) - codec_named("bf16").cpu_s(chunk)
    window = knobs["inner_steps"] // fragments
    on_the_path = (N - 1) / N if knobs.get("overlap_steps") else 1.0
    assert times["fp16"] - times["bf16"] == pytest.approx(on_the_path * cpu / window,
                                                          rel=1e-6)


def test_wagma_models_travel_as_float32_whatever_the_codec() -> None:
    """Models are parameters, which no codec carries: akosim charges wagma as akorun sends
    it, float32 bytes and no codec CPU."""
    plain = simulate(scheme_setup("none", "wagma"), Variant("wagma"))
    coded = simulate(scheme_setup("int8", "wagma"), Variant("wagma"))
    assert coded.bytes_sent_per_worker_per_round == plain.bytes_sent_per_worker_per_round
    assert coded.round_time_s == plain.round_time_s


def test_p_auto_weighs_the_gradient_at_its_encoded_size() -> None:
    from akocore.resolve import resolve_plan

    def p_for(codec: str) -> int:
        config = RunConfig(cluster=ClusterConfig(workers=8),
                           network=NetworkConfig(bandwidth_bps="100mbps"),
                           exchange=ExchangeConfig(codec=codec))
        plan = resolve_plan(config, gradient_bytes=4 * 4_000_000, length=4_000_000,
                            compute_s=1.0)
        return plan.p_of[0]

    assert p_for("int8") < p_for("fp16") < p_for("none")
    assert p_for("topk:0.01") == 1


def test_the_plans_staleness_weighs_the_gradient_at_its_encoded_size() -> None:
    from akosim.planning.advice import with_overlap_ssp

    def s_for(codec: str) -> float:
        config = RunConfig(cluster=ClusterConfig(workers=8),
                           network=NetworkConfig(bandwidth_bps="10mbps"),
                           exchange=ExchangeConfig(codec=codec, p=(1,)),
                           train=TrainConfig(batch_size=32, rounds=ROUNDS))
        setup = Setup(config, 1_000_000, ComputeModel(0.5), 32, StopRule(rounds=ROUNDS))
        return with_overlap_ssp(setup).config.exchange.ssp

    assert s_for("topk:0.01") < s_for("int8") < s_for("none")
