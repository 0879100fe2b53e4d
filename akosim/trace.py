"""Chrome trace JSON (opens in Perfetto or chrome://tracing) of a simulation.

One process per simulated configuration, one thread per worker; spans for
compute, waiting at the SSP gate and sends (from the first byte to the last
delivery of a multicast). Timestamps are simulated microseconds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from akosim.report import write_json
from akosim.scenario import SimRun

_COLOURS = {"compute": "good", "wait": "terrible", "send": "rail_load"}


def trace_events(runs: list[SimRun]) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for pid, run in enumerate(runs):
        events.append({"name": "process_name", "ph": "M", "pid": pid,
                       "args": {"name": run.label}})
        for worker in run.per_worker:
            events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": worker.rank,
                           "args": {"name": f"worker {worker.rank}"}})
        for span in run.trace:
            events.append({
                "name": span.name, "cat": span.name, "ph": "X", "pid": pid, "tid": span.rank,
                "ts": span.start_s * 1e6, "dur": max(span.end_s - span.start_s, 0.0) * 1e6,
                "cname": _COLOURS.get(span.name, "generic_work"), "args": dict(span.args)})
    return events


def write_trace(path: str | Path, runs: list[SimRun]) -> None:
    write_json(path, {"traceEvents": trace_events(runs), "displayTimeUnit": "ms"})
