"""DiLoCo's settings: the knobs of diloco and streaming-diloco, [exchange.diloco].

`DilocoSettings` is the one place the DiLoCo family's knobs are written: each
field's default, help, parser and flag (akocore.schemes.knobs); the settings
layers generate the keys ``exchange.inner_steps`` ..., the TOML table
``[exchange.diloco]``, the flags ``--inner-steps`` ... and their reference from
it. How H, P and tau combine is checked by the schemes
(akocore.schemes.diloco.check_schedule).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from akocore.schemes.diloco_sync import DEFAULT_OUTER_SYNC, OUTER_SYNCS
from akocore.schemes.knobs import SchemeSettings, knob, one_of, preset, real, truth, whole

DEFAULT_INNER_STEPS = 10
DEFAULT_OUTER_LR = 0.7  # the DiLoCo paper's outer learning rate
DEFAULT_OUTER_MOMENTUM = 0.9
DEFAULT_FRAGMENTS = 2
DEFAULT_OVERLAP_STEPS = 1


# MuLoCo (arXiv 2505.23725): DiLoCo with Muon as the inner optimizer (optax.contrib.muon
# on the workload's parameter pytree); configs/presets/muloco.toml holds the same
MULOCO = preset("muloco", "MuLoCo: DiLoCo with Muon (optax.contrib.muon) as the inner "
                "optimizer", {"scheme": "diloco"}, {"optimizer": "muon"})

_EVERY_DILOCO = "scheme diloco, streaming-diloco: "
_STREAMING = "scheme streaming-diloco: "


@dataclass(frozen=True)
class DilocoSettings(SchemeSettings):
    """The knobs of diloco and streaming-diloco ([exchange.diloco]); the first four are
    DiLoCo's, the rest Streaming DiLoCo's (how they combine: `check_schedule`)."""

    table: ClassVar[str] = "diloco"

    inner_steps: int = knob(
        DEFAULT_INNER_STEPS, parse=whole(1),
        help=_EVERY_DILOCO + "H, inner optimizer steps (rounds) between two syncs of the "
        "model (of each fragment)",
        flag="--inner-steps", metavar="H",
        flag_help=_EVERY_DILOCO + "inner optimizer steps between syncs, e.g. 10")
    outer_lr: float = knob(
        DEFAULT_OUTER_LR, parse=real(lambda v: v > 0, "a learning rate > 0, e.g. 0.7"),
        help=_EVERY_DILOCO + "the outer optimizer's learning rate",
        flag="--outer-lr", metavar="LR", flag_help=_EVERY_DILOCO + "outer learning rate, e.g. 0.7")
    outer_momentum: float = knob(
        DEFAULT_OUTER_MOMENTUM,
        parse=real(lambda v: 0 <= v < 1, "a momentum 0 <= m < 1, e.g. 0.9"),
        help=_EVERY_DILOCO + "the outer optimizer's Nesterov momentum (0 = plain SGD)",
        flag="--outer-momentum", metavar="M",
        flag_help=_EVERY_DILOCO + "outer Nesterov momentum, e.g. 0.9")
    outer_sync: str = knob(
        DEFAULT_OUTER_SYNC, parse=one_of(OUTER_SYNCS),
        help=_EVERY_DILOCO + "how the pseudo-gradients are averaged: allreduce "
        "(reduce-scatter to chunk owners, then all-gather: 2(n-1)/n copies per uplink) or "
        "all-to-all (every worker sends its whole delta to every peer: n-1 copies, one "
        "latency)",
        flag="--outer-sync", choices=OUTER_SYNCS,
        flag_help=_EVERY_DILOCO + "allreduce (default) or all-to-all")
    fragments: int = knob(
        DEFAULT_FRAGMENTS, parse=whole(1),
        help=_STREAMING + "P, fragments synced in turn (a divisor of inner_steps)",
        flag="--fragments", metavar="P",
        flag_help=_STREAMING + "fragments synced in turn, e.g. 2")
    overlap_steps: int = knob(
        DEFAULT_OVERLAP_STEPS, parse=whole(0),
        help=_STREAMING + "tau, inner steps a fragment's sync overlaps "
        "(tau < inner_steps / fragments)",
        flag="--overlap-steps", metavar="TAU",
        flag_help=_STREAMING + "inner steps each sync overlaps, e.g. 1")
    merge_alpha: float = knob(
        0.0, parse=real(lambda v: 0 <= v <= 1, "a weight 0 <= alpha <= 1, e.g. 0"),
        help=_STREAMING + "weight of the local fragment when its outer update lands "
        "(0 = take the global value)")
    eager: bool = knob(
        False, parse=truth,
        help=_STREAMING + "eager updates, each rank averages its own pseudo-gradient "
        "as of the outer update (the tau overlapped steps included) with the others' as sent "
        "(false = every replica averages the same values)")
