"""Optimizers over flat float32 parameter vectors.

A scheme node owns its replica as one flat vector and applies updates through
a `FlatOptimizer`: a pure `init`/`apply` pair in the style of optax. `PlainSGD`
is exact numpy (the conservation invariant is checked against it);
`OptaxFlatOptimizer` wraps any optax transformation, jitted once; `NesterovSGD` is
DiLoCo's outer optimizer in numpy; `optimizer_by_name` is what train.optimizer names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np


class FlatOptimizer(Protocol):
    """Pure optimizer on flat vectors: apply never mutates its inputs."""

    def init(self, params: np.ndarray) -> Any: ...

    def apply(
        self, params: np.ndarray, state: Any, update: np.ndarray
    ) -> tuple[np.ndarray, Any]: ...


@dataclass(frozen=True)
class PlainSGD:
    """theta <- theta - lr * update, in numpy float32."""

    lr: float
    # an update's effect is linear in it, so a later update can take back part of an
    # earlier one exactly (akocore.codecs' withdraw at the drain relies on it)
    linear = True

    def init(self, params: np.ndarray) -> None:
        return None

    def apply(
        self, params: np.ndarray, state: None, update: np.ndarray
    ) -> tuple[np.ndarray, None]:
        return (params - np.float32(self.lr) * update).astype(np.float32, copy=False), None


class OptaxFlatOptimizer:
    """An optax GradientTransformation applied to flat vectors, jitted once.

    With `unravel` (flat vector -> the workload's parameter pytree, traceable: the
    workload's own) the transformation sees the pytree, parameters and update alike,
    and the result is flattened back in the same leaf order: what a transformation
    that treats leaves by their shape needs (Muon orthogonalises the 2-D ones)."""

    def __init__(self, transformation: Any, unravel: Any = None) -> None:
        import jax
        import jax.numpy as jnp
        import optax

        self.transformation = transformation
        self.unravel = unravel

        def _apply(params, state, update):
            if unravel is None:
                updates, new_state = transformation.update(update, state, params)
                return optax.apply_updates(params, updates), new_state
            tree = unravel(params)
            updates, new_state = transformation.update(unravel(update), state, tree)
            leaves = jax.tree_util.tree_leaves(optax.apply_updates(tree, updates))
            return jnp.concatenate([leaf.reshape(-1) for leaf in leaves]), new_state

        self._apply = jax.jit(_apply)

    def init(self, params: np.ndarray) -> Any:
        import jax.numpy as jnp

        flat = jnp.asarray(params)
        return self.transformation.init(flat if self.unravel is None else self.unravel(flat))

    def apply(self, params: np.ndarray, state: Any, update: np.ndarray) -> tuple[np.ndarray, Any]:
        new_params, new_state = self._apply(params, state, update)
        # a writable copy: schemes overwrite fetched shards of their replica in place
        return np.array(new_params, dtype=np.float32), new_state


@dataclass(frozen=True)
class NesterovSGD:
    """optax.sgd(lr, momentum, nesterov=True) on flat float32 vectors, in numpy.

    trace <- g + momentum·trace; theta <- theta - lr·(g + momentum·trace) (Nesterov),
    or theta <- theta - lr·g when momentum is 0. Exactly optax's arithmetic, without
    a jit per run (tests/test_schemes_diloco.py compares the two).
    """

    lr: float
    momentum: float = 0.9

    def init(self, params: np.ndarray) -> np.ndarray | None:
        return None if self.momentum == 0 else np.zeros_like(params, dtype=np.float32)

    def apply(self, params: np.ndarray, state: np.ndarray | None,
              update: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        grad = update.astype(np.float32, copy=False)
        if state is None:
            step, trace = grad, None
        else:
            trace = (grad + np.float32(self.momentum) * state).astype(np.float32)
            step = grad + np.float32(self.momentum) * trace
        return (params - np.float32(self.lr) * step).astype(np.float32), trace


def optimizer_by_name(name: str, lr: float,
                      unravel: Callable[[Any], Any] | None = None) -> FlatOptimizer:
    """ "sgd" (exact NumPy PlainSGD), "momentum" (optax sgd, 0.9), "adam", "adagrad",
    "muon" (optax.contrib.muon: Newton-Schulz orthogonalised momentum on 2-D leaves,
    Adam on the others, so it needs `unravel`, the flat vector to parameter pytree)."""
    if name == "sgd":
        return PlainSGD(lr)
    if name == "muon":
        if unravel is None:
            raise ValueError("optimizer muon needs the parameters' shapes (a workload's "
                             "unravel): on one flat vector it would be Adam")
        from optax.contrib import muon

        return OptaxFlatOptimizer(muon(lr), unravel=unravel)
    if name in ("momentum", "adam", "adagrad"):
        import optax

        if name == "momentum":
            return OptaxFlatOptimizer(optax.sgd(lr, momentum=0.9))
        if name == "adam":
            return OptaxFlatOptimizer(optax.adam(lr))
        return OptaxFlatOptimizer(optax.adagrad(lr))  # DOWNPOUR's worker optimizer
    from akocore.workloads.spec import OPTIMIZER_NAMES

    raise ValueError(
        f"unknown optimizer {name!r}; expected one of {', '.join(OPTIMIZER_NAMES)}"
    )
