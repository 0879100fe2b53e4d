"""Network namespaces, a bridge and veth pairs: the testbed's lifecycle.

`NetnsTestbed` owns the kernel objects of one run: one namespace per rank,
joined by a veth pair to a bridge in a hub namespace of its own (the root
namespace gets no device, no address and no route); with latency the hub
routes through the delay line instead of bridging (akorun.launching.testbed.delaypath).
Every veth end has a fixed MAC (`rank_mac`, `hub_mac`) so the routed hub
needs no ARP. Every name carries the
run's tag, ``akotb<pid>``, so runs at the same time never collide, and every
veth is created inside its namespaces, so deleting the namespaces (`down`)
removes everything. `remove_stale` deletes what an earlier run with the same
prefix left behind when it was killed (its pid no longer lives).

The commands' text is akocore.hosttools' (shared with ``akosim calibrate
--netns-rate`` and the analysis probes). `run_command` runs an `ip`/`tc`
command and raises `TestbedError` (a usage error: exit status 2, one line)
naming the command and the kernel's answer.
`entered(namespace)` switches the calling thread into a namespace for a
moment (setns(2)), so the launcher can poll a rank's /status from the root
namespace's process without any route into the testbed.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

from akocore.hosttools.netns_commands import (
    address_up,
    bridge_port,
    bridge_up,
    namespace_add,
    namespace_delete,
    veth_pair,
)
from akocore.hosttools.netns_commands import missing_requirements as host_lacks
from akocore.hosttools.shaping import NodeDevices
from akorun.errors import UsageError
from akorun.launching.testbed.delaypath import hub_mac, rank_mac

PREFIX = "akotb"
SUBNET_PREFIX = "10.77.0"
SUBNET = f"{SUBNET_PREFIX}.0/24"
MAX_RANKS = 250
RANK_PORT = 7070
MTU_BYTES = 1500
COMMAND_TIMEOUT_S = 20.0
CLONE_NEWNET = 0x40000000
_NAME = re.compile(rf"^{PREFIX}(\d+)(?:h|n\d+)$")


class TestbedError(UsageError):
    """The testbed cannot be built here (no root, a tool missing, the kernel refused)."""


def missing_requirements(euid: int | None = None) -> str | None:
    """What this machine lacks for a netns testbed, in one line, or None."""
    return host_lacks(os.geteuid() if euid is None else euid,
                      lambda tool: shutil.which(tool) is not None)


def run_command(argv: tuple[str, ...]) -> str:
    """Run one ip/tc command; its stdout, or TestbedError naming it and the answer."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise TestbedError(f"testbed: `{' '.join(argv)}` failed: {error}") from None
    if done.returncode != 0:
        answer = " ".join(done.stderr.split()) or f"exit status {done.returncode}"
        raise TestbedError(f"testbed: `{' '.join(argv)}` failed: {answer}")
    return done.stdout


def namespaces() -> list[str]:
    """The names `ip netns list` shows."""
    return [line.split()[0] for line in run_command(("ip", "netns", "list")).splitlines()
            if line.strip()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale() -> list[str]:
    """Delete testbed namespaces whose run (the pid in their name) is gone; their names."""
    removed = []
    for name in namespaces():
        match = _NAME.match(name)
        if match and not _alive(int(match.group(1))):
            subprocess.run(namespace_delete(name), capture_output=True,
                           timeout=COMMAND_TIMEOUT_S, check=False)
            removed.append(name)
    return removed


@dataclass(frozen=True)
class TestbedNames:
    """Every name of one run's testbed (devices: at most 15 characters)."""

    tag: str  # akotb<pid>
    workers: int

    @classmethod
    def for_pid(cls, pid: int, workers: int) -> TestbedNames:
        return cls(f"{PREFIX}{pid}", workers)

    @property
    def short(self) -> str:
        return "tb" + self.tag[len(PREFIX):]

    @property
    def hub(self) -> str:
        return f"{self.tag}h"

    @property
    def bridge(self) -> str:
        return f"{self.short}br"

    @property
    def tun(self) -> str:
        """The delay line's TUN device in the hub (routed testbeds only)."""
        return f"{self.short}dl"

    def namespace(self, rank: int) -> str:
        return f"{self.tag}n{rank}"

    def device(self, rank: int) -> str:
        return f"{self.short}r{rank}"

    def bridge_port(self, rank: int) -> str:
        return f"{self.short}p{rank}"

    def all_namespaces(self) -> tuple[str, ...]:
        return (self.hub, *(self.namespace(r) for r in range(self.workers)))

    def address(self, rank: int) -> str:
        return f"{SUBNET_PREFIX}.{rank + 1}"

    def node(self, rank: int) -> NodeDevices:
        return NodeDevices(rank=rank, namespace=self.namespace(rank), device=self.device(rank),
                           hub_namespace=self.hub, bridge_port=self.bridge_port(rank),
                           address=self.address(rank))


class NetnsTestbed:
    """Creates and deletes the namespaces, bridge and veth pairs of one run."""

    def __init__(self, names: TestbedNames) -> None:
        if names.workers > MAX_RANKS:
            raise TestbedError(f"testbed: {names.workers} ranks; the netns testbed holds at "
                               f"most {MAX_RANKS} (one /24 subnet)")
        self.names = names
        self.commands: list[str] = []  # every command run, for the record
        self._created: list[str] = []

    def run(self, *argv: str) -> str:
        self.commands.append(" ".join(argv))
        return run_command(tuple(argv))

    def up(self, *, bridged: bool = True) -> None:
        """The namespaces and veth pairs; with `bridged`, the bridge and the ranks'
        addresses too (else akorun.launching.testbed.delaypath routes and addresses them)."""
        names = self.names
        for name in names.all_namespaces():
            self._created.append(name)  # before: a half-made namespace is deleted too
            self.run(*namespace_add(name))
        if bridged:
            self.apply(tuple(bridge_up(names.hub, names.bridge)))
        for rank in range(names.workers):
            node = names.node(rank)
            self.run(*veth_pair(node.device, node.namespace, node.bridge_port,
                                node.hub_namespace, mac=rank_mac(rank), peer_mac=hub_mac(rank),
                                mtu_bytes=MTU_BYTES))
            if not bridged:
                continue
            self.run(*bridge_port(names.hub, node.bridge_port, names.bridge))
            self.apply(tuple(address_up(node.namespace, node.device, node.address)))

    def apply(self, commands: tuple[tuple[str, ...], ...]) -> None:
        for argv in commands:
            self.run(*argv)

    def down(self) -> list[str]:
        """Delete every namespace of this run (their veths and the bridge go with them);
        the names that could not be deleted."""
        left = []
        present = set(namespaces()) if shutil.which("ip") else set()
        for name in dict.fromkeys([*self._created, *self.names.all_namespaces()]):
            if name not in present:
                continue
            done = subprocess.run(namespace_delete(name), capture_output=True,
                                  timeout=COMMAND_TIMEOUT_S, check=False)
            if done.returncode != 0:
                left.append(name)
        self._created.clear()
        return left

    def read_sysctl(self, rank: int, key: str) -> str:
        """A network sysctl as rank `rank`'s namespace sees it ("" when unreadable)."""
        path = "/proc/sys/" + key.replace(".", "/")
        try:
            with entered(self.names.namespace(rank)), open(path, encoding="ascii") as handle:
                return handle.read().strip()
        except OSError:
            return ""


_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))


@contextlib.contextmanager
def entered(namespace: str) -> Iterator[None]:
    """Run the body with the calling thread in network namespace `namespace`.

    Sockets opened inside stay in that namespace; the thread comes back to its
    own namespace on leaving (OSError if the namespace cannot be entered)."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        target = os.open(f"/run/netns/{namespace}", os.O_RDONLY)
        try:
            _setns(target)
        finally:
            os.close(target)
        try:
            yield
        finally:
            _setns(own)
    finally:
        os.close(own)
