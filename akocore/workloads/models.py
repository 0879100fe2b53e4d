"""JAX models by name: the pure functions a workload differentiates.

This module owns the model registry (`build_model`, `MODEL_NAMES`) and the
models themselves, written in plain `jax.numpy` / `jax.lax` (no flax, no
haiku). A `Model` is two pure functions: `init(seed) -> params` and
`apply(params, x, *, train, rng) -> logits`.

Parameters are a pytree of float32 NumPy arrays built with
`np.random.default_rng(seed)`: NumPy initialisation costs no JAX compilation
and gives bit-identical parameters for the same seed in every process (akosim
and akorun workers start from the same theta0 without exchanging it).

Models:

- ``mlp``: dense ReLU layers (`hidden`, default ``(64,)``) and a linear logits
  layer. Any input shape; the model flattens each example itself.
- ``cnn``: the seed's TF.AKO CNN, NHWC: conv 5x5 -> 32 (SAME, ReLU), maxpool
  2x2/2, conv 3x3 -> 64, conv 3x3 -> 64, maxpool 2x2/2, flatten, dense -> 1024
  (ReLU), dropout keep 0.5 (training only), dense -> classes. On 32x32x3
  input with 10 classes it has exactly 4,263,434 parameters. `channels`,
  `fc_units` and `keep_prob` are options.

Initialisation (`init` option):

- ``"he"`` (default): weights from a normal truncated at two standard
  deviations, scaled to variance 2/fan_in for ReLU layers and 1/fan_in for the
  logits layer (TF's ``variance_scaling(..., "truncated_normal")``); biases
  zero. Trains well with plain SGD at every layer width.
- ``"tf.ako"``: the seed's TF.AKO choice, truncated normal with sigma 0.1 and
  biases 0.1. Kept for fidelity; on the 4096 -> 1024 dense layer it gives
  activations in the hundreds and plain SGD needs a much smaller learning
  rate, so it is not the default.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

Params = Any  # a pytree (dicts / lists) of float32 arrays

INIT_SCHEMES = ("he", "tf.ako")


@dataclass(frozen=True, eq=False)
class Model:
    """A named pure model: `init(seed)` -> params, `apply(params, x, ...)` -> logits.

    `apply(params, x, *, train, rng)` takes a batch `x` of shape
    `(batch, *input_shape)` and returns float32 logits `(batch, num_classes)`.
    `rng` is a JAX PRNG key used only when `train` is true (dropout); pass
    None for evaluation.
    """

    name: str
    input_shape: tuple[int, ...]
    num_classes: int
    init: Callable[[int], Params]
    apply: Callable[..., Any]
    options: tuple[tuple[str, Any], ...] = field(default=())

    def param_count(self) -> int:
        """Number of scalar parameters (builds the parameters once with seed 0)."""
        return count_params(self.init(0))


def count_params(params: Params) -> int:
    """Total number of scalars in a parameter pytree."""
    import jax

    return int(sum(np.size(leaf) for leaf in jax.tree_util.tree_leaves(params)))


# --------------------------------------------------------------------------
# NumPy initialisers


def truncated_normal(rng: np.random.Generator, shape: tuple[int, ...], stddev: float) -> np.ndarray:
    """Float32 normal samples redrawn until within two standard deviations (as TF)."""
    z = rng.standard_normal(shape, dtype=np.float32)
    out_of_range = np.abs(z) > 2.0
    while out_of_range.any():
        z[out_of_range] = rng.standard_normal(int(out_of_range.sum()), dtype=np.float32)
        out_of_range = np.abs(z) > 2.0
    z *= np.float32(stddev)
    return z


# stddev of a unit normal truncated at +-2 sigma; divide by it to keep the variance
_TRUNCATED_STD = 0.87962566103423978


def _layer(
    rng: np.random.Generator,
    shape: tuple[int, ...],
    fan_in: int,
    scheme: str,
    relu: bool,
) -> dict[str, np.ndarray]:
    """One weight/bias pair {"w", "b"}; the bias has the last dimension of w."""
    if scheme == "tf.ako":
        w = truncated_normal(rng, shape, 0.1)
        b = np.full(shape[-1], 0.1, dtype=np.float32)
    else:
        gain = 2.0 if relu else 1.0
        w = truncated_normal(rng, shape, math.sqrt(gain / fan_in) / _TRUNCATED_STD)
        b = np.zeros(shape[-1], dtype=np.float32)
    return {"w": w, "b": b}


def _check_scheme(scheme: str) -> str:
    if scheme not in INIT_SCHEMES:
        raise ValueError(
            f"unknown init scheme {scheme!r}; expected one of {', '.join(INIT_SCHEMES)}"
        )
    return scheme


# --------------------------------------------------------------------------
# mlp


def _build_mlp(
    input_shape: tuple[int, ...],
    num_classes: int,
    *,
    hidden: Sequence[int] | int = (64,),
    init: str = "he",
) -> Model:
    hidden_sizes = (int(hidden),) if isinstance(hidden, int) else tuple(int(h) for h in hidden)
    if any(h <= 0 for h in hidden_sizes):
        raise ValueError(f"mlp hidden sizes must be positive, got {hidden_sizes}")
    scheme = _check_scheme(init)
    in_features = math.prod(input_shape)
    widths = (in_features, *hidden_sizes, num_classes)

    def init_params(seed: int) -> list[dict[str, np.ndarray]]:
        rng = np.random.default_rng(seed)
        layers = []
        for i, (fan_in, fan_out) in enumerate(zip(widths[:-1], widths[1:], strict=True)):
            relu = i < len(widths) - 2
            layers.append(_layer(rng, (fan_in, fan_out), fan_in, scheme, relu))
        return layers

    def apply(params: Params, x: Any, *, train: bool = False, rng: Any = None) -> Any:
        import jax.numpy as jnp

        h = jnp.reshape(x, (x.shape[0], -1))
        for layer in params[:-1]:
            h = jnp.maximum(h @ layer["w"] + layer["b"], 0.0)
        return h @ params[-1]["w"] + params[-1]["b"]

    return Model(
        name="mlp",
        input_shape=tuple(input_shape),
        num_classes=num_classes,
        init=init_params,
        apply=apply,
        options=(("hidden", hidden_sizes), ("init", scheme)),
    )


# --------------------------------------------------------------------------
# cnn (the seed's TF.AKO network)


def _conv(x: Any, layer: dict[str, Any]) -> Any:
    import jax
    import jax.numpy as jnp

    y = jax.lax.conv_general_dilated(
        x,
        layer["w"],
        window_strides=(1, 1),
        padding="SAME",
        dimension_numbers=("NHWC", "HWIO", "NHWC"),
    )
    return jnp.maximum(y + layer["b"], 0.0)


def _pooled(size: int) -> int:
    """Side length after one SAME 2x2 stride-2 pool."""
    return (size + 1) // 2


def _maxpool_2x2(x: Any) -> Any:
    import jax
    import jax.numpy as jnp

    return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "SAME")


def _build_cnn(
    input_shape: tuple[int, ...],
    num_classes: int,
    *,
    channels: Sequence[int] = (32, 64, 64),
    fc_units: int = 1024,
    keep_prob: float = 0.5,
    init: str = "he",
) -> Model:
    if len(input_shape) != 3:
        raise ValueError(
            f"cnn needs image input (height, width, channels), got input_shape {input_shape}"
        )
    conv_channels = tuple(int(c) for c in channels)
    if len(conv_channels) != 3 or any(c <= 0 for c in conv_channels):
        raise ValueError(f"cnn channels must be three positive ints, got {channels!r}")
    if not 0.0 < keep_prob <= 1.0:
        raise ValueError(f"cnn keep_prob must be in (0, 1], got {keep_prob}")
    scheme = _check_scheme(init)
    height, width, in_channels = (int(d) for d in input_shape)
    c1, c2, c3 = conv_channels
    # two SAME 2x2/2 pools: each halves a side, rounding up
    flat_features = _pooled(_pooled(height)) * _pooled(_pooled(width)) * c3
    keep = float(keep_prob)

    def init_params(seed: int) -> dict[str, dict[str, np.ndarray]]:
        rng = np.random.default_rng(seed)
        return {
            "conv1": _layer(rng, (5, 5, in_channels, c1), 25 * in_channels, scheme, True),
            "conv2": _layer(rng, (3, 3, c1, c2), 9 * c1, scheme, True),
            "conv3": _layer(rng, (3, 3, c2, c3), 9 * c2, scheme, True),
            "fc1": _layer(rng, (flat_features, fc_units), flat_features, scheme, True),
            "fc2": _layer(rng, (fc_units, num_classes), fc_units, scheme, False),
        }

    def apply(params: Params, x: Any, *, train: bool = False, rng: Any = None) -> Any:
        import jax
        import jax.numpy as jnp

        h = _conv(x, params["conv1"])
        h = _maxpool_2x2(h)
        h = _conv(h, params["conv2"])
        h = _conv(h, params["conv3"])
        h = _maxpool_2x2(h)
        h = jnp.reshape(h, (h.shape[0], -1))
        h = jnp.maximum(h @ params["fc1"]["w"] + params["fc1"]["b"], 0.0)
        if train and keep < 1.0:
            if rng is None:
                raise ValueError("cnn apply(train=True) needs an rng key for dropout")
            mask = jax.random.bernoulli(rng, keep, h.shape)
            h = jnp.where(mask, h / keep, 0.0)
        return h @ params["fc2"]["w"] + params["fc2"]["b"]

    return Model(
        name="cnn",
        input_shape=tuple(input_shape),
        num_classes=num_classes,
        init=init_params,
        apply=apply,
        options=(
            ("channels", conv_channels),
            ("fc_units", int(fc_units)),
            ("keep_prob", keep),
            ("init", scheme),
        ),
    )


# --------------------------------------------------------------------------
# registry

_BUILDERS: dict[str, Callable[..., Model]] = {
    "mlp": _build_mlp,
    "cnn": _build_cnn,
}

MODEL_NAMES: tuple[str, ...] = tuple(_BUILDERS)


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int, **options: Any) -> Model:
    """The model called `name` for inputs of `input_shape` and `num_classes` classes.

    Options are model specific (mlp: hidden, init; cnn: channels, fc_units,
    keep_prob, init). Unknown names or options raise ValueError.
    """
    try:
        builder = _BUILDERS[name]
    except KeyError:
        raise ValueError(
            f"unknown model {name!r}; expected one of {', '.join(MODEL_NAMES)}"
        ) from None
    if num_classes < 2:
        raise ValueError(f"num_classes must be at least 2, got {num_classes}")
    if not input_shape or any(int(d) <= 0 for d in input_shape):
        raise ValueError(f"input_shape must be positive dimensions, got {input_shape}")
    accepted = model_options(name)
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ValueError(
            f"unknown option(s) {', '.join(unknown)} for model {name!r}; "
            f"expected some of {', '.join(accepted)}"
        )
    return builder(tuple(int(d) for d in input_shape), int(num_classes), **options)


def model_options(name: str) -> tuple[str, ...]:
    """The option names model `name` accepts (its builder's keyword-only arguments)."""
    builder = _BUILDERS[name]
    return tuple(
        p.name
        for p in inspect.signature(builder).parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    )
