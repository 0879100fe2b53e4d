"""First come, first sent (akosim.network.senderfifo) and the asynchronous PS it desynchronises.

Hand-computed cases on one 80 Mbit/s network (1 MB = 0.1 s alone), the TCP-aware
model with it on and off, and the pure parts of analysis.ps_desync_probe.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import simpy

from akocore.records.host_calibration import HostCalibration, TcpParameters
from akocore.settings.normalise import network_layers
from akocore.settings.schema import ClusterConfig, ExchangeConfig, NetworkConfig, RunConfig
from akosim.network.fluidnet import FluidNetwork
from akosim.network.layer import NetworkModel
from akosim.network.netmodel import tcp_layers
from akosim.network.netspec import NetworkSpec
from akosim.network.senderfifo import FIFO_MAX_RTT_S, SenderFifo
from akosim.network.tcpmodel import effective_spec, round_trip_s
from akosim.planning.compute import ComputeModel
from akosim.sim.engine import StopRule
from akosim.sim.scenario import Setup, Variant, simulate
from analysis.ps_desync_probe import leader_share, summarise

RATE_BPS = 80e6
MB = 1e6
ALONE_S = MB * 8 / RATE_BPS  # 0.1 s


def SenderFifoNetwork(env: simpy.Environment, spec: NetworkSpec) -> SenderFifo:  # noqa: N802
    """First come, first sent over the fluid network."""
    return SenderFifo(FluidNetwork(env, spec))


def arrivals(net_kind: Callable[[simpy.Environment, NetworkSpec], NetworkModel],
             sends: list[tuple[float, int, list[int]]], n: int = 3) -> dict[tuple[int, int], float]:
    """Send 1 MB from src to each of dsts at each given time; arrival time per (src, dst)."""
    env = simpy.Environment()
    net = net_kind(env, NetworkSpec.uniform(n, RATE_BPS, 0.0))
    done: dict[tuple[int, int], float] = {}

    def sender(at_s: float, src: int, dsts: list[int]):
        yield env.timeout(at_s)

        def arrived(dests: np.ndarray, _token: object) -> None:
            for d in dests.tolist():
                done[(src, d)] = float(env.now)

        net.send(src, dsts, MB, arrived)

    for at_s, src, dsts in sends:
        env.process(sender(at_s, src, dsts))
    env.run()
    return done


def test_a_later_message_from_the_same_node_waits_for_the_earlier_one():
    sends = [(0.0, 2, [0]), (0.02, 2, [1])]
    fair = arrivals(FluidNetwork, sends)
    fifo = arrivals(SenderFifoNetwork, sends)
    # max-min: 20 ms alone, then half each: the first ends at 2 x 0.1 - 0.02
    assert fair[(2, 0)] == pytest.approx(2 * ALONE_S - 0.02)
    assert fair[(2, 1)] == pytest.approx(2 * ALONE_S)
    # first come, first sent: the first in its alone time, the second after it
    assert fifo[(2, 0)] == pytest.approx(ALONE_S)
    assert fifo[(2, 1)] == pytest.approx(2 * ALONE_S)


def _fifo_with_rtt(rtt_s: float) -> Callable[[simpy.Environment, NetworkSpec], NetworkModel]:
    def build(env: simpy.Environment, spec: NetworkSpec) -> NetworkModel:
        rtt = np.full((spec.n, spec.n), rtt_s)
        np.fill_diagonal(rtt, 0.0)
        return SenderFifo(FluidNetwork(env, spec), rtt)
    return build


def test_on_delayed_paths_a_later_message_shares_instead_of_waiting():
    # measured with the testbed's delay line: from 4 ms round trip on, two messages of
    # one node share its NIC about fairly; without latency they leave in order
    sends = [(0.0, 2, [0]), (0.02, 2, [1])]
    fair = arrivals(FluidNetwork, sends)
    assert arrivals(_fifo_with_rtt(FIFO_MAX_RTT_S * 2), sends) == pytest.approx(fair)
    in_order = arrivals(_fifo_with_rtt(FIFO_MAX_RTT_S / 2), sends)
    assert in_order[(2, 0)] == pytest.approx(ALONE_S)
    assert in_order[(2, 1)] == pytest.approx(2 * ALONE_S)


def test_messages_sent_at_one_instant_share_fairly():
    sends = [(0.0, 2, [0, 1])]
    assert arrivals(SenderFifoNetwork, sends) == pytest.approx(arrivals(FluidNetwork, sends))


def test_messages_of_different_nodes_still_share_a_receiver_fairly():
    sends = [(0.0, 0, [2]), (0.02, 1, [2])]
    assert arrivals(SenderFifoNetwork, sends) == pytest.approx(arrivals(FluidNetwork, sends))
    assert arrivals(SenderFifoNetwork, sends)[(0, 2)] == pytest.approx(2 * ALONE_S - 0.02)


def test_a_message_held_at_its_receiver_does_not_hold_the_next():
    # 0 -> 2 shares node 2's downlink with 1 -> 2, so node 0's uplink is half idle:
    # its next message (to node 3) leaves at once, as in max-min
    sends = [(0.0, 0, [2]), (0.0, 1, [2]), (0.02, 0, [3])]
    fair = arrivals(FluidNetwork, sends, n=4)
    assert arrivals(SenderFifoNetwork, sends, n=4) == pytest.approx(fair)
    # half the uplink until both messages to node 2 end at 0.2 s, then all of it
    assert fair[(0, 3)] == pytest.approx(2 * ALONE_S + (1 - 0.9) * ALONE_S, rel=1e-6)


def test_queued_batches_leave_in_the_order_they_were_sent():
    sends = [(0.0, 0, [1]), (0.01, 0, [2]), (0.02, 0, [1])]
    env = simpy.Environment()
    net = SenderFifoNetwork(env, NetworkSpec.uniform(3, RATE_BPS, 0.0))
    order: list[tuple[str, float]] = []

    def sender(at_s: float, src: int, dsts: list[int], name: str):
        yield env.timeout(at_s)
        net.send(src, dsts, MB, lambda _d, _t: order.append((name, float(env.now))))

    for k, (at_s, src, dsts) in enumerate(sends):
        env.process(sender(at_s, src, dsts, f"m{k}"))
    env.run()
    assert [name for name, _ in order] == ["m0", "m1", "m2"]
    assert [t for _, t in order] == pytest.approx([ALONE_S, 2 * ALONE_S, 3 * ALONE_S])
    assert net.batches_held == 2 and net.batches_waiting == 0


def test_the_tcp_model_keeps_its_own_terms_under_first_come_first_sent():
    params = TcpParameters()  # no slow start: the layers below
    spec = NetworkSpec.uniform(3, RATE_BPS, 0.0)
    rtt = round_trip_s(spec.latency_s, params)
    eff = effective_spec(spec, params, rtt)
    done = {}
    for fifo in (False, True):
        env = simpy.Environment()
        layers = ("tcp-core", "one-per-connection") + (("fifo",) if fifo else ())
        net = tcp_layers(FluidNetwork(env, eff), params, rtt, layers)
        times: list[float] = []

        def later(net=net, env=env, times=times):
            yield env.timeout(0.02)
            net.send(2, [1], MB, lambda _d, _t: times.append(float(env.now)))

        net.send(2, [0], MB, lambda _d, _t, env=env, times=times: times.append(float(env.now)))
        env.process(later())
        env.run()
        done[fifo] = sorted(times)
    alone_s = MB * 8 / (RATE_BPS * params.bandwidth_factor)
    assert done[True] == pytest.approx([alone_s, 2 * alone_s])
    assert done[False] == pytest.approx([2 * alone_s - 0.02, 2 * alone_s])


def test_the_tcp_preset_has_it_and_old_calibrations_with_the_switch_still_read():
    assert "fifo" in network_layers("tcp") and "fifo" not in network_layers("maxmin")
    record = HostCalibration(tcp=TcpParameters(), host="h", measured_at="2026-01-01").to_json()
    record["tcp"]["sender_fifo"] = False  # a file of before the layers
    record["measured"] = ["sender_fifo", "base_rtt_s"]
    old = HostCalibration.from_json(record)
    assert old.tcp == TcpParameters() and old.measured == ("base_rtt_s",)


def _ps_round_s(fifo: bool) -> float:
    cfg = RunConfig(cluster=ClusterConfig(workers=3),
                    network=NetworkConfig(bandwidth_bps=(RATE_BPS,)),
                    exchange=ExchangeConfig(scheme="ps", ssp=0.0, ps_mode="async"))
    setup = Setup(cfg, 250_000, ComputeModel(0.01), 16, StopRule(rounds=30, drain=False),
                  tcp=TcpParameters.ideal(),
                  network_model="tcp-core+fifo" if fifo else "tcp-core")  # 1 MB gradient
    return simulate(setup, Variant("ps", ps_servers=1)).round_time_s


def test_async_ps_workers_fall_half_a_cycle_apart_only_first_come_first_sent():
    # two workers, one server: in lockstep each push and each answer shares the
    # server's NIC (2 x 0.2 s + compute); half a cycle apart each has it alone
    lockstep = _ps_round_s(False)
    apart = _ps_round_s(True)
    assert lockstep == pytest.approx(0.01 + 4 * ALONE_S, rel=0.02)
    assert apart == pytest.approx(0.01 + 2 * ALONE_S, rel=0.02)


def test_leader_share_reads_fair_and_fifo():
    goodput = 80e6
    assert leader_share(ALONE_S, 0.02, int(MB), goodput) == pytest.approx(1.0)
    assert leader_share(2 * ALONE_S - 0.02, 0.02, int(MB), goodput) == pytest.approx(0.5)
    assert leader_share(2 * ALONE_S, 0.0, int(MB), goodput) == pytest.approx(0.5)


def test_summarise_measures_round_time_and_answer_spread():
    # two workers, 0.1 s rounds, the second 0.05 s behind: [push, answer] times
    rounds = np.arange(20) * 0.1
    a = np.stack([rounds, rounds + 0.04], axis=1)
    b = np.stack([rounds + 0.05, rounds + 0.09], axis=1)
    result = summarise("t", [a, b], start_at=0.0)
    assert result.round_time_s == pytest.approx((0.1, 0.1))
    assert result.answer_gap_s == pytest.approx((0.05,) * 20)
    assert result.overlap_fraction == pytest.approx(0.0)
