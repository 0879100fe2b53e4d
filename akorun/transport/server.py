"""The HTTP face of one akorun process: an aiohttp app on the worker's own event loop.

Endpoints (all writes sealed per session and per sender, see akorun.transport.keys):

- ``POST /v1/partial``: one wire message. akorun.transport.admission refuses it first
  while the host is not ready (503) or without a Content-Length (400); then its
  seal (``X-Ako-Auth``) is opened from the HTTP header alone (401 forged,
  replayed from an earlier instance or for another rank; 421 for an earlier
  instance of this rank) before anything is reserved for it. Only then does it
  take a read slot (503 when every slot, or every slot its sender may hold, is
  taken), read the 100-byte header within a deadline (the seal commits to
  it: 401 otherwise) and check it (400 malformed or another sender than the
  sealed one, 413 over the cap, 409 another run) before any body byte is read.
  The body is streamed, within a minimum rate, into a pooled float32 buffer
  while a `BodyHasher` checks it against the header's digest; then the
  partial goes straight to the host's scheme node (a `SchemeError` -> 400; a
  duplicate -> 200 with ``X-Ako-Duplicate: 1``). A header or body that is not
  what the seal commits to (altered or cut on the way, or a Content-Length
  changed) is answered 400 ``damaged``: the sender sends it again. Every
  answer given once the seal is open, whatever its status, carries a tag
  bound to the request, its status and its body (akorun.transport.answers: the sender
  acts only on tagged answers). A 503 means the sender keeps the bytes and
  retries.
- ``POST /v1/<kind>`` for every route of the host's `ControlTable`
  (akorun.transport.routing): sealed JSON control messages (401 unsealed, forged or
  replayed, 421 stale session, 400 not a JSON object, 413 over 64 KiB); the
  answer is bound to its request. A hello sealed with no receiver nonce is a
  discovery: it is answered with this instance's nonce and goes no further.
- The data path (akorun.transport.datapath, akorun.transport.datapath_server): a
  connection whose first
  bytes are ``AKOP`` instead of an HTTP request line carries partials framed
  without HTTP, received straight into pooled buffers, under the same checks and
  answers as ``POST /v1/partial``; the connection guard (akorun.transport.connection_guard:
  allow-list, connection bound, header deadline) hands such a connection over.
- ``GET /metrics`` (Prometheus text) and ``GET /status`` (JSON): read-only and
  unauthenticated on purpose, so standard scrapers work; they expose counts,
  never parameters or keys.

The server never unpickles anything and holds no unbounded buffers: body
memory is bounded by max_concurrent_reads x the body cap.

Who may connect and how long a header may take is akorun.transport.connection_guard's;
the other pieces that stand alone (admission, keys, wire, routing) are modules of
their own too.

Each 200 to a partial adds its handling seconds, less the time spent awaiting
its bytes and its emulated downlink hold, to the sender's
``software_receive_s`` (akorun.metrics): the receiving half of the rank's
``message_software_s``, which holds no network time.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import ssl
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import numpy as np
from aiohttp import StreamReader, web

from akocore.codecs import Codec
from akocore.messages import Partial
from akocore.schemes import SchemeError
from akorun.errors import UsageError
from akorun.metrics import PROMETHEUS_CONTENT_TYPE, ByteWaits, Metrics
from akorun.transport import control
from akorun.transport.admission import (
    Admission,
    BufferPool,
    Refusal,
    refusal_worth_logging,
    wire_refusal,
)
from akorun.transport.answers import ANSWER_TEXT_MAX_CHARS, DAMAGED
from akorun.transport.connection_guard import AllowList, ConnectionGuard, ConnectionLog
from akorun.transport.control import CONTROL_BODY_MAX_BYTES, ControlError, ControlKind
from akorun.transport.datapath_server import DataConnection
from akorun.transport.emulated_links import DownlinkShaper
from akorun.transport.keys import (
    AUTH_HEADER,
    RELAY_HEADER,
    SESSION_PATH,
    Opened,
    RequestVerifier,
    ack_body,
)
from akorun.transport.ordered_lane import OrderedLane
from akorun.transport.port_check import port_taken_line
from akorun.transport.routing import ControlTable
from akorun.transport.sender import (
    DOWNLINK_WAIT_HEADER,
    DUPLICATE_HEADER,
    WIRE_TIME_HEADER,
    seconds_header,
)
from akorun.transport.validation import (
    DamagedInTransit,
    NonFiniteValues,
    checked_header,
    partial_of,
)
from akorun.transport.wire import (
    HEADER_SIZE,
    BodyHasher,
    Status,
    WireError,
)

log = logging.getLogger("akorun")

__all__ = ["ControlError", "Host", "Server"]  # ControlError: its former home, kept importable
HASH_IN_THREAD_BYTES = 256 * 1024  # bodies from this size are hashed off the loop
KEEPALIVE_TIMEOUT_S = 75.0  # longer than the client's 15 s, so the client closes first
HEADER_DEADLINE_S = 10.0  # from a connection's (or a request's) first byte to its last header
READ_BUFFER_BYTES = 1 << 20  # body bytes buffered before the socket is paused (x2)
# open connections a server holds (each may buffer up to 2 x READ_BUFFER_BYTES): past
# this, the oldest never authenticated one is closed for a new one (a member's are kept)
CONNECTIONS_PER_RANK = 32
MIN_CONNECTIONS = 256
async def _read_body_inline(content: StreamReader, values: np.ndarray,
                            verifier: BodyHasher, nbytes: int, waits: ByteWaits) -> None:
    """Read a small body into `values`, feeding the verifier on the loop."""
    view = memoryview(values.data).cast("B")
    filled = 0
    while filled < nbytes:
        chunk, _ = await waits.wait(content.readchunk())
        if not chunk:
            raise WireError(f"body ended after {filled} of {nbytes} bytes", Status.MALFORMED)
        end = filled + len(chunk)
        if end > nbytes:
            raise WireError(f"body longer than {nbytes} bytes", Status.MALFORMED)
        view[filled:end] = chunk
        verifier.update(chunk)
        filled = end


def _copy_and_hash(target: np.ndarray, start: int, end: int, chunk: bytes,
                   verifier: BodyHasher) -> None:
    """One chunk of an HTTP body: into its buffer and its hasher (on an `OrderedLane`)."""
    target[start:end] = np.frombuffer(chunk, dtype=np.uint8)
    verifier.update(chunk)


class Host(Protocol):
    """What the server needs from the process it serves (akorun.runtime.worker.Worker)."""

    rank: int
    world: int
    metrics: Metrics
    verifier: RequestVerifier
    control_table: ControlTable
    downlink: DownlinkShaper | None  # an emulated incoming NIC, if any
    codec: Codec | None  # the run's codec (akocore.codecs); None: float32 bodies only

    def not_accepting(self) -> str | None: ...

    def max_body_bytes(self) -> int: ...

    async def on_partial(self, partial: Partial, nbytes: int) -> bool: ...

    def note_endorsements(self, key: tuple[int, int, int], text: str | None) -> None:
        """The sender's endorsements of the partial `key` about to be given to
        `on_partial` (akorun.transport.keys.RELAY_HEADER; None if it carried none)."""

    def status(self, digest: bool = False) -> dict[str, Any]: ...

    def prometheus(self) -> str: ...


class Server:
    """The aiohttp application of one host, started with `start` and stopped with `close`."""

    def __init__(self, host: Host, *, max_concurrent_reads: int = 8,
                 body_hasher: Callable[[], BodyHasher] = BodyHasher) -> None:
        self.host = host
        self.body_hasher = body_hasher  # another one only in the benchmark's comparison
        self.admission = Admission(host.not_accepting, max_concurrent_reads=max_concurrent_reads)
        self.buffers = BufferPool(keep=max(2, max_concurrent_reads))
        self.app = web.Application(client_max_size=CONTROL_BODY_MAX_BYTES,
                                   middlewares=[self._headers_arrived])
        self.allow: AllowList = ()
        self.header_deadline_s = HEADER_DEADLINE_S
        self.guards: dict[asyncio.Protocol, ConnectionGuard] = {}
        self.data_connections: weakref.WeakSet[DataConnection] = weakref.WeakSet()
        self._digest_lanes: list[OrderedLane] = []  # idle data-path hashing threads
        self.max_connections = max(MIN_CONNECTIONS, CONNECTIONS_PER_RANK * host.world)
        self._listener: asyncio.Server | None = None
        self.app.router.add_post("/v1/partial", self.partial)
        for route in host.control_table.routes:
            self.app.router.add_post(route.path, self._control_handler(route.kind))
        self.app.router.add_get("/metrics", self.metrics)
        self.app.router.add_get("/status", self.status)
        self.runner: web.AppRunner | None = None
        self._free_lanes: list[OrderedLane] = []  # idle hashing threads (made on demand)
        self._lanes_open = True

    # ---------------------------------------------------------------- lifecycle

    async def start(self, listen_host: str, port: int,
                    ssl_context: ssl.SSLContext | None = None, *, allow: AllowList = (),
                    header_deadline_s: float = HEADER_DEADLINE_S) -> None:
        """Listen on listen_host:port, letting in only peers in `allow` (empty: anyone) and
        closing connections whose HTTP header takes over `header_deadline_s`; UsageError if
        the port is taken or the host unknown."""
        self.allow = tuple(allow)
        self.header_deadline_s = header_deadline_s
        self.runner = web.AppRunner(self.app, handle_signals=False, access_log=None,
                                    keepalive_timeout=KEEPALIVE_TIMEOUT_S, shutdown_timeout=2.0,
                                    read_bufsize=READ_BUFFER_BYTES,
                                    logger=ConnectionLog(self.host.metrics))
        await self.runner.setup()
        try:
            self._listener = await asyncio.get_running_loop().create_server(
                lambda: ConnectionGuard(self), listen_host, port, ssl=ssl_context, backlog=128,
                reuse_address=True)
        except OSError as error:
            await self.runner.cleanup()
            self.runner = None
            if error.errno == errno.EADDRINUSE:
                raise UsageError(port_taken_line(port, listen_host, self.host.rank)) from None
            raise UsageError(f"cannot listen on {listen_host}:{port} (rank {self.host.rank}): "
                             f"{error.strerror or error}; check cluster.hosts or --listen") \
                from None

    def evict_untrusted(self) -> bool:
        """Close the oldest connection on which no request has passed its seal; False if
        every open connection is a member's."""
        for inner, guard in self.guards.items():  # oldest first (insertion order)
            if not guard.trusted and guard.transport is not None:
                self.host.metrics.rejected["evicted_connection"] += 1
                del self.guards[inner]  # counted out now; its connection_lost comes later
                guard.transport.abort()
                return True
        return False

    def _trust(self, request: web.Request) -> None:
        guard = self.guards.get(request.protocol)
        if guard is not None:
            guard.trusted = True

    async def close(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()  # accept no more; the runner then closes what is open
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None
        for guard in list(self.guards.values()):
            if guard.transport is not None:
                guard.transport.abort()
        if listener is not None:
            await listener.wait_closed()
        for connection in list(self.data_connections):
            if connection.task is not None:
                connection.task.cancel()
        self._lanes_open = False
        while self._free_lanes:
            self._free_lanes.pop().stop()
        while self._digest_lanes:
            self._digest_lanes.pop().stop()

    def take_digest_lane(self) -> OrderedLane:
        """An idle hashing thread for a data-path body (made on demand)."""
        return self._digest_lanes.pop() if self._digest_lanes else OrderedLane("digest-lane")

    def give_back_digest_lane(self, lane: OrderedLane) -> None:
        if self._lanes_open:
            self._digest_lanes.append(lane)
        else:
            lane.stop()

    # ---------------------------------------------------------------- helpers

    @web.middleware
    async def _headers_arrived(self, request: web.Request,
                               handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                               ) -> web.StreamResponse:
        """The request's header is complete: its connection's header deadline is met."""
        guard = self.guards.get(request.protocol)
        if guard is not None:
            guard.request_started()
        try:
            return await handler(request)
        finally:
            if guard is not None:
                guard.request_ended()

    def _reject(self, status: int, reason: str, detail: str,
                opened: Opened | None = None) -> web.Response:
        """A refusal; once the request's seal is open (`opened`), its answer is tagged
        like a 200 (bound to the request, its status and its body), so that the sender
        can tell it from one forged on the path: only a tagged refusal is final."""
        self.host.metrics.rejected[reason] += 1
        count = self.host.metrics.rejected[reason]
        if status != 503 and refusal_worth_logging(count, authenticated=opened is not None):
            so_far = "" if opened is not None else f" ({count} such so far)"
            log.warning("refused a request with %d %s%s: %s", status, reason, so_far, detail)
        body = f"{reason}: {detail}"[:ANSWER_TEXT_MAX_CHARS].encode("utf-8", "replace") + b"\n"
        headers = {} if opened is None else {
            AUTH_HEADER: self.host.verifier.seal_answer(opened, status, body)}
        return web.Response(status=status, body=body, content_type="text/plain",
                            headers=headers)

    def _refuse(self, refusal: Refusal, opened: Opened | None = None) -> web.Response:
        return self._reject(refusal.status, refusal.reason, refusal.detail, opened)

    def _refuse_error(self, error: WireError, opened: Opened | None = None) -> web.Response:
        return self._refuse(wire_refusal(error), opened)

    # ---------------------------------------------------------------- partials

    async def partial(self, request: web.Request) -> web.Response:
        start_s = time.perf_counter()
        length = request.content_length
        admitted = self.admission.admit_partial(
            self.host.verifier, request.headers.get(AUTH_HEADER), request.path, length,
            lambda: self._trust(request))
        if admitted.refusal is not None:
            return self._refuse(admitted.refusal, admitted.opened)
        opened = admitted.opened
        assert length is not None and opened is not None
        try:
            with self.admission.slot(opened.sender):
                return await self._read_partial(request, length, opened, start_s)
        except DamagedInTransit as error:
            return self._reject(400, DAMAGED, str(error), opened)
        except WireError as error:
            return self._refuse_error(error, opened)
        except TimeoutError:
            return self._reject(503, "too_slow", "header or body slower than the minimum rate",
                                opened)
        except asyncio.IncompleteReadError as error:
            return self._reject(400, DAMAGED, f"body ended after {len(error.partial)} bytes",
                                opened)
        except (SchemeError, KeyError) as error:
            return self._reject(400, "malformed", f"scheme refused the message: {error}",
                                opened)
        except NonFiniteValues as error:  # recorded as zeros by the host (transport.validation)
            return self._reject(error.status, error.reason, str(error), opened)

    async def _read_partial(self, request: web.Request, length: int, opened: Opened,
                            start_s: float) -> web.Response:
        """Read, check and apply one partial. A 200's handling time since `start_s`
        (perf_counter), less its waits for bytes (`ByteWaits`) and its emulated
        downlink hold, goes to the sender's ``software_receive_s`` (akorun.metrics)."""
        host = self.host
        content = request.content
        waits = ByteWaits()
        head = await waits.wait(asyncio.wait_for(content.readexactly(HEADER_SIZE),
                                                 self.admission.header_deadline_s))
        header = checked_header(host.verifier, opened, head,
                                max_body_bytes=host.max_body_bytes(), codec=host.codec)
        if header.body_nbytes != length - HEADER_SIZE:  # Content-Length changed on the way
            raise DamagedInTransit(f"header says {header.body_nbytes} body bytes, the request "
                                   f"has {length - HEADER_SIZE}")
        nbytes = header.body_nbytes
        values = self.buffers.take(header.length)
        hasher = self.body_hasher()
        if nbytes >= HASH_IN_THREAD_BYTES:
            reading = self._read_body_in_lane(content, values, hasher, nbytes, waits)
        else:
            reading = _read_body_inline(content, values, hasher, nbytes, waits)
        try:
            await asyncio.wait_for(reading, self.admission.body_deadline_s(nbytes))
            hasher.check(header.digest)
        except WireError as error:  # short, long or not the body the header commits to
            raise DamagedInTransit(f"body: {error.reason}") from None
        partial = partial_of(header, values)
        downlink = host.downlink
        wait_s = 0.0
        if downlink is not None:
            loop = asyncio.get_running_loop()
            arrived_s = loop.time()
            wire_s = seconds_header(request.headers.get(WIRE_TIME_HEADER)) or None
            await downlink.admit(header.sender, HEADER_SIZE + nbytes, wire_s)
            wait_s = loop.time() - arrived_s
        host.note_endorsements(partial.key, request.headers.get(RELAY_HEADER))
        accepted = await host.on_partial(partial, HEADER_SIZE + nbytes)
        del partial
        self.buffers.give_back(values)
        duplicate = not accepted
        response = web.json_response({"duplicate": duplicate},
                                     headers={DUPLICATE_HEADER: "1" if duplicate else "0",
                                              DOWNLINK_WAIT_HEADER: f"{wait_s:.6f}",
                                              AUTH_HEADER: host.verifier.seal_answer(
                                                  opened, 200, ack_body(duplicate))})
        counters = host.metrics.peer(header.sender)
        counters.software_receive_s += max(
            0.0, time.perf_counter() - start_s - waits.total_s - wait_s)
        counters.software_received += 1
        return response

    async def _read_body_in_lane(self, content: StreamReader, values: np.ndarray,
                                 verifier: BodyHasher, nbytes: int, waits: ByteWaits) -> None:
        """Read a large body; a lane thread copies each chunk into `values` and feeds
        the hasher, in order, while the loop keeps reading (blake3 and numpy's copy
        release the GIL). Returns once the lane is done with every chunk, even on error,
        so that no body outlives its read slot."""
        lane = self._free_lanes.pop() if self._free_lanes else OrderedLane("hash-lane")
        target = values.view(np.uint8)
        filled = 0
        try:
            while filled < nbytes:
                chunk, _ = await waits.wait(content.readchunk())
                if not chunk:
                    raise WireError(f"body ended after {filled} of {nbytes} bytes",
                                    Status.MALFORMED)
                end = filled + len(chunk)
                if end > nbytes:
                    raise WireError(f"body longer than {nbytes} bytes", Status.MALFORMED)
                lane.feed(_copy_and_hash, target, filled, end, chunk, verifier)
                filled = end
        finally:
            drained = lane.drained()
            # the lane can take the next body at once (it works through its queue in
            # order), even if this handler is cancelled while waiting for it
            if self._lanes_open:
                self._free_lanes.append(lane)
            else:
                lane.stop()
            await drained

    # ---------------------------------------------------------------- control

    def _control_handler(self, kind: ControlKind
                         ) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handler(request: web.Request) -> web.Response:
            return await self.control(request, kind)

        return handler

    async def control(self, request: web.Request, kind: ControlKind) -> web.Response:
        path = request.path
        verifier = self.host.verifier
        try:
            opened = verifier.open(request.headers.get(AUTH_HEADER), path, control=True)
        except WireError as error:
            return self._refuse_error(error)
        self._trust(request)
        try:
            body = await asyncio.wait_for(request.read(), self.admission.body_deadline_s(
                CONTROL_BODY_MAX_BYTES))
            verifier.check_digest(opened, body)
        except WireError as error:
            return self._reject(400, DAMAGED, f"{path}: {error.reason}", opened)
        except web.HTTPRequestEntityTooLarge:
            return self._reject(413, "too_large", f"control body over "
                                                  f"{CONTROL_BODY_MAX_BYTES} bytes", opened)
        except TimeoutError:
            return self._reject(503, "too_slow", f"{path}: body slower than the minimum rate",
                                opened)
        if opened.seal.discovery:  # the first half of a hello: who am I now
            assert path == SESSION_PATH
            return self._sealed(opened, control.dumps({
                "rank": self.host.rank, "nonce": verifier.sessions.nonce.hex()}),
                "application/json")
        try:
            payload = control.loads(body)
        except (ValueError, UnicodeDecodeError) as error:
            return self._reject(400, "malformed", f"{path}: body is not a JSON object: {error}",
                                opened)
        try:
            result = await self.host.control_table.dispatch(kind, payload, opened.sender)
        except ControlError as error:
            if error.status == 503:  # not yet: the caller asks again (not counted, not logged)
                body = f"{error.reason}"[:ANSWER_TEXT_MAX_CHARS].encode("utf-8", "replace")
                return web.Response(status=503, body=body + b"\n", content_type="text/plain",
                                    headers={AUTH_HEADER: verifier.seal_answer(
                                        opened, 503, body + b"\n")})
            return self._reject(error.status, "refused", f"{path}: {error.reason}", opened)
        if isinstance(result, bytes):
            return self._sealed(opened, result, "application/octet-stream")
        return self._sealed(opened, control.dumps(result), "application/json")

    def _sealed(self, opened: Opened, body: bytes, content_type: str) -> web.Response:
        tag = self.host.verifier.seal_answer(opened, 200, body)
        return web.Response(body=body, content_type=content_type, headers={AUTH_HEADER: tag})

    # ---------------------------------------------------------------- read-only

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=self.host.prometheus(),
                            headers={"Content-Type": PROMETHEUS_CONTENT_TYPE})

    async def status(self, request: web.Request) -> web.Response:
        digest = request.query.get("digest") == "1"
        return web.Response(text=json.dumps(self.host.status(digest), default=str),
                            content_type="application/json")
