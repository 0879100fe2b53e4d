"""Counters of one akorun process, rendered as Prometheus text, status JSON and progress lines.

`Metrics` is plain mutable state the worker updates on its event loop (no
locks needed: one thread). `render_prometheus` hand-renders the text
exposition format (version 0.0.4) for ``GET /metrics``; ``GET /status`` serves
`Metrics.as_dict` plus the worker's live gauges. Both endpoints are read-only
and unauthenticated by design: they expose counts and timings, never
parameters or the secret. `ProgressLine` turns two snapshots into the line a
worker prints on stderr every interval. `timed_call` and `ByteWaits` are the
stopwatches behind the per-message software cost (`Metrics.message_software_s`).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")

PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4"


@dataclass
class PeerCounters:
    """Traffic with one peer, seen from this process."""

    bytes_sent: int = 0
    bytes_received: int = 0
    messages_sent: int = 0
    messages_received: int = 0
    retries: int = 0
    send_s: float = 0.0  # seconds in successful POSTs
    delivery_s: float = 0.0  # seconds from queueing to acknowledgement, summed
    max_delivery_s: float = 0.0
    stack_s: float = 0.0  # seconds from the end of emulated pacing to the ack, less latency
    stack_messages: int = 0  # first-attempt deliveries counted in stack_s (emulated links only)
    software_send_s: float = 0.0  # sealing requests and checking answers to this peer
    software_receive_s: float = 0.0  # handling this peer's partials, byte waits excluded
    software_received: int = 0  # partials from this peer counted in software_receive_s
    send_dropped: Counter[str] = field(default_factory=Counter)  # reason -> messages
    refused_for_good: int = 0  # messages this peer refused with a tagged final answer
    unauthentic_answers: int = 0  # answers not tagged for their request (not acted on)


@dataclass
class Metrics:
    """Everything one process counts; SI units in the names."""

    rank: int
    role: str
    state: str = "starting"
    round: int = 0
    loss: float | None = None
    accuracy: float | None = None
    compute_s: float = 0.0
    wait_s: float = 0.0
    send_block_s: float = 0.0  # local step + encoding + waiting for queue room
    encode_s: float = 0.0  # seconds encoding outgoing partials (once per multicast)
    duplicates_dropped: int = 0
    rejected: Counter[str] = field(default_factory=Counter)  # incoming, by reason
    peer_timeouts: int = 0
    peers: dict[int, PeerCounters] = field(default_factory=dict)
    evaluations: list[tuple[float, int, float]] = field(default_factory=list)

    def peer(self, rank: int) -> PeerCounters:
        counters = self.peers.get(rank)
        if counters is None:
            counters = self.peers[rank] = PeerCounters()
        return counters

    @property
    def refused_for_good(self) -> dict[int, int]:
        """Per peer: messages it refused with a tagged final answer (never delivered)."""
        return {rank: c.refused_for_good for rank, c in sorted(self.peers.items())
                if c.refused_for_good}

    @property
    def bytes_sent(self) -> int:
        return sum(c.bytes_sent for c in self.peers.values())

    @property
    def bytes_received(self) -> int:
        return sum(c.bytes_received for c in self.peers.values())

    @property
    def retries(self) -> int:
        return sum(c.retries for c in self.peers.values())

    def message_overhead_s(self) -> float | None:
        """Mean seconds a delivered message spent beyond the emulated wire (see
        `PeerCounters.stack_s`), over all peers; None before any such delivery, and
        always None without emulated links (on a real network that time holds the
        network's own; `message_software_s` is the figure that never does)."""
        messages = sum(c.stack_messages for c in self.peers.values())
        if not messages:
            return None
        return sum(c.stack_s for c in self.peers.values()) / messages

    def message_software_s(self) -> float | None:
        """Mean software seconds per message, sender and receiver side added: the
        sending side's encode, seals and answer checks per message sent, plus the
        receiving side's handling per message received (seal check, header, body
        hashing and copy, decode, apply, the sealed answer; time waiting for bytes to
        arrive and emulated downlink holds left out). None before any message."""
        sent = sum(c.messages_sent for c in self.peers.values())
        received = sum(c.software_received for c in self.peers.values())
        if not sent and not received:
            return None
        send_s = self.encode_s + sum(c.software_send_s for c in self.peers.values())
        receive_s = sum(c.software_receive_s for c in self.peers.values())
        return (send_s / sent if sent else 0.0) + (receive_s / received if received else 0.0)

    def as_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "role": self.role,
            "state": self.state,
            "round": self.round,
            "loss": self.loss,
            "accuracy": self.accuracy,
            "compute_s": self.compute_s,
            "wait_s": self.wait_s,
            "send_block_s": self.send_block_s,
            "message_overhead_s": self.message_overhead_s(),
            "message_software_s": self.message_software_s(),
            "bytes_sent": self.bytes_sent,
            "bytes_received": self.bytes_received,
            "retries": self.retries,
            "duplicates_dropped": self.duplicates_dropped,
            "rejected": dict(self.rejected),
            "peer_timeouts": self.peer_timeouts,
            "peers": self.peers_as_dict(),
        }

    def peers_as_dict(self) -> dict[str, dict[str, Any]]:
        """Per-peer counters, keyed by the peer's rank as a string."""
        return {
            str(rank): {
                "bytes_sent": c.bytes_sent,
                "bytes_received": c.bytes_received,
                "messages_sent": c.messages_sent,
                "messages_received": c.messages_received,
                "retries": c.retries,
                "send_s": c.send_s,
                "mean_delivery_s": c.delivery_s / c.messages_sent if c.messages_sent else None,
                "max_delivery_s": c.max_delivery_s,
                "mean_stack_s": c.stack_s / c.stack_messages if c.stack_messages else None,
                "mean_software_receive_s": c.software_receive_s / c.software_received
                if c.software_received else None,
                "send_dropped": dict(c.send_dropped),
                "refused_for_good": c.refused_for_good,
                "unauthentic_answers": c.unauthentic_answers,
            }
            for rank, c in sorted(self.peers.items())
        }


def timed_call(function: Callable[[T], R], argument: T) -> tuple[R, float]:
    """`function(argument)` and the seconds it took (works inside a worker thread)."""
    start_s = time.perf_counter()
    value = function(argument)
    return value, time.perf_counter() - start_s


@dataclass
class ByteWaits:
    """Seconds one request spent awaiting bytes from the network (`wait` times an await)."""

    total_s: float = 0.0

    async def wait(self, awaitable: Awaitable[T]) -> T:
        start_s = time.perf_counter()
        try:
            return await awaitable
        finally:
            self.total_s += time.perf_counter() - start_s


# ------------------------------------------------------------------ prometheus


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


Sample = tuple[Mapping[str, str], float]


class _Writer:
    def __init__(self, base_labels: Mapping[str, str]) -> None:
        self.lines: list[str] = []
        self.base = dict(base_labels)

    def family(self, name: str, kind: str, help_text: str, samples: Iterable[Sample]) -> None:
        self.lines.append(f"# HELP {name} {help_text}")
        self.lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            merged = {**self.base, **labels}
            text = ",".join(f'{k}="{_escape(str(v))}"' for k, v in merged.items())
            self.lines.append(f"{name}{{{text}}} {_number(value)}")


def render_prometheus(metrics: Metrics, gauges: Mapping[str, Any]) -> str:
    """Prometheus text format: counters of `metrics` plus the live `gauges`.

    `gauges` may hold: lag_rounds, queue_depth {peer: n}, suspended {peer},
    last_heard_age_s {peer: s}.
    """
    w = _Writer({"rank": str(metrics.rank), "role": metrics.role})
    peers = sorted(metrics.peers.items())

    def per_peer(attr: str) -> list[Sample]:
        return [({"peer": str(rank)}, float(getattr(c, attr))) for rank, c in peers]

    w.family("akorun_round", "gauge", "Rounds completed by this worker.",
             [({}, metrics.round)])
    if metrics.loss is not None:
        w.family("akorun_loss", "gauge", "Training loss of the last step.", [({}, metrics.loss)])
    if metrics.accuracy is not None:
        w.family("akorun_accuracy", "gauge", "Test accuracy of the last evaluation.",
                 [({}, metrics.accuracy)])
    w.family("akorun_compute_seconds_total", "counter", "Seconds spent in gradient steps.",
             [({}, metrics.compute_s)])
    w.family("akorun_wait_seconds_total", "counter", "Seconds spent waiting at the SSP gate.",
             [({}, metrics.wait_s)])
    w.family("akorun_send_block_seconds_total", "counter",
             "Seconds of local step, encoding and waiting for send-queue room.",
             [({}, metrics.send_block_s)])
    w.family("akorun_bytes_sent_total", "counter", "Message bytes acknowledged by each peer.",
             per_peer("bytes_sent"))
    w.family("akorun_bytes_received_total", "counter", "Message bytes accepted from each peer.",
             per_peer("bytes_received"))
    w.family("akorun_messages_sent_total", "counter", "Messages acknowledged by each peer.",
             per_peer("messages_sent"))
    w.family("akorun_messages_received_total", "counter", "Messages accepted from each peer.",
             per_peer("messages_received"))
    w.family("akorun_retries_total", "counter", "Send attempts that failed and were retried.",
             per_peer("retries"))
    w.family("akorun_send_dropped_total", "counter", "Messages given up, by peer and reason.",
             [({"peer": str(rank), "reason": reason}, float(count))
              for rank, c in peers for reason, count in sorted(c.send_dropped.items())])
    w.family("akorun_refused_for_good_total", "counter",
             "Messages a peer refused with an authenticated final answer.",
             per_peer("refused_for_good"))
    w.family("akorun_unauthentic_answers_total", "counter",
             "Answers without a tag bound to their request (not trusted, sent again).",
             per_peer("unauthentic_answers"))
    w.family("akorun_duplicates_total", "counter", "Duplicate messages acknowledged and dropped.",
             [({}, metrics.duplicates_dropped)])
    w.family("akorun_rejected_total", "counter", "Incoming requests refused, by reason.",
             [({"reason": reason}, float(count))
              for reason, count in sorted(metrics.rejected.items())])
    w.family("akorun_peer_timeouts_total", "counter", "Peers suspended for silence.",
             [({}, metrics.peer_timeouts)])
    if "lag_rounds" in gauges:
        w.family("akorun_lag_rounds", "gauge", "Rounds ahead of the oldest missing input.",
                 [({}, float(gauges["lag_rounds"]))])
    if "queue_depth" in gauges:
        w.family("akorun_send_queue_depth", "gauge", "Messages owed to each peer.",
                 [({"peer": str(p)}, float(n)) for p, n in sorted(gauges["queue_depth"].items())])
    if "suspended" in gauges:
        w.family("akorun_peer_suspended", "gauge", "1 while a peer is out of the SSP gate.",
                 [({"peer": str(p)}, 1.0 if p in gauges["suspended"] else 0.0)
                  for p, _ in peers])
    if "last_heard_age_s" in gauges:
        w.family("akorun_peer_silence_seconds", "gauge", "Seconds since a peer was last heard.",
                 [({"peer": str(p)}, float(age))
                  for p, age in sorted(gauges["last_heard_age_s"].items())])
    return "\n".join(w.lines) + "\n"


# ------------------------------------------------------------------- progress


@dataclass
class ProgressLine:
    """Rates between two calls: rounds/s and MB/s in and out."""

    last_time_s: float | None = None
    last_round: int = 0
    last_sent: int = 0
    last_received: int = 0

    def line(self, now_s: float, metrics: Metrics, lag: int, waiting_on: list[int],
             suspended: Iterable[int]) -> str:
        dt = (now_s - self.last_time_s) if self.last_time_s is not None else 0.0
        rate = (metrics.round - self.last_round) / dt if dt > 0 else 0.0
        out_mb = (metrics.bytes_sent - self.last_sent) / dt / 1e6 if dt > 0 else 0.0
        in_mb = (metrics.bytes_received - self.last_received) / dt / 1e6 if dt > 0 else 0.0
        self.last_time_s = now_s
        self.last_round = metrics.round
        self.last_sent = metrics.bytes_sent
        self.last_received = metrics.bytes_received
        parts = [f"[{metrics.role} {metrics.rank}] {metrics.state}", f"round {metrics.round}"]
        if metrics.loss is not None:
            parts.append(f"loss {metrics.loss:.4f}")
        if metrics.accuracy is not None:
            parts.append(f"acc {metrics.accuracy:.4f}")
        parts.append(f"{rate:.1f} rounds/s")
        parts.append(f"out {out_mb:.2f} MB/s in {in_mb:.2f} MB/s")
        parts.append(f"lag {lag}")
        if waiting_on:
            parts.append("waiting on " + ",".join(map(str, waiting_on)))
        gone = sorted(suspended)
        if gone:
            parts.append("suspended " + ",".join(map(str, gone)))
        return "  ".join(parts)
