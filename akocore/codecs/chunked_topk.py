"""Chunked top-k with b-bit values and decaying error feedback: SparseLoCo's compressor.

SparseLoCo (arXiv 2508.15706) compresses a pseudo-gradient per replica: the
vector is cut into chunks of `chunk` values (the last one may be shorter),
each chunk keeps its k = ceil(fraction * chunk length) values largest in
magnitude, and the kept values are quantised to `bits` bits. What is not
carried stays in the sender's error-feedback accumulator e, which decays:
e <- decay * e + delta; send C(e); e <- e - decoded(C(e)). `encode_decoded`
applies the decay to the residual it is given, so `SendEncoder`
(akocore.codecs.exchange) keeps this accumulator like any codec's residual.

Quantisation (bits 2, 4 or 8), per chunk: the kept values are binned on a
uniform grid of 2^bits levels between their minimum and maximum, and each
bin decodes to the mean of the values it holds (a lookup table per chunk, as
the reference compressors' statistical quantiser keeps; an empty bin decodes
to 0). bits 32 sends the kept values as float32 (no quantisation): with
fraction 1 the codec is then lossless, bit for bit.

Payload: every kept value's index within its chunk as uint16 (chunks of at
most 65,536 values), chunk after chunk in increasing order; then either the
kept values as float32 (bits 32) or their bin codes packed `8 // bits` to a
byte (the lowest bits first, the last byte zero-padded) followed by every
chunk's lookup table of 2^bits float32 values. The size is a function of the
length alone (`encoded_bytes`).
"""

from __future__ import annotations

import math

import numpy as np

from akocore.codecs.interface import F32, Codec

U16 = np.dtype("<u2")
CHUNK_MAX = 65536  # indices within a chunk travel as uint16
BITS = (2, 4, 8, 32)  # 32: float32 values, no quantisation
DEFAULT_CHUNK = 4096


class ChunkedTopKCodec(Codec):
    """Per chunk of `chunk` values, the `fraction` largest in magnitude at `bits` bits,
    with error feedback whose residual decays by `decay` before each message."""

    wire_id = 6
    encode_s_per_element = 8.5e-9  # with error feedback; measured once, see docs/guide/codecs.md
    decode_s_per_element = 0.7e-9

    def __init__(self, fraction: float, chunk: int = DEFAULT_CHUNK, bits: int = 2,
                 decay: float = 1.0) -> None:
        if not (isinstance(fraction, float | int) and 0 < fraction <= 1):
            raise ValueError(f"ctopk fraction: got {fraction!r}, expected 0 < FRACTION <= 1")
        if not (isinstance(chunk, int) and 1 <= chunk <= CHUNK_MAX):
            raise ValueError(f"ctopk chunk: got {chunk!r}, expected 1 <= CHUNK <= {CHUNK_MAX}")
        if bits not in BITS:
            raise ValueError(f"ctopk bits: got {bits!r}, expected one of "
                             f"{', '.join(map(str, BITS))}")
        if not (isinstance(decay, float | int) and 0 <= decay <= 1):
            raise ValueError(f"ctopk decay: got {decay!r}, expected 0 <= DECAY <= 1")
        self.fraction = float(fraction)
        self.chunk = int(chunk)
        self.bits = int(bits)
        self.decay = float(decay)
        self.name = f"ctopk:{self.fraction:g}:{self.chunk}:{self.bits}:{self.decay:g}"

    # ------------------------------------------------------------------ layout

    def kept_in(self, size: int) -> int:
        """Values kept of a chunk of `size` values (at least 1 of a non-empty chunk)."""
        if size <= 0:
            return 0
        return min(size, max(1, math.ceil(self.fraction * size - 1e-9)))

    def _groups(self, length: int) -> list[tuple[int, int, int]]:
        """(rows, chunk size, kept per row) for the full chunks, then the short last one."""
        full, tail = divmod(length, self.chunk)
        groups = [(full, self.chunk, self.kept_in(self.chunk))] if full else []
        if tail:
            groups.append((1, tail, self.kept_in(tail)))
        return groups

    def _counts(self, length: int) -> tuple[int, int]:
        """(chunks, kept values) of a vector of `length` values."""
        groups = self._groups(length)
        return sum(rows for rows, _, _ in groups), sum(rows * k for rows, _, k in groups)

    def encoded_bytes(self, length: int) -> int:
        chunks, kept = self._counts(length)
        if self.bits == 32:
            return kept * (2 + 4)
        return 2 * kept + -(-kept * self.bits // 8) + 4 * (1 << self.bits) * chunks

    # ------------------------------------------------------------------ encode

    def encode_decoded(self, vector: np.ndarray, residual: np.ndarray | None = None
                       ) -> tuple[bytes, np.ndarray, np.ndarray]:
        """As any codec's, with the residual decayed first: e <- decay * e + vector."""
        if residual is not None and self.decay != 1.0:
            residual = (np.float32(self.decay) * residual).astype(F32)
        return super().encode_decoded(vector, residual)

    def pack(self, vector: np.ndarray) -> bytes:
        x = np.asarray(vector, dtype=F32)
        indices, values, start = [], [], 0
        for rows, size, k in self._groups(x.shape[0]):
            block = x[start:start + rows * size].reshape(rows, size)
            start += rows * size
            if k == size:
                index = np.broadcast_to(np.arange(size), (rows, size))
            else:
                index = np.sort(np.argpartition(np.abs(block), size - k, axis=1)[:, size - k:],
                                axis=1)
            indices.append(index.astype(U16).reshape(-1))
            values.append(np.take_along_axis(block, index, axis=1))
        index_bytes = np.concatenate(indices).tobytes() if indices else b""
        if self.bits == 32:
            kept = np.concatenate([v.reshape(-1) for v in values]) if values else np.zeros(0, F32)
            return index_bytes + kept.astype(F32).tobytes()
        codes, tables = zip(*(self._quantise(v) for v in values), strict=True) \
            if values else ((), ())
        flat = np.concatenate([c.reshape(-1) for c in codes]) if codes else np.zeros(0, np.uint8)
        table = np.concatenate([t.reshape(-1) for t in tables]) if tables else np.zeros(0, F32)
        return index_bytes + _packed(flat, self.bits) + table.astype(F32).tobytes()

    def _quantise(self, kept: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(codes (rows, k) uint8, lookup tables (rows, 2^bits) float32) of each row."""
        levels = 1 << self.bits
        rows = kept.shape[0]
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            low = kept.min(axis=1, keepdims=True).astype(np.float64)
            span = kept.max(axis=1, keepdims=True).astype(np.float64) - low
            scaled = np.where(span > 0, (kept - low) / np.where(span > 0, span, 1.0), 0.0)
            codes = np.clip(np.rint(np.nan_to_num(scaled) * (levels - 1)), 0, levels - 1)
        codes = codes.astype(np.uint8)
        slot = (np.arange(rows)[:, None] * levels + codes).reshape(-1)
        sums = np.bincount(slot, weights=kept.reshape(-1).astype(np.float64),
                           minlength=rows * levels)
        counts = np.bincount(slot, minlength=rows * levels)
        with np.errstate(invalid="ignore"):
            table = np.where(counts > 0, sums / np.maximum(counts, 1), 0.0)
        return codes, table.astype(F32).reshape(rows, levels)

    # ------------------------------------------------------------------ decode

    def decode(self, payload: bytes | bytearray | memoryview, length: int) -> np.ndarray:
        view = self._check_size(payload, length)
        chunks, kept = self._counts(length)
        index = np.frombuffer(view[:2 * kept], dtype=U16).astype(np.int64)
        rest = view[2 * kept:]
        if self.bits == 32:
            values = np.frombuffer(rest, dtype=F32)
        else:
            levels = 1 << self.bits
            code_bytes = -(-kept * self.bits // 8)
            codes = _unpacked(np.frombuffer(rest[:code_bytes], dtype=np.uint8), self.bits, kept)
            tables = np.frombuffer(rest[code_bytes:], dtype=F32).reshape(chunks, levels)
            row_of = np.repeat(np.arange(chunks), [k for rows, _, k in self._groups(length)
                                                   for _ in range(rows)])
            values = tables[row_of, codes]
        out = np.zeros(length, dtype=F32)
        start = at = 0
        for rows, size, k in self._groups(length):
            block = index[at:at + rows * k].reshape(rows, k)
            if k and (int(block.max()) >= size or np.any(np.diff(block, axis=1) <= 0)):
                raise ValueError("ctopk payload indices are not increasing within a chunk")
            target = (start + np.arange(rows)[:, None] * size + block).reshape(-1)
            out[target] = values[at:at + rows * k]
            start += rows * size
            at += rows * k
        return out


def _packed(codes: np.ndarray, bits: int) -> bytes:
    """`codes` (< 2^bits each) packed 8 // bits to a byte, the lowest bits first."""
    per = 8 // bits
    padded = np.zeros(-(-codes.shape[0] // per) * per, np.uint8)
    padded[:codes.shape[0]] = codes
    groups = padded.reshape(-1, per)
    out = np.zeros(groups.shape[0], np.uint8)
    for i in range(per):
        out |= (groups[:, i] << np.uint8(i * bits)).astype(np.uint8)
    return out.tobytes()


def _unpacked(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    """The first `count` codes of `packed` (the inverse of `_packed`)."""
    per = 8 // bits
    mask = np.uint8((1 << bits) - 1)
    out = np.stack([(packed >> np.uint8(i * bits)) & mask for i in range(per)], axis=1)
    return out.reshape(-1)[:count].astype(np.int64)


def parse_ctopk(arg: str) -> ChunkedTopKCodec | None:
    """The codec "FRACTION[:CHUNK[:BITS[:DECAY]]]" names (the text after "ctopk:"), or
    None when it names none."""
    parts = arg.split(":")
    if not 1 <= len(parts) <= 4:
        return None
    try:
        fraction = float(parts[0])
        chunk = int(parts[1]) if len(parts) > 1 else DEFAULT_CHUNK
        bits = int(parts[2]) if len(parts) > 2 else 2
        decay = float(parts[3]) if len(parts) > 3 else 1.0
        return ChunkedTopKCodec(fraction, chunk, bits, decay)
    except ValueError:
        return None
