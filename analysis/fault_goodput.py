"""Goodput under faults on the real-TCP testbed: DiLoCo against quorum DiLoCo when a
member is killed or paused.

    sudo python -m analysis.fault_goodput --results results/goodput [--only 'quorum*']

Each case (a scheme of `SCHEMES` x a fault of `FAULTS`) is one ``akorun launch
--testbed netns`` of 3 training ranks (`NETWORK`, the experiments' workload, H = 10)
for `BUDGET_S` seconds of training, under the measurement lock:

- ``none``: fault-free, the reference of its scheme;
- ``kill``: rank 2 SIGKILLs itself after round `KILL_ROUND` (the fault hook
  ``kill_after_round``), and stays dead;
- ``pause``: rank 2 is SIGSTOPped for `PAUSE_S` seconds once it has trained for
  `PAUSE_AFTER_S` seconds (a preempted or migrated machine), then SIGCONTed.

Goodput = the samples that ended in the run's model per second of the run, over the
fault-free run's samples per second of the same scheme: the ranks that ended exit 0
count all their rounds, a killed rank its rounds up to the kill, a rank that ended
exit 1 (left behind: its model is not the run's) none. Beside it: rank 0's time to the
experiments' target accuracy and its final accuracy, and every rank's exit status.

Writes RESULTS/<case>/ (the run and its log) and ``analysis/data/fault_goodput.json``
(the rows); `markdown` renders the table the experiments page holds. Resumable: a case
whose folder holds ``row.json`` is not run again.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from akocore.records.result_reader import read_result
from akocore.records.results import RankResult, RunResult
from analysis.fidelity_tcp import _python, child_env
from analysis.tta_testbed import (
    EVAL_EVERY,
    TARGET_ACCURACY,
    WORKLOAD,
    WORKLOAD_ARG,
    lock_prefix,
    time_to_target,
)

ROOT = Path(__file__).resolve().parent.parent
RECORD = ROOT / "analysis" / "data" / "fault_goodput.json"
WORKERS = 3
BUDGET_S = 60.0
KILL_ROUND = 1500  # any round: one that sent nothing (most of DiLoCo's) kills at once
PAUSE_AFTER_S = 10.0
PAUSE_S = 20.0
NETWORK = ("--bandwidth", "100mbps", "--latency", "5ms")
NETWORK_TEXT = "100 Mbit/s NICs, 10 ms RTT"
SCHEMES: dict[str, tuple[str, ...]] = {
    "diloco": ("--scheme", "diloco", "--inner-steps", "10"),
    "quorum-diloco": ("--scheme", "quorum-diloco", "--inner-steps", "10"),
}
FAULTS = ("none", "kill", "pause")
ROW_FILE = "row.json"


@dataclass(frozen=True)
class GoodputRow:
    """One scheme under one fault."""

    scheme: str
    fault: str
    exit_codes: dict[str, int | None]  # rank -> exit status (None: killed, no record)
    rounds: dict[str, int]  # rank -> rounds it trained (as recorded)
    useful_samples: int  # samples that ended in the run's model
    wall_s: float  # rank 0's training time
    samples_per_s: float  # useful samples per second of rank 0's training
    time_to_target_s: float | None  # rank 0's first evaluation at the target
    final_accuracy: float | None  # rank 0's
    load_before: str


def _descendants(pid: int) -> list[int]:
    """Every process below `pid` (from /proc: children first found, then theirs)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        children = [p for p, pp in parents.items() if pp == parent]
        found += children
        frontier += children
    return found


def _rank_pid(launcher: int, rank: int) -> int | None:
    for pid in _descendants(launcher):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"worker" in argv and b"--rank" in argv and argv[argv.index(b"--rank") + 1] == \
                str(rank).encode() and b"netns" not in argv:
            return pid
    return None


def _pause_when_training(launcher: subprocess.Popen[bytes], out: Path, rank: int) -> None:
    """SIGSTOP rank `rank` for PAUSE_S once it has trained for PAUSE_AFTER_S seconds."""
    phase = out / f"worker-{rank}.phase"
    deadline = time.monotonic() + 3600  # the launch may wait for the measurement lock
    while (not out.exists() or phase.exists() or _rank_pid(launcher.pid, rank) is None) \
            and launcher.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(PAUSE_AFTER_S)
    pid = _rank_pid(launcher.pid, rank)
    if pid is None or launcher.poll() is not None:
        raise RuntimeError(f"rank {rank} not found to pause")
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(PAUSE_S)
    finally:
        os.kill(pid, signal.SIGCONT)


def _rank_records(out: Path) -> dict[int, RankResult]:
    """Each rank's record in the launch's merged result (its exit status written in; a
    killed rank's record says failed, with no rounds)."""
    record = read_result(json.loads((out / "result.json").read_text()))
    if not isinstance(record, RunResult):
        raise ValueError(f"{out / 'result.json'}: not a run result")
    return {r.rank: r for r in record.per_worker}


def run_case(scheme: str, fault: str, results: Path) -> GoodputRow:
    folder = results / f"{scheme}--{fault}"
    if (folder / ROW_FILE).exists():
        return GoodputRow(**json.loads((folder / ROW_FILE).read_text()))
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / "run"
    env = child_env(results / "cache")
    if fault == "kill":
        env["AKORUN_FAULT"] = f"2@kill_after_round:{KILL_ROUND}"
    load = os.getloadavg()
    command = [*lock_prefix(), *_python(
        "akorun", "launch", "--testbed", "netns", "--workers", str(WORKERS), *NETWORK,
        *SCHEMES[scheme], "--workload", WORKLOAD, "--workload-arg", WORKLOAD_ARG,
        "--set", f"train.eval_every={EVAL_EVERY}", "--duration", f"{BUDGET_S:g}s",
        "--out", str(out), "--force", "--quiet", "--timeout", "600s")]
    with open(folder / "run.log", "w") as log:
        log.write("$ " + " ".join(command) + "\n")
        log.flush()
        launcher = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    cwd=ROOT)
        if fault == "pause":
            _pause_when_training(launcher, out, 2)
        launcher.wait(timeout=1200)
    records = {r: record for r, record in _rank_records(out).items() if not record.failed}
    if 0 not in records:
        raise RuntimeError(f"{folder}: rank 0 wrote no record (see {folder / 'run.log'})")
    batch = records[0].batch_size
    useful = sum(record.rounds * batch for record in records.values()
                 if record.exit_code == 0)
    if fault == "kill" and 2 not in records:
        useful += KILL_ROUND * batch
    first = records[0]
    evaluations = [tuple(e) for e in first.evaluations]  # (s, round, accuracy)
    wall_s = first.wall_s or BUDGET_S
    row = GoodputRow(
        scheme=scheme, fault=fault,
        exit_codes={str(r): (records[r].exit_code if r in records else None)
                    for r in range(WORKERS)},
        rounds={str(r): records[r].rounds for r in records}, useful_samples=useful,
        wall_s=wall_s, samples_per_s=useful / wall_s,
        time_to_target_s=time_to_target(evaluations, TARGET_ACCURACY),
        final_accuracy=first.final_accuracy, load_before=f"{load[0]:.2f}")
    (folder / ROW_FILE).write_text(json.dumps(asdict(row), indent=1))
    return row


def markdown(rows: Sequence[GoodputRow]) -> str:
    """The table: each scheme's fault-free samples/s, and goodput under each fault."""
    reference = {r.scheme: r.samples_per_s for r in rows if r.fault == "none"}
    lines = ["| scheme | fault | exit status (rank 0, 1, 2) | samples/s in the model | "
             f"goodput | to {TARGET_ACCURACY:g} (s) | final accuracy |",
             "|---|---|---|---:|---:|---:|---:|"]
    for row in rows:
        base = reference.get(row.scheme)
        goodput = f"{row.samples_per_s / base:.0%}" if base else "-"
        codes = ", ".join("killed" if row.exit_codes[str(r)] is None
                          else str(row.exit_codes[str(r)]) for r in range(WORKERS))
        reach = "-" if row.time_to_target_s is None else f"{row.time_to_target_s:.2f}"
        accuracy = "-" if row.final_accuracy is None else f"{row.final_accuracy:.3f}"
        lines.append(f"| {row.scheme} | {row.fault} | {codes} | {row.samples_per_s:,.0f} | "
                     f"{goodput} | {reach} | {accuracy} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.fault_goodput",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, required=True)
    parser.add_argument("--only", default="", help="cases SCHEME--FAULT matching this glob")
    args = parser.parse_args(argv)
    rows = []
    for scheme in SCHEMES:
        for fault in FAULTS:
            if args.only and not fnmatch.fnmatch(f"{scheme}--{fault}", args.only):
                continue
            print(f"{scheme} under {fault} ...", flush=True)
            rows.append(run_case(scheme, fault, args.results))
    RECORD.write_text(json.dumps({"network": NETWORK_TEXT, "budget_s": BUDGET_S,
                                  "kill_round": KILL_ROUND, "pause_s": PAUSE_S,
                                  "rows": [asdict(r) for r in rows]}, indent=1))
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
