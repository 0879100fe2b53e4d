"""What a sender owes a peer that was away, folded: `OwedGap` (bounded memory, one message back).

akorun.transport.sender folds into it the ako gradients a suspended peer's full queue
drops, and sends what it gives back (`take`) first once the peer is heard
again: one folded message (akocore.messages.Partial `first_round`) per range
of consecutive rounds, whatever the length of the absence.
"""

from __future__ import annotations

import numpy as np

from akocore.messages import Partial


class OwedGap:
    """Messages taken out of a suspended peer's full queue, folded (bounded memory).

    Values are summed per partition (together at most one flat vector); the
    rounds are kept as ranges of consecutive rounds (normally one: the queue
    drops its oldest, in order; a folded message, such as a catch-up's skip,
    adds its whole range). `take` gives back one folded message per
    range (`Partial.first_round`): the first carries the whole sum over the
    span of the partitions folded (zeros between them), any later one no
    values (it only records its rounds). So what a peer was owed, for however
    long it was away, goes back in one message of at most one gradient's size;
    the receiver records each round once and its delivery log has no hole. A
    folded final round (the finish's last message) makes the range that ends
    with it final.
    """

    def __init__(self) -> None:
        self.ranges: list[list[int]] = []  # [first, last] rounds, in order
        self.folded: dict[int, tuple[int, np.ndarray]] = {}  # part -> (offset, summed values)
        self.like: Partial | None = None  # a folded message (kind, sender, p)
        self.final_round: int | None = None
        self.highest_round = -1

    def __len__(self) -> int:
        """Messages it will give back (one per range of rounds)."""
        return len(self.ranges)

    def fold(self, message: Partial) -> None:
        """Add `message` (an ako gradient partition, or a zero-length final marker)."""
        round_ = message.round  # a folded message (a catch-up's skip) covers a range
        self.highest_round = max(self.highest_round, round_)
        if self.ranges and message.rounds_from == self.ranges[-1][1] + 1:
            self.ranges[-1][1] = round_
        else:
            self.ranges.append([message.rounds_from, round_])
        if message.final:
            self.final_round = round_
        if self.like is None:
            self.like = message
        if message.values is None or not message.length:
            return
        held = self.folded.get(message.part)
        if held is None:
            self.folded[message.part] = (message.offset,
                                         np.array(message.values, np.float32, copy=True))
        else:
            held[1][:] += message.values

    def oldest_round(self) -> int | None:
        return self.ranges[0][0] if self.ranges else None

    def take(self) -> Partial:
        """The oldest range of folded rounds as one message to send now."""
        first, last = self.ranges.pop(0)
        like = self.like
        assert like is not None
        offset, values = 0, np.zeros(0, np.float32)
        if self.folded:
            offset = min(start for start, _ in self.folded.values())
            stop = max(start + sum_.size for start, sum_ in self.folded.values())
            values = np.zeros(stop - offset, np.float32)
            for start, sum_ in self.folded.values():
                values[start - offset:start - offset + sum_.size] = sum_
            self.folded.clear()
        if not self.ranges:
            self.like = None
        return Partial(like.kind, like.sender, last, 0, like.p, offset, values.size, values,
                       final=last == self.final_round, first_round=first)

    def clear(self) -> None:
        self.ranges = []
        self.folded.clear()
        self.like = None
        self.final_round = None
