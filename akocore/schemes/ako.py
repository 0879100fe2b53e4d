"""Ako: each round, one of p partitions of the unsent gradient goes to every peer.

`AkoWorker` is the ako scheme node; `ako_partition` is the partition schedule
(staggered or aligned). An ako worker is recoverable (akocore.schemes.recovery:
checkpoints, rejoin snapshots, catch-up, a relay's delivery record; the plain
data it hands out, `RecoveryState` and `RejoinSnapshot`, is defined there).
Delivery records live in an
akocore.ssp.DeliveryLog (`log`), which a simulator may keep in shared rows
(`DeliveryLog.share_rows`) to deliver a multicast in one step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from akocore import ssp
from akocore.messages import Kind, Partial, Receipt, Send
from akocore.partition import accumulate_and_take, check_p, partition_slice
from akocore.schemes.base import Replica, SchemeError, SchemeNode, copy_or_none, reduce_scale
from akocore.schemes.knobs import SchemeSettings, knob
from akocore.schemes.protocol import ExchangeView, ReplicaOf, Scheme
from akocore.schemes.recovery import RecoveryState, RejoinSnapshot
from akocore.settings.normalise import as_flush

if TYPE_CHECKING:
    from akocore.schemes.factory import SchemeSpec

SCHEDULES = ("staggered", "aligned")


def flush_weight(flush: str | float, workers: int) -> float:
    """The fraction of what is still owed at the end that every replica applies:
    "average" 1/workers (every replica ends at the mean of the replicas as they
    stood when their senders finished), "full" 1 (the exact sum of every gradient),
    or a fraction 0 < w <= 1 as given."""
    named = {"average": 1.0 / workers, "full": 1.0}
    weight = named.get(flush) if isinstance(flush, str) else float(flush)
    if weight is None or not 0.0 < weight <= 1.0:
        raise ValueError(f"flush: got {flush!r}, expected average, full or a fraction "
                         f"0 < w <= 1")
    return weight


def ako_partition(rank: int, round_: int, p: int, schedule: str) -> int:
    """Partition a worker sends at a round: (t + i) mod p staggered, t mod p aligned."""
    if schedule == "staggered":
        return (round_ + rank) % p
    if schedule == "aligned":
        return round_ % p
    raise ValueError(f"schedule: got {schedule!r}, expected one of {', '.join(SCHEDULES)}")


class AkoWorker(SchemeNode):
    """Ako: each round send one of p partitions of the unsent gradient to every peer.

    One unsent buffer per partition (one vector of length D overall): every
    local gradient is added to all of it; at round t partition
    k = (t + rank) mod p is sent to every peer and its buffer reset. At its
    step a worker applies (own gradient + partials received since its last
    step) * scale. `finish` sends the p - 1 partitions still owed as extra
    rounds, the last one marked final, so every contribution reaches every
    peer exactly once.

    `flush_weight` w scales what that final flush carries: the sender sends w
    times what it still owes and, with a linear optimizer (plain SGD), takes the
    other 1 - w of it back from its own replica, so every replica still ends
    equal: at theta0 - lr * scale * (every gradient - (1 - w) * what every
    worker still owed when it finished). w = 1/n puts every replica at the mean
    of the replicas as they stood then (each had applied its own owed
    gradients, and only those); w = 1 applies every gradient in full. A
    stateful optimizer cannot take an update back exactly: it flushes in full.
    """

    def __init__(self, rank: int, workers: int, length: int, p_of: Sequence[int], *,
                 replica: Replica, staleness: float = 0.0, schedule: str = "staggered",
                 reduce: str = "mean", flush_weight: float = 1.0) -> None:
        super().__init__(rank, length, replica)
        if not 0.0 < flush_weight <= 1.0:
            raise ValueError(f"flush_weight: got {flush_weight}, expected 0 < w <= 1")
        self.flush_weight = flush_weight
        if len(p_of) != workers:
            raise ValueError(f"need one p per worker ({workers}), got {len(p_of)}")
        self.p_of = _checked_p_of(length, tuple(p_of))
        ako_partition(0, 0, 1, schedule)  # validates the schedule name
        self.workers = workers
        self.p = self.p_of[rank]
        self.staleness = staleness
        self.schedule = schedule
        self.scale = reduce_scale(reduce, workers)
        self.peers = (*range(rank), *range(rank + 1, workers))
        self.log = ssp.DeliveryLog(self.peers, lambda sender, round_: 1, size=workers)
        self.final_round: dict[int, int] = {}
        self._final = np.full(workers, np.inf)  # final round per peer, inf until known
        self._peer_mask = np.ones(workers, dtype=bool)
        self._peer_mask[rank] = False
        self.last_round: int | None = None  # the run's last round, when known before
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

    def _gated_min_round(self) -> int | None:
        """min over the gated peers of the round each is contiguous through (None: no
        peer gates). With no final round known and no peer suspended every peer
        gates: the two slices around this rank, without building a mask (a 1,024-worker
        simulation asks this a few times per worker and round)."""
        contiguous = self.log.contiguous
        if self.final_round or self.suspended:
            rounds = contiguous[self._gate_mask()]
            return int(rounds.min()) if rounds.size else None
        rank = self.rank
        lows = [int(part.min()) for part in (contiguous[:rank], contiguous[rank + 1:])
                if part.size]
        return min(lows) if lows else None

    def plan_rounds(self, rounds: int) -> None:
        """The run stops after `rounds` rounds: over its last s rounds the SSP bound
        shrinks by one a round, to 0 at the last, so the workers end together. A worker
        s rounds ahead would otherwise stop there and then take its peers' last s
        rounds of gradients in one go, with no step of its own after them."""
        self.last_round = rounds - 1

    def bound(self, round_: int) -> float:
        """The SSP bound that gates `round_`: s, less near a planned end."""
        if self.last_round is None or math.isinf(self.staleness):
            return self.staleness
        return float(min(self.staleness, max(0, self.last_round - round_)))

    def may_start(self, round_: int) -> bool:
        if round_ <= 0 or math.isinf(self.staleness):
            return True
        low = self._gated_min_round()
        return low is None or (round_ - 1) - low <= self.bound(round_)

    def waiting_on(self, round_: int) -> list[int]:
        return ssp.blocking_peers(round_, self.log.contiguous, self._gate_peers(),
                                  self.bound(round_))

    def lag(self, round_: int) -> int:
        low = self._gated_min_round() if round_ > 0 else None
        return 0 if low is None else max(0, round_ - 1 - low)

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

    def catch_up_round(self, round_: int) -> int:
        """The round to skip to before `round_` when every peer in the gate is so far
        ahead that this worker would hold them all back (it was paused or cut off):
        the next round of the slowest of them; `round_` itself otherwise."""
        rounds = self.log.contiguous[self._gate_mask()]
        if rounds.size == 0 or math.isinf(self.staleness):
            return round_
        slowest_next = int(rounds.min()) + 1
        return slowest_next if slowest_next > round_ + self.staleness + 1 else round_

    def skip_rounds(self, to_round: int) -> list[Send]:
        """Rounds next_round .. to_round - 1 pass without a gradient: one folded message
        with no values tells every peer (they record the rounds; what is unsent stays
        owed and goes with the partitions of later rounds, so nothing is lost)."""
        if self.finished or to_round <= self.next_round:
            return []
        empty = Partial(Kind.GRAD, self.rank, to_round - 1, 0, self.p, 0, 0,
                        None if self.unsent is None else np.zeros(0, np.float32),
                        first_round=self.next_round)
        self.next_round = to_round
        return [Send(self.peers, empty)]

    def finish(self, rounds_done: int) -> list[Send]:
        if rounds_done != self.next_round:
            raise SchemeError(f"node {self.rank}: finish after {rounds_done} rounds, "
                              f"{self.next_round} done")
        self.finished = True
        if self.p == 1:  # nothing is ever owed: a zero-length final marker
            marker = Partial(Kind.GRAD, self.rank, rounds_done, 0, 1, 0, 0,
                             None if self.unsent is None else np.zeros(0, np.float32), True)
            return [Send(self.peers, marker)]
        self._weigh_what_is_owed()
        flush = self.p - 1
        return [self._send_round(rounds_done + i, final=i == flush - 1) for i in range(flush)]

    def _weigh_what_is_owed(self) -> None:
        """Keep `flush_weight` of the unsent gradient for the flush and take the rest
        back from this replica (which applied it in full when it computed it)."""
        weight = self.flush_weight
        if weight >= 1.0 or self.unsent is None or not self.replica.has_data \
                or not getattr(self.replica.optimizer, "linear", False) \
                or not np.any(self.unsent):
            return
        self.replica.apply(-(1.0 - weight) * self.scale * self.unsent)
        self.unsent *= np.float32(weight)

    def validate(self, msg: Partial) -> None:
        """Refuse a message no correct ako peer sends (SchemeError)."""
        if msg.kind != Kind.GRAD or not self.log.knows(msg.sender):
            raise SchemeError(f"ako worker {self.rank}: unexpected {msg.kind.name} "
                              f"from node {msg.sender}")
        sender_p = self.p_of[msg.sender]
        if msg.folded:
            if msg.p != sender_p or msg.part != 0 or not 0 <= msg.rounds_from <= msg.round:
                raise SchemeError(f"node {msg.sender}: a folded message of rounds "
                                  f"{msg.rounds_from}..{msg.round} must say p={sender_p}, "
                                  f"part 0 and span a piece of the vector or nothing")
            if msg.length:  # one with no values only records its rounds
                self._check_values(msg)
            return
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
        """Take a message; a duplicate (every round it covers held) is refused.

        A folded message whose range partly overlaps rounds held already is taken
        for its new rounds with all its values: the shell must first take out of
        it the values of the rounds it holds (akorun.runtime.recovery.relay `fold_in`)."""
        self.validate(msg)
        if msg.folded:
            if not self.log.record_range(msg.sender, msg.rounds_from, msg.round):
                return Receipt(False)
        elif not self.log.record(msg.sender, msg.round, msg.part):
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

    def withdraw(self, residual: np.ndarray) -> None:
        """Own gradients were applied in full; peers never get `residual` of them: with a
        linear optimizer (plain SGD) take it back, so every replica ends equal. A stateful
        optimizer (momentum, Adam) would turn it into a step of its own: dropped there."""
        if self.replica.has_data and np.any(residual) \
                and getattr(self.replica.optimizer, "linear", False):
            self.replica.apply(-residual * np.float32(self.scale))

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
        owed = self.unsent  # applied here, still to reach the joiner in later rounds
        residual = None if self.encoder is None else self.encoder.residual
        if residual is not None:  # so is what the codec's error feedback holds back
            owed = owed + residual
        return RejoinSnapshot(self.rank, self.replica.params.copy(), self.inbox - owed, record)

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

    def delivery(self) -> AkoWorker:
        return self

    def recovery(self) -> AkoWorker:
        return self

    def state(self) -> RecoveryState:
        def copy(a: np.ndarray | None) -> np.ndarray | None:
            return None if a is None else a.copy()

        return RecoveryState(self.rank, self.next_round, copy(self.replica.params),
                        copy(self.unsent), copy(self.inbox), self.log.export(),
                        dict(self.final_round))

    def load_state(self, state: RecoveryState) -> None:
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


@dataclass(frozen=True)
class AkoSettings(SchemeSettings):
    """Ako's own knob ([exchange.ako]); p, its planner's keys and ssp are shared keys."""

    table: ClassVar[str] = "ako"

    flush: str | float = knob(
        "average", parse=as_flush,
        help="scheme ako: what every replica applies of the gradients still owed at the end: "
             "average (ends at the mean of the replicas), full (all of it: the exact sum) or a "
             "fraction 0 < w <= 1",
        flag="--flush", metavar="{average,full,FRACTION}",
        flag_help="scheme ako: what every replica applies of the gradients still owed at "
                  "the end: average (the mean of the replicas; default), full (every "
                  "gradient in full) or a fraction, e.g. 0.5")


class AkoScheme(Scheme):
    """Ako: each round one of p partitions of the unsent gradient to every peer."""

    name = "ako"
    summary = "partial all-to-all: one of p gradient partitions to every peer each round"
    settings = AkoSettings
    pattern = "partial-all-to-all"
    partitioned = True
    rejoinable = True

    @property
    def keys(self) -> tuple[str, ...]:
        return ("p", "schedule", "utilisation", "p_max", "flush")

    def build(self, spec: SchemeSpec, length: int, params0: np.ndarray | None,
              replica: ReplicaOf) -> list[SchemeNode]:
        p_of = spec.p_list()
        # without the setting (nodes built from a bare SchemeSpec) the flush is exact
        weight = flush_weight(spec.option("flush", "full"), spec.workers)
        return [AkoWorker(i, spec.workers, length, p_of, replica=replica(i, params0),
                          staleness=spec.staleness, schedule=spec.schedule,
                          reduce=spec.reduce, flush_weight=weight)
                for i in range(spec.workers)]

    def staleness_bound(self, exchange: ExchangeView, *, p_max: int, ssp: float) -> float:
        """p - 1 + s: a partition reaches a peer within p rounds, the SSP gate adds s."""
        return p_max - 1 + ssp


AKO = AkoScheme()


def _checked_p_of(length: int, p_of: tuple[int, ...]) -> tuple[int, ...]:
    """`p_of` as ints once every p fits `length` (PartitionError naming the first that
    does not): vectorised, since each of n nodes checks all n p's (n^2 at 1,024 workers)."""
    values = np.asarray(p_of)
    if values.dtype.kind == "i" and values.size and values.min() >= 1 \
            and values.max() <= length:
        return tuple(values.tolist())
    for p in p_of:
        check_p(length, p)
    return tuple(int(p) for p in p_of)
