"""Chrome traces draw right: on every track, any two slices nest or are disjoint."""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from akocore.settings.toml_io import config_from_dict
from akosim.planning.compute import ComputeModel
from akosim.planning.trace import send_lanes, trace_events, write_trace
from akosim.sim.engine import StopRule, TraceEvent
from akosim.sim.scenario import Setup, SimRun, Variant, ako_variant, simulate

WORKERS = 5


def _setup() -> Setup:
    rng = np.random.default_rng(3)
    caps = np.triu(rng.uniform(5e6, 40e6, size=(WORKERS, WORKERS)), 1)
    caps = caps + caps.T
    np.fill_diagonal(caps, np.inf)
    config = config_from_dict({
        "cluster": {"workers": WORKERS},
        "network": {"bandwidth": "100mbps", "link_bandwidth_matrix": [
            ["inf" if np.isinf(cap) else f"{float(cap)!r}bps" for cap in row] for row in caps]},
        "exchange": {"scheme": "ako", "p": 2, "ssp": 2},
        "train": {"workload": "synthetic-cnn", "batch_size": 8, "rounds": 12}})
    return Setup(config, 200_000, ComputeModel(0.01), 8, StopRule(rounds=12, drain=True))


def _runs() -> list[SimRun]:
    setup = _setup()
    return [simulate(setup, ako_variant(setup), trace=True),
            simulate(setup, Variant("allreduce", label="ring allreduce"), trace=True)]


def _partly_overlapping(slices: list[tuple[float, float]] | list[tuple[int, int]]
                        ) -> list[tuple[tuple, tuple]]:
    """Pairs of slices that overlap without one containing the other."""
    bad = []
    for a, b in itertools.combinations(sorted(slices), 2):
        (a_start, a_end), (b_start, b_end) = a, b
        if a_start < b_start < a_end < b_end:
            bad.append((a, b))
    return bad


def _tracks(events: list[dict]) -> dict[tuple[int, int], list[tuple[int, int]]]:
    """Slices per track as (start, end) in whole nanoseconds, as Perfetto reads them."""
    tracks: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
    for event in events:
        if event["ph"] == "X":
            start_ns = round(event["ts"] * 1e3)
            tracks[event["pid"], event["tid"]].append(
                (start_ns, start_ns + round(event["dur"] * 1e3)))
    return tracks


def test_slices_on_every_track_nest(tmp_path: Path) -> None:
    runs = _runs()
    path = tmp_path / "t.json"
    write_trace(path, runs)
    events = json.loads(path.read_text())["traceEvents"]
    tracks = _tracks(events)
    for track, slices in tracks.items():
        assert _partly_overlapping(slices) == [], track
    # Every span of the simulation is drawn, once.
    assert sum(map(len, tracks.values())) == sum(len(run.trace) for run in runs)
    # The sends of a worker did overlap (the case this layout is for) ...
    per_rank: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    for pid, run in enumerate(runs):
        for span in run.trace:
            per_rank[pid, span.rank].append((span.start_s, span.end_s))
    assert any(_partly_overlapping(slices) for slices in per_rank.values())
    # ... and every track has a name saying whose it is.
    named = {(e["pid"], e["tid"]) for e in events if e["name"] == "thread_name"}
    assert set(tracks) <= named


def test_send_lanes_are_the_fewest_that_keep_sends_apart() -> None:
    spans = [TraceEvent(0, "send", start, end) for start, end in
             [(0.0, 3.0), (1.0, 2.0), (2.0, 4.0), (3.0, 5.0), (3.5, 4.5)]]
    lanes = {(span.start_s, span.end_s): lane for span, lane in send_lanes(spans)}
    assert lanes == {(0.0, 3.0): 0, (1.0, 2.0): 1, (2.0, 4.0): 1, (3.0, 5.0): 0,
                     (3.5, 4.5): 2}


def test_compute_and_waits_stay_on_the_worker_track() -> None:
    runs = _runs()[:1]
    events = trace_events(runs)
    names_by_tid: dict[int, set[str]] = defaultdict(set)
    for event in events:
        if event["ph"] == "X":
            names_by_tid[event["tid"]].add(event["name"])
    ranks = {worker.rank for worker in runs[0].per_worker}
    for tid, names in names_by_tid.items():
        if tid in ranks:
            assert "send" not in names
        else:
            assert names == {"send"}
    assert any("compute" in names_by_tid[rank] for rank in ranks)
