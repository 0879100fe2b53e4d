"""First come, first sent: a node's messages leave its NIC in the order they were sent.

The fluid model shares a node's uplink max-min fairly among every message under
way, whenever each started. A real sender does not: TCP hands a warm
connection's bytes to the NIC's queue as fast as its window allows, and on a
drop-tail (FIFO) queue the bytes that entered first leave first, so a message
sent while another from the same node is still leaving mostly waits behind it.
Measured on the netns testbed (`python -m analysis.ps_desync_probe --share`,
docs/design/ps-desync.md): two 0.5 MB messages from one node to two others, the second
started 20 ms after the first, were served strictly in order (the first done
in its alone time, 40 ms); started 0-10 ms apart, the first took 62-65% of the
NIC while both were under way (fair: 50%). Messages from two different nodes
into one NIC's queue arrive paced by their own uplinks and share it about
fairly (52-56%), as in the fluid model.

That order is what desynchronises asynchronous parameter-server workers: in the
fluid model two workers that push at the same instant get their parameters at
the same instant and stay in lockstep forever (a phase gap between workers is
neutral under fair sharing), each of the server's directions idle half the
time; with first come, first sent the server answers one worker before the
other, the first computes and pushes while the second still receives, and the
workers settle half a cycle apart (akorun on the testbed: lan-2w-ps-s0 93 ms a
round, the fluid model 174 ms).

`SenderFifo` is a layer (akosim.network.layer.NetworkLayer) over a network model
whose bottom is the fluid one: one `send` call (a batch: the
messages a node sends at one instant, which share its NIC fairly among
themselves) waits while the node's earlier messages under way fill its uplink
(their max-min rates among every message under way add up to its capacity),
and starts once they no longer do (checked whenever a message arrives), in the
order the batches were sent; a node
whose earlier messages are held elsewhere (at a receiver's downlink shared with
other senders) sends at once, so a FIFO never idles an uplink. Only the start
of a batch changes; the fluid solver is untouched. The node's NIC is counted
free when its last message arrives, so on a link with latency L a queued batch
starts L late (exact on the testbed, which has no latency). Under the TCP-aware model it sits
below the TCP layers (their per-pair queue and delays run first, then this
order); akosim.network.netmodel stacks it.

Only on paths without latency. With a round trip of 4 ms or more (the testbed's
delay line, `python -m analysis.ps_desync_probe --share --rtt-ms R`, 20 Mbit/s,
digits-cnn's 0.5 MB messages) two messages from one node started 0-100 ms apart
shared its NIC about fairly (the first got 45-57% while both were under way,
docs/design/ps-desync.md): a connection that paces over a delayed path leaves
the sender's queue room for a newcomer. So a batch is held only when every
destination's round trip is below `FIFO_MAX_RTT_S` (`rtt_s`, the TCP layers'
round trips; none given: every pair is held as before); a batch to a delayed
destination leaves at once and shares max-min.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Sequence
from functools import partial

import numpy as np

from akosim.network.layer import DeliveryCallback, NetworkLayer, NetworkModel
from akosim.network.maxmin import max_min_rates

__all__ = ["SenderFifo"]

# a sender's uplink counts as full when its messages' rates reach this close to it
_FULL_REL = 1e-6
# round trips below this are served first come, first sent; above it messages share
# (measured: strict order at 0 ms, 45-57% for the first at 4, 10 and 50 ms)
FIFO_MAX_RTT_S = 2e-3


class _Batch:
    """One send call waiting for its sender's NIC."""

    __slots__ = ("dsts", "size_bytes", "on_delivered", "token")

    def __init__(self, dsts: np.ndarray, size_bytes: int | float | np.ndarray,
                 on_delivered: DeliveryCallback, token: object) -> None:
        self.dsts = dsts
        self.size_bytes = size_bytes
        self.on_delivered = on_delivered
        self.token = token


class SenderFifo(NetworkLayer):
    """Nodes send their batches in order while their NIC is full."""

    def __init__(self, inner: NetworkModel, rtt_s: np.ndarray | None = None) -> None:
        super().__init__(inner)
        spec = self.spec
        # pairs whose messages wait their turn (no latency); None: every pair
        self._in_order = None if rtt_s is None else np.asarray(rtt_s) < FIFO_MAX_RTT_S
        self._leaving = np.zeros(spec.n, dtype=np.int64)  # messages under way per sender
        self._pairs: Counter[tuple[int, int]] = Counter()  # messages under way per pair
        self._incoming = np.zeros(spec.n, dtype=np.int64)  # messages under way per receiver
        self._backlog: dict[int, deque[_Batch]] = {}
        self.batches_held = 0  # batches that waited for their sender's earlier ones

    def send(self, src: int, dsts: np.ndarray | Sequence[int],
             size_bytes: int | float | np.ndarray, on_delivered: DeliveryCallback,
             token: object = None) -> None:
        dst = np.array(dsts, dtype=np.intp).reshape(-1)
        if not dst.size:
            return
        if self._in_order is not None and not self._in_order[src, dst].all():
            self._launch(src, dst, size_bytes, on_delivered, token)  # paced: it shares
            return
        if self._backlog.get(src) or (self._leaving[src] > 0 and self._uplink_full(src)):
            self._backlog.setdefault(src, deque()).append(
                _Batch(dst, size_bytes, on_delivered, token))
            self.batches_held += 1
            return
        self._launch(src, dst, size_bytes, on_delivered, token)

    @property
    def batches_waiting(self) -> int:
        return sum(len(queue) for queue in self._backlog.values())

    def _uplink_full(self, src: int) -> bool:
        """Whether `src`'s messages under way fill its uplink: their max-min rates among
        every message under way add up to its capacity (then a new one queues behind
        them; otherwise they are held elsewhere and a new one leaves at once)."""
        spec = self.spec
        capacity_bps = float(spec.uplink_bps[src])
        if not np.isfinite(capacity_bps):
            return False
        mine = [(dst, count) for (sender, dst), count in self._pairs.items() if sender == src]
        receivers = np.array([dst for dst, _ in mine], dtype=np.intp)
        if all(self._incoming[dst] == count for dst, count in mine):
            # src alone sends to its receivers: its flows are held by its uplink, each
            # receiver's downlink and each pair's cap only (exact, no solve)
            reach_bps = np.minimum(spec.downlink_bps[receivers], spec.link_bps[src, receivers])
            return float(reach_bps.sum()) >= capacity_bps * (1.0 - _FULL_REL)
        pairs = list(self._pairs)
        counts = np.fromiter(self._pairs.values(), dtype=np.intp, count=len(pairs))
        ends = np.array(pairs, dtype=np.intp).reshape(-1, 2)
        senders = np.repeat(ends[:, 0], counts)
        rates_bps = max_min_rates(senders, np.repeat(ends[:, 1], counts), self.spec)
        return float(rates_bps[senders == src].sum()) >= capacity_bps * (1.0 - _FULL_REL)

    def _launch(self, src: int, dst: np.ndarray, size_bytes: int | float | np.ndarray,
                on_delivered: DeliveryCallback, token: object) -> None:
        self._leaving[src] += dst.size
        for d in dst.tolist():
            self._pairs[(src, d)] += 1
            self._incoming[d] += 1
        self.inner.send(src, dst, size_bytes, partial(self._arrived_fifo, src, on_delivered),
                        token)

    def _arrived_fifo(self, src: int, on_delivered: DeliveryCallback, dests: np.ndarray,
                      token: object) -> None:
        self._leaving[src] -= dests.shape[0]
        for d in dests.tolist():
            key = (src, d)
            self._incoming[d] -= 1
            self._pairs[key] -= 1
            if not self._pairs[key]:
                del self._pairs[key]
        if self._backlog:
            self._release()
        on_delivered(dests, token)

    def _release(self) -> None:
        """Start the held batches whose sender's NIC is no longer full, in order."""
        moved = True
        while moved:
            moved = False
            for src in list(self._backlog):
                queue = self._backlog[src]
                while queue and (self._leaving[src] == 0 or not self._uplink_full(src)):
                    nxt = queue.popleft()
                    self._launch(src, nxt.dsts, nxt.size_bytes, nxt.on_delivered, nxt.token)
                    moved = True
                if not queue:
                    del self._backlog[src]
