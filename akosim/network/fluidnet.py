"""The simulated network on a SimPy clock: a thin adapter over akosim.network.fluid.

`FluidNetwork` is the max-min network model (akosim.network.layer.NetworkModel)
every other model is layered on. It owns the SimPy side only: it takes `send` calls at `env.now`,
keeps one pending wake-up at the next event of the clock-free fluid model
(akosim.network.fluid.FluidFlows), delivers each group of messages by one SimPy
timeout after its latency (at once when that is zero: the wake-up runs last
at its instant) and tells each batch's sender, and feeds the
traffic counters (akosim.network.netstats). It uses SimPy's public API only
(`env.timeout`, `env.peek`, `env.now`, event callbacks).

Every send made at one instant joins one rate solve: the wake-up runs only
once nothing else is scheduled at its instant (it defers itself by a
zero-delay timeout while `env.peek()` still shows the same instant).

Related modules: akosim.network.netspec (what the network is), akosim.network.maxmin (the
sharing rule), akosim.network.fluid (flows and rates), akosim.network.netstats (counters).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import numpy as np
import simpy

from akosim.network.fluid import COALESCE_REL, Delivery, FluidFlows, check_send
from akosim.network.layer import DeliveryCallback, TransferListener
from akosim.network.netspec import NetworkSpec
from akosim.network.netstats import NetworkStats, NetworkUtilisation, TrafficCounters
from akosim.planning.compute import ComputeModel

__all__ = ["DeliveryCallback", "FluidNetwork"]


class _Batch:
    """One `send` call: who to tell when its messages arrive."""

    __slots__ = ("on_delivered", "token", "outstanding")

    def __init__(self, on_delivered: DeliveryCallback, token: object, count: int):
        self.on_delivered = on_delivered
        self.token = token
        self.outstanding = count


class FluidNetwork:
    """Carries messages between the nodes of `spec` on the SimPy clock `env`.

    `send` starts a batch of flows from one node; the network calls back when
    they are delivered. One pending wake-up (re-armed whenever a send or a
    completion changes the next event) drives everything: no SimPy process per
    flow, no per-packet events. Every message whose transfer ends at one
    wake-up and that shares a latency is delivered by one SimPy timeout (none
    for zero latency), whatever the number of batches.
    """

    def __init__(self, env: simpy.Environment, spec: NetworkSpec,
                 coalesce_rel: float = COALESCE_REL) -> None:
        self.env = env
        self.spec = spec
        self.coalesce_rel = coalesce_rel
        self._flows = FluidFlows(spec, coalesce_rel)
        self._counters = TrafficCounters(spec, float(env.now))
        self._batches: dict[int, _Batch] = {}
        self._next_batch = 0
        self._wake: simpy.Event | None = None
        self._wake_s = np.inf
        self._transfer_listeners: list[TransferListener] = []

    # ------------------------------------------------------------------ API

    def on_transfer_end(self, listener: TransferListener) -> None:
        """Call `listener(src, dst)` (aligned arrays) whenever transfers end (their last
        byte left; they arrive after their latency), before their deliveries."""
        self._transfer_listeners.append(listener)

    def send(
        self,
        src: int,
        dsts: np.ndarray | Sequence[int],
        size_bytes: int | float | np.ndarray,
        on_delivered: DeliveryCallback,
        token: object = None,
    ) -> None:
        """Start one flow from `src` to each of `dsts` at `env.now`.

        `size_bytes` is one size for all or one per destination. When some of
        the messages arrive (transfer finished, then `latency_s[src, dst]`),
        calls `on_delivered(delivered_dsts, token)`: once per group of this
        batch delivered at the same instant (`delivered_dsts` is read-only).
        Zero-byte messages use no bandwidth and arrive after the latency alone.
        """
        src, dst, sizes = check_send(self.spec.n, src, dsts, size_bytes)
        count = dst.shape[0]
        if count == 0:
            return
        batch_id = self._next_batch
        self._next_batch += 1
        self._batches[batch_id] = _Batch(on_delivered, token, count)
        queued, immediate = self._flows.start(src, dst, sizes, batch_id)
        for delivery in immediate:
            self._deliver_after(delivery)
        if queued:
            now = float(self.env.now)
            if now < self._wake_s:
                self._arm(now)

    def with_cpu(self, compute: ComputeModel) -> ComputeModel:
        """The fluid model costs the ranks no CPU: `compute` as it is."""
        return compute

    @property
    def rate_solves(self) -> int:
        return self._flows.rate_solves

    @property
    def local_solves(self) -> int:
        """Solves limited to the flows connected to a change."""
        return self._flows.local_solves

    @property
    def flow_completions(self) -> int:
        return self._flows.flow_completions

    @property
    def messages_delivered(self) -> int:
        return self._counters.messages_delivered

    @property
    def active_flows(self) -> int:
        """Flows started and not yet finished (pending starts included)."""
        return self._flows.active_flows

    @property
    def bytes_sent(self) -> np.ndarray:
        """Per node: bytes of its flows whose transfer has finished."""
        return self._counters.bytes_sent

    @property
    def bytes_received(self) -> np.ndarray:
        """Per node: bytes delivered to it (after latency)."""
        return self._counters.bytes_received

    @property
    def link_bytes(self) -> np.ndarray:
        """(n, n): bytes delivered from i to j."""
        return self._counters.link_bytes

    @property
    def uplink_busy_s(self) -> np.ndarray:
        """Per node: time its uplink carried at least one flow."""
        return self._flows.nic_busy_s(float(self.env.now))[:self.spec.n]

    @property
    def downlink_busy_s(self) -> np.ndarray:
        """Per node: time its downlink carried at least one flow."""
        return self._flows.nic_busy_s(float(self.env.now))[self.spec.n:]

    def utilisation(self, elapsed_s: float | None = None) -> NetworkUtilisation:
        """Bits carried by each uplink and downlink / (capacity * elapsed_s).

        `elapsed_s` defaults to the time since the network was created.
        """
        now = float(self.env.now)
        return self._counters.utilisation(now, self._flows.nic_carried_bits(now), elapsed_s)

    def stats(self, elapsed_s: float | None = None) -> NetworkStats:
        """A snapshot of every counter (arrays are copies)."""
        now = float(self.env.now)
        return self._counters.snapshot(
            now, elapsed_s, carried_bits=self._flows.nic_carried_bits(now),
            busy_s=self._flows.nic_busy_s(now), rate_solves=self.rate_solves,
            flow_completions=self.flow_completions, active_flows=self.active_flows)

    def rates_bps(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(src, dst, rate) of the flows in flight at the last rate solve."""
        return self._flows.rates_bps()

    # ------------------------------------------------------------- machinery

    def _arm(self, at_s: float) -> None:
        """Make sure the network wakes up no later than `at_s`."""
        if at_s < self._wake_s:
            self._wake_s = at_s
            self._schedule_wake(max(at_s - float(self.env.now), 0.0))

    def _schedule_wake(self, delay_s: float) -> None:
        wake = self.env.timeout(delay_s)
        wake.callbacks.append(self._on_wake)
        self._wake = wake

    def _on_wake(self, event: simpy.Event) -> None:
        if event is not self._wake:
            return  # superseded by an earlier wake-up
        now = float(self.env.now)
        if self.env.peek() <= now:
            # Something else happens at this instant (it may send): go after it.
            self._schedule_wake(0.0)
            return
        self._wake = None
        self._wake_s = np.inf
        deliveries, next_s = self._flows.advance(now)
        if next_s < np.inf:
            self._arm(next_s)
        for delivery in deliveries:
            self._counters.add_sent(delivery.src, delivery.size_bytes)
        for listener in self._transfer_listeners:
            for delivery in deliveries:
                listener(delivery.src, delivery.dst)
        # Nothing else is scheduled at this instant (see above), so messages that
        # arrive now are handed over at once: in the order their timeouts would run.
        for delivery in deliveries:
            if delivery.latency_s == 0.0:
                self._deliver(delivery)
            else:
                self._deliver_after(delivery)

    def _deliver_after(self, delivery: Delivery) -> None:
        timeout = self.env.timeout(delivery.latency_s)
        timeout.callbacks.append(partial(self._deliver, delivery))

    def _deliver(self, delivery: Delivery, _event: simpy.Event | None = None) -> None:
        dst, batch = delivery.dst, delivery.batch
        self._counters.add_delivered(delivery.src, dst, delivery.size_bytes)
        if dst.shape[0] == 1 or batch[0] == batch[-1]:  # one batch (batch order)
            self._hand_over(int(batch[0]), dst)
            return
        cuts = np.flatnonzero(batch[1:] != batch[:-1]) + 1
        lo = 0
        batch_id = int(batch[0])
        for hi, next_id in zip(cuts.tolist(), batch[cuts].tolist(), strict=True):
            self._hand_over(batch_id, dst[lo:hi])
            lo, batch_id = hi, next_id
        self._hand_over(batch_id, dst[lo:])

    def _hand_over(self, batch_id: int, dst: np.ndarray) -> None:
        """Tell a batch's sender that messages to `dst` arrived."""
        batch = self._batches[batch_id]
        batch.outstanding -= dst.shape[0]
        if batch.outstanding == 0:
            del self._batches[batch_id]
        batch.on_delivered(dst, batch.token)
