"""A run started by hand ends in one result.json, and a killed launcher's ranks die with it.

`akorun init` + 3 x `akorun worker` on loopback (real processes, one shared
--out): the last rank to finish merges result.json, `akorun merge` rebuilds it,
`akosim predict` reads it; records of missing ranks make a partial result. A
SIGKILLed `akorun launch` leaves no rank running, and its ranks' records merge.
Every wait has a deadline (a hang guard), no pass/fail condition is a speed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

import akorun
from akocore.records.result_reader import read_result
from akocore.records.results import RunResult
from akorun.launching.commands import main as akorun_main
from akorun.launching.run_merge import merge_ranks
from akorun.testing import (
    REPO_ROOT,
    akorun_command,
    child_test_env,
    launched_rank_status,
    wait_for,
)

pytestmark = pytest.mark.timeout(240)

WORKERS = 3
ROUNDS = 8


@pytest.fixture(scope="module")
def by_hand(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """init + 3 x worker on loopback with one shared --out: the run directory."""
    base = tmp_path_factory.mktemp("by-hand")
    cluster = base / "cluster.toml"
    out = base / "run"
    env = child_test_env()
    init = subprocess.run(akorun_command(
        "init", "--workers", str(WORKERS), "--out", str(cluster), "--rounds", str(ROUNDS),
        "--workload", "digits-mlp", "--optimizer", "sgd", "--batch-size", "16", "--p", "2",
        "--ssp", "1"), capture_output=True, text=True, env=env, cwd=REPO_ROOT, timeout=60)
    assert init.returncode == 0, init.stderr
    procs = [subprocess.Popen(akorun_command("worker", "--rank", str(rank), "--config",
                                             str(cluster), "--out", str(out)),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              env=env, cwd=REPO_ROOT)
             for rank in range(WORKERS)]
    logs = []
    try:
        for proc in procs:
            logs.append(proc.communicate(timeout=180)[1])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    assert [proc.returncode for proc in procs] == [0] * WORKERS, "\n".join(logs)
    assert any("wrote " + str(out / "result.json") in log for log in logs), "\n".join(logs)
    return out


def _run(path: Path) -> RunResult:
    record = read_result(json.loads(path.read_text(encoding="utf-8")))
    assert isinstance(record, RunResult)
    return record


def test_the_last_rank_started_by_hand_writes_the_runs_result(by_hand: Path) -> None:
    run = _run(by_hand / "result.json")
    assert run.tool == "akorun" and not run.partial and run.missing_ranks == ()
    assert [r.rounds for r in run.per_worker] == [ROUNDS] * WORKERS
    assert run.max_relative_difference is not None and run.max_relative_difference < 1e-5
    assert run.run_id == run.per_worker[0].details["run_id"]


def test_akorun_merge_rebuilds_the_result_that_predict_reads(by_hand: Path, tmp_path: Path,
                                                            capsys, monkeypatch) -> None:
    run_dir = tmp_path / "copy"
    shutil.copytree(by_hand, run_dir)
    (run_dir / "result.json").unlink()
    assert akorun_main(["merge", str(run_dir)]) == 0
    assert "every rank's record" in capsys.readouterr().err
    merged = _run(run_dir / "result.json")
    assert merged.to_json() == {**_run(by_hand / "result.json").to_json()}
    from akosim.cli import main as akosim_main

    monkeypatch.setenv("AKO_CACHE_DIR", str(tmp_path / "cache"))
    assert akosim_main(["predict", str(run_dir)]) == 0
    assert "predicted round time" in capsys.readouterr().out


def test_missing_ranks_make_a_partial_result_that_names_them(by_hand: Path,
                                                             tmp_path: Path, capsys) -> None:
    run_dir = tmp_path / "two"
    run_dir.mkdir()
    for rank in (0, 2):
        for suffix in ("json", "npz"):
            shutil.copy(by_hand / f"worker-{rank}.{suffix}", run_dir)
    assert akorun.merge_run(run_dir) == run_dir / "result.json"
    run = _run(run_dir / "result.json")
    assert run.partial and run.missing_ranks == (1,)
    assert run.per_worker[1].failed and not run.per_worker[0].failed
    assert run.training_workers == WORKERS and run.workers == WORKERS
    assert akorun_main(["merge", str(run_dir), "--quiet"]) == 0
    assert "partial, rank(s) 1 left no record" in capsys.readouterr().err


def test_nothing_to_merge_or_two_runs_in_one_directory_is_one_line_exit_2(
        by_hand: Path, tmp_path: Path, capsys) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    assert akorun_main(["merge", str(empty)]) == 2
    assert "nothing to merge" in capsys.readouterr().err
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    shutil.copy(by_hand / "worker-0.json", mixed)
    other: dict[str, Any] = json.loads((by_hand / "worker-1.json").read_text())
    other["run_id"] = "0" * 32
    (mixed / "worker-1.json").write_text(json.dumps(other))
    assert akorun_main(["merge", str(mixed)]) == 2
    err = capsys.readouterr().err
    assert "records of 2 runs" in err and len(err.strip().splitlines()) == 1
    # a record of another run is not this run's: merged as missing
    outcome = merge_ranks(mixed, run_id=_run(by_hand / "result.json").run_id)
    assert outcome.missing_ranks == (1, 2)


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc (Linux)")
def test_a_sigkilled_launcher_takes_its_ranks_with_it_and_their_records_merge(
        tmp_path: Path) -> None:
    out = tmp_path / "run"
    command = akorun_command("launch", "--workers", str(WORKERS), "--rounds", "1000000",
                             "--optimizer", "sgd", "--p", "2", "--ssp", "1", "--out", str(out),
                             "--quiet")
    launcher = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env=child_test_env(), cwd=REPO_ROOT, start_new_session=True)
    ranks: list[int] = []
    try:
        cluster = wait_for(lambda: (out / "cluster.toml").exists() and out / "cluster.toml",
                           30, "the cluster file")
        wait_for(lambda: all(launched_rank_status(cluster, r).get("round", 0) >= 3
                             for r in range(WORKERS)), 90, "every rank past round 3")
        ranks = _children(launcher.pid)
        assert len(ranks) == WORKERS
        assert len({os.getpgid(pid) for pid in ranks}) == 1  # one process group
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(timeout=10)
        wait_for(lambda: not any(_alive(pid) for pid in ranks), 60,
                 "the ranks to end after their launcher was killed")
    finally:
        if launcher.poll() is None:
            launcher.kill()
        for pid in ranks:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert not (out / "result.json").exists()
    run = _run(akorun.merge_run(out))
    assert not run.partial
    assert all("SIGTERM" in (r.stop_reason or "") for r in run.per_worker)
    assert all(r.rounds >= 3 for r in run.per_worker)
    assert run.max_relative_difference is not None and run.max_relative_difference < 1e-5
