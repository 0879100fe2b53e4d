"""The phase of one rank's run as a state machine: its phases and the allowed moves.

starting -> running (join) or rejoining (``--resume``); rejoining -> running;
running -> finishing (training over) -> done. Any other move raises
`IllegalTransition`: a bug, never a user mistake. The phase's value is the
"state" that /status, heartbeats and progress lines show.
"""

from __future__ import annotations

from enum import StrEnum


class Phase(StrEnum):
    STARTING = "starting"
    REJOINING = "rejoining"
    RUNNING = "running"
    FINISHING = "finishing"
    DONE = "done"


ALLOWED: dict[Phase, frozenset[Phase]] = {
    Phase.STARTING: frozenset({Phase.RUNNING, Phase.REJOINING}),
    Phase.REJOINING: frozenset({Phase.RUNNING}),
    Phase.RUNNING: frozenset({Phase.FINISHING}),
    Phase.FINISHING: frozenset({Phase.DONE}),
    Phase.DONE: frozenset(),
}


class IllegalTransition(RuntimeError):
    """A move the state machine does not allow."""


class PhaseMachine:
    """The current phase and the only way to change it."""

    def __init__(self) -> None:
        self.current = Phase.STARTING

    def to(self, phase: Phase) -> None:
        if phase not in ALLOWED[self.current]:
            raise IllegalTransition(f"phase {self.current.value} -> {phase.value} is not allowed")
        self.current = phase

    def is_(self, *phases: Phase) -> bool:
        return self.current in phases

    @property
    def name(self) -> str:
        return self.current.value
