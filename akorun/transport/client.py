"""Sealed control requests to peers, over the process's one aiohttp ClientSession.

This module owns the client side of akorun.transport.control: `ControlClient.call`
seals a JSON body for the peer's current session (with the rank's `Signer`,
akorun.keys), POSTs it to the path of its `ControlKind`, checks that the
answer is bound to this request and returns a `ControlAnswer`. A peer whose
current nonce is not known yet, or that answers 421 (this rank sealed for an
earlier instance of it), is first asked for its nonce with a discovery hello
(`discover`), then the request goes again, once. It never raises on network
trouble: an unreachable peer is an answer with status 0, so callers decide
whether to retry (hello, restart) or give up (done, heartbeat). Every answer's body
is bounded before it is read (akorun.transport.answers: 4 KiB for a refusal, 1 MiB for a JSON
answer, `binary_answer_cap` for a relay's partials or a snapshot) and its tag checked;
`ControlAnswer.authentic` says whether a refusal was tagged for this request. `make_session`
builds the one session a process uses: explicit timeouts (never aiohttp's 300 s
default), `limit_per_host=3` (one partial in flight per peer, akorun.transport.sender, plus
control requests and a spare for aiohttp's retry on a dead keep-alive connection).
"""

from __future__ import annotations

import logging
import ssl
from collections import Counter
from dataclasses import dataclass
from typing import Any

import aiohttp

from akorun.transport import control
from akorun.transport.admission import refusal_worth_logging
from akorun.transport.answers import (
    CONTROL_ANSWER_MAX_BYTES,
    PARTIAL_ANSWER_MAX_BYTES,
    AnswerTooLarge,
    read_bounded,
)
from akorun.transport.control import ControlKind
from akorun.transport.keys import AUTH_HEADER, SESSION_PATH, STALE_SESSION, Signer, digest

log = logging.getLogger("akorun")

CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 120.0
DEFAULT_BINARY_ANSWER_MAX_BYTES = 64 << 20  # until the worker knows its model's size


def binary_answer_cap(gradient_bytes: int) -> int:
    """The largest binary control answer a rank reads: a relay answer holds at most two
    full gradients of a lost peer (akorun.runtime.recovery.relay), a rejoin snapshot the parameters
    and one correction vector, each plus headers; four gradients and 1 MiB cover both."""
    return 4 * gradient_bytes + (1 << 20)


def make_session(*, peers: int) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(limit=max(8, 4 * peers), limit_per_host=3,
                                     keepalive_timeout=15.0, enable_cleanup_closed=True)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S,
                                    sock_read=READ_TIMEOUT_S)
    return aiohttp.ClientSession(connector=connector, timeout=timeout,
                                 auto_decompress=False, skip_auto_headers=("User-Agent",))


@dataclass(frozen=True)
class ControlAnswer:
    """What a peer said: status 0 when it could not be reached."""

    status: int
    payload: dict[str, Any] | None = None
    body: bytes = b""
    error: str = ""
    authentic: bool = False  # tagged by the peer for this request (akorun.transport.answers)
    tls: bool = False  # status 0 because the TLS handshake failed (the error says why)

    @property
    def ok(self) -> bool:
        return self.status == 200


class ControlClient:
    """Signed JSON requests to the ranks of one run."""

    def __init__(self, session: aiohttp.ClientSession, signer: Signer, base_urls: list[str], *,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self.session = session
        self.signer = signer
        self.base_urls = base_urls
        self.ssl_context = ssl_context
        # the largest binary answer read (a relay's partials, a rejoin snapshot); the
        # worker sets it from the model's size once the workload exists
        self.binary_answer_max_bytes = DEFAULT_BINARY_ANSWER_MAX_BYTES
        self.untagged_answers: Counter[int] = Counter()  # per rank, for the log's pace

    async def call(self, rank: int, kind: ControlKind, payload: dict[str, Any], *,
                   timeout_s: float = 10.0, binary: bool = False) -> ControlAnswer:
        if not self.signer.knows(rank):
            failed = await self.discover(rank, timeout_s=timeout_s)
            if failed is not None:
                return failed
        body = control.dumps(payload)
        answer = await self._post(rank, kind.path, body, timeout_s=timeout_s, binary=binary)
        if answer.status == STALE_SESSION:  # the peer restarted since we last spoke
            failed = await self.discover(rank, timeout_s=timeout_s)
            if failed is not None:
                return failed
            answer = await self._post(rank, kind.path, body, timeout_s=timeout_s,
                                      binary=binary)
        return answer

    async def discover(self, rank: int, *, timeout_s: float = 10.0) -> ControlAnswer | None:
        """Learn `rank`'s current nonce (a discovery hello); None, or the failed answer."""
        answer = await self._post(rank, SESSION_PATH, b"", timeout_s=timeout_s, binary=False,
                                  discovery=True)
        if not answer.ok:
            return answer
        assert answer.payload is not None
        try:
            nonce = bytes.fromhex(str(answer.payload.get("nonce")))
        except ValueError:
            return ControlAnswer(400, error="discovery answer without a nonce")
        if not self.signer.learn(rank, nonce):
            return ControlAnswer(401, error=f"rank {rank} answered with the nonce of an "
                                            f"earlier instance")
        return None

    async def _post(self, rank: int, path: str, body: bytes, *, timeout_s: float,
                    binary: bool, discovery: bool = False) -> ControlAnswer:
        seal = self.signer.seal(rank, path, digest(body), discovery=discovery)
        headers = {AUTH_HEADER: seal.text(), "Content-Type": "application/json"}
        try:
            async with self.session.post(
                self.base_urls[rank] + path, data=body, headers=headers,
                timeout=aiohttp.ClientTimeout(total=timeout_s, sock_connect=CONNECT_TIMEOUT_S),
                ssl=self.ssl_context if self.ssl_context is not None else True,
                allow_redirects=False,  # a redirect is an untagged answer, not a new address
            ) as response:
                status = response.status
                given = response.headers.get(AUTH_HEADER)
                cap = PARTIAL_ANSWER_MAX_BYTES if status != 200 else \
                    self.binary_answer_max_bytes if binary else CONTROL_ANSWER_MAX_BYTES
                answer = await read_bounded(response, cap)
        except AnswerTooLarge as error:
            log.warning("rank %d's answer to %s was not read: %s", rank, path, error)
            return ControlAnswer(0, error=str(error))
        except aiohttp.ClientSSLError as error:  # the certificate, or TLS itself, failed
            reason = getattr(error, "certificate_error", None) or error
            return ControlAnswer(0, error=f"TLS with {self.base_urls[rank]} failed: {reason}",
                                 tls=True)
        except (aiohttp.ClientError, TimeoutError, OSError) as error:
            return ControlAnswer(0, error=f"{type(error).__name__}: {error}")
        authentic = self.signer.answer_is_authentic(seal, status, answer, given)
        if status != 200:
            return ControlAnswer(status, body=answer, authentic=authentic,
                                 error=answer[:300].decode("utf-8", "replace").strip())
        if not authentic:
            self.untagged_answers[rank] += 1
            count = self.untagged_answers[rank]
            if refusal_worth_logging(count, authenticated=False):  # a forger sets the pace
                log.error("rank %d answered %s without a tag bound to our request: ignored "
                          "(%d such so far)", rank, path, count)
            return ControlAnswer(401, error="answer not bound to our request in this session")
        if binary:
            return ControlAnswer(200, body=answer, authentic=True)
        try:
            return ControlAnswer(200, payload=control.loads(answer), authentic=True)
        except (ValueError, UnicodeDecodeError) as error:
            return ControlAnswer(400, error=f"answer is not a JSON object: {error}")
