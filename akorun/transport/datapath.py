"""akorun's data path for partials: its framing and a socket reader that fills given buffers.

This module owns the bytes of the data path and reading them without copies; the
server side is akorun.transport.datapath_server, the client side akorun.transport.datapath_client.

A partial can travel as an HTTP POST to ``/v1/partial`` (akorun.transport.server) or on the data
path: the same port, told apart by the first four bytes of the connection (`MAGIC`,
which no HTTP method starts with). On a data-path connection the sender writes its
requests back to back, up to a few in flight before the first is answered
(pipelining, akorun.transport.datapath_client), each as::

    preamble   `PREAMBLE`: MAGIC, the request's id (the connection's count, from 1),
               then the byte lengths of the three texts below
    auth       the X-Ako-Auth seal text (ASCII, as on the HTTP path)
    relay      the X-Ako-Relay endorsements text (ASCII, may be empty)
    wire_s     seconds on the sender's emulated wire (ASCII decimal, may be empty)
    message    the wire message (akorun.transport.wire): 100-byte header, then the body

and the receiver serves them in the order they came, one at a time, answering each with
`ANSWER` (ANSWER_MAGIC, the request's id, status, duplicate flag, seconds held at an
emulated downlink, the lengths of the answer tag and text) then the tag and the text.
The sender matches an answer to its request by the id, in whatever order answers come
(an answer to no request waiting on the connection, such as a duplicate, ends the
connection: every request on it goes again); the answer's tag, bound to that very
request's seal, is what makes it trusted. The rules
are those of the HTTP path (docs/reference/wire.md): the seal is opened from the preamble's
texts and checked against the 100-byte header before a
read slot or a body buffer is taken; the texts together are at most
`META_MAX_BYTES`, so unauthenticated bytes hold no more than that (and the
connection's first socket read, which told it from HTTP); every answer given
once the seal is open is tagged exactly as on the HTTP path. After a refusal before
the body was read the receiver closes the connection (the sender reconnects and sends
that request and every one written behind it again). Requests written ahead wait in
the kernel's socket buffers while the receiver serves the one before (it reads only
into buffers it gives, `FillingProtocol`): TCP's flow control bounds them.

`FillingProtocol` is an `asyncio.BufferedProtocol`: the event loop's transport calls
``recv_into`` straight into the buffer the reader asked to fill (a pooled float32
array for a body), so a received message costs no allocation per socket read.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable
from dataclasses import dataclass

MAGIC = b"AKOP"  # first bytes of a data-path connection (and of each request on it)
ANSWER_MAGIC = b"AKOA"
PREAMBLE = struct.Struct("<4sIHHH")  # magic, request id, len(auth), len(relay), len(wire_s)
# magic, request id, status, duplicate, downlink_wait_s, len(tag), len(text)
ANSWER = struct.Struct("<4sIHBdHI")
META_MAX_BYTES = 8192  # auth + relay + wire_s texts (a seal is ~180 B, 16 B per rank of relay)
ANSWER_TAG_MAX_BYTES = 256
SPARE_READ_BYTES = 16384  # a read that lands while no buffer is given (reading pausing)
# a request whose auth text is this asks only "is akorun's data path here?": the server
# answers PROBE_STATUS at once (untagged: it carries nothing) and keeps the connection;
# its wire header is zeros and never read as one (akorun.transport.datapath_client.probe)
PROBE_AUTH = "probe"
PROBE_STATUS = 204


class FramingError(Exception):
    """Bytes that are not a data-path request or answer."""


@dataclass(frozen=True, slots=True)
class RequestMeta:
    """What precedes a partial's wire message on the data path."""

    auth: str
    relay: str | None
    wire_s: str | None


def encode_request_meta(auth: str, relay: str | None, wire_s: str | None,
                        request_id: int = 0) -> bytes:
    """The preamble and texts that go before a wire message."""
    texts = [auth.encode("ascii"), (relay or "").encode("ascii"), (wire_s or "").encode("ascii")]
    if sum(map(len, texts)) > META_MAX_BYTES:
        raise ValueError(f"data-path request texts exceed {META_MAX_BYTES} bytes")
    return PREAMBLE.pack(MAGIC, request_id, *map(len, texts)) + b"".join(texts)


def request_id_of(request: bytes | bytearray | memoryview) -> int:
    """The request id a request's preamble carries (whatever else it holds)."""
    return int(PREAMBLE.unpack_from(request)[1])


def meta_lengths(preamble: bytes | bytearray | memoryview) -> tuple[int, int, int]:
    """The three text lengths of a preamble; FramingError if it is not one."""
    magic, _, auth_n, relay_n, wire_n = PREAMBLE.unpack(preamble)
    if magic != MAGIC:
        raise FramingError(f"not a data-path request (starts {bytes(magic)!r})")
    if auth_n + relay_n + wire_n > META_MAX_BYTES:
        raise FramingError(f"request texts of {auth_n + relay_n + wire_n} bytes exceed "
                           f"{META_MAX_BYTES}")
    return auth_n, relay_n, wire_n


def decode_request_meta(texts: bytes | bytearray | memoryview,
                        lengths: tuple[int, int, int]) -> RequestMeta:
    auth_n, relay_n, wire_n = lengths
    raw = bytes(texts)
    try:
        auth = raw[:auth_n].decode("ascii")
        relay = raw[auth_n:auth_n + relay_n].decode("ascii")
        wire_s = raw[auth_n + relay_n:auth_n + relay_n + wire_n].decode("ascii")
    except UnicodeDecodeError:
        raise FramingError("request texts are not ASCII") from None
    return RequestMeta(auth, relay or None, wire_s or None)


def encode_answer(status: int, duplicate: bool, downlink_wait_s: float, tag: str | None,
                  text: bytes, request_id: int = 0) -> bytes:
    tag_bytes = (tag or "").encode("ascii")
    return ANSWER.pack(ANSWER_MAGIC, request_id, status, int(duplicate), downlink_wait_s,
                       len(tag_bytes), len(text)) + tag_bytes + text


@dataclass(frozen=True, slots=True)
class AnswerHead:
    request_id: int
    status: int
    duplicate: bool
    downlink_wait_s: float
    tag_nbytes: int
    text_nbytes: int


def decode_answer_head(head: bytes | bytearray | memoryview) -> AnswerHead:
    magic, request_id, status, duplicate, wait_s, tag_n, text_n = ANSWER.unpack(head)
    if magic != ANSWER_MAGIC:
        raise FramingError(f"not a data-path answer (starts {bytes(magic)!r})")
    if tag_n > ANSWER_TAG_MAX_BYTES:
        raise FramingError(f"answer tag of {tag_n} bytes")
    if not 0.0 <= wait_s < float("inf"):
        wait_s = 0.0
    return AnswerHead(request_id, status, bool(duplicate), wait_s, tag_n, text_n)


class FillingProtocol(asyncio.BufferedProtocol):
    """A connection read only into buffers its reader gives (`fill`), one at a time.

    Reading pauses as soon as bytes land while no buffer waits to be filled (they are
    kept, at most `SPARE_READ_BYTES` per pause, and given to the next `fill` first), so
    a peer can push no more than that and the kernel's socket buffers hold while the
    reader is busy. Between the fills of one reader (a request's preamble, texts and
    body) reading is left on: no pause and resume (two system calls) per fill. Bytes
    that arrived before this protocol took the connection over are given to `prime`.
    """

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._early = bytearray()  # bytes read before a buffer was given (rare)
        self._spare = bytearray(SPARE_READ_BYTES)
        self._target: memoryview | None = None
        self._filled = 0
        self._on_chunk: Callable[[memoryview], None] | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._closed: BaseException | None = None
        self._discarding = False
        self.paused = False

    # ---------------------------------------------------------------- reader side

    def prime(self, data: bytes) -> None:
        self._early += data

    async def fill(self, target: memoryview,
                   on_chunk: Callable[[memoryview], None] | None = None) -> None:
        """Fill `target` entirely (IncompleteReadError / ConnectionError if the peer
        goes away first); `on_chunk` sees each piece as it lands (e.g. a hasher)."""
        nbytes = target.nbytes
        filled = 0
        if self._early:
            filled = min(nbytes, len(self._early))
            target[:filled] = self._early[:filled]
            if on_chunk is not None:
                on_chunk(target[:filled])
            del self._early[:filled]
        if filled == nbytes:
            return
        if self._closed is not None:
            raise self._closed
        loop = asyncio.get_running_loop()
        self._target, self._filled, self._on_chunk = target, filled, on_chunk
        self._waiter = loop.create_future()
        self._resume()
        try:
            await self._waiter
        finally:
            self._target = self._on_chunk = self._waiter = None

    async def drain_until_closed(self, timeout_s: float) -> None:
        """Read and drop whatever comes until the peer closes or `timeout_s` passes (a
        lingering close: closing with unread bytes would reset the connection, and the
        peer could lose the answer just written before it reads it)."""
        self._early.clear()
        if self._closed is not None:
            return
        self._discarding = True
        self._waiter = asyncio.get_running_loop().create_future()
        self._resume()
        try:
            await asyncio.wait_for(self._waiter, timeout_s)
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._waiter = None

    def _resume(self) -> None:
        if self.paused and self.transport is not None and not self.transport.is_closing():
            self.paused = False
            self.transport.resume_reading()

    def _pause(self) -> None:
        if not self.paused and self.transport is not None and not self.transport.is_closing():
            self.paused = True
            self.transport.pause_reading()

    # ---------------------------------------------------------------- transport side

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.paused = False
        self._pause()

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._target is None:  # a read already under way as reading paused: keep it
            return memoryview(self._spare)
        return self._target[self._filled:]

    def buffer_updated(self, nbytes: int) -> None:
        if self._discarding:
            return
        target = self._target
        if target is None:
            self._early += self._spare[:nbytes]
            self._pause()
            return
        start = self._filled
        self._filled = start + nbytes
        if self._on_chunk is not None:
            self._on_chunk(target[start:self._filled])
        if self._filled >= target.nbytes:
            self._target = None  # what lands next goes to the spare buffer (and pauses)
            if self._waiter is not None and not self._waiter.done():
                self._waiter.set_result(None)

    def eof_received(self) -> bool:
        self._fail(asyncio.IncompleteReadError(b"", None))
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(exc if exc is not None else ConnectionResetError("connection closed"))

    def _fail(self, error: BaseException) -> None:
        if self._closed is None:
            self._closed = error
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(error)
