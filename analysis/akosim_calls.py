"""akosim from the analysis code: Python calls, each in a fresh interpreter.

The experiment runners call akosim's own functions (`akosim.cli.main` with
an argument list, `akosim.planning.measured_compute`) instead of running the
`akosim` executable. Each call runs in a spawned interpreter because a
configuration may need its own XLA flags (akorun's single-threaded XLA when
it would launch as many processes as cores), which JAX reads once per
process, and so that parallel calls use more than one core. The child's
environment is set before it imports anything of JAX.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def _set_environment(env: Mapping[str, str]) -> None:
    os.environ.update(env)


def in_fresh_interpreter(function: Callable[..., T], *args: Any,
                         env: Mapping[str, str] | None = None,
                         timeout_s: float | None = None) -> T:
    """`function(*args)` in a spawned interpreter whose environment has `env` added;
    TimeoutError (the interpreter stopped) when it takes longer than `timeout_s`."""
    context = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(max_workers=1, mp_context=context,
                               initializer=_set_environment, initargs=(dict(env or {}),))
    try:
        result = pool.submit(function, *args).result(timeout=timeout_s)
    except FutureTimeout:
        for process in list(getattr(pool, "_processes", {}).values()):
            process.terminate()  # the interpreter this call started
        pool.shutdown(wait=False, cancel_futures=True)
        raise TimeoutError(f"{getattr(function, '__name__', 'call')} took longer than "
                           f"{timeout_s:g} s") from None
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    return result


def _akosim_main(argv: list[str], log: str, mode: str) -> int:
    from akosim.cli import main

    with open(log, mode, encoding="utf-8") as handle, contextlib.redirect_stdout(handle), \
            contextlib.redirect_stderr(handle):
        try:
            return int(main(argv))
        except SystemExit as stop:  # a user mistake: akosim says it in one line, exit 2
            return stop.code if isinstance(stop.code, int) else 1


def call_akosim(argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                log: Path | None = None, append: bool = False,
                timeout_s: float | None = None) -> int:
    """`akosim ARGV...` as a call of akosim.cli.main (its output to `log`, appended with
    `append`, or discarded); the exit status. TimeoutError past `timeout_s`."""
    target = str(log) if log is not None else os.devnull
    return in_fresh_interpreter(_akosim_main, list(argv), target, "a" if append else "w",
                                env=env, timeout_s=timeout_s)


def _measured_compute_s(config_path: str) -> float:
    from akocore.settings.layers import resolve
    from akocore.settings.toml_io import file_layer
    from akosim.planning import measured_compute
    from akosim.planning.runspec import TIMING_DEFAULTS

    cfg = resolve(file_layer(config_path), defaults=TIMING_DEFAULTS).config
    return float(measured_compute(cfg, announce=False).record.compute_s)


def measured_compute_s(config_path: Path, *, env: Mapping[str, str] | None = None) -> float:
    """akosim's ``--compute measure`` of the workload a config file names: from the
    per-machine compute cache, or measured now (in a fresh interpreter with `env`)."""
    return in_fresh_interpreter(_measured_compute_s, str(config_path), env=env)
