"""A SIGTERM to `akorun launch` while one rank is still starting and the others train.

The fault hook ``2@pause_in_join`` holds rank 2 in its join (before its own
hellos) until it is asked to stop; its server answers the others' hellos, but
says it is not ready (it has not heard every rank), so ranks 0 and 1 wait in
their join too: no rank trains a run another has not joined (akorun.runtime.lifecycle.join).
SIGTERM then goes to launch. Expected (docs/guide/failure.md): every rank
ends within launch's kill grace (launch never needs its SIGKILL: its log says
so when it does, and a killed rank would make it exit 1), every rank writes its
result marked as stopped by SIGTERM with no round, launch exits 130 and no rank
process is left. The peer timeout (30 s) is
longer than the kill grace (20 s): a rank that waited for the starting rank
as for a lost peer (it is given up on only once silent past the peer timeout)
would always be SIGKILLed, however fast the machine. Nothing here measures
time: the test fails on exit codes, result files and the launch log.

Loopback always; the same on the netns testbed (real TCP between namespaces)
when root, `ip` and `tc` are here (skipped with the reason otherwise).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from akocore.records.results import RunResult
from akocore.records.testbed_record import TESTBED_RECORD_FILE
from akocore.records.testbed_record import TestbedRecord as Record
from akorun.launching.local import GRACE_RAN_OUT
from akorun.launching.testbed import netns
from akorun.testing import (
    REPO_ROOT,
    akorun_command,
    child_test_env,
    launched_rank_status,
    wait_for,
)

pytestmark = pytest.mark.timeout(240)

WORKERS = 3
STARTING_RANK = 2
FAULT = {"AKORUN_FAULT": f"{STARTING_RANK}@pause_in_join"}
RTOL = 1e-5
RUN_FLAGS = ("--workers", str(WORKERS), "--workload", "digits-mlp", "--optimizer", "sgd",
             "--lr", "0.05", "--p", "2", "--ssp", "2", "--rounds", "1000000",
             "--set", "train.eval_every=1000", "--peer-timeout", "30s", "--kill-grace", "20s")


def _processes_naming(text: str) -> list[int]:
    """Pids of the processes whose command line names `text` (a rank left behind)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if text in command:
            found.append(int(entry.name))
    return found


def _check_the_interrupted_run(code: int, log: str, out: Path) -> RunResult:
    assert code == 130, log
    assert GRACE_RAN_OUT not in log, log  # launch did not need its SIGKILL
    assert "failed" not in log, log
    result = RunResult.from_json(json.loads((out / "result.json").read_text()))
    ranks = {r.rank: r for r in result.per_worker}
    assert sorted(ranks) == list(range(WORKERS)), log
    for rank, record in ranks.items():
        assert (out / f"worker-{rank}.json").exists(), log
        assert not record.failed and "SIGTERM" in (record.stop_reason or ""), (rank, log)
    assert all(ranks[r].rounds == 0 for r in range(WORKERS)), log  # nobody trained alone
    assert _processes_naming(str(out / "cluster.toml")) == [], log
    return result


@pytest.mark.parametrize("scheme", ["ako", "allreduce"])
def test_a_sigterm_while_one_rank_starts_ends_every_rank_within_the_grace(
        tmp_path: Path, scheme: str) -> None:
    """For ako and all-reduce alike the others wait in their join for the starting rank
    and end at the SIGTERM without waiting for it."""
    out = tmp_path / "run"
    log_path = tmp_path / "launch.log"
    with open(log_path, "wb") as log_file:
        launch = subprocess.Popen(akorun_command("launch", *RUN_FLAGS, "--scheme", scheme,
                                                 "--out", str(out), "--quiet"),
                                  stdout=log_file, stderr=subprocess.STDOUT,
                                  env=child_test_env(FAULT), cwd=REPO_ROOT)
    try:
        cluster_path = wait_for(lambda: (out / "cluster.toml").exists() and out / "cluster.toml",
                                60, "the cluster file")

        def status(rank: int) -> dict[str, Any]:
            return launched_rank_status(cluster_path, rank)

        def all_wait_while_one_starts() -> bool:
            return all(status(r).get("state") == "starting" for r in range(WORKERS))

        wait_for(all_wait_while_one_starts, 120,
                 f"every rank in its join while rank {STARTING_RANK} still starts")
        time.sleep(2.0)  # the others' hellos reach rank 2 (a delay, not a measurement)
        assert all(status(r).get("state") == "starting" for r in range(WORKERS))
        launch.send_signal(signal.SIGTERM)
        code = launch.wait(timeout=120)
    finally:
        if launch.poll() is None:
            launch.kill()
            launch.wait()
    _check_the_interrupted_run(code, log_path.read_text(), out)


def test_the_same_on_the_testbed_leaves_no_namespace(tmp_path: Path) -> None:
    missing = netns.missing_requirements()
    if missing:
        pytest.skip(f"the netns testbed {missing}")
    out = tmp_path / "run"
    log_path = tmp_path / "launch.log"
    command = [sys.executable, "-m", "akorun", "launch", "--testbed", "netns",
               "--bandwidth", "20mbps", *RUN_FLAGS, "--progress-every", "0.5s",
               "--out", str(out)]
    starting = [re.compile(rf"\b{r}:joining\b") for r in range(WORKERS)]
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(command, cwd=REPO_ROOT, env=child_test_env(FAULT),
                                stdout=log_file, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 150
        while not any(all(p.search(line) for p in starting)
                      for line in log_path.read_text().splitlines()):
            if proc.poll() is not None or time.monotonic() > deadline:
                text = log_path.read_text()
                if "testbed: `" in text:  # a command the kernel refused
                    pytest.skip(f"the kernel refused the testbed: {text.strip()}")
                raise AssertionError(f"never saw every rank in its join while rank "
                                     f"{STARTING_RANK} starts:\n{text}")
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log_path.read_text()
    _check_the_interrupted_run(code, text, out)
    record = Record.from_json(json.loads((out / TESTBED_RECORD_FILE).read_text()))
    names = [n for n in netns.namespaces() if n.startswith(record.tag)]
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True,
                           check=True).stdout
    assert names + [line for line in links.splitlines() if record.bridge[:-2] in line] == [], \
        text
