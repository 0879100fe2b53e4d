"""A cluster of sites: --site / --between and [[site]] / [between] mean the per-node
settings every tool reads (workers, NIC per node, latency matrix, caps between sites)."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from akocore.settings.layers import Given, Layer, layer_of, resolve
from akocore.settings.normalise import ConfigError
from akocore.settings.sites import Between, Site, parse_between, parse_site
from akocore.settings.toml_io import load_config

ROOT = Path(__file__).resolve().parent.parent


def _resolve(sites: list[str], between: str | None, *extra: Given):
    givens = [Given("site.list", sites, Layer.FLAG, "by --site")]
    if between is not None:
        givens.append(Given("between.link", between, Layer.FLAG, "by --between"))
    return resolve([*extra, *givens]).config


def test_the_text_forms_read_counts_units_and_latencies() -> None:
    assert parse_site("4x1gbps") == Site(4, 1e9, 0.0)
    assert parse_site("2x50mbps,0.5ms") == Site(2, 50e6, 0.0005)
    assert parse_between("30ms") == Between(0.03, math.inf)
    assert parse_between("30ms,50mbps") == Between(0.03, 50e6)
    for bad in ("0x1gbps", "ax1gbps", "4x1gbps,", "4xfast", "x1gbps", "4x1gbps,0ms,1ms"):
        with pytest.raises(ConfigError, match="site"):
            parse_site(bad)


def test_two_sites_are_eight_nodes_with_their_nics_latencies_and_the_cap_between() -> None:
    cfg = _resolve(["4x1gbps", "4x50mbps"], "30ms,50mbps")
    assert cfg.cluster.workers == 8
    np.testing.assert_array_equal(cfg.network.uplink_bps(8), [1e9] * 4 + [50e6] * 4)
    latency = cfg.network.latency_matrix(8)
    caps = cfg.network.link_bps_matrix(8)
    inside = np.equal.outer(np.arange(8) // 4, np.arange(8) // 4)
    assert np.all(latency[inside] == 0) and np.all(latency[~inside] == 0.03)
    assert np.all(np.isinf(caps[inside & ~np.eye(8, dtype=bool)]))
    assert np.all(caps[~inside] == 50e6)


def test_a_config_file_with_site_tables_is_the_same_cluster() -> None:
    from_file = load_config(ROOT / "configs" / "two-sites.toml")
    from_flags = _resolve(["4x1gbps", "4x50mbps"], "30ms,50mbps")
    assert from_file.cluster == from_flags.cluster
    assert from_file.network == from_flags.network


def test_a_site_latency_inside_and_no_cap_between() -> None:
    cfg = _resolve(["2x1gbps,1ms", "1x10mbps"], "50ms")
    latency = cfg.network.latency_matrix(3)
    assert latency[0, 1] == pytest.approx(0.001) and latency[0, 2] == pytest.approx(0.05)
    assert np.all(np.isinf(cfg.network.link_bps_matrix(3)[~np.eye(3, dtype=bool)]))


def test_sites_and_a_per_node_setting_in_the_same_layer_conflict() -> None:
    with pytest.raises(ConfigError, match="cluster.workers .* both describe"):
        _resolve(["4x1gbps"], None, Given("cluster.workers", 3, Layer.FLAG, "by --workers"))
    # a lower layer is overridden by the sites
    cfg = _resolve(["4x1gbps"], None, Given("cluster.workers", 3, Layer.FILE, "in x.toml"))
    assert cfg.cluster.workers == 4


def test_several_sites_need_the_link_between_them() -> None:
    with pytest.raises(ConfigError, match="no link between them"):
        _resolve(["4x1gbps", "4x50mbps"], None)
    with pytest.raises(ConfigError, match="--between needs --site"):
        resolve([Given("between.link", "30ms", Layer.FLAG, "by --between")])


def test_a_bad_site_table_names_the_form() -> None:
    with pytest.raises(ConfigError, match="expected workers = N"):
        resolve(layer_of({"site": [{"workers": 4}]}, Layer.FILE, "in x.toml"))


def test_akosim_plans_two_sites_and_refuses_a_bad_site_with_exit_2(tmp_path: Path) -> None:
    base = [sys.executable, "-m", "akosim", "--gradient-size", "400kB", "--compute", "5ms",
            "--site", "2x1gbps", "--site", "2x50mbps"]
    done = subprocess.run([*base, "--between", "30ms,50mbps", "--out",
                           str(tmp_path / "plan.json")], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    assert "4 nodes" in done.stderr + done.stdout
    bad = subprocess.run([*base, "--between", "soon"], capture_output=True, text=True,
                         timeout=600)
    assert bad.returncode == 2
    assert "--between soon" in bad.stderr and "Traceback" not in bad.stderr
