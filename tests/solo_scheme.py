"""A throwaway scheme with one knob, written the way a scheme from outside the toolkit is:
this module and one registry entry, nothing else.

`SOLO` trains every worker alone (nothing is exchanged); its knob `solo_scale`
(``--solo-scale``, ``[exchange.solo]``, ``exchange.solo_scale``) scales each local
step, so a run with ``--solo-scale 0`` ends where it started. The entry is
`SCHEMES`: a test registers it in its own process
(akocore.schemes.registry.registering), and names this module in
``$AKO_SCHEME_MODULES`` for the processes akorun starts, which register it at
start (akocore.cli_support.load_scheme_plugins).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from akocore.messages import Partial, Receipt, Send
from akocore.schemes import Replica, Scheme, SchemeError, SchemeNode, SchemeSpec
from akocore.schemes.knobs import SchemeSettings, knob, real
from akocore.schemes.protocol import ExchangeView, ReplicaOf


@dataclass(frozen=True)
class SoloSettings(SchemeSettings):
    """The one knob of scheme solo."""

    table: ClassVar[str] = "solo"

    solo_scale: float = knob(
        1.0, parse=real(lambda v: v >= 0, "a factor >= 0, e.g. 0.5"),
        help="scheme solo: the factor on every local gradient step",
        flag="--solo-scale", metavar="FACTOR",
        flag_help="scheme solo: the factor on every local gradient step, e.g. 0.5")


class SoloWorker(SchemeNode):
    """Trains alone: applies its own gradient times the scale, sends nothing."""

    def __init__(self, rank: int, length: int, replica: Replica, scale: float) -> None:
        super().__init__(rank, length, replica)
        self.scale = np.float32(scale)

    def local_step(self, round_: int, grad: np.ndarray | None) -> list[Send]:
        self._check_round(round_)
        self._check_grad(grad)
        if grad is not None:
            self.replica.apply(grad * self.scale)
        self.next_round += 1
        return []

    def receive(self, msg: Partial) -> Receipt:
        raise SchemeError("solo workers exchange nothing")


class SoloScheme(Scheme):
    """Every worker trains alone, its steps scaled by solo_scale."""

    name = "solo"
    summary = "every worker trains alone, each step scaled by solo_scale"
    settings = SoloSettings

    def build(self, spec: SchemeSpec, length: int, params0: np.ndarray | None,
              replica: ReplicaOf) -> list[SchemeNode]:
        scale = spec.knobs(SoloSettings).solo_scale
        return [SoloWorker(i, length, replica(i, params0), scale) for i in range(spec.workers)]

    def plan_grid(self, exchange: ExchangeView) -> dict[str, tuple[float, ...]]:
        return {"solo_scale": (0.0, 0.5)}  # the planner times these beside the configured

    def label(self, exchange: ExchangeView) -> str:
        return f"scale={exchange.knobs(SoloSettings).solo_scale:g}"


SOLO = SoloScheme()
SCHEMES = (SOLO,)  # the registry entry: what load_scheme_modules registers
