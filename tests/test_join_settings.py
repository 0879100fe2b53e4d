"""Bad configuration across ranks is found at the join: exit 2 on every rank, within
seconds, with one line naming the setting and both values.

The comparison is a table of named settings (akorun.runtime.lifecycle.join `compared_settings`:
every key of the run's config and the entries of `COMPARED`); one loopback run of two
ranks started with different learning rates checks what the user sees.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from akocore.settings.toml_io import config_from_dict
from akorun.launching.cluster import new_settings, write_cluster_file
from akorun.runtime.lifecycle.join import COMPARED, JoinFacts, compared_settings, first_mismatch
from akorun.testing import LocalCluster

pytestmark = pytest.mark.timeout(150)

TABLES = {"cluster": {"workers": 2}, "exchange": {"p": 1, "ssp": 1},
          "train": {"workload": "digits-mlp", "optimizer": "sgd", "lr": 0.1,
                    "rounds": 4, "eval_every": 1000}}


def test_the_table_names_every_config_key_and_the_extra_entries() -> None:
    settings = compared_settings(JoinFacts(config_from_dict(TABLES), "abc"))
    assert settings["train.lr"] == "0.1" and settings["train.seed"] == "0"
    assert "cluster.hosts" not in settings
    assert set(COMPARED) <= set(settings)


def test_the_first_differing_setting_is_named_with_both_values() -> None:
    ours = compared_settings(JoinFacts(config_from_dict(TABLES), "abc"))
    theirs = dict(ours, **{"train.seed": "7"})
    line = first_mismatch(ours, theirs, 0, 1)
    assert line is not None and "train.seed" in line and "rank 0 has 0" in line \
        and "rank 1 has 7" in line
    assert first_mismatch(ours, dict(ours), 0, 1) is None


def test_ranks_started_with_different_learning_rates_both_exit_2_naming_it(
        tmp_path: Path) -> None:
    settings = new_settings(peer_timeout_s=2.0, join_timeout_s=100.0)
    with LocalCluster(tmp_path, TABLES, settings=settings) as cluster:
        cluster.start(0, "--quiet")
        cluster.start(1, "--quiet", "--lr", "0.05")
        codes = cluster.wait_all(110)
        assert codes == {0: 2, 1: 2}, cluster.logs()
        for rank in (0, 1):
            log = cluster.log(rank)
            assert "Traceback" not in log
            assert "setting train.lr differs" in log and "0.1" in log and "0.05" in log, log
            assert "no hello answer within" not in log  # found, not timed out


def test_ranks_of_different_secrets_both_exit_2_saying_so(tmp_path: Path) -> None:
    """Their 401s carry no tag the other can check (it could be forged on the path), so
    each retries until its join timeout, then ends with exit 2 and one line."""
    settings = new_settings(peer_timeout_s=2.0, join_timeout_s=10.0)
    with LocalCluster(tmp_path, TABLES, settings=settings) as cluster:
        other = write_cluster_file(tmp_path / "other.toml", cluster.config,
                                   replace(settings, secret=new_settings().secret))
        cluster.start(0, "--quiet")
        cluster.path, kept = other, cluster.path
        cluster.start(1, "--quiet")
        cluster.path = kept
        codes = cluster.wait_all(110)
        assert codes == {0: 2, 1: 2}, cluster.logs()
        for rank in (0, 1):
            log = cluster.log(rank)
            assert "Traceback" not in log and "cannot authenticate our hello" in log, log
            assert "join timeout 10 s" in log and "secret, run id or key file" in log, log
            # the hellos back off and the server logs unauthenticated refusals at 1, 2, 4, ...
            assert log.count("refused a request") <= 6, log
            assert log.count("not authenticated, retrying") == 1, log
