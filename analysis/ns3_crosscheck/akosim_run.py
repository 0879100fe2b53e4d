"""The akosim side of the cross-check: a `Pattern` on akosim's network models.

`run_akosim(pattern, model)` plays the pattern's message graph on a SimPy
clock over a network built by the named model and returns each message's
arrival time. A model is a factory `(env, NetworkSpec) -> network` whose
network has `FluidNetwork.send`'s signature; `"maxmin"` (akosim.network.fluidnet's
pure max-min fluid model) is built in. Another model (for example the
TCP-aware one) joins by name with `register_model(name, factory)` and is then
run by `python -m analysis.ns3_crosscheck run --model NAME`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np
import simpy

from akosim.network.fluidnet import FluidNetwork
from akosim.network.netspec import NetworkSpec
from analysis.ns3_crosscheck.ns3_run import DEFAULT_TCP
from analysis.ns3_crosscheck.ns3_scenario import Pattern


class MessageNetwork(Protocol):
    """What the runner needs of a network: akosim.network.fluidnet.FluidNetwork.send."""

    def send(self, src: int, dsts: np.ndarray | Sequence[int],
             size_bytes: int | float | np.ndarray,
             on_delivered: Callable[[np.ndarray, Any], None], token: object = None) -> None: ...


NetworkFactory = Callable[[simpy.Environment, NetworkSpec], MessageNetwork]

def ns3_matched_tcp(env: simpy.Environment, spec: NetworkSpec) -> MessageNetwork:
    """akosim's TCP-aware model (akosim.network.tcpmodel) with the TCP settings the ns-3 runs
    use: the window is ns-3's 128 KiB socket buffer, a point-to-point frame adds PPP 2 +
    IPv4 20 + TCP 32 bytes, one connection per pair opened with the first message (its
    handshake and slow start paid), no host stack time and no software cost."""
    from akocore.records.host_calibration import TcpParameters
    from akosim.network.netmodel import tcp_network

    params = TcpParameters(window_bytes=float(DEFAULT_TCP.buffer_bytes),
                           mss_bytes=DEFAULT_TCP.segment_bytes, header_bytes=54,
                           ack_bytes=54, connections_per_pair=1)
    return tcp_network(env, spec, params)


MODELS: dict[str, NetworkFactory] = {"maxmin": FluidNetwork, "tcp": ns3_matched_tcp}


def register_model(name: str, factory: NetworkFactory) -> None:
    """Make `factory` available to the cross-check as model `name`."""
    if not name or not name.replace("-", "").replace("_", "").isalnum():
        raise ValueError(f"model name must be a plain word, got {name!r}")
    MODELS[name] = factory


def network_spec(pattern: Pattern) -> NetworkSpec:
    """The star as akosim sees it: each host's NIC at the link rate, one latency."""
    star = pattern.star
    return NetworkSpec.uniform(star.hosts, star.rate_bps, star.latency_s)


def run_akosim(pattern: Pattern, model: str = "maxmin") -> tuple[float, ...]:
    """Arrival time (s) of every message of `pattern` on akosim's model `model`."""
    if model not in MODELS:
        raise ValueError(f"unknown akosim model {model!r}; known: {sorted(MODELS)}")
    env = simpy.Environment()
    network = MODELS[model](env, network_spec(pattern))
    messages = pattern.messages
    waiting = [len(message.after) for message in messages]
    dependents: list[list[int]] = [[] for _ in messages]
    for index, message in enumerate(messages):
        for before in message.after:
            dependents[before].append(index)
    arrived_s = [float("nan")] * len(messages)

    def send(index: int, _event: simpy.Event | None = None) -> None:
        message = messages[index]
        network.send(message.src, [message.dst], message.size_bytes, arrive, index)

    def release(index: int) -> None:
        gap_s = messages[index].gap_s
        if gap_s > 0:
            env.timeout(gap_s).callbacks.append(lambda event: send(index, event))
        else:
            send(index)

    def arrive(_dsts: np.ndarray, token: Any) -> None:
        index = int(token)
        arrived_s[index] = float(env.now)
        for after in dependents[index]:
            waiting[after] -= 1
            if waiting[after] == 0:
                release(after)

    def start(_event: simpy.Event) -> None:
        for index, count in enumerate(waiting):
            if count == 0:
                release(index)

    env.timeout(0).callbacks.append(start)
    env.run()
    if any(np.isnan(arrived_s)):
        raise RuntimeError(f"{pattern.name}: some messages never arrived on model {model!r}")
    return tuple(arrived_s)
