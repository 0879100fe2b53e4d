"""What first come, first sent (akosim.network.senderfifo) costs the TCP-aware model.

Times one akosim scenario with first come, first sent (the network
model's fifo layer) on and off side by
side in one process (CPU seconds, 5 pairs run back to back, the median of their
ratios): Ako with 16 workers and p = 4 (the tcpmodel benchmark's scenario,
where a node's later messages often find its uplink full) and an asynchronous
PS with 16 workers at s = 0 (every answer of the server queues), on paths without
latency (where the layer holds messages; on delayed paths it lets them share). Rerun
on a quiet machine with

    PYTHONPATH=. JAX_PLATFORMS=cpu python -m tests.bench --only ps_desync
"""

from __future__ import annotations

import statistics
import time

from akocore.records.host_calibration import TcpParameters
from akocore.settings.schema import ClusterConfig, ExchangeConfig, NetworkConfig, RunConfig
from akosim.planning.compute import ComputeModel
from akosim.sim.engine import StopRule
from akosim.sim.scenario import Setup, Variant, ako_variant, simulate
from tests.bench.common import Figure

WORKERS = 16
ROUNDS = 200


def _cpu_s(scheme: str, fifo: bool) -> float:
    exchange = (ExchangeConfig(scheme="ako", p=(4,)) if scheme == "ako" else
                ExchangeConfig(scheme="ps", ssp=0.0, ps_mode="async"))
    cfg = RunConfig(cluster=ClusterConfig(workers=WORKERS + (scheme == "ps")),
                    network=NetworkConfig(bandwidth_bps=(40e6,), latency_s=(0.0,)),
                    exchange=exchange)
    setup = Setup(cfg, 1_000_000, ComputeModel(0.05), 32, StopRule(rounds=ROUNDS, drain=False),
                  tcp=TcpParameters(),
                  network_model="tcp" if fifo else "tcp-core+slow-start+one-per-connection")
    variant = ako_variant(setup) if scheme == "ako" else Variant("ps", ps_servers=1)
    started = time.process_time()
    simulate(setup, variant)
    return time.process_time() - started


def fifo_cost(scheme: str, repeats: int = 5) -> tuple[tuple[float, ...], float, float]:
    """(CPU s with it on / off of each of `repeats` pairs run back to back, median off s,
    median on s)."""
    pairs = [(_cpu_s(scheme, False), _cpu_s(scheme, True)) for _ in range(repeats)]
    return (tuple(on / off for off, on in pairs), statistics.median(off for off, _ in pairs),
            statistics.median(on for _, on in pairs))


def run() -> list[Figure]:
    figures = []
    for scheme in ("ako", "ps"):
        ratios, off_s, on_s = fifo_cost(scheme)
        figures.append(Figure(
            f"ps_desync.sim_cpu_sender_fifo_over_fair_{scheme}", statistics.median(ratios),
            "ratio", higher_is_better=False, goal=2.0, samples=ratios,
            reference="the fair model",
            note=f"fair {off_s:.3f} s, first come first sent {on_s:.3f} s CPU (medians of "
                 f"{len(ratios)} pairs; {scheme} {WORKERS} workers, {ROUNDS} rounds)"))
    return figures


if __name__ == "__main__":
    for figure in run():
        print(figure)
