"""The user's own NaN: a training step whose loss or gradient is not finite.

akorun (each training rank) and akosim train (each simulated worker) check every
step's results where they already hold them on the host: `step_problem` says
what is not finite (the loss: one float; the gradient: its dot product with
itself, one BLAS pass with no temporary array and no device sync, since the
gradient is already a host array). Only once a step went wrong is its batch
looked at (`batch_holds`), so that the one line `nonfinite_line` builds can say
where it first appeared (the rank, the round, the batch, the local loss) and
whether the data held it (a NaN or Inf in the inputs or targets) or the
training diverged on finite data.

`NonFiniteStep` carries that line; akorun turns it into a failed run (exit 1),
akosim train into exit 1 as well.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["NonFiniteStep", "batch_holds", "gradient_is_finite", "is_nonfinite_stop",
           "nonfinite_line", "step_problem"]

_WORDS = "non-finite training step at round"  # in every line nonfinite_line builds


class NonFiniteStep(Exception):
    """A training step's loss or gradient was NaN or Inf; the message is the one line."""


def gradient_is_finite(grad: np.ndarray) -> bool:
    """Whether every value of `grad` is finite. The fast path is its dot product with
    itself (one BLAS pass, no temporary array): finite means every value is; a NaN or
    Inf makes it non-finite, and so can an overflow of huge finite values, which the
    exact check (`np.isfinite`) then tells apart."""
    flat = np.ravel(grad)
    with np.errstate(over="ignore", invalid="ignore"):
        if math.isfinite(float(np.dot(flat, flat))):
            return True
    return bool(np.isfinite(flat).all())


def step_problem(loss: float | None, grad: np.ndarray) -> str | None:
    """What is not finite in one step's (loss, gradient), in words; None: both are (a
    loss of None, a gradient from the user's own loop, is not checked)."""
    if loss is not None and not math.isfinite(loss):
        return f"the loss is {_word(loss)}"
    if not gradient_is_finite(grad):
        return "the gradient holds NaN or Inf (the loss is finite)"
    return None


def _word(value: float) -> str:
    return "NaN" if math.isnan(value) else ("+Inf" if value > 0 else "-Inf")


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, Mapping):
        return [leaf for item in value.values() for leaf in _leaves(item)]
    if isinstance(value, list | tuple):
        return [leaf for item in value for leaf in _leaves(item)]
    return [value]


def _nonfinite(value: Any) -> bool:
    """Whether `value` (an array, a number or a pytree of them) holds a NaN or Inf."""
    for leaf in _leaves(value):
        try:
            array = np.asarray(leaf)
        except (TypeError, ValueError):
            continue
        if array.dtype.kind in "fc" and not bool(np.isfinite(array).all()):
            return True
    return False


def batch_holds(batch: Any) -> tuple[str, ...]:
    """Which parts of a batch (an object with ``x`` and ``y``) hold NaN or Inf:
    ``("inputs",)``, ``("targets",)``, both or none."""
    return tuple(name for name, part in (("inputs", getattr(batch, "x", None)),
                                         ("targets", getattr(batch, "y", None)))
                 if part is not None and _nonfinite(part))


def _batch_name(batch: Any, stream_step: int | None) -> str:
    epoch, index = getattr(batch, "epoch", None), getattr(batch, "index", None)
    if isinstance(epoch, int) and isinstance(index, int):
        return f"batch {index} of epoch {epoch}"
    if stream_step is not None:
        return f"batch {stream_step} of its stream"
    return "its batch"


def nonfinite_line(*, who: str, round_: int, batch: Any, loss: float | None, problem: str,
                   stream_step: int | None = None) -> str:
    """The one line: `who` (``rank 2``, ``simulated worker 2``) at round `round_` on
    `batch`: `problem` (step_problem's), the local loss, and what the batch holds. A
    loss of None: the gradient came from the user's own loop (akorun.Exchange), which
    holds the batch."""
    if loss is None:
        return (f"{who}: {_WORDS} {round_}: {problem}: the gradient your own loop gave "
                f"akorun.Exchange.step (check its loss and data); stopped")
    held = batch_holds(batch)
    if held:
        cause = (f"the batch's {' and '.join(held)} hold NaN or Inf: clean the data "
                 f"(or filter it in the workload's data source)")
    else:
        cause = ("the batch's data are finite: training diverged (try a lower train.lr "
                 "or check the loss for log(0), division by zero or overflow)")
    return (f"{who}: {_WORDS} {round_}, "
            f"{_batch_name(batch, stream_step)}: {problem} (local loss {loss:.6g}); "
            f"{cause}; stopped")


def is_nonfinite_stop(stop_reason: str | None) -> bool:
    """Whether a rank's stop reason is a line of `nonfinite_line` (akorun's record)."""
    return stop_reason is not None and _WORDS in stop_reason
