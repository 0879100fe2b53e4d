"""What an incoming partial may hold on the server, for how long, and the buffers it reads into.

This module owns the server's capacity. Nothing unauthenticated holds any of
it: a request's seal (akorun.keys) is checked from its HTTP header before a
read slot, a buffer or a body byte is taken. In order, a partial is refused

- with 503 while the host is not ready (starting, rejoining) and 400 without
  a usable Content-Length (`refusal`), before its seal is even looked at;
- 401/421 by its seal (the server, with akorun.transport.keys);
- 503 ``inbox_full`` when `max_concurrent_reads` bodies are being read, or
  when its authenticated sender already holds `max_reads_per_sender` slots
  (`slot_refusal`), so one member cannot take every slot either;
- 503 ``too_slow`` when its 100-byte wire header does not arrive within
  `header_deadline_s`, or its body slower than `min_body_rate_bps` (after a
  grace of `body_grace_s`): `body_deadline_s`.

Body memory is bounded by max_concurrent_reads x the body cap; bodies are read
into buffers from a `BufferPool`, reused once nothing refers to them any more
(so a received message costs no fresh allocation and no page faults).
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from akorun.transport.keys import Opened, RequestVerifier
from akorun.transport.wire import HEADER_SIZE, Status, WireError

HEADER_DEADLINE_S = 10.0
BODY_GRACE_S = 10.0
MIN_BODY_RATE_BPS = 8 * 64 * 1024  # 64 KiB/s: far below any link a run is worth running on
MAX_READS_PER_SENDER = 3  # a sender's window (2 POSTs in flight) and one retry


@dataclass(frozen=True)
class Refusal:
    """An HTTP answer instead of reading the body: status, reason (a metrics label), detail."""

    status: int
    reason: str
    detail: str


_REASONS = {Status.MALFORMED: "malformed", Status.BAD_SIGNATURE: "bad_signature",
            Status.WRONG_RUN: "wrong_run", Status.TOO_LARGE: "too_large",
            Status.INBOX_FULL: "inbox_full", Status.STALE_SESSION: "stale_session"}


def refusal_worth_logging(count: int, *, authenticated: bool) -> bool:
    """Whether the `count`-th refusal of one reason gets a log line: always when the
    request was authenticated (a member's mistake), else only the 1st, 2nd, 4th, 8th...
    (anyone can send unauthenticated requests; a log line each would let them flood it)."""
    return authenticated or count & (count - 1) == 0


def wire_refusal(error: WireError) -> Refusal:
    """The answer to a request refused with `error` (its status; its reason as a label)."""
    return Refusal(int(error.status), _REASONS.get(error.status, "malformed"), error.reason)


@dataclass(frozen=True)
class Admitted:
    """A partial's request at its door: its seal once open (answers are then tagged) and
    why it may not take a read slot (None: it may)."""

    opened: Opened | None
    refusal: Refusal | None


class Admission:
    """Read slots of one server and the checks a request passes before it takes one."""

    def __init__(self, not_accepting: Callable[[], str | None], *,
                 max_concurrent_reads: int,
                 max_reads_per_sender: int = MAX_READS_PER_SENDER,
                 header_deadline_s: float = HEADER_DEADLINE_S,
                 min_body_rate_bps: float = MIN_BODY_RATE_BPS,
                 body_grace_s: float = BODY_GRACE_S) -> None:
        self.not_accepting = not_accepting
        self.max_concurrent_reads = max(1, max_concurrent_reads)
        self.max_reads_per_sender = max(1, max_reads_per_sender)
        self.header_deadline_s = header_deadline_s
        self.min_body_rate_bps = min_body_rate_bps
        self.body_grace_s = body_grace_s
        self.active_reads = 0
        self.reads_by_sender: Counter[int] = Counter()

    def refusal(self, content_length: int | None) -> Refusal | None:
        """Why this request is refused before its seal is looked at, or None."""
        not_ready = self.not_accepting()
        if not_ready is not None:
            return Refusal(503, "not_ready", not_ready)
        if content_length is None:
            return Refusal(400, "malformed", "Content-Length is required")
        if content_length < HEADER_SIZE:
            return Refusal(400, "malformed", f"body of {content_length} bytes is shorter "
                                             f"than the {HEADER_SIZE}-byte header")
        return None

    def admit_partial(self, verifier: RequestVerifier, auth: str | None, path: str,
                      content_length: int | None, trust: Callable[[], None]) -> Admitted:
        """The checks before a partial's read slot, in order, on either path: not ready or
        no usable length (`refusal`), the seal (`verifier`; `trust` is called once it
        opened), then the slot (`slot_refusal`). The caller takes the slot (`slot`)."""
        refusal = self.refusal(content_length)
        if refusal is not None:
            return Admitted(None, refusal)
        try:
            opened = verifier.open(auth, path, control=False)
        except WireError as error:
            return Admitted(None, wire_refusal(error))
        trust()
        return Admitted(opened, self.slot_refusal(opened.sender))

    def slot_refusal(self, sender: int) -> Refusal | None:
        """Why the authenticated `sender` may not take a read slot now, or None."""
        if self.active_reads >= self.max_concurrent_reads:
            return Refusal(503, "inbox_full", f"{self.active_reads} bodies being read")
        if self.reads_by_sender[sender] >= self.max_reads_per_sender:
            return Refusal(503, "inbox_full", f"rank {sender} has "
                                              f"{self.reads_by_sender[sender]} bodies in flight")
        return None

    @contextmanager
    def slot(self, sender: int) -> Iterator[None]:
        """Hold one read slot of `sender` while the body is read and handled."""
        self.active_reads += 1
        self.reads_by_sender[sender] += 1
        try:
            yield
        finally:
            self.active_reads -= 1
            self.reads_by_sender[sender] -= 1

    def body_deadline_s(self, nbytes: int) -> float:
        """The longest a body of `nbytes` may take to arrive."""
        return self.body_grace_s + 8 * nbytes / self.min_body_rate_bps


class BufferPool:
    """Receive buffers (float32 arrays) kept for reuse, at most `keep` per length.

    `take` gives a buffer of a length (reused or new); `give_back` keeps it only if
    nothing else refers to it any more (a scheme node may keep a received array, as
    all-reduce's accumulator does: then the pool lets it go)."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self._free: dict[int, list[np.ndarray]] = {}
        self.reused = 0
        self.allocated = 0

    def take(self, length: int) -> np.ndarray:
        free = self._free.get(length)
        if free:
            self.reused += 1
            return free.pop()
        self.allocated += 1
        return np.empty(length, dtype=np.float32)

    def give_back(self, buffer: np.ndarray) -> None:
        # the caller's name for it, this argument and getrefcount's own: nobody else
        if sys.getrefcount(buffer) > 3 or buffer.base is not None:
            return
        free = self._free.setdefault(buffer.size, [])
        if len(free) < self.keep:
            free.append(buffer)
