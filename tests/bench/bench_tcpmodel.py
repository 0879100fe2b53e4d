"""The TCP-aware flow model beside max-min: what it changes, and what it costs.

`all_to_all_ratios()` simulates docs/design/fidelity-references.md's pattern (n hosts on one
switch, each sends M bytes to every other at once, the round ends at the last
arrival) with both models for n in {3, 4, 8}, R in {10, 40, 100} Mbit/s, M in
{0.5, 2, 8} MB at 0.1 ms and 20 ms, and reports the median and range of
tcp / max-min per latency, to set beside SimGrid LV08 (1.08 and 1.27) and
ns-3 (1.15 and 1.28). `speed_ratio()` times the same akosim scenario (Ako,
16 workers, 200 rounds) with both models side by side in one process: the
TCP model must stay within 2x. Rerun on a quiet machine with

    PYTHONPATH=. JAX_PLATFORMS=cpu python -m tests.bench --only tcpmodel
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace

import numpy as np
import simpy

from akocore.records.host_calibration import TcpParameters
from akocore.settings.normalise import network_layers
from akosim.network.fluidnet import FluidNetwork
from akosim.network.layer import NetworkModel
from akosim.network.netmodel import tcp_layers
from akosim.network.netspec import NetworkSpec
from akosim.network.tcpmodel import effective_spec, round_trip_s
from tests.bench.common import Figure

MB = 1e6
HOSTS = (3, 4, 8)
RATES_BPS = (10e6, 40e6, 100e6)
SIZES_BYTES = (0.5 * MB, 2 * MB, 8 * MB)
LATENCIES_S = (0.1e-3, 20e-3)
REFERENCES = {0.1e-3: {"simgrid_lv08": 1.08, "ns3": 1.15},
              20e-3: {"simgrid_lv08": 1.27, "ns3": 1.28}}


def _tcp_network(env: simpy.Environment, spec: NetworkSpec, params: TcpParameters,
                 rtt_s: np.ndarray) -> NetworkModel:
    """The TCP layers (without first come, first sent) over a fluid network on `spec`."""
    return tcp_layers(FluidNetwork(env, spec), params, rtt_s,
                      network_layers("tcp-core+slow-start+one-per-connection"))


def all_to_all_round_s(n: int, rate_bps: float, size_bytes: float, latency_s: float,
                       tcp: TcpParameters | None) -> float:
    """Seconds until every host has every other host's message (one round)."""
    env = simpy.Environment()
    spec = NetworkSpec.uniform(n, rate_bps, latency_s)
    if tcp is None:
        net: FluidNetwork = FluidNetwork(env, spec)
    else:
        rtt_s = round_trip_s(spec.latency_s, tcp)
        net = _tcp_network(env, effective_spec(spec, tcp, rtt_s), tcp, rtt_s)
    last = [0.0]

    def arrived(_dests: np.ndarray, _token: object) -> None:
        last[0] = float(env.now)

    for src in range(n):
        net.send(src, [d for d in range(n) if d != src], size_bytes, arrived)
    env.run()
    return last[0]


def all_to_all_ratios(tcp: TcpParameters | None = None) -> dict[float, list[float]]:
    """tcp / max-min round time per latency, over the whole grid."""
    tcp = tcp or TcpParameters()
    ratios: dict[float, list[float]] = {lat: [] for lat in LATENCIES_S}
    for lat in LATENCIES_S:
        for n in HOSTS:
            for rate in RATES_BPS:
                for size in SIZES_BYTES:
                    ratios[lat].append(all_to_all_round_s(n, rate, size, lat, tcp)
                                       / all_to_all_round_s(n, rate, size, lat, None))
    return ratios


def _scenario_cpu_s(tcp: TcpParameters | None, model: str = "tcp") -> float:
    from akocore.settings.schema import ClusterConfig, ExchangeConfig, NetworkConfig, RunConfig
    from akosim.planning.compute import ComputeModel
    from akosim.sim.engine import StopRule
    from akosim.sim.scenario import Setup, ako_variant, simulate

    cfg = RunConfig(cluster=ClusterConfig(workers=16),
                    network=NetworkConfig(bandwidth_bps=(40e6,), latency_s=(5e-3,)),
                    exchange=ExchangeConfig(scheme="ako", p=(4,)))
    setup = Setup(cfg, 1_000_000, ComputeModel(0.05), 32, StopRule(rounds=200, drain=False),
                  tcp=tcp, network_model=None if tcp is None else model)
    started = time.process_time()  # this process's CPU: other jobs disturb it far less
    simulate(setup, ako_variant(setup))
    return time.process_time() - started


def speed_ratio(tcp: TcpParameters | None = None, repeats: int = 5,
                model: str = "tcp") -> tuple[tuple[float, ...], float, float]:
    """(tcp CPU s / max-min CPU s of each of `repeats` pairs run back to back, median
    max-min s, median tcp s)."""
    tcp = tcp or TcpParameters()
    pairs = [(_scenario_cpu_s(None), _scenario_cpu_s(tcp, model)) for _ in range(repeats)]
    return (tuple(t / m for m, t in pairs), statistics.median(m for m, _ in pairs),
            statistics.median(t for _, t in pairs))


def run() -> list[Figure]:
    figures = []
    for lat, values in all_to_all_ratios().items():
        refs = REFERENCES[lat]
        figures.append(Figure(
            f"tcpmodel.all_to_all_median_ratio_{lat * 1e3:g}ms", statistics.median(values),
            "tcp / max-min", tolerance=None,
            note=f"range {min(values):.2f}-{max(values):.2f}; SimGrid LV08 "
                 f"{refs['simgrid_lv08']}, ns-3 {refs['ns3']}"))
    costly = replace(TcpParameters(), message_fixed_s=1e-3, message_per_byte_s=1e-9)
    # as a host calibration with --netns-rate leaves it: message CPU (f) and sharing (g)
    calibrated = replace(costly, flow_sharing_efficiency=(1.0, 0.87, 0.87, 0.89))
    with_cpu = "tcp-core+slow-start+one-per-connection+message-cpu+fifo"
    for name, params, model in (("sim_cpu_tcp_over_maxmin", TcpParameters(), "tcp"),
                                ("sim_cpu_tcp_with_message_cost_over_maxmin", costly, "tcp"),
                                ("sim_cpu_tcp_calibrated_over_maxmin", calibrated, with_cpu)):
        ratios, maxmin_s, tcp_s = speed_ratio(params, model=model)
        figures.append(Figure(f"tcpmodel.{name}", statistics.median(ratios), "ratio",
                              higher_is_better=False, goal=2.0, samples=ratios,
                              reference="max-min model",
                              note=f"max-min {maxmin_s:.3f} s, tcp {tcp_s:.3f} s CPU (medians "
                                   f"of {len(ratios)} pairs; ako 16 workers, 200 rounds)"))
    return figures


if __name__ == "__main__":
    for figure in run():
        print(figure)
