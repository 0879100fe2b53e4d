"""Network models by name (`--network-model`), and the one way to build one.

A model is a stack of layers (akosim.network.layer) over the max-min fluid
network (akosim.network.fluidnet), named by a preset or written out as
LAYER+LAYER+... (the names and the presets are akocore.settings.normalise's
NETWORK_LAYERS and NETWORK_PRESETS, which the settings check before anything is
simulated):

- ``maxmin`` (no layer): every NIC and pair cap shared max-min fairly among the
  messages under way, each message arriving its latency after its last byte;
- ``fifo``: a node's messages leave its NIC first come, first sent on paths
  without latency (akosim.network.senderfifo); it sits right on the fluid network;
- ``tcp-core``: the fluid network runs on the effective capacities (goodput, window)
  and deliveries arrive later by the software cost and the sharing loss
  (akosim.network.tcpmodel.TcpCorrections), which with ``slow-start`` also
  charges fresh connections their handshake and slow start (pooled: a pair's
  first messages; ``fresh-connections``: every message) and with
  ``message-cpu`` charges the software cost to the ranks' CPUs;
- ``one-per-connection``: a pair's next message waits for the previous one's
  answer (akosim.network.tcpmodel.ConnectionQueue), outermost;
- the preset ``tcp`` is tcp-core+slow-start+one-per-connection+fifo.

The numbers the layers use are a TcpParameters record (measured by `akosim
calibrate` or the defaults); which behaviours a run has is this choice alone.
`build_network_model` is what every entry point calls (akosim.sim.scenario today);
`tcp_layers` stacks the layers on a fluid network someone else built (the layer
tests, the ns-3 cross-check).
"""

from __future__ import annotations

import numpy as np
import simpy

from akocore.records.host_calibration import TcpParameters
from akocore.settings.normalise import NETWORK_LAYERS, NETWORK_MODELS, network_layers
from akosim.network.fluid import COALESCE_REL
from akosim.network.fluidnet import FluidNetwork
from akosim.network.layer import NetworkModel
from akosim.network.netspec import NetworkSpec
from akosim.network.senderfifo import SenderFifo
from akosim.network.tcpmodel import ConnectionQueue, TcpCorrections, effective_spec, round_trip_s

__all__ = ["NETWORK_LAYERS", "NETWORK_MODELS", "build_network_model", "tcp_layers", "tcp_network"]


def tcp_layers(fluid: NetworkModel, params: TcpParameters, rtt_s: np.ndarray,
               layers: tuple[str, ...]) -> NetworkModel:
    """The layers of `layers` (network_layers' order) over `fluid`, innermost first;
    `fluid` runs on the effective spec when `layers` has tcp-core."""
    net: NetworkModel = SenderFifo(fluid, rtt_s) if "fifo" in layers else fluid
    if "tcp-core" in layers:
        fresh = "fresh-connections" in layers
        net = TcpCorrections(net, params, rtt_s, slow_start=fresh or "slow-start" in layers,
                             pooled=not fresh, message_cpu="message-cpu" in layers)
    if "one-per-connection" in layers:
        net = ConnectionQueue(net, params, rtt_s)
    return net


def tcp_network(env: simpy.Environment, spec: NetworkSpec, params: TcpParameters,
                coalesce_rel: float = COALESCE_REL, *,
                model: str = "tcp-core+slow-start+one-per-connection") -> NetworkModel:
    """The network model `model` with TCP layers for the nominal `spec` (its
    latencies give the round trips)."""
    rtt_s = round_trip_s(spec.latency_s, params)
    fluid = FluidNetwork(env, effective_spec(spec, params, rtt_s), coalesce_rel)
    return tcp_layers(fluid, params, rtt_s, network_layers(model))


def build_network_model(env: simpy.Environment, spec: NetworkSpec, *, model: str = "maxmin",
                        tcp: TcpParameters | None = None,
                        rtt_latency_s: np.ndarray | None = None,
                        coalesce_rel: float = COALESCE_REL) -> NetworkModel:
    """The network model `model` (a preset of NETWORK_MODELS or LAYER+LAYER...) for
    `spec` on the clock `env`.

    `tcp`: the numbers the TCP layers use (defaults if None; unused without them);
    `rtt_latency_s`: the one-way latencies their round trips are made of, when
    `spec.latency_s` also carries a per-message software cost (default: spec's);
    `coalesce_rel`: see akosim.network.fluid. ValueError for an unknown model.
    """
    layers = network_layers(model)
    if "tcp-core" not in layers:
        return tcp_layers(FluidNetwork(env, spec, coalesce_rel=coalesce_rel),
                          TcpParameters(), np.zeros((spec.n, spec.n)), layers)
    params = tcp if tcp is not None else TcpParameters()
    rtt_s = round_trip_s(spec.latency_s if rtt_latency_s is None else rtt_latency_s, params)
    fluid = FluidNetwork(env, effective_spec(spec, params, rtt_s), coalesce_rel=coalesce_rel)
    return tcp_layers(fluid, params, rtt_s, layers)
