"""akorun's public Python API: write a cluster file, launch a run on this machine, run one
rank, and Ako's exchange inside the user's own training loop (`Exchange`).

Keyword settings mirror the command line's flags (``workers=3`` is ``--workers 3``,
``rounds=100``, ``workload="./mymodel.py:make"``, ``quiet=True`` is ``--quiet``), ``config=``
a settings or cluster file and ``set=`` dotted settings; they resolve in the same layers as
the command line's. The commands are thin layers over the same functions
(akorun.launch.commands.launch_run, rank_options, run_rank). A mistake raises a ValueError
(`akorun.errors.UsageError`, `akocore.config.ConfigError`, ...) with the line the command
would print; an
unknown keyword is a TypeError naming the keywords there are.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import queue
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from akocore.cli_support import flag_text, parse_quietly, subcommand_parser
from akorun.errors import UsageError

if TYPE_CHECKING:
    import numpy as np

    from akocore.results import RankResult, RunResult
    from akocore.workload import FlatWorkload
    from akorun.runtime.worker import Worker


def init(out: str | os.PathLike[str], *, config: str | os.PathLike[str] | None = None,
         set: Mapping[str, Any] | None = None, **settings: Any) -> Path:
    """Write a cluster file (``akorun init``): the run's settings, one host:port per rank
    (loopback with free ports unless ``hosts`` says otherwise), a fresh run id and secret::

        import akorun
        cluster = akorun.init("run/cluster.toml", workers=3, rounds=50, force=True)
    """
    from akorun.launch.commands import cmd_init

    args = _parse("init", ["--out", os.fspath(out), *_flags("init", config, set, settings)])
    with contextlib.redirect_stderr(io.StringIO()):
        cmd_init(args)
    return Path(out)


def launch(*, out: str | os.PathLike[str], config: str | os.PathLike[str] | None = None,
           set: Mapping[str, Any] | None = None, **settings: Any) -> RunResult:
    """Run every rank on this machine (``akorun launch``) and return the merged result (also
    written to ``OUT/result.json``); `akorun.errors.RunError` names a failed rank::

        import akorun
        run = akorun.launch(out="runs/demo", workers=3, rounds=50,
                            workload="examples/flax_cnn/model.py:make", quiet=True)
        print(run.accuracy, run.max_relative_difference)
    """
    from akorun.launch.commands import launch_run

    workload = settings.get("workload")
    if workload is not None and not isinstance(workload, str):
        raise TypeError("akorun.launch: workload is a name (a built-in, package.module:factory "
                        "or path/to/file.py:factory): every rank is its own process and "
                        "imports it")
    args = _parse("launch", ["--out", os.fspath(out), *_flags("launch", config, set, settings)])
    with warnings.catch_warnings():  # the ranks are fork+exec'd at once: JAX's fork warning
        warnings.filterwarnings("ignore", "os.fork", RuntimeWarning)  # does not apply
        return launch_run(args)


def run_worker(rank: int | None, config: str | os.PathLike[str], *,
               out: str | os.PathLike[str] | None = None,
               set: Mapping[str, Any] | None = None, **settings: Any) -> RankResult:
    """Run one rank of the cluster file `config` in this process, to its end
    (``akorun worker --rank RANK --config FILE``); returns the rank's record::

        import akorun
        record = akorun.run_worker(0, "run/cluster.toml", out="run")
        print(record.rounds, record.accuracy)

    Without a host list (``akorun worker --rendezvous HOST:PORT``), `rank` None takes the
    rank from a rank variable (SLURM_PROCID, JOB_COMPLETION_INDEX, ...) or from the
    order of arrival at the rendezvous::

        record = akorun.run_worker(None, "run/cluster.toml", out="run",
                                   rendezvous="node01:29400")
    """
    from akorun.launch.commands import rank_options, run_rank

    argv = [*([] if rank is None else ["--rank", str(rank)]),
            *_flags("worker", config, set, settings)]
    if out is not None:
        argv += ["--out", os.fspath(out)]
    return run_rank(rank_options(_parse("worker", argv))).rank_result


# ----------------------------------------------------------------- your own loop


class Exchange:
    """Ako's exchange inside your own training loop: you compute gradients with your own
    JAX code, `step` hands them to akorun, which sends their partitions to the peers (in
    a background thread running the rank's event loop), applies its own and the peers'
    gradients with the run's optimizer (``train.optimizer``, ``train.lr``), waits at the
    staleness gate, and returns the parameters of the next round::

        import akorun, jax

        with akorun.Exchange(rank=0, cluster="run/cluster.toml", params=params) as ex:
            params = ex.params                        # the same on every rank
            for batch in my_batches:                  # ex.rounds of them
                grads = jax.grad(my_loss)(params, batch)
                params = ex.step(grads)               # a pytree like `params`
        record = ex.result                            # this rank's RankResult

    Every rank runs the same number of steps, ``rounds`` (default: the cluster file's
    ``train.rounds``); the step after the last returns the final replica, after
    every peer's gradients arrived (under plain SGD every rank then holds the same
    parameters). `params` (any pytree of float arrays) is the starting point of every
    rank: give each the same. `evaluate(params) -> accuracy` (optional) is called on
    the final replica for the record's ``accuracy``. Leaving the ``with`` block early
    stops this rank after the round in flight (a zero gradient): leave on every rank
    at the same step, as a stop rule would.
    """

    def __init__(self, *, rank: int, cluster: str | os.PathLike[str], params: Any,
                 rounds: int | None = None, out: str | os.PathLike[str] | None = None,
                 evaluate: Callable[[Any], float] | None = None,
                 set: Mapping[str, Any] | None = None, **settings: Any) -> None:
        import jax
        import numpy as np
        from jax.flatten_util import ravel_pytree

        flat, unravel = ravel_pytree(jax.tree_util.tree_map(np.asarray, params))
        self._unravel: Callable[[Any], Any] = unravel
        self._init = np.asarray(flat, dtype=np.float32)
        self._user_params = params
        self._evaluate = evaluate
        if rounds is not None:
            settings["rounds"] = rounds
        argv = ["--rank", str(rank), *_flags("worker", cluster, set, {"quiet": True,
                                                                      **settings})]
        if out is not None:
            argv += ["--out", os.fspath(out)]
        self._args = _parse("worker", argv)
        self._to_user: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._from_user: queue.Queue[np.ndarray | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._worker: Worker | None = None
        self._done = False
        self._stopping = False
        self._armed = False  # before the rounds (prepare's measurements): no handoff
        self._loss: float | None = None
        self.rounds = 0
        self.params: Any = None
        self.result: RankResult | None = None

    # ---- the user's side

    def __enter__(self) -> Exchange:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> Any:
        """Join the peers (in the background thread) and return the first parameters."""
        from akorun.launch.commands import rank_options
        from akorun.runtime.worker import Worker

        options = rank_options(self._args)
        self.rounds = options.config.train.rounds or 0
        if not self.rounds:
            raise UsageError("akorun.Exchange: give rounds (the steps of your loop) or "
                             "train.rounds in the cluster file")
        worker = Worker(options)
        worker.prepare(self._bridge_workload(options.config))
        self._worker = worker
        self._thread = threading.Thread(target=self._run, name=f"akorun-rank-{options.rank}",
                                        daemon=True)
        self._armed = True
        self._thread.start()
        return self._next()

    def step(self, grads: Any, loss: float | None = None) -> Any:
        """Hand this round's gradients (a pytree like the parameters) to akorun; returns
        the parameters of the next round (after the last round: the final replica)."""
        import jax
        import numpy as np
        from jax.flatten_util import ravel_pytree

        if self._done:
            raise RuntimeError("akorun.Exchange: the run has ended (all rounds stepped)")
        raveled, _ = ravel_pytree(jax.tree_util.tree_map(np.asarray, grads))
        flat = np.asarray(raveled, dtype=np.float32)
        if flat.shape != self._init.shape:
            raise ValueError(f"akorun.Exchange.step: {flat.size} gradient values for "
                             f"{self._init.size} parameters")
        self._loss = None if loss is None else float(loss)
        self._from_user.put(flat)
        return self._next()

    def close(self) -> None:
        """Stop the run at the next round if steps remain, and wait for the rank's end."""
        worker, thread = self._worker, self._thread
        if worker is None or thread is None:
            return
        if not self._done:
            self._stopping = True
            loop = getattr(worker, "_exchange_loop", None)
            if loop is not None:
                loop.call_soon_threadsafe(worker.waiter.request_stop,
                                          "akorun.Exchange closed before its last round")
            self._from_user.put(None)  # the round in flight: a zero gradient
            while not self._done:
                kind, _ = self._to_user.get()
                if kind in ("done", "error"):
                    self._done = True
                else:
                    self._from_user.put(None)
        thread.join()

    def _next(self) -> Any:
        kind, value = self._to_user.get()
        if kind == "error":
            self._done = True
            raise value
        if kind == "done":
            self._done = True
        self.params = self._unravel(value)
        return self.params

    # ---- the rank's side (the background thread)

    def _run(self) -> None:
        import asyncio

        worker = self._worker
        assert worker is not None

        async def life() -> None:
            worker._exchange_loop = asyncio.get_running_loop()  # type: ignore[attr-defined]
            await worker.run()

        try:
            asyncio.run(life())
            self.result = worker.rank_result
            options = worker.options
            if options.out_dir is not None:  # the last rank to end writes result.json
                from akorun.launch.merge_command import merge_if_complete

                merge_if_complete(options.out_dir, options.settings.run_id,
                                  options.config.cluster.workers, quiet=True)
            node = worker.role.node
            final = self._init if node is None or node.params is None else node.params
            self._to_user.put(("done", final.copy()))
        except BaseException as error:  # the user's thread re-raises it
            self._to_user.put(("error", error))

    def _handoff(self, flat_params: np.ndarray) -> tuple[float | None, np.ndarray]:
        """The gradient step of a round: the user's loop computes it (its loss, when `step`
        is given one, is the rank's reported loss; else none is reported)."""
        import numpy as np

        if not self._armed:  # a measurement before the rounds: no round of the user's
            return 0.0, np.zeros_like(self._init)
        self._to_user.put(("params", np.array(flat_params, copy=True)))
        grads = self._from_user.get()
        if grads is None:
            return 0.0, np.zeros_like(self._init)
        return self._loss, grads

    def _final_accuracy(self, flat_params: np.ndarray) -> float:
        if self._evaluate is None:  # only the warm-up calls it then: the Evaluator does not
            return float("nan")
        return float(self._evaluate(self._unravel(flat_params)))

    def _bridge_workload(self, cfg: Any) -> FlatWorkload:
        """The rank's workload: the user's parameters, gradients from `step`."""
        return _bridge(self, cfg)


def _bridge(exchange: Exchange, cfg: Any) -> FlatWorkload:
    import dataclasses

    import numpy as np

    from akocore.workload import FlatWorkload, flat_workload
    from akocore.workloads import ArrayData, Workload

    workers = cfg.cluster.workers
    examples = max(64, 2 * cfg.train.batch_size * workers)
    data = ArrayData(np.zeros((examples, 1), np.float32), np.zeros(examples, np.int32),
                     np.zeros((1, 1), np.float32), np.zeros(1, np.int32),
                     name="your loop")
    init = exchange._user_params

    def no_loss(params: Any, batch: Any, rng: Any) -> Any:  # never called: step gives grads
        raise AssertionError("akorun.Exchange computes no loss")

    spec = Workload(init=lambda seed: init, loss=no_loss, evaluate=lambda params, batch: 0.0,
                    data=data, optimizer=cfg.train.optimizer, name="akorun.Exchange")
    flat = flat_workload(spec, batch_size=cfg.train.batch_size, seed=cfg.train.seed)

    class Bridge(FlatWorkload):
        evaluates = exchange._evaluate is not None  # else the record has no accuracy

        def grad_step(self, flat_params: Any, x: Any, y: Any,  # type: ignore[override]
                      rng_seed: int = 0) -> tuple[float | None, Any]:
            return exchange._handoff(flat_params)

        def evaluate(self, flat_params: Any) -> float:
            return exchange._final_accuracy(flat_params)

    return Bridge(**{f.name: getattr(flat, f.name) for f in dataclasses.fields(flat)})


# ------------------------------------------------------------------ settings


def _subparser(command: str) -> argparse.ArgumentParser:
    from akorun.launch.commands import build_parser

    return subcommand_parser(build_parser(), command)


def _flags(command: str, config: Any, dotted: Mapping[str, Any] | None,
           settings: Mapping[str, Any]) -> list[str]:
    """Keyword settings as the command's flags; TypeError for one it has no flag for."""
    known = set(_subparser(command).known_flags())  # type: ignore[attr-defined]
    flags: list[str] = []
    if config is not None:
        flags += ["--config", os.fspath(config)]
    for key, value in (dotted or {}).items():
        flags += ["--set", f"{key}={flag_text(value)}"]
    for key, value in settings.items():
        flag = "--" + key.replace("_", "-")
        if flag not in known or flag in ("--config", "--set", "--out", "--rank"):
            names = ", ".join(sorted(f[2:].replace("-", "_") for f in known))
            raise TypeError(f"akorun {command}: no setting {key!r}; the settings are {names}")
        if value is None or value is False:
            continue
        flags += [flag] if value is True else [flag, flag_text(value)]
    return flags


def _parse(command: str, argv: Sequence[str]) -> argparse.Namespace:
    from akorun.launch.commands import build_parser

    return parse_quietly(build_parser(), [command, *argv], f"akorun {command}: bad settings")


__all__ = ["Exchange", "init", "launch", "run_worker"]
