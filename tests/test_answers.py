"""Answers nobody on the path can abuse: forged refusals are not final, bodies are bounded.

A small asyncio TCP proxy on 127.0.0.1 stands between a sender (akorun.transport.sender,
akorun.transport.client) and a real akorun.transport.server.Server:
it forwards requests and answers,
except the ones it is told to answer itself, as an attacker on the path (or a broken
middlebox) would: a forged ``HTTP/1.1 400`` to a partial, or an answer that declares
512 MiB. These tests pin that the message is not lost (it arrives exactly once), that
the forged answer is never taken as the peer's refusal, and that an oversized answer
is refused before it is read (the proxy cannot push more than socket buffers hold).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from akocore.messages import Kind, Partial
from akorun.launching.cluster import free_ports
from akorun.metrics import PeerCounters
from akorun.testing import SinkHost
from akorun.transport import wire
from akorun.transport.answers import (
    CONTROL_ANSWER_MAX_BYTES,
    DAMAGED,
    Verdict,
    verdict,
)
from akorun.transport.client import ControlClient, make_session
from akorun.transport.control import ControlKind
from akorun.transport.datapath import (
    ANSWER,
    PREAMBLE,
    decode_answer_head,
    encode_answer,
    meta_lengths,
    request_id_of,
)
from akorun.transport.datapath import (
    MAGIC as DATA_PATH_MAGIC,
)
from akorun.transport.keys import PARTIAL_PATH, PartialSealer
from akorun.transport.sender import Outgoing, PeerSender, RetryPolicy
from akorun.transport.server import Server

pytestmark = pytest.mark.timeout(120)

SECRET = b"answers test secret, 32 bytes!!!"
RUN = uuid.uuid4().bytes
WIRE_HASH = bytes.fromhex("8899aabbccddeeff")
FAST = RetryPolicy(first_delay_s=0.001, max_delay_s=0.02)
HUGE_BYTES = 512 << 20

Forge = Callable[[int, bytes], bytes | None]  # (request number, request head) -> own answer


def message(round_: int, length: int = 256) -> Outgoing:
    values = np.full(length, round_ + 0.25, dtype=np.float32)
    partial = Partial(Kind.GRAD, 0, round_, 0, 1, 0, length, values)
    return Outgoing(wire.encode_bytes(partial, run_id=RUN, config_hash=WIRE_HASH), Kind.GRAD,
                    round_, 0)


class Proxy:
    """Forwards HTTP/1.1 requests with a Content-Length to `upstream`; request number n
    (from 0) is answered by `forge(n, head)` instead when that returns bytes (then the
    connection is closed). `huge` requests get a 503 declaring `HUGE_BYTES`, streamed
    until the client goes away; `pushed` counts what the client let through.
    Partials on akorun's data path (akorun.transport.datapath) are forwarded too; a forged HTTP
    answer to one goes back in the data path's framing, untagged, as a forger there
    would send it."""

    def __init__(self, upstream_port: int, forge: Forge, *, huge: set[int] | None = None,
                 upstream_host: str = "127.0.0.1", port: int | None = None):
        self.upstream_port = upstream_port
        self.upstream_host = upstream_host
        self.port = port
        self.forge = forge
        self.huge = huge or set()
        self.requests = 0
        self.forged = 0
        self.pushed = 0
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        port = self.port if self.port is not None else free_ports(1)[0]
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", port,
                                                 reuse_address=True)
        return port

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        try:
            while True:
                head, body = await _read_message(reader)
                if head is None:
                    return
                number = self.requests
                self.requests += 1
                if number in self.huge:
                    await self._push_huge(writer)
                    return
                datapath = head.startswith(DATA_PATH_MAGIC)
                own = self.forge(number, head)
                if own is not None:
                    self.forged += 1
                    writer.write(as_datapath_answer(own, request_id_of(head)) if datapath else own)
                    await writer.drain()
                    if datapath:  # then the end, as the server does: requests written
                        writer.write_eof()  # behind it are dropped, not reset
                        with contextlib.suppress(TimeoutError):
                            while await asyncio.wait_for(reader.read(1 << 16), 2.0):
                                pass
                    return
                if upstream is None:
                    upstream = await asyncio.open_connection(self.upstream_host,
                                                             self.upstream_port)
                upstream[1].write(head + body)
                await upstream[1].drain()
                answer_head, answer_body = await (
                    _read_datapath_answer(upstream[0]) if datapath
                    else _read_message(upstream[0]))
                if answer_head is None:
                    return
                writer.write(answer_head + answer_body)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            writer.close()
            if upstream is not None:
                upstream[1].close()

    async def _push_huge(self, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\n"
                     b"Content-Length: %d\r\n\r\n" % HUGE_BYTES)
        chunk = bytes(1 << 20)
        try:
            while self.pushed < HUGE_BYTES:
                writer.write(chunk)
                await asyncio.wait_for(writer.drain(), 2.0)
                self.pushed += len(chunk)
        except (ConnectionError, TimeoutError):
            return


async def _read_message(reader: asyncio.StreamReader) -> tuple[bytes | None, bytes]:
    """One HTTP message (head, body) with a Content-Length, or one data-path request
    (preamble, texts and wire header; body); (None, b"") at EOF."""
    try:
        start = await reader.readexactly(len(DATA_PATH_MAGIC))
        if start == DATA_PATH_MAGIC:
            preamble = start + await reader.readexactly(PREAMBLE.size - len(start))
            texts = await reader.readexactly(sum(meta_lengths(preamble)))
            header = await reader.readexactly(wire.HEADER_SIZE)
            length = int.from_bytes(header[60:68], "little")
            return preamble + texts + header, await reader.readexactly(4 * length)
        head = start + await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None, b""
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return head, await reader.readexactly(length)


async def _read_datapath_answer(reader: asyncio.StreamReader) -> tuple[bytes | None, bytes]:
    try:
        head = await reader.readexactly(ANSWER.size)
        parsed = decode_answer_head(head)
        return head, await reader.readexactly(parsed.tag_nbytes + parsed.text_nbytes)
    except asyncio.IncompleteReadError:
        return None, b""


def as_datapath_answer(http_answer: bytes, request_id: int) -> bytes:
    """An HTTP answer's status and body in the data path's framing, with no tag, as the
    answer to request `request_id` (a forger on the path sees the request's id)."""
    head, _, body = http_answer.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return encode_answer(status, False, 0.0, None, body, request_id)


def forged_answer(status: int, text: bytes) -> bytes:
    location = b"Location: http://127.0.0.1:9/v1/partial\r\n" if 300 <= status < 400 else b""
    return (b"HTTP/1.1 %d Refused\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n"
            b"%sConnection: close\r\n\r\n%s" % (status, len(text), location, text))


async def through_proxy(host: SinkHost, proxy_of: Callable[[int], Proxy],
                        body: Callable[[str, Any, Proxy], Awaitable[Any]]) -> Any:
    """Run `body(proxy_url, session, proxy)` against a live server for `host`."""
    (port,) = free_ports(1)
    server = Server(host, max_concurrent_reads=4)
    await server.start("127.0.0.1", port)
    proxy = proxy_of(port)
    proxy_port = await proxy.start()
    session = make_session(peers=1)
    try:
        return await body(f"http://127.0.0.1:{proxy_port}", session, proxy)
    finally:
        await session.close()
        await proxy.close()
        await server.close()


def sender_through(url: str, session: Any, host: SinkHost) -> PeerSender:
    return PeerSender(1, url + PARTIAL_PATH, session, counters=PeerCounters(), policy=FAST,
                      sealer=PartialSealer(host.peer_signer(0), PARTIAL_PATH))


def is_partial(head: bytes) -> bool:
    return head.startswith((b"POST " + PARTIAL_PATH.encode(), DATA_PATH_MAGIC))


@pytest.mark.parametrize("status", [307, 400, 401, 409, 413, 422])
def test_a_refusal_forged_on_the_path_is_not_final_and_the_message_arrives_once(
        status: int) -> None:
    """The proxy answers the second partial itself with a refusal of `status`: the sender
    does not drop it (no tag bound to its request), sends it again, and every message
    arrives exactly once; nothing is recorded as refused for good."""
    host = SinkHost(SECRET, RUN, WIRE_HASH)
    partials = iter(range(1000))

    def forge(number: int, head: bytes) -> bytes | None:
        if is_partial(head) and next(partials) == 1:
            return forged_answer(status, b"malformed: forged by the path\n")
        return None

    async def body(url: str, session: Any, proxy: Proxy) -> PeerSender:
        sender = sender_through(url, session, host)
        sender.start()
        for round_ in range(4):
            await sender.put(message(round_))
        await asyncio.wait_for(sender.wait(lambda: sender.idle), 30)
        await sender.stop()
        assert proxy.forged == 1
        return sender

    sender = asyncio.run(through_proxy(host, lambda port: Proxy(port, forge), body))
    assert sorted(key for _, _, key in host.arrivals) == [(0, r, 0) for r in range(4)]
    assert sender.counters.refused_for_good == 0 and not sender.counters.send_dropped
    assert sender.counters.unauthentic_answers == 1
    assert sender.counters.messages_sent == 4 and sender.acked_round == 3


def test_a_forged_200_is_not_an_acknowledgement() -> None:
    host = SinkHost(SECRET, RUN, WIRE_HASH)

    def forge(number: int, head: bytes) -> bytes | None:
        if number == 0:
            text = b'{"duplicate": false}'
            return (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                    b"%d\r\nX-Ako-Duplicate: 0\r\nConnection: close\r\n\r\n%s"
                    % (len(text), text))
        return None

    async def body(url: str, session: Any, proxy: Proxy) -> PeerSender:
        sender = sender_through(url, session, host)
        sender.start()
        await sender.put(message(0))
        await asyncio.wait_for(sender.wait(lambda: sender.idle), 30)
        await sender.stop()
        return sender

    sender = asyncio.run(through_proxy(host, lambda port: Proxy(port, forge), body))
    assert [key for _, _, key in host.arrivals] == [(0, 0, 0)]
    assert sender.counters.unauthentic_answers == 1


def test_an_answer_declaring_512_mib_is_not_read_and_the_message_still_arrives() -> None:
    """Three 512 MiB 503 answers (the proxy's own) to one partial: none is read (the
    sender closes the connection at the header; the proxy gets no further than socket
    buffers hold), the message stays owed and arrives once after them."""
    host = SinkHost(SECRET, RUN, WIRE_HASH)
    proxies: list[Proxy] = []

    def make(port: int) -> Proxy:
        proxies.append(Proxy(port, lambda number, head: None, huge={0, 1, 2}))
        return proxies[0]

    async def body(url: str, session: Any, proxy: Proxy) -> PeerSender:
        sender = sender_through(url, session, host)
        sender.start()
        await sender.put(message(0))
        await asyncio.wait_for(sender.wait(lambda: sender.idle), 60)
        await sender.stop()
        await asyncio.sleep(0.1)  # the proxy's pushes see the closed connections
        return sender

    sender = asyncio.run(through_proxy(host, make, body))
    assert [key for _, _, key in host.arrivals] == [(0, 0, 0)]
    assert sender.counters.unauthentic_answers == 3
    assert proxies[0].pushed < 64 << 20, proxies[0].pushed  # not 3 x 512 MiB


def test_a_control_answer_over_its_cap_is_not_read() -> None:
    """A control answer declaring 512 MiB (a 503 from the path) and a 200 past the JSON
    cap are both refused unread: the call fails (status 0), it does not grow memory."""
    host = SinkHost(SECRET, RUN, WIRE_HASH)

    async def body(url: str, session: Any, proxy: Proxy) -> list[Any]:
        client = ControlClient(session, host.peer_signer(0), [url, url])
        first = await client.call(1, ControlKind.HEARTBEAT, {"rank": 0})
        second = await client.call(1, ControlKind.HEARTBEAT, {"rank": 0})
        await asyncio.sleep(0.1)
        return [first, second, proxy.pushed]

    def forge(number: int, head: bytes) -> bytes | None:
        if number == 1:
            return (b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n"
                    % (CONTROL_ANSWER_MAX_BYTES + 1)) + bytes(1 << 16)
        return None

    first, second, pushed = asyncio.run(through_proxy(
        host, lambda port: Proxy(port, forge, huge={0}), body))
    assert first.status == 0 and "cap" in first.error
    assert second.status == 0 and "cap" in second.error
    assert pushed < 64 << 20


def test_a_tagged_refusal_of_a_control_request_is_authentic_and_a_forged_one_is_not() -> None:
    host = SinkHost(SECRET, RUN, WIRE_HASH)

    def forge(number: int, head: bytes) -> bytes | None:
        return forged_answer(409, b"refused: forged\n") if number == 1 else None

    async def body(url: str, session: Any, proxy: Proxy) -> list[Any]:
        client = ControlClient(session, host.peer_signer(0), [url, url])
        real = await client.call(1, ControlKind.STOP, {"rank": 0, "round": 1})
        forged = await client.call(1, ControlKind.STOP, {"rank": 0, "round": 1})
        return [real, forged]

    real, forged = asyncio.run(through_proxy(host, lambda port: Proxy(port, forge), body))
    assert real.status == 409 and real.authentic  # SinkHost refuses STOP, tagged
    assert forged.status == 409 and not forged.authentic


def test_untagged_answers_and_unauthenticated_refusals_are_logged_at_a_falling_pace(
        caplog: pytest.LogCaptureFixture) -> None:
    """Anyone on the path can send untagged 200s and unsealed requests as fast as they like:
    the client's and the server's lines for them come at the 1st, 2nd, 4th, 8th... only."""
    host = SinkHost(SECRET, RUN, WIRE_HASH)
    text = b'{"rank": 1}'
    forged_200 = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                  b"%d\r\nConnection: close\r\n\r\n%s" % (len(text), text))

    async def body(url: str, session: Any, proxy: Proxy) -> list[int]:
        client = ControlClient(session, host.peer_signer(0), [url, url])
        statuses = [(await client.call(1, ControlKind.STOP, {"rank": 0})).status
                    for _ in range(9)]
        server_url = f"http://127.0.0.1:{proxy.upstream_port}"
        for _ in range(9):  # unsealed requests straight to the server
            async with session.post(server_url + PARTIAL_PATH, data=b"x" * 16) as answer:
                statuses.append(answer.status)
        return statuses

    with caplog.at_level("WARNING", logger="akorun"):
        statuses = asyncio.run(through_proxy(
            host, lambda port: Proxy(port, lambda number, head: forged_200), body))
    assert statuses[:9] == [401] * 9 and all(s in (400, 401) for s in statuses[9:])
    lines = [r.getMessage() for r in caplog.records]
    untagged = [line for line in lines if "without a tag bound to our request" in line]
    assert [line.split("(")[-1] for line in untagged] == [
        f"{n} such so far)" for n in (1, 2, 4, 8)], untagged
    refused = [line for line in lines if line.startswith("refused a request")]
    assert 1 <= len(refused) <= 4 and all("such so far" in line for line in refused), refused


def test_the_verdict_on_answers() -> None:
    assert verdict(400, b"malformed: x\n", True) is Verdict.REFUSED
    assert verdict(400, DAMAGED.encode() + b": body cut\n", True) is Verdict.RETRY
    assert verdict(400, b"malformed: x\n", False) is Verdict.RETRY
    assert verdict(503, b"inbox_full: x\n", True) is Verdict.RETRY
    assert verdict(409, b"wrong_run: x\n", True) is Verdict.REFUSED


def test_a_storm_of_broken_connections_logs_one_line_each_no_traceback_and_stays_bounded(
        caplog: pytest.LogCaptureFixture) -> None:
    """300 connections at once: a third send a request line over aiohttp's limit
    (LineTooLong), a third start a partial and reset the connection mid-body, a third
    just connect and reset. The server logs no traceback, never holds more connections
    than its cap (64 here: the oldest never authenticated ones are closed first), and a
    member's sender, connected before the storm, still delivers during and after it."""
    import logging
    import socket
    import struct

    host = SinkHost(SECRET, RUN, WIRE_HASH)
    caplog.set_level(logging.DEBUG)

    async def body(url: str, session: Any) -> tuple[int, int, PeerSender]:
        port = int(url.rsplit(":", 1)[1])
        loop = asyncio.get_running_loop()
        most = 0

        async def one(kind: int) -> None:
            sock = socket.socket()
            sock.setblocking(False)
            try:
                await loop.sock_connect(sock, ("127.0.0.1", port))
                if kind == 0:
                    await loop.sock_sendall(sock, b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\n\r\n")
                elif kind == 1:
                    await loop.sock_sendall(
                        sock, b"POST /v1/partial HTTP/1.1\r\nHost: x\r\nContent-Length: "
                              b"100000\r\n\r\n" + bytes(5000))
                await asyncio.sleep(0.05)
            except OSError:
                pass
            finally:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                sock.close()  # an RST

        async def watch() -> None:
            nonlocal most
            while True:
                most = max(most, len(server.guards))
                await asyncio.sleep(0.001)

        sender = PeerSender(1, url + PARTIAL_PATH, session, counters=PeerCounters(),
                            policy=FAST, sealer=PartialSealer(host.peer_signer(0), PARTIAL_PATH))
        sender.start()
        await sender.put(message(0))
        await asyncio.wait_for(sender.wait(lambda: sender.idle), 30)
        watcher = asyncio.create_task(watch())
        storm = asyncio.gather(*(one(i % 3) for i in range(300)))
        await sender.put(message(1))
        await storm
        await asyncio.sleep(0.3)
        watcher.cancel()
        await sender.put(message(2))
        await asyncio.wait_for(sender.wait(lambda: sender.idle), 30)
        await sender.stop()
        return most, server.max_connections, sender

    (port,) = free_ports(1)
    server = Server(host, max_concurrent_reads=4)
    server.max_connections = 64

    async def main() -> tuple[int, int, PeerSender]:
        await server.start("127.0.0.1", port)
        session = make_session(peers=1)
        try:
            return await body(f"http://127.0.0.1:{port}", session)
        finally:
            await session.close()
            await server.close()

    most, cap, _ = asyncio.run(main())
    assert sorted(key for _, _, key in host.arrivals) == [(0, 0, 0), (0, 1, 0), (0, 2, 0)]
    assert most <= cap == 64
    assert host.metrics.rejected["evicted_connection"] >= 1
    assert not [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]
    assert host.metrics.rejected["bad_connection"] >= 1
    lines = [r for r in caplog.records if "connection dropped" in r.getMessage()]
    assert len(lines) <= 5 + 300 // 100


def test_a_run_with_a_refusal_forged_in_front_of_a_rank_ends_with_equal_replicas(
        tmp_path: Path) -> None:
    """3 ranks; rank 2 listens on 127.0.0.2 and the others reach it through a proxy on its
    cluster-file address that answers the 20th partial itself with ``HTTP/1.1 400``. The
    message is sent again (the 400 carries no tag for it), every rank exits 0 and the
    replicas are equal within the run's bound (they were 2.6e-3 apart when a 400 was
    final)."""
    import threading

    from akorun.testing import LocalCluster

    tables = {"cluster": {"workers": 3}, "exchange": {"p": 2, "ssp": 1},
              "train": {"workload": "digits-mlp", "optimizer": "sgd", "lr": 0.1,
                        "rounds": 30, "eval_every": 1000}}
    with LocalCluster(tmp_path, tables) as cluster:
        host, port = cluster.config.cluster.hosts[2].rsplit(":", 1)
        assert host == "127.0.0.1"
        partials = iter(range(10_000))

        def forge(number: int, head: bytes) -> bytes | None:
            if is_partial(head) and next(partials) == 20:
                return forged_answer(400, b"malformed: forged by the path\n")
            return None

        proxy = Proxy(int(port), forge, upstream_host="127.0.0.2", port=int(port))
        loop = asyncio.new_event_loop()
        started = threading.Event()

        def serve() -> None:
            asyncio.set_event_loop(loop)
            loop.run_until_complete(proxy.start())
            started.set()
            loop.run_forever()

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        assert started.wait(10)
        try:
            cluster.start(0, "--quiet")
            cluster.start(1, "--quiet")
            cluster.start(2, "--quiet", "--listen", "127.0.0.2")
            codes = cluster.wait_all(150)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(5)
        assert codes == {0: 0, 1: 0, 2: 0}, cluster.logs()
        assert proxy.forged == 1
        results = {rank: cluster.result(rank) for rank in range(3)}
        assert sum(r["unauthentic_answers"] for r in results.values()) == 1
        assert all(not r["refused_for_good"] for r in results.values())
        replicas = [cluster.params(rank) for rank in range(3)]
        for rank in (1, 2):
            np.testing.assert_allclose(replicas[rank], replicas[0], rtol=1e-5, atol=1e-6,
                                       err_msg=f"replica {rank} differs from replica 0")


def test_a_run_whose_messages_are_refused_for_good_exits_non_zero_and_says_so(
        tmp_path: Path) -> None:
    """Every rank sends a NaN gradient in its last round, past its own check (the
    send_nonfinite test hook: a member whose guard failed): every receiver refuses those
    partials with a tagged 422 (recorded as zeros there), so the replicas cannot be equal.
    The first receiver stops the run naming the sender and the reason and tells every
    peer: each rank writes its result and exits 1 with that line, instead of exiting 0.
    (A rank's own non-finite step never leaves it: tests/test_user_nan.py.)"""
    from akorun.testing import LocalCluster

    tables = {"cluster": {"workers": 3}, "exchange": {"p": 1, "ssp": 0},
              "train": {"workload": "digits-mlp", "optimizer": "sgd", "lr": 0.05,
                        "rounds": 8, "eval_every": 1000}}
    with LocalCluster(tmp_path, tables) as cluster:
        cluster.start_all("--quiet", env={"AKORUN_FAULT": "send_nonfinite:7"})
        codes = cluster.wait_all(150)
        assert codes == {0: 1, 1: 1, 2: 1}, cluster.logs()
        for rank in range(3):
            assert cluster.result(rank)["rounds"] <= 8  # its result is written
            log = cluster.log(rank)
            # the first receiver stops the run naming the member (every rank told)
            assert "sent data a correct member never sends" in log, log
            assert "non-finite value(s)" in log and "Traceback" not in log, log
