"""The user's parameters between their pytree and the flat float32 vector the schemes hold.

This module owns the one leaf order (``jax.flatten_util.ravel_pytree``'s) both ways:
`flatten_params` makes the vector and its `unravel`, `cast_back` gives leaves their
own dtypes again (bfloat16, float16 held as float32), and `unflatten_like` puts a
vector back into the structure, shapes and dtypes of a pytree given as a template.
Pure NumPy/JAX tree work: no I/O, nothing compiled.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from akocore.workloads.models import Params

__all__ = ["cast_back", "flatten_params", "unflatten_like"]


def flatten_params(params: Params) -> tuple[np.ndarray, Callable[[Any], Params]]:
    """(flat float32 vector, unravel) with the leaf order of jax.flatten_util.ravel_pytree.

    Done in NumPy so building a workload compiles nothing. `unravel` slices
    and reshapes; it works on NumPy arrays (returning views) and inside jit.
    """
    import jax

    leaves, treedef = jax.tree_util.tree_flatten(params)
    shapes = [tuple(np.shape(leaf)) for leaf in leaves]
    bounds = np.cumsum([0, *(int(np.prod(s)) for s in shapes)]).tolist()
    flat = np.concatenate([np.asarray(leaf, dtype=np.float32).ravel() for leaf in leaves])

    def unravel(vector: Any) -> Params:
        if vector.shape != (bounds[-1],):
            raise ValueError(f"expected a flat vector of shape ({bounds[-1]},), got {vector.shape}")
        parts = [
            vector[start:stop].reshape(shape)
            for start, stop, shape in zip(bounds[:-1], bounds[1:], shapes, strict=True)
        ]
        return jax.tree_util.tree_unflatten(treedef, parts)

    return flat, unravel


def cast_back(params: Params, dtypes: tuple[Any, ...]) -> Params:
    """Cast float32 leaves to the user's dtypes (differentiable: gradients come back f32)."""
    import jax

    leaves, treedef = jax.tree_util.tree_flatten(params)
    cast = [leaf if leaf.dtype == dtype else leaf.astype(dtype)
            for leaf, dtype in zip(leaves, dtypes, strict=True)]
    return jax.tree_util.tree_unflatten(treedef, cast)


def unflatten_like(flat_params: np.ndarray, like: Params) -> Params:
    """`flat_params` (ravel_pytree order) as a pytree of `like`'s structure, shapes and
    dtypes, NumPy leaves (a copy); ValueError when the sizes differ."""
    import jax

    _, unravel = flatten_params(like)
    dtypes = tuple(np.dtype(leaf.dtype if hasattr(leaf, "dtype") else np.asarray(leaf).dtype)
                   for leaf in jax.tree_util.tree_leaves(like))
    return cast_back(unravel(np.array(flat_params, dtype=np.float32)), dtypes)
