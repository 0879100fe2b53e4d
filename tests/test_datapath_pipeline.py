"""akorun's data path with several requests in flight on one connection (pipelining).

Pinned here: a peer's requests share one connection, several written before the
first is answered, while the receiver reads one at a time (one read slot, one body
buffer: what is written ahead waits in the socket buffers); answers are matched to
requests by id in whatever order they come; an answer to no waiting request (a
duplicate) ends the connection and every request on it goes again; an answer
replayed from another request (the right id, another request's tag) is not trusted;
a connection cut with requests in flight loses none of them (each arrives exactly
once after the sender's retries).
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import pytest

from akorun.launching.cluster import free_ports
from akorun.testing import SinkHost
from akorun.transport import wire
from akorun.transport.datapath import (
    ANSWER,
    PREAMBLE,
    FramingError,
    decode_answer_head,
    encode_answer,
    meta_lengths,
    request_id_of,
)
from akorun.transport.datapath_client import DataLink
from akorun.transport.sender import Outcome
from akorun.transport.server import Server
from tests.test_datapath import RUN, SECRET, WIRE_HASH, data_sender, message, with_server

pytestmark = pytest.mark.timeout(120)


class HeldSink(SinkHost):
    """A sink whose applies wait for `release`, counting how many run at once."""

    def __init__(self) -> None:
        super().__init__(SECRET, RUN, WIRE_HASH)
        self.release = asyncio.Event()
        self.entered = asyncio.Event()
        self.applying = 0
        self.most_applying = 0

    async def on_partial(self, partial: Any, nbytes: int) -> bool:
        self.applying += 1
        self.most_applying = max(self.most_applying, self.applying)
        self.entered.set()
        try:
            await self.release.wait()
            return await super().on_partial(partial, nbytes)
        finally:
            self.applying -= 1


def test_requests_are_pipelined_on_one_connection_and_read_one_at_a_time() -> None:
    async def body(url: str, session: Any, server: Server, port: int) -> Any:
        host = server.host
        sender = data_sender(url, session, host)
        assert sender.datalink is not None and sender.window == sender.datalink.depth == 3
        sender.start()
        for round_ in range(8):
            await sender.put(message(round_))
        await host.entered.wait()  # the first is being applied, held
        most_in_flight = 0
        for _ in range(60):  # the sender writes ahead up to its depth, no further
            most_in_flight = max(most_in_flight, sender.datalink.in_flight)
            await asyncio.sleep(0.005)
        reads_while_held = server.admission.active_reads
        host.release.set()
        await sender.wait(lambda: sender.idle, poll_s=0.01)
        await sender.stop()
        return (most_in_flight, reads_while_held, host.most_applying, sender.datalink.connects,
                server.buffers.allocated, sender.counters.retries)

    host = HeldSink()
    in_flight, reads, applying, connects, allocated, retries = asyncio.run(
        with_server(host, body))
    assert in_flight == 3  # several written before the first was answered ...
    assert reads == 1 and applying == 1 and allocated == 1  # ... read and applied one by one
    assert connects == 1 and retries == 0
    assert [key for _, _, key in host.arrivals] == [(0, r, 0) for r in range(8)]  # in order


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    """One whole data-path request (preamble, texts, wire message) off a stream."""
    preamble = await reader.readexactly(PREAMBLE.size)
    texts = await reader.readexactly(sum(meta_lengths(preamble)))
    header = await reader.readexactly(wire.HEADER_SIZE)
    length = int.from_bytes(header[60:68], "little")
    return preamble + texts + header + await reader.readexactly(4 * length)


async def _scripted_peer(answers: Any) -> tuple[asyncio.Server, int]:
    """A listener that reads two requests, then writes `answers(id1, id2)` at once."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            first = await _read_request(reader)
            second = await _read_request(reader)
            writer.write(answers(request_id_of(first), request_id_of(second)))
            await writer.drain()
            await reader.read()  # until the client goes away
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    (port,) = free_ports(1)
    return await asyncio.start_server(serve, "127.0.0.1", port), port


def _two_exchanges(answers: Any) -> list[Any]:
    async def main() -> list[Any]:
        listener, port = await _scripted_peer(answers)
        link = DataLink("127.0.0.1", port)
        try:
            return await asyncio.wait_for(asyncio.gather(
                *(link.exchange("seal", None, None, message(r, 64).data, 4096)
                  for r in range(2)), return_exceptions=True), 20)
        finally:
            link.close()
            listener.close()

    return asyncio.run(main())


def test_answers_out_of_order_are_matched_by_id() -> None:
    first, second = _two_exchanges(lambda one, two: (
        encode_answer(200, True, 0.0, "dHdv", b"two", two)
        + encode_answer(200, False, 0.0, "b25l", b"one", one)))
    assert (first.text, first.tag, first.duplicate) == (b"one", "b25l", False)
    assert (second.text, second.tag, second.duplicate) == (b"two", "dHdv", True)


def test_an_answer_to_no_waiting_request_ends_the_connection() -> None:
    first, second = _two_exchanges(lambda one, two: (
        encode_answer(200, False, 0.0, "b25l", b"one", one)
        + encode_answer(200, False, 0.0, "b25l", b"one", one)))  # the same answer twice
    assert first.text == b"one"
    assert isinstance(second, FramingError)  # not taken as the second's answer


class _ReplayingProxy:
    """Forwards a data-path connection to `upstream`; the answer to the client's request
    number `replay_as` (from 1) is replaced by the first answer's bytes under its id."""

    def __init__(self, upstream_port: int, replay_as: int) -> None:
        self.upstream_port = upstream_port
        self.replay_as = replay_as
        self.replayed = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)

        async def forward() -> None:
            while data := await reader.read(1 << 16):
                up_writer.write(data)
                await up_writer.drain()

        pump = asyncio.ensure_future(forward())
        first: bytes | None = None
        try:
            while True:
                head = await up_reader.readexactly(ANSWER.size)
                parsed = decode_answer_head(head)
                answer = head + await up_reader.readexactly(parsed.tag_nbytes +
                                                            parsed.text_nbytes)
                if first is None:
                    first = answer
                if parsed.request_id == self.replay_as:
                    answer = first[:4] + struct.pack("<I", parsed.request_id) + first[8:]
                    self.replayed += 1
                writer.write(answer)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            pump.cancel()
            writer.close()
            up_writer.close()


def test_an_answer_replayed_from_another_request_is_not_trusted() -> None:
    host = SinkHost(SECRET, RUN, WIRE_HASH)

    async def body(url: str, session: Any, server: Server, port: int) -> Any:
        proxy = _ReplayingProxy(port, replay_as=2)
        (proxy_port,) = free_ports(1)
        listener = await asyncio.start_server(proxy.serve, "127.0.0.1", proxy_port)
        try:
            sender = data_sender(f"http://127.0.0.1:{proxy_port}", session, host)
            outcomes = await asyncio.gather(*(sender.attempt(message(r)) for r in range(3)))
            return outcomes, proxy.replayed, sender.counters.unauthentic_answers
        finally:
            listener.close()

    outcomes, replayed, unauthentic = asyncio.run(with_server(host, body))
    assert replayed == 1 and unauthentic == 1
    assert outcomes == [Outcome.DELIVERED, Outcome.RETRY, Outcome.DELIVERED]
    assert sorted(key for _, _, key in host.arrivals) == [(0, r, 0) for r in range(3)]


def test_a_connection_cut_with_requests_in_flight_loses_none_of_them() -> None:
    async def body(url: str, session: Any, server: Server, port: int) -> Any:
        host = server.host
        sender = data_sender(url, session, host)
        sender.start()
        for round_ in range(6):
            await sender.put(message(round_))
        await host.entered.wait()
        for _ in range(2000):  # until three are in flight (10 s at most)
            if sender.datalink is not None and sender.datalink.in_flight == 3:
                break
            await asyncio.sleep(0.005)
        assert sender.datalink is not None and sender.datalink.in_flight == 3
        for connection in list(server.data_connections):  # the peer goes away mid-way
            assert connection.transport is not None
            connection.transport.abort()
        host.release.set()
        await sender.wait(lambda: sender.idle, poll_s=0.01)
        await sender.stop()
        return sender.counters, sender.datalink.connects if sender.datalink else 0

    host = HeldSink()
    counters, connects = asyncio.run(with_server(host, body))
    assert connects >= 2 and counters.retries >= 3  # every request in flight went again
    assert counters.refused_for_good == 0 and counters.messages_sent == 6
    assert sorted(host.seen) == [(0, r, 0) for r in range(6)]  # each applied exactly once


def test_a_write_under_way_ends_when_the_connection_fails_beside_it() -> None:
    """A peer that reads nothing and answers a request never made: the connection ends,
    and the request whose body is still being written fails at once instead of waiting
    forever on a socket closed under it."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(encode_answer(200, False, 0.0, None, b"", 99))
        await writer.drain()
        await asyncio.sleep(30)  # reads nothing: the client's write cannot finish
        writer.close()

    async def main() -> Any:
        (port,) = free_ports(1)
        listener = await asyncio.start_server(serve, "127.0.0.1", port)
        link = DataLink("127.0.0.1", port)
        body = bytes(64 << 20)  # far more than the socket buffers hold
        try:
            return await asyncio.wait_for(asyncio.gather(
                link.exchange("seal", None, None, body, 4096), return_exceptions=True), 20)
        finally:
            link.close()
            listener.close()

    (outcome,) = asyncio.run(main())
    assert isinstance(outcome, (OSError, FramingError)), outcome
