"""Simulator-only fast path: one ako multicast delivered to many nodes in one step.

In timing-only mode an ako message that arrives in order at every receiver
only advances r_sender in each receiver's delivery log: so does any node that
records its deliveries (`SchemeNode.delivery`, the DeliveryRecorded protocol
of akocore.schemes.recovery, which promises it). `MulticastDelivery` keeps
every such timing-only node's delivery rows in one shared matrix (through the
public `DeliveryLog.share_rows` hook of akocore.ssp) and makes
that update for all receivers with one vectorised assignment. Anything else
(training mode, other schemes, final markers, out-of-order or duplicate
messages) goes through each node's own `receive`, so the result is exactly
what per-node delivery gives. akorun never needs this module.

It also watches the SSP gates of waiting ako workers (`watch`, `opened`): a
worker waiting to start round t needs r_j >= t - 1 - s of every peer; the
watch counts the peers still below that and says when the last one crossed,
so the engine resumes a waiting worker once, not at every message it gets.
The count is kept only through in-order deliveries of the fast path, and only
for nodes that know no final round and suspend nobody (anything else makes
the engine re-check the gate itself), and the engine still asks the node's
own `may_start` before it goes on: the watch decides when to look, never
the answer.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from akocore.messages import Partial, Send
from akocore.schemes import DeliveryRecorded, SchemeNode

# From this many nodes a multicast to all the others updates the shared column through
# two slices instead of an index array (measured: 0.75x the time at 512 nodes, 0.5x at
# 1,024, but 1.7x at 64, where the index array's gather is cheaper than the checks).
SLICED_FROM_NODES = 384


@dataclass(frozen=True)
class SharedDeliveryMatrix:
    """Every simulated ako node's delivery rows in one matrix: rounds[i, j] is
    r_j as seen by node i."""

    rounds: np.ndarray  # (n, n) int64
    pending: np.ndarray  # (n, n) bool: node i holds out-of-order rounds of j

    @classmethod
    def create(cls, n: int) -> SharedDeliveryMatrix:
        return cls(np.full((n, n), -1, dtype=np.int64), np.zeros((n, n), dtype=bool))


def _shared_rows(nodes: Sequence[SchemeNode]) -> list[DeliveryRecorded] | None:
    """The nodes as delivery-recording nodes when all of them are, timing-only and
    ranked by position (their rows can be shared); None otherwise."""
    if len(nodes) <= 1:
        return None
    recorded = []
    for i, node in enumerate(nodes):
        delivery = node.delivery()
        if delivery is None or node.replica.has_data or node.rank != i:
            return None
        recorded.append(delivery)
    return recorded


class MulticastDelivery:
    """Delivers messages to the nodes of one simulation, a multicast at a time."""

    def __init__(self, nodes: Sequence[SchemeNode]) -> None:
        self.nodes = nodes
        self.matrix: SharedDeliveryMatrix | None = None
        # the nodes as delivery-recording ones, when their rows are shared (else empty)
        self.recorded: list[DeliveryRecorded] = _shared_rows(nodes) or []
        if self.recorded:
            matrix = SharedDeliveryMatrix.create(len(nodes))
            for node in self.recorded:
                node.log.share_rows(matrix.rounds[node.rank], matrix.pending[node.rank])
            self.matrix = matrix
        n = len(nodes)
        # sender -> every other rank, ascending: made on first use, n^2 integers at most,
        # as the shared matrix already is (comparing two slices with one arange instead
        # measured 4% slower over a whole 1,024 x 100 run)
        self._others: dict[int, np.ndarray] = {}
        # Per watched node: the round every peer must reach, and how many have not.
        self.watched = np.zeros(n, dtype=bool)
        self.need_round = np.zeros(n, dtype=np.int64)
        self.blocking = np.zeros(n, dtype=np.int64)

    def _everyone_but(self, sender: int) -> np.ndarray:
        others = self._others.get(sender)
        if others is None:
            n = len(self.nodes)
            others = self._others[sender] = np.delete(np.arange(n), sender)
        return others

    def deliver(self, dests: np.ndarray, msg: Partial) -> tuple[int, list[tuple[int, Send]]]:
        """Deliver `msg` to every node in `dests`: (duplicates, (node, effect)s)."""
        duplicates, effects, _ = self.deliver_tracked(dests, msg)
        return duplicates, effects

    def deliver_tracked(self, dests: np.ndarray, msg: Partial, *,
                        validated: bool = False) -> tuple[int, list[tuple[int, Send]], bool]:
        """`deliver`, and whether it arrived in order everywhere through the shared matrix, as the
        gate watch needs). `validated`: `msg` was validated at an earlier
        delivery (every timing-only ako node validates a message alike)."""
        matrix = self.matrix
        if matrix is not None and not msg.final:
            if not validated:
                self.recorded[int(dests[0])].validate(msg)
            sender = msg.sender
            if dests.shape[0] == 1:
                dest = int(dests[0])
                if (matrix.rounds[dest, sender] == msg.round - 1
                        and not matrix.pending[dest, sender]):
                    matrix.rounds[dest, sender] = msg.round
                    return 0, [], True
            elif dests.shape[0] == len(self.nodes) - 1 >= SLICED_FROM_NODES - 1 \
                    and np.array_equal(dests, self._everyone_but(sender)):
                # every other node of a large cluster: the column's two slices, no
                # gather and scatter by an index array (half the time at 1,024 nodes)
                rounds, pending = matrix.rounds[:, sender], matrix.pending[:, sender]
                parts = (slice(0, sender), slice(sender + 1, None))
                if all((rounds[part] == msg.round - 1).all() and not pending[part].any()
                       for part in parts):
                    for part in parts:
                        rounds[part] = msg.round
                    return 0, [], True
            else:
                column = matrix.rounds[dests, sender]
                if (column == msg.round - 1).all() and not matrix.pending[dests, sender].any():
                    matrix.rounds[dests, sender] = msg.round
                    return 0, [], True
        duplicates = 0
        effects: list[tuple[int, Send]] = []
        nodes = self.nodes
        for dest in dests.tolist():
            receipt = nodes[dest].receive(msg)
            duplicates += not receipt.accepted
            effects.extend((dest, effect) for effect in receipt.effects)
        return duplicates, effects, False

    # ------------------------------------------------------------ gate watch

    def watch(self, rank: int, round_: int) -> bool:
        """Count the peers that hold `rank`'s start of `round_` back; False (no
        watch) when the count cannot be kept exactly: not a shared-matrix
        node, or one that knows a final round or suspends a peer."""
        matrix = self.matrix
        if matrix is None:
            self.watched[rank] = False
            return False
        node = self.recorded[rank]
        if (node.final_round or node.suspended or math.isinf(node.staleness)
                or round_ <= 0):
            self.watched[rank] = False
            return False
        need = math.ceil(round_ - 1 - node.staleness)
        row = matrix.rounds[rank]
        self.need_round[rank] = need
        # every peer is in the gate (no finals, no suspensions); the diagonal is no peer
        self.blocking[rank] = int(np.count_nonzero(row < need)) - int(row[rank] < need)
        self.watched[rank] = True
        return True

    def unwatch(self, rank: int) -> None:
        self.watched[rank] = False

    def opened(self, dest: int, round_: int) -> bool:
        """A message of `round_` reached watched `dest` in order: whether its
        gate may now be open (the last peer it waited for crossed)."""
        if self.need_round[dest] == round_:
            left = int(self.blocking[dest]) - 1
            self.blocking[dest] = left
            return left <= 0
        return False

    def opened_many(self, dests: np.ndarray, round_: int) -> np.ndarray:
        """`opened` for distinct watched `dests` at once: those that may be open."""
        hit = dests[self.need_round[dests] == round_]
        if hit.shape[0] == 0:
            return hit
        self.blocking[hit] -= 1
        return hit[self.blocking[hit] <= 0]
