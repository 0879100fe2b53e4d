"""The identity codec: little-endian float32, what every message carried before codecs."""

from __future__ import annotations

import numpy as np

from akocore.codecs.interface import F32, Codec


class NoCodec(Codec):
    """float32 as is: 4 bytes a value, lossless."""

    name = "none"
    wire_id = 1
    lossy = False

    def encoded_bytes(self, length: int) -> int:
        return 4 * length

    def pack(self, vector: np.ndarray) -> bytes:
        return np.ascontiguousarray(vector, dtype=F32).tobytes()

    def decode(self, payload: bytes | bytearray | memoryview, length: int) -> np.ndarray:
        return np.frombuffer(self._check_size(payload, length), dtype=F32).copy()


NONE = NoCodec()
