"""The TCP-aware flow model: what real TCP adds to the max-min fluid network.

akosim's fluid network (akosim.network.fluid, akosim.network.maxmin) shares every NIC max-min
fairly and instantly and charges each message its one-way latency once. Peer
simulators and real kernel TCP take longer (docs/design/fidelity-references.md: SimGrid's
TCP-calibrated LV08 model 8% at 0.1 ms and 27% at 20 ms, ns-3 15% and 28%).
This module adds those effects without touching the solver, in the spirit of
SimGrid's LV08 model (docs/source/Models.rst of simgrid/simgrid): corrections
to the inputs of the max-min solver, and a per-message delay after it.

(a) Goodput. Every MSS of payload travels with Ethernet + IP + TCP framing,
    and every `segments_per_ack` segments send one ACK frame back on the other
    direction of the receiver's NIC. Each NIC and per-pair cap is scaled by
    `TcpParameters.bandwidth_factor` (default 1448/1514 / (1 + 66/(2 x 1514))
    = 0.936: a loaded link in both directions; LV08 uses 0.97 / 1.05 = 0.924;
    one 20 Mbit/s tc link measured 0.96 one way and 0.94 both ways). The ACK
    term is charged always, also when the reverse direction is idle (then the
    model is about 2% slow): a static transform keeps the solver untouched.
(b) Window. One connection moves at most `window_bytes` per round trip, so
    each ordered pair gets the cap window / RTT (SimGrid CM02/LV08:
    TCP_gamma / (2 x latency)), RTT = latency(i->j) + latency(j->i) +
    `base_rtt_s`. With Linux's autotuned 4-6 MiB windows it binds only on
    fast, long links (4 MiB at 40 ms RTT: 839 Mbit/s).
(c) Slow start. A fresh connection first spends `handshake_rtts` round trips
    (SYN, SYN-ACK), then sends `initial_window_segments` and doubles its window
    every round trip until the window covers the rate it gets times the RTT.
    `slow_start_extra_s` is the time this adds to a fluid transfer of the same
    bytes at the same rate: (rounds with the window below the BDP) x RTT minus
    what those rounds carried at the fluid rate. The rate is the one the fluid
    model gave the message (its bytes over its transfer time), so contention
    shortens the ramp as it does in TCP. akorun pools `connections_per_pair`
    connections per peer (layer slow-start), so only each pair's first messages pay
    (layer fresh-connections: every message pays);
    research found that disabling slow-start-after-idle changes nothing, so a
    warm connection never ramps again. LV08 charges 13.01 x latency on every
    message instead: right for fresh connections, wrong for pooled ones.
(d) Software. `message_cost_s(bytes)` (akorun's sealing, HTTP, verification
    and apply, measured by `akorun measure-messages` without network time).
(e) One message per connection. A TCP connection is one ordered byte stream,
    and akorun's sender keeps `connections_per_pair` (1) per peer and starts a
    peer's next message when the previous one is answered. So a pair's messages
    do not share the links as separate fluid flows: at most
    `connections_per_pair` are in flight per ordered pair, the rest wait in
    order and start when one is answered (delivered, its software cost paid, and
    the answer back after half the pair's round trip). The fluid model shares them
    instead, which delays the oldest message, the one an SSP gate waits for,
    behind younger ones (measured on the netns testbed: an asynchronous
    parameter server at s = 2 predicted 77% too slow without it,
    docs/reports/fidelity-tcp.md). The layer one-per-connection.

(f) Message CPU. With the layer message-cpu, the software cost (d) is also
    CPU time of the ranks: half charged to the sender as the message leaves,
    half to each receiver as it arrives, and owed as per-round overhead by a
    rank that was busy at that moment (akosim.network.rank_cpu), so a CPU-bound rank's
    round is not shorter than its step plus its message handling. The
    layer's `with_cpu(compute)` (the NetworkModel hook the engine calls) gives
    the simulation's compute model that ledger.

(g) Sharing. Several TCP flows that start at the same instant through one
    shaped drop-tail port collide in its queue, lose packets and back off
    unevenly, so together they carry less than one flow does (measured on the
    netns testbed: uplinks carried 63-86% of the rate at 3-4 workers of Ako
    p = 1 where the model kept 93%). `akosim calibrate --netns-rate` measures
    `flow_sharing_efficiency`: what k flows, each sending one message at the
    same instant every round through one port shaped as the testbed shapes it,
    carry over what one flow carries. The flows that start together by
    construction are one send's: a multicast to k peers leaves its sender's
    uplink as k flows at once (akorun sends a round's partition to every peer
    at once). Each of them arrives later by its fluid transfer time x
    (1 / efficiency(k) - 1): like LV08's corrections, a delay after the solver
    that uses no bandwidth (with one message per connection (e), the pair's
    next message waits for it all the same). Flows that overlap only because
    their senders happen to send at the same time (a parameter server's
    workers in the model's lockstep) are not charged: whether they start
    together is the model's timing, not the scheme's, and on the testbed the
    asynchronous server's links showed no such loss.

(a) and (b) are a transformation of the NetworkSpec (`effective_spec`); (c),
(d), (f) and (g) are the layer `TcpCorrections`, whose `send` wraps the
delivery callback (like LV08's latency, the delay uses no bandwidth); (e) is
the layer `ConnectionQueue` above it (akosim.network.layer; the stack is
built by akosim.network.netmodel). With `TcpParameters.ideal()` and the
tcp-core layer alone every correction is off and the model is max-min exactly
(tests/test_tcpmodel.py checks it).

Units: rates in bits per second, sizes in bytes, times in seconds.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import replace
from functools import partial

import numpy as np
import simpy

from akocore.records.host_calibration import TcpParameters
from akosim.network.layer import DeliveryCallback, NetworkLayer, NetworkModel
from akosim.network.netspec import NetworkSpec
from akosim.network.rank_cpu import RankCpu
from akosim.planning.compute import ComputeModel

BITS_PER_BYTE = 8

__all__ = ["ConnectionQueue", "TcpCorrections", "effective_spec", "round_trip_s",
           "slow_start_extra_s"]


def round_trip_s(latency_s: np.ndarray, params: TcpParameters) -> np.ndarray:
    """(n, n) round trip of each ordered pair: there and back plus the host stack."""
    return latency_s + latency_s.T + params.base_rtt_s


def effective_spec(spec: NetworkSpec, params: TcpParameters,
                   rtt_s: np.ndarray | None = None) -> NetworkSpec:
    """`spec` with goodput capacities (a) and the window/RTT cap per pair (b); latencies
    unchanged. `rtt_s` defaults to round_trip_s(spec.latency_s) (pass the network's
    own when spec.latency_s also carries a software cost)."""
    factor = params.bandwidth_factor
    rtt = round_trip_s(spec.latency_s, params) if rtt_s is None else rtt_s
    with np.errstate(divide="ignore"):
        window_bps = np.where(rtt > 0, params.window_bytes * BITS_PER_BYTE / rtt, np.inf)
    link = np.minimum(spec.link_bps * factor, window_bps)
    return NetworkSpec(spec.uplink_bps * factor, spec.downlink_bps * factor, link,
                       spec.latency_s)


def slow_start_extra_s(size_bytes: np.ndarray | float, rate_bps: np.ndarray | float,
                       rtt_s: np.ndarray | float, initial_window_bytes: float) -> np.ndarray:
    """Seconds slow start adds to a fluid transfer of `size_bytes` at `rate_bps`.

    The window starts at `initial_window_bytes` and doubles every `rtt_s` while it is
    below the bandwidth-delay product B = rate x RTT; each such round takes one RTT.
    With K = ceil(log2(B / IW)) window-limited rounds carrying IW (2^K - 1) bytes:
    a transfer that fits in them takes (m - 1) RTT + last / rate, m = ceil(log2(S / IW
    + 1)); a longer one K RTT + (S - IW (2^K - 1)) / rate. The result is that time
    minus S / rate (the fluid transfer); 0 when IW >= B or nothing is sent.
    """
    size = np.asarray(size_bytes, dtype=np.float64)
    rate = np.asarray(rate_bps, dtype=np.float64)
    rtt = np.asarray(rtt_s, dtype=np.float64)
    size, rate, rtt = np.broadcast_arrays(size, rate, rtt)
    iw = float(initial_window_bytes)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        bdp = rate * rtt / BITS_PER_BYTE
        ramps = (size > 0) & (rtt > 0) & np.isfinite(rate) & (rate > 0) & (bdp > iw)
        byte_s = BITS_PER_BYTE / rate
        k = np.ceil(np.log2(np.where(ramps, bdp / iw, 1.0)))
        ss_bytes = iw * (np.exp2(k) - 1.0)
        m = np.ceil(np.log2(np.where(ramps, size / iw, 0.0) + 1.0))
        before_last = iw * (np.exp2(m - 1.0) - 1.0)
        inside = (m - 1.0) * rtt - before_last * byte_s
        beyond = k * rtt - ss_bytes * byte_s
        extra = np.where(size <= ss_bytes, inside, beyond)
    return np.where(ramps, np.maximum(extra, 0.0), 0.0)


class _Queued:
    """(e): a message waiting for its pair's connection."""

    __slots__ = ("size_bytes", "on_delivered", "token")

    def __init__(self, size_bytes: float, on_delivered: DeliveryCallback,
                 token: object) -> None:
        self.size_bytes = size_bytes
        self.on_delivered = on_delivered
        self.token = token


class _Pending:
    """One send's per-receiver facts, kept until its messages arrive."""

    __slots__ = ("src", "start_s", "size_of", "fresh_of", "efficiency", "on_delivered")

    def __init__(self, src: int, start_s: float, size_of: np.ndarray, fresh_of: np.ndarray,
                 efficiency: float, on_delivered: DeliveryCallback) -> None:
        self.src = src
        self.start_s = start_s
        self.size_of = size_of
        self.fresh_of = fresh_of
        self.efficiency = efficiency  # (g): of the flows this send started together
        self.on_delivered = on_delivered


def _hand_over(on_delivered: DeliveryCallback, dests: np.ndarray, token: object,
               _event: simpy.Event) -> None:
    on_delivered(dests, token)


class ConnectionQueue(NetworkLayer):
    """(e): at most `connections_per_pair` messages in flight per ordered pair; the
    others wait in order and start when one is answered (delivered, then the answer
    back after half the pair's round trip `rtt_s`)."""

    def __init__(self, inner: NetworkModel, params: TcpParameters, rtt_s: np.ndarray) -> None:
        super().__init__(inner)
        n = self.spec.n
        self.params = params
        self.rtt_s = np.array(rtt_s, dtype=np.float64)
        self._in_flight = np.zeros((n, n), dtype=np.int64)
        self._waiting: dict[tuple[int, int], deque[_Queued]] = {}
        self._queued = 0  # messages waiting, over all pairs
        # the answer's way back: half the pair's round trip (the network's own latency and
        # the host stack; spec.latency_s may also carry a software cost, paid already)
        off_diagonal = self.rtt_s[~np.eye(n, dtype=bool)] / 2
        self._answer_s: float | None = float(off_diagonal[0]) if off_diagonal.size and (
            off_diagonal == off_diagonal[0]).all() else None

    def send(self, src: int, dsts: np.ndarray | Sequence[int],
             size_bytes: int | float | np.ndarray, on_delivered: DeliveryCallback,
             token: object = None) -> None:
        dst = np.asarray(dsts, dtype=np.intp).reshape(-1)
        row = self._in_flight[src]
        busy = row[dst] >= self.params.connections_per_pair
        if busy.any():
            sizes = np.broadcast_to(np.asarray(size_bytes, dtype=np.float64), dst.shape)
            for waiting_dst in np.flatnonzero(busy).tolist():
                pair = (src, int(dst[waiting_dst]))
                self._waiting.setdefault(pair, deque()).append(
                    _Queued(float(sizes[waiting_dst]), on_delivered, token))
                self._queued += 1
            dst, sizes = dst[~busy], sizes[~busy]
            if not dst.size:
                return
            size_bytes = sizes if sizes.size > 1 else float(sizes[0])
        row[dst] += 1
        self.inner.send(src, dst, size_bytes, partial(self._answered, src, on_delivered),
                        token)

    def _answered(self, src: int, on_delivered: DeliveryCallback, dests: np.ndarray,
                  token: object) -> None:
        """Deliver, then free each pair's connection when its answer is back."""
        on_delivered(dests, token)
        if self._answer_s is not None:  # one figure for every pair
            if self._answer_s > 0:
                timeout = self.env.timeout(self._answer_s)
                timeout.callbacks.append(partial(self._free, src, dests.copy()))
            else:
                self._free(src, dests)
            return
        back_s = self.rtt_s[src, dests] / 2
        for delay_s in np.unique(back_s).tolist():
            group = dests if back_s.size == 1 else dests[back_s == delay_s]
            if delay_s > 0:
                timeout = self.env.timeout(delay_s)
                timeout.callbacks.append(partial(self._free, src, group.copy()))
            else:
                self._free(src, group)

    def _free(self, src: int, dests: np.ndarray, _event: object = None) -> None:
        self._in_flight[src, dests] -= 1
        if not self._queued:
            return
        for dst in dests.tolist():
            queue = self._waiting.get((src, dst))
            if queue:
                nxt = queue.popleft()
                self._queued -= 1
                self._in_flight[src, dst] += 1
                self.inner.send(src, (dst,), nxt.size_bytes,
                                partial(self._answered, src, nxt.on_delivered), nxt.token)


class TcpCorrections(NetworkLayer):
    """Deliveries of the inner (effective-spec) model arrive later by (d) and (g), with
    `slow_start` by (c) (`pooled`: a pair's first `connections_per_pair` messages pay
    it; otherwise every one), and with `message_cpu` (f) the ranks pay the software
    cost as CPU.

    The inner model runs on the effective spec (effective_spec); `rtt_s` are the
    network's round trips. Each message's extra delay is computed when the inner
    model delivers it: its software cost, and on a fresh connection the handshake
    and slow start at the rate the message got. Messages of one delivery with the
    same delay stay one group.
    """

    def __init__(self, inner: NetworkModel, params: TcpParameters, rtt_s: np.ndarray, *,
                 slow_start: bool, pooled: bool, message_cpu: bool) -> None:
        super().__init__(inner)
        n = self.spec.n
        self.params = params
        self.rtt_s = np.array(rtt_s, dtype=np.float64)
        self.pooled = pooled
        self._sent = np.zeros((n, n), dtype=np.int64)  # messages per pair so far
        self._costly = params.message_fixed_s > 0 or params.message_per_byte_s > 0
        # (g): flows one send starts together on its sender's uplink lose goodput
        self._sharing = any(e < 1 for e in params.flow_sharing_efficiency)
        # (f): message handling as CPU of the ranks (None: a delay only)
        self.cpu = RankCpu(self.env, n) if self._costly and message_cpu else None
        self._all_warm = not slow_start
        self._cold_pairs = n * (n - 1)  # pairs still below their pooled count

    def with_cpu(self, compute: ComputeModel) -> ComputeModel:
        """`compute` charged with this network's message CPU (f), or as it is."""
        return compute if self.cpu is None else replace(compute, cpu=self.cpu)

    def send(self, src: int, dsts: np.ndarray | Sequence[int],
             size_bytes: int | float | np.ndarray, on_delivered: DeliveryCallback,
             token: object = None) -> None:
        if self._all_warm and not self._costly and not self._sharing:
            self.inner.send(src, dsts, size_bytes, on_delivered, token)
            return
        dst = np.array(dsts, dtype=np.intp).reshape(-1)
        n = self.spec.n
        size_of = np.zeros(n)
        size_of[dst] = size_bytes
        fresh_of = np.zeros(n, dtype=bool)
        if not self._all_warm:
            params = self.params
            if self.pooled:
                row = self._sent[src]
                fresh_of[dst] = row[dst] < params.connections_per_pair
                row[dst] += 1
                self._cold_pairs -= int((row[dst] == params.connections_per_pair).sum())
                self._all_warm = self._cold_pairs <= 0
            else:
                fresh_of[dst] = True
        if self.cpu is not None:  # (f): the sender's half, as the messages leave
            params = self.params
            self.cpu.charge(src, float(params.message_fixed_s * dst.size
                                       + params.message_per_byte_s * size_of[dst].sum()) / 2)
        # (g): the flows this send starts at once through its sender's uplink
        efficiency = self.params.sharing_efficiency(int(dst.size)) if self._sharing else 1.0
        pending = _Pending(src, float(self.env.now), size_of, fresh_of, efficiency,
                           on_delivered)
        self.inner.send(src, dst, size_bytes, partial(self._arrived, pending), token)

    def _arrived(self, pending: _Pending, dests: np.ndarray, token: object) -> None:
        params, src = self.params, pending.src
        sizes = pending.size_of[dests]
        extra = params.message_fixed_s + params.message_per_byte_s * sizes
        if self.cpu is not None:  # (f): each receiver's half, as it starts handling
            self.cpu.charge_each(dests.tolist(), (extra / 2).tolist())
        fresh = pending.fresh_of[dests]
        if pending.efficiency < 1.0:  # (g): flows started together carry less
            transfer_s = np.maximum(float(self.env.now) - pending.start_s
                                    - self.spec.latency_s[src, dests], 0.0)
            extra = extra + transfer_s * (1.0 / pending.efficiency - 1.0)
        if fresh.any():
            rtt = self.rtt_s[src, dests]
            latency = self.spec.latency_s[src, dests]
            transfer_s = float(self.env.now) - pending.start_s - latency
            with np.errstate(divide="ignore", invalid="ignore"):
                rate = np.where(transfer_s > 0, sizes * BITS_PER_BYTE / transfer_s, np.inf)
            ramp = params.handshake_rtts * rtt + slow_start_extra_s(
                sizes, rate, rtt, params.initial_window_bytes)
            extra = extra + np.where(fresh, ramp, 0.0)
        extra = np.broadcast_to(extra, dests.shape)
        first_s = float(extra[0])
        if extra.size == 1 or (extra == first_s).all():  # one delay for every receiver
            if first_s <= 0:
                pending.on_delivered(dests, token)
                return
            timeout = self.env.timeout(first_s)
            timeout.callbacks.append(partial(_hand_over, pending.on_delivered, dests, token))
            return
        for delay_s in np.unique(extra).tolist():
            group = dests if extra.size == 1 else dests[extra == delay_s]
            timeout = self.env.timeout(delay_s)
            timeout.callbacks.append(partial(_hand_over, pending.on_delivered, group, token))
