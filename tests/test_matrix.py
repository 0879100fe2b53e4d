"""The experiment matrix: committed configs equal the generator's, and they load."""

from __future__ import annotations

import pytest

from akocore.settings.layers import Given, Layer, resolve
from akocore.settings.toml_io import load_config
from analysis import matrix
from analysis.matrix import CONFIG_DIR, SCALING, all_experiments, expected_files


def test_committed_files_equal_the_generator():
    files = expected_files()
    stale = [str(p) for p, text in files.items()
             if not p.exists() or p.read_text(encoding="utf-8") != text]
    assert not stale, "run `python -m analysis.matrix --write`: " + ", ".join(stale[:5])
    on_disk = set(CONFIG_DIR.rglob("*.toml"))
    extra = on_disk - set(files)
    assert not extra, f"files not produced by the generator: {sorted(map(str, extra))[:5]}"


def test_the_matrix_is_networks_by_workers_by_schemes():
    ids = [e.id for e in all_experiments()]
    assert len(ids) == len(set(ids)) == 4 * 3 * len(matrix.ALL_SCHEMES)
    assert matrix.ALL_SCHEMES[:5] == ("ps", "ako-p1", "ako-various", "ako-p4", "ako-pauto")
    assert "wagma" in matrix.NEW_SCHEMES and matrix.DIST_TF in matrix.DIST_TF_CANDIDATES
    assert matrix.select(subset="ci")[0].id in matrix.CI_SUBSET
    assert {e.id for e in matrix.select("uniform-wan/2w-*")} == {
        f"uniform-wan/2w-{s}" for s in matrix.ALL_SCHEMES}


def test_scaling_keeps_the_ratio_of_compute_to_transfer():
    # one full gradient over one link, in compute steps, is the same in both setups
    for seed_mbps in (800, 40, 10):
        seed = 8 * matrix.SEED_GRADIENT_BYTES / (seed_mbps * 1e6 * matrix.SEED_COMPUTE_S)
        ours = 8 * matrix.OUR_GRADIENT_BYTES / (SCALING.mbps(seed_mbps) * 1e6
                                                 * matrix.OUR_COMPUTE_S)
        assert ours == pytest.approx(seed, rel=1e-3)
    assert SCALING.budget_s / matrix.OUR_COMPUTE_S == pytest.approx(
        matrix.SEED_BUDGET_S / matrix.SEED_COMPUTE_S, rel=1e-3)


@pytest.mark.parametrize("exp", all_experiments(), ids=lambda e: e.id)
def test_every_config_loads_and_says_what_it_is(exp):
    cfg = load_config(exp.path())
    full = load_config(exp.path(fullsize=True))
    for c in (cfg, full):
        assert c.cluster.workers == exp.nodes
        assert c.exchange.scheme == matrix.core_scheme(exp.scheme)
    assert cfg.train.workload == matrix.WORKLOAD and cfg.train.batch_size == matrix.BATCH
    assert cfg.train.duration_s == pytest.approx(SCALING.budget_s)
    assert cfg.train.target_accuracy is None  # it would stop the run (see analysis.matrix)
    assert full.train.workload == "synthetic-cnn"
    link = cfg.network.link_bandwidth_bps[0] / full.network.link_bandwidth_bps[0]
    assert link == pytest.approx(SCALING.bandwidth_factor, rel=1e-3)
    if exp.scheme == "ps":
        assert cfg.exchange.ps_servers == 1 and cfg.exchange.ps_mode == "async"
    elif exp.scheme == "ako-various":
        assert len(cfg.exchange.p) == exp.workers
        assert set(cfg.exchange.p) <= set(matrix.VARIOUS_CHOICES)
        assert cfg.exchange.p == full.exchange.p  # the scaling keeps the planner's need
    elif exp.scheme == "ako-pauto":
        assert cfg.exchange.p == "auto"
    elif exp.scheme in matrix.NEW_SCHEMES:
        # a named scheme's exchange settings, the matrix's training settings
        named = resolve([Given("exchange.scheme", exp.scheme, Layer.FLAG, "")]).config
        assert cfg.exchange == full.exchange == named.exchange
        assert cfg.train.optimizer == matrix.OPTIMIZER and cfg.train.lr == matrix.LR
    else:
        assert cfg.exchange.p == (int(exp.scheme[-1]),)
