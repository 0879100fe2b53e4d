"""The sending end of akorun's data path: a peer's pipelined connection and one exchange on it.

This module owns talking to one peer's data path (framing in akorun.transport.datapath): one
plain non-blocking socket per peer (replaced when it breaks, closed once idle past
`IDLE_S`) that carries up to `PIPELINE_DEPTH` requests at once. Requests are written
whole and back to back in the order they were made (the preamble and the caller's
encoded message as it is in one scatter/gather ``sendmsg``, then what the socket did
not take at once: no concatenation, no copy of the body),
so the next body flows while the peer still checks and applies the one before; the
peer serves them in order and a reader task matches each answer to its request by
the request's id (in whatever order answers come). An answer to no waiting request
(a duplicate, or one never asked for), bytes that are no answer,
an answer over its caps (the tag at most `akorun.transport.datapath.ANSWER_TAG_MAX_BYTES`, the
text at most the caller's cap, so a forged answer cannot make the sender read more), a
request abandoned half written or half answered (cancelled), a timeout or the peer
going away end the connection: every request still on it fails (the caller sends it
again: the receiver's delivery log makes a copy that had arrived a duplicate, so each
message is applied exactly once). Whether an answer is authentic is the caller's check
(akorun.transport.sender with akorun.transport.keys), exactly as on the HTTP path.

Bounded: at most `PIPELINE_DEPTH` requests wait for answers per peer (more wait for
room before a byte is written); the sender holds their encoded messages anyway, and
the receiver reads one request at a time, so requests written ahead wait in the
kernel's socket buffers (TCP's flow control is the backpressure).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import socket
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from akorun.transport.answers import AnswerTooLarge
from akorun.transport.datapath import (
    ANSWER,
    PROBE_AUTH,
    PROBE_STATUS,
    FramingError,
    decode_answer_head,
    encode_request_meta,
)
from akorun.transport.wire import HEADER_SIZE

# a connect started while the path was cut waits on the kernel's SYN retransmits (1 s, 3 s,
# ...): given up after 1.5 s, the sender's backoff retries at once on a new one
CONNECT_TIMEOUT_S = 1.5
READ_TIMEOUT_S = 120.0  # for a request's answer once it is written (as the HTTP client's)
IDLE_S = 15.0  # a connection idle longer than this is closed, not reused (the server: 75 s)
# requests to one peer written before their answers came: enough to keep a body on the
# wire while the peer checks and applies the one before (two), one more for small ones
PIPELINE_DEPTH = 3
WARM_FRESH_S = 1.0  # a warmed connection unused this long counts as a kept idle one


@functools.cache
def send_buffer_bytes() -> int | None:
    """The send buffer a data-path socket asks for: the most TCP's autotuning could
    reach (``tcp_wmem``'s maximum), fixed at once, so that a pipelined body goes into
    the kernel in one or two writes instead of one per wake-up as the buffer grows
    (fewer system calls and event-loop wake-ups per message). Only where the system
    allows that much (``wmem_max``): a capped SO_SNDBUF would switch autotuning off
    and leave a smaller buffer than it reaches, so then None (the kernel's default)."""
    try:
        with open("/proc/sys/net/ipv4/tcp_wmem", encoding="ascii") as file:
            autotuned_max = int(file.read().split()[2])
        with open("/proc/sys/net/core/wmem_max", encoding="ascii") as file:
            allowed = int(file.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return autotuned_max if allowed >= autotuned_max else None


@dataclass(frozen=True, slots=True)
class DataAnswer:
    """What the peer answered one data-path request."""

    status: int
    duplicate: bool
    downlink_wait_s: float
    tag: str | None
    text: bytes


@dataclass(slots=True)
class _Waiting:
    request_id: int
    answer: asyncio.Future[DataAnswer]
    answer_max_bytes: int


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


async def _send_request(loop: asyncio.AbstractEventLoop, sock: socket.socket, meta: bytes,
                        data: bytes | memoryview) -> None:
    """`meta` then `data` on `sock`: first as one scatter/gather write (``sendmsg``: one
    system call, the preamble not a packet of its own), the rest as the socket takes it."""
    try:
        sent = sock.sendmsg([meta, data])
    except (BlockingIOError, InterruptedError):
        sent = 0
    if sent < len(meta):
        await loop.sock_sendall(sock, memoryview(meta)[sent:])
        sent = len(meta)
    rest = memoryview(data).cast("B")[sent - len(meta):]
    if rest.nbytes:
        await loop.sock_sendall(sock, rest)


class _Pipe:
    """One connection: requests written in order, answers read by one task in order."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.used_s = time.monotonic()
        self.next_id = 1
        self.waiting: dict[int, _Waiting] = {}  # by request id, in the order written
        self.writing = asyncio.Lock()
        self.broken: BaseException | None = None
        self.answered = 0  # answers read on it (a connection that answered was alive)
        self._reader: asyncio.Task[None] | None = None
        self._reading = False  # the reader task is inside its loop

    @property
    def usable(self) -> bool:
        return self.broken is None and (
            bool(self.waiting) or time.monotonic() - self.used_s < IDLE_S)

    def add(self, answer_max_bytes: int) -> _Waiting:
        waiting = _Waiting(self.next_id, asyncio.get_running_loop().create_future(),
                           answer_max_bytes)
        self.next_id = self.next_id % 0xFFFFFFFF + 1
        self.waiting[waiting.request_id] = waiting
        if self._reader is None:
            self._reader = asyncio.get_running_loop().create_task(self._read_answers())
        return waiting

    def fail(self, error: BaseException) -> None:
        """End the connection: every request still waiting on it fails with `error`.

        The socket is shut down at once, which ends a write or a read under way on it
        with an error (closing it under them would leave them waiting for an event that
        never comes), and closed once neither is under way (`close_if_done`)."""
        if self.broken is None:
            self.broken = error
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_RDWR)
        waitings, self.waiting = list(self.waiting.values()), {}
        for waiting in waitings:
            if not waiting.answer.done():
                waiting.answer.set_exception(error)
                waiting.answer.exception()  # retrieved: an abandoned request logs nothing
        if self._reader is not None and self._reader is not asyncio.current_task():
            self._reader.cancel()
        self.close_if_done()

    def close_if_done(self) -> None:
        """Close a failed connection's socket once no write and no read is under way."""
        if self.broken is not None and not self.writing.locked() and not self._reading:
            self.sock.close()

    async def _read_answers(self) -> None:
        loop = asyncio.get_running_loop()
        self._reading = True
        try:
            while True:
                head = decode_answer_head(await _recv_exactly(loop, self.sock, ANSWER.size))
                waiting = self.waiting.get(head.request_id)
                if waiting is None:
                    raise FramingError(f"an answer to request {head.request_id}, which waits "
                                       f"for none (answered already, or never made)")
                if head.text_nbytes > waiting.answer_max_bytes:
                    raise AnswerTooLarge(f"declares {head.text_nbytes} bytes, more than the "
                                         f"{waiting.answer_max_bytes} accepted")
                rest = await _recv_exactly(loop, self.sock, head.tag_nbytes + head.text_nbytes)
                tag = bytes(rest[:head.tag_nbytes]).decode("ascii", "replace") or None
                del self.waiting[head.request_id]
                self.answered += 1
                self.used_s = time.monotonic()
                if not waiting.answer.done():
                    waiting.answer.set_result(DataAnswer(
                        head.status, head.duplicate, head.downlink_wait_s, tag,
                        bytes(rest[head.tag_nbytes:])))
        except asyncio.CancelledError:
            self.fail(ConnectionResetError("the connection was closed"))
            raise
        except (OSError, asyncio.IncompleteReadError, FramingError,
                AnswerTooLarge) as error:
            self.fail(error)
        finally:
            self._reading = False
            self.close_if_done()


class DataLink:
    """The data path to one peer at `host`:`port`."""

    def __init__(self, host: str, port: int, *, depth: int = PIPELINE_DEPTH) -> None:
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self.host = host
        self.port = port
        self.depth = depth
        self._pipe: _Pipe | None = None
        self._requests = asyncio.Semaphore(depth)
        self._connecting = asyncio.Lock()
        self.connects = 0

    @classmethod
    def for_url(cls, url: str, *, depth: int = PIPELINE_DEPTH) -> DataLink | None:
        """The data path of the server behind an ``http://`` URL (None for any other)."""
        parts = urlsplit(url)
        if parts.scheme != "http" or parts.hostname is None:
            return None
        return cls(parts.hostname, parts.port or 80, depth=depth)

    @property
    def in_flight(self) -> int:
        """Requests written (or being written) whose answers have not come."""
        return len(self._pipe.waiting) if self._pipe is not None else 0

    async def _socket(self) -> socket.socket:
        """A new connected non-blocking socket to the peer (OSError, TimeoutError)."""
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
        family, type_, proto, _, address = infos[0]
        sock = socket.socket(family, type_, proto)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # no Nagle delay
            send_buffer = send_buffer_bytes()
            if send_buffer is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer)
            await asyncio.wait_for(loop.sock_connect(sock, address), CONNECT_TIMEOUT_S)
        except BaseException:
            sock.close()
            raise
        return sock

    async def _connect(self) -> _Pipe:
        sock = await self._socket()
        self.connects += 1
        return _Pipe(sock)

    async def probe(self, timeout_s: float) -> bool | None:
        """Whether the data path reaches the peer's akorun server, asked on a connection of
        its own: True when a probe (`akorun.transport.datapath.PROBE_AUTH`) is answered
        within `timeout_s`; False when the connection opens but nothing answers, or
        bytes that are no probe's answer come, or it is closed (a middlebox on the path
        that carries only HTTP); None when no connection opens (no verdict)."""
        loop = asyncio.get_running_loop()
        try:
            sock = await self._socket()
        except (OSError, TimeoutError):
            return None
        try:
            meta = encode_request_meta(PROBE_AUTH, None, None, 1)
            await asyncio.wait_for(_send_request(loop, sock, meta, bytes(HEADER_SIZE)),
                                   timeout_s)
            head = await asyncio.wait_for(_recv_exactly(loop, sock, ANSWER.size), timeout_s)
            return decode_answer_head(head).status == PROBE_STATUS
        except (OSError, TimeoutError, asyncio.IncompleteReadError, FramingError):
            return False
        finally:
            sock.close()

    async def _open_pipe(self) -> tuple[_Pipe, bool]:
        """The peer's connection (a new one if there is none usable) and whether it is new."""
        async with self._connecting:
            pipe = self._pipe
            if pipe is not None and pipe.usable:
                return pipe, False
            if pipe is not None:
                pipe.fail(ConnectionResetError("idle connection closed"))
            pipe = self._pipe = await self._connect()
            return pipe, True

    async def warm(self) -> None:
        """Open the connection now, before the first request needs it (a failure is left
        to that request: it connects again)."""
        with contextlib.suppress(OSError, TimeoutError):
            await self._open_pipe()

    async def exchange(self, auth: str, relay: str | None, wire_s: str | None,
                       data: bytes | memoryview, answer_max_bytes: int) -> DataAnswer:
        """Send one request (its texts, then the encoded message `data`) and await its answer.

        Raises OSError, TimeoutError or asyncio.IncompleteReadError when the peer
        cannot be reached or goes away (a kept connection the peer had closed while
        idle is replaced once, silently), AnswerTooLarge for an answer over the caps,
        and akorun.transport.datapath.FramingError for bytes that are no answer or an
        answer to another request. At most `depth` run at once; more wait for room."""
        async with self._requests:
            pipe, new = await self._open_pipe()
            # a kept connection that sat idle (it answered before, or was warmed a while
            # ago): one the peer closed meanwhile is replaced silently; a fresh one's
            # failure is the caller's to count and retry
            reused_idle = not new and not pipe.waiting and (
                pipe.answered > 0 or time.monotonic() - pipe.used_s > WARM_FRESH_S)
            try:
                return await self._on(pipe, auth, relay, wire_s, data, answer_max_bytes)
            except (ConnectionError, asyncio.IncompleteReadError) as error:
                if not reused_idle or (isinstance(error, asyncio.IncompleteReadError)
                                       and error.partial):
                    raise
            pipe, _ = await self._open_pipe()  # the idle one had been closed by the peer
            return await self._on(pipe, auth, relay, wire_s, data, answer_max_bytes)

    async def _on(self, pipe: _Pipe, auth: str, relay: str | None, wire_s: str | None,
                  data: bytes | memoryview, answer_max_bytes: int) -> DataAnswer:
        loop = asyncio.get_running_loop()
        waiting = pipe.add(answer_max_bytes)
        meta = encode_request_meta(auth, relay, wire_s, waiting.request_id)
        try:
            async with pipe.writing:  # written whole and in the order the requests came
                if pipe.broken is not None:
                    raise ConnectionResetError(f"the connection failed: {pipe.broken!r}")
                await _send_request(loop, pipe.sock, meta, data)
            pipe.used_s = time.monotonic()
            return await asyncio.wait_for(asyncio.shield(waiting.answer), READ_TIMEOUT_S)
        except BaseException as error:
            # abandoned half written or before its answer (cancelled, timed out) or the
            # connection failed: nothing after it on this connection can be trusted
            if not waiting.answer.done() or isinstance(error, asyncio.CancelledError):
                pipe.fail(error if isinstance(error, (OSError, TimeoutError))
                          else ConnectionResetError("a request on the connection was "
                                                    "abandoned"))
            raise
        finally:
            pipe.close_if_done()
            if pipe is self._pipe and pipe.broken is not None:
                self._pipe = None

    def close(self) -> None:
        if self._pipe is not None:
            self._pipe.fail(ConnectionResetError("closed"))
            self._pipe = None
