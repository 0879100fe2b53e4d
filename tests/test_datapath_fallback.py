"""A path that carries only HTTP (akorun.transport.path_check): found, said once, and
partials go as HTTP POSTs; a peer that answers nothing at all is no such verdict.

The middlebox here is a small TCP proxy in front of the peer's port that forwards a
connection whose first bytes are an HTTP method and holds any other (it reads and
answers nothing, as a proxy waiting for a request line does).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import numpy as np
import pytest

from akorun.launching.cluster import free_ports
from akorun.testing import SinkHost
from akorun.transport.datapath_client import DataLink
from akorun.transport.sender import Outcome
from akorun.transport.server import Server
from tests.test_datapath import RUN, SECRET, WIRE_HASH, data_sender, message, with_server

pytestmark = pytest.mark.timeout(120)

HTTP_METHODS = (b"GET ", b"POST", b"PUT ", b"HEAD")


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    writer.close()


async def proxy(target_port: int, *, forward_http: bool, host: str = "127.0.0.1",
                upstream_host: str = "127.0.0.1", port: int | None = None) -> Any:
    """A proxy on `host`:`port` (a free port if None) to `upstream_host`:`target_port`:
    HTTP forwarded when `forward_http`, anything else held unanswered (its bytes read
    and dropped). Returns (the server, its port), or the server when `port` is given."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            first = await reader.readexactly(4)
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()
            return
        if not (forward_http and first in HTTP_METHODS):
            with contextlib.suppress(ConnectionError):
                while await reader.read(65536):
                    pass  # held: never forwarded, never answered
            writer.close()
            return
        upstream_reader, upstream_writer = await asyncio.open_connection(upstream_host,
                                                                         target_port)
        upstream_writer.write(first)
        await asyncio.gather(_pipe(reader, upstream_writer), _pipe(upstream_reader, writer))

    if port is not None:
        return await asyncio.start_server(handle, host, port)
    (free,) = free_ports(1)
    return await asyncio.start_server(handle, host, free), free


def test_a_probe_is_answered_by_the_peer_and_changes_nothing() -> None:
    host = SinkHost(SECRET, RUN, WIRE_HASH)

    async def body(url: str, session: Any, server: Server, port: int) -> Any:
        link = DataLink("127.0.0.1", port)
        return await link.probe(5.0), link.connects

    assert asyncio.run(with_server(host, body)) == (True, 0)  # its own connection
    assert host.arrivals == []


def test_behind_a_proxy_that_carries_only_http_partials_go_as_http_posts() -> None:
    host = SinkHost(SECRET, RUN, WIRE_HASH)

    async def body(url: str, session: Any, server: Server, port: int) -> Any:
        middlebox, proxy_port = await proxy(port, forward_http=True)
        try:
            sender = data_sender(f"http://127.0.0.1:{proxy_port}", session, host)
            link = sender.datalink
            assert link is not None and await link.probe(2.0) is False
            first = await asyncio.wait_for(sender.attempt(message(3, length=1000)), 60)
            second = await sender.attempt(message(3, length=1000))
            return first, second, sender
        finally:
            middlebox.close()

    first, second, sender = asyncio.run(with_server(host, body))
    assert first is Outcome.RETRY  # abandoned on the data path once the check said so
    assert second is Outcome.DELIVERED  # as an HTTP POST through the proxy
    assert sender.datalink is None and sender.path_check.http_only
    assert [key for _, _, key in host.arrivals] == [(0, 3, 0)]


def test_a_peer_that_answers_nothing_at_all_keeps_the_data_path() -> None:
    """A paused or cut-off peer is silent on HTTP too: no fallback (the request waits)."""
    host = SinkHost(SECRET, RUN, WIRE_HASH)

    async def body(url: str, session: Any, server: Server, port: int) -> Any:
        middlebox, proxy_port = await proxy(port, forward_http=False)
        try:
            sender = data_sender(f"http://127.0.0.1:{proxy_port}", session, host)
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(sender.attempt(message(0, length=1000)), 8)
            return sender
        finally:
            middlebox.close()

    sender = asyncio.run(with_server(host, body))
    assert sender.datalink is not None and not sender.path_check.http_only
    assert not sender.path_check.verified
    assert host.arrivals == []


def test_a_run_behind_a_proxy_that_carries_only_http_finishes_with_equal_replicas(
        tmp_path) -> None:
    """Two ranks on loopback; rank 1 listens on 127.0.0.2 and its cluster-file address
    127.0.0.1 is the proxy's: rank 0's partials to it fall back to HTTP POSTs (one line),
    rank 1's to rank 0 keep the data path; both end exit 0 with equal replicas."""
    import threading

    from akorun.testing import LocalCluster

    run_tables = {"cluster": {"workers": 2}, "exchange": {"p": 2, "ssp": 0},
                  "train": {"workload": "digits-mlp", "optimizer": "sgd", "lr": 0.1,
                            "rounds": 30, "eval_every": 1000}}
    loop = asyncio.new_event_loop()
    with LocalCluster(tmp_path, run_tables) as cluster:
        port = int(cluster.config.cluster.hosts[1].rsplit(":", 1)[1])
        middlebox = loop.run_until_complete(
            proxy(port, forward_http=True, host="127.0.0.1", upstream_host="127.0.0.2",
                  port=port))
        thread = threading.Thread(target=loop.run_forever, daemon=True)
        thread.start()
        try:
            cluster.start(0, "--quiet")
            cluster.start(1, "--quiet", "--listen", "127.0.0.2")
            assert cluster.wait_all(120) == {0: 0, 1: 0}, cluster.logs()
        finally:
            loop.call_soon_threadsafe(middlebox.close)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
        assert "the data path gets no answer while HTTP does" in cluster.log(0)
        assert "the data path gets no answer" not in cluster.log(1)
        np.testing.assert_allclose(cluster.params(1), cluster.params(0), rtol=1e-5,
                                   atol=1e-6)
