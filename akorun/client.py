"""Signed control requests to peers, over the process's one aiohttp ClientSession.

This module owns the client side of akorun.control: `ControlClient.call`
signs a JSON body (with the rank's `Signer`, akorun.keys), POSTs it to the
path of its `ControlKind`, checks the answer's signature and returns a
`ControlAnswer`. It never raises on network trouble:
an unreachable peer is an answer with status 0, so callers decide whether to
retry (hello, restart) or give up (done, heartbeat). `make_session` builds the
one session a process uses: explicit timeouts (never aiohttp's 300 s
default), `limit_per_host=3` (two partials in flight plus one control request).
"""

from __future__ import annotations

import logging
import ssl
from dataclasses import dataclass
from typing import Any

import aiohttp

from akorun import control
from akorun.control import ControlKind
from akorun.keys import Signer

log = logging.getLogger("akorun")

CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 120.0


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

    async def call(self, rank: int, kind: ControlKind, payload: dict[str, Any], *,
                   timeout_s: float = 10.0, binary: bool = False) -> ControlAnswer:
        path = kind.path
        body = control.dumps(payload)
        headers = {control.SIGNATURE_HEADER: self.signer.sign_request(path, body),
                   "Content-Type": "application/json"}
        try:
            async with self.session.post(
                self.base_urls[rank] + path, data=body, headers=headers,
                timeout=aiohttp.ClientTimeout(total=timeout_s, sock_connect=CONNECT_TIMEOUT_S),
                ssl=self.ssl_context if self.ssl_context is not None else True,
            ) as response:
                answer = await response.read()
                status = response.status
                given = response.headers.get(control.SIGNATURE_HEADER)
        except (aiohttp.ClientError, TimeoutError, OSError) as error:
            return ControlAnswer(0, error=f"{type(error).__name__}: {error}")
        if status != 200:
            return ControlAnswer(status, body=answer,
                                 error=answer[:300].decode("utf-8", "replace").strip())
        if not self.signer.answer_is_signed(path, answer, given):
            log.error("rank %d answered %s with a missing or wrong signature: ignored", rank,
                      path)
            return ControlAnswer(401, error="answer not signed with the run's secret")
        if binary:
            return ControlAnswer(200, body=answer)
        try:
            return ControlAnswer(200, payload=control.loads(answer))
        except (ValueError, UnicodeDecodeError) as error:
            return ControlAnswer(400, error=f"answer is not a JSON object: {error}")
