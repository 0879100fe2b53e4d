"""What `akosim calibrate` measured on one host: the TCP-aware flow model's parameters.

`TcpParameters` are the measured numbers of akosim's TCP-aware network model
(akosim.network.tcpmodel documents what each one does; which of its behaviours
a run has is the network model's layer choice, `--network-model`, not part of
this record): the wire framing that makes
goodput a fraction of the line rate, the largest window (the window/RTT
bound), the initial congestion window and handshake (the slow-start cost of a
fresh connection), how many pooled connections akorun keeps per peer, and the
per-message software cost of akorun (sealing, HTTP, verification, apply)
measured without network time. Their defaults are the documented Linux/TCP
constants (1448-byte MSS with timestamps, IW10, one SYN round trip, delayed
ACKs), so the model works before any calibration.

`HostCalibration` is the versioned record `akosim calibrate` writes (kind
``host-calibration``): the parameters, which of them were measured on this
host (`measured`, the rest are defaults), the raw figures behind them
(loopback RTT, goodput, fresh and warm transfer times), the host fingerprint
and when. No I/O here: akosim.calibration.host_calibration_io reads and writes the files.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

from akocore.records.jsonrecord import RecordError, meta, record_from_json, record_to_json

HOST_CALIBRATION_VERSION = 1
KIND = "host-calibration"
# fields older files have: behaviour switches, now layers of akosim's network model
LEGACY_SWITCHES = frozenset({"one_message_per_connection", "sender_fifo", "slow_start",
                             "pooled", "message_cpu_serialised"})

__all__ = ["HOST_CALIBRATION_VERSION", "HostCalibration", "TcpParameters", "TransferTiming",
           "wire_goodput_fraction"]


def wire_goodput_fraction(mss_bytes: float, header_bytes: float, ack_bytes: float,
                          segments_per_ack: float) -> float:
    """Payload bits per line bit of a bulk TCP transfer whose reverse direction also
    carries data: each MSS travels with `header_bytes` of framing (one way), and every
    `segments_per_ack` segments cost one `ack_bytes` frame on the other direction of
    the same NIC (LV08's cross-traffic, here from the frame sizes)."""
    frame = mss_bytes + header_bytes
    return (mss_bytes / frame) / (1.0 + ack_bytes / (segments_per_ack * frame))


def _positive(name: str, value: float, *, allow_zero: bool = False) -> None:
    ok = value >= 0 if allow_zero else value > 0
    if not (ok and math.isfinite(value)):
        raise ValueError(f"{name}: expected a finite number {'>= 0' if allow_zero else '> 0'}, "
                         f"got {value!r}")


@dataclass(frozen=True)
class TcpParameters:
    """The TCP-aware model's parameters (defaults: Linux TCP, no software cost)."""

    mss_bytes: int = field(default=1448, metadata=meta(
        "B", "payload bytes per segment (1500 MTU - IPv4 20 - TCP 32 with timestamps)",
        "akosim"))
    header_bytes: int = field(default=66, metadata=meta(
        "B", "framing per segment on the line: Ethernet 14 + IPv4 20 + TCP 32", "akosim"))
    ack_bytes: int = field(default=66, metadata=meta(
        "B", "one pure ACK frame on the reverse direction", "akosim"))
    segments_per_ack: float = field(default=2.0, metadata=meta(
        "segments", "data segments acknowledged per ACK (delayed ACK)", "akosim"))
    measured_goodput_fraction: float | None = field(default=None, metadata=meta(
        "fraction", "goodput / line rate measured on a shaped link (null: from the frame "
        "sizes)", "akosim"))
    window_bytes: float = field(default=4194304.0, metadata=meta(
        "B", "largest window of one connection (rate <= window / RTT; SimGrid's TCP_gamma)",
        "akosim"))
    initial_window_segments: int = field(default=10, metadata=meta(
        "segments", "congestion window of a fresh connection (Linux IW10)", "akosim"))
    handshake_rtts: float = field(default=1.0, metadata=meta(
        "RTT", "round trips before a fresh connection's first byte (SYN, SYN-ACK)", "akosim"))
    base_rtt_s: float = field(default=0.0, metadata=meta(
        "s", "round trip of the host stack alone (loopback), added to 2 x latency", "akosim"))
    connections_per_pair: int = field(default=1, metadata=meta(
        "connections", "pooled connections a sender keeps per peer (akorun: 1)", "akosim"))
    message_fixed_s: float = field(default=0.0, metadata=meta(
        "s", "software seconds per message without network time (akorun measure-messages)",
        "akosim"))
    message_per_byte_s: float = field(default=0.0, metadata=meta(
        "s/B", "software seconds per payload byte without network time", "akosim"))
    flow_sharing_efficiency: tuple[float, ...] = field(default=(), metadata=meta(
        "fraction", "what k flows through one shaped drop-tail port, each moving one "
        "message per round, carry over what one flow carries in the same pattern, for "
        "k = 1, 2, ... (more flows: the last; empty: 1, no loss from sharing)", "akosim"))

    def __post_init__(self) -> None:
        for name in ("mss_bytes", "segments_per_ack", "initial_window_segments",
                     "connections_per_pair"):
            _positive(name, float(getattr(self, name)))
        if not self.window_bytes > 0:  # math.inf: no window bound
            raise ValueError(f"window_bytes: expected > 0 (inf: no bound), got "
                             f"{self.window_bytes!r}")
        for name in ("header_bytes", "ack_bytes", "handshake_rtts", "base_rtt_s",
                     "message_fixed_s", "message_per_byte_s"):
            _positive(name, float(getattr(self, name)), allow_zero=True)
        if not all(0 < e <= 1 and math.isfinite(e) for e in self.flow_sharing_efficiency):
            raise ValueError(f"flow_sharing_efficiency: expected fractions 0 < x <= 1, got "
                             f"{self.flow_sharing_efficiency!r}")
        fraction = self.measured_goodput_fraction
        if fraction is not None and not 0 < fraction <= 1:
            raise ValueError(f"measured_goodput_fraction: expected 0 < x <= 1, got {fraction!r}")

    @property
    def bandwidth_factor(self) -> float:
        """Goodput as a fraction of the line rate (measured, else from frame sizes)."""
        if self.measured_goodput_fraction is not None:
            return self.measured_goodput_fraction
        return wire_goodput_fraction(self.mss_bytes, self.header_bytes, self.ack_bytes,
                                     self.segments_per_ack)

    def sharing_efficiency(self, flows: int) -> float:
        """The fraction of the goodput `flows` concurrent flows on one link carry."""
        table = self.flow_sharing_efficiency
        if not table or flows < 1:
            return 1.0
        return table[min(flows, len(table)) - 1]

    @property
    def initial_window_bytes(self) -> float:
        return float(self.initial_window_segments * self.mss_bytes)

    def message_cost_s(self, payload_bytes: float) -> float:
        """Software seconds one message of `payload_bytes` costs beyond the network."""
        return self.message_fixed_s + self.message_per_byte_s * payload_bytes

    @classmethod
    def ideal(cls) -> TcpParameters:
        """No framing, no window bound: the tcp-core layer alone (network model
        "tcp-core") then equals max-min exactly."""
        return cls(header_bytes=0, ack_bytes=0, window_bytes=math.inf)


@dataclass(frozen=True)
class TransferTiming:
    """One timed transfer of `size_bytes` over a TCP connection (median of repeats)."""

    size_bytes: int = field(metadata=meta("B", "payload bytes", "akosim"))
    fresh_s: float = field(metadata=meta(
        "s", "connect + send + acknowledgement on a new connection", "akosim"))
    warm_s: float = field(metadata=meta(
        "s", "send + acknowledgement on an open connection", "akosim"))


@dataclass(frozen=True)
class HostCalibration:
    """`akosim calibrate`'s record: the TCP model's parameters for one host, and how."""

    tcp: TcpParameters = field(metadata=meta("", "the TCP-aware model's parameters", "akosim"))
    host: str = field(metadata=meta("", "host fingerprint (name, CPU, kernel)", "akosim"))
    measured_at: str = field(metadata=meta("", "when, ISO 8601 UTC", "akosim"))
    measured: tuple[str, ...] = field(default=(), metadata=meta(
        "", "parameters measured on this host; the others are defaults", "akosim"))
    notes: tuple[str, ...] = field(default=(), metadata=meta(
        "", "how each measured parameter was measured, and what was not", "akosim"))
    loopback_rtt_s: float | None = field(default=None, metadata=meta(
        "s", "median round trip of a 1-byte ping-pong over loopback TCP", "akosim"))
    loopback_goodput_bps: float | None = field(default=None, metadata=meta(
        "bit/s", "bulk loopback TCP goodput (the host stack's ceiling)", "akosim"))
    transfers: tuple[TransferTiming, ...] = field(default=(), metadata=meta(
        "", "timed transfers on fresh and warm loopback connections", "akosim"))
    shaped_rate_bps: float | None = field(default=None, metadata=meta(
        "bit/s", "the tc rate of the namespace pair the goodput fraction was measured on "
        "(null: not measured)", "akosim"))

    def __post_init__(self) -> None:
        known = {f.name for f in fields(TcpParameters)}
        unknown = sorted(set(self.measured) - known)
        if unknown:
            raise ValueError(f"measured: {unknown[0]!r} is not a TcpParameters field")

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": HOST_CALIBRATION_VERSION, "kind": KIND,
                **record_to_json(self)}

    @classmethod
    def from_json(cls, data: Any) -> HostCalibration:
        if not isinstance(data, dict):
            raise RecordError(f"{KIND}: expected an object, got {data!r}")
        version = data.get("schema_version")
        if version != HOST_CALIBRATION_VERSION:
            raise RecordError(f"schema_version: this toolkit reads host calibration version "
                              f"{HOST_CALIBRATION_VERSION}, the file has {version!r}")
        if data.get("kind") != KIND:
            raise RecordError(f"kind: expected {KIND!r}, got {data.get('kind')!r}")
        record = {k: v for k, v in data.items() if k not in ("schema_version", "kind")}
        tcp = record.get("tcp")
        if isinstance(tcp, dict):  # files of before the network model's layers: their
            # behaviour switches are the model's layer choice now (--network-model)
            record["tcp"] = {k: v for k, v in tcp.items() if k not in LEGACY_SWITCHES}
            if isinstance(record.get("measured"), list):
                record["measured"] = [m for m in record["measured"] if m not in LEGACY_SWITCHES]
        return record_from_json(cls, record)

    def provenance(self) -> str:
        """One line a user reads: what the TCP model uses and where it came from."""
        what = ", ".join(self.measured) if self.measured else "nothing (all defaults)"
        tcp = self.tcp
        return (f"tcp model: goodput {100 * tcp.bandwidth_factor:.1f}% of line rate, "
                f"window {tcp.window_bytes / 2**20:g} MiB, IW{tcp.initial_window_segments}, "
                f"message cost {self.tcp.message_fixed_s * 1e3:.2f} ms + "
                f"{self.tcp.message_per_byte_s * 1e9:.2f} ns/B; host calibration of "
                f"{self.measured_at[:10]} (measured: {what})")
