"""A stand-in for one rank of a live run: speaks to real workers as a peer (or attacker) would.

`Peer` holds one rank's keys (derived from the cluster secret, as a member
would) and a nonce (its own, i.e. a new instance of that rank, or the live
rank's, learnt by discovering that rank: then it speaks in the live rank's
sessions without replacing it), discovers a worker's nonce with a discovery
hello, seals partials and control messages for the worker's current session,
and records every request
exactly as it went (`Sent`), so that a test can send the same bytes again
later (`replay`): to the same instance, to a restarted one, or to a later run
started from the same cluster file.
"""

from __future__ import annotations

import http.client
import itertools
import json
from dataclasses import dataclass
from urllib.parse import urlsplit

from akorun.transport import control
from akorun.transport.control import ControlKind
from akorun.transport.keys import (
    AUTH_HEADER,
    PARTIAL_PATH,
    SESSION_PATH,
    RankKeys,
    RunKeys,
    Signer,
    digest,
)


@dataclass(frozen=True)
class Sent:
    """One request as it went on the wire, and what came back."""

    url: str
    path: str
    body: bytes
    headers: dict[str, str]
    status: int
    answer: bytes
    answer_headers: dict[str, str]


def post(url: str, path: str, body: bytes, headers: dict[str, str],
         timeout_s: float = 10.0) -> tuple[int, bytes, dict[str, str]]:
    """One POST of exactly these bytes and headers (status, body, headers)."""
    where = urlsplit(url)
    connection = http.client.HTTPConnection(where.hostname, where.port, timeout=timeout_s)
    try:
        connection.request("POST", path, body=body,
                           headers={"Content-Type": "application/octet-stream", **headers})
        response = connection.getresponse()
        return response.status, response.read(), dict(response.getheaders())
    finally:
        connection.close()


def replay(sent: Sent, url: str | None = None) -> int:
    """Send a recorded request again, byte for byte (to `url`, default its own); the status."""
    return post(url or sent.url, sent.path, sent.body, sent.headers)[0]


class Peer:
    """Rank `rank` of a run, as far as sealing goes, talking to workers at `urls`."""

    def __init__(self, secret: bytes, run_id: bytes, rank: int, urls: list[str], *,
                 nonce: bytes | None = None) -> None:
        self._start(RankKeys.from_secret(secret, run_id, rank, len(urls)), urls, nonce)

    @classmethod
    def from_keys(cls, keys: RankKeys, urls: list[str]) -> Peer:
        """A peer holding exactly `keys` (a rank key file's row, or a forger's guess)."""
        peer = cls.__new__(cls)
        peer._start(keys, urls, None)
        return peer

    def _start(self, keys: RankKeys, urls: list[str], nonce: bytes | None) -> None:
        self.rank = keys.rank
        self.urls = urls
        self.keys = RunKeys(keys)
        if nonce is not None:
            self.keys.sessions.nonce = nonce
        self.signer = Signer(self.keys)

    def count_from(self, first: int) -> None:
        """Number this peer's seals from `first` on: a peer posing as a live rank's
        instance keeps clear of the counters that rank itself uses meanwhile."""
        self.keys.sessions._counter = itertools.count(first)

    def discover(self, dest: int) -> bytes:
        """Ask `dest` for its current nonce (a discovery hello) and adopt it."""
        seal = self.signer.seal(dest, SESSION_PATH, digest(b""), discovery=True)
        status, answer, headers = post(self.urls[dest], SESSION_PATH, b"",
                                       {AUTH_HEADER: seal.text()})
        if status != 200 or not self.signer.answer_is_authentic(seal, 200, answer,
                                                               headers.get(AUTH_HEADER)):
            raise AssertionError(f"discovery of rank {dest} failed: {status} {answer[:200]!r}")
        nonce = bytes.fromhex(json.loads(answer)["nonce"])
        self.signer.learn(dest, nonce)
        return nonce

    def _send(self, dest: int, path: str, body: bytes, sealed: bytes) -> Sent:
        if not self.signer.knows(dest):
            self.discover(dest)
        seal = self.signer.seal(dest, path, digest(sealed))
        headers = {AUTH_HEADER: seal.text()}
        status, answer, answer_headers = post(self.urls[dest], path, body, headers)
        return Sent(self.urls[dest], path, body, headers, status, answer, answer_headers)

    def partial(self, dest: int, data: bytes) -> Sent:
        """POST an encoded partial, sealed over its header as a sender does."""
        return self._send(dest, PARTIAL_PATH, data, data[:100])

    def control(self, dest: int, kind: ControlKind, payload: dict[str, object]) -> Sent:
        body = control.dumps({"rank": self.rank, **payload})
        return self._send(dest, kind.path, body, body)
