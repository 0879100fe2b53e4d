"""WAGMA-SGD: wait-avoiding group model averaging (Li et al., TPDS 2021).

Model averaging, not gradient exchange. Every worker applies its own
optimizer step to its replica each round, then averages its *model*:

- group rounds: with the G members of its butterfly group for that round
  (`butterfly_group`: ranks that differ only in base-G digit t mod
  ceil(log_G n), so groups never overlap and information reaches every
  worker in log_G n rounds when n is a power of G; otherwise the top groups
  are smaller and mixing can take longer, the global average still bounds
  it). Wait-avoiding (the default): the worker
  sends its model to the group and averages at once with the newest model it
  holds from each member, so a member that is behind contributes its latest
  model instead of making the others wait. With `wait_avoiding=False` the
  group collective is synchronous: each member waits for the group's models
  of that round (the reference against which the invariants are stated).
- global rounds, every `global_every` (tau) rounds (t + 1 divisible by tau):
  a blocking average of every live worker's model of that round.

Invariants (tests/test_schemes_wagma.py):
- a synchronous group or global average preserves the mean of the averaged
  models; so with plain SGD and synchronous groups, after equal rounds the
  mean of the replicas is theta0 - lr * sum(gradients) / n;
- after a global round every live replica holds the same model;
- staleness: a worker starts round t only after every live peer has finished
  the last global round before t, so no peer is more than tau - 1 rounds behind.

Messages: Kind.MODEL, part GROUP or GLOBAL, carrying the sender's whole model
after its round-t step; a final marker (part FINAL, no values) at finish.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from akocore.messages import Kind, Partial, Receipt, Send
from akocore.schemes.base import Replica, SchemeError, SchemeNode
from akocore.schemes.knobs import SchemeSettings, knob, preset, whole
from akocore.schemes.protocol import ExchangeView, ReplicaOf, Scheme

if TYPE_CHECKING:
    from akocore.schemes.factory import SchemeSpec

GROUP, GLOBAL, FINAL = 0, 1, 2
DEFAULT_GROUP_SIZE = 4
DEFAULT_GLOBAL_EVERY = 10


def butterfly_phases(workers: int, group_size: int) -> int:
    """Rounds for one model to reach every worker: ceil(log_G n), at least 1."""
    phases, reach = 1, group_size
    while reach < workers:
        reach *= group_size
        phases += 1
    return phases


def butterfly_group(rank: int, workers: int, group_size: int, round_: int) -> tuple[int, ...]:
    """The ranks (including `rank`) that average together in `round_`.

    Ranks whose base-G representations differ only in digit round_ mod phases;
    when n is not a power of G the groups at the top are smaller.
    """
    if group_size < 2:
        raise ValueError(f"group size must be >= 2, got {group_size}")
    stride = group_size ** (round_ % butterfly_phases(workers, group_size))
    base = rank - ((rank // stride) % group_size) * stride
    return tuple(r for r in (base + j * stride for j in range(group_size)) if r < workers)


class WagmaWorker(SchemeNode):
    """One WAGMA-SGD worker (see the module docstring)."""

    def __init__(self, rank: int, workers: int, length: int, *, replica: Replica,
                 group_size: int = DEFAULT_GROUP_SIZE,
                 global_every: int = DEFAULT_GLOBAL_EVERY, wait_avoiding: bool = True) -> None:
        super().__init__(rank, length, replica)
        if workers < 2:
            raise ValueError("wagma needs at least 2 workers")
        if group_size < 2:
            raise ValueError(f"wagma group size: got {group_size}, expected >= 2")
        if global_every < 1:
            raise ValueError(f"wagma global_every: got {global_every}, expected >= 1")
        self.workers = workers
        self.group_size = group_size
        self.global_every = global_every
        self.wait_avoiding = wait_avoiding
        self.peers = tuple(r for r in range(workers) if r != rank)
        self.seen: set[tuple[int, int, int]] = set()
        self.final_round: dict[int, int] = {}
        self.latest: dict[int, tuple[int, np.ndarray | None]] = {}  # peer -> (round, model)
        self.models: dict[int, dict[int, np.ndarray | None]] = {}  # round -> peer -> model
        self.awaiting: int | None = None  # the blocking average in progress
        self.completed_through = -1  # last round whose blocking average completed
        self.averages_done = 0

    @property
    def staleness_bound(self) -> int:
        return self.global_every - 1

    def is_global(self, round_: int) -> bool:
        return (round_ + 1) % self.global_every == 0

    def group(self, round_: int) -> tuple[int, ...]:
        return butterfly_group(self.rank, self.workers, self.group_size, round_)

    def _partners(self, round_: int) -> tuple[int, ...]:
        members = self.peers if self.is_global(round_) else self.group(round_)
        return tuple(r for r in members if r != self.rank)

    def _live(self, peer: int, round_: int) -> bool:
        return peer not in self.suspended and self.final_round.get(peer, math.inf) > round_

    def _model_msg(self, round_: int, part: int) -> Partial:
        values = None if self.replica.params is None else self.replica.params.copy()
        return Partial(Kind.MODEL, self.rank, round_, part, 1, 0, self.length, values)

    def local_step(self, round_: int, grad: np.ndarray | None) -> list[Send]:
        self._step_replica(round_, grad,
                           lambda: f"the average of round {self.awaiting} completed")
        partners = self._partners(round_)
        part = GLOBAL if self.is_global(round_) else GROUP
        effects = [Send(partners, self._model_msg(round_, part))] if partners else []
        if part == GROUP and self.wait_avoiding:
            self._average([m for peer, (_, m) in sorted(self.latest.items())
                           if peer in partners and self._live(peer, round_)])
        else:
            self.awaiting = round_
            self._try_complete()
        return effects

    def _average(self, others: list[np.ndarray | None]) -> None:
        self.averages_done += 1
        if self.replica.params is None or not others:
            return
        total = self.replica.params.astype(np.float64)
        for model in others:
            assert model is not None
            total += model
        self.replica.params = (total / (len(others) + 1)).astype(np.float32)

    def _try_complete(self) -> None:
        round_ = self.awaiting
        if round_ is None:
            return
        arrived = self.models.get(round_, {})
        live = [p for p in self._partners(round_) if self._live(p, round_)]
        if any(p not in arrived for p in live):
            return
        self.awaiting = None
        self.completed_through = round_
        self._average([arrived[p] for p in live])
        for old in [r for r in self.models if r <= round_]:
            del self.models[old]

    def may_start(self, round_: int) -> bool:
        self._try_complete()
        return self.awaiting is None

    def waiting_on(self, round_: int) -> list[int]:
        if self.may_start(round_) or self.awaiting is None:
            return []
        arrived = self.models.get(self.awaiting, {})
        return [p for p in self._partners(self.awaiting)
                if self._live(p, self.awaiting) and p not in arrived]

    def lag(self, round_: int) -> int:
        return 0 if self.awaiting is None else max(0, round_ - self.awaiting)

    def receive(self, msg: Partial) -> Receipt:
        if msg.kind != Kind.MODEL or msg.sender not in self.peers or msg.part not in (
                GROUP, GLOBAL, FINAL):
            raise SchemeError(f"wagma worker {self.rank}: unexpected {msg.kind.name} "
                              f"part {msg.part} from node {msg.sender}")
        if msg.part != FINAL and (msg.offset, msg.length) != (0, self.length):
            raise SchemeError(f"a wagma model spans the whole vector of length {self.length}")
        self._check_values(msg)
        if msg.key in self.seen:
            return Receipt(False)
        self.seen.add(msg.key)
        if msg.part == FINAL:
            self.final_round[msg.sender] = msg.round
        else:
            values = None if msg.values is None else msg.values.copy()
            if msg.round > self.latest.get(msg.sender, (-1, None))[0]:
                self.latest[msg.sender] = (msg.round, values)
            blocking = msg.part == GLOBAL or not self.wait_avoiding
            if blocking and msg.round > self.completed_through:
                self.models.setdefault(msg.round, {})[msg.sender] = values
        self._try_complete()
        return Receipt(True)

    def suspend_peer(self, peer: int) -> None:
        super().suspend_peer(peer)
        self._try_complete()

    def finish(self, rounds_done: int) -> list[Send]:
        if rounds_done != self.next_round:
            raise SchemeError(f"node {self.rank}: finish after {rounds_done} rounds")
        self.finished = True
        marker = Partial(Kind.MODEL, self.rank, rounds_done, FINAL, 1, 0, 0,
                         None if self.replica.params is None else np.zeros(0, np.float32), True)
        return [Send(self.peers, marker)]

    def drained(self) -> bool:
        self._try_complete()
        return self.awaiting is None and all(
            p in self.final_round or p in self.suspended for p in self.peers)


@dataclass(frozen=True)
class WagmaSettings(SchemeSettings):
    """WAGMA's knobs ([exchange.wagma])."""

    table: ClassVar[str] = "wagma"

    group_size: int = knob(
        DEFAULT_GROUP_SIZE, parse=whole(2),
        help="scheme wagma: G, workers per butterfly group (model averaging each round)",
        flag="--group-size", metavar="G",
        flag_help="scheme wagma: workers per averaging group, e.g. 4")
    global_every: int = knob(
        DEFAULT_GLOBAL_EVERY, parse=whole(1),
        help="scheme wagma: tau, a global model average every tau rounds (staleness <= tau - 1)",
        flag="--global-every", metavar="TAU",
        flag_help="scheme wagma: a global model average every TAU rounds, e.g. 10")


class WagmaScheme(Scheme):
    """WAGMA-SGD: group model averaging, a blocking global average every tau rounds."""

    name = "wagma"
    summary = "wait-avoiding group model averaging, a global average every tau rounds"
    settings = WagmaSettings
    presets = (preset("wagma", "WAGMA-SGD: wait-avoiding butterfly group model averaging, "
                      "G = 4, global average every tau = 10 rounds",
                      {"scheme": "wagma", "group_size": 4, "global_every": 10}),)
    pattern = "groups"
    compared = False  # a model-averaging scheme: chosen by name, not in the comparison

    def build(self, spec: SchemeSpec, length: int, params0: np.ndarray | None,
              replica: ReplicaOf) -> list[SchemeNode]:
        knobs = spec.knobs(WagmaSettings)
        return [WagmaWorker(i, spec.workers, length, replica=replica(i, params0),
                            group_size=knobs.group_size, global_every=knobs.global_every,
                            wait_avoiding=spec.wait_avoiding) for i in range(spec.workers)]

    def staleness_bound(self, exchange: ExchangeView, *, p_max: int, ssp: float) -> float:
        """tau - 1: a blocking global average every tau = global_every rounds."""
        return float(exchange.knobs(WagmaSettings).global_every - 1)

    def label(self, exchange: ExchangeView) -> str:
        knobs = exchange.knobs(WagmaSettings)
        return f"G={knobs.group_size} tau={knobs.global_every}"


WAGMA = WagmaScheme()
