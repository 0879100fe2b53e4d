"""The network presets in configs/: the seeds' four emulated networks load and run."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from akocore.settings.toml_io import load_config

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
PRESETS = ["uniform-lan", "hetero-lan", "uniform-wan", "hetero-wan"]
SITE_EXAMPLES = ["two-sites", "four-sites-8-devices"]  # tested in tests/test_sites.py and
# tests/test_site_islands.py
MBPS = 1e6


def test_every_preset_is_tested():
    assert sorted(path.stem for path in CONFIGS.glob("*.toml")) == sorted(
        PRESETS + SITE_EXAMPLES)


@pytest.mark.parametrize(
    ("name", "link_mbps", "latency_s"),
    [
        ("uniform-lan", (800,), 1e-4),
        ("hetero-lan", (800, 400, 200), 1e-4),
        ("uniform-wan", (40,), 0.02),
        ("hetero-wan", (40, 20, 10), 0.02),
    ],
)
def test_a_preset_caps_each_link_as_the_seeds_emulated_it(name, link_mbps, latency_s):
    config = load_config(CONFIGS / f"{name}.toml")
    net = config.network
    assert config.cluster.workers == 4  # the seeds ran 2, 3 and 4 workers
    assert net.bandwidth_bps == (1e9,)  # the testbed's Ethernet NIC
    assert net.link_bandwidth_bps == tuple(r * MBPS for r in link_mbps)
    assert net.latency_s == (pytest.approx(latency_s),)
    matrix = net.link_bps_matrix(4)
    # pairs (0,1), (0,2), (0,3), (1,2), (1,3), (2,3) take the rates in turn, both ways
    pairs = [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]
    for k, (i, j) in enumerate(pairs):
        expected = link_mbps[k % len(link_mbps)] * MBPS
        assert matrix[i, j] == matrix[j, i] == expected
    assert all(math.isinf(matrix[i, i]) for i in range(4))
    assert np.allclose(net.latency_matrix(4)[~np.eye(4, dtype=bool)], latency_s)


def test_every_preset_says_what_it_models_and_that_latency_is_assumed():
    for name in PRESETS:
        header = (CONFIGS / f"{name}.toml").read_text().split("[cluster]")[0]
        assert "seeds" in header and "ASSUMPTION" in header, name


@pytest.mark.parametrize("name", PRESETS)
def test_a_preset_runs_through_the_cli(name):
    result = subprocess.run(
        [sys.executable, "-m", "akosim", "--config", f"configs/{name}.toml", "--workers", "3",
         "--gradient-size", "1MB", "--compute", "0.1s", "--rounds", "5", "--quiet"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "3 nodes" in result.stdout and "ako p=" in result.stdout
