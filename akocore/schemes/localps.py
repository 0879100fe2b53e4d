"""Parameter-server variants of the Distributed TensorFlow Guide's catalog.

- `LocalStepPSWorker` / `DeltaPSServer` (async, `exchange.local_steps`):
  DOWNPOUR and ADAG/AGN. The worker applies its own optimizer (the guide uses
  Adagrad for DOWNPOUR) to its replica every round and accumulates the
  update it applied (params before - params after); every `push_every`
  rounds it pushes the accumulation (ADAG/AGN, `exchange.push_average`:
  divided by push_every, the lambda local steps), every `fetch_every` rounds
  it replaces its replica with the servers' parameters. The server adds each
  pushed update to the centre as it arrives (centre -= update, lock-free),
  without an optimizer of its own: with plain SGD the centre after a drain is
  theta0 - lr * sum(gradients) / (lambda if averaged else 1).
- `LocalStepPSWorker(sync=True)` / `SyncDeltaPSServer` (ps sync with
  `exchange.local_steps`): SDAG and SAGN, the synchronous forms: lambda =
  push_every local steps, then every worker's update (divided by lambda with
  push_average) is reduced over the workers and applied once, and everyone
  waits for the new parameters.
- `ScaledPSWorker`: synchronous SGD with a learning rate per worker
  (`exchange.worker_lr_scale`): worker i pushes scale_i * gradient, so the
  server's step is lr * mean_i(scale_i * g_i).

Hogwild (async, push and fetch every round, no gate) and synchronous SGD
(ps sync) are plain `ps` settings; configs/presets/ names them.
"""

from __future__ import annotations

import numpy as np

from akocore.messages import Kind, Partial, Send
from akocore.schemes.base import Replica, SchemeError
from akocore.schemes.ps import PSLayout, PSServer, PSWorker


class LocalStepPSWorker(PSWorker):
    """A PS worker that steps its own replica and pushes the updates it applied.

    sync (SDAG/SAGN): push and fetch every push_every rounds and wait for the
    answer before the next round (fetch_every and staleness are ignored).
    """

    def __init__(self, rank: int, layout: PSLayout, *, replica: Replica,
                 staleness: float = 0.0, push_every: int = 1, fetch_every: int = 1,
                 push_average: bool = False, sync: bool = False) -> None:
        super().__init__(rank, layout, replica=replica, mode="async",
                         staleness=0.0 if sync else staleness, push_every=push_every,
                         fetch_every=push_every if sync else fetch_every)
        self.push_scale = np.float32(1.0 / push_every if push_average else 1.0)

    def local_step(self, round_: int, grad: np.ndarray | None) -> list[Send]:
        self._check_round(round_)
        self._check_grad(grad)
        update = grad
        if grad is not None and self.replica.params is not None:
            before = self.replica.params.copy()
            self.replica.apply(grad)
            update = ((before - self.replica.params) * self.push_scale).astype(np.float32)
        return super().local_step(round_, update)


class DeltaPSServer(PSServer):
    """Async shard that subtracts each pushed update as it arrives (no optimizer).

    A worker's final marker is answered only once every push it made before
    has arrived (messages may overtake each other), so the reply to the last
    final answered is the centre after every update: that worker ends with
    exactly the servers' parameters.
    """

    def __init__(self, rank: int, layout: PSLayout, *, replica: Replica,
                 push_every: int = 1, fetch_every: int = 1) -> None:
        super().__init__(rank, layout, replica=replica, mode="async", reduce="sum",
                         fetch_every=fetch_every)
        self.push_every = push_every
        self.pushes_from = dict.fromkeys(range(layout.workers), 0)
        self.held_finals: dict[int, int] = {}  # worker -> its final round, unanswered

    def _receive_async(self, msg: Partial) -> tuple[Send, ...]:
        if msg.kind == Kind.PUSH and self.replica.params is not None:
            assert msg.values is not None
            self.replica.params = (self.replica.params - msg.values).astype(np.float32)
        effects = []
        if msg.final:
            self.held_finals[msg.sender] = msg.round
        else:
            self.pushes_from[msg.sender] += msg.kind == Kind.PUSH
            if msg.kind == Kind.PULL or (msg.round + 1) % self.fetch_every == 0:
                effects.append(self._params_to((msg.sender,), msg.round))
        for worker, final in sorted(self.held_finals.items()):
            if self.pushes_from[worker] >= final // self.push_every:
                del self.held_finals[worker]
                effects.append(self._params_to((worker,), final))
        return tuple(effects)


class SyncDeltaPSServer(PSServer):
    """SDAG/SAGN shard: every push_every rounds, subtract the reduced updates of all
    live workers at once and send the parameters to them.

    A final marker's leftover update (rounds after the last exchange) is
    subtracted (scaled) on arrival; its answer waits for every exchange before
    it. With plain SGD the centre after a drain is
    theta0 - lr * scale * sum(gradients) (/ lambda when averaged).
    """

    def __init__(self, rank: int, layout: PSLayout, *, replica: Replica,
                 push_every: int = 1, reduce: str = "mean") -> None:
        super().__init__(rank, layout, replica=replica, mode="sync", reduce=reduce)
        self.push_every = push_every
        self.arrived: dict[int, set[int]] = {}

    def _receive_sync(self, msg: Partial) -> tuple[Send, ...]:
        params = self.replica.params
        if msg.final:
            if msg.kind == Kind.PUSH and params is not None and msg.values is not None:
                self.replica.params = (params - msg.values * self.scale).astype(np.float32)
            self.unanswered_finals.add(msg.sender)
        else:
            if msg.round <= self.applied_round:
                raise SchemeError(f"push for round {msg.round} after it was applied")
            self.arrived.setdefault(msg.round, set()).add(msg.sender)
            if msg.values is not None:
                total = self.sums.get(msg.round)
                self.sums[msg.round] = msg.values.copy() if total is None else total + msg.values
        effects = self._complete_exchanges()
        for worker in sorted(self.unanswered_finals):
            last_exchange = (self.final_round[worker] // self.push_every) * self.push_every - 1
            if last_exchange <= self.applied_round:
                self.unanswered_finals.discard(worker)
                effects.append(self._params_to((worker,), self.final_round[worker]))
        return tuple(effects)

    def _complete_exchanges(self) -> list[Send]:
        effects: list[Send] = []
        while True:
            round_ = self.applied_round + self.push_every
            live = self._live_in_round(round_)
            if not live or any(w not in self.arrived.get(round_, ()) for w in live):
                return effects
            self.arrived.pop(round_, None)
            total = self.sums.pop(round_, None)
            if total is not None and self.replica.params is not None:
                self.replica.params = (self.replica.params - total * self.scale).astype(
                    np.float32)
            self.applied_round = round_
            effects.append(self._params_to(tuple(live), round_))


class ScaledPSWorker(PSWorker):
    """A PS worker whose gradient is scaled by its own learning-rate factor."""

    def __init__(self, rank: int, layout: PSLayout, *, replica: Replica, mode: str = "sync",
                 staleness: float = 0.0, push_every: int = 1, fetch_every: int = 1,
                 lr_scale: float = 1.0) -> None:
        super().__init__(rank, layout, replica=replica, mode=mode, staleness=staleness,
                         push_every=push_every, fetch_every=fetch_every)
        if not lr_scale > 0:
            raise ValueError(f"learning-rate scale of worker {rank}: got {lr_scale}, "
                             f"expected > 0")
        self.lr_scale = np.float32(lr_scale)

    def local_step(self, round_: int, grad: np.ndarray | None) -> list[Send]:
        scaled = None if grad is None else (grad * self.lr_scale).astype(np.float32)
        return super().local_step(round_, scaled)
