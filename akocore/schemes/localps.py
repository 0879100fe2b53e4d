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
- `ScaledPSWorker`: synchronous SGD with a learning rate per worker
  (`exchange.worker_lr_scale`): worker i pushes scale_i * gradient, so the
  server's step is lr * mean_i(scale_i * g_i).

Hogwild (async, push and fetch every round, no gate) and synchronous SGD
(ps sync) are plain `ps` settings; configs/presets/ names them.
"""

from __future__ import annotations

import numpy as np

from akocore.messages import Kind, Partial, Send
from akocore.schemes.base import Replica
from akocore.schemes.ps import PSLayout, PSServer, PSWorker


class LocalStepPSWorker(PSWorker):
    """Async PS worker that steps its own replica and pushes the updates it applied."""

    def __init__(self, rank: int, layout: PSLayout, *, replica: Replica,
                 staleness: float = 0.0, push_every: int = 1, fetch_every: int = 1,
                 push_average: bool = False) -> None:
        super().__init__(rank, layout, replica=replica, mode="async", staleness=staleness,
                         push_every=push_every, fetch_every=fetch_every)
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
