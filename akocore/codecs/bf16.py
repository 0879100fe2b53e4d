"""bf16: the upper 16 bits of each float32, rounded to nearest even (2 bytes a value)."""

from __future__ import annotations

import numpy as np

from akocore.codecs.interface import F32, Codec

U16 = np.dtype("<u2")


class Bf16Codec(Codec):
    """bfloat16: float32's range with an 8-bit mantissa; round to nearest even."""

    name = "bf16"
    wire_id = 3
    encode_s_per_element = 3.1e-9  # with error feedback; measured once, see docs/guide/codecs.md
    decode_s_per_element = 0.36e-9

    def encoded_bytes(self, length: int) -> int:
        return 2 * length

    def pack(self, vector: np.ndarray) -> bytes:
        bits = np.ascontiguousarray(vector, dtype=F32).view(np.uint32)
        rounded = bits + (np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))
        nan = np.isnan(np.asarray(vector, dtype=F32))
        top = (rounded >> np.uint32(16)).astype(U16)
        if nan.any():  # keep a NaN a NaN (rounding could carry it into inf)
            top[nan] = np.uint16(0x7FC0)
        return top.tobytes()

    def decode(self, payload: bytes | bytearray | memoryview, length: int) -> np.ndarray:
        top = np.frombuffer(self._check_size(payload, length), dtype=U16)
        return (top.astype(np.uint32) << np.uint32(16)).view(F32)


BF16 = Bf16Codec()
