"""Network models by name: which layers each name stacks, and the simulation they go into."""

from __future__ import annotations

import numpy as np
import pytest
import simpy

from akocore.records.host_calibration import TcpParameters
from akocore.resolve import scheme_spec
from akocore.schemes import build_nodes
from akocore.settings.normalise import NETWORK_MODELS, ConfigError, network_layers
from akocore.settings.schema import NetworkConfig
from akocore.settings.toml_io import config_from_dict
from akosim.network.fluidnet import FluidNetwork
from akosim.network.layer import NetworkLayer
from akosim.network.netmodel import build_network_model
from akosim.network.netspec import NetworkSpec
from akosim.network.senderfifo import SenderFifo
from akosim.network.tcpmodel import ConnectionQueue, TcpCorrections
from akosim.planning.compute import ComputeModel
from akosim.sim.engine import Simulation, StopRule

SPEC = NetworkSpec.uniform(3, 40e6, 1e-3)


def _stack(model: object) -> list[type]:
    """The layer classes of a model, outermost first."""
    kinds = []
    while isinstance(model, NetworkLayer):
        kinds.append(type(model))
        model = model.inner
    return [*kinds, type(model)]


def test_each_name_builds_its_stack_of_layers() -> None:
    env = simpy.Environment()
    assert _stack(build_network_model(env, SPEC)) == [FluidNetwork]
    assert _stack(build_network_model(env, SPEC, model="tcp")) == [
        ConnectionQueue, TcpCorrections, SenderFifo, FluidNetwork]
    assert _stack(build_network_model(env, SPEC, model="tcp-core+slow-start")) == [
        TcpCorrections, FluidNetwork]
    assert _stack(build_network_model(env, SPEC, model="maxmin+fifo")) == [
        SenderFifo, FluidNetwork]
    assert set(NETWORK_MODELS) == {"maxmin", "tcp"}


def test_layers_stack_the_same_way_whatever_order_they_are_written_in() -> None:
    assert network_layers("fifo+one-per-connection+tcp-core") == network_layers(
        "tcp-core+one-per-connection+fifo") == ("tcp-core", "one-per-connection", "fifo")
    assert network_layers("maxmin") == () and network_layers("maxmin+fifo") == ("fifo",)


@pytest.mark.parametrize(("model", "says"), [
    ("tcp+fifo", "expected maxmin, tcp, or layers"),
    ("fifo+fifo", "appears twice"),
    ("slow-start", "only over the tcp-core layer"),
    ("", "expected maxmin, tcp"),
])
def test_a_model_that_is_not_one_is_refused_saying_what_is_allowed(model: str, says: str):
    with pytest.raises(ValueError, match=says):
        network_layers(model)
    with pytest.raises(ConfigError, match="network.model"):
        NetworkConfig(model=model)
    with pytest.raises(ValueError, match=says):
        build_network_model(simpy.Environment(), SPEC, model=model)


def test_the_tcp_core_layer_runs_the_fluid_network_on_the_effective_capacities() -> None:
    params = TcpParameters()
    model = build_network_model(simpy.Environment(), SPEC, model="tcp-core", tcp=params)
    assert np.allclose(model.spec.uplink_bps, SPEC.uplink_bps * params.bandwidth_factor)
    plain = build_network_model(simpy.Environment(), SPEC, model="maxmin+fifo", tcp=params)
    assert plain.spec is SPEC


def _nodes(workers: int) -> list:
    config = config_from_dict({"cluster": {"workers": workers},
                               "exchange": {"scheme": "ako", "ssp": 0},
                               "train": {"workload": "synthetic-cnn", "batch_size": 32}})
    return build_nodes(scheme_spec(config, (1,)), 1000, None, None)


def test_the_simulation_runs_on_the_clock_and_cpu_of_the_model_it_is_given() -> None:
    env = simpy.Environment()
    costly = TcpParameters(message_fixed_s=0.002)
    model = build_network_model(env, SPEC, model="tcp-core+message-cpu", tcp=costly)
    sim = Simulation(_nodes(3), model, ComputeModel(0.01), StopRule(rounds=3))
    assert sim.env is env and sim.net is model
    assert sim.compute.cpu is not None  # the message-cpu layer charges the ranks
    delay_only = build_network_model(simpy.Environment(), SPEC, model="tcp-core", tcp=costly)
    sim = Simulation(_nodes(3), delay_only, ComputeModel(0.01), StopRule(rounds=3))
    assert sim.compute.cpu is None
    sim.run()
    assert all(len(line.round_end_s) == 3 for line in sim.timelines.values())


def test_a_model_for_another_number_of_nodes_is_refused() -> None:
    model = build_network_model(simpy.Environment(), SPEC)
    with pytest.raises(ValueError, match="the network has 3 nodes, the scheme 4"):
        Simulation(_nodes(4), model, ComputeModel(0.01), StopRule(rounds=1))
