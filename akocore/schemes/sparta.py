"""SPARTA: every step, average a random fraction of the parameters with every peer.

SPARTA (Sparse Parameter Averaging for Reduced-communication Training; EXO,
OpenReview stFPf3gzq1; reference code exo-explore/gym
``exogym/strategy/sparta.py``, its `RandomIndexSelector`): each worker applies
its own optimizer step to its replica every round, then averages the values
of a random fraction f = ``exchange.sparta_fraction`` (default 0.005, 0.5%)
of the parameters with every peer. This module owns the scheme: the index
set (`sparta_indices`), the node (`SpartaWorker`), its settings
(`SpartaSettings`, ``[exchange.sparta]``) and the `Scheme` object.

- The index set of round t is a function of (``exchange.sparta_seed``, t)
  alone: k = max(1, round(f * D)) distinct indices drawn by numpy's
  Generator seeded with (seed, t), sorted. Every worker computes it alike, so
  every replica averages the same indices and a message carries only the k
  values (Kind.MODEL, offset 0, length k: parameters, never coded).
- The average is the mean of the contributors' values summed in float64 in
  rank order, so every replica writes the same float32 values: after round t
  the parameters at round t's indices are equal bit for bit on every replica
  that took part. With f = 1 every index is averaged every round: per-step
  model averaging (tests/test_schemes_sparta.py pins it).
- The exchange is synchronous: round t + 1 starts once round t's values of
  every live peer are in (SPARTA's paper tolerates delay; this form has
  none, so the invariants hold exactly).

A lost member: a peer the shell suspends (silent past the peer timeout), or
whose final marker says it stopped before the round, is not awaited, and the
others average among the live ones; values a suspended peer sent before it
fell silent are dropped, so survivors that suspended it agree bit for bit
whichever of its messages reached them. ``exchange.reduce`` and
``exchange.ssp`` are not read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from akocore.messages import Kind, Partial, Receipt, Send
from akocore.schemes.base import Replica, SchemeError, SchemeNode
from akocore.schemes.diloco_sync import mean_of
from akocore.schemes.knobs import SchemeSettings, knob, real, whole
from akocore.schemes.live_peers import LivePeersNode
from akocore.schemes.protocol import ExchangeView, ReplicaOf, Scheme

if TYPE_CHECKING:
    from akocore.schemes.factory import SchemeSpec

VALUES, FINAL = 0, 1  # message parts: a round's values, the final marker
DEFAULT_FRACTION = 0.005  # the paper's 0.5%


def sparta_count(length: int, fraction: float) -> int:
    """k, the number of indices averaged per round: round(f * D), at least 1, at most D."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"exchange.sparta_fraction: got {fraction}, expected 0 < f <= 1")
    return min(length, max(1, round(fraction * length)))


def sparta_indices(seed: int, round_: int, length: int, fraction: float) -> np.ndarray:
    """The sorted indices every worker averages at `round_`: a function of (seed, round)."""
    k = sparta_count(length, fraction)
    if k == length:
        return np.arange(length, dtype=np.int64)
    rng = np.random.default_rng((seed, round_))
    return np.sort(rng.choice(length, size=k, replace=False, shuffle=False))


class SpartaWorker(LivePeersNode):
    """One SPARTA worker (see the module docstring)."""

    exchange_name = "average"

    def __init__(self, rank: int, workers: int, length: int, *, replica: Replica,
                 fraction: float = DEFAULT_FRACTION, seed: int = 0) -> None:
        if workers < 2:
            raise ValueError("sparta needs at least 2 workers")
        super().__init__(rank, workers, length, replica)
        self.fraction = fraction
        self.seed = seed
        self.k = sparta_count(length, fraction)
        self.arrived: dict[int, dict[int, np.ndarray | None]] = {}  # round -> peer -> values
        self.awaiting: int | None = None  # the round whose average is still to come
        self.own: np.ndarray | None = None  # this rank's values of that round
        self.indices: np.ndarray | None = None  # that round's indices
        self.completed_through = -1  # the last round whose average is applied
        self.averages_done = 0

    def local_step(self, round_: int, grad: np.ndarray | None) -> list[Send]:
        self.begin_round(round_, grad)
        values = None
        if self.replica.params is not None:
            self.indices = sparta_indices(self.seed, round_, self.length, self.fraction)
            values = self.replica.params[self.indices].copy()
        self.own, self.awaiting = values, round_
        message = Partial(Kind.MODEL, self.rank, round_, VALUES, 1, 0, self.k, values)
        self.progress()
        return [Send(self.peers, message)]

    def progress(self) -> None:
        round_ = self.awaiting
        if round_ is None:
            return
        arrived = self.arrived.get(round_, {})
        if len(arrived) + len(self.suspended) + len(self.final_round) < len(self.peers):
            return  # some peer neither sent, nor stopped, nor is suspended (O(1) per message)
        live = [p for p in self.peers if self.live(p, round_)]
        if any(p not in arrived for p in live):
            return
        self.awaiting, self.completed_through = None, round_
        self.averages_done += 1
        mean = mean_of({self.rank: self.own, **{p: arrived[p] for p in live}}, self.k)
        if mean is not None and self.replica.params is not None:
            self.replica.params[self.indices] = mean
        for old in [r for r in self.arrived if r <= round_]:
            del self.arrived[old]

    def in_progress(self) -> int | None:
        return self.awaiting

    def waiting_on(self, round_: int) -> list[int]:
        if self.may_start(round_) or self.awaiting is None:
            return []
        arrived = self.arrived.get(self.awaiting, {})
        return [p for p in self.peers if self.live(p, self.awaiting) and p not in arrived]

    def lag(self, round_: int) -> int:
        return 0 if self.awaiting is None else max(0, round_ - self.awaiting - 1)

    def receive(self, msg: Partial) -> Receipt:
        if msg.kind != Kind.MODEL or msg.sender not in self.peers \
                or msg.part not in (VALUES, FINAL) or msg.final != (msg.part == FINAL):
            raise SchemeError(f"sparta worker {self.rank}: unexpected {msg.kind.name} "
                              f"part {msg.part} from node {msg.sender}")
        if msg.part == VALUES and (msg.offset, msg.length) != (0, self.k):
            raise SchemeError(f"a sparta message carries the {self.k} values of its round's "
                              f"indices, got [{msg.offset}, {msg.offset + msg.length})")
        if not self.first_copy(msg):
            return Receipt(False)
        if not msg.final and msg.round > self.completed_through:  # else: averaged already
            values = None if msg.values is None else msg.values.copy()
            self.arrived.setdefault(msg.round, {})[msg.sender] = values
        self.progress()
        return Receipt(True)

    def finish(self, rounds_done: int) -> list[Send]:
        return self.end_with_marker(rounds_done, Kind.MODEL, FINAL, 1)


@dataclass(frozen=True)
class SpartaSettings(SchemeSettings):
    """SPARTA's knobs ([exchange.sparta])."""

    table: ClassVar[str] = "sparta"

    sparta_fraction: float = knob(
        DEFAULT_FRACTION, parse=real(lambda v: 0 < v <= 1, "a fraction 0 < f <= 1, e.g. 0.005"),
        help="scheme sparta: f, the fraction of the parameters every worker averages with its "
             "peers each round (random indices, the same on every worker)",
        flag="--sparta-fraction", metavar="F",
        flag_help="scheme sparta: fraction of the parameters averaged each round, e.g. 0.005")
    sparta_seed: int = knob(
        0, parse=whole(0),
        help="scheme sparta: the seed of the random index sets (round t's set is a function "
             "of the seed and t, so every worker averages the same indices)")


class SpartaScheme(Scheme):
    """SPARTA: each round, average a random fraction of the parameters with every peer."""

    name = "sparta"
    summary = "every round, average a random fraction f of the parameters with every peer"
    settings = SpartaSettings
    pattern = "all-to-all"

    def build(self, spec: SchemeSpec, length: int, params0: np.ndarray | None,
              replica: ReplicaOf) -> list[SchemeNode]:
        knobs = spec.knobs(SpartaSettings)
        return [SpartaWorker(i, spec.workers, length, replica=replica(i, params0),
                             fraction=knobs.sparta_fraction, seed=knobs.sparta_seed)
                for i in range(spec.workers)]

    def staleness_bound(self, exchange: ExchangeView, *, p_max: int, ssp: float) -> float:
        """1/f - 1: the rounds a parameter goes unaveraged, in expectation (each round
        picks it with probability f; a random set has no hard bound)."""
        return 1.0 / exchange.knobs(SpartaSettings).sparta_fraction - 1.0

    def lead_rounds(self, exchange: ExchangeView, *, p_max: int, ssp: float) -> float:
        """0: every round waits for every live peer's values, however stale a parameter."""
        return 0.0

    def effective_ssp(self, exchange: ExchangeView) -> float:
        return 0.0

    def plan_grid(self, exchange: ExchangeView) -> dict[str, tuple[float, ...]]:
        return {"sparta_fraction": (0.05, 0.25)}

    def label(self, exchange: ExchangeView) -> str:
        return f"f={exchange.knobs(SpartaSettings).sparta_fraction:g}"


SPARTA = SpartaScheme()
