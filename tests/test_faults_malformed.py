"""A member that sends malformed but authenticated coded data stops the run on every rank.

Rank 0 holds a valid key but, from round 10 on, sends coded bodies a correct
member never sends (the `send_malformed` test hook): a top-k index past the end
of the vector (400 malformed) or an int8 scale that is NaN (422 non_finite).
The first receiver refuses it, names the sender and the reason, and tells every
peer to stop: every rank exits 1 with that line, never a stall.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from akorun.faults import faults_for
from akorun.launching.cluster import new_settings
from akorun.testing import LocalCluster

pytestmark = pytest.mark.slow


def test_send_malformed_is_read_and_a_wrong_kind_is_refused() -> None:
    assert faults_for(0, {"AKORUN_FAULT": "0@send_malformed:5:topk_index"}).send_malformed \
        == (5, "topk_index")
    from akorun.errors import UsageError
    with pytest.raises(UsageError):
        faults_for(0, {"AKORUN_FAULT": "send_malformed:5:garbage"})


@pytest.mark.parametrize(("how", "codec", "scheme", "reason"), [
    ("topk_index", "topk:0.1", "ako", "topk payload indices"),
    ("int8_scale", "int8", "diloco", "non-finite value(s)")],
    ids=["topk-index-ako", "int8-nan-scale-diloco"])
def test_a_member_sending_malformed_data_ends_the_run_with_exit_1_on_every_rank(
        how: str, codec: str, scheme: str, reason: str, tmp_path: Path) -> None:
    exchange = {"scheme": scheme, "codec": codec}
    exchange.update({"p": 2, "ssp": 2} if scheme == "ako" else {"inner_steps": 4})
    tables = {"cluster": {"workers": 3}, "exchange": exchange,
              "train": {"workload": "digits-mlp", "optimizer": "sgd", "lr": 0.1,
                        "rounds": 2000, "eval_every": 100000}}
    with LocalCluster(tmp_path, tables, settings=new_settings(peer_timeout_s=1.5)) as cluster:
        cluster.start_all("--quiet", env={"AKORUN_FAULT": f"0@send_malformed:10:{how}"})
        codes = cluster.wait_all(150)
        assert codes == {0: 1, 1: 1, 2: 1}, cluster.logs()
        for rank in range(3):
            log = cluster.log(rank)
            assert "rank 0 sent data a correct member never sends" in log, log
            assert reason in log and "Traceback" not in log, log
            assert cluster.result(rank)["rounds"] < 2000  # stopped, not run to the end
