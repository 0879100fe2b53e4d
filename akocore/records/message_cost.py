"""What one message costs akorun's software, as a function of its size: the `MessageCost` record.

``akorun measure-messages --out FILE.json`` times messages sent one at a time over
loopback (no emulation, so the wire costs next to nothing): encode, seal, HTTP, the
receiver's verification, decode and apply, and the answer. It fits
``fixed_s + per_byte_s * payload_bytes`` to the per-size medians (`fit_message_cost`)
and writes a `MessageCost`; ``akosim calibrate`` runs that command as a subprocess and
reads the file back with `MessageCost.from_json`, so akosim never imports akorun.
`MessageCost.cost_s(payload_bytes)` is the software seconds one message of that size
costs, sender and receiver together, on top of its time on the wire.

The record carries its own `schema_version` (`MESSAGE_COST_SCHEMA_VERSION`) and
``kind`` ("message_cost"); `from_json` refuses another version. Pure: no clock, no
I/O (the command stamps `measured_at` and the host fingerprint).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from akocore.records.jsonrecord import RecordError, meta, record_from_json, record_to_json

MESSAGE_COST_SCHEMA_VERSION = 1
MESSAGE_COST_KIND = "message_cost"

__all__ = ["MESSAGE_COST_KIND", "MESSAGE_COST_SCHEMA_VERSION", "MessageCost", "MessageSample",
           "fit_message_cost"]


@dataclass(frozen=True)
class MessageSample:
    """One timed message."""

    payload_bytes: int = field(metadata=meta(
        "B", "bytes of the message on the wire (header and body)", "akorun"))
    seconds: float = field(metadata=meta(
        "s", "encode to acknowledgement, one message at a time over loopback", "akorun"))


@dataclass(frozen=True)
class MessageCost:
    """akorun's per-message software cost on one host: ``fixed_s + per_byte_s * bytes``."""

    fixed_s: float = field(metadata=meta(
        "s", "seconds every message costs, whatever its size", "akorun"))
    per_byte_s: float = field(metadata=meta(
        "s/B", "seconds each byte of a message adds (encode, hash, copy, apply)", "akorun"))
    samples: tuple[MessageSample, ...] = field(metadata=meta(
        "", "every timed message behind the fit", "akorun"))
    host: str = field(metadata=meta(
        "", "host fingerprint: CPU model, logical cores, machine, Python", "akorun"))
    measured_at: str = field(metadata=meta("", "when, ISO 8601 UTC", "akorun"))
    repetitions: int = field(default=0, metadata=meta(
        "messages", "timed messages per size", "akorun"))
    schema_version: int = field(default=MESSAGE_COST_SCHEMA_VERSION, metadata=meta(
        "", "version of this record's layout", "akorun"))

    def cost_s(self, payload_bytes: float) -> float:
        """Software seconds of one message of `payload_bytes` bytes (never negative)."""
        return max(0.0, self.fixed_s + self.per_byte_s * payload_bytes)

    def to_json(self) -> dict[str, Any]:
        return {"kind": MESSAGE_COST_KIND, **record_to_json(self)}

    @classmethod
    def from_json(cls, data: Any) -> MessageCost:
        if not isinstance(data, dict):
            raise RecordError(f"message cost: expected an object, got {data!r}")
        version = data.get("schema_version")
        if version != MESSAGE_COST_SCHEMA_VERSION:
            raise RecordError(f"schema_version: this toolkit reads message-cost version "
                              f"{MESSAGE_COST_SCHEMA_VERSION}, the file has {version!r}")
        if data.get("kind", MESSAGE_COST_KIND) != MESSAGE_COST_KIND:
            raise RecordError(f"kind: expected {MESSAGE_COST_KIND!r}, got {data.get('kind')!r}")
        record = record_from_json(cls, {k: v for k, v in data.items() if k != "kind"})
        for name in ("fixed_s", "per_byte_s"):
            value = getattr(record, name)
            if not math.isfinite(value):
                raise RecordError(f"{name}: expected a finite number, got {value!r}")
        if not record.samples:
            raise RecordError("samples: expected at least one timed message")
        return record


def fit_message_cost(samples: Sequence[MessageSample]) -> tuple[float, float]:
    """(fixed_s, per_byte_s): least squares through the median seconds of each size
    (medians, so that a garbage collection or a scheduler hiccup does not tilt the
    line). One size only: all of it is fixed cost. A negative intercept (the line's
    slope overshoots at small sizes) is clipped to 0 and the slope refitted through
    the origin; a negative slope (noise) to 0 with the mean as the fixed cost."""
    if not samples:
        raise ValueError("no samples to fit")
    by_size: dict[int, list[float]] = {}
    for sample in samples:
        by_size.setdefault(sample.payload_bytes, []).append(sample.seconds)
    sizes = sorted(by_size)
    medians = [statistics.median(by_size[size]) for size in sizes]
    if len(sizes) == 1:
        return medians[0], 0.0
    slope, intercept = statistics.linear_regression(sizes, medians)
    if slope < 0:
        return statistics.fmean(medians), 0.0
    if intercept < 0:
        through_origin = sum(x * y for x, y in zip(sizes, medians, strict=True)) \
            / sum(x * x for x in sizes)
        return 0.0, through_origin
    return intercept, slope
