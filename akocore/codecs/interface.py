"""The codec interface: how a float32 vector becomes the bytes a message carries.

In the spirit of optax, a codec is a small object with a pure pair of functions:

- `encode(vector, residual) -> (payload, new_residual)`: the bytes to send for
  `vector + residual`; `new_residual` is what the payload failed to carry
  (error feedback: the caller adds it to the next vector sent for the same
  range). A lossless codec returns a zero residual.
- `decode(payload, length) -> vector`: the float32 values the payload carries.
- `encoded_bytes(length)`: the exact payload size for a vector of `length`.

`encode_decoded` returns the decoded values too (what every receiver will
apply), so a sender does not decode its own payload twice. Pure: no I/O, no
clocks. `encode_s_per_element` / `decode_s_per_element` are the CPU seconds
per element that akosim charges, constants measured once on the development
host (see docs/guide/codecs.md for how and the figures).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import numpy as np

F32 = np.dtype("<f4")


class Codec(ABC):
    """One way of putting a float32 vector on the wire."""

    name: str  # the canonical text form, as --codec takes it: "int8", "topk:0.01"
    wire_id: ClassVar[int]  # the header's codec byte (akorun.transport.wire)
    lossy: ClassVar[bool] = True  # False: decode(encode(x)) == x, no residual kept
    encode_s_per_element: ClassVar[float] = 0.0
    decode_s_per_element: ClassVar[float] = 0.0

    @abstractmethod
    def encoded_bytes(self, length: int) -> int:
        """Payload bytes of a vector of `length` values."""

    @abstractmethod
    def pack(self, vector: np.ndarray) -> bytes:
        """The payload of a float32 vector (no error feedback)."""

    @abstractmethod
    def decode(self, payload: bytes | bytearray | memoryview, length: int) -> np.ndarray:
        """The float32 vector of `length` values that `payload` carries (ValueError if
        the payload is not one this codec produces for that length)."""

    def encode_decoded(self, vector: np.ndarray, residual: np.ndarray | None = None
                       ) -> tuple[bytes, np.ndarray, np.ndarray]:
        """(payload, decoded values, new residual) for `vector + residual`."""
        x = np.asarray(vector, dtype=F32)
        if residual is not None:
            x = x + residual
        with np.errstate(invalid="ignore", over="ignore"):  # non-finite in, non-finite out
            payload = self.pack(x)
            decoded = self.decode(payload, x.shape[0])
            return payload, decoded, (x - decoded).astype(F32, copy=False)

    def encode(self, vector: np.ndarray, residual: np.ndarray | None = None
               ) -> tuple[bytes, np.ndarray]:
        """(payload, new residual) for `vector + residual` (error feedback)."""
        payload, _, new_residual = self.encode_decoded(vector, residual)
        return payload, new_residual

    def ratio(self, length: int) -> float:
        """Encoded bytes over float32 bytes for a vector of `length` values."""
        return self.encoded_bytes(length) / (4 * length) if length else 1.0

    def cpu_s(self, length: int) -> float:
        """Seconds one message of `length` values costs to encode and decode."""
        return length * (self.encode_s_per_element + self.decode_s_per_element)

    def _check_size(self, payload: bytes | bytearray | memoryview, length: int) -> memoryview:
        view = memoryview(payload).cast("B")
        if view.nbytes != self.encoded_bytes(length):
            raise ValueError(f"{self.name} payload of {view.nbytes} bytes for {length} values, "
                             f"expected {self.encoded_bytes(length)}")
        return view

    def __repr__(self) -> str:
        return f"<codec {self.name}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Codec) and other.name == self.name

    def __hash__(self) -> int:
        return hash(self.name)
