"""Network models by name (`--network-model`), and the one way to build one.

A model is a stack of layers (akosim.network.layer) over the max-min fluid
network (akosim.network.fluidnet):

- ``maxmin``: the fluid network alone: every NIC and pair cap shared max-min
  fairly among the messages under way, each message arriving its latency
  after its last byte left;
- ``tcp``: the TCP-aware model (akosim.network.tcpmodel) on the fluid network
  of the effective capacities (goodput, window): first come, first sent
  (akosim.network.senderfifo) when the parameters ask for it, then the TCP
  corrections (slow start, software cost, message CPU, sharing loss), then
  one message per connection (the per-pair queue) when they ask for it.

The names are akocore.settings.normalise.NETWORK_MODELS (the settings check
them before anything is simulated); this module maps each to its stack and
refuses at import a name without one.

`build_network_model` is what every entry point calls (akosim.scenario today);
`tcp_layers` stacks the TCP layers on a fluid network someone else built (the
layer tests, the ns-3 cross-check).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import simpy

from akocore.host_calibration import TcpParameters
from akocore.settings.normalise import NETWORK_MODELS
from akosim.network.fluid import COALESCE_REL
from akosim.network.fluidnet import FluidNetwork
from akosim.network.layer import NetworkModel
from akosim.network.netspec import NetworkSpec
from akosim.network.senderfifo import SenderFifo
from akosim.network.tcpmodel import ConnectionQueue, TcpCorrections, effective_spec, round_trip_s

__all__ = ["NETWORK_MODELS", "build_network_model", "tcp_layers", "tcp_network"]


def tcp_layers(fluid: NetworkModel, params: TcpParameters, rtt_s: np.ndarray, *,
               sender_fifo: bool) -> NetworkModel:
    """The TCP layers over `fluid` (built on the effective spec): first come, first
    sent if `sender_fifo`, the corrections, one message per connection if the
    parameters ask for it; outermost last."""
    net: NetworkModel = SenderFifo(fluid) if sender_fifo else fluid
    net = TcpCorrections(net, params, rtt_s)
    if params.one_message_per_connection:
        net = ConnectionQueue(net, params, rtt_s)
    return net


def tcp_network(env: simpy.Environment, spec: NetworkSpec, params: TcpParameters,
                coalesce_rel: float = COALESCE_REL, *,
                sender_fifo: bool = False) -> NetworkModel:
    """The TCP-aware network for the nominal `spec` (its latencies give the round
    trips): (a) and (b) applied to its capacities, the layers above."""
    rtt_s = round_trip_s(spec.latency_s, params)
    fluid = FluidNetwork(env, effective_spec(spec, params, rtt_s), coalesce_rel)
    return tcp_layers(fluid, params, rtt_s, sender_fifo=sender_fifo)


def _maxmin(env: simpy.Environment, spec: NetworkSpec, tcp: TcpParameters | None,
            rtt_latency_s: np.ndarray | None, coalesce_rel: float) -> NetworkModel:
    return FluidNetwork(env, spec, coalesce_rel=coalesce_rel)


def _tcp(env: simpy.Environment, spec: NetworkSpec, tcp: TcpParameters | None,
         rtt_latency_s: np.ndarray | None, coalesce_rel: float) -> NetworkModel:
    params = tcp if tcp is not None else TcpParameters()
    rtt_s = round_trip_s(spec.latency_s if rtt_latency_s is None else rtt_latency_s, params)
    fluid = FluidNetwork(env, effective_spec(spec, params, rtt_s), coalesce_rel=coalesce_rel)
    return tcp_layers(fluid, params, rtt_s, sender_fifo=params.sender_fifo)


_Builder = Callable[[simpy.Environment, NetworkSpec, TcpParameters | None, np.ndarray | None,
                     float], NetworkModel]
_BUILDERS: dict[str, _Builder] = {"maxmin": _maxmin, "tcp": _tcp}
if set(_BUILDERS) != set(NETWORK_MODELS):  # one list of names, checked where both meet
    raise ImportError(f"network models {sorted(NETWORK_MODELS)} (settings) and "
                      f"{sorted(_BUILDERS)} (akosim.network.netmodel) differ")


def build_network_model(env: simpy.Environment, spec: NetworkSpec, *, model: str = "maxmin",
                        tcp: TcpParameters | None = None,
                        rtt_latency_s: np.ndarray | None = None,
                        coalesce_rel: float = COALESCE_REL) -> NetworkModel:
    """The network model `model` (one of NETWORK_MODELS) for `spec` on the clock `env`.

    `tcp`: the TCP-aware model's parameters (defaults if None; only ``tcp`` reads
    them); `rtt_latency_s`: the one-way latencies its round trips are made of, when
    `spec.latency_s` also carries a per-message software cost (default: spec's);
    `coalesce_rel`: see akosim.network.fluid.
    """
    builder = _BUILDERS.get(model)
    if builder is None:
        raise ValueError(f"network model {model!r}: expected one of {', '.join(NETWORK_MODELS)}")
    return builder(env, spec, tcp, rtt_latency_s, coalesce_rel)
