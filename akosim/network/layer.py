"""The NetworkModel protocol the engine drives, and the base of every layer over one.

A network model carries messages between the nodes of its `spec` on the SimPy
clock `env`: `send` starts a batch of messages and calls back as they arrive;
`stats` and the counters report what it carried; `on_transfer_end` lets a layer
hear when transfers end (their last byte left); `with_cpu` hands the engine the
compute model the network charges (message CPU of the ranks), or the one given.
akosim.network.fluidnet.FluidNetwork (max-min fluid sharing) is the model every
other one is built on.

A behaviour the fluid model lacks is a `NetworkLayer`: it wraps an inner model,
overrides `send` (and, where it must, `with_cpu`) and delegates everything else,
so behaviours combine by stacking (akosim.network.netmodel builds the stacks),
never by inheritance.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np
import simpy

from akosim.network.netspec import NetworkSpec
from akosim.network.netstats import NetworkStats, NetworkUtilisation
from akosim.planning.compute import ComputeModel

DeliveryCallback = Callable[[np.ndarray, Any], None]
TransferListener = Callable[[np.ndarray, np.ndarray], None]

__all__ = ["DeliveryCallback", "NetworkLayer", "NetworkModel", "TransferListener"]


class NetworkModel(Protocol):
    """What the engine and its reports need of a simulated network."""

    env: simpy.Environment
    spec: NetworkSpec  # the capacities the model shares (a TCP model's effective ones)

    def send(self, src: int, dsts: np.ndarray | Sequence[int],
             size_bytes: int | float | np.ndarray, on_delivered: DeliveryCallback,
             token: object = None) -> None:
        """Start one message from `src` to each of `dsts` now; call
        `on_delivered(dsts_arrived, token)` for each group that arrives together."""
        ...

    def on_transfer_end(self, listener: TransferListener) -> None:
        """Call `listener(src, dst)` whenever transfers end (before they arrive)."""
        ...

    def with_cpu(self, compute: ComputeModel) -> ComputeModel:
        """`compute` charged with what this network costs the ranks' CPUs, or as it is."""
        ...

    def stats(self, elapsed_s: float | None = None) -> NetworkStats: ...

    def utilisation(self, elapsed_s: float | None = None) -> NetworkUtilisation: ...

    def rates_bps(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...

    @property
    def rate_solves(self) -> int: ...

    @property
    def flow_completions(self) -> int: ...


class NetworkLayer:
    """One behaviour over an inner network model: `send` passes through unless a
    subclass changes it; everything else is the inner model's."""

    def __init__(self, inner: NetworkModel) -> None:
        self.inner = inner
        self.env = inner.env
        self.spec = inner.spec

    def send(self, src: int, dsts: np.ndarray | Sequence[int],
             size_bytes: int | float | np.ndarray, on_delivered: DeliveryCallback,
             token: object = None) -> None:
        self.inner.send(src, dsts, size_bytes, on_delivered, token)

    def on_transfer_end(self, listener: TransferListener) -> None:
        self.inner.on_transfer_end(listener)

    def with_cpu(self, compute: ComputeModel) -> ComputeModel:
        return self.inner.with_cpu(compute)

    def stats(self, elapsed_s: float | None = None) -> NetworkStats:
        return self.inner.stats(elapsed_s)

    def utilisation(self, elapsed_s: float | None = None) -> NetworkUtilisation:
        return self.inner.utilisation(elapsed_s)

    def rates_bps(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.inner.rates_bps()

    @property
    def rate_solves(self) -> int:
        return self.inner.rate_solves

    @property
    def flow_completions(self) -> int:
        return self.inner.flow_completions
