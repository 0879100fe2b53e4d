"""What recovery asks of a scheme node: the protocols a node implements, and the data
that crosses the border.

In the spirit of torchft's CheckpointTransport, the shells recover a rank
without knowing its scheme: they ask the node for a capability and get the
node itself back as one of these protocols, or None where it has none
(`SchemeNode.delivery`, `SchemeNode.recovery`, `SchemeNode.resync`). No
module outside akocore.schemes checks a node's class
(tests/test_architecture.py).

- `DeliveryRecorded`: per peer, which of its rounds the node holds (its
  delivery record, an akocore.ssp.DeliveryLog), gated by an SSP bound. What a
  relay compares and a result reports. In timing-only mode an accepted,
  in-order, non-final message only records its round in `log`, so akosim's
  multicast fast path may record it in many nodes' rows at once.
- `Recoverable`: a DeliveryRecorded node whose whole state can be taken out
  and put back (`state`/`load_state`: checkpoints, ``--resume`` alone), that
  can hand a rejoining peer a snapshot and adopt one (`rejoin_snapshot`,
  `adopt`), take back a restarted peer (`peer_restarted`), and catch up by
  skipping rounds every peer is past (`catch_up_round`, `skip_rounds`).
- `Resyncable`: a node whose replicas agree on a state at each sync and that
  can take a live peer's (diloco's anchor and outer optimizer state).

`RecoveryState` and `RejoinSnapshot` are the plain data a checkpoint or a
rejoining peer takes; `DeliveryRecord` a delivery log as exported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from akocore.messages import Partial, Send
from akocore.schemes.base import Replica
from akocore.ssp import DeliveryLog

# per peer: (the round through which every round is held, {later round: parts held})
DeliveryRecord = dict[int, tuple[int, dict[int, list[int]]]]


@dataclass(frozen=True)
class RecoveryState:
    """Everything a recoverable node holds, for checkpoints (optimizer state aside):
    its parameters, what it applied but has not sent (`unsent`), what it received but
    has not applied (`inbox`), its delivery record and its peers' known final rounds."""

    rank: int
    next_round: int
    params: np.ndarray | None
    unsent: np.ndarray | None
    inbox: np.ndarray | None
    log: DeliveryRecord
    final_round: dict[int, int]


@dataclass(frozen=True)
class RejoinSnapshot:
    """What a live node hands a restarted peer so that it rejoins exactly.

    The joiner takes the donor's parameters, the donor's record of what it has
    received (so the joiner drops those messages as duplicates) and, for the
    donor's own messages, "everything up to the donor's last round". What the
    donor has received but not applied (inbox) is owed to the joiner's next
    step; what the donor has applied but not yet sent (unsent) will reach the
    joiner again in the donor's later rounds, so it is subtracted now:
    correction = inbox - unsent (and, with a codec, minus the donor's
    error-feedback residual, owed the same way). With plain SGD the joiner then
    ends exactly equal to its peers; what the dead worker never sent is lost
    for everyone.
    """

    donor: int
    params: np.ndarray
    correction: np.ndarray
    log: DeliveryRecord


class DeliveryRecorded(Protocol):
    """A node that records, per peer, which of its rounds it holds (see the module
    docstring for what its timing-only receive promises)."""

    rank: int
    length: int
    replica: Replica
    peers: tuple[int, ...]
    p_of: tuple[int, ...]  # each rank's p: its messages are partitions of p parts
    staleness: float  # the SSP bound s it gates with
    log: DeliveryLog
    suspended: set[int]
    final_round: dict[int, int]  # peer -> its final round, once known

    def validate(self, msg: Partial) -> None:
        """SchemeError for a message no correct peer sends (receive checks it too)."""
        ...


class Recoverable(DeliveryRecorded, Protocol):
    """A DeliveryRecorded node that can be checkpointed whole, rejoin and donate, take
    back a restarted peer and catch up (see the module docstring)."""

    next_round: int
    finished: bool
    inbox: np.ndarray | None  # received, not yet applied (a relay adds differences here)
    unsent: np.ndarray | None  # applied here, not yet sent

    def state(self) -> RecoveryState: ...

    def load_state(self, state: RecoveryState) -> None:
        """SchemeError when `state` does not fit this node."""
        ...

    def rejoin_snapshot(self, joiner: int) -> RejoinSnapshot: ...

    def adopt(self, snapshot: RejoinSnapshot, first_round: int) -> None:
        """Become consistent with a donor; number own rounds from `first_round`."""
        ...

    def peer_restarted(self, peer: int, first_round: int) -> None: ...

    def suspend_peer(self, peer: int) -> None: ...

    def catch_up_round(self, round_: int) -> int:
        """The round to skip to before `round_` (every peer far ahead), else `round_`."""
        ...

    def skip_rounds(self, to_round: int) -> list[Send]:
        """Rounds next_round .. to_round - 1 pass without a gradient: what tells the peers."""
        ...


class Resyncable(Protocol):
    """A node whose replicas agree on a state at each sync (`anchor`, `outer_state`
    after `syncs_done` syncs) and that can take a live peer's (`adopt_agreed`)."""

    anchor: np.ndarray | None
    outer_state: list[Any]
    syncs_done: int
    view_changes: int  # suspensions and returns seen: a re-sync may be due
    fragments: int
    suspended: set[int]

    def adopt_agreed(self, syncs: int, anchor: np.ndarray,
                     outer_state: list[np.ndarray | None]) -> None:
        """SchemeError when the peer's state is of another sync or shape."""
        ...
