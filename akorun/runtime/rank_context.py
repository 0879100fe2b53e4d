"""A rank's context and its event hub: what every collaborator of one rank shares.

`RankContext` is frozen and built once by the composition root (akorun.runtime.worker):
who this rank is (rank, peers, role, run id, config hash), its settings (timeouts,
checkpoint and out directories), its phase machine, metrics, clock, and how it starts a
background task (`spawn`: the task is cancelled when the rank ends). A collaborator
takes the context plus the few ports it talks to (the Waiter, Liveness, the Outbox, ...)
instead of a dozen loose arguments.

`RankEvents` is the hub for what happens to the rank that others react to: a wake of
the waits, a peer lost, a peer's suspension changed, a peer stuck, this rank given up by
its peers. The one who notices emits; the ones who care subscribe when the rank is
wired, so nobody is handed a lambda or has an attribute set after construction.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, ParamSpec

if TYPE_CHECKING:
    from akocore.settings.schema import RunConfig
    from akorun.metrics import Metrics
    from akorun.runtime.lifecycle.phase import PhaseMachine
    from akorun.runtime.roles import Role

__all__ = ["Event", "RankContext", "RankEvents", "loop_time"]

P = ParamSpec("P")


class Event(Generic[P]):
    """One kind of event: handlers subscribed in order, each called on every emit."""

    def __init__(self) -> None:
        self._handlers: list[Callable[P, object]] = []

    def subscribe(self, handler: Callable[P, object]) -> None:
        self._handlers.append(handler)

    def emit(self, *args: P.args, **kwargs: P.kwargs) -> None:
        for handler in self._handlers:
            handler(*args, **kwargs)


class RankEvents:
    """The events of one rank (the hub); each is an `Event` to subscribe to and emit."""

    def __init__(self) -> None:
        self.wake: Event[[]] = Event()  # something changed: the waits look again
        self.peer_lost: Event[[int]] = Event()  # suspended: repair what it left (relay)
        self.peer_changed: Event[[int]] = Event()  # suspended or back: its sender reconnects
        self.peer_stuck: Event[[int, str]] = Event()  # given up for making no progress
        self.given_up_here: Event[[str]] = Event()  # this rank was given up by its peers


def loop_time() -> float:
    """The running event loop's clock (seconds)."""
    return asyncio.get_running_loop().time()


@dataclass(frozen=True)
class RankContext:
    """Who this rank is, its settings and shared services; built once, never changed."""

    rank: int
    peers: tuple[int, ...]
    role: Role
    phase: PhaseMachine
    metrics: Metrics
    spawn: Callable[[Coroutine[Any, Any, Any]], None]
    events: RankEvents = field(default_factory=RankEvents)
    clock: Callable[[], float] = loop_time
    hosts: tuple[str, ...] = ()  # every rank's host:port (cluster.hosts)
    run_id: str = ""
    config_hash: str = ""
    peer_timeout_s: float = math.inf  # a peer silent this long is suspended
    join_timeout_s: float = math.inf
    grace_s: float = 0.0  # the finish's wait for the last messages
    checkpoint_every: int = 0
    checkpoint_dir: Path | None = None
    out_dir: Path | None = None
    wall_start_s: float = 0.0  # perf_counter when the process began (the result says)

    @property
    def cfg(self) -> RunConfig:
        return self.role.cfg
