"""Adapters from the usual JAX model libraries to a `Workload`.

This module owns `from_flax` (flax.linen), `from_nnx` (flax.nnx), `from_equinox`
and `classifier_loss`, the default loss and evaluation of all three (mean softmax
cross-entropy on integer labels, test accuracy). Flax and Equinox are optional
extras, imported only when an adapter is called; a missing one is named with the
command that installs it. Plain JAX functions need no adapter: build a `Workload`
directly.

Only trainable arrays are parameters: Flax's "params" collection, nnx.Param
variables, Equinox's inexact arrays. Models with other mutable state (batch
statistics) are refused, because every rank would keep its own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from akocore.workloads.spec import DataSource, Workload

Apply = Callable[[Any, Any, Any, bool], Any]  # (params, x, rng or None, train) -> logits


def _require(module: str, extra: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(f"{module} is not installed; install it with "
                          f"pip install 'ako-toolkit[{extra}]'") from None


def classifier_loss(apply: Apply) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """(loss, evaluate) of a classifier `apply(params, x, rng, train) -> logits`:
    mean softmax cross-entropy on integer labels, and test accuracy and loss."""

    def loss(params: Any, batch: Any, rng: Any) -> Any:
        import optax

        x, y = batch
        return optax.softmax_cross_entropy_with_integer_labels(
            apply(params, x, rng, True), y).mean()

    def evaluate(params: Any, batch: Any) -> dict[str, Any]:
        import jax.numpy as jnp
        import optax

        x, y = batch
        logits = apply(params, x, None, False)
        return {"accuracy": jnp.mean(jnp.argmax(logits, axis=-1) == y),
                "loss": optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()}

    return loss, evaluate


def _workload(init: Any, apply: Apply, data: DataSource, loss: Any, evaluate: Any,
              optimizer: Any) -> Workload:
    default_loss, default_evaluate = classifier_loss(apply)
    return Workload(init=init, loss=loss or default_loss, evaluate=evaluate or default_evaluate,
                    data=data, optimizer=optimizer)


def from_flax(module: Any, *, data: DataSource, example_input: Any = None,
              loss: Callable[..., Any] | None = None,
              evaluate: Callable[..., Any] | None = None, optimizer: Any = None,
              train_kwargs: Mapping[str, Any] | None = None,
              eval_kwargs: Mapping[str, Any] | None = None) -> Workload:
    """A flax.linen `module` as a Workload; its parameters are ``module.init(key,
    example_input)["params"]`` with ``key = PRNGKey(seed)`` (`example_input` defaults
    to the first training input of ArrayData).

    Training calls ``module.apply({"params": p}, x, rngs={"dropout": rng},
    **train_kwargs)``, evaluation ``module.apply({"params": p}, x, **eval_kwargs)``
    (e.g. ``train_kwargs={"train": True}``). Without `loss`/`evaluate` the module's
    output is taken as class logits (see `classifier_loss`); a custom `loss` gets
    ``(params, batch, rng)`` and may call ``module.apply`` itself.

    Example::

        from_flax(CNN(), example_input=x_train[:1],
                  data=ArrayData(x_train, y_train, x_test, y_test))
    """
    _require("flax", "flax")
    if example_input is None:  # one training example of array data
        x_train = getattr(data, "x_train", None)
        if x_train is None:
            raise ValueError("from_flax needs example_input (one batch of inputs) when the "
                             "data are not ArrayData")
        example_input = x_train[:1]
    train_options = dict(train_kwargs or {})
    eval_options = dict(eval_kwargs or {})

    def init(key: Any) -> Any:
        variables = module.init(key, example_input, **eval_options)
        others = sorted(set(variables) - {"params"})
        if others:
            raise ValueError(f"{type(module).__name__} has mutable collections "
                             f"{', '.join(others)}; only 'params' can be trained")
        return variables["params"]

    def apply(params: Any, x: Any, rng: Any, train: bool) -> Any:
        if train:
            rngs = {"dropout": rng} if rng is not None else None
            return module.apply({"params": params}, x, rngs=rngs, **train_options)
        return module.apply({"params": params}, x, **eval_options)

    return _workload(init, apply, data, loss, evaluate, optimizer)


def from_nnx(model: Any, *, data: DataSource, loss: Callable[..., Any] | None = None,
             evaluate: Callable[..., Any] | None = None, optimizer: Any = None) -> Workload:
    """A flax.nnx model as a Workload: `model` is an ``nnx.Module``, or a function of
    ``nnx.Rngs(seed)`` building one (then the run's seed picks the initial values).

    Its ``nnx.Param`` variables are the parameters; the model is called as
    ``model(x)`` (set dropout off or drive it yourself in a custom `loss`).

    Example::

        from_nnx(lambda rngs: MLP(64, 10, rngs=rngs),
                 data=ArrayData(x_train, y_train, x_test, y_test))
    """
    nnx = _require("flax.nnx", "flax")
    built = model if isinstance(model, nnx.Module) else None

    def module_of(seed: int) -> Any:
        return built if built is not None else model(nnx.Rngs(seed))

    graphdef, _, rest = nnx.split(module_of(0), nnx.Param, ...)

    def init(seed: int) -> Any:
        _, params, _ = nnx.split(module_of(seed), nnx.Param, ...)
        return params  # an nnx.State: a pytree of the Param values

    def apply(params: Any, x: Any, rng: Any, train: bool) -> Any:
        return nnx.merge(graphdef, params, rest)(x)

    return _workload(init, apply, data, loss, evaluate, optimizer)


def from_equinox(model: Any, *, data: DataSource, loss: Callable[..., Any] | None = None,
                 evaluate: Callable[..., Any] | None = None, optimizer: Any = None,
                 batched: bool = False) -> Workload:
    """An equinox Module as a Workload: `model` is a Module, or a function of a PRNG key
    building one (then the run's seed picks the initial values).

    Its inexact arrays are the parameters, the rest stays static. The model maps one
    example to logits and is vmapped over the batch (``batched=True``: it takes the
    whole batch itself).

    Example::

        from_equinox(lambda key: eqx.nn.MLP(64, 10, 128, 2, key=key),
                     data=ArrayData(x_train, y_train, x_test, y_test))
    """
    eqx = _require("equinox", "equinox")
    import jax

    built = model if isinstance(model, eqx.Module) else None

    def module_of(key: Any) -> Any:
        return built if built is not None else model(key)

    _, static = eqx.partition(module_of(jax.random.PRNGKey(0)), eqx.is_inexact_array)

    def init(key: Any) -> Any:
        params, _ = eqx.partition(module_of(key), eqx.is_inexact_array)
        return params

    def apply(params: Any, x: Any, rng: Any, train: bool) -> Any:
        network = eqx.combine(params, static)
        return network(x) if batched else jax.vmap(network)(x)

    return _workload(init, apply, data, loss, evaluate, optimizer)
