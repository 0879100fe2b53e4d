"""What a scheme node that waits on its live peers shares: final markers and who is live.

`LivePeersNode` is the base of the scheme nodes whose every worker ends by
sending every peer a final marker (sparta, noloco): it holds the peers, the
round each peer said it stopped at, whether a peer takes part in a round
(`live`: not suspended and not stopped before it), the marker itself
(`end_with_marker`), the gate (one exchange at a time: the round begun after
`in_progress` must complete before the next round starts), the drain rule
(that exchange done, every peer ended or suspended), the words for an
exchange left unfinished, and the hook that re-checks what a suspension or a
message may complete (`progress`).
"""

from __future__ import annotations

import math

import numpy as np

from akocore.messages import Kind, Partial, Send
from akocore.schemes.base import Replica, SchemeError, SchemeNode


class LivePeersNode(SchemeNode):
    """A worker among `workers` ranks that ends with a final marker to every peer."""

    exchange_name = "exchange"  # words for one exchange, e.g. "outer step"

    def __init__(self, rank: int, workers: int, length: int, replica: Replica) -> None:
        super().__init__(rank, length, replica)
        self.workers = workers
        self.peers = tuple(r for r in range(workers) if r != rank)
        self.final_round: dict[int, int] = {}  # peer -> the rounds it ran
        self.seen: set[tuple[int, int, int]] = set()  # keys of the messages taken

    def first_copy(self, msg: Partial) -> bool:
        """Check `msg`'s values; False for a copy taken before; a final marker's rounds
        are noted."""
        self._check_values(msg)
        if msg.key in self.seen:
            return False
        self.seen.add(msg.key)
        if msg.final:
            self.final_round[msg.sender] = msg.round
        return True

    def live(self, peer: int, round_: int) -> bool:
        """Whether `peer` takes part in `round_`: not suspended, not stopped before it."""
        return peer not in self.suspended and self.final_round.get(peer, math.inf) > round_

    def progress(self) -> None:
        """Apply whatever is complete now (after a suspension, a message, a marker)."""

    def in_progress(self) -> int | None:
        """The round after which the exchange still incomplete began; None if none."""
        return None

    def may_start(self, round_: int) -> bool:
        self.progress()
        return self.in_progress() is None

    def begin_round(self, round_: int, grad: np.ndarray | None) -> None:
        """local_step's start: the checks, then the own optimizer step."""
        self._step_replica(round_, grad, lambda: f"the {self.exchange_name} begun after "
                                                 f"round {self.in_progress()} completed")

    def drained(self) -> bool:
        self.progress()
        return self.in_progress() is None and self.peers_ended()

    def unfinished(self) -> str | None:
        start = self.in_progress()
        if start is None:
            return None
        return (f"the {self.exchange_name} begun after round {start} never completed "
                f"here: no values from rank(s) {self.waiting_on(start + 1)}")

    def end_with_marker(self, rounds_done: int, kind: Kind, part: int, p: int) -> list[Send]:
        """finish(): the marker (no values) that tells every peer the rounds this one ran."""
        if rounds_done != self.next_round:
            raise SchemeError(f"node {self.rank}: finish after {rounds_done} rounds, "
                              f"{self.next_round} done")
        self.finished = True
        marker = Partial(kind, self.rank, rounds_done, part, p, 0, 0,
                         None if self.replica.params is None else np.zeros(0, np.float32), True)
        return [Send(self.peers, marker)]

    def peers_ended(self) -> bool:
        """Every peer sent its final marker or is suspended."""
        return all(p in self.final_round or p in self.suspended for p in self.peers)

    def suspend_peer(self, peer: int) -> None:
        super().suspend_peer(peer)
        self.progress()
