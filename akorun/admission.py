"""Which incoming partial may take a read slot on the server, and how many are read at once.

This module owns the server's admission: before any body byte is read, a
partial is refused with 503 while the host is not ready (starting,
rejoining), 400 without a usable Content-Length, and 503 ``inbox_full`` when
`max_concurrent_reads` bodies are being read already. Body memory is thus
bounded by max_concurrent_reads x the body cap. Limits per source or per
claimed sender, and header deadlines, belong here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from akorun.wire import HEADER_SIZE


@dataclass(frozen=True)
class Refusal:
    """An HTTP answer instead of reading the body: status, reason (a metrics label), detail."""

    status: int
    reason: str
    detail: str


class Admission:
    """Read slots of one server and the checks a request passes before it takes one."""

    def __init__(self, not_accepting: Callable[[], str | None], *,
                 max_concurrent_reads: int) -> None:
        self.not_accepting = not_accepting
        self.max_concurrent_reads = max(1, max_concurrent_reads)
        self.active_reads = 0

    def refusal(self, content_length: int | None) -> Refusal | None:
        """Why this request may not take a read slot now, or None."""
        not_ready = self.not_accepting()
        if not_ready is not None:
            return Refusal(503, "not_ready", not_ready)
        if content_length is None:
            return Refusal(400, "malformed", "Content-Length is required")
        if content_length < HEADER_SIZE:
            return Refusal(400, "malformed", f"body of {content_length} bytes is shorter "
                                             f"than the {HEADER_SIZE}-byte header")
        if self.active_reads >= self.max_concurrent_reads:
            return Refusal(503, "inbox_full", f"{self.active_reads} bodies being read")
        return None

    @contextmanager
    def slot(self) -> Iterator[None]:
        """Hold one read slot while the body is read and handled."""
        self.active_reads += 1
        try:
            yield
        finally:
            self.active_reads -= 1
