"""int8 with a per-chunk scale, as INTELLECT-1's int8 all-reduce: 1 byte a value.

The vector is cut into chunks of `CHUNK` values; each chunk carries one float32
scale = max |x| / 127 and its values as round(x / scale) in [-127, 127].
Payload: the float32 scales of every chunk, then the int8 values.
"""

from __future__ import annotations

import numpy as np

from akocore.codecs.interface import F32, Codec

CHUNK = 1024  # values per scale: 4 bytes of scale per 1024 bytes of values
I8 = np.dtype("i1")


def chunks_of(length: int) -> int:
    return -(-length // CHUNK)


class Int8Codec(Codec):
    """Symmetric int8 quantisation, one float32 scale per chunk of 1024 values."""

    name = "int8"
    wire_id = 4
    encode_s_per_element = 8.0e-9  # with error feedback; measured once, see docs/guide/codecs.md
    decode_s_per_element = 0.8e-9

    def encoded_bytes(self, length: int) -> int:
        return length + 4 * chunks_of(length)

    def pack(self, vector: np.ndarray) -> bytes:
        x = np.asarray(vector, dtype=F32)
        n = x.shape[0]
        chunks = chunks_of(n)
        padded = np.zeros(chunks * CHUNK, dtype=F32)
        padded[:n] = x
        blocks = padded.reshape(chunks, CHUNK)
        scales = (np.abs(blocks).max(axis=1) / np.float32(127.0)).astype(F32)
        safe = np.where(scales > 0, scales, np.float32(1.0))
        q = np.clip(np.rint(blocks / safe[:, None]), -127, 127).astype(I8)
        return scales.tobytes() + q.reshape(-1)[:n].tobytes()

    def decode(self, payload: bytes | bytearray | memoryview, length: int) -> np.ndarray:
        view = self._check_size(payload, length)
        chunks = chunks_of(length)
        scales = np.frombuffer(view[:4 * chunks], dtype=F32)
        if np.any(scales < 0):  # a NaN scale (a non-finite gradient) decodes to NaN, which
            raise ValueError("int8 payload has a negative scale")  # receivers refuse (422)
        q = np.frombuffer(view[4 * chunks:], dtype=I8).astype(F32)
        return q * np.repeat(scales, CHUNK)[:length]


INT8 = Int8Codec()
