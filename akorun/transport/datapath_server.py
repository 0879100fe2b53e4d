"""The receiving end of akorun's data path: one connection that carries partials.

This module owns serving a data-path connection (framing in akorun.transport.datapath) once
the connection guard (akorun.transport.connection_guard) has seen its first bytes. Each
request passes the checks of the HTTP path in the same order (akorun.transport.server,
akorun.transport.admission): 503 while the host is not ready; the seal opened from the
preamble's auth text (401, 421); a read slot (503 ``inbox_full``); the 100-byte header
within the header deadline and against the seal's digest (400 ``damaged``), bounds (400,
413), sender and run (401, 409); only then a pooled float32 buffer, which the socket fills
directly (``recv_into``, no allocation per read) within the minimum body rate (503
``too_slow``) while a hashing thread checks the body against the header's digest as it
lands. Every answer once the seal is open is tagged as on the HTTP path. A probe (auth text
`akorun.transport.datapath.PROBE_AUTH`) is answered at once, untagged, and changes nothing:
a sender learns that the path carries the data path. A refusal before the body was read
closes the connection after the answer, so no unread body is left on it. Unauthenticated
bytes hold at most the connection's first socket read (asyncio reads at most 256 KiB at a
time, less than an HTTP connection's read buffer) and then the preamble and its texts
(`akorun.transport.datapath.META_MAX_BYTES`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from akocore.schemes import SchemeError
from akorun.metrics import ByteWaits
from akorun.transport.admission import refusal_worth_logging, wire_refusal
from akorun.transport.answers import ANSWER_TEXT_MAX_CHARS, DAMAGED
from akorun.transport.cancelling import raise_if_cancelling
from akorun.transport.datapath import (
    PREAMBLE,
    PROBE_AUTH,
    PROBE_STATUS,
    FillingProtocol,
    FramingError,
    decode_request_meta,
    encode_answer,
    meta_lengths,
    request_id_of,
)
from akorun.transport.keys import PARTIAL_PATH, Opened, ack_body
from akorun.transport.ordered_lane import OrderedLane
from akorun.transport.sender import seconds_header
from akorun.transport.validation import (
    DamagedInTransit,
    NonFiniteValues,
    checked_header,
    partial_of,
)
from akorun.transport.wire import (
    HEADER_SIZE,
    BodyHasher,
    WireError,
)

if TYPE_CHECKING:
    from akorun.transport.server import Server

log = logging.getLogger("akorun")

IDLE_TIMEOUT_S = 75.0  # between requests; longer than the client's, so the client closes first
LINGER_S = 2.0  # after a refusal that ends the connection: bytes written behind it dropped
HASH_BATCH_BYTES = 256 * 1024  # body bytes handed to the hashing thread at a time
HASH_IN_THREAD_BYTES = 256 * 1024  # bodies from this size are hashed in a thread
class _Refused(Exception):
    """Answer `answer` and, unless `keep`, close the connection."""

    def __init__(self, answer: bytes, keep: bool) -> None:
        super().__init__()
        self.answer = answer
        self.keep = keep


class _Batcher:
    """Hands landed body bytes to an `OrderedLane` in pieces of `HASH_BATCH_BYTES`."""

    def __init__(self, lane: OrderedLane, hasher: BodyHasher, body: memoryview) -> None:
        self.lane, self.hasher, self.body = lane, hasher, body
        self.landed = 0
        self.fed = 0

    def __call__(self, piece: memoryview) -> None:
        self.landed += piece.nbytes
        if self.landed - self.fed >= HASH_BATCH_BYTES:
            self.flush()

    def flush(self) -> None:
        if self.landed > self.fed:
            self.lane.feed(self.hasher.update, self.body[self.fed:self.landed])
            self.fed = self.landed


class DataConnection(FillingProtocol):
    """One data-path connection of `server`, handed over by its guard."""

    def __init__(self, server: Server, guard: Any) -> None:
        super().__init__()
        self.server = server
        self.guard = guard
        self.task: asyncio.Task[None] | None = None
        self.request_id = 0  # the id of the request being served (its answer carries it)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.task = asyncio.get_running_loop().create_task(self.serve())

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.server.guards.pop(self.guard, None)

    def _trust(self) -> None:
        self.guard.trusted = True

    async def serve(self) -> None:
        first = True
        try:
            while True:
                preamble = bytearray(PREAMBLE.size)
                try:
                    await asyncio.wait_for(
                        self.fill(memoryview(preamble)),
                        self.server.header_deadline_s if first else IDLE_TIMEOUT_S)
                except TimeoutError:
                    if first:
                        self.server.host.metrics.rejected["header_too_slow"] += 1
                    return
                first = False
                raise_if_cancelling()  # a cancellation that wait_for returned over
                self.request_id = request_id_of(preamble)
                try:
                    answer, keep = await self.request(preamble)
                except _Refused as refused:
                    answer, keep = refused.answer, refused.keep
                if self.transport is None or self.transport.is_closing():
                    return
                self.transport.write(answer)
                if not keep:
                    if answer and self.transport.can_write_eof():
                        self.transport.write_eof()  # the answer, then the end: no reset
                        await self.drain_until_closed(LINGER_S)
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            if self.transport is not None and not self.transport.is_closing():
                self.transport.close()

    # ---------------------------------------------------------------- one request

    def _refusal(self, status: int, reason: str, detail: str, opened: Opened | None, *,
                 keep: bool = False) -> _Refused:
        host = self.server.host
        host.metrics.rejected[reason] += 1
        count = host.metrics.rejected[reason]
        if status != 503 and refusal_worth_logging(count, authenticated=opened is not None):
            so_far = "" if opened is not None else f" ({count} such so far)"
            log.warning("refused a request with %d %s%s: %s", status, reason, so_far, detail)
        text = f"{reason}: {detail}"[:ANSWER_TEXT_MAX_CHARS].encode("utf-8", "replace") + b"\n"
        tag = None if opened is None else host.verifier.seal_answer(opened, status, text)
        return _Refused(encode_answer(status, False, 0.0, tag, text, self.request_id), keep)

    def _wire_refusal(self, error: WireError, opened: Opened | None, *,
                      keep: bool = False) -> _Refused:
        refusal = wire_refusal(error)
        return self._refusal(refusal.status, refusal.reason, refusal.detail, opened, keep=keep)

    async def request(self, preamble: bytearray) -> tuple[bytes, bool]:
        """Read, check and apply one partial; its answer and whether to keep the connection."""
        start_s = time.perf_counter()
        server = self.server
        host = server.host
        admission = server.admission
        try:
            lengths = meta_lengths(preamble)
        except FramingError as error:
            raise self._refusal(400, "malformed", str(error), None) from None
        meta_nbytes = sum(lengths)
        head = bytearray(meta_nbytes + HEADER_SIZE)
        waits = ByteWaits()
        try:
            await waits.wait(asyncio.wait_for(self.fill(memoryview(head)),
                                              admission.header_deadline_s))
        except TimeoutError:
            host.metrics.rejected["header_too_slow"] += 1
            raise _Refused(b"", False) from None
        try:
            meta = decode_request_meta(memoryview(head)[:meta_nbytes], lengths)
        except FramingError as error:
            raise self._refusal(400, "malformed", str(error), None) from None
        if meta.auth == PROBE_AUTH:  # a sender asking whether the data path reaches us
            return encode_answer(PROBE_STATUS, False, 0.0, None, b"", self.request_id), True
        wire_head = bytes(memoryview(head)[meta_nbytes:])
        admitted = admission.admit_partial(host.verifier, meta.auth, PARTIAL_PATH, HEADER_SIZE,
                                           self._trust)
        refusal, opened = admitted.refusal, admitted.opened
        if refusal is not None:
            raise self._refusal(refusal.status, refusal.reason, refusal.detail, opened)
        assert opened is not None
        with admission.slot(opened.sender):
            return await self._read_partial(opened, meta.relay, meta.wire_s, wire_head,
                                            waits, start_s)

    async def _read_partial(self, opened: Opened, relay: str | None, wire_s_text: str | None,
                            wire_head: bytes, waits: ByteWaits,
                            start_s: float) -> tuple[bytes, bool]:
        server = self.server
        host = server.host
        try:
            header = checked_header(host.verifier, opened, wire_head,
                                    max_body_bytes=host.max_body_bytes(), codec=host.codec)
        except DamagedInTransit as error:
            raise self._refusal(400, DAMAGED, str(error), opened) from None
        except WireError as error:
            raise self._wire_refusal(error, opened) from None
        nbytes = header.body_nbytes
        values = server.buffers.take(header.length)
        hasher = server.body_hasher()
        body = memoryview(values.data).cast("B")[:nbytes]  # a coded body is shorter
        try:
            if nbytes >= HASH_IN_THREAD_BYTES:
                await self._fill_hashing_in_lane(body, hasher, nbytes, waits, opened)
            else:  # a small body: hashed on the loop (no thread hop)
                await self._fill(body, hasher.update, nbytes, waits, opened)
            del body
            try:
                hasher.check(header.digest)
            except WireError as error:  # the whole body was read: the connection stays usable
                raise self._refusal(400, DAMAGED, f"body: {error.reason}", opened,
                                    keep=True) from None
            return await self._apply(opened, header, values, relay, wire_s_text, waits,
                                     start_s)
        finally:
            server.buffers.give_back(values)

    async def _fill(self, body: memoryview, on_chunk: Any, nbytes: int, waits: ByteWaits,
                    opened: Opened) -> None:
        try:
            await waits.wait(asyncio.wait_for(self.fill(body, on_chunk),
                                              self.server.admission.body_deadline_s(nbytes)))
        except TimeoutError:
            raise self._refusal(503, "too_slow", "body slower than the minimum rate",
                                opened) from None

    async def _fill_hashing_in_lane(self, body: memoryview, hasher: BodyHasher, nbytes: int,
                                    waits: ByteWaits, opened: Opened) -> None:
        """Fill a large body while a lane thread hashes what has landed; returns once the
        lane is done with it, even on error, so that no body outlives its read slot."""
        server = self.server
        lane = server.take_digest_lane()
        batcher = _Batcher(lane, hasher, body)
        try:
            await self._fill(body, batcher, nbytes, waits, opened)
        finally:
            batcher.flush()
            drained = lane.drained()
            server.give_back_digest_lane(lane)
            await drained

    async def _apply(self, opened: Opened, header: Any, values: np.ndarray, relay: str | None,
                     wire_s_text: str | None, waits: ByteWaits,
                     start_s: float) -> tuple[bytes, bool]:
        host = self.server.host
        partial = partial_of(header, values)
        nbytes = HEADER_SIZE + header.body_nbytes
        wait_s = 0.0
        if host.downlink is not None:
            loop = asyncio.get_running_loop()
            arrived_s = loop.time()
            await host.downlink.admit(header.sender, nbytes, seconds_header(wire_s_text) or None)
            wait_s = loop.time() - arrived_s
        host.note_endorsements(partial.key, relay)
        try:
            accepted = await host.on_partial(partial, nbytes)
        except (SchemeError, KeyError) as error:
            raise self._refusal(400, "malformed", f"scheme refused the message: {error}",
                                opened, keep=True) from None
        except NonFiniteValues as error:  # recorded as zeros by the host (transport.validation)
            raise self._refusal(error.status, error.reason, str(error), opened,
                                keep=True) from None
        del partial
        duplicate = not accepted
        tag = host.verifier.seal_answer(opened, 200, ack_body(duplicate))
        counters = host.metrics.peer(header.sender)
        counters.software_receive_s += max(
            0.0, time.perf_counter() - start_s - waits.total_s - wait_s)
        counters.software_received += 1
        return encode_answer(200, duplicate, wait_s, tag, b"", self.request_id), True
