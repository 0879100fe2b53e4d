"""Per-node exchange state machines: ako, ps (sync and async) and allreduce.

A scheme node takes events and returns effects; it never sleeps, sends or
reads a clock. The shells drive every worker node the same way:

    t = 0
    while the run goes on:
        wait until node.may_start(t)            # the SSP gate
        grad = gradient of node.params          # None in timing-only mode
        deliver node.local_step(t, grad)        # Send effects
        t += 1
    deliver node.finish(t)                       # flush what is still owed
    wait until node.drained()                    # every live peer's last message
    node.settle()                                # fold in what arrived last

and hand every message that arrives to `node.receive(msg)`, delivering the
effects of its Receipt. Server nodes (ps) only receive.

Each node owns its replica as one flat float32 vector (`params`) and applies
updates through a FlatOptimizer. With `params=None` a node does all the
bookkeeping (who sends what to whom, how long, which round) without any
arithmetic: that is akosim's timing-only mode.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from akocore import ssp
from akocore.messages import Kind, Partial, Receipt, Send
from akocore.optim import FlatOptimizer
from akocore.partition import (
    accumulate_and_take,
    check_p,
    partition_bounds,
    partition_slice,
)

SCHEMES = ("ako", "ps", "allreduce")
SCHEDULES = ("staggered", "aligned")
REDUCES = ("mean", "sum")
PS_MODES = ("sync", "async")


class SchemeError(ValueError):
    """A message that no correct peer could have sent (wrong kind, range, p)."""


def ako_partition(rank: int, round_: int, p: int, schedule: str) -> int:
    """Partition a worker sends at a round: (t + i) mod p staggered, t mod p aligned."""
    if schedule == "staggered":
        return (round_ + rank) % p
    if schedule == "aligned":
        return round_ % p
    raise ValueError(f"schedule: got {schedule!r}, expected one of {', '.join(SCHEDULES)}")


def copy_or_none(array: np.ndarray | None) -> np.ndarray | None:
    return None if array is None else np.array(array, dtype=np.float32, copy=True)


def _scale(reduce: str, n: int) -> float:
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
    length: int

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

    def suspend_peer(self, peer: int) -> None:
        """The shell found `peer` silent past the peer timeout: leave the gate."""
        self.suspended.add(peer)

    def resume_peer(self, peer: int) -> None:
        """`peer` spoke again: it rejoins the gate."""
        self.suspended.discard(peer)

    def _check_round(self, round_: int) -> None:
        if self.finished:
            raise SchemeError(f"node {self.rank} already finished")
        if round_ != self.next_round:
            raise SchemeError(f"node {self.rank}: round {round_} given, {self.next_round} due")

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


# --------------------------------------------------------------------------- ako


@dataclass(frozen=True)
class SharedDeliveryMatrix:
    """Every simulated ako node's delivery rows in one matrix: rounds[i, j] is
    r_j as seen by node i. Lets a simulator deliver a multicast in one step."""

    rounds: np.ndarray  # (n, n) int64
    pending: np.ndarray  # (n, n) bool: node i holds out-of-order rounds of j

    @classmethod
    def create(cls, n: int) -> SharedDeliveryMatrix:
        return cls(np.full((n, n), -1, dtype=np.int64), np.zeros((n, n), dtype=bool))


def receive_multicast(nodes: Sequence[SchemeNode], dests: np.ndarray,
                      msg: Partial) -> tuple[int, list[tuple[int, Send]]]:
    """Deliver one message to every node in `dests`: (duplicates, (node, effect)s).

    Timing-only ako nodes sharing a SharedDeliveryMatrix take an in-order
    message in one vectorised step (the same record a per-node receive makes);
    anything else goes through each node's own `receive`.
    """
    first = nodes[int(dests[0])]
    if (isinstance(first, AkoWorker) and first.shared is not None and first.inbox is None
            and not msg.final and dests.size > 1):
        first.validate(msg)
        shared, sender = first.shared, msg.sender
        column = shared.rounds[dests, sender]
        if (column == msg.round - 1).all() and not shared.pending[dests, sender].any():
            shared.rounds[dests, sender] = msg.round
            return 0, []
    duplicates = 0
    effects: list[tuple[int, Send]] = []
    for dest in dests.tolist():
        receipt = nodes[dest].receive(msg)
        duplicates += not receipt.accepted
        effects.extend((dest, effect) for effect in receipt.effects)
    return duplicates, effects


DeliveryRecord = dict[int, tuple[int, dict[int, list[int]]]]


@dataclass(frozen=True)
class AkoState:
    """Everything an ako worker holds, for checkpoints (optimizer state aside)."""

    rank: int
    next_round: int
    params: np.ndarray | None
    unsent: np.ndarray | None
    inbox: np.ndarray | None
    log: DeliveryRecord
    final_round: dict[int, int]


@dataclass(frozen=True)
class RejoinSnapshot:
    """What a live ako worker hands a restarted peer so that it rejoins exactly.

    The joiner takes the donor's parameters, the donor's record of what it has
    received (so the joiner drops those messages as duplicates) and, for the
    donor's own messages, "everything up to the donor's last round". What the
    donor has received but not applied (inbox) is owed to the joiner's next
    step; what the donor has applied but not yet sent (unsent) will reach the
    joiner again in the donor's later rounds, so it is subtracted now:
    correction = inbox - unsent. With plain SGD the joiner then ends exactly
    equal to its peers; what the dead worker never sent is lost for everyone.
    """

    donor: int
    params: np.ndarray
    correction: np.ndarray
    log: DeliveryRecord


class AkoWorker(SchemeNode):
    """Ako: each round send one of p partitions of the unsent gradient to every peer.

    One unsent buffer per partition (one vector of length D overall): every
    local gradient is added to all of it; at round t partition
    k = (t + rank) mod p is sent to every peer and its buffer reset. At its
    step a worker applies (own gradient + partials received since its last
    step) * scale. `finish` sends the p - 1 partitions still owed as extra
    rounds, the last one marked final, so every contribution reaches every
    peer exactly once.
    """

    def __init__(self, rank: int, workers: int, length: int, p_of: Sequence[int], *,
                 replica: Replica, staleness: float = 0.0, schedule: str = "staggered",
                 reduce: str = "mean", shared: SharedDeliveryMatrix | None = None) -> None:
        super().__init__(rank, length, replica)
        if len(p_of) != workers:
            raise ValueError(f"need one p per worker ({workers}), got {len(p_of)}")
        for p in p_of:
            check_p(length, p)
        ako_partition(0, 0, 1, schedule)  # validates the schedule name
        self.workers = workers
        self.p_of = tuple(int(p) for p in p_of)
        self.p = self.p_of[rank]
        self.staleness = staleness
        self.schedule = schedule
        self.scale = _scale(reduce, workers)
        self.peers = tuple(j for j in range(workers) if j != rank)
        rows = (None, None) if shared is None else (shared.rounds[rank], shared.pending[rank])
        self.log = ssp.DeliveryLog(self.peers, lambda sender, round_: 1, size=workers,
                                   rounds_row=rows[0], pending_row=rows[1])
        self.shared = shared
        self.final_round: dict[int, int] = {}
        self._final = np.full(workers, np.inf)  # final round per peer, inf until known
        self._peer_mask = np.ones(workers, dtype=bool)
        self._peer_mask[rank] = False
        self.unsent = np.zeros(length, np.float32) if replica.has_data else None
        self.inbox = np.zeros(length, np.float32) if replica.has_data else None

    def peer_done(self, peer: int) -> bool:
        return bool(self.log.contiguous[peer] >= self._final[peer])

    def _set_final(self, peer: int, round_: int | None) -> None:
        if round_ is None:
            self.final_round.pop(peer, None)
            self._final[peer] = np.inf
        else:
            self.final_round[peer] = round_
            self._final[peer] = round_

    def _gate_mask(self) -> np.ndarray:
        mask = self._peer_mask & (self.log.contiguous < self._final)
        if self.suspended:
            mask[list(self.suspended)] = False
        return mask

    def _gate_peers(self) -> list[int]:
        return np.flatnonzero(self._gate_mask()).tolist()

    def may_start(self, round_: int) -> bool:
        if round_ <= 0 or math.isinf(self.staleness):
            return True
        return ssp.may_start(round_, self.log.contiguous[self._gate_mask()], self.staleness)

    def waiting_on(self, round_: int) -> list[int]:
        return ssp.blocking_peers(round_, self.log.contiguous, self._gate_peers(), self.staleness)

    def lag(self, round_: int) -> int:
        rounds = self.log.contiguous[self._gate_mask()]
        if round_ <= 0 or rounds.size == 0:
            return 0
        return max(0, round_ - 1 - int(rounds.min()))

    def _send_round(self, round_: int, final: bool) -> Send:
        k = ako_partition(self.rank, round_, self.p, self.schedule)
        start, stop = partition_slice(self.length, self.p, k)
        msg = self._partial(Kind.GRAD, round_, k, self.p, start, stop, self.unsent, final)
        if self.unsent is not None:
            self.unsent[start:stop] = 0.0
        return Send(self.peers, msg)

    def local_step(self, round_: int, grad: np.ndarray | None) -> list[Send]:
        self._check_round(round_)
        self._check_grad(grad)
        if self.unsent is not None and self.inbox is not None and grad is not None:
            k = ako_partition(self.rank, round_, self.p, self.schedule)
            start, stop = partition_slice(self.length, self.p, k)
            values = accumulate_and_take(self.unsent, grad, start, stop)
            send = Send(self.peers, Partial(Kind.GRAD, self.rank, round_, k, self.p, start,
                                            stop - start, values))
            update = (grad + self.inbox) * np.float32(self.scale)
            self.inbox[:] = 0.0
            self.replica.apply(update)
        else:
            send = self._send_round(round_, final=False)
        self.next_round = round_ + 1
        return [send]

    def finish(self, rounds_done: int) -> list[Send]:
        if rounds_done != self.next_round:
            raise SchemeError(f"node {self.rank}: finish after {rounds_done} rounds, "
                              f"{self.next_round} done")
        self.finished = True
        if self.p == 1:  # nothing is ever owed: a zero-length final marker
            marker = Partial(Kind.GRAD, self.rank, rounds_done, 0, 1, 0, 0,
                             None if self.unsent is None else np.zeros(0, np.float32), True)
            return [Send(self.peers, marker)]
        flush = self.p - 1
        return [self._send_round(rounds_done + i, final=i == flush - 1) for i in range(flush)]

    def validate(self, msg: Partial) -> None:
        """Refuse a message no correct ako peer sends (SchemeError)."""
        if msg.kind != Kind.GRAD or not self.log.knows(msg.sender):
            raise SchemeError(f"ako worker {self.rank}: unexpected {msg.kind.name} "
                              f"from node {msg.sender}")
        sender_p = self.p_of[msg.sender]
        if msg.p != sender_p or not 0 <= msg.part < sender_p:
            raise SchemeError(f"node {msg.sender} uses p={sender_p}, message says p={msg.p} "
                              f"part {msg.part}")
        if not (msg.final and msg.length == 0):
            if (msg.offset, msg.offset + msg.length) != partition_slice(
                    self.length, sender_p, msg.part):
                raise SchemeError(f"partition {msg.part} of {sender_p} does not span "
                                  f"[{msg.offset}, {msg.offset + msg.length})")
        self._check_values(msg)

    def receive(self, msg: Partial) -> Receipt:
        self.validate(msg)
        if not self.log.record(msg.sender, msg.round, msg.part):
            return Receipt(False)
        if msg.final:
            self._set_final(msg.sender, msg.round)
        if self.inbox is not None and msg.length:
            assert msg.values is not None
            self.inbox[msg.offset:msg.offset + msg.length] += msg.values
        return Receipt(True)

    def drained(self) -> bool:
        return all(self.peer_done(j) or j in self.suspended for j in self.peers)

    def settle(self) -> None:
        if self.inbox is not None and np.any(self.inbox):
            self.replica.apply(self.inbox * np.float32(self.scale))
            self.inbox[:] = 0.0

    def peer_restarted(self, peer: int, first_round: int) -> None:
        """`peer` restarted and numbers its rounds from `first_round` on."""
        self.log.skip_to(peer, first_round - 1)
        self._set_final(peer, None)
        self.suspended.discard(peer)

    def rejoin_snapshot(self, joiner: int) -> RejoinSnapshot:
        if self.replica.params is None or self.inbox is None or self.unsent is None:
            raise SchemeError("a timing-only node has no state to hand over")
        record = {j: r for j, r in self.log.export().items() if j != joiner}
        record[self.rank] = (self.next_round - 1, {})
        return RejoinSnapshot(self.rank, self.replica.params.copy(),
                              self.inbox - self.unsent, record)

    def adopt(self, snapshot: RejoinSnapshot, first_round: int) -> None:
        """Become consistent with a donor; number own rounds from `first_round`."""
        if self.inbox is None or self.unsent is None:
            raise SchemeError("a timing-only node cannot adopt a snapshot")
        if snapshot.params.shape != (self.length,):
            raise SchemeError(f"snapshot has {snapshot.params.shape[0]} parameters, "
                              f"this model {self.length}")
        self.replica.params = np.array(snapshot.params, dtype=np.float32, copy=True)
        self.inbox[:] = snapshot.correction
        self.unsent[:] = 0.0
        self.log.load({j: r for j, r in snapshot.log.items() if j != self.rank})
        self.final_round.clear()
        self._final[:] = np.inf
        self.next_round = first_round
        self.finished = False

    def state(self) -> AkoState:
        def copy(a: np.ndarray | None) -> np.ndarray | None:
            return None if a is None else a.copy()

        return AkoState(self.rank, self.next_round, copy(self.replica.params),
                        copy(self.unsent), copy(self.inbox), self.log.export(),
                        dict(self.final_round))

    def load_state(self, state: AkoState) -> None:
        if state.rank != self.rank:
            raise SchemeError(f"state of worker {state.rank} given to worker {self.rank}")
        for name, have, new in (("params", self.replica.params, state.params),
                                ("unsent", self.unsent, state.unsent),
                                ("inbox", self.inbox, state.inbox)):
            if (have is None) != (new is None) or (
                    new is not None and have is not None and new.shape != have.shape):
                raise SchemeError(f"checkpoint {name} does not fit this model")
        self.replica.params = copy_or_none(state.params)
        self.unsent = copy_or_none(state.unsent)
        self.inbox = copy_or_none(state.inbox)
        self.log.load(state.log)
        self.final_round = {}
        self._final[:] = np.inf
        for peer, final in state.final_round.items():
            self._set_final(int(peer), int(final))
        self.next_round = state.next_round


# ---------------------------------------------------------------------------- ps


@dataclass(frozen=True)
class PSLayout:
    """Ranks 0..workers-1 are workers, the next `servers` ranks hold shards."""

    workers: int
    servers: int
    length: int

    def __post_init__(self) -> None:
        if self.workers < 1 or self.servers < 1:
            raise ValueError("ps needs at least one worker and one server")
        check_p(self.length, self.servers)

    def server_rank(self, shard: int) -> int:
        return self.workers + shard

    def shard_of(self, rank: int) -> int:
        return rank - self.workers

    def shard_slice(self, shard: int) -> tuple[int, int]:
        return partition_slice(self.length, self.servers, shard)

    @property
    def server_ranks(self) -> tuple[int, ...]:
        return tuple(range(self.workers, self.workers + self.servers))


class PSWorker(SchemeNode):
    """A parameter-server worker: push gradient shards, receive parameter shards.

    sync: push every round, then wait for every server's parameters of that
    round before starting the next. async (DOWNPOUR-style): accumulate and push
    every `push_every` rounds, fetch every `fetch_every` rounds; the gate lets
    the worker run up to `staleness` rounds past its oldest unanswered fetch.
    """

    def __init__(self, rank: int, layout: PSLayout, *, replica: Replica, mode: str = "sync",
                 staleness: float = 0.0, push_every: int = 1, fetch_every: int = 1) -> None:
        super().__init__(rank, layout.length, replica)
        if mode not in PS_MODES:
            raise ValueError(f"ps mode: got {mode!r}, expected one of {', '.join(PS_MODES)}")
        if push_every < 1 or fetch_every < 1:
            raise ValueError("push_every and fetch_every must be >= 1")
        self.layout = layout
        self.mode = mode
        self.staleness = 0.0 if mode == "sync" else staleness
        self.push_every = 1 if mode == "sync" else push_every
        self.fetch_every = 1 if mode == "sync" else fetch_every
        self.unpushed = np.zeros(self.length, np.float32) if replica.has_data else None
        # fetch round -> servers still to answer it
        self.outstanding: dict[int, set[int]] = {}
        self.latest_params_round = {s: -1 for s in layout.server_ranks}

    def _fetches(self, round_: int) -> bool:
        return (round_ + 1) % self.fetch_every == 0

    def _pushes(self, round_: int) -> bool:
        return (round_ + 1) % self.push_every == 0

    def _sends(self, round_: int, push: bool, fetch: bool, final: bool) -> list[Send]:
        sends = []
        for shard, server in enumerate(self.layout.server_ranks):
            start, stop = self.layout.shard_slice(shard)
            if push:
                msg = self._partial(Kind.PUSH, round_, shard, self.layout.servers, start, stop,
                                    self.unpushed, final)
            else:
                msg = Partial(Kind.PULL, self.rank, round_, shard, self.layout.servers, start, 0,
                              None if self.unpushed is None else np.zeros(0, np.float32), final)
            sends.append(Send((server,), msg))
        if push and self.unpushed is not None:
            self.unpushed[:] = 0.0
        if fetch or final:
            self.outstanding[round_] = set(self.layout.server_ranks)
        return sends

    def local_step(self, round_: int, grad: np.ndarray | None) -> list[Send]:
        self._check_round(round_)
        self._check_grad(grad)
        if self.unpushed is not None and grad is not None:
            self.unpushed += grad
        push, fetch = self._pushes(round_), self._fetches(round_)
        self.next_round = round_ + 1
        if not push and not fetch:
            return []
        return self._sends(round_, push, fetch, final=False)

    def finish(self, rounds_done: int) -> list[Send]:
        if rounds_done != self.next_round:
            raise SchemeError(f"node {self.rank}: finish after {rounds_done} rounds")
        self.finished = True
        owed = self.unpushed is not None and bool(np.any(self.unpushed))
        if self.mode == "async" and (owed or self.unpushed is None):
            return self._sends(rounds_done, push=True, fetch=True, final=True)
        return self._sends(rounds_done, push=False, fetch=True, final=True)

    def _open_fetches(self) -> list[int]:
        return sorted(r for r, servers in self.outstanding.items()
                      if servers - self.suspended)

    def may_start(self, round_: int) -> bool:
        """Round t may start while every fetch issued at rounds <= t-1-s is answered."""
        if round_ == 0 or math.isinf(self.staleness):
            return True
        open_rounds = self._open_fetches()
        return not open_rounds or open_rounds[0] > (round_ - 1) - self.staleness

    def waiting_on(self, round_: int) -> list[int]:
        if self.may_start(round_):
            return []
        return sorted(set().union(*self.outstanding.values()) - self.suspended)

    def lag(self, round_: int) -> int:
        open_rounds = self._open_fetches()
        return max(0, round_ - 1 - open_rounds[0] + 1) if open_rounds and round_ > 0 else 0

    def receive(self, msg: Partial) -> Receipt:
        if msg.kind != Kind.PARAMS or msg.sender not in self.latest_params_round:
            raise SchemeError(f"ps worker {self.rank}: unexpected {msg.kind.name} "
                              f"from node {msg.sender}")
        shard = self.layout.shard_of(msg.sender)
        if (msg.offset, msg.offset + msg.length) != self.layout.shard_slice(shard):
            raise SchemeError(f"shard {shard} does not span [{msg.offset}, "
                              f"{msg.offset + msg.length})")
        self._check_values(msg)
        waiting = self.outstanding.get(msg.round)
        if waiting is None or msg.sender not in waiting:
            return Receipt(False)
        waiting.discard(msg.sender)
        if not waiting:
            del self.outstanding[msg.round]
        if msg.round > self.latest_params_round[msg.sender]:
            self.latest_params_round[msg.sender] = msg.round
            if self.replica.params is not None and msg.values is not None:
                self.replica.params[msg.offset:msg.offset + msg.length] = msg.values
        return Receipt(True)

    def drained(self) -> bool:
        return not self._open_fetches()


class PSServer(SchemeNode):
    """A parameter-server shard: apply pushed gradients, answer with parameters.

    sync: sum every live worker's push of round t, apply once (scaled), then
    send the shard to every worker. async: apply each push on arrival and
    answer the pusher (when that round fetches) or a pull.
    """

    is_worker = False

    def __init__(self, rank: int, layout: PSLayout, *, replica: Replica, mode: str = "sync",
                 reduce: str = "mean", fetch_every: int = 1) -> None:
        shard = layout.shard_of(rank)
        start, stop = layout.shard_slice(shard)
        if replica.params is not None and replica.params.shape != (stop - start,):
            raise ValueError(f"server {rank} holds shard of length {stop - start}")
        super().__init__(rank, layout.length, replica)
        if mode not in PS_MODES:
            raise ValueError(f"ps mode: got {mode!r}, expected one of {', '.join(PS_MODES)}")
        self.layout = layout
        self.shard = shard
        self.start, self.stop = start, stop
        self.mode = mode
        self.fetch_every = 1 if mode == "sync" else fetch_every
        self.scale = np.float32(_scale(reduce, layout.workers))
        workers = range(layout.workers)
        self.log = ssp.DeliveryLog(workers, lambda sender, round_: 1)
        self.final_round: dict[int, int] = {}
        self.sums: dict[int, np.ndarray | None] = {}
        self.applied_round = -1  # sync: last round applied
        self.unanswered_finals: set[int] = set()

    def _params_to(self, dests: tuple[int, ...], round_: int) -> Send:
        values = None if self.replica.params is None else self.replica.params.copy()
        msg = Partial(Kind.PARAMS, self.rank, round_, self.shard, self.layout.servers,
                      self.start, self.stop - self.start, values)
        return Send(dests, msg)

    def _live_in_round(self, round_: int) -> list[int]:
        return [w for w in range(self.layout.workers)
                if w not in self.suspended and self.final_round.get(w, math.inf) > round_]

    def receive(self, msg: Partial) -> Receipt:
        if msg.kind not in (Kind.PUSH, Kind.PULL) or not self.log.knows(msg.sender):
            raise SchemeError(f"ps server {self.rank}: unexpected {msg.kind.name} "
                              f"from node {msg.sender}")
        if msg.kind == Kind.PUSH and (msg.offset, msg.offset + msg.length) != (
                self.start, self.stop):
            raise SchemeError(f"push to shard {self.shard} must span [{self.start}, {self.stop})")
        self._check_values(msg)
        if not self.log.record(msg.sender, msg.round, 0):
            return Receipt(False)
        if msg.final:
            self.final_round[msg.sender] = msg.round
        if self.mode == "async":
            return Receipt(True, self._receive_async(msg))
        return Receipt(True, self._receive_sync(msg))

    def _receive_async(self, msg: Partial) -> tuple[Send, ...]:
        if msg.kind == Kind.PUSH and self.replica.params is not None:
            assert msg.values is not None
            self.replica.apply(msg.values * self.scale)
        if msg.kind == Kind.PULL or msg.final or (msg.round + 1) % self.fetch_every == 0:
            return (self._params_to((msg.sender,), msg.round),)
        return ()

    def _receive_sync(self, msg: Partial) -> tuple[Send, ...]:
        if msg.kind == Kind.PUSH:
            if msg.round <= self.applied_round:
                raise SchemeError(f"push for round {msg.round} after it was applied")
            total = self.sums.get(msg.round)
            if msg.values is not None:
                self.sums[msg.round] = msg.values.copy() if total is None else total + msg.values
            else:
                self.sums.setdefault(msg.round, None)
        if msg.final:
            self.unanswered_finals.add(msg.sender)
        effects = self._complete_rounds()
        # answer a final marker once every round before it is applied, so the
        # worker's last parameters are the newest it could see
        ready = [w for w in self.unanswered_finals
                 if self.final_round[w] - 1 <= self.applied_round]
        for w in sorted(ready):
            self.unanswered_finals.discard(w)
            effects.append(self._params_to((w,), self.final_round[w]))
        return tuple(effects)

    def _complete_rounds(self) -> list[Send]:
        effects: list[Send] = []
        while True:
            round_ = self.applied_round + 1
            live = self._live_in_round(round_)
            if not live or any(self.log.contiguous[w] < round_ for w in live):
                return effects
            total = self.sums.pop(round_, None)
            if total is not None and self.replica.params is not None:
                self.replica.apply(total * self.scale)
            self.applied_round = round_
            effects.append(self._params_to(tuple(live), round_))

    def drained(self) -> bool:
        return all(w in self.final_round or w in self.suspended
                   for w in range(self.layout.workers))


# --------------------------------------------------------------------- allreduce


class AllReduceWorker(SchemeNode):
    """Ring all-reduce of the full gradient each round, then a mean update.

    The vector is cut into n chunks. Reduce-scatter: at step s worker i sends
    chunk (i - s) mod n to i + 1, which adds it to its own. All-gather: at
    step s worker i sends its complete chunk (i + 1 - s) mod n to i + 1, which
    overwrites. Messages carry `part` = step (0..n-2 reduce, n-1..2n-3 gather).
    Rounds are lockstep: round t + 1 starts when round t's ring is complete.
    """

    def __init__(self, rank: int, workers: int, length: int, *, replica: Replica,
                 reduce: str = "mean") -> None:
        super().__init__(rank, length, replica)
        if workers < 2:
            raise ValueError("allreduce needs at least 2 workers")
        check_p(length, workers)
        self.workers = workers
        self.scale = np.float32(_scale(reduce, workers))
        self.bounds = partition_bounds(length, workers)
        self.next = (rank + 1) % workers
        self.prev = (rank - 1) % workers
        self.steps = 2 * (workers - 1)
        self.log = ssp.DeliveryLog((self.prev,), lambda sender, round_: self.steps)
        self.acc: np.ndarray | None = None
        self.active_round = -1  # round whose ring is in progress
        self.done_step = -1  # last processed step of the active round
        self.held: dict[tuple[int, int], Partial] = {}
        self.completed_round = -1

    def _chunk_send(self, round_: int, step: int) -> Send:
        n = self.workers
        if step < n - 1:
            kind, chunk = Kind.REDUCE, (self.rank - step) % n
        else:
            kind, chunk = Kind.GATHER, (self.rank + 1 - (step - (n - 1))) % n
        start, stop = int(self.bounds[chunk]), int(self.bounds[chunk + 1])
        return Send((self.next,), self._partial(kind, round_, step, n, start, stop, self.acc))

    def may_start(self, round_: int) -> bool:
        return round_ == 0 or self.completed_round >= round_ - 1

    def waiting_on(self, round_: int) -> list[int]:
        return [] if self.may_start(round_) else [self.prev]

    def local_step(self, round_: int, grad: np.ndarray | None) -> list[Send]:
        self._check_round(round_)
        self._check_grad(grad)
        if not self.may_start(round_):
            raise SchemeError(f"node {self.rank}: round {round_} started before the ring "
                              f"of round {round_ - 1} completed")
        self.acc = None if grad is None else np.array(grad, dtype=np.float32, copy=True)
        self.active_round, self.done_step = round_, -1
        self.next_round = round_ + 1
        effects = [self._chunk_send(round_, 0)]
        effects.extend(self._process_held())
        return effects

    def receive(self, msg: Partial) -> Receipt:
        if msg.kind not in (Kind.REDUCE, Kind.GATHER) or msg.sender != self.prev:
            raise SchemeError(f"allreduce worker {self.rank}: unexpected {msg.kind.name} "
                              f"from node {msg.sender}")
        if not 0 <= msg.part < self.steps:
            raise SchemeError(f"ring step {msg.part} out of range")
        self._check_values(msg)
        if not self.log.record(msg.sender, msg.round, msg.part):
            return Receipt(False)
        self.held[(msg.round, msg.part)] = msg
        return Receipt(True, tuple(self._process_held()))

    def _process_held(self) -> list[Send]:
        effects: list[Send] = []
        n = self.workers
        while (self.active_round, self.done_step + 1) in self.held:
            step = self.done_step + 1
            msg = self.held.pop((self.active_round, step))
            if self.acc is not None and msg.values is not None:
                window = slice(msg.offset, msg.offset + msg.length)
                if step < n - 1:
                    self.acc[window] += msg.values
                else:
                    self.acc[window] = msg.values
            self.done_step = step
            if step + 1 < self.steps:
                effects.append(self._chunk_send(self.active_round, step + 1))
            else:
                if self.acc is not None:
                    self.replica.apply(self.acc * self.scale)
                self.completed_round = self.active_round
        return effects

    def drained(self) -> bool:
        return self.completed_round >= self.next_round - 1


# ----------------------------------------------------------------------- factory


@dataclass(frozen=True)
class SchemeSpec:
    """Everything needed to build the nodes of one run."""

    scheme: str = "ako"
    workers: int = 4  # total nodes (ps: workers + servers)
    p_of: tuple[int, ...] = (1,)  # ako: one per worker, or one for all
    staleness: float = 0.0
    schedule: str = "staggered"
    reduce: str = "mean"
    ps_servers: int = 1
    ps_mode: str = "sync"
    push_every: int = 1
    fetch_every: int = 1

    def __post_init__(self) -> None:
        if self.scheme not in SCHEMES:
            raise ValueError(f"scheme: got {self.scheme!r}, expected one of {', '.join(SCHEMES)}")
        if self.workers < 2:
            raise ValueError(f"workers: got {self.workers}, expected >= 2")
        if self.staleness < 0:
            raise ValueError(f"ssp: got {self.staleness}, expected >= 0 or inf")
        if self.scheme == "ps" and not 1 <= self.ps_servers < self.workers:
            raise ValueError(f"ps_servers: got {self.ps_servers}, expected 1..{self.workers - 1} "
                             f"(the rest of the {self.workers} nodes are workers)")

    @property
    def training_workers(self) -> int:
        """Nodes that compute gradients (ps: all but the servers)."""
        return self.workers - self.ps_servers if self.scheme == "ps" else self.workers

    def p_list(self) -> tuple[int, ...]:
        if len(self.p_of) == 1:
            return self.p_of * self.workers
        if len(self.p_of) != self.workers:
            raise ValueError(f"p: got {len(self.p_of)} values, expected 1 or {self.workers}")
        return self.p_of


def build_nodes(spec: SchemeSpec, length: int, params0: np.ndarray | None,
                optimizer: FlatOptimizer | None) -> list[SchemeNode]:
    """All nodes of a run, ranks 0..workers-1 (ps servers last)."""

    def replica(params: np.ndarray | None) -> Replica:
        return Replica(params, optimizer if params is not None else None)

    if params0 is not None and params0.shape != (length,):
        raise ValueError(f"initial parameters must have shape ({length},)")
    if spec.scheme == "ako":
        p_of = spec.p_list()
        shared = SharedDeliveryMatrix.create(spec.workers) if params0 is None else None
        return [AkoWorker(i, spec.workers, length, p_of, replica=replica(params0),
                          staleness=spec.staleness, schedule=spec.schedule, reduce=spec.reduce,
                          shared=shared)
                for i in range(spec.workers)]
    if spec.scheme == "allreduce":
        return [AllReduceWorker(i, spec.workers, length, replica=replica(params0),
                                reduce=spec.reduce) for i in range(spec.workers)]
    layout = PSLayout(spec.training_workers, spec.ps_servers, length)
    nodes: list[SchemeNode] = [
        PSWorker(i, layout, replica=replica(params0), mode=spec.ps_mode,
                 staleness=spec.staleness, push_every=spec.push_every,
                 fetch_every=spec.fetch_every)
        for i in range(layout.workers)]
    for shard, rank in enumerate(layout.server_ranks):
        start, stop = layout.shard_slice(shard)
        shard_params = None if params0 is None else params0[start:stop]
        nodes.append(PSServer(rank, layout, replica=replica(shard_params), mode=spec.ps_mode,
                              reduce=spec.reduce, fetch_every=spec.fetch_every))
    return nodes
