"""The tc commands that realise a config's network on a netns testbed (pure: no I/O).

`plan_shaping` turns a `NetworkConfig` and the testbed's names into the `tc`
command lines to run and the `ShapedQueue` records they create
(akocore.records.testbed_record):

- every rank's veth egress (its uplink) gets an htb tree: root class 1:1 at
  the node's uplink; default leaf 1:2 (destinations without a cap); one leaf
  1:(10 + j) per destination j with a per-pair cap (ceil = min(cap, uplink)),
  selected by a u32 filter on j's address. Leaves share the root's excess by
  equal quanta (`HTB_QUANTUM_BYTES`), close to the fluid model's max-min
  share; each leaf's guaranteed rate is root / number of leaves.
- with `downlink`, the bridge-side veth's egress towards the rank (the
  receiver's NIC, where incast queues) gets root 1:1 and one leaf 1:2 at the
  node's downlink.

Every leaf queue is a drop-tail `bfifo` of `queue_limit_bytes` (100 ms at
the class's ceiling, at least 128 KiB so one 64 KiB GSO packet always fits);
every bucket's burst is 1 ms at its rate, at least two full frames. tc
realises no latency here (no netem on this kernel): the runner refuses or
ignores a config's latency (akorun.launching.testbed.runner).

`egress_tree` is one such tree with its default leaf alone (what ``akosim
calibrate --netns-rate`` shapes a probe link with); `tbf_root` a plain token
bucket (burst `tbf_burst_bytes`) for the probes that shape with tbf.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from akocore.records.testbed_record import ShapedQueue
from akocore.settings.schema import NetworkConfig

BURST_S = 1e-3
MIN_BURST_BYTES = 2 * 1514
QUEUE_S = 0.1
MIN_QUEUE_BYTES = 128 * 1024
HTB_QUANTUM_BYTES = 1514
ROOT_CLASS = "1:1"
DEFAULT_CLASS = "1:2"
PAIR_CLASS_BASE = 10  # the class of destination j is 1:(10 + j), its qdisc handle 10+j:


@dataclass(frozen=True)
class NodeDevices:
    """Where one rank's NIC lives: its namespace and veth, the bridge end, its address."""

    rank: int
    namespace: str
    device: str
    hub_namespace: str
    bridge_port: str
    address: str


@dataclass(frozen=True)
class ShapingPlan:
    commands: tuple[tuple[str, ...], ...]  # argv of every tc command, in order
    queues: tuple[ShapedQueue, ...]


def burst_bytes(rate_bps: float) -> int:
    return max(MIN_BURST_BYTES, math.ceil(rate_bps / 8 * BURST_S))


def queue_limit_bytes(rate_bps: float) -> int:
    return max(MIN_QUEUE_BYTES, math.ceil(rate_bps / 8 * QUEUE_S))


def _bits(rate_bps: float) -> str:
    return f"{max(1, round(rate_bps))}bit"


def _htb_class(namespace: str, device: str, parent: str, classid: str, rate_bps: float,
               ceil_bps: float) -> tuple[str, ...]:
    burst = f"{burst_bytes(ceil_bps)}b"
    return ("tc", "-n", namespace, "class", "add", "dev", device, "parent", parent,
            "classid", classid, "htb", "rate", _bits(rate_bps), "ceil", _bits(ceil_bps),
            "burst", burst, "cburst", burst, "quantum", str(HTB_QUANTUM_BYTES))


def _leaf(namespace: str, device: str, classid: str, ceil_bps: float) -> tuple[str, ...]:
    handle = classid.split(":")[1] + ":"
    return ("tc", "-n", namespace, "qdisc", "add", "dev", device, "parent", classid,
            "handle", handle, "bfifo", "limit", str(queue_limit_bytes(ceil_bps)))


def _tree(namespace: str, device: str, root_bps: float,
          leaves: Sequence[tuple[str, float, str | None]]) -> list[tuple[str, ...]]:
    """htb root 1:1 at `root_bps` and one leaf per (classid, ceil, destination address)."""
    commands = [("tc", "-n", namespace, "qdisc", "add", "dev", device, "root", "handle", "1:",
                 "htb", "default", DEFAULT_CLASS.split(":")[1]),
                _htb_class(namespace, device, "1:", ROOT_CLASS, root_bps, root_bps)]
    share_bps = root_bps / len(leaves)
    for classid, ceil_bps, _ in leaves:
        commands.append(_htb_class(namespace, device, ROOT_CLASS, classid,
                                   min(share_bps, ceil_bps), ceil_bps))
        commands.append(_leaf(namespace, device, classid, ceil_bps))
    for classid, _, address in leaves:
        if address is not None:
            commands.append(("tc", "-n", namespace, "filter", "add", "dev", device, "parent",
                             "1:", "protocol", "ip", "prio", "1", "u32", "match", "ip", "dst",
                             f"{address}/32", "flowid", classid))
    return commands


def egress_tree(namespace: str, device: str, rate_bps: float) -> list[tuple[str, ...]]:
    """A node's egress as the testbed shapes an uplink without per-pair caps: htb root
    1:1 and the default leaf 1:2 at `rate_bps`, its drop-tail bfifo."""
    return _tree(namespace, device, rate_bps, [(DEFAULT_CLASS, rate_bps, None)])


TBF_BURST_S = 0.01  # a tbf bucket holds 10 ms at the rate ...
TBF_MIN_BURST_BYTES = 32 * 1024  # ... and at least 32 KiB
TBF_LATENCY = "100ms"  # the longest a packet waits in the tbf queue


def tbf_burst_bytes(rate_bps: float) -> int:
    return max(TBF_MIN_BURST_BYTES, int(rate_bps / 8 * TBF_BURST_S))


def tbf_root(namespace: str, device: str, rate_bps: float) -> tuple[str, ...]:
    """A tbf root qdisc at `rate_bps` on `device` (burst `tbf_burst_bytes`)."""
    return ("tc", "-n", namespace, "qdisc", "add", "dev", device, "root", "tbf", "rate",
            _bits(rate_bps), "burst", str(tbf_burst_bytes(rate_bps)), "latency", TBF_LATENCY)


def _queue(rank: int, direction: str, peer: int | None, namespace: str, device: str,
           classid: str, rate_bps: float, ceil_bps: float) -> ShapedQueue:
    return ShapedQueue(rank=rank, direction=direction, peer=peer, namespace=namespace,
                       device=device, classid=classid, rate_bps=float(round(rate_bps)),
                       ceil_bps=float(round(ceil_bps)), burst_bytes=burst_bytes(ceil_bps),
                       queue_limit_bytes=queue_limit_bytes(ceil_bps))


def plan_shaping(network: NetworkConfig, nodes: Sequence[NodeDevices], *,
                 downlink: bool) -> ShapingPlan:
    """The tc commands and classes that realise `network` for `nodes` (rank order)."""
    n = len(nodes)
    uplink = network.uplink_bps(n)
    down = network.downlink_bps(n)
    caps = network.link_bps_matrix(n)
    commands: list[tuple[str, ...]] = []
    queues: list[ShapedQueue] = []
    for node in nodes:
        i = node.rank
        up_bps = float(uplink[i])
        leaves: list[tuple[str, float, str | None]] = [(DEFAULT_CLASS, up_bps, None)]
        for peer in nodes:
            cap_bps = float(caps[i, peer.rank])
            if peer.rank != i and math.isfinite(cap_bps):
                leaves.append((f"1:{PAIR_CLASS_BASE + peer.rank}", min(cap_bps, up_bps),
                               peer.address))
        commands += _tree(node.namespace, node.device, up_bps, leaves)
        share_bps = up_bps / len(leaves)
        for classid, ceil_bps, address in leaves:
            peer_rank = None if address is None else int(classid.split(":")[1]) - \
                PAIR_CLASS_BASE
            queues.append(_queue(i, "uplink" if peer_rank is None else "pair", peer_rank,
                                 node.namespace, node.device, classid,
                                 min(share_bps, ceil_bps), ceil_bps))
        if downlink:
            down_bps = float(down[i])
            commands += _tree(node.hub_namespace, node.bridge_port, down_bps,
                              [(DEFAULT_CLASS, down_bps, None)])
            queues.append(_queue(i, "downlink", None, node.hub_namespace, node.bridge_port,
                                 DEFAULT_CLASS, down_bps, down_bps))
    return ShapingPlan(tuple(commands), tuple(queues))
