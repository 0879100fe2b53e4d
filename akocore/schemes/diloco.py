"""DiLoCo and Streaming DiLoCo: H local steps, then an outer step on averaged pseudo-gradients.

DiLoCo (Douillard et al., arXiv 2311.08105): every worker applies its inner
optimizer (the run's optimizer, any optax transformation) to its own gradient
each round. Every H = ``exchange.inner_steps`` rounds the workers average their
*pseudo-gradients* delta_i = theta_at_last_sync - theta_i and every worker
applies the outer optimizer (Nesterov momentum by default,
``optax.sgd(outer_lr, momentum=outer_momentum, nesterov=True)``; any
`FlatOptimizer`, e.g. `akocore.optim.OptaxFlatOptimizer(any optax
transformation)`, through `DilocoWorker(outer=...)`) to the shared anchor
theta_at_last_sync with the mean delta; the result is the new anchor and
every replica's parameters.

Streaming DiLoCo (Douillard et al., arXiv 2501.18512): the flat vector is cut
into P = ``exchange.fragments`` contiguous fragments (the array_split bounds
of akocore.partition, as Ako's partitions) synced in turn, so each sync sends
1/P of the model. The schedule is torchft's (`torchft/local_sgd.py`, class
`DiLoCo` and `_StreamingDiLoCoFragment.prepare_sync` / `perform_sync`; MaxText's
`src/maxtext/trainers/diloco/diloco.py` runs the unfragmented form): rounds
are cut into windows of H/P rounds; window w = t // (H/P) belongs to fragment
k = w mod P (so fragment k syncs when (t // (H/P)) mod P == k, once every H
rounds). The sync of window w *starts* after round (w+1)·H/P - 1 - tau (the
pseudo-gradient of fragment k is taken then and sent) and its outer update is
*applied* after round (w+1)·H/P - 1: the exchange overlaps tau =
``exchange.overlap_steps`` inner steps. At the apply, as torchft's
`_merge_parameters` (the paper's mixing factor alpha), the fragment becomes
(1 - alpha)·new_anchor + alpha·local, where local holds the tau steps of
progress made since the sync started; alpha = ``exchange.merge_alpha``
defaults to 0 (torchft's default: the global value replaces the local one, so
after each sync every replica holds the same fragment). tau < H/P, as torchft
asserts. DiLoCo is the case P = 1, tau = 0; both schemes build `DilocoWorker`.
Eager updates (Kale et al., arXiv 2502.12996; ``exchange.eager``): at the apply
a worker averages its own delta as of now (what it sent plus the tau steps made
since the sync started) with the others' deltas as sent, so the overlap does
not delay its own contribution; replicas then differ by 1/n of each worker's
overlapped steps on the fragment. With tau = 0 eager is non-eager, bit for bit.

Codecs: the run's codec (akocore.codecs) carries the deltas. The worker codes
its delta itself (`SchemeNode.coded`, error feedback per fragment range) and
averages the *decoded* value of its own delta, the value every peer decodes,
so every replica sums the same values and the anchors stay bit-equal.

The exchange is an **all-reduce** of the fragment's pseudo-gradient by default
(``exchange.outer_sync = "allreduce"``: a direct reduce-scatter to chunk owners,
then an all-gather of the owners' means; akocore.schemes.diloco_sync), as
every DiLoCo users compare against does: 2(n-1)/n fragment copies leave each
uplink per sync, in two message latencies. ``outer_sync = "all-to-all"``
keeps the earlier exchange (each worker multicasts its whole delta to every
peer, Kind.PSEUDO keyed (sender, round the sync started, fragment)): (n-1)
copies per uplink but one latency, so it can win for 2 workers (the same
bytes) or on a path where latency dominates the fragment's transfer.

Averaging: the mean over the contributing workers (own delta plus every peer
delta that arrived or is awaited), summed in float64 in rank order (all-to-all:
by every replica; all-reduce: by each chunk's owner, whose mean every replica
applies), so every replica computes bit-identical anchors. A peer is awaited
unless the shell suspended it (silent past the peer timeout) or its final
marker says it stopped before that sync. After a member is killed during a
sync, the survivors apply the sync without it once the peer timeout suspends
it (all-reduce: the next live rank takes over the chunk it owned, and every
survivor re-sends that chunk to it), and from then on average among
themselves; if its delta reached some survivors and not others, their anchors
differ by that one contribution (1/n of one pseudo-gradient) until the end of
the run, unless re-synced (`adopt_agreed`, akorun.runtime.recovery.anchor_sync).

Rounds are inner steps (one local gradient each), as for every other scheme,
so ``train.rounds`` counts inner steps and a run whose rounds are a multiple
of H ends on a full sync. Staleness: a component of a replica misses at most
the other workers' last H - 1 + tau inner steps. ``exchange.reduce`` and
``exchange.ssp`` are not read: the average is a mean and the gate is the sync.

Past ~500 lines on purpose: the worker's sync schedule, its two outer
exchanges, its averaging and its re-sync share one state (pending syncs,
anchor, outer optimizer state); the all-reduce's chunk bookkeeping already
lives in diloco_sync and the settings in diloco_settings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from akocore.messages import Kind, Partial, Receipt, Send
from akocore.optim import FlatOptimizer, NesterovSGD
from akocore.partition import check_p, partition_bounds
from akocore.schemes.base import Replica, SchemeError, SchemeNode
from akocore.schemes.diloco_settings import (
    DEFAULT_INNER_STEPS,
    DEFAULT_OUTER_LR,
    MULOCO,
    DilocoSettings,
)
from akocore.schemes.diloco_sync import (
    DEFAULT_OUTER_SYNC,
    OUTER_SYNCS,
    AllReduceSync,
    ChunkState,
    mean_of,
)
from akocore.schemes.knobs import Preset
from akocore.schemes.protocol import ExchangeView, ReplicaOf, Scheme

if TYPE_CHECKING:
    from akocore.schemes.factory import SchemeSpec



@dataclass
class _Sync:
    """One fragment's sync in flight: started after round `start`, applied after `due`."""

    start: int
    due: int
    fragment: int
    own: np.ndarray | None
    deltas: dict[int, np.ndarray | None]  # all-to-all: sender -> its delta
    at_start: np.ndarray | None = None  # eager: the fragment's local values at the start
    chunks: ChunkState | None = None  # all-reduce: its chunks, owners and means


class DilocoWorker(AllReduceSync, SchemeNode):
    """One (Streaming) DiLoCo worker (see the module docstring)."""

    def __init__(self, rank: int, workers: int, length: int, *, replica: Replica,
                 inner_steps: int = DEFAULT_INNER_STEPS, fragments: int = 1,
                 overlap_steps: int = 0, merge_alpha: float = 0.0, eager: bool = False,
                 outer: FlatOptimizer | None = None,
                 outer_sync: str = DEFAULT_OUTER_SYNC) -> None:
        super().__init__(rank, length, replica)
        check_diloco_knobs(workers, length, inner_steps, fragments, overlap_steps, merge_alpha)
        if outer_sync not in OUTER_SYNCS:
            raise ValueError(f"exchange.outer_sync: got {outer_sync!r}, expected one of "
                             f"{', '.join(OUTER_SYNCS)}")
        self.workers = workers
        self.inner_steps = inner_steps
        self.fragments = fragments
        self.window = inner_steps // fragments
        self.overlap_steps = overlap_steps
        self.merge_alpha = merge_alpha
        self.eager = eager
        self.reduced = outer_sync == "allreduce"
        self.bounds = partition_bounds(length, fragments)
        self.peers = tuple(r for r in range(workers) if r != rank)
        self.outer: FlatOptimizer = outer if outer is not None else NesterovSGD(DEFAULT_OUTER_LR)
        params = replica.params
        self.anchor = None if params is None else params.copy()  # theta at each fragment's sync
        self.outer_state: list[Any] = [
            None if self.anchor is None else self.outer.init(self.anchor[self._slice(k)])
            for k in range(fragments)]
        self.seen: set[tuple[int, int, int, int]] = set()  # (kind, sender, round, part)
        self.final_round: dict[int, int] = {}
        self.early: dict[tuple[int, int], dict[int, np.ndarray | None]] = {}  # (start, k)
        self.early_chunks: dict[tuple[int, int], ChunkState] = {}  # all-reduce: (start, k)
        self.applied: list[_Sync] = []  # all-reduce: the last syncs applied, for successors
        self._view = 0  # all-reduce: bumped when who is live changes (owners again)
        self._owner_cache: dict[int, tuple[int, list[int]]] = {}
        self._bounds_cache: dict[int, np.ndarray] = {}
        self.pending: list[_Sync] = []  # in start order; at most one while tau < H/P
        self.syncs_done = 0
        self._due: list[Send] = []  # effects of a suspension, for take_effects
        self.view_changes = 0  # suspensions and returns seen (a re-sync may be due)

    def _slice(self, fragment: int) -> slice:
        return slice(int(self.bounds[fragment]), int(self.bounds[fragment + 1]))

    def sync_after(self, round_: int) -> tuple[int, int] | None:
        """(fragment, due round) when a sync starts after `round_`, else None."""
        end = round_ + self.overlap_steps  # the last round of the window
        if (end + 1) % self.window:
            return None
        return (end // self.window) % self.fragments, end

    # ------------------------------------------------------------------ gate

    def _live(self, peer: int, start: int) -> bool:
        return peer not in self.suspended and self.final_round.get(peer, math.inf) > start

    def _missing(self, sync: _Sync) -> list[int]:
        if sync.chunks is None:
            return [p for p in self.peers if p not in sync.deltas and self._live(p, sync.start)]
        return self._chunks_missing(sync)

    def _complete(self, sync: _Sync) -> bool:
        if sync.chunks is None:
            return not self._missing(sync)
        return sync.chunks.complete()

    def _try_apply(self) -> None:
        while self.pending and self.pending[0].due < self.next_round \
                and self._complete(self.pending[0]):
            self._apply(self.pending.pop(0))

    def _mean(self, sync: _Sync, window: slice) -> tuple[np.ndarray | None, np.ndarray]:
        """(the mean delta of the sync, contributors per element as float32)."""
        if sync.chunks is None:
            own = sync.own
            if sync.at_start is not None and own is not None:  # eager: own delta as of now
                assert self.replica.params is not None
                own = (own + (sync.at_start - self.replica.params[window])).astype(np.float32)
            contributions = {self.rank: own, **sync.deltas}
            count = np.full(window.stop - window.start, len(contributions), np.float32)
            return mean_of(contributions, window.stop - window.start), count
        mean, count = self._chunks_mean(sync, window)
        if mean is not None and sync.at_start is not None:  # eager: own delta as of now,
            assert self.replica.params is not None  # with weight 1/count
            moved = (sync.at_start - self.replica.params[window]).astype(np.float32)
            mean = (mean + moved / count).astype(np.float32)
        return mean, count

    def _apply(self, sync: _Sync) -> None:
        self.syncs_done += 1
        if sync.chunks is not None:
            self._keep_applied(sync)
        if self.anchor is None or self.replica.params is None:
            return
        window = self._slice(sync.fragment)
        mean, _ = self._mean(sync, window)
        assert mean is not None
        anchor, self.outer_state[sync.fragment] = self.outer.apply(
            self.anchor[window], self.outer_state[sync.fragment], mean)
        self.anchor[window] = anchor
        if self.merge_alpha == 0:
            self.replica.params[window] = anchor
        else:
            alpha = np.float32(self.merge_alpha)
            self.replica.params[window] = (np.float32(1) - alpha) * anchor \
                + alpha * self.replica.params[window]

    def may_start(self, round_: int) -> bool:
        self._try_apply()
        return not self.pending or self.pending[0].due >= round_

    def waiting_on(self, round_: int) -> list[int]:
        if self.may_start(round_):
            return []
        return self._missing(self.pending[0])

    def lag(self, round_: int) -> int:
        return 0 if not self.pending else max(0, round_ - self.pending[0].start - 1)

    # ------------------------------------------------------------------ events

    def local_step(self, round_: int, grad: np.ndarray | None) -> list[Send]:
        self._step_replica(round_, grad, lambda: f"the sync started after round "
                                                 f"{self.pending[0].start} was applied")
        effects: list[Send] = []
        starting = self.sync_after(round_)
        if starting is not None:
            fragment, due = starting
            window = self._slice(fragment)
            produced = None
            if self.anchor is not None and self.replica.params is not None:
                produced = (self.anchor[window] - self.replica.params[window]).astype(np.float32)
            if self.reduced:
                sync = _Sync(round_, due, fragment, None, {})
            else:
                # coded here, not by the hook on the way out: the sync averages the value
                # every peer decodes, own contribution included, so replicas stay equal
                message = self.coded(Partial(Kind.PSEUDO, self.rank, round_, fragment,
                                             self.fragments, window.start,
                                             window.stop - window.start, produced))
                own = None if message.values is None else message.values.copy()
                sync = _Sync(round_, due, fragment, own, self.early.pop((round_, fragment), {}))
                effects.append(Send(self.peers, message))
            if self.eager and self.replica.params is not None:
                sync.at_start = self.replica.params[window].copy()
            self.pending.append(sync)
            if self.reduced:
                effects.extend(self._start_chunks(sync, produced))
        self._try_apply()
        return effects

    def _check_message(self, msg: Partial) -> bool:
        """SchemeError unless `msg` is one a correct peer sends; True for a final marker."""
        n, parts = self.workers, self.fragments
        kinds: tuple[Kind, ...]
        if self.reduced:
            kinds, last, p_ok = (Kind.PSEUDO, Kind.PSEUDO_MEAN), 2 * n, \
                (msg.p == n if msg.kind == Kind.PSEUDO else 1 <= msg.p <= n)
        else:
            kinds, last, p_ok = (Kind.PSEUDO,), parts, msg.p == parts
        if msg.kind not in kinds or msg.sender not in self.peers \
                or not 0 <= msg.part <= last or not p_ok:
            raise SchemeError(f"diloco worker {self.rank}: unexpected {msg.kind.name} "
                              f"part {msg.part} of {msg.p} from node {msg.sender}")
        final = msg.part == last and msg.kind == Kind.PSEUDO
        if final:
            return True
        starting = self.sync_after(msg.round)
        fragment = msg.part if not self.reduced else None if starting is None else starting[0]
        if starting is None or starting[0] != fragment \
                or (self.reduced and (msg.part < n) != (msg.kind == Kind.PSEUDO)):
            raise SchemeError(f"no sync of part {msg.part} starts after round {msg.round}")
        if self.reduced:
            bounds = self._chunk_bounds(fragment)
            c = msg.part % n
            span = (int(bounds[c]), int(bounds[c + 1] - bounds[c]))
        else:
            window = self._slice(fragment)
            span = (window.start, window.stop - window.start)
        if (msg.offset, msg.length) != span or not msg.length:
            raise SchemeError(f"a pseudo-gradient of part {msg.part} spans "
                              f"[{span[0]}, {span[0] + span[1]})")
        return False

    def receive(self, msg: Partial) -> Receipt:
        final = self._check_message(msg)
        self._check_values(msg)
        key = (int(msg.kind), *msg.key)
        if key in self.seen:
            return Receipt(False)
        self.seen.add(key)
        effects: list[Send] = []
        if self.reduced:
            effects = self._receive_chunk(msg, final)
        elif final:
            self.final_round[msg.sender] = msg.round
        else:
            values = None if msg.values is None else msg.values.copy()
            sync = next((s for s in self.pending
                         if (s.start, s.fragment) == (msg.round, msg.part)), None)
            if sync is not None:
                sync.deltas[msg.sender] = values
            elif msg.round >= self.next_round:  # a peer ahead of us: keep it for our sync
                self.early.setdefault((msg.round, msg.part), {})[msg.sender] = values
            # else: the sync was applied without this peer (suspended): drop it
        self._try_apply()
        return Receipt(True, tuple(effects))

    def suspend_peer(self, peer: int) -> None:
        super().suspend_peer(peer)
        self.view_changes += 1
        self._view_changed()
        if self.reduced:
            self._due.extend(self._reroute())
        self._try_apply()

    def resume_peer(self, peer: int) -> None:
        super().resume_peer(peer)
        self.view_changes += 1
        self._view_changed()

    def finish(self, rounds_done: int) -> list[Send]:
        if rounds_done != self.next_round:
            raise SchemeError(f"node {self.rank}: finish after {rounds_done} rounds")
        self.finished = True
        last = 2 * self.workers if self.reduced else self.fragments
        marker = Partial(Kind.PSEUDO, self.rank, rounds_done, last,
                         self.workers if self.reduced else self.fragments,
                         0, 0, None if self.replica.params is None else np.zeros(0, np.float32),
                         True)
        return [Send(self.peers, marker)]

    def drained(self) -> bool:
        self._try_apply_finished()
        return not self.pending and all(
            p in self.final_round or p in self.suspended for p in self.peers)

    def _try_apply_finished(self) -> None:
        """After finish, a sync whose overlap runs past the last round applies when its
        deltas are in (the rounds that would have overlapped it never come)."""
        while self.finished and self.pending and self._complete(self.pending[0]):
            self._apply(self.pending.pop(0))

    def settle(self) -> None:
        self._try_apply_finished()

    def unfinished(self) -> str | None:
        if not self.pending:
            return None
        sync = self.pending[0]
        missing = self._missing(sync)
        whose = f": no part from rank(s) {missing}" if missing else ""
        return (f"the outer sync begun after round {sync.start} never "
                f"completed here{whose}")

    def adopt_agreed(self, syncs: int, anchor: np.ndarray,
                     outer_state: list[np.ndarray | None]) -> None:
        """Take a live peer's anchor and outer state as of the same `syncs` applied (a
        re-sync); the replica keeps its progress since (moved by the anchors' difference)."""
        if syncs != self.syncs_done or self.anchor is None or self.replica.params is None:
            raise SchemeError(f"diloco worker {self.rank}: a re-sync at {syncs} syncs, "
                              f"{self.syncs_done} applied here")
        if anchor.shape != self.anchor.shape or len(outer_state) != self.fragments:
            raise SchemeError(f"diloco worker {self.rank}: a re-sync of another shape")
        self.replica.params += (anchor - self.anchor).astype(np.float32)
        self.anchor = anchor.astype(np.float32, copy=True)
        self.outer_state = [None if state is None else np.array(state, np.float32)
                            for state in outer_state]

    def resync(self) -> DilocoWorker:
        return self

    def agreed_state(self) -> np.ndarray | None:
        """The anchor: every replica applies the same syncs (their means are the owners'),
        so ranks that ran the same rounds end with bit-equal anchors."""
        return None if self.pending else self.anchor


def check_schedule(inner_steps: int, fragments: int, overlap_steps: int) -> None:
    """ValueError naming the key when H, P and tau do not make torchft's schedule."""
    if inner_steps < 1:
        raise ValueError(f"exchange.inner_steps: got {inner_steps}, expected >= 1")
    if fragments < 1 or inner_steps % fragments:
        raise ValueError(f"exchange.fragments: got {fragments}, expected a divisor of "
                         f"exchange.inner_steps ({inner_steps})")
    if not 0 <= overlap_steps < inner_steps // fragments:
        raise ValueError(f"exchange.overlap_steps: got {overlap_steps}, expected 0 <= tau < "
                         f"inner_steps / fragments = {inner_steps // fragments}")


def check_diloco_knobs(workers: int, length: int, inner_steps: int, fragments: int,
                       overlap_steps: int, merge_alpha: float) -> None:
    """ValueError saying which (Streaming) DiLoCo knob is out of range."""
    if workers < 2:
        raise ValueError("diloco needs at least 2 workers")
    check_schedule(inner_steps, fragments, overlap_steps)
    check_p(length, fragments)
    if not 0 <= merge_alpha <= 1:
        raise ValueError(f"exchange.merge_alpha: got {merge_alpha}, expected 0 <= alpha <= 1")


def _sync_label(settings: DilocoSettings) -> str:
    """" all-to-all" when the sync is not the default all-reduce."""
    return "" if settings.outer_sync == DEFAULT_OUTER_SYNC else f" {settings.outer_sync}"


class DilocoScheme(Scheme):
    """DiLoCo: H inner steps, then an outer Nesterov step on the mean pseudo-gradient."""

    name = "diloco"
    summary = "H local optimizer steps, then an outer step on averaged pseudo-gradients"
    settings = DilocoSettings
    presets: ClassVar[tuple[Preset, ...]] = (MULOCO,)
    pattern = "all-reduce"
    _fragmented: ClassVar[bool] = False  # whether exchange.fragments is read

    @property
    def keys(self) -> tuple[str, ...]:
        return ("inner_steps", "outer_lr", "outer_momentum", "outer_sync")

    def _streaming(self, knobs: DilocoSettings) -> dict[str, Any]:
        """The Streaming knobs: DiLoCo is one fragment, no overlap."""
        return {"fragments": 1, "overlap_steps": 0, "merge_alpha": 0.0, "eager": False}

    def _knobs(self, spec: SchemeSpec) -> dict[str, Any]:
        knobs = spec.knobs(DilocoSettings)
        return {"inner_steps": knobs.inner_steps, "outer_sync": knobs.outer_sync,
                **self._streaming(knobs)}

    def check_spec(self, spec: SchemeSpec) -> None:
        knobs = self._knobs(spec)
        check_schedule(knobs["inner_steps"], knobs["fragments"], knobs["overlap_steps"])

    def check_exchange(self, exchange: ExchangeView) -> None:
        knobs = exchange.knobs(DilocoSettings)
        check_schedule(knobs.inner_steps, knobs.fragments if self._fragmented else 1,
                       self._tau(knobs))

    def build(self, spec: SchemeSpec, length: int, params0: np.ndarray | None,
              replica: ReplicaOf) -> list[SchemeNode]:
        knobs = spec.knobs(DilocoSettings)
        outer = NesterovSGD(knobs.outer_lr, knobs.outer_momentum)
        return [DilocoWorker(i, spec.workers, length, replica=replica(i, params0), outer=outer,
                             **self._knobs(spec)) for i in range(spec.workers)]

    def _tau(self, knobs: DilocoSettings) -> int:
        return 0

    def staleness_bound(self, exchange: ExchangeView, *, p_max: int, ssp: float) -> float:
        """H - 1 + tau: the others' inner steps since the last sync, plus the overlap."""
        knobs = exchange.knobs(DilocoSettings)
        return float(knobs.inner_steps - 1 + self._tau(knobs))

    def effective_ssp(self, exchange: ExchangeView) -> float:
        return 0.0

    def period_rounds(self, exchange: ExchangeView) -> int:
        """H / P: a sync lands every window (every H rounds for DiLoCo)."""
        knobs = exchange.knobs(DilocoSettings)
        return knobs.inner_steps // (knobs.fragments if self._fragmented else 1)

    def label(self, exchange: ExchangeView) -> str:
        knobs = exchange.knobs(DilocoSettings)
        return f"H={knobs.inner_steps}{_sync_label(knobs)}"


class StreamingDilocoScheme(DilocoScheme):
    """Streaming DiLoCo: P fragments synced in turn, each sync overlapping tau inner steps."""

    name = "streaming-diloco"
    summary = "DiLoCo syncing P fragments in turn, each sync overlapped with tau inner steps"
    presets: ClassVar[tuple[Preset, ...]] = ()  # muloco is diloco's
    _fragmented: ClassVar[bool] = True

    @property
    def keys(self) -> tuple[str, ...]:
        return DilocoSettings.names()

    def _streaming(self, knobs: DilocoSettings) -> dict[str, Any]:
        return {"fragments": knobs.fragments, "overlap_steps": knobs.overlap_steps,
                "merge_alpha": knobs.merge_alpha, "eager": knobs.eager}

    def _tau(self, knobs: DilocoSettings) -> int:
        return knobs.overlap_steps

    def label(self, exchange: ExchangeView) -> str:
        knobs = exchange.knobs(DilocoSettings)
        eager = " eager" if knobs.eager else ""
        return (f"H={knobs.inner_steps} P={knobs.fragments} "
                f"tau={knobs.overlap_steps}{eager}{_sync_label(knobs)}")


DILOCO = DilocoScheme()
STREAMING_DILOCO = StreamingDilocoScheme()
