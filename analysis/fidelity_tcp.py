"""Fidelity on real TCP: akosim's predictions against akorun on the netns testbed.

    sudo python -m analysis.fidelity_tcp --results results/fidelity-tcp
    python -m analysis.fidelity_tcp --results results/fidelity-tcp --report-only

Runs a grid of configurations with ``akorun launch --testbed netns`` (ranks in
network namespaces, real kernel TCP, tc htb shaping), one at a time, and
predicts each with ``akosim predict`` three ways. ``--grid lan`` (the default)
has no latency; ``--grid wan`` gives every pair a one-way latency that the
testbed's delay line realises (10-100 ms round trips, 5-100 Mbit/s, Ako, the
parameter server and ring all-reduce):

- host-calibrated: the TCP-aware model with this host's calibration (``akosim
  calibrate``, made once at the start of the grid and kept in RESULTS) and
  akosim's own compute measurement of the workload (``--compute measure``,
  cached in RESULTS/cache under the XLA threading akorun's ranks use), on the
  testbed the step timed with as many processes at once as the run's training
  ranks (akosim.calibration.colocated_compute, cached there too: the ranks share this host's
  cores) and the host's message cost as the ranks' CPU: nothing timed by the run
  being predicted;
- run-calibrated: the TCP-aware model with the run's compute per rank, its
  per-round overhead and its per-message software cost (``message_software_s``);
- max-min: the pure fluid model (``--network-model maxmin``), uncalibrated
  (akosim's own compute as above, no per-message cost: no host calibration is given and
  none is cached in RESULTS/cache).

Resumable: a configuration whose folder holds ``done.json`` is not run again
(``--repredict`` predicts it again without running it, after a change to akosim).
Writes RESULTS/fidelity-tcp.json (`FidelityTcpRecord`) and the markdown report
(`--report`, default docs/reports/fidelity-tcp.md). The measured round time is the
mean steady-state round time of akocore.records.figures (warm-up rounds skipped).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from akocore.rank_threads import NPROC_ENV, SINGLE_THREAD_XLA_FLAGS
from akocore.records.figures import steady_round_time_s
from akocore.records.jsonrecord import record_from_json, record_to_json
from akocore.records.result_reader import read_result
from akocore.records.results import PlanResult, RunResult
from akocore.schemes.registry import has_servers, is_partitioned
from analysis.fidelity_tcp_record import (
    COLUMNS,
    FidelityTcpRecord,
    FidelityTcpRow,
    summarise,
)
from analysis.fidelity_tcp_report import kept_analysis, markdown_report

ROOT = Path(__file__).resolve().parent.parent
DONE_FILE = "done.json"
ROW_FILE = "row.json"
RECORD_FILE = "fidelity-tcp.json"
# what each prediction asks akosim predict for, beyond the run directory
PREDICT_FLAGS: dict[str, tuple[str, ...]] = {
    "host-calibrated": ("--compute", "measure"),
    "run-calibrated": (),
    "max-min": ("--compute", "measure", "--network-model", "maxmin"),
}
# each node's NIC, both ways; a list goes to the nodes in turn (het: 100, 20, 100, ...)
RATES_BPS: dict[str, tuple[float, ...]] = {"lan": (100e6,), "wan": (20e6,),
                                           "het": (100e6, 20e6), "5m": (5e6,),
                                           "20m": (20e6,), "100m": (100e6,)}
# streaming-diloco rows: fragments synced in turn (each sync overlaps one inner step)
STREAMING_FRAGMENTS = 2
# given to both tools, so akosim's own compute measurement times the step the runs take
TRAINING_FLAGS = ("--batch-size", "32", "--optimizer", "sgd", "--lr", "0.05")


@dataclass(frozen=True)
class GridPoint:
    """One configuration of the grid."""

    scheme: str  # ako, ps (the asynchronous parameter server, one server), allreduce,
    # diloco or streaming-diloco
    workers: int  # training workers
    rate: str  # a key of RATES_BPS
    p: str  # "1" or "auto" (ako); "-" (the others)
    ssp: int
    rtt_ms: float = 0.0  # round trip; every pair gets half of it one way (the delay line)
    inner_steps: int = 0  # diloco, streaming-diloco: H (0: not that scheme)
    fragments: int = 0  # streaming-diloco: fragments synced in turn, 1 step overlapped

    @property
    def name(self) -> str:
        exchange = f"ako-p{self.p}" if is_partitioned(self.scheme) else self.scheme
        if self.inner_steps:
            exchange += f"-H{self.inner_steps}"
        rtt = f"-rtt{self.rtt_ms:g}ms" if self.rtt_ms > 0 else ""
        return f"{self.rate}-{self.workers}w-{exchange}-s{self.ssp}{rtt}"

    @property
    def nodes(self) -> int:
        return self.workers + (1 if has_servers(self.scheme) else 0)

    def launch_flags(self) -> list[str]:
        rates = ",".join(f"{bps / 1e6:g}mbps" for bps in RATES_BPS[self.rate])
        flags = ["--workers", str(self.nodes), "--bandwidth", rates,
                 "--scheme", self.scheme, "--ssp", str(self.ssp)]
        if is_partitioned(self.scheme):
            flags += ["--p", self.p]
        elif has_servers(self.scheme):
            flags += ["--set", "exchange.ps_mode=async", "--set", "exchange.ps_servers=1"]
        if self.inner_steps:
            flags += ["--inner-steps", str(self.inner_steps)]
        if self.fragments:
            flags += ["--fragments", str(self.fragments), "--overlap-steps", "1"]
        if self.rtt_ms > 0:
            flags += ["--latency", f"{self.rtt_ms / 2:g}ms"]
        return flags


def grid() -> tuple[GridPoint, ...]:
    """40 configurations: Ako at 2-4 workers x LAN/WAN x p in {1, auto} x s in {0, 2}
    (24), the asynchronous parameter server at 2-4 workers x LAN/WAN x s in {0, 2}
    (12), and a heterogeneous network (NICs of 100 and 20 Mbit/s in turn) at 3 workers
    for Ako p in {1, auto} and the PS at s = 0, 2 (4). Smaller clusters first, so an
    interrupted grid still spans the schemes and rates."""
    points = []
    for workers in (2, 3, 4):
        for rate in ("lan", "wan"):
            for p in ("1", "auto"):
                for ssp in (0, 2):
                    points.append(GridPoint("ako", workers, rate, p, ssp))
            for ssp in (0, 2):
                points.append(GridPoint("ps", workers, rate, "-", ssp))
        if workers == 3:
            points += [GridPoint("ako", 3, "het", "1", 0), GridPoint("ako", 3, "het", "auto", 0),
                       GridPoint("ps", 3, "het", "-", 0), GridPoint("ps", 3, "het", "-", 2)]
    return tuple(points)


def wan_grid() -> tuple[GridPoint, ...]:
    """26 configurations with latency: at 3 workers and 20 Mbit/s, RTT 10, 50 and 100 ms
    for Ako p = 1 and auto (s = 0), the asynchronous parameter server and ring
    all-reduce (12); at 50 ms, 5 and 100 Mbit/s for Ako p = 1 and all-reduce (4); at
    50 ms and 20 Mbit/s, 2 and 4 workers for Ako p = auto, s = 2 and the parameter
    server (4); at 3 workers, 20 Mbit/s, 50 ms: Ako p = 1 and auto at s = 2, the
    parameter server at s = 2 (3); DiLoCo (H = 4) at 10 and 100 ms and Streaming DiLoCo
    (H = 4, 2 fragments, 1 overlapped step) at 50 ms (3). The first rows span schemes
    and round trips, so an interrupted grid still does."""
    points = []
    for rtt_ms in (50.0, 10.0, 100.0):
        points += [GridPoint("ako", 3, "20m", "1", 0, rtt_ms),
                   GridPoint("ako", 3, "20m", "auto", 0, rtt_ms),
                   GridPoint("ps", 3, "20m", "-", 0, rtt_ms),
                   GridPoint("allreduce", 3, "20m", "-", 0, rtt_ms)]
    for rate in ("5m", "100m"):
        points += [GridPoint("ako", 3, rate, "1", 0, 50.0),
                   GridPoint("allreduce", 3, rate, "-", 0, 50.0)]
    for workers in (2, 4):
        points += [GridPoint("ako", workers, "20m", "auto", 2, 50.0),
                   GridPoint("ps", workers, "20m", "-", 0, 50.0)]
    points += [GridPoint("ako", 3, "20m", "1", 2, 50.0),
               GridPoint("ako", 3, "20m", "auto", 2, 50.0),
               GridPoint("ps", 3, "20m", "-", 2, 50.0),
               GridPoint("diloco", 3, "20m", "-", 0, 10.0, inner_steps=4),
               GridPoint("diloco", 3, "20m", "-", 0, 100.0, inner_steps=4),
               GridPoint("streaming-diloco", 3, "20m", "-", 0, 50.0, inner_steps=4,
                         fragments=STREAMING_FRAGMENTS)]
    return tuple(points)


GRIDS = {"lan": grid, "wan": wan_grid}


# ---- running one configuration -------------------------------------------------------

def child_env(cache: Path) -> dict[str, str]:
    """akorun and akosim children: CPU JAX, the grid's own compute cache, and the XLA
    threading akorun gives its ranks (as many processes as cores or more: one thread),
    so akosim's compute measurement times the step the ranks run."""
    env = dict(os.environ)
    env["JAX_PLATFORMS"] = "cpu"
    env["AKO_CACHE_DIR"] = str(cache)
    env["XLA_FLAGS"] = SINGLE_THREAD_XLA_FLAGS
    env[NPROC_ENV] = "1"  # XLA's thread pool: one thread (akocore.rank_threads)
    env.setdefault("AKO_JAX_CACHE", str(ROOT / ".cache" / "jax"))
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *[p for p in env.get(
        "PYTHONPATH", "").split(os.pathsep) if p and p != str(ROOT)]])
    return env


def _run(cmd: list[str], env: dict[str, str], log: Path, timeout_s: float) -> None:
    with open(log, "a") as out:
        out.write("$ " + " ".join(cmd) + "\n")
        out.flush()
        done = subprocess.run(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                              cwd=ROOT, timeout=timeout_s, check=False)
    if done.returncode != 0:
        tail = log.read_text().strip().splitlines()[-1:] or ["no output"]
        at = cmd.index("-m") + 1 if "-m" in cmd else 0
        raise RuntimeError(f"{' '.join(cmd[at:at + 2])} exited {done.returncode}: {tail[0]} "
                           f"(see {log})")


def _akosim(args: list[str], env: dict[str, str], log: Path, timeout_s: float) -> None:
    """`akosim ARGS...` as a call of akosim's entry point in a fresh interpreter with
    `env` (analysis.akosim_calls), its output appended to `log`."""
    from analysis.akosim_calls import call_akosim

    with open(log, "a") as out:
        out.write("$ akosim " + " ".join(args) + "\n")
    try:
        code = call_akosim(args, env=env, log=log, append=True, timeout_s=timeout_s)
    except TimeoutError as error:
        raise RuntimeError(f"akosim {args[0]}: {error} (see {log})") from None
    if code != 0:
        tail = log.read_text().strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"akosim {args[0]} exited {code}: {tail[0]} (see {log})")


def _python(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def read_run(path: Path) -> RunResult:
    record = read_result(json.loads(path.read_text()))
    if not isinstance(record, RunResult):
        raise ValueError(f"{path}: not a run result")
    return record


def read_prediction(path: Path) -> float:
    record = read_result(json.loads(path.read_text()))
    if not isinstance(record, PlanResult) or not record.runs:
        raise ValueError(f"{path}: not a prediction")
    value = record.runs[0].round_time_s
    if value is None:
        raise ValueError(f"{path}: the prediction has no round time")
    return float(value)


def row_of(point: GridPoint, run: RunResult, predictions: dict[str, float],
           host_compute_s: float, wall_s: float) -> FidelityTcpRow:
    training = run.training_ranks or run.per_worker
    measured = [steady_round_time_s(r.round_end_s) / r.round_stride for r in training]
    rates = RATES_BPS[point.rate]
    bandwidth_bps = tuple(rates[i % len(rates)] for i in range(point.nodes))
    round_time_s = sum(measured) / len(measured)
    sent = [r.bytes_sent_per_worker_per_round or 0.0 for r in training]
    utilisation = [8 * b / t / bandwidth_bps[r.rank] for b, t, r
                   in zip(sent, measured, training, strict=True) if t > 0]
    return FidelityTcpRow(
        name=point.name, scheme=point.scheme, workers=point.workers, nodes=point.nodes,
        rate=point.rate, bandwidth_bps=bandwidth_bps, p_configured=point.p,
        p_resolved=tuple(run.p_of), ssp=point.ssp,
        rounds=max(r.rounds for r in training), measured_round_time_s=round_time_s,
        host_calibrated_s=predictions["host-calibrated"],
        run_calibrated_s=predictions["run-calibrated"], maxmin_s=predictions["max-min"],
        run_compute_s=tuple(r.compute_s_per_round or 0.0 for r in training),
        run_overhead_s=tuple(r.overhead_s_per_round or 0.0 for r in training),
        host_compute_s=host_compute_s,
        message_software_s=tuple(r.message_software_s or 0.0 for r in run.per_worker),
        bytes_sent_per_round=sum(sent) / len(sent),
        uplink_utilisation=sum(utilisation) / len(utilisation) if utilisation else math.nan,
        wall_s=wall_s, rtt_s=point.rtt_ms * 1e-3)


@dataclass(frozen=True)
class GridSettings:
    results: Path
    workload: str
    rounds: int
    host_calibration: Path
    host_compute_s: float
    timeout_s: float
    repredict: bool = False  # done configurations: predict again, keep the run
    lock: Path | None = None  # each launch holds this file's lock (flock) while it runs


def run_point(point: GridPoint, settings: GridSettings) -> FidelityTcpRow:
    """Launch one configuration on the testbed (unless done), predict it, keep its row."""
    folder = settings.results / point.name
    done = folder / DONE_FILE
    env = child_env(settings.results / "cache")
    run_dir = folder / "run"
    log = folder / "run.log"
    if done.exists():
        kept = record_from_json(FidelityTcpRow, json.loads((folder / ROW_FILE).read_text()))
        if not settings.repredict:
            return kept
        wall_s = kept.wall_s  # the run stays; only the predictions are made again
    else:
        folder.mkdir(parents=True, exist_ok=True)
        log.write_text("")
        started = time.perf_counter()
        lock = ["flock", str(settings.lock)] if settings.lock else []
        _run(lock + _python("akorun", "launch", "--testbed", "netns", *point.launch_flags(),
                     "--workload", settings.workload, *TRAINING_FLAGS,
                     "--rounds", str(settings.rounds), "--set", "train.eval_every=1000",
                     "--out", str(run_dir), "--force", "--quiet", "--timeout",
                     f"{settings.timeout_s:g}s"), env, log, settings.timeout_s + 60)
        wall_s = time.perf_counter() - started
    predictions = {}
    for column in COLUMNS:
        out = folder / f"predict-{column}.json"
        calibration = [] if column == "max-min" else [
            "--host-calibration", str(settings.host_calibration)]
        _akosim(["predict", str(run_dir), *calibration, *PREDICT_FLAGS[column],
                 "--out", str(out)], env, log, 600)
        predictions[column] = read_prediction(out)
    row = row_of(point, read_run(run_dir / "result.json"), predictions,
                 settings.host_compute_s, wall_s)
    (folder / ROW_FILE).write_text(json.dumps(record_to_json(row), indent=1))
    if not done.exists():
        done.write_text(json.dumps({"config": point.name, "wall_s": wall_s,
                                    "uptime": uptime()}, indent=1))
    return row


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True,
                              check=False).stdout.strip()
    except OSError:
        return "uptime: not available"


# ---- once per grid: host calibration and akosim's compute -----------------------------

def host_calibration(results: Path, *, message_cost: bool, netns_rate: str | None,
                     given: Path | None) -> Path:
    """The host calibration the grid uses: `given`, else RESULTS/host-calibration.json,
    made once (akorun measure-messages, then akosim calibrate)."""
    if given is not None:
        return given
    path = results / "host-calibration.json"
    if path.exists():
        return path
    env = child_env(results / "cache")
    log = results / "calibrate.log"
    flags: list[str] = []
    if message_cost:
        cost = results / "message-cost.json"
        _run(_python("akorun", "measure-messages", "--out", str(cost)), env, log, 900)
        flags += ["--message-cost", str(cost)]
    else:
        flags.append("--no-message-cost")
    if netns_rate:
        flags += ["--netns-rate", netns_rate]
    _akosim(["calibrate", *flags, "--out", str(path)], env, log, 900)
    return path


def host_compute_s(results: Path, workload: str) -> float:
    """akosim's own compute measurement of `workload` (cached in RESULTS/cache)."""
    out = results / "compute-measure.json"
    _akosim(["--workers", "2", "--workload", workload, *TRAINING_FLAGS, "--scheme", "ako",
             "--compute", "measure", "--rounds", "1", "--quiet", "--out", str(out)],
            child_env(results / "cache"), results / "calibrate.log", 900)
    record = read_result(json.loads(out.read_text()))
    if not isinstance(record, PlanResult) or not record.compute_s:
        raise ValueError(f"{out}: no compute measurement")
    return float(record.compute_s[0])


def colocated_summaries(results: Path) -> tuple[str, ...]:
    """One line per co-located step measurement cached in RESULTS/cache."""
    from akocore.records.jsonrecord import RecordError
    from akosim.calibration.colocated_compute import ColocatedCompute

    lines = []
    for path in sorted((results / "cache").glob("colocated-*.json")):
        try:
            record = ColocatedCompute.from_json(json.loads(path.read_text()))
        except (OSError, ValueError, RecordError):
            continue
        lines.append((record.processes, record.provenance()))
    return tuple(line for _, line in sorted(lines))


def calibration_summary(path: Path) -> str:
    from akocore.records.host_calibration import HostCalibration

    record = HostCalibration.from_json(json.loads(path.read_text()))
    p = record.tcp
    fraction = "-" if p.measured_goodput_fraction is None else f"{p.measured_goodput_fraction:.3f}"
    sharing = ("" if not p.flow_sharing_efficiency else "flow sharing efficiency "
               + "/".join(f"{e:.3f}" for e in p.flow_sharing_efficiency)
               + " for 1/2/3/4 flows, ")
    return (f"goodput fraction {fraction}, {sharing}window {p.window_bytes:.0f} B, "
            f"base RTT {p.base_rtt_s * 1e6:.0f} us, message cost {p.message_fixed_s * 1e3:.2f} "
            f"ms + {p.message_per_byte_s * 1e9:.2f} ns/B; measured at {record.measured_at}")


# ---- entry point ----------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.fidelity_tcp",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, required=True, help="the results folder")
    parser.add_argument("--grid", choices=tuple(GRIDS), default="lan",
                        help="lan: no latency (default); wan: round trips of 10-100 ms "
                             "realised by the testbed's delay line")
    parser.add_argument("--only", metavar="GLOB[,GLOB]",
                        help="configuration names, e.g. 'wan-2w-*' (default: the whole grid)")
    parser.add_argument("--workload", default="digits-cnn")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--timeout", type=float, default=240.0, metavar="SECONDS",
                        help="stop one launch after this long (default 240)")
    parser.add_argument("--host-calibration", type=Path, metavar="FILE.json",
                        help="use this host calibration instead of measuring one")
    parser.add_argument("--no-message-cost", action="store_true",
                        help="calibrate without akorun measure-messages (quicker; tests)")
    parser.add_argument("--netns-rate", default="20mbps",
                        help="calibrate the goodput fraction on a tc-shaped veth pair at "
                             "this rate (default %(default)s; 'none' to skip)")
    parser.add_argument("--report", type=Path, default=None,
                        help="markdown report (default: docs/reports/fidelity-tcp.md for the "
                             "lan grid, RESULTS/fidelity-wan.md for the wan grid)")
    parser.add_argument("--json", type=Path, default=None,
                        help="also copy the record here (e.g. analysis/data/fidelity-tcp.json)")
    parser.add_argument("--lock", type=Path, metavar="FILE",
                        help="run each launch under `flock FILE` (machines shared with other "
                             "measurements: only the launch holds it, not the predictions)")
    parser.add_argument("--report-only", action="store_true",
                        help="run nothing: rebuild the record and report from finished rows")
    parser.add_argument("--repredict", action="store_true",
                        help="launch nothing: predict the finished configurations again "
                             "(after a change to akosim) and rebuild the record and report")
    args = parser.parse_args(argv)
    if args.rounds < 4:
        parser.error(f"--rounds: got {args.rounds}, expected >= 4 (warm-up is skipped)")
    points = [p for p in GRIDS[args.grid]() if not args.only or any(
        fnmatch.fnmatch(p.name, g) for g in args.only.split(","))]
    if not points:
        print("no configuration matches --only", file=sys.stderr)
        return 2
    results = args.results.resolve()
    results.mkdir(parents=True, exist_ok=True)
    if args.report is None:
        args.report = (ROOT / "docs" / "reports" / "fidelity-tcp.md" if args.grid == "lan"
                       else results / "fidelity-wan.md")
    calibration = host_calibration(
        results, message_cost=not args.no_message_cost,
        netns_rate=None if args.netns_rate == "none" else args.netns_rate,
        given=args.host_calibration)
    compute_s = host_compute_s(results, args.workload)
    settings = GridSettings(results, args.workload, args.rounds, calibration, compute_s,
                            args.timeout, repredict=args.repredict, lock=args.lock)
    rows, failed = [], 0
    for point in points:
        if args.report_only or args.repredict:
            if (results / point.name / DONE_FILE).exists():
                rows.append(run_point(point, settings))
            continue
        try:
            row = run_point(point, settings)
        except (RuntimeError, ValueError, subprocess.TimeoutExpired) as error:
            failed += 1
            print(f"{point.name:<22} FAILED: {error}", flush=True)
            continue
        rows.append(row)
        print(f"{point.name:<22} measured {row.measured_round_time_s:.3f} s, host "
              f"{row.host_calibrated_s:.3f}, run {row.run_calibrated_s:.3f}, max-min "
              f"{row.maxmin_s:.3f}", flush=True)
    uptimes = tuple(json.loads((results / r.name / DONE_FILE).read_text()).get("uptime", "")
                    for r in rows)
    record = FidelityTcpRecord(
        created=datetime.now(UTC).isoformat(timespec="seconds"), workload=args.workload,
        rounds=args.rounds, host_calibration=str(calibration),
        host_calibration_summary=calibration_summary(calibration), host_compute_s=compute_s,
        uptime=uptimes, rows=tuple(rows),
        columns=tuple(summarise(rows, c) for c in COLUMNS),
        colocated_compute=colocated_summaries(results))
    text = json.dumps(record.to_json(), indent=1)
    (results / RECORD_FILE).write_text(text)
    if args.json:
        args.json.write_text(text)
    args.report.parent.mkdir(parents=True, exist_ok=True)
    previous = args.report.read_text() if args.report.exists() else ""
    args.report.write_text(markdown_report(record, kept_analysis(previous)))
    print(f"wrote {results / RECORD_FILE} and {args.report} ({len(rows)} configurations"
          f"{f', {failed} failed' if failed else ''})")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
