"""What a real-network testbed configured for one run: the typed record `testbed.json`.

`akorun launch --testbed netns` writes it into the run directory before any
rank starts (akorun.launching.testbed.runner); `akosim predict` reads it to know the
network the run really had, which is the config's network as closely as the
kernel realised it: rates, token-bucket bursts and drop-tail queue limits of
every tc class, the addresses, the one-way delay per pair the testbed's delay
line holds packets for (`latency_matrix_s`; there is no netem on this kernel),
and what it left out (`latency_ignored_s`, when told to ignore latency).

Shaping (one `ShapedQueue` per htb class with its own queue):

- ``uplink``: egress of the rank's veth (the sender's NIC). The default class
  of an htb tree whose root carries `uplink_bps`; traffic to destinations
  without a per-pair cap goes here.
- ``pair``: a leaf under the same root for traffic to one destination `peer`
  (u32 filter on the destination address), ceil = min(pair cap, uplink).
- ``downlink``: egress of the bridge-side veth towards the rank (the
  receiver's NIC, incast), when shaped.

Every class has ``ceil_bps`` (the most it carries: what the config asked)
and ``rate_bps`` (what htb guarantees it when siblings compete; excess is
shared by equal quanta). No I/O here: `to_json`/`from_json` map to and from
JSON objects; akorun writes the file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from akocore.records.jsonrecord import RecordError, meta, record_from_json, record_to_json

TESTBED_RECORD_VERSION = 1
TESTBED_RECORD_FILE = "testbed.json"  # in the run directory
DIRECTIONS = ("uplink", "downlink", "pair")
LATENCY_POLICIES = ("delay", "ignore")

__all__ = ["DIRECTIONS", "LATENCY_POLICIES", "TESTBED_RECORD_FILE", "TESTBED_RECORD_VERSION",
           "ShapedQueue", "TestbedNode", "TestbedRecord"]


@dataclass(frozen=True)
class ShapedQueue:
    """One htb class the testbed applied, with its drop-tail (bfifo) queue."""

    rank: int = field(metadata=meta("", "the node whose NIC this class shapes", "akorun"))
    direction: str = field(metadata=meta("", "uplink, downlink or pair", "akorun"))
    peer: int | None = field(metadata=meta("", "pair: the destination rank", "akorun"))
    namespace: str = field(metadata=meta("", "network namespace of the device", "akorun"))
    device: str = field(metadata=meta("", "the device whose egress is shaped", "akorun"))
    classid: str = field(metadata=meta("", "htb class id, e.g. 1:2", "akorun"))
    rate_bps: float = field(metadata=meta("bit/s", "htb rate (guaranteed share)", "akorun"))
    ceil_bps: float = field(metadata=meta("bit/s", "htb ceil (the most it carries)", "akorun"))
    burst_bytes: int = field(metadata=meta("B", "token bucket burst (and cburst)", "akorun"))
    queue_limit_bytes: int = field(metadata=meta("B", "bfifo limit of the leaf queue",
                                                 "akorun"))

    def __post_init__(self) -> None:
        if self.direction not in DIRECTIONS:
            raise RecordError(f"direction: got {self.direction!r}, expected one of "
                              f"{', '.join(DIRECTIONS)}")
        if (self.peer is None) != (self.direction != "pair"):
            raise RecordError("peer: a pair class names its destination, other classes none")


@dataclass(frozen=True)
class TestbedNode:
    """One rank's place on the testbed."""

    rank: int = field(metadata=meta("", "the rank", "akorun"))
    namespace: str = field(metadata=meta("", "its network namespace", "akorun"))
    device: str = field(metadata=meta("", "its veth end (in its namespace)", "akorun"))
    bridge_port: str = field(metadata=meta("", "the veth's other end, in the hub "
                                               "namespace (on the bridge, if any)", "akorun"))
    address: str = field(metadata=meta("", "IPv4 address of `device`", "akorun"))
    port: int = field(metadata=meta("", "TCP port the rank listens on", "akorun"))
    uplink_bps: float = field(metadata=meta("bit/s", "uplink ceiling applied", "akorun"))
    downlink_bps: float | None = field(metadata=meta(
        "bit/s", "downlink ceiling applied; null: not shaped", "akorun"))


@dataclass(frozen=True)
class TestbedRecord:
    """The testbed of one run, as configured (not as measured)."""

    testbed: str = field(metadata=meta("", "kind of testbed: netns", "akorun"))
    tag: str = field(metadata=meta("", "the run's unique name prefix", "akorun"))
    hub_namespace: str = field(metadata=meta("", "namespace holding the bridge", "akorun"))
    bridge: str = field(metadata=meta("", "the bridge joining the ranks (empty: the hub "
                                          "routes through the delay line)", "akorun"))
    subnet: str = field(metadata=meta("", "the ranks' IPv4 subnet", "akorun"))
    mtu: int = field(metadata=meta("B", "MTU of every veth", "akorun"))
    nodes: tuple[TestbedNode, ...] = field(metadata=meta("", "one per rank", "akorun"))
    queues: tuple[ShapedQueue, ...] = field(metadata=meta("", "every htb class applied",
                                                          "akorun"))
    downlink_shaped: bool = field(metadata=meta("", "bridge-side egress shaped", "akorun"))
    latency_policy: str = field(metadata=meta(
        "", "delay (the delay line realises latency) or ignore", "akorun"))
    latency_ignored_s: float = field(metadata=meta(
        "s", "largest configured latency the testbed did not realise (0: none)", "akorun"))
    in_process_emulation: bool = field(metadata=meta("", "akorun's own link emulation",
                                                     "akorun"))
    htb_quantum_bytes: int = field(metadata=meta("B", "quantum of every class (equal "
                                                      "shares of excess)", "akorun"))
    tcp_congestion_control: str = field(metadata=meta("", "the ranks' TCP congestion control",
                                                      "akorun"))
    kernel: str = field(metadata=meta("", "kernel release", "akorun"))
    commands: tuple[str, ...] = field(metadata=meta("", "every ip/tc command run, in order",
                                                    "akorun"))
    latency_matrix_s: tuple[tuple[float, ...], ...] | None = field(default=None, metadata=meta(
        "s", "one-way delay per ordered pair (row sends) the delay line holds packets for; "
             "null: no delay line", "akorun"))
    delay_jitter_s: float = field(default=0.0, metadata=meta(
        "s", "uniform jitter added to each packet's delay (a pair's order kept)", "akorun"))
    delay_device: str = field(default="", metadata=meta(
        "", "the delay line's TUN device in the hub namespace (empty: none)", "akorun"))

    def queue(self, rank: int, direction: str, peer: int | None = None) -> ShapedQueue | None:
        """The class shaping `rank`'s `direction` (towards `peer` for a pair), or None."""
        for queue in self.queues:
            if (queue.rank, queue.direction, queue.peer) == (rank, direction, peer):
                return queue
        return None

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": TESTBED_RECORD_VERSION, "kind": "testbed",
                **record_to_json(self)}

    @classmethod
    def from_json(cls, data: Any) -> TestbedRecord:
        if not isinstance(data, dict):
            raise RecordError(f"testbed: expected an object, got {data!r}")
        if data.get("kind") != "testbed":
            raise RecordError(f"kind: expected \"testbed\", got {data.get('kind')!r}")
        if data.get("schema_version") != TESTBED_RECORD_VERSION:
            raise RecordError(f"schema_version: this version reads "
                              f"{TESTBED_RECORD_VERSION}, the file has "
                              f"{data.get('schema_version')!r}")
        return record_from_json(cls, {k: v for k, v in data.items()
                                      if k not in ("schema_version", "kind")})
