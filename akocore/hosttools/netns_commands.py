"""The `ip` commands that build a netns testbed: namespaces, veth pairs, a bridge, addresses.

Each function returns argv tuples (pure: nothing is run here). A veth end is created
inside its namespace, so deleting the namespaces removes every device; every name
the callers pass carries their process id, so runs at the same time never collide.
"""

from __future__ import annotations

from collections.abc import Callable

HOST_TOOLS = ("ip", "tc")  # iproute2: what every netns testbed needs on the host

Argv = tuple[str, ...]


def missing_requirements(euid: int, has_tool: Callable[[str], bool]) -> str | None:
    """What a host with effective user id `euid` and the tools `has_tool` says it has
    lacks for a netns testbed, in one line, or None."""
    if euid != 0:
        return "needs root (network namespaces, veth, bridges and tc qdiscs)"
    missing = [tool for tool in HOST_TOOLS if not has_tool(tool)]
    if missing:
        return f"needs the {' and '.join(f'`{t}`' for t in missing)} command (iproute2)"
    return None


def namespace_add(name: str) -> Argv:
    return ("ip", "netns", "add", name)


def namespace_delete(name: str) -> Argv:
    return ("ip", "netns", "del", name)


def bridge_up(namespace: str, bridge: str) -> list[Argv]:
    """A bridge in `namespace`, up."""
    return [("ip", "-n", namespace, "link", "add", bridge, "type", "bridge"),
            ("ip", "-n", namespace, "link", "set", bridge, "up")]


def veth_pair(device: str, namespace: str, peer_device: str, peer_namespace: str, *,
              mac: str | None = None, peer_mac: str | None = None,
              mtu_bytes: int | None = None) -> Argv:
    """A veth pair whose ends are created inside their namespaces (optional fixed MACs
    and MTU)."""

    def end(name: str, where: str, address: str | None) -> list[str]:
        words = [name, "netns", where]
        if address is not None:
            words += ["address", address]
        if mtu_bytes is not None:
            words += ["mtu", str(mtu_bytes)]
        return words

    return ("ip", "link", "add", *end(device, namespace, mac), "type", "veth", "peer",
            "name", *end(peer_device, peer_namespace, peer_mac))


def bridge_port(namespace: str, port: str, bridge: str) -> Argv:
    """`port` enslaved to `bridge` and up."""
    return ("ip", "-n", namespace, "link", "set", port, "master", bridge, "up")


def address_up(namespace: str, device: str, address: str, prefix_bits: int = 24) -> list[Argv]:
    """`address` on `device`, the device and the namespace's loopback up."""
    return [("ip", "-n", namespace, "addr", "add", f"{address}/{prefix_bits}", "dev", device),
            ("ip", "-n", namespace, "link", "set", device, "up"),
            ("ip", "-n", namespace, "link", "set", "lo", "up")]
