"""The sending end of akorun's data path: a peer's connections and one exchange on them.

This module owns talking to one peer's data path (framing in akorun.transport.datapath): a
few plain non-blocking sockets (one per request in flight, at most
`REQUESTS_PER_PEER`, kept for reuse while they are fresh); each request written as
the preamble and then the encoded message as it is (``sock_sendall`` of the
caller's bytes: no concatenation, no copy of the body); the answer read within a
bound: its tag and text are at most `akorun.transport.datapath.ANSWER_TAG_MAX_BYTES` and the
caller's cap, so a forged answer cannot make the sender read more. Whether the
answer is authentic is the caller's check (akorun.transport.sender with akorun.transport.keys),
exactly as on the HTTP path.
"""

from __future__ import annotations

import asyncio
import socket
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from akorun.transport.admission import MAX_READS_PER_SENDER
from akorun.transport.answers import AnswerTooLarge
from akorun.transport.datapath import ANSWER, decode_answer_head

# a connect started while the path was cut waits on the kernel's SYN retransmits (1 s, 3 s,
# ...): given up after 1.5 s, the sender's backoff retries at once on a new one
CONNECT_TIMEOUT_S = 1.5
READ_TIMEOUT_S = 120.0  # for the answer once the request is written (as the HTTP client's)
IDLE_S = 15.0  # a kept connection older than this is closed, not reused (the server: 75 s)
# requests to one peer at once (more wait): what a receiver lets one sender read at once
REQUESTS_PER_PEER = MAX_READS_PER_SENDER


@dataclass(frozen=True, slots=True)
class DataAnswer:
    """What the peer answered one data-path request."""

    status: int
    duplicate: bool
    downlink_wait_s: float
    tag: str | None
    text: bytes


class _Connection:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.used_s = time.monotonic()

    def close(self) -> None:
        self.sock.close()


async def _recv_exactly(loop: asyncio.AbstractEventLoop, sock: socket.socket,
                        nbytes: int) -> bytearray:
    buffer = bytearray(nbytes)
    view = memoryview(buffer)
    filled = 0
    while filled < nbytes:
        got = await loop.sock_recv_into(sock, view[filled:])
        if not got:
            raise asyncio.IncompleteReadError(bytes(buffer[:filled]), nbytes)
        filled += got
    return buffer


class DataLink:
    """The data path to one peer at `host`:`port`."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self._idle: list[_Connection] = []
        self._requests = asyncio.Semaphore(REQUESTS_PER_PEER)
        self.connects = 0

    @classmethod
    def for_url(cls, url: str) -> DataLink | None:
        """The data path of the server behind an ``http://`` URL (None for any other)."""
        parts = urlsplit(url)
        if parts.scheme != "http" or parts.hostname is None:
            return None
        return cls(parts.hostname, parts.port or 80)

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
        family, type_, proto, _, address = infos[0]
        sock = socket.socket(family, type_, proto)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            await asyncio.wait_for(loop.sock_connect(sock, address), CONNECT_TIMEOUT_S)
        except BaseException:
            sock.close()
            raise
        self.connects += 1
        return _Connection(sock)

    def _fresh_idle(self) -> _Connection | None:
        now = time.monotonic()
        while self._idle:
            connection = self._idle.pop()
            if now - connection.used_s < IDLE_S:
                return connection
            connection.close()
        return None

    async def exchange(self, meta: bytes, data: bytes | memoryview,
                       answer_max_bytes: int) -> DataAnswer:
        """Send one request (`meta` then the encoded message `data`) and read its answer.

        Raises OSError, TimeoutError or asyncio.IncompleteReadError when the peer
        cannot be reached or goes away (a kept connection the peer had closed is
        replaced once, silently), AnswerTooLarge for an answer over the caps, and
        akorun.transport.datapath.FramingError for bytes that are no answer. At most
        `REQUESTS_PER_PEER` run at once; more wait for one to end."""
        async with self._requests:
            return await self._exchange(meta, data, answer_max_bytes)

    async def _exchange(self, meta: bytes, data: bytes | memoryview,
                        answer_max_bytes: int) -> DataAnswer:
        connection = self._fresh_idle()
        if connection is not None:
            try:
                return await self._on(connection, meta, data, answer_max_bytes)
            except (ConnectionError, asyncio.IncompleteReadError) as error:
                if isinstance(error, asyncio.IncompleteReadError) and error.partial:
                    raise
        return await self._on(await self._connect(), meta, data, answer_max_bytes)

    async def _on(self, connection: _Connection, meta: bytes, data: bytes | memoryview,
                  answer_max_bytes: int) -> DataAnswer:
        loop = asyncio.get_running_loop()
        sock = connection.sock
        keep = False
        try:
            await loop.sock_sendall(sock, meta)
            await loop.sock_sendall(sock, data)
            head = decode_answer_head(await asyncio.wait_for(
                _recv_exactly(loop, sock, ANSWER.size), READ_TIMEOUT_S))
            if head.text_nbytes > answer_max_bytes:
                raise AnswerTooLarge(f"declares {head.text_nbytes} bytes, more than the "
                                     f"{answer_max_bytes} accepted")
            rest = await asyncio.wait_for(
                _recv_exactly(loop, sock, head.tag_nbytes + head.text_nbytes), READ_TIMEOUT_S)
            tag = bytes(rest[:head.tag_nbytes]).decode("ascii", "replace") or None
            keep = head.status == 200
            connection.used_s = time.monotonic()
            return DataAnswer(head.status, head.duplicate, head.downlink_wait_s, tag,
                              bytes(rest[head.tag_nbytes:]))
        finally:
            if keep:
                self._idle.append(connection)
            else:
                connection.close()

    def close(self) -> None:
        while self._idle:
            self._idle.pop().close()
