"""Chrome trace JSON (opens in Perfetto or chrome://tracing) of a simulation.

One process per simulated configuration. Each worker has its own track
(thread) for what it does in sequence: compute, overhead and waiting at the
SSP gate. Its sends (from the first byte to the last delivery of a multicast)
overlap one another, so they go on tracks of their own beside it: each send
takes the first of the worker's send lanes that is free when it starts (the
fewest lanes that keep the slices of every track disjoint). So no two slices
on one track partly overlap, which is what Perfetto needs to draw them.
Timestamps are simulated microseconds, in whole nanoseconds.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from akosim.planning.result_tables import write_json
from akosim.sim.engine import TraceEvent
from akosim.sim.scenario import SimRun

_COLOURS = {"compute": "good", "wait": "terrible", "send": "rail_load"}
_SEND = "send"
# Tracks are ordered worker by worker: the worker's own track, then its send lanes.
_SORT_STRIDE = 1_000_000


def send_lanes(spans: Iterable[TraceEvent]) -> list[tuple[TraceEvent, int]]:
    """Each send of one worker with the lane it is drawn on: spans sorted by start,
    each on the lowest-numbered lane whose previous span has ended (interval
    partitioning: as many lanes as the most sends in flight at once)."""
    lane_free_at_s: list[float] = []
    placed = []
    for span in sorted(spans, key=lambda s: (s.start_s, s.end_s)):
        for lane, free_at_s in enumerate(lane_free_at_s):
            if free_at_s <= span.start_s:
                lane_free_at_s[lane] = span.end_s
                break
        else:
            lane = len(lane_free_at_s)
            lane_free_at_s.append(span.end_s)
        placed.append((span, lane))
    return placed


def _slice(span: TraceEvent, pid: int, tid: int) -> dict[str, Any]:
    # Whole nanoseconds, so that a slice ending where the next begins ends
    # exactly there once a viewer has added ts and dur.
    start_ns = round(span.start_s * 1e9)
    end_ns = max(round(span.end_s * 1e9), start_ns)
    return {"name": span.name, "cat": span.name, "ph": "X", "pid": pid, "tid": tid,
            "ts": start_ns / 1e3, "dur": (end_ns - start_ns) / 1e3,
            "cname": _COLOURS.get(span.name, "generic_work"), "args": dict(span.args)}


def _thread(pid: int, tid: int, name: str, sort_index: int) -> list[dict[str, Any]]:
    return [{"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}},
            {"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid,
             "args": {"sort_index": sort_index}}]


def trace_events(runs: list[SimRun]) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for pid, run in enumerate(runs):
        events.append({"name": "process_name", "ph": "M", "pid": pid,
                       "args": {"name": run.label}})
        ranks = sorted({worker.rank for worker in run.per_worker}
                       | {span.rank for span in run.trace})
        for rank in ranks:
            events += _thread(pid, rank, f"worker {rank}", rank * _SORT_STRIDE)
        sends: dict[int, list[TraceEvent]] = {rank: [] for rank in ranks}
        for span in run.trace:
            if span.name == _SEND:
                sends[span.rank].append(span)
            else:
                events.append(_slice(span, pid, span.rank))
        next_tid = max(ranks, default=-1) + 1
        for rank in ranks:
            lane_tids: list[int] = []
            for span, lane in send_lanes(sends[rank]):
                if lane == len(lane_tids):
                    lane_tids.append(next_tid)
                    events += _thread(pid, next_tid, f"worker {rank} sends {lane}",
                                      rank * _SORT_STRIDE + lane + 1)
                    next_tid += 1
                events.append(_slice(span, pid, lane_tids[lane]))
    return events


def write_trace(path: str | Path, runs: list[SimRun]) -> None:
    write_json(path, {"traceEvents": trace_events(runs), "displayTimeUnit": "ms"})
