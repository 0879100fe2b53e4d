"""top-k: only the k largest-magnitude values travel, as uint32 indices + float32 values.

k = ceil(fraction * length) (at least 1 for a non-empty vector). What is not
sent stays in the sender's residual (error feedback, as in DGC and SparseLoCo),
so it goes out in a later message for the same range. Payload: k uint32
indices in increasing order, then the k float32 values (8 bytes per kept value).
"""

from __future__ import annotations

import math

import numpy as np

from akocore.codecs.interface import F32, Codec

U32 = np.dtype("<u4")


class TopKCodec(Codec):
    """Keep the `fraction` of values largest in magnitude."""

    wire_id = 5
    encode_s_per_element = 7.3e-9  # with error feedback; measured once, see docs/guide/codecs.md
    decode_s_per_element = 0.25e-9

    def __init__(self, fraction: float) -> None:
        if not (isinstance(fraction, float | int) and 0 < fraction <= 1):
            raise ValueError(f"topk fraction: got {fraction!r}, expected 0 < FRACTION <= 1")
        self.fraction = float(fraction)
        self.name = f"topk:{self.fraction:g}"

    def kept(self, length: int) -> int:
        if length <= 0:
            return 0
        return min(length, max(1, math.ceil(self.fraction * length - 1e-9)))

    def encoded_bytes(self, length: int) -> int:
        return 8 * self.kept(length)

    def pack(self, vector: np.ndarray) -> bytes:
        x = np.asarray(vector, dtype=F32)
        k = self.kept(x.shape[0])
        if k == x.shape[0]:
            index = np.arange(k, dtype=U32)
        else:
            index = np.sort(np.argpartition(np.abs(x), x.shape[0] - k)[x.shape[0] - k:])
        return index.astype(U32).tobytes() + x[index].astype(F32).tobytes()

    def decode(self, payload: bytes | bytearray | memoryview, length: int) -> np.ndarray:
        view = self._check_size(payload, length)
        k = self.kept(length)
        index = np.frombuffer(view[:4 * k], dtype=U32)
        if k and (int(index[-1]) >= length or np.any(np.diff(index.astype(np.int64)) <= 0)):
            raise ValueError("topk payload indices are not increasing within the vector")
        out = np.zeros(length, dtype=F32)
        out[index] = np.frombuffer(view[4 * k:], dtype=F32)
        return out
