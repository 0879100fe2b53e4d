"""Traffic statistics of the simulated network: bytes and utilisation per node and link.

`TrafficCounters` is fed by the SimPy adapter (akosim.network.fluidnet): the bytes of
every flow whose transfer ended and of every message delivered. What each NIC
carried and how long it was busy come from the fluid model
(akosim.network.fluid.FluidFlows keeps them as flows start and end) and are passed in
when a snapshot is taken. It reads no clock: every call says what time it is.
`NetworkStats` and `NetworkUtilisation` are the frozen snapshots reports use.

Units: loads in bits per second, traffic in bytes (carried traffic is kept in
bits and converted), times in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from akosim.network.netspec import NetworkSpec

BITS_PER_BYTE = 8
# Delivered-traffic logs are folded into the counters after this many entries.
_LOG_FLUSH_ENTRIES = 1 << 20
# Up to this many ordered pairs, delivered bytes are summed per pair by a bincount.
_BINCOUNT_PAIRS_MAX = 1 << 22


@dataclass(frozen=True, eq=False)
class NetworkUtilisation:
    """Fraction of capacity used over an interval, per node (0..1)."""

    uplink: np.ndarray
    downlink: np.ndarray


@dataclass(frozen=True, eq=False)
class NetworkStats:
    """Traffic counters of a `FluidNetwork` at one instant, for reports.

    `bytes_sent[i]`: bytes of flows from i whose transfer has finished;
    `bytes_received[j]` and `link_bytes[i, j]`: bytes delivered (after
    latency); `*_carried_bytes`: bytes that crossed each NIC, in-flight flows
    included; `*_busy_s`: time each NIC carried at least one flow.
    """

    elapsed_s: float
    bytes_sent: np.ndarray
    bytes_received: np.ndarray
    link_bytes: np.ndarray
    uplink_carried_bytes: np.ndarray
    downlink_carried_bytes: np.ndarray
    uplink_busy_s: np.ndarray
    downlink_busy_s: np.ndarray
    utilisation: NetworkUtilisation
    rate_solves: int
    flow_completions: int
    messages_delivered: int
    active_flows: int


class TrafficCounters:
    """Per-node and per-link traffic of one network since `start_s`."""

    def __init__(self, spec: NetworkSpec, start_s: float) -> None:
        n = spec.n
        self.spec = spec
        self._n = n
        self.start_s = start_s
        self._bytes_sent = np.zeros(n)
        self._bytes_received = np.zeros(n)
        self._link_bytes = np.zeros((n, n))
        self._delivered_log: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._delivered_log_entries = 0
        self.messages_delivered = 0

    # ---------------------------------------------------------------- feeding

    def add_sent(self, src: np.ndarray, size_bytes: np.ndarray) -> None:
        """Transfers from `src` of `size_bytes` each have ended."""
        if src.shape[0] == 1:
            self._bytes_sent[src[0]] += size_bytes[0]
        else:
            self._bytes_sent += np.bincount(src, weights=size_bytes, minlength=self._n)

    def add_delivered(self, src: np.ndarray, dst: np.ndarray, size_bytes: np.ndarray) -> None:
        """Messages src[k] -> dst[k] of size_bytes[k] arrived (summed lazily)."""
        count = dst.shape[0]
        self._delivered_log.append((src, dst, size_bytes))
        self._delivered_log_entries += count
        if self._delivered_log_entries >= _LOG_FLUSH_ENTRIES:
            self._flush_delivered()
        self.messages_delivered += count

    # --------------------------------------------------------------- reading

    @property
    def bytes_sent(self) -> np.ndarray:
        return self._bytes_sent.copy()

    @property
    def bytes_received(self) -> np.ndarray:
        self._flush_delivered()
        return self._bytes_received.copy()

    @property
    def link_bytes(self) -> np.ndarray:
        self._flush_delivered()
        return self._link_bytes.copy()

    def utilisation(self, now_s: float, carried_bits: np.ndarray,
                    elapsed_s: float | None = None) -> NetworkUtilisation:
        """Bits carried by each uplink and downlink (`carried_bits`: uplinks then
        downlinks) / (capacity * elapsed_s); `elapsed_s` defaults to the time
        since `start_s`."""
        if elapsed_s is None:
            elapsed_s = now_s - self.start_s
        if elapsed_s <= 0:
            zeros = np.zeros(self._n)
            return NetworkUtilisation(uplink=zeros, downlink=zeros.copy())
        n = self._n
        return NetworkUtilisation(
            uplink=carried_bits[:n] / (self.spec.uplink_bps * elapsed_s),
            downlink=carried_bits[n:] / (self.spec.downlink_bps * elapsed_s),
        )

    def snapshot(self, now_s: float, elapsed_s: float | None, *, carried_bits: np.ndarray,
                 busy_s: np.ndarray, rate_solves: int, flow_completions: int,
                 active_flows: int) -> NetworkStats:
        """Every counter at `now_s` (arrays are copies), with what the NICs carried
        and how long they were busy (uplinks then downlinks, from the fluid model)."""
        n = self._n
        return NetworkStats(
            elapsed_s=now_s - self.start_s if elapsed_s is None else float(elapsed_s),
            bytes_sent=self.bytes_sent,
            bytes_received=self.bytes_received,
            link_bytes=self.link_bytes,
            uplink_carried_bytes=carried_bits[:n] / BITS_PER_BYTE,
            downlink_carried_bytes=carried_bits[n:] / BITS_PER_BYTE,
            uplink_busy_s=busy_s[:n].copy(),
            downlink_busy_s=busy_s[n:].copy(),
            utilisation=self.utilisation(now_s, carried_bits, elapsed_s),
            rate_solves=rate_solves,
            flow_completions=flow_completions,
            messages_delivered=self.messages_delivered,
            active_flows=active_flows,
        )

    def _flush_delivered(self) -> None:
        if not self._delivered_log:
            return
        log = self._delivered_log
        self._delivered_log = []
        self._delivered_log_entries = 0
        n = self._n
        if len(log) == 1:
            src, dst, size = log[0]
        else:
            src = np.concatenate([entry[0] for entry in log])
            dst = np.concatenate([entry[1] for entry in log])
            size = np.concatenate([entry[2] for entry in log])
        self._bytes_received += np.bincount(dst, weights=size, minlength=n)
        pair = src * n + dst
        if n * n <= _BINCOUNT_PAIRS_MAX:
            self._link_bytes += np.bincount(pair, weights=size, minlength=n * n).reshape(n, n)
        else:
            np.add.at(self._link_bytes.reshape(-1), pair, size)
