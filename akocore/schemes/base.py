"""What every scheme node is: the SchemeNode interface, its replica and shared checks.

A scheme node takes events and returns effects; it never sleeps, sends or
reads a clock (see akocore.schemes for the loop the shells run). This module
holds what all schemes share: `SchemeError`, the `Replica` (parameters and
optimizer state, or nothing in timing-only mode), the `SchemeNode` base class
with its round, gradient and message checks, and the reduce rule.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from akocore.messages import Kind, Partial, Receipt, Send
from akocore.optim import FlatOptimizer

if TYPE_CHECKING:
    from akocore.schemes.recovery import DeliveryRecorded, Recoverable, Resyncable

REDUCES = ("mean", "sum")


class SchemeError(ValueError):
    """A message that no correct peer could have sent (wrong kind, range, p)."""


def copy_or_none(array: np.ndarray | None) -> np.ndarray | None:
    return None if array is None else np.array(array, dtype=np.float32, copy=True)


def reduce_scale(reduce: str, n: int) -> float:
    """The factor applied to a sum of n contributions: 1/n for mean, 1 for sum."""
    if reduce == "mean":
        return 1.0 / n
    if reduce == "sum":
        return 1.0
    raise ValueError(f"reduce: got {reduce!r}, expected one of {', '.join(REDUCES)}")


class Replica:
    """A node's parameters and optimizer state, or nothing in timing-only mode."""

    def __init__(self, params: np.ndarray | None, optimizer: FlatOptimizer | None) -> None:
        if params is not None:
            if optimizer is None:
                raise ValueError("a node with parameters needs an optimizer")
            params = np.array(params, dtype=np.float32, copy=True)
        self.params = params
        self.optimizer = optimizer
        self.state: Any = optimizer.init(params) if params is not None and optimizer else None

    @property
    def has_data(self) -> bool:
        return self.params is not None

    def apply(self, update: np.ndarray) -> None:
        assert self.params is not None and self.optimizer is not None
        self.params, self.state = self.optimizer.apply(self.params, self.state, update)


class SchemeNode(ABC):
    """What every node offers its shell."""

    rank: int
    is_worker: bool = True
    # True: this node's messages to one peer form one in-order stream (a ring's
    # neighbour channel): each leaves after the previous one to that peer has left
    in_order_sends: bool = False
    length: int
    encoder: Any = None  # the run's codec on this node's sends (akocore.codecs.exchange)

    def __init__(self, rank: int, length: int, replica: Replica) -> None:
        if length < 1:
            raise ValueError(f"vector length must be >= 1, got {length}")
        self.rank = rank
        self.length = length
        self.replica = replica
        self.next_round = 0
        self.finished = False
        self.suspended: set[int] = set()  # peers silent past the peer timeout

    @property
    def params(self) -> np.ndarray | None:
        return self.replica.params

    def may_start(self, round_: int) -> bool:
        return True

    def plan_rounds(self, rounds: int) -> None:
        """The run stops after `rounds` rounds, known before it starts (a round limit):
        a scheme may use it to end in step. By default nothing changes."""
        return None

    def waiting_on(self, round_: int) -> list[int]:
        """Peers whose messages `round_` still waits for (for reports)."""
        return []

    def lag(self, round_: int) -> int:
        """Rounds this node is ahead of the oldest input it lacks, starting `round_`."""
        return 0

    def local_step(self, round_: int, grad: np.ndarray | None) -> list[Send]:
        raise SchemeError(f"node {self.rank} is not a worker")

    @abstractmethod
    def receive(self, msg: Partial) -> Receipt: ...

    def finish(self, rounds_done: int) -> list[Send]:
        self.finished = True
        return []

    def drained(self) -> bool:
        return True

    def settle(self) -> None:
        """Apply whatever arrived after the last step (after drained())."""
        return None

    def coded(self, message: Partial) -> Partial:
        """`message` as the run's codec puts it on the wire: its `values` are what every
        receiver decodes, and error feedback keeps what the codec did not carry (see
        akocore.codecs.exchange). A scheme whose own contribution must be the value its
        peers decode (diloco averages its own pseudo-gradient with theirs) encodes its
        message here and keeps the returned values; the hook leaves an already coded
        message as it is. Without a codec (or for a kind the codec never carries) it is
        `message` itself."""
        return message if self.encoder is None else self.encoder.encode_message(message)

    def withdraw(self, residual: np.ndarray) -> None:
        """The run's codec will never send `residual` (what error feedback still held
        at the drain). A scheme that applied its own contribution in full takes that
        part back here, so every replica holds the same decoded sum; by default the
        residual is simply dropped (see akocore.codecs.exchange)."""
        return None

    def suspend_peer(self, peer: int) -> None:
        """The shell found `peer` silent past the peer timeout: leave the gate."""
        self.suspended.add(peer)

    def agreed_state(self) -> np.ndarray | None:
        """What every replica that ran the same rounds holds bit-equal once settled (diloco:
        the anchor, the model of the last sync), for the shell's end-of-run check; None
        where the scheme claims no such state here."""
        return None

    def unfinished(self) -> str | None:
        """After settle: what this replica began but could not complete although its
        peers went on (diloco: a sync whose parts never all came because a peer ended it
        without this rank), as words for the shell's exit line; None when nothing is
        unfinished or the scheme tolerates it (ako's partitions are folded in whenever
        they come)."""
        return None

    def take_effects(self) -> list[Send]:
        """Sends an event that returns no effects made necessary (a suspended peer owned
        what others must now send elsewhere: diloco's all-reduce re-forms); the shell
        asks after `suspend_peer` and while it waits, and sends them."""
        return []

    def resume_peer(self, peer: int) -> None:
        """`peer` spoke again: it rejoins the gate."""
        self.suspended.discard(peer)

    # Capabilities (akocore.schemes.recovery): the node itself as what the shells
    # recover with, or None where it has no such capability; never a class check.

    def delivery(self) -> DeliveryRecorded | None:
        """This node as one that records which of each peer's rounds it holds (and, in
        timing-only mode, does nothing else with an in-order message)."""
        return None

    def recovery(self) -> Recoverable | None:
        """This node as one that can be checkpointed whole, rejoin, donate and catch up."""
        return None

    def resync(self) -> Resyncable | None:
        """This node as one whose replicas agree on a state at each sync, to re-sync."""
        return None

    def params_offset(self) -> int:
        """Where this node's parameters start in the full vector (a server: its shard)."""
        return 0

    def _check_round(self, round_: int) -> None:
        if self.finished:
            raise SchemeError(f"node {self.rank} already finished")
        if round_ != self.next_round:
            raise SchemeError(f"node {self.rank}: round {round_} given, {self.next_round} due")

    def _step_replica(self, round_: int, grad: np.ndarray | None,
                      blocked_by: Callable[[], str] | None = None) -> None:
        """The opening of a local step that trains a replica: the round and gradient
        checks; a SchemeError when `may_start(round_)` is false, naming what this round
        waits for (`blocked_by()`, for a scheme whose exchange must complete first); the own
        optimizer step; the next round due."""
        self._check_round(round_)
        self._check_grad(grad)
        if blocked_by is not None and not self.may_start(round_):
            raise SchemeError(f"node {self.rank}: round {round_} started before "
                              f"{blocked_by()}")
        if grad is not None:
            self.replica.apply(grad)
        self.next_round = round_ + 1

    def _check_grad(self, grad: np.ndarray | None) -> None:
        if self.replica.has_data:
            if grad is None or grad.shape != (self.length,):
                raise SchemeError(f"node {self.rank}: gradient must have shape ({self.length},)")
        elif grad is not None:
            raise SchemeError(f"node {self.rank} is timing-only and takes no gradient values")

    def _check_values(self, msg: Partial) -> None:
        if msg.offset < 0 or msg.length < 0 or msg.offset + msg.length > self.length:
            raise SchemeError(
                f"message [{msg.offset}, {msg.offset + msg.length}) outside the vector "
                f"of length {self.length}"
            )
        if self.replica.has_data:
            if msg.values is None or msg.values.shape != (msg.length,):
                raise SchemeError(f"message from {msg.sender} carries no values of length "
                                  f"{msg.length}")

    def _partial(self, kind: Kind, round_: int, part: int, p: int, start: int, stop: int,
                 source: np.ndarray | None, final: bool = False) -> Partial:
        values = None if source is None else source[start:stop].copy()
        return Partial(kind, self.rank, round_, part, p, start, stop - start, values, final)
