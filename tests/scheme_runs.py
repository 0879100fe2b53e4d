"""Real runs for the schemes' end-to-end tests: a short akorun launch of a scheme by name
(its merged result and every worker's final parameters), and a rank killed mid-run."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np

from akorun.testing import REPO_ROOT, akorun_command, child_test_env

WORKLOAD = "digits-mlp"


def launch(out: Path, workers: int, rounds: int, *flags: str) -> tuple[dict[str, Any],
                                                                        list[np.ndarray]]:
    """Run ``akorun launch`` (plain SGD on digits-mlp) with `flags`, asserting it exits 0."""
    command = akorun_command("launch", "--workers", str(workers), "--rounds", str(rounds),
                             "--lr", "0.1", "--optimizer", "sgd", "--workload", WORKLOAD,
                             *flags, "--out", str(out), "--quiet", "--timeout", "120s")
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO_ROOT,
                            env=child_test_env({}), timeout=140)
    assert result.returncode == 0, result.stderr
    params = []
    for rank in range(workers):
        with np.load(out / f"worker-{rank}.npz") as data:
            params.append(np.array(data["params"]))
    return json.loads((out / "result.json").read_text()), params


def kill_at_round(cluster: Any, victim: int, round_: int, wait_s: float = 120) -> None:
    """SIGKILL rank `victim` of a running akorun.testing.LocalCluster once it reports
    `round_`, and wait for it to be gone."""
    deadline = time.monotonic() + wait_s
    while (cluster.status(victim) or {}).get("round", 0) < round_:
        assert time.monotonic() < deadline, cluster.logs()
        time.sleep(0.05)
    cluster.procs[victim].send_signal(signal.SIGKILL)
    assert cluster.wait(victim, 30) == -9


def akosim_trained(out: Path, *flags: str) -> dict[str, Any]:
    """``akosim train`` in this process (3 workers, 4 rounds of plain SGD on digits-mlp)
    with `flags`, asserting it exits 0: the run's record."""
    from akosim.cli import main

    assert main(["train", *flags, "--workers", "3", "--rounds", "4", "--workload", WORKLOAD,
                 "--optimizer", "sgd", "--quiet", "--out", str(out)]) == 0
    run: dict[str, Any] = json.loads(out.read_text())["runs"][0]
    assert run["simulated_rounds"] == 4 and 0 < run["final_accuracy"] <= 1
    return run
