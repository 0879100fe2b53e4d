"""The torch peer's own virtual environment for bench_peers (built once, then reused).

`torch_peer()` makes REPO/.cache/bench/torch-peer with the standard venv module and pip:
torch without its dependencies (PyPI's default Linux wheel pulls several GB of CUDA
libraries the CPU peer never loads; a CPU build, ``torch==VERSION+cpu``, is tried first
where an index or wheel folder has one) plus the small pure packages it imports, then
torchft 0.2.0 (its own dependencies are pure: OpenTelemetry). It checks that torch
imports and runs a gloo all-reduce on the CPU, and that torchft imports and has its
lighthouse. ``AKO_BENCH_TORCH`` names another torch requirement. What cannot be
installed here raises Skipped with the reason (the benchmark then says so); torchft
alone missing leaves the plain torch.distributed peer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from dataclasses import dataclass
from pathlib import Path

from akorun.testing import REPO_ROOT
from tests.bench.common import Skipped

VENV_DIR = REPO_ROOT / ".cache" / "bench" / "torch-peer"
TORCH_CANDIDATES = ("torch==2.13.0+cpu", "torch")
TORCH_DEPENDENCIES = ("filelock", "typing-extensions", "sympy", "networkx", "jinja2",
                      "fsspec", "numpy", "setuptools")
TORCHFT = "torchft==0.2.0"
INSTALL_TIMEOUT_S = 1800
CHECK = ("import os, torch, torch.distributed as dist; "
         "dist.init_process_group('gloo', init_method='tcp://127.0.0.1:0', rank=0, "
         "world_size=1); t = torch.ones(3); dist.all_reduce(t); "
         "print(torch.__version__, float(t.sum()))")
CHECK_TORCHFT = "import torchft, torchft.local_sgd, torchft.manager; print(torchft.__file__)"


@dataclass(frozen=True)
class TorchPeer:
    """The peer venv's python, torch's version, and torchft's lighthouse (None: no
    torchft here, with `torchft_missing` saying why)."""

    python: Path
    torch_version: str
    lighthouse: Path | None
    torchft_missing: str = ""


def _run(argv: list[str], timeout_s: float = INSTALL_TIMEOUT_S) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)


def _pip(python: Path, *args: str) -> subprocess.CompletedProcess:
    return _run([str(python), "-m", "pip", "install", "--quiet",
                 "--disable-pip-version-check", *args])


def _tail(done: subprocess.CompletedProcess) -> str:
    lines = [line for line in (done.stderr or done.stdout).splitlines()
             if line.strip() and "is ignored: it is neither" not in line]
    return lines[-1] if lines else f"exit status {done.returncode}"


def _check(python: Path, code: str) -> subprocess.CompletedProcess:
    return _run([str(python), "-c", code], timeout_s=300)


def torch_peer() -> TorchPeer:
    """The peer venv, built on first use; Skipped with the reason when torch cannot be
    installed or run gloo here."""
    python = VENV_DIR / "bin" / "python"
    marker = VENV_DIR / "installed.json"
    if not (marker.exists() and _check(python, CHECK).returncode == 0):
        VENV_DIR.parent.mkdir(parents=True, exist_ok=True)
        venv.EnvBuilder(with_pip=True, clear=True).create(VENV_DIR)
        wanted = os.environ.get("AKO_BENCH_TORCH")
        failures = []
        for requirement in (wanted,) if wanted else TORCH_CANDIDATES:
            done = _pip(python, "--no-deps", requirement)
            if done.returncode == 0:
                break
            failures.append(f"{requirement}: {_tail(done)}")
        else:
            raise Skipped(f"the torch peer could not be installed: {'; '.join(failures)}")
        done = _pip(python, *TORCH_DEPENDENCIES)
        if done.returncode != 0:
            raise Skipped(f"torch's dependencies could not be installed: {_tail(done)}")
        torchft = _pip(python, TORCHFT)
        marker.write_text(json.dumps({"torch": requirement, "torchft": torchft.returncode == 0,
                                      "torchft_error": "" if torchft.returncode == 0
                                      else _tail(torchft)}))
    checked = _check(python, CHECK)
    if checked.returncode != 0:
        raise Skipped(f"torch in {VENV_DIR} does not run gloo on the CPU: {_tail(checked)}")
    version = checked.stdout.split()[0]
    lighthouse = VENV_DIR / "bin" / "torchft_lighthouse"
    ft = _check(python, CHECK_TORCHFT)
    if ft.returncode != 0 or not lighthouse.exists():
        error = json.loads(marker.read_text()).get("torchft_error") or _tail(ft)
        return TorchPeer(python, version, None, f"{TORCHFT} is not usable here: {error}")
    return TorchPeer(python, version, lighthouse)


if __name__ == "__main__":
    print(torch_peer(), file=sys.stderr)
