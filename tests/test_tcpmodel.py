"""The TCP-aware flow model (akosim.network.tcpmodel): max-min when its corrections are off,
and its goodput, window, slow-start and software terms on hand-computed cases."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from akocore.records.host_calibration import HostCalibration, TcpParameters, wire_goodput_fraction
from akocore.records.jsonrecord import RecordError
from akocore.settings.normalise import network_layers
from akocore.settings.schema import ClusterConfig, ExchangeConfig, NetworkConfig, RunConfig
from akosim.network.fluidnet import FluidNetwork
from akosim.network.layer import NetworkModel
from akosim.network.netmodel import tcp_layers
from akosim.network.netspec import NetworkSpec
from akosim.network.rank_cpu import RankCpu
from akosim.network.tcpmodel import effective_spec, round_trip_s, slow_start_extra_s
from akosim.planning.compute import ComputeModel
from akosim.sim.engine import StopRule
from akosim.sim.scenario import Setup, Variant, ako_variant, simulate

WARM = TcpParameters()  # with WARM_MODEL (no slow start): goodput and window only
WARM_MODEL = "tcp-core+one-per-connection"
DIRECT = "tcp-core+slow-start+one-per-connection"  # the TCP layers, not first come first sent


def _tcp_network(env: simpy.Environment, spec: NetworkSpec, params: TcpParameters,
                 rtt_s: np.ndarray, model: str = DIRECT) -> NetworkModel:
    """The layers of `model` over a fluid network on `spec` (the effective spec)."""
    return tcp_layers(FluidNetwork(env, spec), params, rtt_s, network_layers(model))


def one_message_s(spec: NetworkSpec, size_bytes: float, params: TcpParameters | None,
                  messages: int = 1, model: str = DIRECT) -> list[float]:
    """Arrival time of each of `messages` sent 0 -> 1 one after the other."""
    env = simpy.Environment()
    if params is None:
        net: FluidNetwork = FluidNetwork(env, spec)
    else:
        rtt = round_trip_s(spec.latency_s, params)
        net = _tcp_network(env, effective_spec(spec, params, rtt), params, rtt, model)
    arrivals: list[float] = []

    def arrived(_dests: np.ndarray, _token: object) -> None:
        arrivals.append(float(env.now))
        if len(arrivals) < messages:
            net.send(0, [1], size_bytes, arrived)

    net.send(0, [1], size_bytes, arrived)
    env.run()
    return arrivals


# ------------------------------------------------------------------ max-min when off


def _run(cfg: RunConfig, tcp: TcpParameters | None, p: tuple[int, ...], scheme: str,
         model: str | None = None):
    setup = Setup(cfg, 60_000, ComputeModel(0.01, speed_factors=(1.0, 1.5)), 16,
                  StopRule(rounds=6, drain=False), tcp=tcp, network_model=model)
    variant = ako_variant(setup, p=p) if scheme == "ako" else Variant(scheme, ps_servers=1)
    return simulate(setup, variant)


@settings(max_examples=12, deadline=None)
@given(workers=st.integers(3, 6),
       rates=st.lists(st.sampled_from([5e6, 20e6, 100e6]), min_size=1, max_size=3),
       latency=st.sampled_from([0.0, 1e-4, 0.02]),
       p=st.integers(1, 3), scheme=st.sampled_from(["ako", "ps", "allreduce"]))
def test_tcp_model_with_every_correction_off_is_max_min(workers, rates, latency, p, scheme):
    cfg = RunConfig(cluster=ClusterConfig(workers=workers),
                    network=NetworkConfig(bandwidth_bps=tuple(rates), latency_s=(latency,)),
                    exchange=ExchangeConfig(scheme=scheme, p=(p,)))
    plain = _run(cfg, None, (p,), scheme)
    ideal = _run(cfg, TcpParameters.ideal(), (p,), scheme, "tcp-core")  # that layer alone
    assert ideal.round_time_s == plain.round_time_s
    assert ideal.simulated_s == plain.simulated_s
    assert ideal.bytes_sent_per_worker_per_round == plain.bytes_sent_per_worker_per_round


def test_ideal_parameters_leave_the_spec_as_it_is():
    spec = NetworkSpec.uniform(4, 40e6, 0.02)
    same = effective_spec(spec, TcpParameters.ideal())
    for name in ("uplink_bps", "downlink_bps", "link_bps", "latency_s"):
        np.testing.assert_array_equal(getattr(same, name), getattr(spec, name))


# ------------------------------------------------------------------ (a) goodput


def test_goodput_fraction_is_frame_arithmetic():
    # 1448 B of payload per 1514 B frame; one 66 B ACK per two frames the other way
    expected = (1448 / 1514) / (1 + 66 / (2 * 1514))
    assert TcpParameters().bandwidth_factor == pytest.approx(expected, rel=1e-12)
    assert expected == pytest.approx(0.9360, abs=1e-4)
    assert wire_goodput_fraction(1448, 0, 0, 2) == 1.0
    measured = replace(TcpParameters(), measured_goodput_fraction=0.95)
    assert measured.bandwidth_factor == 0.95


def test_goodput_slows_a_transfer_by_exactly_the_factor():
    spec = NetworkSpec.uniform(2, 10e6, 0.001)
    size = 2e6
    factor = TcpParameters().bandwidth_factor
    (plain,) = one_message_s(spec, size, None)
    (tcp,) = one_message_s(spec, size, WARM, model=WARM_MODEL)
    assert plain == pytest.approx(size * 8 / 10e6 + 0.001, rel=1e-9)
    assert tcp == pytest.approx(size * 8 / (10e6 * factor) + 0.001, rel=1e-9)


# ------------------------------------------------------------------ (b) window


def test_window_bounds_a_long_fat_pair_to_window_over_rtt():
    spec = NetworkSpec.uniform(2, 1e9, 0.05)  # RTT 100 ms
    params = replace(WARM, window_bytes=2**20, header_bytes=0, ack_bytes=0)
    cap_bps = 2**20 * 8 / 0.1  # 83.9 Mbit/s, far below 1 Gbit/s
    assert effective_spec(spec, params).link_bps[0, 1] == pytest.approx(cap_bps)
    (tcp,) = one_message_s(spec, 10e6, params, model=WARM_MODEL)
    assert tcp == pytest.approx(10e6 * 8 / cap_bps + 0.05, rel=1e-9)


def test_window_does_not_bind_on_a_short_pair():
    spec = effective_spec(NetworkSpec.uniform(2, 40e6, 1e-4), WARM)
    assert math.isclose(spec.uplink_bps[0], 40e6 * WARM.bandwidth_factor)
    assert spec.link_bps[0, 1] == pytest.approx(4 * 2**20 * 8 / 2e-4)  # 168 Gbit/s: loose


# ------------------------------------------------------------------ (c) slow start


def test_slow_start_extra_on_hand_computed_cases():
    iw, rate, rtt = 14480.0, 10e6, 0.1  # BDP 125 kB: 4 rounds below it carry 217.2 kB
    # a long transfer leaves slow start: 4 RTT - 217200 B at 10 Mbit/s
    assert slow_start_extra_s(1e6, rate, rtt, iw) == pytest.approx(0.4 - 0.17376)
    # 50 kB fits in 3 rounds (14.48 + 28.96 + the rest): 2 RTT - 43440 B at the rate
    assert slow_start_extra_s(50e3, rate, rtt, iw) == pytest.approx(0.2 - 0.034752)
    # one window's worth: no ramp
    assert slow_start_extra_s(10e3, rate, rtt, iw) == 0.0
    # the initial window already covers the BDP (fast, short path): nothing to ramp
    assert slow_start_extra_s(1e6, 1e6, 0.01, iw) == 0.0
    assert slow_start_extra_s(0.0, rate, rtt, iw) == 0.0
    assert slow_start_extra_s(1e6, math.inf, rtt, iw) == 0.0


def test_slow_start_extra_grows_with_latency_and_is_never_negative():
    sizes = np.array([1e4, 1e5, 5e5, 2e6, 8e6])
    short = slow_start_extra_s(sizes, 40e6, 0.0002, 14480)
    long = slow_start_extra_s(sizes, 40e6, 0.04, 14480)
    assert (short >= 0).all() and (long >= short).all() and long.max() > 0.1


def test_fresh_connection_pays_handshake_and_ramp_then_stays_warm():
    spec = NetworkSpec.uniform(2, 10e6, 0.05)  # RTT 100 ms
    # (e) off: the next message leaves on arrival, not when the answer is back
    params = replace(TcpParameters(), header_bytes=0, ack_bytes=0, connections_per_pair=1)
    size = 1e6
    first, second = one_message_s(spec, size, params, messages=2, model="tcp-core+slow-start")
    fluid_s = size * 8 / 10e6 + 0.05
    ramp = 0.1 + (0.4 - 0.17376)  # one SYN round trip + the case above
    assert first == pytest.approx(fluid_s + ramp, rel=1e-9)
    assert second - first == pytest.approx(fluid_s, rel=1e-9)  # warm: no ramp again
    first, second = one_message_s(spec, size, params, messages=2,
                                  model="tcp-core+fresh-connections")
    assert second - first == pytest.approx(fluid_s + ramp, rel=1e-9)


def test_slow_start_uses_the_rate_the_message_got():
    # two senders share node 2's downlink: each message gets 5 Mbit/s, not 10
    spec = NetworkSpec.uniform(3, 10e6, 0.05)
    params = replace(TcpParameters(), header_bytes=0, ack_bytes=0, handshake_rtts=0.0)
    env = simpy.Environment()
    rtt = round_trip_s(spec.latency_s, params)
    net = _tcp_network(env, effective_spec(spec, params, rtt), params, rtt)
    arrivals: list[float] = []
    for src in (0, 1):
        net.send(src, [2], 1e6, lambda _d, _t: arrivals.append(float(env.now)))
    env.run()
    shared_s = 1e6 * 8 / 5e6 + 0.05
    assert arrivals == pytest.approx([shared_s + float(slow_start_extra_s(1e6, 5e6, 0.1,
                                                                          14480))] * 2)


# ------------------------------------------------------------------ (d) software


def test_software_cost_delays_every_message_by_fixed_plus_per_byte():
    spec = NetworkSpec.uniform(2, 10e6, 0.001)
    params = replace(WARM, header_bytes=0, ack_bytes=0, message_fixed_s=0.002,
                     message_per_byte_s=1e-9)
    arrivals = one_message_s(spec, 1e6, params, messages=3, model="tcp-core")
    each = 1e6 * 8 / 10e6 + 0.001 + 0.002 + 1e-3
    assert np.diff([0.0, *arrivals]) == pytest.approx([each] * 3, rel=1e-9)


# ------------------------------------------------------------------ (e) one message per connection


def _arrivals(net: FluidNetwork, env: simpy.Environment,
              sends: list[tuple[int, list[int], float]]) -> dict[tuple[int, int], list[float]]:
    """Arrival times per (src, dst) of `sends`, all handed to the network at time 0."""
    arrivals: dict[tuple[int, int], list[float]] = {}
    for src, dsts, size in sends:
        def arrived(dests: np.ndarray, _token: object, src: int = src) -> None:
            for dst in dests.tolist():
                arrivals.setdefault((src, dst), []).append(float(env.now))
        net.send(src, dsts, size, arrived)
    env.run()
    return arrivals


def test_a_pairs_messages_cross_its_connection_one_at_a_time_in_order():
    spec = NetworkSpec.uniform(3, 10e6, 0.0)
    params = replace(WARM, header_bytes=0, ack_bytes=0)  # one connection per pair
    env = simpy.Environment()
    rtt = round_trip_s(spec.latency_s, params)
    net = _tcp_network(env, effective_spec(spec, params, rtt), params, rtt,
                       WARM_MODEL)
    # two messages 0 -> 1 at once, and one 0 -> {1, 2} (multicast) behind them
    got = _arrivals(net, env, [(0, [1], 1e6), (0, [1], 1e6), (0, [1, 2], 1e6)])
    one_s = 1e6 * 8 / 10e6
    # 0 -> 1 carries its three in turn; 0 -> 2 starts at once and shares 0's uplink
    # with the first two 0 -> 1 messages: 0.8 s alone, 1.6 s at half the uplink
    assert got[0, 1] == pytest.approx([2 * one_s, 3 * one_s, 4 * one_s], rel=1e-9)
    assert got[0, 2] == pytest.approx([2 * one_s], rel=1e-9)
    fluid = FluidNetwork(simpy.Environment(), spec)
    shared = _arrivals(fluid, fluid.env, [(0, [1], 1e6), (0, [1], 1e6), (0, [1, 2], 1e6)])
    assert shared[0, 1] == pytest.approx([4 * one_s] * 3, rel=1e-9)  # max-min: together


def test_the_next_message_waits_for_the_answer_to_come_back():
    spec = NetworkSpec.uniform(2, 10e6, 0.05)
    params = replace(WARM, header_bytes=0, ack_bytes=0)
    env = simpy.Environment()
    rtt = round_trip_s(spec.latency_s, params)
    net = _tcp_network(env, effective_spec(spec, params, rtt), params, rtt,
                       WARM_MODEL)
    got = _arrivals(net, env, [(0, [1], 1e6), (0, [1], 1e6)])
    one_s = 1e6 * 8 / 10e6 + 0.05
    assert got[0, 1] == pytest.approx([one_s, 2 * one_s + 0.05], rel=1e-9)


# ------------------------------------------------------------------ (f) message CPU


def test_rank_cpu_charges_a_busy_rank_and_forgives_an_idle_one():
    env = simpy.Environment()
    cpu = RankCpu(env, 3)
    cpu.charge_each([0, 1], [0.004, 0.004])  # nobody computes: handled while idle
    assert cpu.charged_s == [0.0, 0.0, 0.0]
    cpu.begin_step(1)
    cpu.charge_each([0, 1], [0.004, 0.003])
    assert cpu.settle(1, 0.001) == 0.003  # owed at the end of its step, then cleared
    cpu.charge(1, 0.002)  # during its overhead and the owed CPU: busy still
    assert cpu.settle(1, 0.0) == 0.002 and cpu.settle(0, 0.0) == 0.0


def _cpu_bound_round_s(tcp: TcpParameters, model: str) -> float:
    """Two Ako workers, p = 1, a fast network and a loose gate: the CPU decides."""
    cfg = RunConfig(cluster=ClusterConfig(workers=2),
                    network=NetworkConfig(bandwidth_bps=(10e9,), latency_s=(0.0,)),
                    exchange=ExchangeConfig(p=(1,), ssp=50))
    setup = Setup(cfg, 1000, ComputeModel(0.010), 16, StopRule(rounds=40, drain=False),
                  tcp=tcp, network_model=model)
    run = simulate(setup, ako_variant(setup))
    assert run.round_time_s is not None
    return run.round_time_s


def test_message_cpu_is_serialised_with_the_step_of_a_busy_rank():
    """Each round a rank sends one message and receives one while it computes: with a
    2 ms cost per message (1 ms each side) its round is the 10 ms step plus 2 ms; as a
    delay only, the step alone."""
    costly = replace(WARM, message_fixed_s=0.002, measured_goodput_fraction=1.0)
    model = WARM_MODEL + "+fifo"
    assert _cpu_bound_round_s(costly, model + "+message-cpu") == pytest.approx(0.012, rel=0.02)
    assert _cpu_bound_round_s(costly, model) == pytest.approx(0.010, rel=0.02)


# ------------------------------------------------------------------ (g) flow sharing


def test_sharing_efficiency_of_k_flows_delays_their_messages():
    spec = NetworkSpec.uniform(3, 10e6, 0.0)
    params = replace(WARM, header_bytes=0, ack_bytes=0,
                     flow_sharing_efficiency=(1.0, 0.8))
    assert params.sharing_efficiency(1) == 1.0 and params.sharing_efficiency(5) == 0.8
    env = simpy.Environment()
    rtt = round_trip_s(spec.latency_s, params)
    net = _tcp_network(env, effective_spec(spec, params, rtt), params, rtt,
                       WARM_MODEL)
    got = _arrivals(net, env, [(0, [1, 2], 1e6)])  # one send, two flows: 1.6 s fluid
    assert got[0, 1] == pytest.approx([1.6 / 0.8]) and got[0, 2] == pytest.approx([2.0])
    env = simpy.Environment()
    net = _tcp_network(env, effective_spec(spec, params, rtt), params, rtt,
                       WARM_MODEL)
    alone = _arrivals(net, env, [(0, [1], 1e6)])  # one flow: as the fluid model
    assert alone[0, 1] == pytest.approx([0.8])


def test_only_the_flows_one_send_starts_together_are_charged():
    """Two senders into node 2's downlink at the same instant share it as the fluid
    model shares it (1.6 s each): they start together only by the model's timing."""
    spec = NetworkSpec.uniform(3, 10e6, 0.0)
    params = replace(WARM, header_bytes=0, ack_bytes=0, flow_sharing_efficiency=(1.0, 0.5))
    env = simpy.Environment()
    rtt = round_trip_s(spec.latency_s, params)
    net = _tcp_network(env, effective_spec(spec, params, rtt), params, rtt,
                       WARM_MODEL)
    got = _arrivals(net, env, [(0, [2], 1e6), (1, [2], 1e6)])
    assert got[0, 2] == pytest.approx([1.6]) and got[1, 2] == pytest.approx([1.6])


def test_sharing_efficiencies_must_be_fractions():
    with pytest.raises(ValueError, match="flow_sharing_efficiency"):
        TcpParameters(flow_sharing_efficiency=(1.0, 1.2))
    assert TcpParameters.ideal().flow_sharing_efficiency == ()
    assert "message-cpu" not in network_layers("tcp")  # a free core: a delay only


# ------------------------------------------------------------------ the record


def test_host_calibration_round_trips_and_refuses_other_versions():
    record = HostCalibration(tcp=replace(TcpParameters(), base_rtt_s=2e-5),
                             host="h", measured_at="2026-01-01T00:00:00+00:00",
                             measured=("base_rtt_s",))
    data = record.to_json()
    assert data["schema_version"] == 1 and data["kind"] == "host-calibration"
    assert HostCalibration.from_json(data) == record
    with pytest.raises(RecordError, match="schema_version"):
        HostCalibration.from_json({**data, "schema_version": 99})
    with pytest.raises(RecordError, match="tcp.window_bytes"):
        HostCalibration.from_json({**data, "tcp": {**data["tcp"], "window_bytes": "x"}})
    with pytest.raises(ValueError, match="not a TcpParameters field"):
        HostCalibration(tcp=TcpParameters(), host="h", measured_at="", measured=("nope",))
    with pytest.raises(ValueError, match="initial_window_segments"):
        TcpParameters(initial_window_segments=0)
