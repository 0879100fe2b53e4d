"""One stream per ordered pair: a node's messages to one peer leave in the order sent.

akorun sends to each peer over one lane (one POST at a time, in queue order,
akorun.transport.sender), and ring all-reduce implementations keep one in-order channel
per neighbour: a message to a peer starts when the previous one to that peer
has left (its last byte sent; latency does not hold the stream). The fluid
model alone shares a pair's concurrent messages fairly instead, so a ring node
that receives faster than it can forward starts every step at once and the
first one, which the next node waits for, arrives as late as the last
(a ring with half its NICs upgraded was 1.6x slower than with none).

`PairStreams` is a layer (akosim.network.layer.NetworkLayer) that the engine
puts over its network model for the nodes that declare `in_order_sends`: it
passes a send through for every receiver
whose stream is free and holds the others, in order, until their stream's
earlier message has left. Messages of zero bytes use no bandwidth and pass
at once, as in the layer below.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np

from akosim.network.layer import DeliveryCallback, NetworkLayer, NetworkModel

__all__ = ["PairStreams"]


class _Held:
    """A message waiting for its pair's stream."""

    __slots__ = ("size_bytes", "on_delivered", "token")

    def __init__(self, size_bytes: float, on_delivered: DeliveryCallback,
                 token: object) -> None:
        self.size_bytes = size_bytes
        self.on_delivered = on_delivered
        self.token = token


class PairStreams(NetworkLayer):
    """Holds each message until the earlier messages of its ordered pair have left."""

    def __init__(self, inner: NetworkModel) -> None:
        super().__init__(inner)
        n = self.spec.n
        self._busy = np.zeros((n, n), dtype=np.int64)  # messages leaving per pair (0 or 1)
        self._held: dict[tuple[int, int], deque[_Held]] = {}
        self.messages_held = 0  # messages that waited for their stream
        inner.on_transfer_end(self._left)

    def send(self, src: int, dsts: np.ndarray | Sequence[int],
             size_bytes: int | float | np.ndarray, on_delivered: DeliveryCallback,
             token: object = None) -> None:
        dst = np.array(dsts, dtype=np.intp).reshape(-1)
        if dst.size == 0 or not 0 <= src < self._busy.shape[0]:
            self.inner.send(src, dst, size_bytes, on_delivered, token)  # it validates
            return
        sizes = np.broadcast_to(np.asarray(size_bytes, dtype=np.float64), dst.shape)
        row = self._busy[src]
        busy = (row[dst] > 0) & (sizes > 0)
        if busy.any():
            for k in np.flatnonzero(busy).tolist():
                pair = (src, int(dst[k]))
                self._held.setdefault(pair, deque()).append(
                    _Held(float(sizes[k]), on_delivered, token))
                self.messages_held += 1
            keep = ~busy
            dst, sizes = dst[keep], sizes[keep]
            if not dst.size:
                return
            size_bytes = sizes if sizes.size > 1 else float(sizes[0])
        row[dst[sizes > 0]] += 1
        self.inner.send(src, dst, size_bytes, on_delivered, token)

    def _left(self, src: np.ndarray, dst: np.ndarray) -> None:
        """Transfers src[k] -> dst[k] ended: start each pair's next held message."""
        self._busy[src, dst] -= 1
        if not self._held:
            return
        for i, j in zip(src.tolist(), dst.tolist(), strict=True):
            queue = self._held.get((i, j))
            if queue:
                nxt = queue.popleft()
                if not queue:
                    del self._held[(i, j)]
                self._busy[i, j] += 1
                self.inner.send(i, (j,), nxt.size_bytes, nxt.on_delivered, nxt.token)
