"""The one table of control messages: kind -> path and handler, used by the server and the host.

A `ControlTable` holds exactly one handler for every `ControlKind` (it refuses
to be built with one missing), checks who is speaking (the sender the request's
seal authenticated; a ``rank`` in the payload must be that same rank) and calls
the handler with that sender. The server
registers one POST route per entry (`ControlTable.routes`), so adding a control
message is one `ControlKind` member and one entry in the table the host builds.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from akorun.transport.control import ControlError, ControlKind

ControlAnswerBody = dict[str, Any] | bytes
ControlHandler = Callable[[int, dict[str, Any]], Awaitable[ControlAnswerBody]]


@dataclass(frozen=True)
class Route:
    """One control message: its kind, its path and who answers it."""

    kind: ControlKind
    handler: ControlHandler

    @property
    def path(self) -> str:
        return self.kind.path


class ControlTable:
    """Routes signed control requests of a rank's peers to their handlers."""

    def __init__(self, handlers: Mapping[ControlKind, ControlHandler], *, rank: int,
                 world: int) -> None:
        missing = [kind.value for kind in ControlKind if kind not in handlers]
        if missing:
            raise ValueError(f"control messages without a handler: {', '.join(missing)}")
        self.rank = rank
        self.world = world
        self.routes = tuple(Route(kind, handlers[kind]) for kind in ControlKind)
        self._by_kind = {route.kind: route for route in self.routes}

    def sender_of(self, payload: dict[str, Any], sealed_by: int | None = None) -> int:
        """The peer rank speaking; ControlError 400 for no peer rank, 401 when the payload
        names another rank than the one whose seal the request carries (`sealed_by`)."""
        sender = payload.get("rank") if sealed_by is None else payload.get("rank", sealed_by)
        if not isinstance(sender, int) or isinstance(sender, bool) or sender == self.rank \
                or not 0 <= sender < self.world:
            raise ControlError(400, f"rank: got {sender!r}, expected a peer rank "
                                    f"0..{self.world - 1} other than {self.rank}")
        if sealed_by is not None and sender != sealed_by:
            raise ControlError(401, f"rank: the payload says {sender} but the request was "
                                    f"sealed by rank {sealed_by}")
        return sender

    async def dispatch(self, kind: ControlKind, payload: dict[str, Any],
                       sealed_by: int | None = None) -> ControlAnswerBody:
        """The answer of `kind`'s handler (ControlError when the sender or the handler refuses).

        The server always passes `sealed_by`, the sender its seal authenticated."""
        sender = self.sender_of(payload, sealed_by)
        return await self._by_kind[kind].handler(sender, payload)
