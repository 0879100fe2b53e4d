"""Simulator-only fast path: one ako multicast delivered to many nodes in one step.

In timing-only mode an ako message that arrives in order at every receiver
only advances r_sender in each receiver's delivery log. `MulticastDelivery`
keeps every timing-only ako node's delivery rows in one shared matrix
(through the public `DeliveryLog.share_rows` hook of akocore.ssp) and makes
that update for all receivers with one vectorised assignment. Anything else
(training mode, other schemes, final markers, out-of-order or duplicate
messages) goes through each node's own `receive`, so the result is exactly
what per-node delivery gives. akorun never needs this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from akocore.messages import Partial, Send
from akocore.schemes import AkoWorker, SchemeNode


@dataclass(frozen=True)
class SharedDeliveryMatrix:
    """Every simulated ako node's delivery rows in one matrix: rounds[i, j] is
    r_j as seen by node i."""

    rounds: np.ndarray  # (n, n) int64
    pending: np.ndarray  # (n, n) bool: node i holds out-of-order rounds of j

    @classmethod
    def create(cls, n: int) -> SharedDeliveryMatrix:
        return cls(np.full((n, n), -1, dtype=np.int64), np.zeros((n, n), dtype=bool))


def _shares_rows(nodes: Sequence[SchemeNode]) -> bool:
    """Whether the nodes are timing-only ako workers, ranked by position."""
    return len(nodes) > 1 and all(
        isinstance(node, AkoWorker) and not node.replica.has_data and node.rank == i
        for i, node in enumerate(nodes))


class MulticastDelivery:
    """Delivers messages to the nodes of one simulation, a multicast at a time."""

    def __init__(self, nodes: Sequence[SchemeNode]) -> None:
        self.nodes = nodes
        self.matrix: SharedDeliveryMatrix | None = None
        if _shares_rows(nodes):
            matrix = SharedDeliveryMatrix.create(len(nodes))
            for node in nodes:
                assert isinstance(node, AkoWorker)
                node.log.share_rows(matrix.rounds[node.rank], matrix.pending[node.rank])
            self.matrix = matrix

    def deliver(self, dests: np.ndarray, msg: Partial) -> tuple[int, list[tuple[int, Send]]]:
        """Deliver `msg` to every node in `dests`: (duplicates, (node, effect)s)."""
        matrix = self.matrix
        if matrix is not None and not msg.final and dests.size > 1:
            first = self.nodes[int(dests[0])]
            assert isinstance(first, AkoWorker)
            first.validate(msg)
            sender = msg.sender
            column = matrix.rounds[dests, sender]
            if (column == msg.round - 1).all() and not matrix.pending[dests, sender].any():
                matrix.rounds[dests, sender] = msg.round
                return 0, []
        duplicates = 0
        effects: list[tuple[int, Send]] = []
        nodes = self.nodes
        for dest in dests.tolist():
            receipt = nodes[dest].receive(msg)
            duplicates += not receipt.accepted
            effects.extend((dest, effect) for effect in receipt.effects)
        return duplicates, effects
