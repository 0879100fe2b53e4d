"""Codecs: what goes on the wire for a float32 vector, with error feedback.

Modules: base (the `Codec` interface: encode with a residual, decode,
encoded_bytes), one module per codec (none, fp16, bf16, int8 with a
per-chunk scale, topk with uint32 indices + float32 values), registry
(`codec_named`) and exchange (the one hook every scheme's sends pass through:
`attach_codec`). Pure: no I/O, no clocks.
"""

from akocore.codecs.base import Codec
from akocore.codecs.registry import CODEC_CHOICES, WIRE_IDS, codec_named

__all__ = ["CODEC_CHOICES", "WIRE_IDS", "Codec", "codec_named"]
