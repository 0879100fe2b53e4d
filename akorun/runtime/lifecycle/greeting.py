"""The retrying calls of a handshake (join, rejoin): one greeting, the retry loop, and
how a refusal that is not authenticated is judged.

`greet` makes one control call and returns the peer's answer, None to try again,
or RunError when the peer itself refused us for good: a 400/401/409 whose answer
carries the tag bound to our request (akorun.transport.answers, as on the data
path). An untagged or badly tagged refusal is what anyone on the path can forge:
`Unverified` logs it once per peer and status ("not authenticated, retrying"),
backs the next greeting off (doubling up to `UNVERIFIED_RETRY_MAX_S`), and
remembers it, so that a handshake ending at its timeout can name the likely
cause (only untagged 401s: the peer's secret, run id or key file differs;
a failed TLS handshake: the certificate it names; akorun.runtime.lifecycle.join).
`until` repeats a greeting every `RETRY_S` until it answers or a deadline passes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from akorun.errors import RunError
from akorun.transport.client import ControlClient
from akorun.transport.control import ControlKind

log = logging.getLogger("akorun")

GREET_TIMEOUT_S = 5.0
RETRY_S = 0.2
UNVERIFIED_RETRY_MAX_S = 1.0  # greeting a peer that refuses us untagged: at most this pause


@dataclass
class Unverified:
    """The refusals of one handshake that carried no tag bound to our request: never
    final (anyone on the path can forge them), logged once per peer and status, and
    remembered so that a handshake that times out can name the likely cause."""

    what: str  # "hello", "rejoin"
    timeout_s: float  # how long the handshake retries
    statuses: dict[int, set[int]] = field(default_factory=dict)  # peer -> statuses seen
    counts: dict[int, int] = field(default_factory=dict)  # peer -> untagged refusals so far
    tls_errors: dict[int, str] = field(default_factory=dict)  # peer -> its last TLS failure

    def note_tls(self, peer: int, error: str) -> None:
        """The TLS handshake with `peer` failed (its certificate is not one we trust: a
        man in the middle, or another run's certificate): logged once per peer, kept for
        the handshake's timeout line."""
        self.counts[peer] = self.counts.get(peer, 0) + 1
        if peer not in self.tls_errors:
            log.warning("rank %d: %s; retrying until the timeout %g s (is a proxy or "
                        "another certificate on the path?)", peer, error[:300],
                        self.timeout_s)
        self.tls_errors[peer] = error[:300]

    def note(self, peer: int, status: int, error: str) -> None:
        self.counts[peer] = self.counts.get(peer, 0) + 1
        seen = self.statuses.setdefault(peer, set())
        if status in seen:
            return
        seen.add(status)
        hint = (": if this lasts, its cluster secret, run id or key file differs from ours"
                if status == 401 else "")
        log.warning("rank %d refused our %s with %d (%s), not authenticated, retrying until "
                    "the timeout %g s%s", peer, self.what, status,
                    error[:120] or "no reason", self.timeout_s, hint)

    def tls_failures(self, peers: list[int]) -> str | None:
        """The line that ends a handshake whose `peers` never answered because TLS with
        them failed; None when none of them did."""
        failed = [j for j in peers if j in self.tls_errors]
        if not failed:
            return None
        why = "; ".join(f"rank {j}: {self.tls_errors[j]}" for j in failed)
        return (f"no {self.what} answer within {self.timeout_s:g} s: the TLS handshake "
                f"failed ({why}); the certificate presented is not the run's (--tls-ca): "
                f"a man in the middle, or a rank started with another certificate")

    def backoff_s(self, peer: int) -> float:
        """How much longer than RETRY_S to wait before greeting `peer` again: doubling
        from 0 up to a pause of UNVERIFIED_RETRY_MAX_S, so that a peer of other keys is
        not asked five times a second for the whole join timeout."""
        count = self.counts.get(peer, 0)
        if count < 2:
            return 0.0
        return min(UNVERIFIED_RETRY_MAX_S, RETRY_S * 2 ** min(count - 1, 8)) - RETRY_S

    def keys_differ(self, peer: int) -> bool:
        """`peer` refused us with untagged 401s: likely its keys differ from ours."""
        return 401 in self.statuses.get(peer, set())


async def greet(control: ControlClient, peer: int, kind: ControlKind, payload: dict[str, Any],
                what: str, unverified: Unverified | None = None) -> dict[str, Any] | None:
    """One control call of a handshake: the answer, None to try again, or RunError
    when the peer refuses us for good (a 400/401/409 tagged for our request; an
    untagged one is noted in `unverified` and tried again, see the module docstring)."""
    answer = await control.call(peer, kind, payload, timeout_s=GREET_TIMEOUT_S)
    if answer.ok:
        return answer.payload
    if answer.tls and unverified is not None:
        unverified.note_tls(peer, answer.error)
        await asyncio.sleep(unverified.backoff_s(peer))
        return None
    if answer.status in (400, 401, 409):
        if answer.authentic:
            raise RunError(f"rank {peer} refused our {what} ({answer.status}): "
                           f"{answer.error}")
        if unverified is not None:
            unverified.note(peer, answer.status, answer.error)
            await asyncio.sleep(unverified.backoff_s(peer))
    return None


async def until(deadline_s: float,
                attempt: Callable[[], Awaitable[dict[str, Any] | None]]) -> dict[str, Any] | None:
    """`attempt()` every RETRY_S until it answers or the loop time passes `deadline_s`."""
    loop = asyncio.get_running_loop()
    while True:
        result = await attempt()
        if result is not None or loop.time() > deadline_s:
            return result
        await asyncio.sleep(RETRY_S)
