"""Every codec by name: `codec_named("int8")`, `codec_named("topk:0.01")`.

Adding a codec is one module (a `Codec` subclass) and one entry in `_FIXED`
(or a parameterised family beside "topk" and "ctopk"). `CODEC_CHOICES` is the text a
user error and the help show.
"""

from __future__ import annotations

from functools import lru_cache

from akocore.codecs.bf16 import BF16
from akocore.codecs.chunked_topk import ChunkedTopKCodec, parse_ctopk
from akocore.codecs.fp16 import FP16
from akocore.codecs.int8 import INT8
from akocore.codecs.interface import Codec
from akocore.codecs.none import NONE
from akocore.codecs.topk import TopKCodec

_FIXED: dict[str, Codec] = {codec.name: codec for codec in (NONE, FP16, BF16, INT8)}
CODEC_CHOICES = ("none, fp16, bf16, int8 or topk:FRACTION (0 < FRACTION <= 1, e.g. topk:0.01), "
                 "or ctopk:FRACTION[:CHUNK[:BITS[:DECAY]]] (SparseLoCo's chunked top-k, "
                 "e.g. ctopk:0.0156:4096:2)")
WIRE_IDS = {codec.wire_id: codec.name for codec in _FIXED.values()} | {
    TopKCodec.wire_id: "topk", ChunkedTopKCodec.wire_id: "ctopk"}


@lru_cache(maxsize=64)
def codec_named(text: str) -> Codec:
    """The codec `text` names; ValueError saying what is allowed otherwise."""
    name = str(text).strip().lower()
    if name in _FIXED:
        return _FIXED[name]
    family, sep, arg = name.partition(":")
    if family == "topk" and sep:
        try:
            fraction = float(arg)
        except ValueError:
            fraction = float("nan")
        if 0 < fraction <= 1:
            return TopKCodec(fraction)
    if family == "ctopk" and sep:
        found = parse_ctopk(arg)
        if found is not None:
            return found
    raise ValueError(f"codec: got {text!r}, expected {CODEC_CHOICES}")
