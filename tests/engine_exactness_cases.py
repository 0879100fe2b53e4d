"""Small simulations whose every round end is pinned: the exactness check of akosim's speed work.

Each case runs the engine (akosim.sim.engine.Simulation over akosim.network.fluidnet) on a
few workers and returns every worker's round end times, in simulated seconds.
tests/data/engine_round_ends.json holds the values the engine gave before its
event path and solver were made faster; tests/test_engine_speed_exact.py
checks that they still agree to a relative 1e-9. Regenerate (only on a
purposeful change of the model) with
`PYTHONPATH=. python -m tests.engine_exactness_cases --write`.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np

from akocore.resolve import scheme_spec
from akocore.schemes import build_nodes
from akocore.settings.toml_io import config_from_dict
from akosim.planning.compute import ComputeModel
from akosim.sim.engine import Simulation, StopRule
from akosim.sim.scenario import network_spec

GOLDEN = Path(__file__).parent / "data" / "engine_round_ends.json"
LENGTH = 250_000  # float32 gradient elements: 1 MB


def random_caps(workers: int, seed: int, low_bps: float = 10e6,
                high_bps: float = 40e6) -> list[list[str]]:
    """A per-pair cap table (config units), U(low, high) per ordered pair."""
    rng = np.random.default_rng(seed)
    caps = rng.uniform(low_bps, high_bps, size=(workers, workers))
    return [["inf" if i == j else f"{float(caps[i, j])!r}bps" for j in range(workers)]
            for i in range(workers)]


def random_latency(workers: int, seed: int) -> list[list[str]]:
    rng = np.random.default_rng(seed)
    lat = rng.uniform(0.1e-3, 5e-3, size=(workers, workers))
    return [["0s" if i == j else f"{float(lat[i, j])!r}s" for j in range(workers)]
            for i in range(workers)]


# name -> (workers, network table, exchange table, p_of, compute, rounds, drain)
CASES: dict[str, tuple[int, dict[str, object], dict[str, object], tuple[int, ...],
                       ComputeModel, int, bool]] = {
    "ako_homog_s0": (6, {"bandwidth": "40mbps"}, {"scheme": "ako", "ssp": 0},
                     (5,), ComputeModel(0.05), 8, False),
    "ako_random_caps_s0": (8, {"bandwidth": "1gbps", "link_bandwidth_matrix": random_caps(8, 1)},
                           {"scheme": "ako", "ssp": 0}, (7,), ComputeModel(0.05), 8, False),
    "ako_random_caps_s2": (8, {"bandwidth": "1gbps", "link_bandwidth_matrix": random_caps(8, 2)},
                           {"scheme": "ako", "ssp": 2}, (7,),
                           ComputeModel(0.03, jitter=0.3, seed=4), 10, False),
    "ako_random_caps_p3_drain": (
        7, {"bandwidth": "100mbps", "link_bandwidth_matrix": random_caps(7, 3, 5e6, 60e6),
            "latency_matrix": random_latency(7, 3)},
        {"scheme": "ako", "ssp": 1}, (3,), ComputeModel(0.02, speed_factors=(1.0, 1.7)), 9, True),
    "ako_random_caps_24w_s0": (24, {"bandwidth": "1gbps",
                                    "link_bandwidth_matrix": random_caps(24, 7)},
                               {"scheme": "ako", "ssp": 0}, (23,), ComputeModel(0.05), 3, False),
    "ako_random_caps_16w_s2": (16, {"bandwidth": "400mbps",
                                    "link_bandwidth_matrix": random_caps(16, 8)},
                               {"scheme": "ako", "ssp": 2}, (6,),
                               ComputeModel(0.02, jitter=0.4, seed=2), 6, True),
    "ako_hetero_nics_s2": (6, {"bandwidth": "10mbps,40mbps,25mbps,100mbps,40mbps,15mbps",
                               "latency": "2ms"},
                           {"scheme": "ako", "ssp": 2}, (5,),
                           ComputeModel(0.04, stragglers=(2,), straggler_factor=2.5), 10, True),
    "ako_hetero_nics_p_of_s0": (5, {"bandwidth": "10mbps,40mbps,25mbps,100mbps,40mbps"},
                                {"scheme": "ako", "ssp": 0}, (1, 4, 2, 4, 3),
                                ComputeModel(0.04), 8, True),
    "ps_random_caps": (6, {"bandwidth": "1gbps", "link_bandwidth_matrix": random_caps(6, 5)},
                       {"scheme": "ps", "ps_servers": 2, "ssp": 0}, (1,),
                       ComputeModel(0.05), 6, True),
    "ps_hetero_nics_s2": (5, {"bandwidth": "20mbps,80mbps,40mbps,40mbps,30mbps,60mbps"},
                          {"scheme": "ps", "ps_servers": 1, "ssp": 2}, (1,),
                          ComputeModel(0.03, jitter=0.2, seed=1), 8, True),
    "allreduce_random_caps": (6, {"bandwidth": "1gbps",
                                  "link_bandwidth_matrix": random_caps(6, 6)},
                              {"scheme": "allreduce", "ssp": 0}, (1,), ComputeModel(0.05), 5, True),
    "allreduce_hetero_nics": (5, {"bandwidth": "10mbps,40mbps,25mbps,100mbps,40mbps",
                                  "latency": "1ms"},
                              {"scheme": "allreduce", "ssp": 0}, (1,), ComputeModel(0.05), 4, True),
}


def run_case(name: str) -> list[list[float]]:
    """Every worker's round end times (s) of one case, by rank."""
    workers, network, exchange, p_of, compute, rounds, drain = CASES[name]
    config = config_from_dict({
        "cluster": {"workers": workers}, "network": network, "exchange": exchange,
        "train": {"workload": "synthetic-cnn", "batch_size": 32, "rounds": rounds}})
    spec = scheme_spec(config, p_of)
    nodes = build_nodes(spec, LENGTH, None, None)
    sim = Simulation(nodes, network_spec(config), compute, StopRule(rounds=rounds, drain=drain))
    sim.run()
    ends = [sim.timelines[rank].round_end_s for rank in sorted(sim.timelines)]
    if drain:
        ends.append([sim.timelines[rank].drained_s for rank in sorted(sim.timelines)])
    return ends


def relative_gap(got: list[list[float]], want: list[list[float]]) -> float:
    """The largest relative difference between two runs' times (inf if shapes differ)."""
    if [len(row) for row in got] != [len(row) for row in want]:
        return math.inf
    gap = 0.0
    for got_row, want_row in zip(got, want, strict=True):
        for a, b in zip(got_row, want_row, strict=True):
            gap = max(gap, abs(a - b) / max(abs(b), 1e-300))
    return gap


def main(argv: list[str]) -> int:
    results = {name: run_case(name) for name in CASES}
    if "--write" in argv:
        GOLDEN.write_text(json.dumps(results, indent=0) + "\n")
        print(f"wrote {GOLDEN}")
        return 0
    want = json.loads(GOLDEN.read_text())
    worst = 0.0
    for name, got in results.items():
        gap = relative_gap(got, want[name])
        worst = max(worst, gap)
        print(f"{name:28s} {gap:.3g}")
    return 0 if worst <= 1e-9 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
