"""In front of aiohttp: who may connect, how long a header may take, HTTP or the data path.

`ConnectionGuard` is the protocol of every accepted connection of an
akorun.transport.server `Server`: a peer outside the allow-list (`peer_allowed`)
is closed before any byte is read; past the server's connection bound the oldest
never-authenticated connection is evicted; a request's HTTP header must be complete
within the server's header deadline (aiohttp bounds only idle connections); and the
first bytes tell an HTTP request from the data path (``AKOP``: the connection is
handed to akorun.transport.datapath_server). `ConnectionLog` is what aiohttp's
connection handler logs through: a reset or malformed connection is one counted
line, never a traceback.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import ssl
from typing import TYPE_CHECKING, Any

from aiohttp import http_exceptions

from akorun.metrics import Metrics
from akorun.transport.datapath import MAGIC as DATA_PATH_MAGIC
from akorun.transport.datapath_server import DataConnection

if TYPE_CHECKING:
    from akorun.transport.server import Server

log = logging.getLogger("akorun")

_QUIET_ERRORS: tuple[type[BaseException], ...] = (
    ConnectionError, asyncio.IncompleteReadError, TimeoutError, ssl.SSLError,
    http_exceptions.HttpProcessingError)
_LOUD_FIRST = 5  # connection errors logged one line each; then one line per 100



class ConnectionLog:
    """What aiohttp's connection handler logs through (its ``logger``): a peer that resets
    its connection or sends a malformed request (a storm of them, or noise on the port)
    is one counted line, never a traceback; any other exception keeps its traceback
    (a bug here)."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def debug(self, *args: Any, **kwargs: Any) -> None:
        log.debug(*args, **kwargs)

    def warning(self, *args: Any, **kwargs: Any) -> None:
        log.warning(*args, **kwargs)

    def exception(self, message: str, *args: Any, exc_info: Any = True,
                  **kwargs: Any) -> None:
        error = exc_info if isinstance(exc_info, BaseException) else None
        if not isinstance(error, _QUIET_ERRORS):
            log.error(message, *args, exc_info=exc_info, **kwargs)
            return
        self.metrics.rejected["bad_connection"] += 1
        count = self.metrics.rejected["bad_connection"]
        if count <= _LOUD_FIRST or count % 100 == 0:
            log.warning("connection dropped (%d so far): %s: %s", count, type(error).__name__,
                        str(error).splitlines()[0][:200] if str(error) else "")


AllowList = tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]


def peer_allowed(allow: AllowList, peername: Any) -> bool:
    """The connection's peer address is in `allow` (an empty list lets everyone in)."""
    if not allow:
        return True
    try:
        address = ipaddress.ip_address(peername[0])
    except (TypeError, ValueError, IndexError):
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return any(address in network for network in allow)


class ConnectionGuard(asyncio.Protocol):
    """One accepted connection, in front of aiohttp's own handler of it.

    A peer outside the allow-list is closed in `connection_made`, before any byte
    is read. Otherwise the aiohttp handler is made and gets every event; the
    guard closes the connection when a request's HTTP header (request line and
    header fields) is not complete `header_deadline_s` after the connection was
    made or after the first byte of a later request: aiohttp itself bounds only
    idle connections (its keep-alive timeout), not one that dribbles its header.
    """

    def __init__(self, owner: Server) -> None:
        self.owner = owner
        self.inner: asyncio.Protocol | None = None
        self.refused = False
        self.first_bytes = bytearray()  # until they tell the data path from HTTP
        self.transport: asyncio.Transport | None = None
        self.in_request = False
        self.trusted = False  # a request on it passed its seal (a member's connection)
        self.deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        if not peer_allowed(self.owner.allow, transport.get_extra_info("peername")):
            self.owner.host.metrics.rejected["not_allowed"] += 1
            self.refused = True
            transport.abort()
            return
        if len(self.owner.guards) >= self.owner.max_connections and \
                not self.owner.evict_untrusted():  # bounded memory: each holds buffers
            self.owner.host.metrics.rejected["too_many_connections"] += 1
            self.refused = True
            transport.abort()
            return
        self.owner.guards[self] = self  # keyed by its aiohttp handler once there is one
        self._arm()

    def _to_http(self) -> None:
        assert self.owner.runner is not None and self.owner.runner.server is not None
        assert self.transport is not None
        self.inner = self.owner.runner.server()
        if self.owner.guards.pop(self, None) is not None:
            self.owner.guards[self.inner] = self
        self.inner.connection_made(self.transport)

    def _to_data_path(self, first_bytes: bytes) -> None:
        """Hand the connection to akorun.transport.datapath_server (it keeps its own deadlines)."""
        assert self.transport is not None
        self._disarm()
        connection = DataConnection(self.owner, self)
        connection.prime(first_bytes)
        self.transport.set_protocol(connection)
        connection.connection_made(self.transport)
        self.owner.data_connections.add(connection)

    def _arm(self) -> None:
        if self.deadline is None:
            self.deadline = asyncio.get_running_loop().call_later(
                self.owner.header_deadline_s, self._too_slow)

    def _disarm(self) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None

    def _too_slow(self) -> None:
        self.deadline = None
        if not self.in_request and self.transport is not None:
            self.owner.host.metrics.rejected["header_too_slow"] += 1
            self.transport.abort()

    def request_started(self) -> None:
        self.in_request = True
        self._disarm()

    def request_ended(self) -> None:
        self.in_request = False

    def data_received(self, data: bytes) -> None:
        if self.refused:
            return
        if self.inner is None:  # the connection's first bytes: HTTP or the data path?
            self.first_bytes += data
            seen = bytes(self.first_bytes)
            if len(seen) < len(DATA_PATH_MAGIC) and DATA_PATH_MAGIC.startswith(seen):
                return
            self.first_bytes = bytearray()
            if seen.startswith(DATA_PATH_MAGIC):
                self._to_data_path(seen)
                return
            self._to_http()
            data = seen
            assert self.inner is not None
        if not self.in_request:
            self._arm()  # the first bytes of the next request: its header has a deadline
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.inner is not None else None

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self.owner.guards.pop(self, None)
        if self.inner is not None:
            self.owner.guards.pop(self.inner, None)
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_writing()
