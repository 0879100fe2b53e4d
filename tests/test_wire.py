"""akorun.transport.wire: round trips, body digests, run checks, caps and malformed input."""

from __future__ import annotations

import dataclasses
import struct
import uuid

import blake3
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from akocore.messages import Kind, Partial
from akorun.transport import wire
from akorun.transport.wire import (
    FIELDS_SIZE,
    HEADER_SIZE,
    BodyHasher,
    Status,
    WireError,
    check_body,
    check_run,
    decode,
    decode_header,
    encode,
    encode_bytes,
    to_partial,
)

RUN = uuid.UUID("12345678-1234-5678-1234-567812345678").bytes
OTHER_RUN = uuid.UUID("87654321-4321-8765-4321-876543218765").bytes
CONFIG = bytes.fromhex("0123456789abcdef")
KEYS = dict(run_id=RUN, config_hash=CONFIG)


def checked(message: bytes | bytearray, max_body_bytes: int | None = None) -> Partial:
    """`decode` as the receiver of this run does."""
    return decode(
        message, run_id=RUN, config_hash=CONFIG, max_body_bytes=max_body_bytes
    )


def grad(length: int = 10, **fields: object) -> Partial:
    values = np.arange(length, dtype=np.float32) * 0.5 - 1.0
    base: dict[str, object] = dict(
        kind=Kind.GRAD, sender=3, round=17, part=2, p=4, offset=1000, length=length, values=values
    )
    base.update(fields)
    return Partial(**base)  # type: ignore[arg-type]


def assert_same_partial(got: Partial, want: Partial) -> None:
    for name in ("kind", "sender", "round", "part", "p", "offset", "length", "final"):
        assert getattr(got, name) == getattr(want, name), name
    if want.values is None:
        assert got.values is None
    else:
        assert got.values is not None
        np.testing.assert_array_equal(got.values, want.values)


# --- round trips -----------------------------------------------------------


@pytest.mark.parametrize("kind", list(Kind))
@pytest.mark.parametrize("final", [False, True])
def test_round_trip_preserves_every_field_for_every_kind(kind: Kind, final: bool) -> None:
    partial = grad(7, kind=kind, final=final)
    got = checked(encode_bytes(partial, **KEYS))
    assert_same_partial(got, partial)
    assert got.kind is kind


def test_round_trip_of_a_pull_without_values_has_an_empty_body() -> None:
    pull = Partial(kind=Kind.PULL, sender=1, round=5, part=0, p=2, offset=0, length=0)
    header, body = encode(pull, **KEYS)
    assert len(header) == HEADER_SIZE and len(body) == 0
    got = checked(header + bytes(body))
    assert_same_partial(got, pull)
    assert got.values is None


def test_round_trip_of_extreme_field_values() -> None:
    partial = grad(
        3, sender=2**32 - 1, round=2**63 - 1, part=2**32 - 1, p=2**32 - 1, offset=2**63 - 4
    )
    assert_same_partial(checked(encode_bytes(partial, **KEYS)), partial)


def test_header_is_fixed_size_and_body_is_raw_little_endian_float32() -> None:
    partial = grad(5)
    message = encode_bytes(partial, **KEYS)
    assert len(message) == HEADER_SIZE + 5 * 4 == wire.message_nbytes(5)
    assert message[:4] == b"AKO1"
    assert message[HEADER_SIZE:] == np.asarray(partial.values, dtype="<f4").tobytes()
    header = decode_header(message)
    assert header.key == partial.key
    assert header.body_nbytes == 20
    assert header.digest == message[FIELDS_SIZE:HEADER_SIZE]
    assert header.digest == blake3.blake3(message[HEADER_SIZE:]).digest()


def test_big_endian_values_are_converted_to_little_endian() -> None:
    values = np.linspace(-3, 3, 9).astype(">f4")
    partial = grad(9, values=values)
    header, body = encode(partial, **KEYS)
    assert bytes(body) == values.astype("<f4").tobytes()
    assert not np.shares_memory(np.frombuffer(body, dtype="<f4"), values)
    assert_same_partial(checked(header + bytes(body)), partial)


def test_body_is_zero_copy_for_a_contiguous_little_endian_float32_array() -> None:
    values = np.arange(1000, dtype="<f4")
    _, body = encode(grad(1000, values=values), **KEYS)
    assert body.obj is values
    assert np.shares_memory(np.frombuffer(body, dtype="<f4"), values)


def test_non_contiguous_values_are_copied_into_a_contiguous_body() -> None:
    values = np.arange(20, dtype="<f4")[::2]
    _, body = encode(grad(10, values=values), **KEYS)
    np.testing.assert_array_equal(np.frombuffer(body, dtype="<f4"), values)


def test_to_partial_views_the_receive_buffer_without_copying() -> None:
    partial = grad(64)
    header_bytes, body = encode(partial, **KEYS)
    received = np.empty(64 * 4, dtype=np.uint8)
    received[:] = np.frombuffer(body, dtype=np.uint8)
    got = to_partial(decode_header(header_bytes), received)
    assert got.values is not None and np.shares_memory(got.values, received)
    assert_same_partial(got, partial)


def test_to_partial_refuses_a_body_of_the_wrong_size() -> None:
    header = decode_header(encode(grad(4), **KEYS)[0])
    with pytest.raises(WireError) as err:
        to_partial(header, bytes(15))
    assert err.value.status == Status.MALFORMED


# --- body digest -----------------------------------------------------------


def test_check_body_accepts_an_untouched_message() -> None:
    header, body = encode(grad(10), **KEYS)
    check_body(decode_header(header), body)


def test_flipping_any_byte_of_digest_or_body_is_refused_with_401() -> None:
    message = bytearray(encode_bytes(grad(10), **KEYS))
    for index in range(FIELDS_SIZE, len(message)):
        tampered = bytearray(message)
        tampered[index] ^= 0x01
        with pytest.raises(WireError) as err:
            checked(tampered)
        assert err.value.status == Status.BAD_SIGNATURE, index
    # a flipped field changes the header, which akorun.transport.keys' seal commits to
    # (tests/test_security_sessions.py)


def test_body_truncated_or_extended_fails_the_digest() -> None:
    header, body = encode(grad(10), **KEYS)
    for bad in (body[:-1], bytes(body) + b"\0"):
        with pytest.raises(WireError) as err:
            check_body(decode_header(header), bad)
        assert err.value.status == Status.BAD_SIGNATURE


@settings(max_examples=50, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=8))
def test_incremental_hasher_accepts_the_body_in_any_chunking(cuts: list[int]) -> None:
    header, body = encode(grad(100), **KEYS)
    bounds = [0, *sorted(cuts), len(body)]
    hasher = BodyHasher()
    for start, stop in zip(bounds, bounds[1:], strict=False):
        hasher.update(body[start:stop])
    assert hasher.body_nbytes == len(body)
    hasher.check(decode_header(header).digest)


def test_incremental_hasher_refuses_a_changed_chunk() -> None:
    header, body = encode(grad(100), **KEYS)
    hasher = BodyHasher()
    hasher.update(body[:200])
    hasher.update(bytes(200))
    with pytest.raises(WireError) as err:
        hasher.check(header[FIELDS_SIZE:])
    assert err.value.status == Status.BAD_SIGNATURE


def test_a_big_body_is_digested_with_threads_to_the_same_digest() -> None:
    values = np.random.default_rng(0).standard_normal(1 << 19).astype(np.float32)
    assert wire.body_digest(values.data) == blake3.blake3(values.tobytes()).digest()


# --- run and config --------------------------------------------------------


def test_wrong_run_id_is_refused_with_409() -> None:
    message = encode_bytes(grad(), run_id=OTHER_RUN, config_hash=CONFIG)
    with pytest.raises(WireError) as err:
        checked(message)
    assert err.value.status == Status.WRONG_RUN == 409
    assert OTHER_RUN.hex() in err.value.reason


def test_wrong_config_hash_is_refused_with_409() -> None:
    header = decode_header(encode(grad(), run_id=RUN, config_hash=bytes(8))[0])
    with pytest.raises(WireError) as err:
        check_run(header, RUN, CONFIG)
    assert err.value.status == Status.WRONG_RUN


def test_run_id_and_config_hash_helpers() -> None:
    run = uuid.uuid4()
    assert wire.run_id_bytes(run) == wire.run_id_bytes(str(run)) == run.bytes
    assert wire.run_id_bytes(run.hex) == run.bytes
    assert len(wire.run_id_bytes("exp-42")) == 16
    assert wire.run_id_bytes("exp-42") != wire.run_id_bytes("exp-43")
    assert wire.config_hash_bytes("0123456789abcdef" * 4) == CONFIG
    assert wire.config_hash_bytes(CONFIG) == CONFIG
    with pytest.raises(ValueError, match="hex"):
        wire.config_hash_bytes("not hex")
    with pytest.raises(ValueError, match="at least 8 bytes"):
        wire.config_hash_bytes("abcd")


# --- caps ------------------------------------------------------------------


def test_oversized_body_is_refused_with_413_from_the_header_alone() -> None:
    header, _ = encode(grad(1000), **KEYS)
    decode_header(header, max_body_bytes=4000)
    with pytest.raises(WireError) as err:
        decode_header(header, max_body_bytes=3999)
    assert err.value.status == Status.TOO_LARGE == 413
    with pytest.raises(WireError) as err:
        checked(encode_bytes(grad(1000), **KEYS), max_body_bytes=1024)
    assert err.value.status == Status.TOO_LARGE


# --- malformed input -------------------------------------------------------


def malformed(buf: bytes | bytearray, **kwargs: object) -> WireError:
    with pytest.raises(WireError) as err:
        decode_header(buf, **kwargs)  # type: ignore[arg-type]
    assert err.value.status == Status.MALFORMED, err.value
    return err.value


def with_field(message: bytes, index: int, value: object) -> bytes:
    fields = list(struct.unpack_from(wire.HEADER_FORMAT, message))
    fields[index] = value
    return struct.pack(wire.HEADER_FORMAT, *fields) + message[FIELDS_SIZE:]


def test_malformed_headers_are_refused_with_400() -> None:
    message = encode_bytes(grad(4), **KEYS)
    assert "short header" in malformed(message[: HEADER_SIZE - 1]).reason
    assert "short header" in malformed(b"").reason
    assert "magic" in malformed(b"XXXX" + message[4:]).reason
    assert "version" in malformed(with_field(message, 1, 1)).reason  # version 1: HMAC
    assert "kind" in malformed(with_field(message, 2, 0)).reason
    assert "kind" in malformed(with_field(message, 2, 99)).reason
    assert "codec" in malformed(with_field(message, 3, 9)).reason  # no codec has code 9
    assert "flag" in malformed(with_field(message, 4, 0x82)).reason
    assert "round" in malformed(with_field(message, 8, 2**63)).reason
    assert "length" in malformed(with_field(message, 12, 2**62)).reason
    assert "offset" in malformed(with_field(message, 11, 2**63 - 2)).reason


def test_body_size_that_does_not_match_length_is_refused_with_400() -> None:
    message = encode_bytes(grad(4), **KEYS)
    assert "body has 12 bytes" in malformed(message, body_nbytes=12).reason
    for bad in (message[:-1], message + b"\0\0\0\0"):
        with pytest.raises(WireError) as err:
            checked(bad)
        assert err.value.status == Status.MALFORMED


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=3 * HEADER_SIZE))
def test_random_bytes_only_ever_raise_wire_errors(data: bytes) -> None:
    for buf in (data, b"AKO1\x02" + data):
        try:
            checked(buf, max_body_bytes=1 << 20)
        except WireError as err:
            assert err.status in (400, 401, 409, 413)


@settings(max_examples=300, deadline=None)
@given(
    fields=st.tuples(
        st.integers(0, 255),
        st.integers(0, 255),
        st.integers(0, 255),
        st.integers(0, 255),
        st.integers(0, 2**32 - 1),
        st.integers(0, 2**64 - 1),
        st.integers(0, 2**32 - 1),
        st.integers(0, 2**32 - 1),
        st.integers(0, 2**64 - 1),
        st.one_of(st.integers(0, 8), st.integers(0, 2**64 - 1)),
    ),
    body=st.binary(max_size=40),
)
def test_any_field_values_only_ever_raise_wire_errors(fields: tuple[int, ...], body: bytes) -> None:
    version, kind, dtype, flags, sender, round_, part, p, offset, length = fields
    signed = struct.pack(
        wire.HEADER_FORMAT, b"AKO1", version, kind, dtype, flags, RUN, CONFIG,
        sender, round_, part, p, offset, length,
    )  # fmt: skip
    digest = blake3.blake3(body).digest()
    try:
        got = checked(signed + digest + body, max_body_bytes=1 << 20)
    except WireError:
        return
    assert got.length * 4 == len(body)
    assert (version, dtype, flags & ~1) == (2, 1, 0)


# --- encoding errors -------------------------------------------------------


def test_partials_that_cannot_go_on_the_wire_raise_value_or_type_errors() -> None:
    with pytest.raises(ValueError, match="round"):
        encode(grad(round=-1), **KEYS)
    with pytest.raises(ValueError, match="sender"):
        encode(grad(sender=2**32), **KEYS)
    with pytest.raises(ValueError, match="says length 11"):
        encode(dataclasses.replace(grad(10), length=11), **KEYS)
    with pytest.raises(ValueError, match="no values"):
        encode(grad(10, values=None), **KEYS)
    with pytest.raises(TypeError, match="float32"):
        encode(grad(3, values=np.zeros(3)), **KEYS)
    with pytest.raises(ValueError, match="run_id"):
        encode(grad(), run_id=b"short", config_hash=CONFIG)
    with pytest.raises(ValueError, match="config_hash"):
        encode(grad(), run_id=RUN, config_hash=b"")
