"""Quorum DiLoCo: DiLoCo whose outer syncs go on with a quorum of the workers.

Decoupled DiLoCo (arXiv 2604.21428) merges the learners' pseudo-gradients as
soon as a minimum quorum is in, waits a grace window for late ones, and weighs
each by the tokens behind it. Here, without a central syncer, adapted to this
project's peer-to-peer DiLoCo:

- **Contributions.** Every H = ``exchange.inner_steps`` of its own rounds (its
  m-th *point*) a worker sends its pseudo-gradient delta = origin - theta
  (origin: the anchor it last took, its progress since) to every peer
  (Kind.PSEUDO keyed (sender, m)), coded by the run's codec with error
  feedback; it keeps the decoded value as its own contribution. A worker has
  at most one contribution not yet in a sync: it does not start the round that
  ends its next point while its last one is still out.
- **Who decides.** The *decider* of every sync is the lowest rank that the
  deciding rank does not hold suspended (rank 0 unless it went silent; a
  finished decider goes on deciding while it drains, and drains only once
  every contribution owed is in a sync). It decides sync s once it holds a contribution from
  ``exchange.quorum_min`` workers (0 = a majority, floor(n/2)+1: more than
  half of the data in every outer step, and the most lost or slow members a
  majority survives) and the grace window is over, or at once when every live
  worker's contribution is in. It multicasts the decision (Kind.PSEUDO_MEAN,
  round s, no values, ``p`` = the bit mask of the ranks whose oldest untaken
  contribution the sync takes, 32 ranks per message), so every replica averages the same
  contributions, summed in rank order in float64: the anchors stay bit-equal.
  A contribution that missed sync s is taken by the next one (never dropped,
  never twice: each replica takes each sender's contributions in order, one
  per sync that names it).
- **Grace, in rounds.** The core has no clock, so the grace window
  ``exchange.quorum_grace_steps`` (g < H) counts the decider's own inner steps
  after it first held the quorum: a decider waiting at its point may run up to
  g rounds ahead while it waits for late contributions (its replica keeps them:
  the progress since its point is kept over the outer update). A finished
  decider has no steps left: it decides at the quorum.
- **Weights.** Every contribution holds exactly H inner steps of one worker (a
  late one joins a later sync whole), so the token-weighted mean of
  Decoupled DiLoCo is the plain mean over the sync's contributions.
- **The gate.** A worker that sent at its point waits until a sync was applied
  after it (the first one decided after its contribution came in takes it),
  then goes on from the new anchor. A slower worker's contribution joins the
  sync decided after it arrives; a fast worker never waits for it.

Applying sync s: anchor <- outer(anchor, mean), then theta <- anchor +
(theta - origin) and origin <- anchor: the steps a replica made since its
point (the grace window) or since its last outer update (a worker not at a
point, e.g. a slow one) are kept; its own contribution in flight reaches its
replica through the anchor of the sync that takes it. With no step since
(every DiLoCo sync) theta takes the anchor itself, so **with quorum = every
worker this is DiLoCo bit for bit** (grace never opens: the quorum is
everyone), whatever the grace.

Exchange: every worker multicasts its whole pseudo-gradient (diloco's
``outer_sync = "all-to-all"``: n-1 copies per uplink, one latency, plus a
tiny decision), not DiLoCo's all-reduce: an all-reduce makes every worker own
a chunk, so one silent member would stall the chunk it owns whatever the
quorum; here only the decider's silence stalls a sync (until the peer timeout
suspends it and the next rank decides; a decision it sent some replicas first
is adopted by its successor, as diloco's successor owners adopt a lost owner's
mean).

Faults: a silent worker (slow, paused or killed) is not awaited once the quorum
is in: the others go on syncing. A returning member holds what its peers sent
meanwhile (every contribution and decision goes to every peer): it applies the
syncs it missed in order and its own pseudo-gradient joins the next sync
decided after it arrives. Staleness: a replica that keeps up misses at most
the others' last H - 1 + g inner steps, plus one more period (H) for a
contribution that came late (with quorum = everyone: H - 1, as DiLoCo).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from akocore.messages import Kind, Partial, Receipt, Send
from akocore.optim import FlatOptimizer, NesterovSGD
from akocore.schemes.base import Replica, SchemeError, SchemeNode
from akocore.schemes.diloco import check_schedule
from akocore.schemes.diloco_settings import DEFAULT_INNER_STEPS, DEFAULT_OUTER_LR, DilocoSettings
from akocore.schemes.diloco_sync import mean_of
from akocore.schemes.knobs import SchemeSettings, knob, whole
from akocore.schemes.protocol import ExchangeView, ReplicaOf, Scheme

if TYPE_CHECKING:
    from akocore.schemes.factory import SchemeSpec

MASK_BITS = 32  # a decision's message carries 32 ranks of its contributor mask in `p`
EVERYONE = 1 << 16  # a quorum_min that stands for every worker (the planner's "q=all")
_QUORUM = "scheme quorum-diloco: "
_DECISION_PART = 1  # Kind.PSEUDO_MEAN part of a decision's first block of ranks
_FINAL_PART = 1  # Kind.PSEUDO part of the final marker (contributions are part 0)


def majority(workers: int) -> int:
    """The default quorum: more than half of the workers."""
    return workers // 2 + 1


@dataclass(frozen=True)
class QuorumSettings(SchemeSettings):
    """The knobs of quorum-diloco ([exchange.quorum]); H and the outer optimizer are
    DiLoCo's ([exchange.diloco])."""

    table: ClassVar[str] = "quorum"

    quorum_min: int = knob(
        0, parse=whole(0),
        help=_QUORUM + "workers whose pseudo-gradients an outer sync needs before it may go "
        "on (0 = a majority, floor(n/2)+1; n or more = every worker: DiLoCo)",
        flag="--quorum-min", metavar="Q",
        flag_help=_QUORUM + "workers an outer sync needs, e.g. 2 (0 = a majority)")
    quorum_grace_steps: int = knob(
        0, parse=whole(0),
        help=_QUORUM + "the grace window after the quorum is in, in the deciding worker's "
        "inner steps (< inner_steps), in which late pseudo-gradients still join the sync",
        flag="--quorum-grace-steps", metavar="G",
        flag_help=_QUORUM + "inner steps the decider waits for late workers after the "
        "quorum, e.g. 1")


def check_quorum(workers: int, inner_steps: int, quorum_min: int, grace_steps: int) -> int:
    """The quorum in workers (one above the workers is every worker); ValueError naming
    the key when a knob is out of range."""
    if workers < 2:
        raise ValueError(f"cluster.workers: got {workers}, quorum-diloco takes >= 2 workers")
    if quorum_min < 0:
        raise ValueError(f"exchange.quorum_min: got {quorum_min}, expected 0 (a majority) "
                         f"or a number of workers >= 1")
    if not 0 <= grace_steps < inner_steps:
        raise ValueError(f"exchange.quorum_grace_steps: got {grace_steps}, expected 0 <= g "
                         f"< inner_steps ({inner_steps})")
    return min(quorum_min or majority(workers), workers)


class QuorumDilocoWorker(SchemeNode):
    """One quorum DiLoCo worker (see the module docstring)."""

    def __init__(self, rank: int, workers: int, length: int, *, replica: Replica,
                 inner_steps: int = DEFAULT_INNER_STEPS, quorum: int | None = None,
                 grace_steps: int = 0, outer: FlatOptimizer | None = None) -> None:
        super().__init__(rank, length, replica)
        check_schedule(inner_steps, 1, 0)
        self.quorum = check_quorum(workers, inner_steps, quorum or 0, grace_steps)
        self.workers = workers
        self.inner_steps = inner_steps
        self.grace_steps = grace_steps
        self.peers = tuple(r for r in range(workers) if r != rank)
        self.outer: FlatOptimizer = outer if outer is not None else NesterovSGD(DEFAULT_OUTER_LR)
        params = replica.params
        self.anchor = None if params is None else params.copy()
        self.origin = None if params is None else params.copy()  # theta - origin: unsent
        self.steps_since_origin = 0
        self.outer_state = None if self.anchor is None else self.outer.init(self.anchor)
        self.seen: set[tuple[int, int, int, int]] = set()
        self.final_round: dict[int, int] = {}
        # contributions by sender, by its point index; `taken` of each sender are in syncs
        self.held: dict[int, dict[int, np.ndarray | None]] = {r: {} for r in range(workers)}
        self.taken = [0] * workers
        self.decisions: dict[int, int] = {}  # sync -> contributor mask (first one wins)
        self.blocks = -(-workers // MASK_BITS)  # messages per decision
        self._parts: dict[tuple[int, int], dict[int, int]] = {}  # (sync, decider) -> blocks
        self.announced: set[int] = set()  # syncs whose decision this rank multicast
        # the contributions of each sync applied, (sender, its point), for checks
        self.included: list[tuple[tuple[int, int], ...]] = []
        self.points = 0  # contributions this rank sent
        self.waiting_from: int | None = None  # syncs_done when it sent at its point
        self.point_round = -1  # the round that ended its last point
        self.quorum_round: dict[int, int] = {}  # sync -> own next_round at its quorum
        self.syncs_done = 0
        self._due: list[Send] = []
        self.view_changes = 0

    # ------------------------------------------------------------------ view

    def _owes(self, peer: int) -> bool:
        """Whether `peer` may still send a contribution this rank has not taken (its
        final marker says how many points it made; a suspended peer is not awaited)."""
        if peer == self.rank:
            return not self.finished or self.points > self.taken[peer]
        if peer in self.suspended:
            return False
        final = self.final_round.get(peer)
        return final is None or final // self.inner_steps > self.taken[peer]

    def decider(self) -> int:
        """The lowest rank this rank does not hold suspended (itself at the latest). A
        finished decider goes on deciding while it drains: it leaves only once every
        contribution owed is in a sync, so no other rank takes over from it."""
        return next(r for r in range(self.workers)
                    if r == self.rank or r not in self.suspended)

    def _ready(self) -> list[int]:
        """Ranks whose next untaken contribution this rank holds."""
        return [r for r in range(self.workers) if self.taken[r] in self.held[r]]

    # ------------------------------------------------------------------ deciding

    def _decide(self) -> list[Send]:
        """As the decider: decide the next sync when its quorum and grace allow (or adopt
        a decision for it a previous decider sent here), and multicast it once."""
        s = self.syncs_done
        if self.decider() != self.rank or s in self.announced:
            return []
        if s not in self.decisions:
            ready = self._ready()
            expected = [r for r in range(self.workers) if self._owes(r)]
            if not ready:
                return []
            everyone = all(r in ready for r in expected)
            if not everyone:
                if len(ready) < min(self.quorum, len(expected)):
                    return []
                since = self.quorum_round.setdefault(s, self.next_round)
                if not self.finished and self.next_round - since < self.grace_steps:
                    return []
            self.decisions[s] = sum(1 << r for r in ready)
        self.announced.add(s)
        values = None if self.replica.params is None else np.zeros(0, np.float32)
        low = (1 << MASK_BITS) - 1
        return [Send(self.peers, Partial(Kind.PSEUDO_MEAN, self.rank, s, _DECISION_PART + b,
                                         self.decisions[s] >> (MASK_BITS * b) & low, 0, 0,
                                         values)) for b in range(self.blocks)]

    def _in_grace(self) -> bool:
        """The decider holds the quorum of the open sync and waits out its grace."""
        s = self.syncs_done
        return (s in self.quorum_round and s not in self.decisions
                and self.next_round - self.quorum_round[s] < self.grace_steps)

    # ------------------------------------------------------------------ applying

    def _progress(self) -> list[Send]:
        """Decide and apply whatever can be, in sync order; the decisions to send."""
        effects: list[Send] = []
        while True:
            effects.extend(self._decide())
            s = self.syncs_done
            mask = self.decisions.get(s)
            if mask is None:
                return effects
            senders = [r for r in range(self.workers) if mask >> r & 1]
            if any(self.taken[r] not in self.held[r] for r in senders):
                return effects
            self._apply(senders)

    def _apply(self, senders: list[int]) -> None:
        contributions = {r: self.held[r].pop(self.taken[r]) for r in senders}
        self.included.append(tuple((r, self.taken[r]) for r in senders))
        for r in senders:
            self.taken[r] += 1
        self.syncs_done += 1
        if self.anchor is None or self.replica.params is None or self.origin is None:
            return
        mean = mean_of(contributions, self.length)
        assert mean is not None
        self.anchor, self.outer_state = self.outer.apply(self.anchor, self.outer_state, mean)
        if self.steps_since_origin == 0:
            self.replica.params = self.anchor.copy()
        else:  # keep the steps made since the point (grace) or the last outer update
            self.replica.params = (self.anchor + (self.replica.params - self.origin)).astype(
                np.float32)
        self.origin = self.anchor.copy()

    # ------------------------------------------------------------------ gate

    def _point(self, round_: int) -> bool:
        return (round_ + 1) % self.inner_steps == 0

    def may_start(self, round_: int) -> bool:
        self._due.extend(self._progress())
        if self.waiting_from is not None:
            if self.syncs_done > self.waiting_from:
                self.waiting_from = None
            elif not self._in_grace():
                return False
        return not (self._point(round_) and self.taken[self.rank] < self.points)

    def waiting_on(self, round_: int) -> list[int]:
        if self.may_start(round_):
            return []
        mask = self.decisions.get(self.syncs_done)
        if mask is None:
            decider = self.decider()
            if decider != self.rank:
                return [decider]
            return [r for r in self.peers if self._owes(r) and self.taken[r] not in self.held[r]]
        return [r for r in range(self.workers) if mask >> r & 1
                and self.taken[r] not in self.held[r]]

    def lag(self, round_: int) -> int:
        return 0 if self.waiting_from is None else max(0, round_ - self.point_round - 1)

    # ------------------------------------------------------------------ events

    def local_step(self, round_: int, grad: np.ndarray | None) -> list[Send]:
        self._step_replica(round_, grad, lambda: "its outer sync came back")
        self.steps_since_origin += 1
        effects: list[Send] = []
        if self._point(round_):
            produced = None
            if self.origin is not None and self.replica.params is not None:
                produced = (self.origin - self.replica.params).astype(np.float32)
                self.origin = self.replica.params.copy()
            self.steps_since_origin = 0
            message = self.coded(Partial(Kind.PSEUDO, self.rank, self.points, 0, 1, 0,
                                         self.length, produced))
            self.held[self.rank][self.points] = None if message.values is None \
                else message.values.copy()
            self.points += 1
            self.waiting_from = self.syncs_done
            self.point_round = round_
            effects.append(Send(self.peers, message))
        effects.extend(self._progress())
        return effects

    def _check_message(self, msg: Partial) -> bool:
        """SchemeError unless a correct peer sends `msg`; True for a final marker."""
        ok_kind = (msg.kind == Kind.PSEUDO and msg.part in (0, _FINAL_PART) and msg.p == 1) \
            or (msg.kind == Kind.PSEUDO_MEAN
                and _DECISION_PART <= msg.part < _DECISION_PART + self.blocks
                and 0 <= msg.p < 1 << min(MASK_BITS, self.workers
                                          - MASK_BITS * (msg.part - _DECISION_PART)))
        if not ok_kind or msg.sender not in self.peers:
            raise SchemeError(f"quorum-diloco worker {self.rank}: unexpected {msg.kind.name} "
                              f"part {msg.part} of {msg.p} from node {msg.sender}")
        final = msg.kind == Kind.PSEUDO and msg.part == _FINAL_PART
        span = (0, 0) if final or msg.kind == Kind.PSEUDO_MEAN else (0, self.length)
        if (msg.offset, msg.length) != span:
            raise SchemeError(f"quorum-diloco: a {msg.kind.name} spans [{span[0]}, {span[1]})")
        return final

    def receive(self, msg: Partial) -> Receipt:
        final = self._check_message(msg)
        self._check_values(msg)
        key = (int(msg.kind), *msg.key)
        if key in self.seen:
            return Receipt(False)
        self.seen.add(key)
        if final:
            self.final_round[msg.sender] = msg.round
            self._viewed()
        elif msg.kind == Kind.PSEUDO_MEAN:
            parts = self._parts.setdefault((msg.round, msg.sender), {})
            parts[msg.part - _DECISION_PART] = msg.p
            if len(parts) == self.blocks:  # the first whole decision wins
                del self._parts[(msg.round, msg.sender)]
                self.decisions.setdefault(msg.round, sum(
                    p << (MASK_BITS * b) for b, p in parts.items()))
        elif msg.round >= self.taken[msg.sender]:
            self.held[msg.sender][msg.round] = None if msg.values is None \
                else msg.values.copy()
        return Receipt(True, tuple(self._progress()))

    def _viewed(self) -> None:
        self.view_changes += 1

    def suspend_peer(self, peer: int) -> None:
        super().suspend_peer(peer)
        self._viewed()
        self._due.extend(self._progress())

    def resume_peer(self, peer: int) -> None:
        super().resume_peer(peer)
        self._viewed()

    def take_effects(self) -> list[Send]:
        self._due.extend(self._progress())
        due, self._due = self._due, []
        return due

    def finish(self, rounds_done: int) -> list[Send]:
        if rounds_done != self.next_round:
            raise SchemeError(f"node {self.rank}: finish after {rounds_done} rounds")
        self.finished = True
        values = None if self.replica.params is None else np.zeros(0, np.float32)
        marker = Partial(Kind.PSEUDO, self.rank, rounds_done, _FINAL_PART, 1, 0, 0, values,
                         True)
        return [*self._progress(), Send(self.peers, marker)]  # a decider decides at quorum

    def _outstanding(self) -> bool:
        """A contribution some live rank owes or this rank holds is not in a sync yet."""
        return any(self._owes(r) for r in range(self.workers))

    def drained(self) -> bool:
        self._due.extend(self._progress())
        return not self._due and not self._outstanding() and all(
            p in self.final_round or p in self.suspended for p in self.peers)

    def settle(self) -> None:
        self._due.extend(self._progress())

    def unfinished(self) -> str | None:
        if not self._outstanding():
            return None
        return (f"outer sync {self.syncs_done} never completed here: waiting on rank(s) "
                f"{self.waiting_on(self.next_round) or [self.decider()]}")

    def agreed_state(self) -> np.ndarray | None:
        """The anchor: every replica applies the same decided syncs in order."""
        return None if self._outstanding() else self.anchor


class QuorumDilocoScheme(Scheme):
    """DiLoCo whose outer syncs go on with a quorum of the workers' pseudo-gradients."""

    name = "quorum-diloco"
    summary = ("DiLoCo whose outer syncs go on once a quorum of pseudo-gradients is in "
               "(late ones join the next sync)")
    settings = QuorumSettings
    pattern = "all-to-all"

    @property
    def keys(self) -> tuple[str, ...]:
        return ("inner_steps", "outer_lr", "outer_momentum", *QuorumSettings.names())

    def check_spec(self, spec: SchemeSpec) -> None:
        knobs = spec.knobs(QuorumSettings)
        check_quorum(spec.workers, spec.knobs(DilocoSettings).inner_steps, knobs.quorum_min,
                     knobs.quorum_grace_steps)

    def check_exchange(self, exchange: ExchangeView) -> None:
        knobs = exchange.knobs(QuorumSettings)
        inner_steps = exchange.knobs(DilocoSettings).inner_steps
        if not 0 <= knobs.quorum_grace_steps < inner_steps:
            raise ValueError(f"exchange.quorum_grace_steps: got {knobs.quorum_grace_steps}, "
                             f"expected 0 <= g < inner_steps ({inner_steps})")

    def build(self, spec: SchemeSpec, length: int, params0: np.ndarray | None,
              replica: ReplicaOf) -> list[SchemeNode]:
        diloco = spec.knobs(DilocoSettings)
        knobs = spec.knobs(QuorumSettings)
        outer = NesterovSGD(diloco.outer_lr, diloco.outer_momentum)
        return [QuorumDilocoWorker(i, spec.workers, length, replica=replica(i, params0),
                                   inner_steps=diloco.inner_steps, quorum=knobs.quorum_min,
                                   grace_steps=knobs.quorum_grace_steps, outer=outer)
                for i in range(spec.workers)]

    def staleness_bound(self, exchange: ExchangeView, *, p_max: int, ssp: float) -> float:
        """H - 1 + g, plus H for a contribution that came late (DiLoCo's H - 1 when the
        quorum is every worker, which the settings alone cannot tell: the bound is kept)."""
        h = exchange.knobs(DilocoSettings).inner_steps
        return float(2 * h - 1 + exchange.knobs(QuorumSettings).quorum_grace_steps)

    def effective_ssp(self, exchange: ExchangeView) -> float:
        return 0.0

    def period_rounds(self, exchange: ExchangeView) -> int:
        return exchange.knobs(DilocoSettings).inner_steps

    def plan_grid(self, exchange: ExchangeView) -> dict[str, tuple[int, ...]]:
        """A quorum of everyone (q=all: DiLoCo's waits, every contribution on time) beside
        the configured run; the grace moves the staleness bound, so the planner tries it
        as it tries H."""
        return {"quorum_min": (EVERYONE,)}

    def label(self, exchange: ExchangeView) -> str:
        knobs = exchange.knobs(QuorumSettings)
        quorum = "majority" if not knobs.quorum_min else \
            "all" if knobs.quorum_min >= EVERYONE else knobs.quorum_min
        return (f"H={exchange.knobs(DilocoSettings).inner_steps} q={quorum} "
                f"g={knobs.quorum_grace_steps}")


QUORUM_DILOCO = QuorumDilocoScheme()
