"""Sites of many devices: a rank is an island whose devices each compute their own batch and
reduce over an inside network (a ring, in closed form) before the rank exchanges with the
other sites; akosim charges that all-reduce in every round and plans every scheme for
"4 sites x 8 devices, 1 Gbit/s between sites"."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from akocore.records.results import PlanResult
from akocore.settings.layers import Given, Layer, resolve
from akocore.settings.normalise import ConfigError
from akocore.settings.schema import ClusterConfig, NetworkConfig, RunConfig, TrainConfig
from akocore.settings.sites import Site, parse_between, parse_site
from akocore.settings.toml_io import config_hash, load_config
from akosim.cli import main
from akosim.network.island_reduce import (
    inside_allreduce_s,
    inside_times_s,
    island_batch_config,
    island_round_s,
    samples_per_round,
)
from akosim.planning.compute import ComputeModel
from akosim.planning.learning_runs import learning_source
from akosim.planning.setup import build_setup
from akosim.sim.closed_form import closed_form_run
from akosim.sim.engine import StopRule
from akosim.sim.scenario import Variant, simulate

ROOT = Path(__file__).resolve().parent.parent
FOUR_BY_EIGHT = "8dev@1gbps,inside=100gbps/5us,repeat=4"
GRADIENT_BYTES = 400_000


def _ring_s(gradient_bytes: float, d: int, bandwidth_bps: float, latency_s: float) -> float:
    """The closed form, written out: 2(d-1)/d of the gradient over the inside links and
    2(d-1) inside latencies."""
    return 2 * (d - 1) / d * gradient_bytes * 8 / bandwidth_bps + 2 * (d - 1) * latency_s


# ------------------------------------------------------------------ the closed form


@pytest.mark.parametrize(("devices", "bandwidth_bps", "latency_s"),
                         [(2, 10e9, 0.0), (8, 100e9, 5e-6), (3, 1e9, 1e-3), (64, 400e9, 2e-6)])
def test_the_inside_all_reduce_is_the_ring_closed_form(devices, bandwidth_bps,
                                                       latency_s) -> None:
    got = inside_allreduce_s(GRADIENT_BYTES, devices, bandwidth_bps, latency_s)
    assert got == pytest.approx(_ring_s(GRADIENT_BYTES, devices, bandwidth_bps, latency_s),
                                rel=1e-12)
    assert island_round_s(0.2, GRADIENT_BYTES, devices, bandwidth_bps, latency_s) == \
        pytest.approx(0.2 + got, rel=1e-12)


def test_one_device_costs_nothing_and_a_free_inside_network_only_latency() -> None:
    assert inside_allreduce_s(GRADIENT_BYTES, 1, 1e9, 1e-3) == 0.0
    assert inside_allreduce_s(GRADIENT_BYTES, 4, math.inf, 1e-3) == pytest.approx(6e-3)
    assert inside_allreduce_s(GRADIENT_BYTES, 4, math.inf, 0.0) == 0.0
    for bad in ((GRADIENT_BYTES, 0, 1e9, 0.0), (GRADIENT_BYTES, 2, 0.0, 0.0),
                (GRADIENT_BYTES, 2, 1e9, -1.0)):
        with pytest.raises(ValueError):
            inside_allreduce_s(*bad)


# ------------------------------------------------------------------ the description


def _resolve(sites: list[str], between: str | None):
    givens = [Given("site.list", sites, Layer.FLAG, "by --site")]
    if between is not None:
        givens.append(Given("between.link", between, Layer.FLAG, "by --between"))
    return resolve(givens).config


def test_a_site_of_islands_reads_its_devices_inside_network_and_repeat() -> None:
    assert parse_site(FOUR_BY_EIGHT) == Site(1, 1e9, 0.0, devices_per_rank=8,
                                             inside_bandwidth_bps=100e9,
                                             inside_latency_s=5e-6, repeat=4)
    assert parse_site("2x4dev@10gbps,1ms,inside=400gbps") == Site(
        2, 10e9, 1e-3, devices_per_rank=4, inside_bandwidth_bps=400e9)
    assert parse_site("1gbps") == Site(1, 1e9)  # one rank of one device
    table = {"ranks": 1, "devices_per_rank": 8, "bandwidth": "1gbps",
             "inside_bandwidth": "100gbps", "inside_latency": "5us", "repeat": 4}
    assert parse_site(table) == parse_site(FOUR_BY_EIGHT)
    # the link between sites reads in either order
    assert parse_between("1gbps,30ms") == parse_between("30ms,1gbps")


@pytest.mark.parametrize(("text", "words"), [
    ("8dev@1gbps", "needs its inside network: add inside="),
    ("4x1gbps,inside=100gbps", "give DEVICESdev@ first"),
    ("0dev@1gbps,inside=1gbps", "the devices per rank must be a whole number"),
    ("8dev@1gbps,inside=1gbps,repeat=0", "repeat must be a whole number"),
    ("8dev@1gbps,inside=1gbps,every=2", "cannot read 'every=2'"),
    ("8gpu@1gbps,inside=1gbps", "expected [RANKSx][DEVICESdev@]"),
])
def test_a_bad_site_of_islands_says_what_is_allowed(text: str, words: str) -> None:
    with pytest.raises(ConfigError, match="--site") as error:
        parse_site(text)
    assert words in str(error.value)


def test_four_sites_of_eight_devices_are_four_ranks_with_islands() -> None:
    cfg = _resolve([FOUR_BY_EIGHT], "1gbps,30ms")
    assert cfg.cluster.workers == 4
    assert cfg.cluster.devices_per_rank == (8, 8, 8, 8)
    assert [cfg.network.inside_of(rank) for rank in range(4)] == [(100e9, 5e-6)] * 4
    latency = cfg.network.latency_matrix(4)
    assert all(latency[i, j] == pytest.approx(0.03) for i in range(4) for j in range(4)
               if i != j)
    from_file = load_config(ROOT / "configs" / "four-sites-8-devices.toml")
    assert from_file.cluster == _resolve([FOUR_BY_EIGHT], "30ms").cluster
    assert from_file.network == _resolve([FOUR_BY_EIGHT], "30ms").network


def test_sites_of_one_device_give_the_settings_they_gave_before() -> None:
    cfg = _resolve(["4x1gbps", "4x50mbps"], "30ms,50mbps")
    assert cfg.cluster.devices_per_rank == (1,)
    assert cfg.network.inside_bandwidth_bps == (math.inf,)


def test_devices_change_the_run_hash_and_the_inside_network_does_not() -> None:
    base = RunConfig()
    islands = RunConfig(cluster=ClusterConfig(devices_per_rank=8))
    inside = RunConfig(network=NetworkConfig(inside_bandwidth_bps="100gbps",
                                             inside_latency_s="5us"))
    assert config_hash(islands) != config_hash(base)
    assert config_hash(inside) == config_hash(base)


def test_a_bad_devices_per_rank_names_the_key() -> None:
    with pytest.raises(ConfigError, match="cluster.devices_per_rank"):
        ClusterConfig(devices_per_rank=0)
    with pytest.raises(ConfigError, match="network.inside_bandwidth"):
        NetworkConfig(inside_bandwidth_bps="fast")


# ------------------------------------------------------------------ the simulation


def _setup(sites: list[str], *, compute_s: float = 0.005, rounds: int = 8):
    cfg = _resolve(sites, "1gbps,30ms")
    cfg = RunConfig(cluster=cfg.cluster, network=cfg.network,
                    train=TrainConfig(batch_size=32, rounds=rounds))
    return build_setup(cfg, length=GRADIENT_BYTES // 4, compute=ComputeModel(compute_s),
                       stop=StopRule(rounds=rounds), coalesce_rel=0.0)


def test_every_round_charges_the_inside_all_reduce_after_the_gradient() -> None:
    islands = _setup([FOUR_BY_EIGHT])
    plain = _setup(["1gbps,repeat=4"])
    inside_s = _ring_s(GRADIENT_BYTES, 8, 100e9, 5e-6)
    assert islands.compute.inside_s == pytest.approx((inside_s,) * 4)
    assert inside_times_s(islands.config, GRADIENT_BYTES) == islands.compute.inside_s
    ring = Variant("allreduce", label="ring allreduce")
    with_islands = simulate(islands, ring)
    without = simulate(plain, ring)
    # the lockstep ring: the rounds are longer by exactly the inside all-reduce
    assert with_islands.round_time_s - without.round_time_s == pytest.approx(inside_s,
                                                                             rel=1e-6)
    assert with_islands.compute_s_per_round == pytest.approx(0.005)  # the gradient only
    # and the closed form (what the plan runs for the ring) says the same
    closed = closed_form_run(islands, ring)
    assert closed is not None
    assert closed.round_time_s == pytest.approx(with_islands.round_time_s, rel=1e-9)
    # samples: every device of every island, batch 32 each
    assert samples_per_round(islands.config, 32, 4) == 4 * 8 * 32
    assert with_islands.samples_per_s == pytest.approx(
        4 * 8 * 32 / with_islands.round_time_s)


def test_a_scheme_that_overlaps_sends_is_compute_plus_inside_when_the_network_keeps_up() -> None:
    islands = _setup(["8dev@100gbps,inside=100gbps/5us,repeat=4"], compute_s=0.05, rounds=30)
    run = simulate(islands, Variant("ako", p_of=(1,), ssp=4, label="ako"))
    inside_s = _ring_s(GRADIENT_BYTES, 8, 100e9, 5e-6)
    assert run.round_time_s == pytest.approx(0.05 + inside_s, rel=1e-6)
    spans = simulate(islands, Variant("ako", p_of=(1,), ssp=4, label="ako"), trace=True).trace
    inside = [span for span in spans if span.name == "inside"]
    assert inside and all(span.end_s - span.start_s == pytest.approx(inside_s)
                          for span in inside)


def test_the_learning_twin_trains_an_islands_batch() -> None:
    setup = _setup([FOUR_BY_EIGHT])
    source = learning_source(setup.config, setup, stand_in_gradient=True, measured_step_s=None)
    assert source.devices == 8 and source.rank_batch == 8 * source.batch_size
    assert "per island of 8" in source.describe("synthetic-cnn")


# ------------------------------------------------------------------ the plan


def test_the_plan_answers_four_sites_of_eight_devices_for_every_scheme(capsys,
                                                                        tmp_path) -> None:
    common = ["--gradient-size", "400kB", "--compute", "5ms", "--between", "1gbps,30ms",
              "--rank-by", "throughput"]
    records = {}
    for name, site in (("islands", FOUR_BY_EIGHT), ("plain", "1gbps,repeat=4")):
        out = tmp_path / f"{name}.json"
        assert main([*common, "--site", site, "--out", str(out)]) == 0
        records[name] = PlanResult.from_json(json.loads(out.read_text()))
    text = capsys.readouterr().out
    inside_s = _ring_s(GRADIENT_BYTES, 8, 100e9, 5e-6)
    assert "islands: 4 ranks of 8 devices, batch" in text
    islands, plain = records["islands"], records["plain"]
    schemes = {run.scheme for run in islands.runs}
    assert {"ako", "ps", "allreduce", "diloco", "streaming-diloco"} <= schemes
    assert all(run.round_time_s and run.samples_per_s for run in islands.runs)
    ring = next(run for run in islands.runs if run.scheme == "allreduce")
    ring_plain = next(run for run in plain.runs if run.scheme == "allreduce")
    assert ring.round_time_s - ring_plain.round_time_s == pytest.approx(inside_s, rel=1e-6)
    assert ring.samples_per_s == pytest.approx(4 * 8 * 104 / ring.round_time_s)
    assert islands.config["cluster"]["devices_per_rank"] == [8, 8, 8, 8]


def test_the_api_takes_a_list_of_sites_of_islands() -> None:
    import akosim

    record = akosim.plan(site=["8dev@1gbps,inside=100gbps/5us", "2x4dev@1gbps,inside=10gbps"],
                         between="30ms", gradient_size="400kB", compute="5ms",
                         rank_by="throughput", scheme="allreduce", quiet=True)
    assert record.config["cluster"]["devices_per_rank"] == [8, 4, 4]
    (run,) = record.runs
    assert run.samples_per_s == pytest.approx((8 + 4 + 4) * 104 / run.round_time_s)


def test_simulated_training_takes_an_islands_gradient_on_every_devices_batch(tmp_path) -> None:
    cfg = _resolve(["2x4dev@10gbps,inside=100gbps"], None)
    assert island_batch_config(cfg).train.batch_size == 4 * cfg.train.batch_size
    assert island_batch_config(RunConfig()) == RunConfig()
    with pytest.raises(ValueError, match="the same devices in every rank"):
        island_batch_config(_resolve(["4dev@1gbps,inside=1gbps", "2dev@1gbps,inside=1gbps"],
                                     "30ms"))
    out = tmp_path / "train.json"
    assert main(["train", "--site", "2x4dev@10gbps,inside=100gbps", "--workload",
                 "digits-mlp", "--batch-size", "8", "--rounds", "3", "--compute", "5ms",
                 "--scheme", "allreduce", "--quiet", "--out", str(out)]) == 0
    record = PlanResult.from_json(json.loads(out.read_text()))
    (run,) = record.runs
    inside_s = _ring_s(4_810 * 4, 4, 100e9, 0.0)
    assert run.compute_s_per_round == pytest.approx(0.005)
    assert run.samples_per_s == pytest.approx(2 * 4 * 8 / run.round_time_s)
    assert run.round_time_s > 0.005 + inside_s


def test_akorun_refuses_sites_its_islands_do_not_match_with_one_line(tmp_path) -> None:
    site = ["--site", "2x8dev@1gbps,inside=100gbps"]  # 8 devices per rank; islands of 1
    for command in (["launch", *site, "--out", str(tmp_path / "run")],
                    ["init", *site, "--out", str(tmp_path / "cluster.toml")]):
        done = subprocess.run([sys.executable, "-m", "akorun", *command],
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in done.stderr
        assert "akorun runs islands of 1 device(s): give --devices-per-rank" in lines[0]
        assert not (tmp_path / "cluster.toml").exists()


def test_akorun_takes_sites_whose_devices_its_islands_match(tmp_path) -> None:
    out = tmp_path / "cluster.toml"
    done = subprocess.run([sys.executable, "-m", "akorun", "init", "--site",
                           "2x2dev@1gbps,inside=100gbps", "--devices-per-rank", "2", "--out",
                           str(out)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert out.exists()
