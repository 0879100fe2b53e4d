"""akorun across real network namespaces behind a kernel rate limit (tc htb).

Two namespaces on the testbed's bridge (akorun.launching.testbed.netns), each uplink
shaped to 5 Mbit/s by the testbed's tc plan (akocore.hosttools.shaping); one
worker in each namespace, talking over real TCP with in-process emulation
off. Needs root, `ip`, `tc` and network namespaces: skipped with the reason
otherwise. Traffic goes only to the addresses this test creates, and the
namespaces (with their veth ends and the bridge) are always deleted.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from akocore.hosttools.shaping import burst_bytes, plan_shaping
from akocore.settings.toml_io import config_from_dict
from akorun.launching.cluster import new_settings, write_cluster_file
from akorun.launching.testbed import netns
from akorun.testing import REPO_ROOT, akorun_command, child_test_env

pytestmark = [pytest.mark.netns, pytest.mark.timeout(120)]

RATE_BPS = 5e6
# what a sender gets past the token bucket at once: its burst, and one GSO packet
# (up to 64 KiB) that htb lets through on credit
BURST_BYTES = burst_bytes(RATE_BPS) + 64 * 1024
NAMES = netns.TestbedNames.for_pid(os.getpid(), 2)
ADDRESSES = (NAMES.address(0), NAMES.address(1))


@pytest.fixture
def namespaces() -> Iterator[tuple[str, str]]:
    missing = netns.missing_requirements()
    if missing:
        pytest.skip(f"the netns testbed {missing}")
    testbed = netns.NetnsTestbed(NAMES)
    cfg = config_from_dict({"cluster": {"workers": 2}, "network": {"bandwidth": "5mbps"}})
    try:
        try:
            testbed.up()
            testbed.apply(plan_shaping(cfg.network, [NAMES.node(0), NAMES.node(1)],
                                       downlink=False).commands)
        except netns.TestbedError as error:
            pytest.skip(f"network namespaces or htb unavailable here: {error}")
        yield (NAMES.namespace(0), NAMES.namespace(1))
    finally:
        testbed.down()


def test_two_workers_in_namespaces_behind_htb_train_to_equal_replicas(
        namespaces: tuple[str, str], tmp_path: Path) -> None:
    cfg = config_from_dict({
        "cluster": {"workers": 2, "hosts": [f"{a}:7070" for a in ADDRESSES]},
        "exchange": {"p": 1, "ssp": 0},
        "train": {"workload": "digits-mlp", "optimizer": "sgd", "lr": 0.1, "rounds": 20,
                  "eval_every": 1000},
    })
    path = write_cluster_file(tmp_path / "cluster.toml", cfg,
                              new_settings(peer_timeout_s=10.0, emulate="off"))
    out = tmp_path / "out"
    procs = []
    try:
        for rank, name in enumerate(namespaces):
            command = ["ip", "netns", "exec", name, *akorun_command(
                "worker", "--rank", str(rank), "--config", str(path), "--out", str(out),
                "--quiet")]
            with open(tmp_path / f"rank-{rank}.log", "wb") as log:
                procs.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                              env=child_test_env(), cwd=REPO_ROOT))
        codes = [proc.wait(timeout=100) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    logs = "\n".join((tmp_path / f"rank-{r}.log").read_text() for r in range(2))
    assert codes == [0, 0], logs
    replicas = []
    for rank in range(2):
        with np.load(out / f"worker-{rank}.npz") as data:
            replicas.append(np.array(data["params"]))
    np.testing.assert_allclose(replicas[1], replicas[0], rtol=1e-5, atol=1e-6)
    import json

    for rank in range(2):
        result = json.loads((out / f"worker-{rank}.json").read_text())
        assert result["rounds"] == 20 and result["bytes_sent"] > 0
        # the kernel's token bucket bounds what crossed the veth (a slower machine
        # only sends less): bytes <= rate * time + burst
        assert result["bytes_sent"] * 8 <= RATE_BPS * result["wall_s"] * 1.1 + 8 * BURST_BYTES
