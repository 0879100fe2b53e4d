"""A rank's endpoints: ``host:port`` entries of cluster.hosts split, and the networks
``[akorun] allow`` lets in (what the rank's server checks every peer's address against).

The runtime needs these to listen and to let its peers in; the launcher (akorun.launching)
uses them too when it writes and checks a cluster file.
"""

from __future__ import annotations

import ipaddress
import socket

from akocore.settings.schema import ALLOW_HOSTS
from akorun.errors import UsageError

__all__ = ["allowed_networks", "split_host", "url_host"]


def split_host(entry: str) -> tuple[str, int]:
    """``host:port`` / ``[v6]:port`` -> (host, port)."""
    host, _, port = entry.rpartition(":")
    return host.strip("[]"), int(port)


def url_host(host: str) -> str:
    """A host as a URL spells it: an IPv6 address in brackets."""
    return f"[{host}]" if ":" in host else host


def allowed_networks(allow: tuple[str, ...], hosts: tuple[str, ...]
                     ) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    """The networks `[akorun] allow` lets in: its addresses and networks, and for "hosts"
    every address the entries of cluster.hosts resolve to (empty: no allow-list).
    UsageError when a host of cluster.hosts does not resolve."""
    networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
    for item in allow:
        if item != ALLOW_HOSTS:
            networks.append(ipaddress.ip_network(item, strict=False))
            continue
        for entry in hosts:
            host = split_host(entry)[0]
            try:
                infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
            except OSError as error:
                raise UsageError(f"akorun.allow = hosts: cannot resolve {host!r} of "
                                 f"cluster.hosts: {error.strerror or error}") from None
            networks += [ipaddress.ip_network(str(info[4][0]).split("%")[0])
                         for info in infos]
    return tuple(dict.fromkeys(networks))
