"""Which patterns the cross-check runs, and running one grid into a record.

`GRIDS["default"]` is the committed run (about 5 CPU minutes: the
all-to-all grid of docs/design/fidelity-references.md, 54 cases, plus Ako and parameter-server
rounds at 10 and 100 Mbit/s); `"full"` adds 40 Mbit/s to Ako and the PS;
`"quick"` leaves out the all-to-all's largest cases (n = 8 with 8 MB
messages, about 2 CPU minutes); `"tiny"` is one small case per family.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import replace

from analysis.ns3_crosscheck.akosim_run import run_akosim
from analysis.ns3_crosscheck.ns3_run import DEFAULT_TCP, TcpSettings, load_ns3, ns3_version, run_ns3
from analysis.ns3_crosscheck.ns3_scenario import (
    Pattern,
    ako_rounds,
    all_to_all,
    parameter_server,
)
from analysis.ns3_crosscheck.record import CaseResult, CrossCheckRecord, ModelTime

MBIT = 1e6
MB = 1e6
LATENCIES_S = (0.1e-3, 20e-3)
ROUNDS = 3
COMPUTE_S = 0.05
GRADIENT_BYTES = 2 * MB


def _default(full: bool, quick: bool = False) -> Iterator[Pattern]:
    rates = (10 * MBIT, 40 * MBIT, 100 * MBIT)
    for latency_s in LATENCIES_S:
        for hosts in (3, 4, 8):
            for rate_bps in rates:
                for message_bytes in (0.5 * MB, 2 * MB, 8 * MB):
                    if message_bytes == 8 * MB and hosts == 8 and quick:
                        continue
                    yield all_to_all(hosts, rate_bps, message_bytes, latency_s)
    loop_rates = rates if full else (10 * MBIT, 100 * MBIT)
    for latency_s in LATENCIES_S:
        for workers in (3, 4):
            for rate_bps in loop_rates:
                for partitions in sorted({1, workers - 1}):
                    yield ako_rounds(workers, rate_bps, GRADIENT_BYTES, partitions, ROUNDS,
                                     COMPUTE_S, latency_s)
                yield parameter_server(workers, rate_bps, GRADIENT_BYTES, ROUNDS, COMPUTE_S,
                                       latency_s)


def _tiny() -> Iterator[Pattern]:
    yield all_to_all(3, 100 * MBIT, 0.2 * MB, 0.1e-3)
    yield ako_rounds(3, 100 * MBIT, 0.4 * MB, 2, 2, 0.01, 0.1e-3)
    yield parameter_server(2, 100 * MBIT, 0.2 * MB, 2, 0.01, 0.1e-3)


GRIDS: dict[str, Callable[[], Iterator[Pattern]]] = {
    "default": lambda: _default(full=False),
    "full": lambda: _default(full=True),
    "quick": lambda: _default(full=False, quick=True),
    "tiny": _tiny,
}


def run_case(pattern: Pattern, models: tuple[str, ...],
             tcp: TcpSettings = DEFAULT_TCP) -> CaseResult:
    """One pattern in ns-3 and in each akosim model (ns3_wall_s: the ns-3 run
    alone, not loading the bindings)."""
    load_ns3()
    started = time.perf_counter()
    ns3_makespan_s = max(run_ns3(pattern, tcp))
    ns3_wall_s = time.perf_counter() - started
    return CaseResult(
        family=pattern.family, name=pattern.name, hosts=pattern.star.hosts,
        rate_bps=pattern.star.rate_bps, latency_s=pattern.star.latency_s,
        size_bytes=pattern.size_bytes, partitions=pattern.partitions, rounds=pattern.rounds,
        compute_s=pattern.compute_s, ns3_makespan_s=ns3_makespan_s, ns3_wall_s=ns3_wall_s,
        akosim=tuple(ModelTime(model, max(run_akosim(pattern, model))) for model in models))


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True,
                              check=False).stdout.strip()
    except OSError:
        return "unknown"


def run_grid(grid: str, models: tuple[str, ...], tcp: TcpSettings = DEFAULT_TCP,
             progress: Callable[[CaseResult], None] | None = None) -> CrossCheckRecord:
    """Every pattern of `grid` in ns-3 and each akosim model."""
    if grid not in GRIDS:
        raise ValueError(f"unknown grid {grid!r}; known: {sorted(GRIDS)}")
    load = _uptime()
    load_ns3()
    started = time.perf_counter()
    cases = []
    for pattern in GRIDS[grid]():
        case = run_case(pattern, models, tcp)
        cases.append(case)
        if progress is not None:
            progress(case)
    return CrossCheckRecord(
        grid=grid, ns3_version=ns3_version(), congestion_control=tcp.congestion_control,
        segment_bytes=tcp.segment_bytes, buffer_bytes=tcp.buffer_bytes, models=models,
        cases=tuple(cases), wall_s=time.perf_counter() - started, load=load)


def rescore(record: CrossCheckRecord, models: tuple[str, ...]) -> CrossCheckRecord:
    """`record` with akosim's `models` (re)computed for every case and ns-3's times kept:
    adding a model needs no ns-3 run. Each case's pattern is rebuilt from the record's
    grid by name."""
    if record.grid not in GRIDS:
        raise ValueError(f"the record's grid {record.grid!r} is not one of {sorted(GRIDS)}")
    patterns = {pattern.name: pattern for pattern in GRIDS[record.grid]()}
    missing = [case.name for case in record.cases if case.name not in patterns]
    if missing:
        raise ValueError(f"cases not in grid {record.grid!r} any more: {', '.join(missing)}")
    cases = []
    for case in record.cases:
        kept = tuple(entry for entry in case.akosim if entry.model not in models)
        fresh = tuple(ModelTime(model, max(run_akosim(patterns[case.name], model)))
                      for model in models)
        cases.append(replace(case, akosim=kept + fresh))
    ordered = tuple(dict.fromkeys(record.models + models))
    return replace(record, models=ordered, cases=tuple(cases))
