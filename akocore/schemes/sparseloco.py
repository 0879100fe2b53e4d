"""SparseLoCo: DiLoCo whose pseudo-gradients travel as chunked top-k at 2 bits, with error feedback.

SparseLoCo (arXiv 2508.15706; Covenant-72B, arXiv 2603.08163): every worker
takes H = ``exchange.inner_steps`` inner optimizer steps, as in DiLoCo, then
compresses its pseudo-gradient delta = anchor - theta with its own
error-feedback accumulator e (one per replica, never shared):
e <- beta * e + delta; send C(e); e <- e - decoded(C(e)), where C keeps, in
each chunk of ``exchange.sparseloco_chunk`` values, the
``exchange.sparseloco_topk_fraction`` largest in magnitude, quantised to
``exchange.sparseloco_bits`` bits (akocore.codecs.chunked_topk, codec
``ctopk``), and beta = ``exchange.sparseloco_error_decay``. The workers
all-gather the compressed pseudo-gradients (each sends its payload to every
peer: a sparse payload cannot be summed on the way as an all-reduce does)
and every replica applies the mean of the decoded ones with plain SGD at
``exchange.sparseloco_outer_lr``: the error feedback replaces the outer
momentum, so there is none.

What runs is `akocore.schemes.diloco.DilocoWorker` with the all-to-all sync
(``outer_sync = "all-to-all"``), outer SGD without momentum, and the ctopk
codec as the run's codec on its sends (`SparseLocoScheme.wire_codec`; the
codec's residual is e, `SendEncoder` keeps it). Each worker averages the
decoded value of its own pseudo-gradient, the value its peers decode, so
every replica applies the same outer update and the anchors stay bit-equal.
With a fraction of 1 and 32-bit values the codec is lossless and SparseLoCo
is DiLoCo with outer momentum 0, bit for bit (tests/test_schemes_sparseloco.py).
``exchange.codec`` must stay "none": the scheme names its own.

A lost member: as DiLoCo's all-to-all sync, the survivors apply a sync
without a peer once the shell suspends it (silent past the peer timeout) or
its final marker says it stopped before; they average what they received
(a payload that reached some survivors and not others leaves their anchors
apart: one averaged n decoded pseudo-gradients, the other n - 1, until
akorun's anchor re-sync, akorun.runtime.recovery.anchor_sync). The lost member's
accumulator e, what it had not sent yet, is lost with it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from akocore.codecs.chunked_topk import BITS, CHUNK_MAX, DEFAULT_CHUNK, ChunkedTopKCodec
from akocore.optim import NesterovSGD
from akocore.schemes.base import SchemeNode
from akocore.schemes.diloco import DilocoWorker, check_schedule
from akocore.schemes.diloco_settings import DilocoSettings
from akocore.schemes.knobs import SchemeSettings, knob, real, whole
from akocore.schemes.protocol import CodecView, ExchangeView, ReplicaOf, Scheme

if TYPE_CHECKING:
    from akocore.schemes.factory import SchemeSpec

DEFAULT_TOPK_FRACTION = 64 / 4096  # Covenant-72B: 64 of every 4096 values (1.56%)
DEFAULT_ERROR_DECAY = 0.95
DEFAULT_OUTER_LR = 1.0
_SPARSELOCO = "scheme sparseloco: "


def check_knobs(knobs: SparseLocoSettings) -> None:
    """ValueError naming the key when the chunk or the bits make no ctopk codec (each
    is read as any whole number first, so the planner may probe other values)."""
    if knobs.sparseloco_chunk > CHUNK_MAX:
        raise ValueError(f"exchange.sparseloco_chunk: got {knobs.sparseloco_chunk}, expected "
                         f"an integer 1 <= chunk <= {CHUNK_MAX}, e.g. 4096")
    if knobs.sparseloco_bits not in BITS:
        raise ValueError(f"exchange.sparseloco_bits: got {knobs.sparseloco_bits}, expected "
                         f"2, 4 or 8 bits a kept value, or 32 (float32, no quantisation)")


@dataclass(frozen=True)
class SparseLocoSettings(SchemeSettings):
    """SparseLoCo's own knobs ([exchange.sparseloco]); H is DiLoCo's exchange.inner_steps."""

    table: ClassVar[str] = "sparseloco"

    sparseloco_topk_fraction: float = knob(
        DEFAULT_TOPK_FRACTION,
        parse=real(lambda v: 0 < v <= 1, "a fraction 0 < k <= 1, e.g. 0.015625"),
        help=_SPARSELOCO + "k, the fraction of each chunk of the pseudo-gradient sent "
        "(the largest in magnitude; 0.015625 = 64 of every 4096)",
        flag="--sparseloco-topk-fraction", metavar="K",
        flag_help=_SPARSELOCO + "fraction of each chunk sent, e.g. 0.015625")
    sparseloco_chunk: int = knob(
        DEFAULT_CHUNK, parse=whole(1, f"an integer 1 <= chunk <= {CHUNK_MAX}, e.g. 4096"),
        help=_SPARSELOCO + f"values per chunk of the top-k selection (at most {CHUNK_MAX})",
        flag="--sparseloco-chunk", metavar="VALUES",
        flag_help=_SPARSELOCO + "values per top-k chunk, e.g. 4096")
    sparseloco_bits: int = knob(
        2, parse=whole(1, "2, 4 or 8 bits a kept value, or 32 (float32, no quantisation)"),
        help=_SPARSELOCO + "bits per kept value: 2, 4 or 8 (quantised per chunk), or 32 "
        "(float32, no quantisation)",
        flag="--sparseloco-bits", metavar="BITS",
        flag_help=_SPARSELOCO + "bits per kept value, 2, 4, 8 or 32")
    sparseloco_error_decay: float = knob(
        DEFAULT_ERROR_DECAY,
        parse=real(lambda v: 0 <= v <= 1, "a decay 0 <= beta <= 1, e.g. 0.95"),
        help=_SPARSELOCO + "beta, the decay of each worker's error-feedback accumulator "
        "before it adds the next pseudo-gradient (1 = plain error feedback)",
        flag="--sparseloco-error-decay", metavar="BETA",
        flag_help=_SPARSELOCO + "error-feedback decay, e.g. 0.95")
    sparseloco_outer_lr: float = knob(
        DEFAULT_OUTER_LR, parse=real(lambda v: v > 0, "a learning rate > 0, e.g. 1"),
        help=_SPARSELOCO + "the outer SGD's learning rate (no outer momentum: the error "
        "feedback replaces it)",
        flag="--sparseloco-outer-lr", metavar="LR",
        flag_help=_SPARSELOCO + "outer SGD learning rate, e.g. 1")

    def codec(self) -> ChunkedTopKCodec:
        """The compressor these settings make (with its error-feedback decay)."""
        return ChunkedTopKCodec(self.sparseloco_topk_fraction, self.sparseloco_chunk,
                                self.sparseloco_bits, self.sparseloco_error_decay)


class SparseLocoScheme(Scheme):
    """SparseLoCo: DiLoCo with chunked top-k, b-bit pseudo-gradients and error feedback."""

    name = "sparseloco"
    summary = ("DiLoCo whose pseudo-gradients travel as chunked top-k at 2 bits, error "
               "feedback in place of outer momentum")
    settings = SparseLocoSettings
    pattern = "all-gather"

    @property
    def keys(self) -> tuple[str, ...]:
        return ("inner_steps", *SparseLocoSettings.names())

    def _inner_steps(self, setting: ExchangeView | CodecView) -> int:
        return setting.knobs(DilocoSettings).inner_steps

    def check_spec(self, spec: SchemeSpec) -> None:
        self._check_codec(spec.codec, "codec")
        check_knobs(spec.knobs(SparseLocoSettings))
        check_schedule(self._inner_steps(spec), 1, 0)

    def check_exchange(self, exchange: ExchangeView) -> None:
        self._check_codec(exchange.codec, "exchange.codec")
        check_knobs(exchange.knobs(SparseLocoSettings))
        check_schedule(self._inner_steps(exchange), 1, 0)

    @staticmethod
    def _check_codec(codec: str, key: str) -> None:
        if codec != "none":
            raise ValueError(f"{key}: got {codec!r}, expected none with scheme sparseloco "
                             f"(it compresses its pseudo-gradients itself: "
                             f"exchange.sparseloco_topk_fraction, _chunk, _bits)")

    def wire_codec(self, setting: ExchangeView | CodecView) -> str:
        return setting.knobs(SparseLocoSettings).codec().name

    def build(self, spec: SchemeSpec, length: int, params0: np.ndarray | None,
              replica: ReplicaOf) -> list[SchemeNode]:
        knobs = spec.knobs(SparseLocoSettings)
        outer = NesterovSGD(knobs.sparseloco_outer_lr, 0.0)  # plain SGD: no momentum
        return [DilocoWorker(i, spec.workers, length, replica=replica(i, params0),
                             inner_steps=self._inner_steps(spec), outer=outer,
                             outer_sync="all-to-all") for i in range(spec.workers)]

    def staleness_bound(self, exchange: ExchangeView, *, p_max: int, ssp: float) -> float:
        """H - 1: the others' inner steps since the last sync (as DiLoCo's)."""
        return float(self._inner_steps(exchange) - 1)

    def effective_ssp(self, exchange: ExchangeView) -> float:
        return 0.0

    def period_rounds(self, exchange: ExchangeView) -> int:
        return self._inner_steps(exchange)

    def plan_grid(self, exchange: ExchangeView) -> Mapping[str, Sequence[Any]]:
        """Half and twice the paper's k, and float32 values (no quantisation)."""
        return {"sparseloco_topk_fraction": (32 / 4096, 128 / 4096), "sparseloco_bits": (32,)}

    def label(self, exchange: ExchangeView) -> str:
        knobs = exchange.knobs(SparseLocoSettings)
        bits = "f32" if knobs.sparseloco_bits == 32 else f"{knobs.sparseloco_bits}-bit"
        return (f"H={self._inner_steps(exchange)} "
                f"k={knobs.sparseloco_topk_fraction * 100:.3g}%/{knobs.sparseloco_chunk} {bits}")


SPARSELOCO = SparseLocoScheme()
