"""The one hook every scheme's sends pass through: `attach_codec(node, codec)`.

A scheme never calls a codec. `attach_codec` wraps the node's three entry
points that return `Send` effects (local_step, finish, receive) so that every
outgoing message of a kind in `akocore.messages.CODED_KINDS` is encoded once,
before it is multicast or queued (a scheme that must use the decoded value of
its own contribution, as DiLoCo's average does, has its message encoded
earlier through `SchemeNode.coded`, which asks this encoder; the wrapper then
leaves the coded message as it is): its payload is the codec's bytes, its
`values` are what each receiver decodes (so a retransmission carries the same
values and exactly-once holds for the decoded values), its `nbytes` the
encoded size. Error feedback: `SendEncoder.residual` (one float32 vector of
the model's length per node) keeps, per element, what the codec has not
carried yet; it is added to the next message over the same range. So, per
sender, everything sent (decoded) plus the residual equals everything the
scheme produced.

When the node settles after the drain, what is still in the residual will
never be sent; the hook hands it to `SchemeNode.withdraw`, so that a scheme
that applied its own contribution in full (ako) takes that part back and every
replica holds the same decoded sum.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from akocore.codecs.codec_registry import codec_named
from akocore.codecs.interface import F32, Codec
from akocore.messages import CODED_KINDS, Partial, Receipt, Send


class SendEncoder:
    """Encodes one node's outgoing messages with a codec and keeps its residual."""

    def __init__(self, codec: Codec, length: int, with_values: bool) -> None:
        self.codec = codec
        self.residual = np.zeros(length, F32) if with_values and codec.lossy else None
        self.encoded_values = 0  # values encoded so far
        # what the residual still held when the node settled: never sent to anyone
        self.withdrawn = np.zeros(length, F32) if self.residual is not None else None

    def encode_message(self, msg: Partial) -> Partial:
        if msg.kind not in CODED_KINDS or msg.codec != "none":
            return msg
        if msg.values is None:  # timing only: the size is what counts
            return dataclasses.replace(msg, codec=self.codec.name)
        window = None
        if self.residual is not None:
            window = self.residual[msg.offset:msg.offset + msg.length]
        payload, decoded, left = self.codec.encode_decoded(msg.values, window)
        if window is not None:
            window[:] = left
        self.encoded_values += msg.length
        return dataclasses.replace(msg, values=decoded, payload=payload, codec=self.codec.name)

    def encode(self, effects: Sequence[Send]) -> list[Send]:
        return [Send(send.dests, self.encode_message(send.message)) for send in effects]


def decoded(msg: Partial) -> Partial:
    """`msg` with the values its payload carries (a receiver's side of the wire); a
    message that already has its values, or none to have, is returned as is.
    ValueError when the payload is not one the codec produces."""
    if msg.codec == "none" or msg.values is not None or msg.payload is None:
        return msg
    values = codec_named(msg.codec).decode(msg.payload, msg.length)
    return dataclasses.replace(msg, values=values)


def codec_cpu_s(effects: Sequence[Send]) -> float:
    """Seconds of codec CPU behind `effects`: each coded message's encode, plus one
    decode (the receivers decode in parallel), at the codec's per-element cost."""
    return sum(codec_named(send.message.codec).cpu_s(send.message.length)
               for send in effects if send.message.codec != "none")


def attach_codec(node: Any, codec: Codec) -> SendEncoder | None:
    """Put `codec` on every message `node` sends; None (node untouched) for "none"."""
    if codec.name == "none":
        return None
    encoder = SendEncoder(codec, node.length, node.replica.has_data)
    local_step: Callable[..., list[Send]] = node.local_step
    finish: Callable[[int], list[Send]] = node.finish
    receive: Callable[[Partial], Receipt] = node.receive
    settle: Callable[[], None] = node.settle

    def coded_local_step(round_: int, grad: np.ndarray | None) -> list[Send]:
        return encoder.encode(local_step(round_, grad))

    def coded_finish(rounds_done: int) -> list[Send]:
        return encoder.encode(finish(rounds_done))

    def coded_receive(msg: Partial) -> Receipt:
        receipt = receive(msg)
        if not receipt.effects:
            return receipt
        return Receipt(receipt.accepted, tuple(encoder.encode(receipt.effects)))

    def coded_settle() -> None:
        settle()
        if encoder.residual is not None and np.any(encoder.residual):
            node.withdraw(encoder.residual.copy())
            assert encoder.withdrawn is not None
            encoder.withdrawn += encoder.residual
            encoder.residual[:] = 0.0

    node.local_step = coded_local_step
    node.finish = coded_finish
    node.receive = coded_receive
    node.settle = coded_settle
    node.encoder = encoder
    return encoder
