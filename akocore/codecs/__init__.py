"""Codecs: what goes on the wire for a float32 vector, with error feedback.

Modules: interface (the `Codec` interface: encode with a residual, decode,
encoded_bytes), one module per codec (none, fp16, bf16, int8 with a
per-chunk scale, topk with uint32 indices + float32 values), codec_registry
(`codec_named`) and exchange (the one hook every scheme's sends pass through:
`attach_codec`). Pure: no I/O, no clocks.
"""

from akocore.codecs.codec_registry import CODEC_CHOICES, WIRE_IDS, codec_named
from akocore.codecs.interface import Codec

__all__ = ["CODEC_CHOICES", "WIRE_IDS", "Codec", "codec_named"]
