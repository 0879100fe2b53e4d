"""Control messages: small JSON bodies, sealed per session like partials (akorun.keys).

Gradient partitions are binary wire messages (akorun.transport.wire). Every other write
(hello, stop, heartbeat, done, rejoin-hello, snapshot, restart, relay, leave, anchor) is a JSON body
whose request carries a seal (``X-Ako-Auth``: sender, receiver, both
instances' nonces, a counter, the body's BLAKE3 digest and a keyed tag) and
whose answer carries a tag bound to that request, so neither side acts on a
control message that is forged, replayed (from an earlier run, an earlier
instance of a rank, or earlier in this session) or answered for another
request. The snapshot and relay answers are binary (relay: akorun.runtime.recovery.relay);
the snapshot's is a 4-byte little-endian JSON length,
the JSON, then raw little-endian float32 arrays named in the JSON.

`ControlKind` is the one list of control messages (each with its path);
`ControlError` is how a handler refuses one. Which handler answers which kind
is akorun.transport.routing's `ControlTable`, which the server registers its routes from.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

import numpy as np

CONTROL_BODY_MAX_BYTES = 64 * 1024  # a control request is small; the server reads no more


class ControlKind(StrEnum):
    """Every control message a rank serves; the value is the last part of its path."""

    HELLO = "hello"
    STOP = "stop"
    HEARTBEAT = "heartbeat"
    DONE = "done"
    REJOIN_HELLO = "rejoin-hello"
    SNAPSHOT = "snapshot"
    RESTART = "restart"
    RELAY = "relay"
    LEAVE = "leave"
    ANCHOR = "anchor"

    @property
    def path(self) -> str:
        return f"/v1/{self.value}"


class ControlError(Exception):
    """A control request the host refuses: `status` and a one-line reason."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def dumps(payload: Mapping[str, Any]) -> bytes:
    return json.dumps(payload, separators=(",", ":"), sort_keys=True).encode("utf-8")


def loads(body: bytes) -> dict[str, Any]:
    """A JSON object or ValueError."""
    value = json.loads(body.decode("utf-8"))
    if not isinstance(value, dict):
        raise ValueError("expected a JSON object")
    return value


def pack_arrays(meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> bytes:
    """JSON meta plus raw float32 arrays: [u32 json length][json][array bytes...]."""
    layout = []
    for name, array in arrays.items():
        layout.append([name, int(array.size)])
    head = dumps({**meta, "arrays": layout})
    parts = [struct.pack("<I", len(head)), head]
    parts.extend(np.ascontiguousarray(a, dtype="<f4").tobytes() for a in arrays.values())
    return b"".join(parts)


def unpack_arrays(body: bytes) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Inverse of pack_arrays; ValueError on a malformed body."""
    if len(body) < 4:
        raise ValueError("short snapshot body")
    (head_len,) = struct.unpack_from("<I", body)
    meta = loads(body[4:4 + head_len])
    offset = 4 + head_len
    arrays: dict[str, np.ndarray] = {}
    for name, size in meta.pop("arrays", []):
        nbytes = int(size) * 4
        if offset + nbytes > len(body):
            raise ValueError(f"snapshot array {name} runs past the body")
        arrays[str(name)] = np.frombuffer(body, dtype="<f4", count=int(size),
                                          offset=offset).astype(np.float32)
        offset += nbytes
    if offset != len(body):
        raise ValueError("snapshot body has trailing bytes")
    return meta, arrays
