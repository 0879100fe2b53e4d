"""akorun across real network namespaces behind a kernel rate limit (tc tbf).

Two namespaces joined by a veth pair, each end shaped by `tc ... tbf rate
5mbit`; one worker in each namespace, talking over the veth with in-process
emulation off. Needs root, `ip`, `tc` and network namespaces: skipped with
the reason otherwise. Traffic goes only to the addresses this test creates,
and the namespaces (with their veth ends) are always deleted.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from akocore.config import config_from_dict
from akorun.cluster import new_settings, write_cluster_file
from akorun.testing import REPO_ROOT, akorun_command, child_test_env

pytestmark = [pytest.mark.netns, pytest.mark.timeout(120)]

RATE_BPS = 5e6
BURST_BYTES = 32 * 1024
ADDRESSES = ("10.231.7.1", "10.231.7.2")


def _run(*command: str) -> None:
    subprocess.run(command, check=True, capture_output=True, timeout=20)


@pytest.fixture
def namespaces() -> Iterator[tuple[str, str]]:
    if os.geteuid() != 0:
        pytest.skip("needs root to create network namespaces and tc qdiscs")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            pytest.skip(f"needs the `{tool}` command (iproute2)")
    tag = f"{os.getpid() % 100000}"
    names = (f"akotest_a{tag}", f"akotest_b{tag}")
    veths = (f"akova{tag}", f"akovb{tag}")
    created: list[str] = []
    try:
        try:
            for name in names:
                _run("ip", "netns", "add", name)
                created.append(name)
            _run("ip", "link", "add", veths[0], "type", "veth", "peer", "name", veths[1])
            for name, veth, address in zip(names, veths, ADDRESSES, strict=True):
                _run("ip", "link", "set", veth, "netns", name)
                _run("ip", "-n", name, "addr", "add", f"{address}/24", "dev", veth)
                _run("ip", "-n", name, "link", "set", veth, "up")
                _run("ip", "-n", name, "link", "set", "lo", "up")
                _run("ip", "netns", "exec", name, "tc", "qdisc", "add", "dev", veth, "root",
                     "tbf", "rate", "5mbit", "burst", "32kb", "latency", "100ms")
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as error:
            stderr = getattr(error, "stderr", b"") or b""
            pytest.skip(f"network namespaces or tbf unavailable here: "
                        f"{stderr.decode(errors='replace').strip() or error}")
        yield names
    finally:
        for name in created:  # deleting a namespace removes its veth end too
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=20)
        subprocess.run(["ip", "link", "del", veths[0]], capture_output=True, timeout=20)


def test_two_workers_in_namespaces_behind_tbf_train_to_equal_replicas(
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
