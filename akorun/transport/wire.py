"""The akorun wire format: one `Partial` as one HTTP/1.1 POST body with a body digest.

This module owns the bytes and nothing else: no sockets, no clocks, no keys,
no pickle. A message is a fixed-size little-endian header followed by the raw
values as little-endian float32 (or, for a run with a codec, the codec's
payload: akocore.codecs). The last 32 bytes of the header are the
BLAKE3-256 digest of the body, so that the header alone commits to the whole
message: akorun.transport.keys authenticates the header (per destination and per
session, in the request's ``X-Ako-Auth``) before a receiver reserves anything
for the body, and `BodyHasher` checks the body against the digest as it streams
in. The digest is unkeyed on purpose: it is computed once per message whatever
the number of destinations; the keyed tag over the header is what
authenticates (hash-then-MAC).

Header layout (all integers little-endian, `struct` format `HEADER_FORMAT`):

| offset | size | field       | type    | meaning                                       |
|-------:|-----:|-------------|---------|-----------------------------------------------|
|      0 |    4 | magic       | bytes   | `b"AKO1"`                                     |
|      4 |    1 | version     | u8      | `VERSION` (2); anything else is rejected      |
|      5 |    1 | kind        | u8      | `akocore.messages.Kind`                       |
|      6 |    1 | codec       | u8      | 1 float32, 2 fp16, 3 bf16, 4 int8, 5 topk, 6 ctopk |
|      7 |    1 | flags       | u8      | bit 0 = final, bit 1 = folded; others 0       |
|      8 |   16 | run_id      | bytes   | the run's 16-byte id (a UUID's bytes)         |
|     24 |    8 | config_hash | bytes   | first 8 bytes of the (config, params) hash    |
|     32 |    4 | sender      | u32     | sender rank                                   |
|     36 |    8 | round       | u64     | sender's round, < 2**63                       |
|     44 |    4 | part        | u32     | partition / shard / ring step (folded: below) |
|     48 |    4 | p           | u32     | number of partitions                          |
|     52 |    8 | offset      | u64     | first element in the flat vector              |
|     60 |    8 | length      | u64     | number of float32 values the body carries     |
|     68 |   32 | digest      | bytes   | BLAKE3-256(body)                              |
|    100 |      | body        | bytes   | float32: `length * 4` bytes; else the payload |

`offset + length` and `length * 4` must fit in a signed 64-bit integer.

A *folded* message (flag bit 1; `Partial.first_round` set) carries the sum of
the sender's rounds `round - part` .. `round` (on the wire `part` counts the
earlier rounds folded in; decoded, the Partial has part 0 and `first_round`):
what a sender owed a peer that was away goes back in one message
(akorun.transport.sender.OwedGap).

The codec byte (`akocore.codecs`, `Codec.wire_id`) says how the body carries
the values. A receiver takes float32 (1) or its run's own codec, whose
parameters (topk's fraction, ctopk's) the config hash pins, and refuses any other code
with 409: the header is authenticated, so a codec mismatch is detected before
the body is read. The body of a coded message is `codec.encoded_bytes(length)`
bytes; `to_partial` keeps it as the `Partial`'s payload and the runtime decodes
it (`akocore.codecs.exchange.decoded`) before the scheme sees it.

Checks and the HTTP status a server answers with (`Status`):

- `decode_header` parses and bounds-checks the header: 400 if malformed, 413 if
  the body would exceed the receiver's cap (so a server can refuse before it
  reads the body).
- `check_run`: 409 if the run id or config hash is not the receiver's.
- `check_body` / `BodyHasher`: 401 if the body does not match the header's
  digest. `BodyHasher` is fed the body chunk by chunk while a server streams it
  into a pooled buffer.
- `to_partial` turns a header and the body buffer into a `Partial` without a copy.

`decode` runs all of these in that order on a message held whole in memory.
(Version 1 carried an HMAC-SHA256 over one cluster-wide secret here instead of
the digest; see docs/guide/security.md for why it changed.)

Past ~500 lines: the layout table, the encoder and the bounds-checking decoder of
one header format (plain and folded messages, every codec) belong together.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
import uuid
from dataclasses import dataclass
from enum import IntEnum

import blake3
import numpy as np

from akocore.codecs import Codec, codec_named
from akocore.codecs.codec_registry import WIRE_IDS
from akocore.messages import FLOAT_BYTES, Kind, Partial

MAGIC = b"AKO1"
VERSION = 2
DTYPE_FLOAT32 = 1
FLAG_FINAL = 0x01
FLAG_FOLDED = 0x02
_FLAGS = FLAG_FINAL | FLAG_FOLDED
RUN_ID_BYTES = 16
CONFIG_HASH_BYTES = 8
DIGEST_BYTES = 32

HEADER_FORMAT = "<4sBBBB16s8sIQIIQQ"
FIELDS_SIZE = struct.calcsize(HEADER_FORMAT)  # the header bytes before the body digest
HEADER_SIZE = FIELDS_SIZE + DIGEST_BYTES
HASH_THREADS_FROM_BYTES = 1 << 20  # a sender hashes bodies from this size with threads

_I64_MAX = 2**63 - 1
_U32_MAX = 2**32 - 1
MAX_LENGTH = _I64_MAX // FLOAT_BYTES  # so that length * 4 fits in an i64

_WIRE_DTYPE = np.dtype("<f4")
_KINDS = frozenset(int(k) for k in Kind)

assert FIELDS_SIZE == 68 and HEADER_SIZE == 100


class Status(IntEnum):
    """The HTTP status a receiver answers a pushed message with."""

    OK = 200  # applied, or a duplicate acknowledged and dropped
    MALFORMED = 400  # not a well-formed message of this version
    BAD_SIGNATURE = 401  # not authenticated: seal missing or wrong, body not the digested one
    WRONG_RUN = 409  # another run or another model/config
    STALE_SESSION = 421  # sealed for an earlier instance of the receiver: rediscover, retry
    TOO_LARGE = 413  # body larger than the receiver accepts
    INBOX_FULL = 503  # receiver busy: keep the bytes, retry with backoff


class WireError(Exception):
    """A message was refused; `status` is the HTTP answer, `reason` says why."""

    def __init__(self, reason: str, status: Status) -> None:
        super().__init__(f"{int(status)} {status.name}: {reason}")
        self.reason = reason
        self.status = status


@dataclass(frozen=True, slots=True)
class Header:
    """A parsed, bounds-checked header (authenticated by akorun.transport.keys, not here)."""

    version: int
    kind: Kind
    dtype: int
    final: bool
    run_id: bytes
    config_hash: bytes
    sender: int
    round: int
    part: int
    p: int
    offset: int
    length: int
    digest: bytes
    first_round: int | None = None  # folded: the first round summed in (see the layout)
    codec: str = "none"  # the codec of the body (the run's, or "none" for float32)

    @property
    def body_nbytes(self) -> int:
        if self.codec == "none":
            return self.length * FLOAT_BYTES
        return codec_named(self.codec).encoded_bytes(self.length)

    @property
    def key(self) -> tuple[int, int, int]:
        """The duplicate-detection key, as `Partial.key`."""
        return (self.sender, self.round, self.part)


# --- identifiers -----------------------------------------------------------


def run_id_bytes(run_id: str | bytes | uuid.UUID) -> bytes:
    """The 16 wire bytes of a run id.

    A UUID (object or any string form `uuid.UUID` accepts) gives its 16 bytes;
    16 raw bytes pass through; any other string is hashed (BLAKE2b-128 of its
    UTF-8), so human run names such as "exp-42" work too.
    """
    if isinstance(run_id, uuid.UUID):
        return run_id.bytes
    if isinstance(run_id, bytes):
        if len(run_id) != RUN_ID_BYTES:
            raise ValueError(f"run id must be {RUN_ID_BYTES} bytes, got {len(run_id)}")
        return run_id
    try:
        return uuid.UUID(run_id).bytes
    except ValueError:
        return hashlib.blake2b(run_id.encode("utf-8"), digest_size=RUN_ID_BYTES).digest()


def config_hash_bytes(config_hash: str | bytes) -> bytes:
    """The 8 wire bytes of a config hash: 8 raw bytes, or a hex digest's first 8 bytes."""
    if isinstance(config_hash, bytes):
        raw = config_hash
    else:
        try:
            raw = bytes.fromhex(config_hash)
        except ValueError as exc:
            raise ValueError(f"config hash must be a hex string, got {config_hash!r}") from exc
    if len(raw) < CONFIG_HASH_BYTES:
        raise ValueError(
            f"config hash must have at least {CONFIG_HASH_BYTES} bytes "
            f"({2 * CONFIG_HASH_BYTES} hex digits), got {len(raw)}"
        )
    return raw[:CONFIG_HASH_BYTES]


def message_nbytes(length: int) -> int:
    """Bytes on the wire (header + float32 body) for a partial of `length` values."""
    return HEADER_SIZE + length * FLOAT_BYTES


# --- encoding --------------------------------------------------------------


def _check_range(name: str, value: int, high: int) -> None:
    if not 0 <= value <= high:
        raise ValueError(f"{name} must be in [0, {high}], got {value}")


def _body_view(partial: Partial) -> memoryview:
    """The values as a flat byte view, little-endian float32, copied only if needed."""
    values = partial.values
    if values is None:
        if partial.length != 0:
            raise ValueError(
                f"partial {partial.key} has length {partial.length} but no values; "
                "only a timing-only simulation may omit values"
            )
        return memoryview(b"")
    if values.dtype.kind != "f" or values.dtype.itemsize != FLOAT_BYTES:
        raise TypeError(f"values must be float32, got {values.dtype}")
    if values.size != partial.length:
        raise ValueError(
            f"partial {partial.key} says length {partial.length} but has {values.size} values"
        )
    wire = np.ascontiguousarray(values, dtype=_WIRE_DTYPE)  # the same array if already <f4
    if wire.ndim != 1:
        wire = wire.reshape(-1)
    return wire.data.cast("B")


def body_digest(body: bytes | bytearray | memoryview) -> bytes:
    """BLAKE3-256 of a body (with threads for a big one: blake3 releases the GIL)."""
    view = memoryview(body).cast("B")
    threads = blake3.blake3.AUTO if view.nbytes >= HASH_THREADS_FROM_BYTES else 1
    return blake3.blake3(view, max_threads=threads).digest()


def encode(partial: Partial, *, run_id: bytes, config_hash: bytes) -> tuple[bytes, memoryview]:
    """Header (with the body digest) and body of `partial`.

    The body is a zero-copy view over `partial.values` when that is a
    contiguous little-endian float32 array (else over a converted copy); keep
    the array unchanged until the body has been sent. Raises ValueError or
    TypeError for a partial that cannot be put on the wire.
    """
    if len(run_id) != RUN_ID_BYTES:
        raise ValueError(f"run_id must be {RUN_ID_BYTES} bytes, got {len(run_id)}")
    if len(config_hash) != CONFIG_HASH_BYTES:
        raise ValueError(f"config_hash must be {CONFIG_HASH_BYTES} bytes, got {len(config_hash)}")
    if int(partial.kind) not in _KINDS:
        raise ValueError(f"unknown kind {partial.kind!r}")
    _check_range("sender", partial.sender, _U32_MAX)
    _check_range("round", partial.round, _I64_MAX)
    _check_range("part", partial.part, _U32_MAX)
    part = partial.part
    if partial.first_round is not None:
        if partial.part != 0:
            raise ValueError(f"a folded partial has part 0, got {partial.part}")
        _check_range("first_round", partial.first_round, partial.round)
        part = partial.round - partial.first_round
        _check_range("rounds folded", part, _U32_MAX)
    _check_range("p", partial.p, _U32_MAX)
    _check_range("length", partial.length, MAX_LENGTH)
    _check_range("offset", partial.offset, _I64_MAX - partial.length)
    if partial.codec == "none":
        body, codec_id = _body_view(partial), DTYPE_FLOAT32
    else:
        codec = codec_named(partial.codec)
        if partial.payload is None or len(partial.payload) != codec.encoded_bytes(partial.length):
            raise ValueError(f"partial {partial.key} is coded {codec.name} but carries no "
                             f"payload of {codec.encoded_bytes(partial.length)} bytes")
        body, codec_id = memoryview(partial.payload).cast("B"), codec.wire_id
    fields = struct.pack(
        HEADER_FORMAT,
        MAGIC,
        VERSION,
        int(partial.kind),
        codec_id,
        (FLAG_FINAL if partial.final else 0)
        | (FLAG_FOLDED if partial.first_round is not None else 0),
        run_id,
        config_hash,
        partial.sender,
        partial.round,
        part,
        partial.p,
        partial.offset,
        partial.length,
    )
    return fields + body_digest(body), body


def encode_bytes(partial: Partial, *, run_id: bytes, config_hash: bytes) -> bytes:
    """The whole message as one bytes object (one copy of the body, into the result)."""
    header, body = encode(partial, run_id=run_id, config_hash=config_hash)
    return b"".join((header, body))


# --- decoding --------------------------------------------------------------


def decode_header(
    buf: bytes | bytearray | memoryview,
    *,
    max_body_bytes: int | None = None,
    body_nbytes: int | None = None,
    codec: Codec | None = None,
) -> Header:
    """Parse and bounds-check the first `HEADER_SIZE` bytes of `buf`.

    `max_body_bytes` is the receiver's cap (413 above it). `body_nbytes`, when
    known (Content-Length minus `HEADER_SIZE`, or the rest of a whole message),
    must equal the header's body size (400 otherwise). `codec` is the
    receiver's run's codec (None: float32 only); a message coded otherwise is
    refused (409). Does not check the run (`check_run`) nor the body
    (`check_body`).
    """
    if len(buf) < HEADER_SIZE:
        raise WireError(f"short header: got {len(buf)} bytes, need {HEADER_SIZE}", Status.MALFORMED)
    (
        magic,
        version,
        kind,
        dtype,
        flags,
        run_id,
        config_hash,
        sender,
        round_,
        part,
        p,
        offset,
        length,
    ) = struct.unpack_from(HEADER_FORMAT, buf)
    if magic != MAGIC:
        raise WireError(f"bad magic {bytes(magic)!r}, expected {MAGIC!r}", Status.MALFORMED)
    if version != VERSION:
        raise WireError(f"unknown version {version}, expected {VERSION}", Status.MALFORMED)
    if kind not in _KINDS:
        raise WireError(f"unknown kind {kind}", Status.MALFORMED)
    codec_name = "none"
    if dtype != DTYPE_FLOAT32:
        if dtype not in WIRE_IDS:
            raise WireError(f"unknown codec code {dtype}", Status.MALFORMED)
        if codec is None or codec.wire_id != dtype:
            raise WireError(
                f"codec mismatch: the message is coded {WIRE_IDS[dtype]}, this run takes "
                f"{'float32' if codec is None or codec.name == 'none' else codec.name}",
                Status.WRONG_RUN,
            )
        codec_name = codec.name
    if flags & ~_FLAGS:
        raise WireError(f"unknown flag bits {flags:#04x}", Status.MALFORMED)
    if round_ > _I64_MAX:
        raise WireError(f"round {round_} does not fit in a signed 64-bit int", Status.MALFORMED)
    first_round = None
    if flags & FLAG_FOLDED:
        if part > round_:
            raise WireError(f"folded message of {part + 1} rounds ending at round {round_}",
                            Status.MALFORMED)
        first_round, part = round_ - part, 0
    if length > MAX_LENGTH:
        raise WireError(f"length {length} overflows a 64-bit byte count", Status.MALFORMED)
    if offset > _I64_MAX - length:
        raise WireError(
            f"offset {offset} + length {length} overflows a signed 64-bit int", Status.MALFORMED
        )
    nbytes = length * FLOAT_BYTES if codec_name == "none" else codec_named(
        codec_name).encoded_bytes(length)
    if max_body_bytes is not None and nbytes > max_body_bytes:
        raise WireError(
            f"body of {nbytes} bytes ({length} values) exceeds the cap of {max_body_bytes} bytes",
            Status.TOO_LARGE,
        )
    if body_nbytes is not None and body_nbytes != nbytes:
        raise WireError(
            f"header says {length} values ({nbytes} bytes) but the body has {body_nbytes} bytes",
            Status.MALFORMED,
        )
    return Header(
        version=version,
        kind=Kind(kind),
        dtype=dtype,
        final=bool(flags & FLAG_FINAL),
        run_id=bytes(run_id),
        config_hash=bytes(config_hash),
        sender=sender,
        round=round_,
        part=part,
        p=p,
        offset=offset,
        length=length,
        digest=bytes(buf[FIELDS_SIZE:HEADER_SIZE]),
        first_round=first_round,
        codec=codec_name,
    )


def check_run(header: Header, run_id: bytes, config_hash: bytes) -> None:
    """Raise WireError(409) unless the message belongs to this run and this model."""
    if header.run_id != run_id:
        raise WireError(
            f"message is for run {header.run_id.hex()}, this is run {run_id.hex()}",
            Status.WRONG_RUN,
        )
    if header.config_hash != config_hash:
        raise WireError(
            f"sender's config hash {header.config_hash.hex()} differs from ours "
            f"{config_hash.hex()}: different config or initial parameters",
            Status.WRONG_RUN,
        )


class BodyHasher:
    """Incremental body check: feed the body chunk by chunk, then `check(digest)`."""

    __slots__ = ("_hash", "body_nbytes")

    def __init__(self) -> None:
        self._hash = blake3.blake3()
        self.body_nbytes = 0  # bytes fed so far

    def update(self, chunk: bytes | bytearray | memoryview) -> None:
        self._hash.update(chunk)
        self.body_nbytes += len(chunk)

    def check(self, digest: bytes | bytearray | memoryview) -> None:
        """Raise WireError(401) unless the body fed is the one `digest` commits to."""
        if not hmac.compare_digest(self._hash.digest(), bytes(digest)):
            raise WireError("body does not match the authenticated header's digest: altered "
                            "in transit or sent by someone else", Status.BAD_SIGNATURE)


def check_body(header: Header, body: bytes | bytearray | memoryview) -> None:
    """Raise WireError(401) unless `body` is the one the header's digest commits to."""
    hasher = BodyHasher()
    hasher.update(body)
    hasher.check(header.digest)


def to_partial(header: Header, body_array: np.ndarray | bytes | bytearray | memoryview) -> Partial:
    """The `Partial` a header and its body describe; values view `body_array` (no copy).

    `body_array` is any buffer of exactly `length * 4` bytes (e.g. the
    preallocated array the server streamed into). The values are read-only
    when the buffer is. A message with length 0 (e.g. a PULL) has values None.
    A coded message has values None and its body as `payload` (a copy), for the
    runtime to decode.
    """
    nbytes = (
        body_array.nbytes if isinstance(body_array, np.ndarray) else memoryview(body_array).nbytes
    )
    if nbytes != header.body_nbytes:
        raise WireError(
            f"body has {nbytes} bytes, header says {header.body_nbytes}", Status.MALFORMED
        )
    if header.codec != "none":
        return Partial(kind=header.kind, sender=header.sender, round=header.round,
                       part=header.part, p=header.p, offset=header.offset, length=header.length,
                       values=None, final=header.final, codec=header.codec,
                       payload=_payload_bytes(body_array))
    values = np.frombuffer(body_array, dtype=_WIRE_DTYPE) if header.length else None
    return Partial(
        kind=header.kind,
        sender=header.sender,
        round=header.round,
        part=header.part,
        p=header.p,
        offset=header.offset,
        length=header.length,
        values=values,
        final=header.final,
        first_round=header.first_round,
    )


def _payload_bytes(body: np.ndarray | bytes | bytearray | memoryview) -> bytes:
    """A coded body as its own bytes (the receive buffer goes back to its pool)."""
    return body.tobytes() if isinstance(body, np.ndarray) else bytes(body)


def decode(
    message: bytes | bytearray | memoryview,
    *,
    run_id: bytes,
    config_hash: bytes,
    max_body_bytes: int | None = None,
    codec: Codec | None = None,
) -> Partial:
    """Check and decode a whole in-memory message: 400/413, then 409, then 401 (digest).

    The header's authenticity is akorun.transport.keys' business (the request's seal); this
    checks that the body is the one the header commits to. The returned values
    view `message` (read-only if `message` is bytes).
    """
    view = memoryview(message).cast("B")
    header = decode_header(view, max_body_bytes=max_body_bytes,
                           body_nbytes=len(view) - HEADER_SIZE, codec=codec)
    check_run(header, run_id, config_hash)
    body = view[HEADER_SIZE:]
    check_body(header, body)
    return to_partial(header, body)
