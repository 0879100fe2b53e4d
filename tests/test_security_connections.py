"""Connections before any request: the peer address allow-list and the HTTP header deadline.

A real akorun.transport.server.Server (behind a sink host) on 127.0.0.1. The
allow-list test connects from 127.0.0.2 (another loopback source address)
and from 127.0.0.1; the deadline test dribbles a request header a byte at a
time and is cut off, while a client that pauses between whole requests on
one kept-alive connection is not.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import time
import uuid

import pytest

from akocore.settings.normalise import ConfigError
from akocore.settings.schema import AkorunConfig
from akorun.launching.cluster import free_ports
from akorun.runtime.endpoints import allowed_networks
from akorun.testing import SinkHost
from akorun.transport.server import Server

pytestmark = pytest.mark.timeout(60)

STATUS_REQUEST = b"GET /status HTTP/1.1\r\nHost: rank\r\n\r\n"


async def serving(host: SinkHost, **start: object) -> tuple[Server, int]:
    (port,) = free_ports(1)
    server = Server(host)
    await server.start("127.0.0.1", port, **start)  # type: ignore[arg-type]
    return server, port


def connect(port: int, source: str) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(20)
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    return sock


def read_answer(sock: socket.socket) -> bytes:
    """What the server sends before closing or within one answer; b"" if it closed at once."""
    try:
        return sock.recv(65536)
    except ConnectionResetError:
        return b""


def test_a_peer_outside_the_allow_list_is_closed_before_any_read() -> None:
    host = SinkHost(b"allow-list test secret, 32 bytes", uuid.uuid4().bytes, bytes(8))

    def client(port: int, source: str, request: bool) -> bytes:
        with connect(port, source) as sock:
            if request:
                sock.sendall(STATUS_REQUEST)
            return read_answer(sock)

    async def body() -> list[bytes]:
        server, port = await serving(host, allow=(ipaddress.ip_network("127.0.0.1"),))
        try:
            return [await asyncio.to_thread(client, port, "127.0.0.2", False),
                    await asyncio.to_thread(client, port, "127.0.0.2", True),
                    await asyncio.to_thread(client, port, "127.0.0.1", True)]
        finally:
            await server.close()

    silent, refused, allowed = asyncio.run(body())
    assert silent == b"" and refused == b""  # closed with nothing said, whether it spoke or not
    assert allowed.startswith(b"HTTP/1.1 200")
    assert host.metrics.rejected["not_allowed"] == 2


def test_a_client_dribbling_its_header_is_disconnected_and_a_pausing_one_is_not() -> None:
    host = SinkHost(b"deadline test secret, 32 bytes!!", uuid.uuid4().bytes, bytes(8))

    def dribble(port: int) -> tuple[int, bytes]:
        """Send the header a byte every 50 ms (never finishing); bytes sent before the cut."""
        with connect(port, "127.0.0.1") as sock:
            sent = 0
            header = b"POST /v1/partial HTTP/1.1\r\nHost: rank\r\n" + b"X-Pad: " + b"a" * 4000
            try:
                for byte in header:
                    sock.sendall(bytes([byte]))
                    sent += 1
                    time.sleep(0.05)
            except (BrokenPipeError, ConnectionResetError):
                return sent, b""
            return sent, read_answer(sock)

    def pause_between_requests(port: int) -> list[bytes]:
        answers = []
        with connect(port, "127.0.0.1") as sock:
            for _ in range(2):
                sock.sendall(STATUS_REQUEST)
                answers.append(read_answer(sock)[:12])
                time.sleep(1.0)  # idle twice the header deadline: not a slow header
        return answers

    async def body() -> tuple[tuple[int, bytes], list[bytes]]:
        server, port = await serving(host, header_deadline_s=0.5)
        try:
            return await asyncio.gather(asyncio.to_thread(dribble, port),
                                        asyncio.to_thread(pause_between_requests, port))
        finally:
            await server.close()

    (sent, after), answers = asyncio.run(body())
    assert sent < 4000 and after == b""  # cut off long before the header could end
    assert answers == [b"HTTP/1.1 200"] * 2
    assert host.metrics.rejected["header_too_slow"] == 1


def test_the_allow_list_setting_takes_addresses_networks_or_the_cluster_hosts() -> None:
    assert AkorunConfig(allow="10.0.0.1, 10.0.1.0/24").allow == ("10.0.0.1", "10.0.1.0/24")
    with pytest.raises(ConfigError, match="akorun.allow"):
        AkorunConfig(allow=["node-7"])
    networks = allowed_networks(("hosts", "10.9.0.0/16"), ("localhost:7000", "10.0.0.2:7000"))
    assert {ipaddress.ip_network("127.0.0.1"), ipaddress.ip_network("10.0.0.2"),
            ipaddress.ip_network("10.9.0.0/16")} <= set(networks)
    assert allowed_networks((), ("10.0.0.2:7000",)) == ()
