"""akorun's wire carries the codec in its authenticated header: coded bodies round-trip,
a receiver takes float32 or its own codec and refuses any other (409)."""

from __future__ import annotations

import uuid

import numpy as np
import pytest

from akocore.codecs import codec_named
from akocore.codecs.exchange import SendEncoder, decoded
from akocore.messages import Kind, Partial
from akorun.transport import wire
from akorun.transport.wire import HEADER_SIZE, Status, WireError

KEYS = dict(run_id=uuid.UUID(int=7).bytes, config_hash=b"12345678")


def coded(name: str, length: int = 3000) -> Partial:
    values = np.random.default_rng(0).standard_normal(length).astype(np.float32)
    encoder = SendEncoder(codec_named(name), length, with_values=True)
    return encoder.encode_message(Partial(Kind.GRAD, 1, 5, 0, 1, 0, length, values))


@pytest.mark.parametrize("name", ["fp16", "bf16", "int8", "topk:0.01", "ctopk:0.02:4096:2:1"])
def test_a_coded_partial_round_trips_with_its_decoded_values(name: str) -> None:
    partial = coded(name)
    message = wire.encode_bytes(partial, **KEYS)
    assert len(message) == HEADER_SIZE + codec_named(name).encoded_bytes(3000)
    assert message[6] == codec_named(name).wire_id
    got = wire.decode(message, **KEYS, codec=codec_named(name))
    assert got.codec == name and got.values is None and got.key == partial.key
    got = decoded(got)
    assert got.values is not None and np.array_equal(got.values, partial.values)


def test_a_receiver_refuses_another_codec_before_the_body() -> None:
    message = wire.encode_bytes(coded("int8"), **KEYS)
    for receiver in (None, codec_named("none"), codec_named("fp16"), codec_named("topk:0.5")):
        with pytest.raises(WireError, match="codec mismatch") as refused:
            wire.decode_header(message[:HEADER_SIZE], codec=receiver)
        assert refused.value.status == Status.WRONG_RUN


def test_a_coded_receiver_still_takes_float32_bodies() -> None:
    values = np.arange(8, dtype=np.float32)
    message = wire.encode_bytes(Partial(Kind.GRAD, 1, 0, 0, 1, 0, 8, values), **KEYS)
    got = wire.decode(message, **KEYS, codec=codec_named("int8"))
    assert got.codec == "none" and np.array_equal(got.values, values)


def test_an_unknown_codec_code_is_malformed() -> None:
    message = bytearray(wire.encode_bytes(coded("int8"), **KEYS))
    message[6] = 77
    with pytest.raises(WireError) as refused:
        wire.decode_header(bytes(message[:HEADER_SIZE]), codec=codec_named("int8"))
    assert refused.value.status == Status.MALFORMED


def test_a_coded_body_of_the_wrong_size_is_malformed() -> None:
    message = wire.encode_bytes(coded("int8"), **KEYS)
    with pytest.raises(WireError) as refused:
        wire.decode(message[:-1], **KEYS, codec=codec_named("int8"))
    assert refused.value.status == Status.MALFORMED
