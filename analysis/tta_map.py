"""Which scheme reaches the target accuracy first: a bandwidth x latency map in akosim.

For each cell of a bandwidth x one-way-latency grid, every configuration of the testbed
grid (analysis.tta_testbed.CONFIGS: ring all-reduce, DiLoCo, Streaming DiLoCo, Ako, a
synchronous parameter server and WAGMA, and all-reduce, DiLoCo, Streaming DiLoCo, Ako
and the PS with the int8 codec) trains the same workload (digits-mlp, hidden 512, 3
workers, SGD, batch 32) with ``akosim.train`` until the target accuracy or a budget of
simulated seconds, evaluating every 10 rounds. The winner of a cell is the configuration
with the shortest simulated time to the target, with codecs allowed and with codec none
only; beside it, the bytes each worker sent until the target.

akosim's compute per step is its own measurement of the workload on this host (one
process alone, as on a machine per worker); the network model is max-min (the fluid
ideal, akosim train's default).

    python -m analysis.tta_map --out analysis/data/tta_map.json [--quick]
    python -m analysis.tta_map --out analysis/data/tta_map.json --configs NAME[,NAME]

``--configs`` runs only those configurations and merges their rows into the record
already at ``--out`` (replacing rows of the same configurations), so adding a
configuration does not rerun the whole map.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from analysis.tta_testbed import (
    CONFIGS,
    EVAL_EVERY,
    TARGET_ACCURACY,
    WORKERS,
    WORKLOAD,
    WORKLOAD_ARG,
    Config,
    time_to_target,
)
from analysis.tta_testbed import uptime as _uptime

BANDWIDTHS = ("10mbps", "100mbps", "1gbps", "10gbps")
LATENCIES = ("0.1ms", "1ms", "10ms", "100ms")  # one-way
BUDGET_S = 60.0  # simulated seconds at most per run
QUICK_BANDWIDTHS = ("10mbps",)
QUICK_LATENCIES = ("10ms",)
QUICK_CONFIGS = ("allreduce", "diloco")
QUICK_BUDGET_S = 3.0


@dataclass(frozen=True)
class MapRow:
    """One configuration trained in one cell."""

    bandwidth: str
    latency: str
    config: str
    codec: str
    label: str
    time_to_target_s: float | None
    rounds_to_target: int | None
    final_accuracy: float | None
    round_time_s: float | None
    bytes_sent_per_worker_per_round: float | None
    bytes_to_target_per_worker: float | None


@dataclass
class TtaMap:
    """The record: the grid, its settings and every row."""

    workload: str
    workers: int
    target_accuracy: float
    budget_s: float
    bandwidths: tuple[str, ...]
    latencies: tuple[str, ...]
    rows: list[MapRow] = field(default_factory=list)
    generated_utc: str = ""
    machine: str = ""
    load: str = ""  # uptime at the start and the end
    elapsed_s: float = 0.0


def settings_of(config: Config) -> dict[str, Any]:
    """akosim.train keywords of a configuration's flags ('--inner-steps 10' ->
    inner_steps='10')."""
    flags = config.flags
    return {flags[i].lstrip("-").replace("-", "_"): flags[i + 1]
            for i in range(0, len(flags), 2)}


def train_cell(bandwidth: str, latency: str, configs: Sequence[Config],
               budget_s: float) -> list[MapRow]:
    """`akosim.train` of every configuration in one cell, stopping at the target."""
    import akosim

    rows = []
    for config in configs:
        run = akosim.train(workers=config.nodes, bandwidth=bandwidth, latency=latency,
                           compute="measure", workload=f"{WORKLOAD}:{WORKLOAD_ARG}",
                           target_accuracy=TARGET_ACCURACY, duration=f"{budget_s:g}s",
                           eval_every=EVAL_EVERY, quiet=True, **settings_of(config))
        reached = time_to_target(run.evaluations, TARGET_ACCURACY)
        rounds = next((int(e[1]) for e in run.evaluations if e[2] >= TARGET_ACCURACY), None)
        per_round = run.bytes_sent_per_worker_per_round
        rows.append(MapRow(
            bandwidth=bandwidth, latency=latency, config=config.name, codec=config.codec,
            label=run.label, time_to_target_s=reached, rounds_to_target=rounds,
            final_accuracy=run.final_accuracy, round_time_s=run.round_time_s,
            bytes_sent_per_worker_per_round=per_round,
            bytes_to_target_per_worker=(per_round * rounds
                                        if per_round is not None and rounds else None)))
    return rows


def winner(rows: Sequence[MapRow], *, codecs: bool = True) -> MapRow | None:
    """The row with the shortest time to target (codec none only unless `codecs`);
    None when none reached it. Ties: the earlier row."""
    reached = [r for r in rows if r.time_to_target_s is not None
               and (codecs or r.codec == "none")]
    return min(reached, key=lambda r: r.time_to_target_s or 0.0) if reached else None


def cells(record: TtaMap) -> dict[tuple[str, str], list[MapRow]]:
    """The rows of each (bandwidth, latency) cell."""
    out: dict[tuple[str, str], list[MapRow]] = {}
    for row in record.rows:
        out.setdefault((row.bandwidth, row.latency), []).append(row)
    return out


def tta_map(*, quick: bool = False, progress: bool = False,
            only: Sequence[str] = ()) -> TtaMap:
    """The whole map; `quick`: one cell, two configurations, a 3 s budget; `only`: just
    those configurations."""
    bandwidths = QUICK_BANDWIDTHS if quick else BANDWIDTHS
    latencies = QUICK_LATENCIES if quick else LATENCIES
    configs = [c for c in CONFIGS if (not quick or c.name in QUICK_CONFIGS)
               and (not only or c.name in only)]
    budget_s = QUICK_BUDGET_S if quick else BUDGET_S
    started = time.perf_counter()
    before = _uptime()
    record = TtaMap(workload=f"{WORKLOAD}:{WORKLOAD_ARG}", workers=WORKERS,
                    target_accuracy=TARGET_ACCURACY, budget_s=budget_s,
                    bandwidths=bandwidths, latencies=latencies,
                    generated_utc=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
                    machine=f"{platform.system()} {platform.machine()}, "
                            f"{os.cpu_count()} cores, Python {platform.python_version()}")
    for bandwidth in bandwidths:
        for latency in latencies:
            record.rows.extend(train_cell(bandwidth, latency, configs, budget_s))
            if progress:
                best = winner(cells(record)[(bandwidth, latency)])
                print(f"{bandwidth} {latency}: {best.config if best else '-'}", flush=True)
    record.elapsed_s = time.perf_counter() - started
    record.load = f"start: {before} | end: {_uptime()}"
    return record


def read_map(path: Path) -> TtaMap:
    """A record written by `main`."""
    data = json.loads(path.read_text(encoding="utf-8"))
    rows = [MapRow(**r) for r in data.pop("rows")]
    data["bandwidths"] = tuple(data["bandwidths"])
    data["latencies"] = tuple(data["latencies"])
    return TtaMap(**data, rows=rows)


def merge_maps(old: TtaMap, new: TtaMap) -> TtaMap:
    """`old` with the rows of `new`'s configurations replaced by `new`'s, in grid and
    configuration order; elapsed time summed, both loads kept."""
    replaced = {r.config for r in new.rows}
    if (old.bandwidths, old.latencies, old.budget_s) != \
            (new.bandwidths, new.latencies, new.budget_s):
        raise ValueError("the record at --out has another grid or budget; rerun the map")
    order = {c.name: i for i, c in enumerate(CONFIGS)}
    cell = {(b, lat): i for i, (b, lat) in enumerate(
        (b, lat) for b in old.bandwidths for lat in old.latencies)}
    rows = [r for r in old.rows if r.config not in replaced] + new.rows
    rows.sort(key=lambda r: (cell[(r.bandwidth, r.latency)], order.get(r.config, len(order))))
    return TtaMap(workload=old.workload, workers=old.workers,
                  target_accuracy=old.target_accuracy, budget_s=old.budget_s,
                  bandwidths=old.bandwidths, latencies=old.latencies, rows=rows,
                  generated_utc=f"{old.generated_utc}; {', '.join(sorted(replaced))}: "
                                f"{new.generated_utc}",
                  machine=old.machine, load=f"{old.load} || {new.load}",
                  elapsed_s=old.elapsed_s + new.elapsed_s)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.tta_map",
                                     description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--out", type=Path, required=True, help="the record (JSON)")
    parser.add_argument("--quick", action="store_true",
                        help="one cell, two configurations, a 3 s budget")
    parser.add_argument("--configs", metavar="NAME[,NAME]",
                        help="run only these configurations and merge their rows into "
                             "the record at --out")
    args = parser.parse_args(argv)
    only = tuple(args.configs.split(",")) if args.configs else ()
    known = {c.name for c in CONFIGS}
    if unknown := [name for name in only if name not in known]:
        print(f"--configs: unknown {', '.join(unknown)}; allowed: {', '.join(sorted(known))}",
              file=sys.stderr)
        return 2
    record = tta_map(quick=args.quick, progress=True, only=only)
    if only and args.out.exists():
        try:
            record = merge_maps(read_map(args.out), record)
        except ValueError as error:
            print(f"--configs: {error}", file=sys.stderr)
            return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(asdict(record), indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out} ({len(record.rows)} runs in {record.elapsed_s:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
