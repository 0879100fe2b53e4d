"""A short akorun launch of a scheme by name, for the schemes' end-to-end tests: its
merged result and every worker's final parameters."""

from __future__ import annotations

import json
import subprocess
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
