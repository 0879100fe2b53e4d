"""Stale-synchronous gating from per-peer contiguous rounds.

`DeliveryLog` records which messages a node has received from each sender,
keyed by (sender, round, part), and derives r_j: the highest round up to which
every expected message from sender j has arrived. It also answers "is this a
duplicate?" in bounded memory (rounds at or below r_j are forgotten).

`may_start` is the gate: a node that has finished round t may start round
t + 1 only while t - min_j r_j <= s over the peers still in the gate. s = 0 is
lockstep, s = inf fully asynchronous. There is no central clock: each node
decides from what it has received. Peers that finished, or that the shell
declared silent past the peer timeout, leave the gate.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import numpy as np


class DeliveryLog:
    """Per-sender record of delivered (round, part) messages.

    `contiguous[j]` is r_j for sender j (-1 before anything arrived), held in a
    numpy row indexed by rank so that gates take a vectorised minimum;
    `has_pending[j]` says whether out-of-order rounds of j are held. A
    simulator may keep every node's two rows in shared matrices
    (`share_rows`).
    """

    def __init__(self, senders: Iterable[int], parts_per_round: Callable[[int, int], int], *,
                 size: int | None = None) -> None:
        self._parts_per_round = parts_per_round
        self.senders = tuple(sorted(set(senders)))
        width = size if size is not None else (max(self.senders) + 1 if self.senders else 0)
        if self.senders and max(self.senders) >= width:
            raise ValueError(f"sender {max(self.senders)} outside a log of width {width}")
        self.contiguous = np.full(width, -1, np.int64)
        self.has_pending = np.zeros(width, bool)
        self.known = np.zeros(width, dtype=bool)
        self.known[list(self.senders)] = True
        self._pending: dict[int, dict[int, set[int]]] = {j: {} for j in self.senders}

    def share_rows(self, rounds_row: np.ndarray, pending_row: np.ndarray) -> None:
        """Keep `contiguous` and `has_pending` in these arrays from now on (views
        into a caller's matrices; the current values are copied in). Whoever
        writes the rows directly must keep them what `record` would make them."""
        if rounds_row.shape != self.contiguous.shape or pending_row.shape != self.has_pending.shape:
            raise ValueError(f"rows of shape {rounds_row.shape} and {pending_row.shape} for a "
                             f"log of width {self.contiguous.shape[0]}")
        rounds_row[:] = self.contiguous
        pending_row[:] = self.has_pending
        self.contiguous = rounds_row
        self.has_pending = pending_row

    def knows(self, sender: int) -> bool:
        return 0 <= sender < self.known.size and bool(self.known[sender])

    def is_duplicate(self, sender: int, round_: int, part: int) -> bool:
        if round_ <= self.contiguous[sender]:
            return True
        parts = self._pending[sender].get(round_)
        return parts is not None and part in parts

    def record(self, sender: int, round_: int, part: int) -> bool:
        """Record a delivery; False (and nothing changes) when it is a duplicate."""
        if not self.knows(sender):
            raise KeyError(f"unknown sender {sender}")
        if self.is_duplicate(sender, round_, part):
            return False
        self._pending[sender].setdefault(round_, set()).add(part)
        self.record_advance(sender)
        return True

    def held_rounds(self, sender: int, first: int, last: int) -> list[int]:
        """The rounds of `sender` in [first, last] of which something is recorded."""
        held = list(range(first, min(last, int(self.contiguous[sender])) + 1))
        held += sorted(r for r in self._pending[sender] if first <= r <= last)
        return held

    def record_range(self, sender: int, first: int, last: int) -> list[int]:
        """Record every round of `sender` in [first, last] as wholly delivered (a folded
        message: one message per round senders only); the rounds newly recorded, in
        order (empty: every one was held, a duplicate)."""
        if not self.knows(sender):
            raise KeyError(f"unknown sender {sender}")
        if self._parts_per_round(sender, last) != 1:
            raise ValueError("a range of rounds is recorded only for one message per round")
        if last < first:
            return []
        held = set(self.held_rounds(sender, first, last))
        if len(held) == last - first + 1:
            return []
        new = [r for r in range(max(first, int(self.contiguous[sender]) + 1), last + 1)
               if r not in held]
        pending = self._pending[sender]
        if first <= self.contiguous[sender] + 1:
            for r in [r for r in pending if r <= last]:
                del pending[r]
            self.contiguous[sender] = last
        else:
            for r in new:
                pending.setdefault(r, set()).add(0)
        self.record_advance(sender)
        return new

    def skip_to(self, sender: int, round_: int) -> None:
        """Treat every round of `sender` up to `round_` as delivered (a restarted
        sender continues after a gap: nothing before its first new round will come)."""
        if round_ > self.contiguous[sender]:
            pending = self._pending[sender]
            for r in [r for r in pending if r <= round_]:
                del pending[r]
            self.contiguous[sender] = round_
            self.record_advance(sender)

    def record_advance(self, sender: int) -> None:
        pending = self._pending[sender]
        nxt = int(self.contiguous[sender]) + 1
        while nxt in pending and len(pending[nxt]) >= self._parts_per_round(sender, nxt):
            del pending[nxt]
            self.contiguous[sender] = nxt
            nxt += 1
        self.has_pending[sender] = bool(pending)

    def export(self) -> dict[int, tuple[int, dict[int, list[int]]]]:
        """Plain data: sender -> (contiguous round, {pending round: parts})."""
        return {j: (int(self.contiguous[j]), {r: sorted(p) for r, p in self._pending[j].items()})
                for j in self.senders}

    def load(self, state: dict[int, tuple[int, dict[int, list[int]]]]) -> None:
        """Replace the record for the senders in `state` (others are kept)."""
        for j, (contiguous, pending) in state.items():
            j = int(j)
            if not self.knows(j):
                raise KeyError(f"unknown sender {j}")
            self.contiguous[j] = int(contiguous)
            self._pending[j] = {int(r): set(p) for r, p in pending.items()}
            self.has_pending[j] = bool(self._pending[j])

    def pending_rounds(self, sender: int) -> int:
        """How many incomplete rounds are held for a sender (memory check)."""
        return len(self._pending[sender])


def may_start(next_round: int, peer_rounds: Iterable[int], staleness: float) -> bool:
    """SSP gate: round 0 always; round t+1 while t - min_j r_j <= s."""
    if next_round <= 0 or math.isinf(staleness):
        return True
    if isinstance(peer_rounds, np.ndarray):
        if peer_rounds.size == 0:
            return True
        return bool((next_round - 1) - peer_rounds.min() <= staleness)
    rounds = list(peer_rounds)
    if not rounds:
        return True
    return (next_round - 1) - min(rounds) <= staleness


def blocking_peers(
    next_round: int, contiguous: np.ndarray, active: Iterable[int], staleness: float
) -> list[int]:
    """The peers whose missing messages hold `next_round` back (for reports)."""
    if next_round <= 0 or math.isinf(staleness):
        return []
    need = next_round - 1 - staleness
    return sorted(j for j in active if contiguous[j] < need)
