"""DiLoCo's outer sync as an all-reduce: a direct reduce-scatter, then an all-gather.

What every DiLoCo users compare against does (torchft's `local_sgd.py` through
its process group, OpenDiLoCo, PCCL, MaxText's `diloco.py` through a psum):
the pseudo-gradients are all-reduced, 2(n-1)/n copies of the fragment leaving
each uplink per sync, not the (n-1) copies of an all-to-all. This module
holds the all-reduce's pure part for `akocore.schemes.diloco.DilocoWorker`:

- the fragment is cut into n contiguous *chunks* (chunk c of [start, stop) is
  [start + c·L//n, start + (c+1)·L//n), L = stop - start; a chunk may be empty
  when L < n, and an empty chunk is never sent);
- **reduce-scatter**: at the sync's start each worker codes every chunk of its
  pseudo-gradient (the run's codec with error feedback, per chunk, as any
  contribution) and sends chunk c to its *owner* (Kind.PSEUDO, part c, p n);
- **all-gather**: the owner of chunk c sums the decoded contributions in rank
  order in float64 (its own included), divides by their count and sends the
  mean to every peer (Kind.PSEUDO_MEAN, part n + c, p the count). It codes the
  mean with the run's codec *without* error feedback (as torchft's quantised
  all-reduce does) and uses the decoded value itself, so every replica applies
  the same values and anchors stay bit-equal;
- each worker applies the sync once it holds every non-empty chunk's mean.

The owner of chunk c is rank c, or, if c is lost (suspended, or stopped
before the sync), the next live rank after c (cyclically): the *successor*.
When a worker's view of who is live changes (a peer suspended or its final
marker read), it re-sends each chunk whose owner changed, so the group
re-forms among the survivors without stalling. Every rank computes the
owners alike when their views agree; if they disagree (one rank suspended a
peer that another still heard), the first mean of a chunk to arrive wins and
a later one is dropped, so a replica never mixes two means of one chunk.
Survivors whose views differed can then hold means with different
contributors (each owner's mean is exact for what it held).

Two rounds of latency per sync against the ring's 2(n-1), the same bytes per
uplink; each worker sends n-1 chunk messages and n-1 mean copies per sync.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from akocore.messages import Kind, Partial, Send

OUTER_SYNCS = ("allreduce", "all-to-all")  # exchange.outer_sync
DEFAULT_OUTER_SYNC = "allreduce"


def chunk_bounds(start: int, stop: int, n: int) -> np.ndarray:
    """The n + 1 bounds of the n chunks of [start, stop) (empty chunks when stop - start < n)."""
    return start + (np.arange(n + 1, dtype=np.int64) * (stop - start)) // n


@dataclass
class ChunkState:
    """One sync's all-reduce state on one worker: its chunks, what it holds, where they went."""

    bounds: np.ndarray  # n + 1 absolute offsets
    own: dict[int, Partial] = field(default_factory=dict)  # chunk -> the own coded chunk
    sent_to: dict[int, int] = field(default_factory=dict)  # chunk -> owner it went to
    deltas: dict[int, dict[int, np.ndarray | None]] = field(default_factory=dict)
    # chunk -> its mean as first received (or made): values, contributors in `p`, sender
    means: dict[int, Partial] = field(default_factory=dict)
    announced: set[int] = field(default_factory=set)  # chunks whose mean this rank sent

    def __post_init__(self) -> None:
        sizes = np.diff(self.bounds)
        self._chunks = [int(c) for c in np.flatnonzero(sizes)]

    def chunk(self, c: int) -> slice:
        return slice(int(self.bounds[c]), int(self.bounds[c + 1]))

    def chunks(self) -> list[int]:
        """The non-empty chunks."""
        return self._chunks

    def complete(self) -> bool:
        return len(self.means) == len(self._chunks)

    def take_early(self, early: ChunkState) -> None:
        """Merge what arrived before this worker started the sync."""
        for c, senders in early.deltas.items():
            self.deltas.setdefault(c, {}).update(senders)
        for c, mean in early.means.items():
            self.means.setdefault(c, mean)


def mean_of(contributions: dict[int, np.ndarray | None], length: int) -> np.ndarray | None:
    """The float32 mean of `contributions` summed in rank order in float64 (every replica
    and every owner sums alike); None in timing-only mode."""
    if any(values is None for values in contributions.values()):
        return None
    total = np.zeros(length, np.float64)
    for rank in sorted(contributions):
        total += contributions[rank]  # type: ignore[operator,arg-type]
    return (total / len(contributions)).astype(np.float32)


def owners_of(live: list[bool]) -> list[int]:
    """The owner of each chunk: rank c, or the next live rank after it, cyclically.
    `live[r]` says whether rank r takes part in the sync (the asking rank always does)."""
    n = len(live)
    if not any(live):
        raise ValueError("no live rank owns the chunks")
    owners = [0] * n
    following = 0
    for step in reversed(range(2 * n)):  # twice round: the next live rank, cyclically
        rank = step % n
        if live[rank]:
            following = rank
        if step < n:
            owners[rank] = following
    return owners


class AllReduceSync:
    """DilocoWorker's all-reduce, as a mixin: routing chunks to their owners, reducing the
    chunks a rank owns, taking chunks and means in, re-forming after a loss. It reads the
    worker's state (rank, workers, peers, pending syncs, its codec) and its `_live`."""

    rank: int
    workers: int
    peers: tuple[int, ...]
    pending: list[Any]  # akocore.schemes.diloco._Sync, in start order
    applied: list[Any]  # the last syncs applied (_keep_applied)
    inner_steps: int
    next_round: int
    early_chunks: dict[tuple[int, int], ChunkState]
    final_round: dict[int, int]
    _view: int
    _owner_cache: dict[int, tuple[int, list[int]]]
    _bounds_cache: dict[int, np.ndarray]
    encoder: Any
    _due: list[Send]

    if TYPE_CHECKING:  # the worker's own, not overridden here
        def _live(self, peer: int, start: int) -> bool: ...
        def _slice(self, fragment: int) -> slice: ...
        def sync_after(self, round_: int) -> tuple[int, int] | None: ...
        def coded(self, message: Partial) -> Partial: ...

    def _chunks_missing(self, sync: Any) -> list[int]:
        """Whom the sync waits for: the owners of the chunks whose mean is still to come,
        and, for a chunk this rank owns, the live peers whose contribution is missing."""
        missing: set[int] = set()
        for c in sync.chunks.chunks():
            if c in sync.chunks.means:
                continue
            owner = self._owner(c, sync.start)
            if owner != self.rank:
                missing.add(owner)
            else:
                held = sync.chunks.deltas.get(c, {})
                missing.update(p for p in self.peers
                               if p not in held and self._live(p, sync.start))
        return sorted(missing)

    def _chunks_mean(self, sync: Any, window: slice) -> tuple[np.ndarray | None, np.ndarray]:
        """The complete sync's mean over the fragment `window`, from its chunks' means, and
        the number of contributors behind each element."""
        mean = np.zeros(window.stop - window.start, np.float32)
        count = np.ones(window.stop - window.start, np.float32)
        for c in sync.chunks.chunks():
            held = sync.chunks.means[c]
            values, contributors = held.values, held.p
            if values is None:
                return None, count
            piece = slice(int(sync.chunks.bounds[c]) - window.start,
                          int(sync.chunks.bounds[c + 1]) - window.start)
            mean[piece] = values
            count[piece] = contributors
        return mean, count

    def _route(self, sync: Any) -> list[Send]:
        """Send each chunk to its owner, once per owner (again when the owner changed): the
        own delta while the chunk's mean is still to come, or the mean already held when
        the owner is a successor that did not send it (so a successor adopts the mean a
        lost owner gave some survivors rather than computing a second one); then reduce
        the chunks this rank owns."""
        chunks = sync.chunks
        assert chunks is not None
        effects: list[Send] = []
        for c in chunks.chunks():
            owner = self._owner(c, sync.start)
            if owner == self.rank or chunks.sent_to.get(c) == owner:
                continue
            held = chunks.means.get(c)
            if held is None:
                effects.append(Send((owner,), chunks.own[c]))
            elif held.sender != owner:
                effects.append(Send((owner,), dataclasses.replace(held, sender=self.rank)))
            chunks.sent_to[c] = owner
        effects.extend(self._reduce_owned(sync))
        return effects

    def _reduce_owned(self, sync: Any) -> list[Send]:
        """For each chunk this rank owns: its mean once every live peer's contribution is
        in (or the mean a lost owner gave, adopted), sent once to every live peer."""
        chunks = sync.chunks
        assert chunks is not None
        effects: list[Send] = []
        owners = self._owners(sync.start)
        for c in chunks.chunks():
            if owners[c] != self.rank or c in chunks.announced:
                continue
            if c not in chunks.means:
                held = chunks.deltas.get(c, {})
                if any(p not in held and self._live(p, sync.start) for p in self.peers):
                    continue
                piece = chunks.chunk(c)
                mean = mean_of({self.rank: chunks.own[c].values, **held},
                               piece.stop - piece.start)
                chunks.means[c] = self._coded_mean(Partial(
                    Kind.PSEUDO_MEAN, self.rank, sync.start, self.workers + c, 1 + len(held),
                    piece.start, piece.stop - piece.start, mean))
            chunks.announced.add(c)
            message = dataclasses.replace(chunks.means[c], sender=self.rank)
            dests = tuple(p for p in self.peers if self._live(p, sync.start))
            if dests:
                effects.append(Send(dests, message))
        return effects

    def _coded_mean(self, message: Partial) -> Partial:
        """The mean as the run's codec carries it, without error feedback: the owner
        applies the decoded value its peers apply."""
        if self.encoder is None:
            return message
        codec = self.encoder.codec
        if message.values is None:
            return dataclasses.replace(message, codec=codec.name)
        payload, decoded, _ = codec.encode_decoded(message.values, None)
        return dataclasses.replace(message, values=decoded, payload=payload, codec=codec.name)

    def _start_chunks(self, sync: Any, produced: np.ndarray | None) -> list[Send]:
        """Code every chunk of the own delta (error feedback per chunk) and route them."""
        chunks = ChunkState(self._chunk_bounds(sync.fragment))
        window = self._slice(sync.fragment)
        for c in chunks.chunks():
            piece = chunks.chunk(c)
            values = None if produced is None else \
                produced[piece.start - window.start:piece.stop - window.start]
            message = self.coded(Partial(Kind.PSEUDO, self.rank, sync.start, c, self.workers,
                                         piece.start, piece.stop - piece.start, values))
            chunks.own[c] = message
        early = self.early_chunks.pop((sync.start, sync.fragment), None)
        if early is not None:
            chunks.take_early(early)
        sync.chunks = chunks
        return self._route(sync)

    def _keep_applied(self, sync: Any) -> None:
        """Keep an applied sync's means for a while: a survivor that applied it may hold
        the mean a lost owner sent to it alone, which the successor must adopt. Kept: the
        syncs started within the last 2H rounds (a peer still in a sync cannot be further
        behind: the next sync waits for it); their deltas are no longer needed."""
        sync.chunks.deltas.clear()
        self.applied.append(sync)
        horizon = sync.start - 2 * self.inner_steps
        self.applied = [s for s in self.applied if s.start >= horizon]

    def _reroute(self) -> list[Send]:
        """Who is live changed: chunks whose owner changed go to the new owner (a mean
        held, for a sync applied here already), and a contribution no longer awaited may
        complete a chunk this rank owns."""
        effects: list[Send] = []
        for sync in (*self.applied, *self.pending):
            if sync.chunks is not None:
                effects.extend(self._route(sync))
        return effects

    def take_effects(self) -> list[Send]:
        due, self._due = self._due, []
        return due

    def _receive_chunk(self, msg: Partial, final: bool) -> list[Send]:
        n = self.workers
        if final:
            self.final_round[msg.sender] = msg.round
            self._view_changed()
            return self._reroute()
        c = msg.part % n
        values = None if msg.values is None else msg.values.copy()
        sync = next((s for s in self.pending if s.start == msg.round), None)
        if sync is None and msg.round < self.next_round:  # applied here already
            applied = next((s for s in self.applied if s.start == msg.round), None)
            if applied is None or msg.kind == Kind.PSEUDO_MEAN:
                return []  # a late copy or a second mean: the first one counted
            return self._reduce_owned(applied)  # a successor's call: the mean held
        if sync is None:
            fragment = self.sync_after(msg.round)
            assert fragment is not None
            target = self.early_chunks.setdefault(
                (msg.round, fragment[0]), ChunkState(self._chunk_bounds(fragment[0])))
        else:
            assert sync.chunks is not None
            target = sync.chunks
        if msg.kind == Kind.PSEUDO_MEAN:  # the first mean of a chunk wins
            target.means.setdefault(c, dataclasses.replace(msg, values=values))
        else:
            target.deltas.setdefault(c, {})[msg.sender] = values
        return [] if sync is None else self._reduce_owned(sync)

    def _owner(self, chunk: int, start: int) -> int:
        return self._owners(start)[chunk]

    def _owners(self, start: int) -> list[int]:
        """The owner of every chunk of the sync started after `start`, in this rank's view
        (owners_of); cached until the view changes (`_view`)."""
        cached = self._owner_cache.get(start)
        if cached is not None and cached[0] == self._view:
            return cached[1]
        owners = owners_of([r == self.rank or self._live(r, start)
                            for r in range(self.workers)])
        if len(self._owner_cache) > 16:
            self._owner_cache.clear()
        self._owner_cache[start] = (self._view, owners)
        return owners

    def _view_changed(self) -> None:
        """Who is live changed (a suspension, a return, a final marker): owners again."""
        self._view += 1

    def _chunk_bounds(self, fragment: int) -> np.ndarray:
        """The bounds of the n chunks of `fragment` (computed once per fragment)."""
        cached = self._bounds_cache.get(fragment)
        if cached is None:
            window = self._slice(fragment)
            cached = self._bounds_cache[fragment] = chunk_bounds(window.start, window.stop,
                                                                 self.workers)
        return cached

