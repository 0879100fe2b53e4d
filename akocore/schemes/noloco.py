"""NoLoCo: DiLoCo's inner steps, but each outer step averages with one peer, not all.

NoLoCo (No-all-reduce Low Communication; Kolehmainen et al., arXiv
2506.10911; code gensyn-ai/noloco): every worker applies its inner optimizer
(the run's optimizer) to its own gradient each round, as in DiLoCo. Every
H = ``exchange.noloco_inner_steps`` rounds it does an outer step with the
members of its *group* only: this module owns the grouping
(`noloco_groups`), the node (`NolocoWorker`), its settings (`NolocoSettings`,
``[exchange.noloco]``) and the `Scheme` object.

- Groups: outer step s (the sync after round (s + 1)·H - 1) pairs the workers
  by a random permutation drawn by numpy's Generator seeded with
  (``exchange.noloco_seed``, s): consecutive entries form pairs, and with an odd
  worker count the one left over joins the last pair (one triple). Every worker
  computes the same groups, so pairings are symmetric and no message is needed
  to agree on them.
- Each member sends its group its slow weights phi (the anchor of its last
  outer step; Kind.MODEL, never coded) and its pseudo-gradient
  Delta = phi - theta (Kind.PSEUDO, coded by the run's codec; the own value
  used is the decoded one, as in DiLoCo). The group means m_phi and m_Delta are
  summed in float64 in rank order, so every member of a group computes them bit
  for bit alike (tests/test_schemes_noloco.py pins it).
- The outer step, as we read the paper's modified Nesterov: with outer
  momentum alpha (``noloco_outer_momentum``), outer learning rate beta
  (``noloco_outer_lr``) and pull gamma (``noloco_pull``),
  delta_i = alpha·delta_i(previous) - beta·m_Delta - gamma·(phi_i - m_phi),
  phi_i <- phi_i + delta_i, and the replica restarts from phi_i. It is computed as
  (gamma·m_phi - beta·m_Delta) + ((1 - gamma)·phi_i + alpha·delta_i(previous)) in
  float64: with alpha = 0, beta = gamma = 1 the second term is exactly 0 and each
  group ends with equal replicas bit for bit (pairwise model averaging).

A lost member: a partner the shell suspends (silent past the peer timeout), or
whose final marker says it stopped before the sync, is not awaited; the
others of the group average among themselves, and a worker left alone does its
outer step on its own pseudo-gradient (m = its own values: no pull). Groups
stay a function of (seed, s) over every rank, so nothing is re-agreed; a lost
rank's partners step alone at the outer steps it would have joined. Values a
suspended partner sent before it fell silent are dropped.

Rounds are inner steps, so a run whose rounds are a multiple of H ends on an
outer step. The staleness bound reported is DiLoCo's H - 1 (a partner's
steps); the other workers' steps reach a replica by gossip over later outer
steps, which no bound covers. ``exchange.reduce`` and ``exchange.ssp`` are not
read: the gate is the group's sync.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from akocore.messages import Kind, Partial, Receipt, Send
from akocore.schemes.base import Replica, SchemeError, SchemeNode
from akocore.schemes.diloco_sync import mean_of
from akocore.schemes.knobs import SchemeSettings, knob, real, whole
from akocore.schemes.live_peers import LivePeersNode
from akocore.schemes.protocol import ExchangeView, ReplicaOf, Scheme

if TYPE_CHECKING:
    from akocore.schemes.factory import SchemeSpec

ANCHOR, DELTA, FINAL = 0, 1, 2  # message parts: phi, Delta, the final marker
PART_KINDS = {ANCHOR: Kind.MODEL, DELTA: Kind.PSEUDO, FINAL: Kind.MODEL}
DEFAULT_INNER_STEPS = 10
DEFAULT_OUTER_LR = 0.7
DEFAULT_OUTER_MOMENTUM = 0.5
DEFAULT_PULL = 0.5


def noloco_groups(workers: int, seed: int, outer_step: int) -> tuple[tuple[int, ...], ...]:
    """The groups of outer step `outer_step`: pairs of a random permutation seeded with
    (seed, outer_step), the odd one out joining the last pair; each sorted."""
    if workers < 2:
        raise ValueError(f"noloco needs at least 2 workers, got {workers}")
    order = [int(r) for r in np.random.default_rng((seed, outer_step)).permutation(workers)]
    groups = [order[i:i + 2] for i in range(0, workers - workers % 2, 2)]
    if workers % 2:
        groups[-1].append(order[-1])
    return tuple(sorted(tuple(sorted(group)) for group in groups))


def noloco_group(rank: int, workers: int, seed: int, outer_step: int) -> tuple[int, ...]:
    """The group (`rank` included) that `rank` averages with at `outer_step`."""
    return next(g for g in noloco_groups(workers, seed, outer_step) if rank in g)


@dataclass
class _Sync:
    """One outer step in flight: begun after round `start` with `partners`."""

    start: int
    partners: tuple[int, ...]
    anchor: np.ndarray | None  # own phi
    delta: np.ndarray | None  # own Delta, as decoded
    parts: dict[int, dict[int, np.ndarray | None]] = field(default_factory=dict)


class NolocoWorker(LivePeersNode):
    """One NoLoCo worker (see the module docstring)."""

    exchange_name = "outer step"

    def __init__(self, rank: int, workers: int, length: int, *, replica: Replica,
                 inner_steps: int = DEFAULT_INNER_STEPS, outer_lr: float = DEFAULT_OUTER_LR,
                 outer_momentum: float = DEFAULT_OUTER_MOMENTUM, pull: float = DEFAULT_PULL,
                 seed: int = 0) -> None:
        noloco_groups(workers, seed, 0)  # validates the worker count
        super().__init__(rank, workers, length, replica)
        if inner_steps < 1:
            raise ValueError(f"exchange.noloco_inner_steps: got {inner_steps}, expected >= 1")
        self.inner_steps = inner_steps
        self.outer_lr, self.outer_momentum, self.pull = outer_lr, outer_momentum, pull
        self.seed = seed
        params = replica.params
        self.anchor = None if params is None else params.copy()  # phi
        self.step = None if params is None else np.zeros(length, np.float32)  # delta
        self.early: dict[int, dict[int, dict[int, np.ndarray | None]]] = {}  # start -> ...
        self.pending: _Sync | None = None
        self.syncs_done = 0
        # (start, members averaged, digest of their means): what each group agreed on
        self.sync_log: list[tuple[int, tuple[int, ...], str]] = []

    def sync_after(self, round_: int) -> bool:
        return (round_ + 1) % self.inner_steps == 0

    def group(self, start: int) -> tuple[int, ...]:
        """This rank's group at the outer step begun after round `start`."""
        return noloco_group(self.rank, self.workers, self.seed, (start + 1) // self.inner_steps - 1)

    def _missing(self, sync: _Sync) -> list[int]:
        return [p for p in sync.partners
                if self.live(p, sync.start) and len(sync.parts.get(p, {})) < 2]

    def progress(self) -> None:
        if self.pending is not None and not self._missing(self.pending):
            sync, self.pending = self.pending, None
            self._apply(sync)

    def _apply(self, sync: _Sync) -> None:
        self.syncs_done += 1
        members = [p for p in sync.partners if self.live(p, sync.start)]
        anchors = {self.rank: sync.anchor, **{p: sync.parts[p][ANCHOR] for p in members}}
        deltas = {self.rank: sync.delta, **{p: sync.parts[p][DELTA] for p in members}}
        mean_anchor, mean_delta = mean_of(anchors, self.length), mean_of(deltas, self.length)
        digest = ""
        if mean_anchor is not None and mean_delta is not None:
            digest = hashlib.blake2b(mean_anchor.tobytes() + mean_delta.tobytes(),
                                     digest_size=16).hexdigest()
        self.sync_log.append((sync.start, tuple(sorted(anchors)), digest))
        if self.anchor is None or self.step is None or mean_anchor is None \
                or mean_delta is None:
            return
        phi = self.anchor.astype(np.float64)
        shared = self.pull * mean_anchor.astype(np.float64) \
            - self.outer_lr * mean_delta.astype(np.float64)
        own = (1.0 - self.pull) * phi + self.outer_momentum * self.step.astype(np.float64)
        new = (shared + own).astype(np.float32)
        self.step = (new.astype(np.float64) - phi).astype(np.float32)
        self.anchor = new
        self.replica.params = new.copy()

    def in_progress(self) -> int | None:
        return None if self.pending is None else self.pending.start

    def waiting_on(self, round_: int) -> list[int]:
        return [] if self.may_start(round_) or self.pending is None \
            else self._missing(self.pending)

    def lag(self, round_: int) -> int:
        return 0 if self.pending is None else max(0, round_ - self.pending.start - 1)

    def local_step(self, round_: int, grad: np.ndarray | None) -> list[Send]:
        self.begin_round(round_, grad)
        if not self.sync_after(round_):
            return []
        partners = tuple(p for p in self.group(round_) if p != self.rank)
        produced = anchor = None
        if self.anchor is not None and self.replica.params is not None:
            anchor = self.anchor.copy()
            produced = (self.anchor - self.replica.params).astype(np.float32)
        # coded here: the group averages the value every partner decodes, own included
        delta = self.coded(Partial(Kind.PSEUDO, self.rank, round_, DELTA, 2, 0, self.length,
                                   produced))
        own = None if delta.values is None else delta.values.copy()
        self.pending = _Sync(round_, partners, anchor, own, self.early.pop(round_, {}))
        phi = Partial(Kind.MODEL, self.rank, round_, ANCHOR, 2, 0, self.length, anchor)
        self.progress()
        return [Send(partners, phi), Send(partners, delta)]

    def receive(self, msg: Partial) -> Receipt:
        if msg.sender not in self.peers or PART_KINDS.get(msg.part) != msg.kind \
                or msg.p != 2 or msg.final != (msg.part == FINAL):
            raise SchemeError(f"noloco worker {self.rank}: unexpected {msg.kind.name} "
                              f"part {msg.part} of {msg.p} from node {msg.sender}")
        if msg.part != FINAL:
            if not self.sync_after(msg.round) or msg.sender not in self.group(msg.round):
                raise SchemeError(f"node {msg.sender} is not in the group of rank "
                                  f"{self.rank} at the outer step after round {msg.round}")
            if (msg.offset, msg.length) != (0, self.length):
                raise SchemeError(f"a noloco message spans the whole vector of length "
                                  f"{self.length}")
        if not self.first_copy(msg):
            return Receipt(False)
        if not msg.final:
            values = None if msg.values is None else msg.values.copy()
            if self.pending is not None and self.pending.start == msg.round:
                self.pending.parts.setdefault(msg.sender, {})[msg.part] = values
            elif msg.round >= self.next_round:  # a partner ahead of us: keep it
                self.early.setdefault(msg.round, {}).setdefault(msg.sender, {})[
                    msg.part] = values
            # else: the outer step was applied without this partner (suspended): dropped
        self.progress()
        return Receipt(True)

    def finish(self, rounds_done: int) -> list[Send]:
        return self.end_with_marker(rounds_done, Kind.MODEL, FINAL, 2)


_NOLOCO = "scheme noloco: "


@dataclass(frozen=True)
class NolocoSettings(SchemeSettings):
    """NoLoCo's knobs ([exchange.noloco])."""

    table: ClassVar[str] = "noloco"

    noloco_inner_steps: int = knob(
        DEFAULT_INNER_STEPS, parse=whole(1),
        help=_NOLOCO + "H, inner optimizer steps (rounds) between two outer steps",
        flag="--noloco-inner-steps", metavar="H",
        flag_help=_NOLOCO + "inner optimizer steps between outer steps, e.g. 10")
    noloco_outer_lr: float = knob(
        DEFAULT_OUTER_LR, parse=real(lambda v: v > 0, "a learning rate > 0, e.g. 0.7"),
        help=_NOLOCO + "beta, the outer learning rate on the group's mean pseudo-gradient",
        flag="--noloco-outer-lr", metavar="LR",
        flag_help=_NOLOCO + "outer learning rate, e.g. 0.7")
    noloco_outer_momentum: float = knob(
        DEFAULT_OUTER_MOMENTUM,
        parse=real(lambda v: 0 <= v < 1, "a momentum 0 <= m < 1, e.g. 0.5"),
        help=_NOLOCO + "alpha, the outer momentum on the previous outer step (0 = none)",
        flag="--noloco-outer-momentum", metavar="M",
        flag_help=_NOLOCO + "outer momentum, e.g. 0.5")
    noloco_pull: float = knob(
        DEFAULT_PULL, parse=real(lambda v: 0 <= v <= 1, "a weight 0 <= gamma <= 1, e.g. 0.5"),
        help=_NOLOCO + "gamma, how far each outer step pulls the slow weights toward the "
             "group's mean (0 = not at all, 1 = onto it)")
    noloco_seed: int = knob(
        0, parse=whole(0),
        help=_NOLOCO + "the seed of the pairings (outer step s's groups are a function of "
             "the seed and s, so every worker pairs alike)")


class NolocoScheme(Scheme):
    """NoLoCo: H inner steps, then an outer step averaged with one random peer."""

    name = "noloco"
    summary = "H local optimizer steps, then an outer step averaged with one random peer"
    settings = NolocoSettings
    pattern = "pairs"

    def build(self, spec: SchemeSpec, length: int, params0: np.ndarray | None,
              replica: ReplicaOf) -> list[SchemeNode]:
        knobs = spec.knobs(NolocoSettings)
        return [NolocoWorker(i, spec.workers, length, replica=replica(i, params0),
                             inner_steps=knobs.noloco_inner_steps,
                             outer_lr=knobs.noloco_outer_lr,
                             outer_momentum=knobs.noloco_outer_momentum,
                             pull=knobs.noloco_pull, seed=knobs.noloco_seed)
                for i in range(spec.workers)]

    def staleness_bound(self, exchange: ExchangeView, *, p_max: int, ssp: float) -> float:
        """H - 1: the partner's inner steps since its last outer step (the others' steps
        arrive by gossip, later, and no bound covers them)."""
        return float(exchange.knobs(NolocoSettings).noloco_inner_steps - 1)

    def effective_ssp(self, exchange: ExchangeView) -> float:
        return 0.0

    def period_rounds(self, exchange: ExchangeView) -> int:
        """H: an outer step every H rounds. (H moves the staleness bound, so the planner
        steps it as it does DiLoCo's: no plan_grid is needed.)"""
        return exchange.knobs(NolocoSettings).noloco_inner_steps

    def label(self, exchange: ExchangeView) -> str:
        return f"H={exchange.knobs(NolocoSettings).noloco_inner_steps}"


NOLOCO = NolocoScheme()
