"""akorun's data path (akorun.transport.datapath*): partials without HTTP, under the HTTP
path's rules.

Pinned here: a partial arrives exactly once over one reused connection into pooled
buffers; unauthenticated bytes are refused untagged before a buffer is taken and the
connection is closed; a body altered on the way is answered ``damaged`` (tagged) and
sent again; an answer forged on the path (untagged, or declaring a huge text) is never
taken as the peer's refusal; a connection that never completes its preamble is closed;
HTTP still works on the same port.
"""

from __future__ import annotations

import asyncio
import socket
import uuid
from typing import Any

import numpy as np
import pytest

from akocore.messages import Kind, Partial
from akorun.launching.cluster import free_ports
from akorun.metrics import PeerCounters
from akorun.testing import SinkHost
from akorun.transport import wire
from akorun.transport.client import make_session
from akorun.transport.datapath import (
    ANSWER,
    PREAMBLE,
    decode_answer_head,
    encode_answer,
    encode_request_meta,
    meta_lengths,
)
from akorun.transport.keys import PARTIAL_PATH, PartialSealer
from akorun.transport.sender import Outcome, Outgoing, PeerSender, RetryPolicy
from akorun.transport.server import Server

pytestmark = pytest.mark.timeout(120)

SECRET = b"datapath test secret, 32 bytes!!"
RUN = uuid.uuid4().bytes
WIRE_HASH = bytes.fromhex("0011223344556677")
FAST = RetryPolicy(first_delay_s=0.001, max_delay_s=0.02)


def message(round_: int, length: int = 1 << 18) -> Outgoing:
    values = np.full(length, round_ + 0.5, dtype=np.float32)
    partial = Partial(Kind.GRAD, 0, round_, 0, 1, 0, length, values)
    return Outgoing(wire.encode_bytes(partial, run_id=RUN, config_hash=WIRE_HASH), Kind.GRAD,
                    round_, 0)


def data_sender(url: str, session: Any, host: SinkHost) -> PeerSender:
    return PeerSender(1, url + PARTIAL_PATH, session, counters=PeerCounters(), policy=FAST,
                      sealer=PartialSealer(host.peer_signer(0), PARTIAL_PATH), data_path=True)


async def with_server(host: SinkHost, body: Any, **start: Any) -> Any:
    (port,) = free_ports(1)
    server = Server(host, max_concurrent_reads=4)
    await server.start("127.0.0.1", port, **start)
    session = make_session(peers=1)
    try:
        return await body(f"http://127.0.0.1:{port}", session, server, port)
    finally:
        await session.close()
        await server.close()


def test_partials_arrive_once_over_one_connection_into_pooled_buffers() -> None:
    host = SinkHost(SECRET, RUN, WIRE_HASH)

    async def body(url: str, session: Any, server: Server, port: int) -> Any:
        sender = data_sender(url, session, host)
        outcomes = [await sender.attempt(message(round_)) for round_ in range(4)]
        outcomes.append(await sender.attempt(message(2)))  # sent again
        return sender, outcomes, server.buffers.allocated, server.buffers.reused

    sender, outcomes, allocated, reused = asyncio.run(with_server(host, body))
    assert outcomes == [Outcome.DELIVERED] * 4 + [Outcome.DUPLICATE]
    assert sorted(host.seen) == [(0, r, 0) for r in range(4)]  # the fifth: a duplicate
    assert sender.datalink is not None and sender.datalink.connects == 1
    assert allocated == 1 and reused == 4


def test_the_sink_sees_the_values_sent() -> None:
    host = SinkHost(SECRET, RUN, WIRE_HASH)
    seen: list[np.ndarray] = []
    original = host.on_partial

    async def keep(partial: Partial, nbytes: int) -> bool:
        assert partial.values is not None
        seen.append(np.array(partial.values))
        return await original(partial, nbytes)

    host.on_partial = keep  # type: ignore[method-assign]

    async def body(url: str, session: Any, server: Server, port: int) -> Outcome:
        return await data_sender(url, session, host).attempt(message(7, length=1000))

    assert asyncio.run(with_server(host, body)) is Outcome.DELIVERED
    assert len(seen) == 1 and np.all(seen[0] == 7.5) and seen[0].size == 1000


def _raw_exchange(port: int, request: bytes) -> tuple[bytes, bytes]:
    """Send `request` on a fresh data-path connection; (answer, what follows it)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as connection:
        connection.sendall(request)
        answer = b""
        while len(answer) < ANSWER.size:
            chunk = connection.recv(ANSWER.size - len(answer))
            if not chunk:
                break
            answer += chunk
        head = decode_answer_head(answer)
        rest = b""
        while True:
            chunk = connection.recv(65536)
            if not chunk:
                return answer, rest
            rest += chunk
            assert len(rest) <= head.tag_nbytes + head.text_nbytes


def test_a_forged_seal_is_refused_untagged_before_a_buffer_is_taken_and_closed() -> None:
    host = SinkHost(SECRET, RUN, WIRE_HASH)
    huge = message(0, length=1 << 24).data[:wire.HEADER_SIZE]  # declares a 64 MiB body

    async def body(url: str, session: Any, server: Server, port: int) -> Any:
        request = encode_request_meta("AAAA" * 40, None, None) + huge
        answer, rest = await asyncio.to_thread(_raw_exchange, port, request)
        return answer, rest, server.buffers.allocated

    answer, rest, allocated = asyncio.run(with_server(host, body))
    head = decode_answer_head(answer)
    assert head.status == 401 and head.tag_nbytes == 0  # untagged: the seal never opened
    assert rest.startswith(b"bad_signature")  # then the connection was closed
    assert allocated == 0 and host.arrivals == []
    assert host.metrics.rejected["bad_signature"] == 1


def test_texts_past_the_bound_are_refused_from_the_preamble() -> None:
    preamble = PREAMBLE.pack(b"AKOP", 1, 60000, 60000, 0)
    with pytest.raises(Exception, match="exceed"):
        meta_lengths(preamble)
    host = SinkHost(SECRET, RUN, WIRE_HASH)

    async def body(url: str, session: Any, server: Server, port: int) -> Any:
        return await asyncio.to_thread(_raw_exchange, port, preamble + bytes(1000))

    answer, rest = asyncio.run(with_server(host, body))
    assert decode_answer_head(answer).status == 400 and rest.startswith(b"malformed")


def test_a_body_altered_on_the_way_is_answered_damaged_and_sent_again() -> None:
    host = SinkHost(SECRET, RUN, WIRE_HASH)
    good = message(3)
    altered = bytearray(good.data)
    altered[-1] ^= 0xFF

    async def body(url: str, session: Any, server: Server, port: int) -> Any:
        sender = data_sender(url, session, host)
        first = await sender.attempt(Outgoing(bytes(altered), Kind.GRAD, 3, 0))
        second = await sender.attempt(good)
        return first, second, sender.counters.refused_for_good

    first, second, refused = asyncio.run(with_server(host, body))
    assert (first, second, refused) == (Outcome.RETRY, Outcome.DELIVERED, 0)
    assert [key for _, _, key in host.arrivals] == [(0, 3, 0)]
    assert host.metrics.rejected["damaged"] == 1


async def _fake_peer(answer: bytes) -> tuple[asyncio.Server, int]:
    """A listener that reads a request's first bytes and answers `answer` itself."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.read(65536)
            writer.write(answer)
            await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    (port,) = free_ports(1)
    return await asyncio.start_server(serve, "127.0.0.1", port), port


@pytest.mark.parametrize("answer", [
    encode_answer(400, False, 0.0, None, b"malformed: forged\n", 1),
    encode_answer(401, False, 0.0, "Zm9yZ2Vk", b"bad_signature: forged\n", 1),
    ANSWER.pack(b"AKOA", 1, 400, 0, 0.0, 0, 512 << 20),  # declares a 512 MiB text
    b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n",
], ids=["untagged", "wrong_tag", "huge_text", "not_an_answer"])
def test_an_answer_forged_on_the_path_is_not_final(answer: bytes) -> None:
    host = SinkHost(SECRET, RUN, WIRE_HASH)

    async def main() -> Any:
        listener, port = await _fake_peer(answer)
        session = make_session(peers=1)
        try:
            sender = data_sender(f"http://127.0.0.1:{port}", session, host)
            return await sender.attempt(message(1, length=64)), sender.counters
        finally:
            await session.close()
            listener.close()

    outcome, counters = asyncio.run(main())
    assert outcome is Outcome.RETRY
    assert counters.refused_for_good == 0 and counters.unauthentic_answers == 1


def test_a_preamble_that_never_completes_is_closed_at_the_header_deadline() -> None:
    host = SinkHost(SECRET, RUN, WIRE_HASH)

    def dribble(port: int) -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as connection:
            connection.sendall(b"AKOP\x10")
            return connection.recv(100)

    async def body(url: str, session: Any, server: Server, port: int) -> bytes:
        return await asyncio.to_thread(dribble, port)

    assert asyncio.run(with_server(host, body, header_deadline_s=0.3)) == b""
    assert host.metrics.rejected["header_too_slow"] == 1


def test_http_and_the_data_path_share_the_port() -> None:
    host = SinkHost(SECRET, RUN, WIRE_HASH)

    async def body(url: str, session: Any, server: Server, port: int) -> Any:
        over_http = PeerSender(1, url + PARTIAL_PATH, session, counters=PeerCounters(),
                               policy=FAST, sealer=PartialSealer(host.peer_signer(0),
                                                                 PARTIAL_PATH), data_path=False)
        assert over_http.datalink is None
        first = await over_http.attempt(message(0))
        second = await data_sender(url, session, host).attempt(message(1))
        async with session.get(url + "/status") as response:
            status = response.status
        return first, second, status

    assert asyncio.run(with_server(host, body)) == (Outcome.DELIVERED, Outcome.DELIVERED, 200)
    assert [key for _, _, key in host.arrivals] == [(0, 0, 0), (0, 1, 0)]


class _FakeTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.reading = True

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def is_closing(self) -> bool:
        return False


def test_the_filling_protocol_keeps_every_byte_in_order_and_reads_only_when_asked() -> None:
    """Bytes primed from the first read, a read that lands while no buffer is given, and
    reads straight into the given buffer come out in order; reading pauses as soon as
    bytes land while no buffer waits, and only then."""
    from akorun.transport.datapath import FillingProtocol

    async def main() -> tuple[bytes, bytes, list[bool]]:
        protocol = FillingProtocol()
        transport = _FakeTransport()
        protocol.connection_made(transport)
        reading = [transport.reading]  # paused until a buffer is given
        protocol.prime(b"abc")
        spare = protocol.get_buffer(-1)  # a read already under way as reading paused
        spare[:3] = b"def"
        protocol.buffer_updated(3)
        first = bytearray(4)
        await protocol.fill(memoryview(first))  # from what was kept: no read needed
        reading.append(transport.reading)
        second = bytearray(6)
        seen: list[bytes] = []

        async def feed() -> None:
            await asyncio.sleep(0)
            reading.append(transport.reading)  # resumed for the buffer
            target = protocol.get_buffer(-1)
            target[:4] = b"ghij"
            protocol.buffer_updated(4)

        feeder = asyncio.ensure_future(feed())
        await protocol.fill(memoryview(second), lambda piece: seen.append(bytes(piece)))
        await feeder
        reading.append(transport.reading)  # left on between one reader's fills
        spare = protocol.get_buffer(-1)  # bytes that land while no buffer waits ...
        spare[:2] = b"kl"
        protocol.buffer_updated(2)
        reading.append(transport.reading)  # ... are kept, and reading pauses
        third = bytearray(2)
        await protocol.fill(memoryview(third))
        assert seen == [b"ef", b"ghij"]
        return bytes(first), bytes(second) + bytes(third), reading

    first, second, reading = asyncio.run(main())
    assert (first, second) == (b"abcd", b"efghijkl")
    assert reading == [False, False, True, True, False]
