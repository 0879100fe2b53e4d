"""The messages and effects that cross the border between schemes and shells.

A scheme (akocore.schemes) never sends anything itself: it returns `Send`
effects holding a `Partial`, and the shell (akosim's simulated network or
akorun's HTTP client) delivers the `Partial` to the destination node's
scheme. In timing-only simulation `values` is None and only `length` counts.

A run's codec (akocore.codecs) is put on a scheme's sends by one hook
(akocore.codecs.exchange): a coded `Partial` names its `codec`, carries the
encoded `payload` and, as `values`, what every receiver decodes from it; its
`nbytes` is the codec's exact encoded size. `CODED_KINDS` are the kinds the
hook codes (gradient-like contributions, never parameters).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import numpy as np

from akocore.codecs.codec_registry import codec_named  # codecs' own modules never import this one

FLOAT_BYTES = 4  # parameters and gradients travel as little-endian float32


class Kind(IntEnum):
    """What a partial carries; the wire encodes it as one byte."""

    GRAD = 1  # ako: a partition of a sender's unsent gradient
    PUSH = 2  # ps: a worker's gradient shard sent to a server
    PARAMS = 3  # ps: a server's parameter shard sent to a worker
    PULL = 4  # ps async: a worker asks a server for its shard (no values)
    REDUCE = 5  # allreduce: a reduce-scatter step of the ring
    GATHER = 6  # allreduce: an all-gather step of the ring
    MODEL = 7  # wagma, elastic: a replica's parameters sent for model averaging
    ELASTIC = 8  # elastic: the centre's elastic difference sent back to a worker
    PSEUDO = 9  # diloco: a fragment (or a chunk) of a worker's pseudo-gradient
    PSEUDO_MEAN = 10  # diloco all-reduce: an owner's mean of one chunk of the pseudo-gradients


# what a codec may carry, with error feedback: contributions a sender produced
# (gradients, pushes, reduce-scatter sums, pseudo-gradients), never parameters or
# averaged models
CODED_KINDS = frozenset({Kind.GRAD, Kind.PUSH, Kind.REDUCE, Kind.PSEUDO})


@dataclass(frozen=True, slots=True)
class Partial:
    """A contiguous piece [offset, offset+length) of a flat vector, in flight.

    `(sender, round, part)` identifies a message: a receiver that sees the same
    key twice drops the second copy. `part` is the partition index for ako,
    the shard index for ps and the ring step for allreduce. `final` marks the
    last message a sender will ever send to this receiver. `codec` names the
    codec of `payload` ("none": the values travel as float32, no payload).

    A *folded* message (`first_round` set, ako only) carries the sum of the
    sender's rounds `first_round` .. `round` to one receiver at once: what a
    sender owed a peer that was away (suspended, cut off, paused) goes back as
    one message instead of one per round. Its `part` is 0 and it spans the
    whole flat vector (or nothing: a zero-length folded message only records
    its rounds). The receiver records every round of the range as delivered
    (akocore.ssp.DeliveryLog.record_range).
    """

    kind: Kind
    sender: int
    round: int
    part: int
    p: int
    offset: int
    length: int
    values: np.ndarray | None = None
    final: bool = False
    codec: str = "none"
    payload: bytes | None = None
    first_round: int | None = None  # folded: the first of the rounds summed in here

    @property
    def folded(self) -> bool:
        return self.first_round is not None

    @property
    def rounds_from(self) -> int:
        """The first round this message covers (`round` unless folded)."""
        return self.round if self.first_round is None else self.first_round

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.sender, self.round, self.part)

    @property
    def nbytes(self) -> int:
        """Bytes of the body on the wire: float32 values, or the codec's payload."""
        if self.codec == "none":
            return self.length * FLOAT_BYTES
        return codec_named(self.codec).encoded_bytes(self.length)


@dataclass(frozen=True, slots=True)
class Send:
    """Effect: deliver the same `message` to every node in `dests`.

    One effect per multicast (an ako round sends one partition to all peers),
    so a shell can share the bytes and a simulator can start all flows at once.
    """

    dests: tuple[int, ...]
    message: Partial


@dataclass(frozen=True, slots=True)
class Receipt:
    """What a node did with a received partial."""

    accepted: bool  # False: a duplicate, acknowledged and dropped
    effects: tuple[Send, ...] = ()
