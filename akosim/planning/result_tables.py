"""Human tables and result files for simulated runs.

`format_table` prints the side-by-side comparison a user reads first (its
rounds column says how many rounds each row was simulated for, "not settled"
when a row ran to the settle cap without its round time settling, and
`unsettled_lines` says so under the table; its NIC
column gives two figures, the mean use of the training workers' uplinks and the
busiest NIC of any node, servers included, which is the one the bottleneck
column names when a NIC is the bottleneck);
`plan_result` turns the simulated configurations into the akocore.records.results
records (`PlanResult`: config echoed, one `RunResult` per configuration in
`runs`, with `per_worker` and `per_link`), the file ``--out`` writes;
`write_json` writes JSON atomically, so an interrupted run never leaves half a
file.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from akocore.records.results import LinkResult, PlanResult, RankResult, RunResult
from akocore.schemes.registry import is_partitioned
from akocore.units import format_duration, format_size
from akosim.sim.scenario import SimRun

if TYPE_CHECKING:
    from akosim.planning.accuracy_ranking import Ranking
    from akosim.planning.advice import Explanation
    from akosim.planning.learning_ranking import LearningRanking


def _stale(value: float) -> str:
    return "inf" if math.isinf(value) else f"{value:g}"


NIC_HEADER = "NIC use: workers / busiest"


def nic_use(run: SimRun) -> str:
    """``84% / 84%``: the training workers' mean uplink use, then the busiest NIC's
    (any node's uplink or downlink, parameter servers included)."""
    busiest = max(run.max_uplink_utilisation, run.max_downlink_utilisation)
    return f"{100 * run.nic_utilisation:.0f}% / {100 * busiest:.0f}%"


def rounds_cell(run: SimRun) -> str:
    """``325``: the rounds a row was simulated for; ``3,000, not settled`` when it ran to
    the settle cap without its round time settling."""
    return f"{run.simulated_rounds:,}" + (", not settled" if run.settled is False else "")


def unsettled_lines(runs: list[SimRun]) -> list[str]:
    """One line under the table for each row whose round time did not settle."""
    return [f"akosim: {run.label}: the round time did not settle within "
            f"{run.simulated_rounds:,} rounds (a window's mean still moved by more than the "
            f"tolerance against the one before); its figure is the mean over them after the "
            f"warm-up" for run in runs if run.settled is False]


def format_table(runs: list[SimRun], *, training: bool = False) -> str:
    headers = ["configuration", "round time", "rounds", "samples/s", "sent/worker/round",
               NIC_HEADER, "staleness", "bottleneck"]
    if training:
        headers[1:1] = ["time to target", "final acc"]
    rows = []
    for run in runs:
        row = [run.label, format_duration(run.round_time_s), rounds_cell(run),
               f"{run.samples_per_s:,.1f}",
               format_size(run.bytes_sent_per_worker_per_round),
               nic_use(run),
               f"<= {_stale(run.staleness_bound_rounds)} rounds", run.bottleneck]
        if training:
            ttt = "not reached" if run.time_to_target_s is None else format_duration(
                run.time_to_target_s)
            acc = "-" if run.final_accuracy is None else f"{100 * run.final_accuracy:.1f}%"
            row[1:1] = [ttt, acc]
        rows.append(row)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)


def run_result(run: SimRun, *, config: dict[str, Any], mode: str,
               batch_size: int) -> RunResult:
    """One simulated configuration as a RunResult (per-worker figures per round from the
    simulated totals)."""
    p_of = tuple(run.p_of) if is_partitioned(run.scheme) else ()
    shared: dict[str, Any] = dict(
        scheme=run.scheme, p=run.p, p_of=p_of, ssp=run.ssp, workers=run.workers,
        training_workers=run.training_workers, batch_size=batch_size)
    samples = run.samples_per_round or run.training_workers * batch_size
    ranks = tuple(
        RankResult(rank=w.rank, role="worker", **shared, rounds=w.rounds,
                   round_time_s=_finite(w.round_time_s),
                   samples_per_s=_finite(samples / w.round_time_s)
                   if w.round_time_s > 0 else None,
                   compute_s_per_round=w.compute_s / w.rounds if w.rounds else None,
                   wait_s_per_round=w.wait_s / w.rounds if w.rounds else None,
                   compute_s=w.compute_s, wait_s=w.wait_s, bytes_sent=w.bytes_sent,
                   bytes_received=w.bytes_received, uplink_utilisation=w.uplink_utilisation,
                   downlink_utilisation=w.downlink_utilisation, max_lag_rounds=w.max_lag_rounds,
                   mean_lag_rounds=w.mean_lag_rounds)
        for w in run.per_worker)
    links = tuple(LinkResult(int(link["src"] or 0), int(link["dst"] or 0),
                             float(link["bytes"] or 0.0), link["cap_bps"], link["utilisation"])
                  for link in run.per_link)
    return RunResult(
        tool="akosim", mode=mode, label=run.label, config=config, **shared,
        p_reason=run.p_reason, ps_servers=run.ps_servers, round_time_s=run.round_time_s,
        samples_per_s=run.samples_per_s,
        bytes_sent_per_worker_per_round=run.bytes_sent_per_worker_per_round,
        compute_s_per_round=run.compute_s_per_round, wait_s_per_round=run.wait_s_per_round,
        simulated_rounds=run.simulated_rounds, settled=run.settled,
        warmup_rounds=run.warmup_rounds, final_accuracy=run.final_accuracy,
        evaluations=tuple((e.sim_time_s, e.round, e.accuracy) for e in run.evaluations),
        time_to_target_s=run.time_to_target_s, nic_utilisation=run.nic_utilisation,
        max_uplink_utilisation=run.max_uplink_utilisation,
        max_downlink_utilisation=run.max_downlink_utilisation,
        staleness_bound_rounds=run.staleness_bound_rounds, max_lag_rounds=run.max_lag_rounds,
        bottleneck=run.bottleneck, simulated_s=run.simulated_s, wall_s=run.wall_s,
        events=dict(run.events), per_worker=ranks, per_link=links)


def plan_result(runs: list[SimRun], *, config: dict[str, Any], training: bool,
                gradient_bytes: int, compute_s: list[float], batch_size: int,
                compute_source: str = "", explanation: Explanation | None = None,
                recommendation: tuple[str, ...] = (), ranking: Ranking | None = None,
                explained: tuple[str, ...] = (),
                learning: LearningRanking | None = None) -> PlanResult:
    """What `akosim --out` writes: every simulated configuration of one question, the
    plan's explanation when there is one, the recommendation (akosim.planning.advice.recommend),
    the ranking by accuracy (akosim.planning.accuracy_ranking) and the --explain text."""
    mode = "train" if training else "timing"
    extra: dict[str, Any] = {"recommendation": recommendation, "explained": explained}
    if ranking is not None:
        from akosim.planning.accuracy_ranking import ranked_records

        extra |= dict(target_accuracy=ranking.goal.target_accuracy,
                      time_budget_s=ranking.goal.time_budget_s,
                      ranking_rounds=ranking.goal.rounds, ranking=ranked_records(ranking),
                      ranking_verdict=ranking.verdict())
    elif learning is not None:  # the default ranking: every row, by predicted time to target
        extra |= dict(target_accuracy=learning.target, ranking_rounds=learning.rounds,
                      ranking=learning.records(), ranking_verdict=learning.verdict())
    if explanation is not None:
        extra |= dict(explanation=explanation.line, chosen_ssp=explanation.ssp,
                         propagation_rounds=explanation.propagation_rounds,
                         propagation_s=explanation.propagation_s,
                         max_staleness_rounds=explanation.max_staleness_rounds,
                         advice=explanation.advice)
    return PlanResult(config=config, mode=mode, gradient_bytes=gradient_bytes,
                      compute_s=tuple(compute_s),
                      runs=tuple(run_result(r, config=config, mode=mode, batch_size=batch_size)
                                 for r in runs), compute_source=compute_source, **extra)


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def write_json(path: str | Path, payload: dict[str, Any]) -> None:
    """Write JSON atomically (temp file in the same folder, then rename)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(payload, handle, indent=1, default=_default, allow_nan=False)
            handle.write("\n")
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _default(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


def json_safe(value: Any) -> Any:
    """Replace inf/nan (not JSON) by strings, recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return "inf" if value > 0 else ("-inf" if value < 0 else "nan")
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value
