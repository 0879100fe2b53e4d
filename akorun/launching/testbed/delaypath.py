"""The testbed's delayed path: routes through the delay line, its limits, its process.

With latency, the hub namespace routes instead of bridging, so that every
rank-to-rank packet crosses the delay line (akorun.launching.testbed.delayline):

- each rank's veth end has its address as a /32 and one route to the testbed
  subnet via a gateway address that exists only as a permanent neighbour
  entry (the hub-side veth's fixed MAC): no ARP, no bridge;
- in the hub, packets from any veth go (policy rule, table `DELAY_TABLE`) to
  the TUN device the delay line reads; packets the line writes back come in
  on that device and follow the main table: one /32 route per rank to its
  veth, with a permanent neighbour entry for the rank's fixed MAC.

So a packet crosses: the sender's uplink shaping (tc, its veth), the delay
line (one-way delay of its pair), the receiver's downlink shaping (tc, the
hub-side veth towards it). `plan_delay_path` is pure (the ip commands, before
and after the line starts);
`check_delay` refuses what the line cannot realise faithfully;
`DelayLineProcess` starts the line in the hub and stops it.

Limits (measured, docs/design/link-emulation.md): the line adds about
0.1-0.3 ms per direction (the timer's lateness plus two forwarding hops), so
one-way delays below `MIN_DELAY_S` are refused; it is one Python process
carrying every rank's traffic, so the ranks' uplinks together may not exceed
`MAX_LINE_BPS`.
"""

from __future__ import annotations

import contextlib
import json
import select
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from akorun.errors import UsageError
from akorun.launching.testbed.delayline import DelaySchedule

MIN_DELAY_S = 2e-3  # one-way; below it the line's own 0.1-0.3 ms would be > 10 %
MAX_DELAY_S = 1.0  # one-way; the line holds rate x delay bytes in memory
MAX_LINE_BPS = 1e9  # what the ranks can send at once; 2.3 Gbit/s measured unshaped
DELAY_TABLE = "200"
GATEWAY_SUFFIX = "254"  # the ranks' gateway: a neighbour entry, no device holds it
TXQUEUE_PACKETS = 10000
READY_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 5.0


def rank_mac(rank: int) -> str:
    return f"02:77:00:00:{rank >> 8:02x}:{rank & 0xFF:02x}"


def hub_mac(rank: int) -> str:
    return f"02:77:00:01:{rank >> 8:02x}:{rank & 0xFF:02x}"


@dataclass(frozen=True)
class RankPort:
    """One rank's veth pair as the routed hub sees it."""

    rank: int
    namespace: str
    device: str
    hub_port: str
    address: str


def line_load_bps(uplink_bps: np.ndarray, link_bps: np.ndarray) -> float:
    """The most the ranks can send at once: each node's uplink, or the sum of its pair
    caps when that is smaller, summed over the nodes."""
    caps = np.where(np.eye(len(uplink_bps), dtype=bool), 0.0, link_bps)
    return float(np.sum(np.minimum(uplink_bps, caps.sum(axis=1))))


def check_delay(latency_s: np.ndarray, load_bps: float, jitter_s: float) -> None:
    """UsageError (one line) when the delay line cannot realise these delays faithfully."""
    off_diagonal = latency_s[~np.eye(len(latency_s), dtype=bool)]
    positive = off_diagonal[off_diagonal > 0]
    if positive.size and positive.min() < MIN_DELAY_S:
        raise UsageError(f"--testbed netns: one-way latency {positive.min() * 1e3:g} ms is "
                         f"below the delay line's floor of {MIN_DELAY_S * 1e3:g} ms (its own "
                         f"0.1-0.3 ms would be more than 10 %); use 0 or at least "
                         f"{MIN_DELAY_S * 1e3:g} ms")
    if off_diagonal.max(initial=0.0) > MAX_DELAY_S:
        raise UsageError(f"--testbed netns: one-way latency {off_diagonal.max():g} s is above "
                         f"the delay line's {MAX_DELAY_S:g} s")
    smallest_s = float(positive.min()) if positive.size else 0.0
    if jitter_s < 0 or jitter_s > smallest_s:
        raise UsageError(f"--testbed-jitter: got {jitter_s * 1e3:g} ms; allowed 0 up to the "
                         f"smallest non-zero one-way latency ({smallest_s * 1e3:g} ms)")
    if load_bps > MAX_LINE_BPS:
        raise UsageError(f"--testbed netns: the ranks can send {load_bps / 1e6:g} Mbit/s "
                         f"at once (uplinks, or pair caps where smaller); with latency the "
                         f"delay line carries at most {MAX_LINE_BPS / 1e6:g} Mbit/s in total "
                         f"(lower network.bandwidth, or set network.latency = 0)")


def gateway(subnet_prefix: str) -> str:
    return f"{subnet_prefix}.{GATEWAY_SUFFIX}"


@dataclass(frozen=True)
class DelayPathPlan:
    """The ip commands of the delayed path, in two steps around the line's start."""

    before_line: tuple[tuple[str, ...], ...]  # devices, addresses, routes to the ranks
    after_line: tuple[tuple[str, ...], ...]  # the TUN device up, the routes into it


def plan_delay_path(hub: str, tun: str, ports: Sequence[RankPort], subnet: str,
                    subnet_prefix: str) -> DelayPathPlan:
    """The ip/sysctl commands that route every rank-to-rank packet through `tun` in `hub`
    (the veths exist, made with `rank_mac`/`hub_mac`; nothing addressed yet).

    The TUN device comes up only once the line is attached (`after_line`): bringing it
    up with its carrier on activates its queue at once, whereas a device already up
    whose carrier comes on later waits for the kernel's link watch, and a first packet
    (a SYN) sent meanwhile was dropped (1 connect in 12 paid a 1 s SYN retry)."""
    via = gateway(subnet_prefix)
    before: list[tuple[str, ...]] = [
        ("ip", "netns", "exec", hub, "sysctl", "-qw", "net.ipv4.ip_forward=1",
         "net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.default.rp_filter=0",
         "net.ipv4.conf.all.send_redirects=0"),
        ("ip", "-n", hub, "tuntap", "add", "dev", tun, "mode", "tun", "vnet_hdr"),
    ]
    for port in ports:
        before += [
            ("ip", "-n", port.namespace, "addr", "add", f"{port.address}/32", "dev",
             port.device),
            ("ip", "-n", port.namespace, "link", "set", port.device, "up"),
            ("ip", "-n", port.namespace, "link", "set", "lo", "up"),
            ("ip", "-n", port.namespace, "route", "add", via, "dev", port.device, "scope",
             "link"),
            ("ip", "-n", port.namespace, "route", "add", subnet, "via", via, "dev",
             port.device),
            ("ip", "-n", port.namespace, "neigh", "add", via, "lladdr", hub_mac(port.rank),
             "dev", port.device, "nud", "permanent"),
            ("ip", "-n", hub, "link", "set", port.hub_port, "up"),
            ("ip", "-n", hub, "route", "add", f"{port.address}/32", "dev", port.hub_port),
            ("ip", "-n", hub, "neigh", "add", port.address, "lladdr", rank_mac(port.rank),
             "dev", port.hub_port, "nud", "permanent"),
        ]
    after: list[tuple[str, ...]] = [
        ("ip", "-n", hub, "link", "set", tun, "up", "txqueuelen", str(TXQUEUE_PACKETS)),
        ("ip", "-n", hub, "route", "add", "default", "dev", tun, "table", DELAY_TABLE),
        ("ip", "-n", hub, "rule", "add", "pref", "100", "iif", tun, "lookup", "main"),
        ("ip", "-n", hub, "rule", "add", "pref", "200", "lookup", DELAY_TABLE),
    ]
    return DelayPathPlan(tuple(before), tuple(after))


class DelayLineProcess:
    """The delay line running in the hub namespace, from `start` to `stop`."""

    def __init__(self, hub: str, tun: str, schedule: DelaySchedule, *,
                 raise_priority: bool = True) -> None:
        self.hub, self.tun, self.schedule = hub, tun, schedule
        self.raise_priority = raise_priority
        self.priority = ""
        self._process: subprocess.Popen[str] | None = None

    def start(self) -> None:
        """Start it and wait until it is attached to the TUN device (TestbedError-like
        UsageError naming its answer otherwise)."""
        argv = ("ip", "netns", "exec", self.hub, sys.executable, "-m",
                "akorun.launching.testbed.delayline", "--device", self.tun, "--spec", "-",
                "--priority", "raise" if self.raise_priority else "keep")
        self._process = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, start_new_session=True)  # Ctrl-C stops the ranks first, not the line
        assert self._process.stdin is not None and self._process.stdout is not None
        self._process.stdin.write(json.dumps(self.schedule.to_json()))
        self._process.stdin.close()
        self._process.stdin = None  # communicate() in stop must not flush it
        ready, _, _ = select.select([self._process.stdout], [], [], READY_TIMEOUT_S)
        line = self._process.stdout.readline() if ready else ""
        if not line.startswith("ready"):
            self.stop()
            raise UsageError(f"testbed: the delay line did not start: "
                             f"{line.strip() or 'no answer'} {self._errors()}".strip())
        self.priority = line.split(" ", 1)[1].strip() if " " in line else ""

    def _errors(self) -> str:
        process = self._process
        if process is None or process.stderr is None or process.poll() is None:
            return ""
        return " ".join(process.stderr.read().split())[-300:]

    def stop(self) -> dict[str, Any] | None:
        """Stop it (SIGTERM, then SIGKILL); its statistics, or None."""
        process, self._process = self._process, None
        if process is None:
            return None
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
        try:
            out, _ = process.communicate(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            out, _ = process.communicate()
        for line in reversed((out or "").splitlines()):
            with contextlib.suppress(ValueError):
                stats = json.loads(line)
                if isinstance(stats, dict):
                    return stats
        return None

