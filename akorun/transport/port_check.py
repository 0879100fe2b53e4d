"""Whether a rank's port is free, asked before anything slow loads.

`akorun worker` (and so every rank `akorun launch` starts) calls
`check_port_free` before it imports the user's workload or JAX: a port that
another process listens on is refused at once with one line naming it (exit 2),
not after half a minute of loading. The probe binds the address for an instant
with SO_REUSEADDR, as the server does; any other failure (an unknown host, an
address of another machine) is left to the server, which names it when it
listens. `port_taken_line` is that line, the server's too.
"""

from __future__ import annotations

import errno
import socket

from akorun.errors import UsageError

__all__ = ["check_port_free", "port_taken_line"]


def port_taken_line(port: int, host: str, rank: int) -> str:
    """The one line for a port another process holds."""
    return (f"port {port} on {host} is in use (rank {rank}); stop what holds it or write a "
            f"new cluster file with `akorun init`")


def check_port_free(host: str, port: int, rank: int) -> None:
    """UsageError (`port_taken_line`) when `host`:`port` is in use; anything else passes."""
    try:
        addresses = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                       flags=socket.AI_PASSIVE)
    except OSError:
        return
    for family, kind, proto, _, address in addresses:
        try:
            probe = socket.socket(family, kind, proto)
        except OSError:
            continue
        with probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:  # as asyncio's server binds it
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                probe.bind(address)
            except OSError as error:
                if error.errno == errno.EADDRINUSE:
                    raise UsageError(port_taken_line(port, host, rank)) from None
