"""What this rank can do to recover, as one object its role hands out.

The runtime never checks the scheme or its node's class to recover: it asks
the role's `recovery` (akorun.runtime.roles), one of

- `NoRecovery`, for a scheme whose nodes are not recoverable (ps,
  all-reduce, wagma, diloco): ``--resume`` is refused, there is no rejoin
  snapshot to donate, a checkpoint holds the parameters and the round, no
  round is skipped to catch up, no relay keeps partials, and a rank its
  peers gave up on stops;
- `RejoinRecovery`, for a scheme that says it is rejoinable
  (`Scheme.rejoinable`) and whose node is recoverable
  (`SchemeNode.recovery`, akocore.schemes.recovery): checkpoints of its whole
  state, ``--resume`` (akorun.runtime.recovery.rejoin: a donor's snapshot, or the
  checkpoint alone), rejoin snapshots for a restarted peer, the relay of a
  lost peer's partials (akorun.runtime.recovery.relay works on `node()`), catch-up by
  skipping rounds, and the peers taking back a rank they gave up on.

A new scheme whose node implements akocore.schemes.recovery.Recoverable and
that says `rejoinable` gets all of that without a change here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from akocore.messages import Send
from akocore.schemes import Recoverable, SchemeNode
from akocore.schemes.registry import registered
from akorun.errors import RunError, UsageError
from akorun.runtime.node_plan import params_digest
from akorun.runtime.records.checkpoint_file import Checkpoint
from akorun.transport.control import ControlError


class RankRecovery:
    """What the runtime asks to recover a rank; these answers are a rank's that cannot
    be recovered (`NoRecovery`), `RejoinRecovery` overrides them."""

    def __init__(self, rank: int, scheme: str, node: Callable[[], SchemeNode | None]) -> None:
        self.rank = rank
        self.scheme = scheme  # the run's scheme name, for messages
        self._node = node  # the role's node, None before it is built

    def node(self) -> Recoverable | None:
        """The node to checkpoint, rejoin, donate and relay with; None here."""
        return None

    def check_resume(self) -> None:
        """UsageError unless ``--resume`` can rejoin this run."""
        raise UsageError(f"--resume rejoins {rejoinable_schemes()} runs only; this run's "
                         f"scheme is {self.scheme!r}")

    def donor(self) -> Recoverable:
        """The node that can give a rejoining peer a snapshot; ControlError 409 if none."""
        raise ControlError(409, f"rejoin exists for scheme {rejoinable_schemes()} only")

    def rejoiner(self) -> Recoverable:
        """The node a ``--resume`` rejoins with (only a recoverable rank gets that far)."""
        raise RunError(f"rank {self.rank} cannot rejoin: scheme {self.scheme}")

    def takes_back_given_up(self) -> bool:
        """Whether the peers take this rank back once it sends again after they gave it
        up (otherwise they went on, or stopped, without it)."""
        return False

    def catch_up_round(self, round_: int) -> int:
        """The round to skip to before `round_` (every peer far past it); `round_` here."""
        return round_

    def skip_rounds(self, to_round: int) -> list[Send]:
        """Pass the rounds up to `to_round` without a gradient: what tells the peers."""
        return []

    def checkpoint(self, common: dict[str, Any]) -> Checkpoint | None:
        """What a checkpoint of this rank holds now (None before the node has data)."""
        node = self._node()
        if node is None or node.params is None:
            return None
        return Checkpoint(next_round=node.next_round, params=node.params.copy(), **common)

    def status_extras(self, digest: bool) -> dict[str, Any]:
        """What /status adds for this rank (the parameters' digest, if asked)."""
        node = self._node()
        if digest and node is not None and node.params is not None:
            return {"params_sha256": params_digest(node.params)}
        return {}

    def held_through(self) -> dict[str, int]:
        """Per peer, the round through which every round of it is held (a result's
        ``held_through``); empty without a delivery record."""
        return {}


class NoRecovery(RankRecovery):
    """A rank whose node cannot be recovered: every answer says so."""


class RejoinRecovery(RankRecovery):
    """A rank whose node is recoverable: it checkpoints whole, rejoins, donates, relays
    and catches up (see the module docstring)."""

    def node(self) -> Recoverable | None:
        node = self._node()
        return node.recovery() if node is not None else None

    def check_resume(self) -> None:
        return None

    def donor(self) -> Recoverable:
        node = self.node()
        if node is None:
            return super().donor()
        return node

    def rejoiner(self) -> Recoverable:
        node = self.node()
        assert node is not None, "the node is built before the rejoin uses it"
        return node

    def takes_back_given_up(self) -> bool:
        return self.node() is not None

    def catch_up_round(self, round_: int) -> int:
        node = self.node()
        return node.catch_up_round(round_) if node is not None else round_

    def skip_rounds(self, to_round: int) -> list[Send]:
        node = self.node()
        return node.skip_rounds(to_round) if node is not None else []

    def checkpoint(self, common: dict[str, Any]) -> Checkpoint | None:
        node = self.node()
        if node is None or node.replica.params is None:
            return None
        state = node.state()
        assert state.params is not None
        return Checkpoint(next_round=state.next_round, params=state.params,
                          unsent=state.unsent, inbox=state.inbox, log=state.log,
                          final_round=state.final_round, **common)

    def status_extras(self, digest: bool) -> dict[str, Any]:
        node = self.node()
        if node is None:
            return {}
        extras: dict[str, Any] = {"contiguous": self.held_through()}
        params = node.replica.params
        if digest and params is not None:
            extras["params_sha256"] = params_digest(params)
            if node.inbox is not None:
                extras["inbox_sha256"] = params_digest(node.inbox)
                extras["unsent_sha256"] = params_digest(node.unsent) \
                    if node.unsent is not None else None
        return extras

    def held_through(self) -> dict[str, int]:
        node = self.node()
        if node is None:
            return {}
        return {str(j): int(node.log.contiguous[j]) for j in node.peers}


def rejoinable_schemes() -> str:
    """The schemes a rank can rejoin, as words ("ako", "ako or x")."""
    return " or ".join(name for name, scheme in registered().items() if scheme.rejoinable)


def recovery_for(rank: int, scheme: str, rejoinable: bool,
                 node: Callable[[], SchemeNode | None]) -> RankRecovery:
    """The recovery of a rank of a scheme that is `rejoinable` or not."""
    return (RejoinRecovery if rejoinable else NoRecovery)(rank, scheme, node)
