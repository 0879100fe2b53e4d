"""akorun's public Python API: write a cluster file, launch a run on this machine, run one
rank, and Ako's exchange inside the user's own training loop (`Exchange`).

Each call names its settings as typed keyword parameters (``inspect.signature`` and
``help()`` list them): the run and [akorun] settings its command takes, by the key's
name (``workers=3``, ``rounds=100``, ``workload="./mymodel.py:make"``,
``peer_timeout="30s"`` or 30.0 seconds), and the command's own options (``quiet=True``,
``timeout="10m"``). A value left None is not given: the layer below decides. ``config``
(a settings or cluster file) and dotted ``overrides`` complete them; they resolve in the
command line's layers, the keywords entering directly as the API layer, whose origin
says "api" (akocore.settings.api_layer; no flag text is built). The commands are thin
layers over the same functions (akorun.launching.commands.init_cluster, launch_run,
rank_options, run_rank), with the command's own options typed
(akorun.launching.requests). A mistake raises a ValueError (`akorun.errors.UsageError`,
`akocore.settings.normalise.ConfigError`, ...) with the line the command would print; an unknown
keyword is a TypeError naming the settings there are.
"""

from __future__ import annotations

import contextlib
import io
import os
import queue
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from akocore.settings.api_layer import api_layer, config_layers, takes_settings
from akocore.settings.key_registry import Tool
from akocore.settings.layers import Given
from akorun.errors import UsageError
from akorun.launching.cluster import DEFAULT_BASE_PORT

if TYPE_CHECKING:
    import numpy as np

    from akocore.records.results import RankResult, RunResult
    from akocore.workloads.flat import FlatWorkload
    from akorun.launching.requests import RankRequest
    from akorun.runtime.worker import Worker

PathText = str | os.PathLike[str]


@takes_settings(Tool.AKORUN_INIT)
def init(out: PathText, config: PathText | None = None, *,
         overrides: Mapping[str, Any] | None = None,
         hosts: str | Sequence[str] | None = None, base_port: int = DEFAULT_BASE_PORT,
         per_rank_keys: PathText | None = None, force: bool = False,
         **settings: Any) -> Path:
    """Write a cluster file (``akorun init``): the run's settings, one host:port per rank
    (loopback with free ports unless ``hosts`` says otherwise, ``base_port`` for a host
    given without one), a fresh run id and secret (with ``per_rank_keys``, a key file
    per rank there instead of the secret)::

        import akorun
        cluster = akorun.init("run/cluster.toml", workers=3, rounds=50, force=True)
    """
    from akorun.launching.commands import init_cluster
    from akorun.launching.requests import InitRequest, whole

    request = InitRequest(out=Path(out),
                          hosts=hosts if hosts is None or isinstance(hosts, str)
                          else ",".join(hosts),
                          base_port=whole(base_port, "base_port", 1) or DEFAULT_BASE_PORT,
                          per_rank_keys=None if per_rank_keys is None else Path(per_rank_keys),
                          force=force)
    layers = _layers("akorun.init", (Tool.AKORUN_INIT,), config, overrides, settings)
    with contextlib.redirect_stderr(io.StringIO()):
        init_cluster(request, layers)
    return Path(out)


@takes_settings(Tool.AKORUN_LAUNCH)
def launch(*, out: PathText, config: PathText | None = None,
           overrides: Mapping[str, Any] | None = None, force: bool = False,
           quiet: bool = False, timeout: str | float | None = None,
           kill_grace: str | float | None = None, progress_every: str | float | None = None,
           checkpoint_dir: PathText | None = None, plan: PathText | None = None,
           plan_rank: int | None = None, testbed: str | None = None,
           testbed_latency: str | None = None, testbed_jitter: str | float | None = None,
           testbed_downlink: bool | None = None, **settings: Any) -> RunResult:
    """Run every rank on this machine (``akorun launch``) and return the merged result (also
    written to ``OUT/result.json``); `akorun.errors.RunError` names a failed rank.
    Durations (``timeout``, ``kill_grace``, ``progress_every``) are text with a unit
    ("10m") or seconds; ``plan`` runs what an akosim plan record recommends (its
    ``plan_rank``-th with a ranking), ``testbed="netns"`` over real kernel TCP::

        import akorun
        run = akorun.launch(out="runs/demo", workers=3, rounds=50,
                            workload="examples/flax_cnn/model.py:make", quiet=True)
        print(run.accuracy, run.max_relative_difference)
    """
    from akorun.launching.commands import launch_run
    from akorun.launching.requests import LaunchRequest, seconds, whole

    workload = settings.get("workload")
    if workload is not None and not isinstance(workload, str):
        raise TypeError("akorun.launch: workload is a name (a built-in, package.module:factory "
                        "or path/to/file.py:factory): every rank is its own process and "
                        "imports it")
    request = LaunchRequest(
        out=Path(out), force=force, quiet=quiet, timeout_s=seconds(timeout, "timeout"),
        kill_grace_s=seconds(kill_grace, "kill_grace"),
        progress_every_s=seconds(progress_every, "progress_every"),
        checkpoint_dir=None if checkpoint_dir is None else Path(checkpoint_dir),
        plan=None if plan is None else Path(plan),
        plan_rank=whole(plan_rank, "plan_rank", 1), testbed=testbed,
        testbed_latency=testbed_latency,
        testbed_jitter_s=seconds(testbed_jitter, "testbed_jitter"),
        testbed_downlink=testbed_downlink)
    layers = _layers("akorun.launch", (Tool.AKORUN_LAUNCH,), config, overrides, settings)
    with warnings.catch_warnings():  # the ranks are fork+exec'd at once: JAX's fork warning
        warnings.filterwarnings("ignore", "os.fork", RuntimeWarning)  # does not apply
        return launch_run(request, layers)


@takes_settings(Tool.AKORUN_RANK)
def run_worker(rank: int | None, config: PathText, *, out: PathText | None = None,
               overrides: Mapping[str, Any] | None = None, role: str = "worker",
               rendezvous: str | None = None, advertise: str | None = None,
               resume: bool = False, checkpoint_dir: PathText | None = None,
               progress_every: str | float | None = None, quiet: bool = False,
               listen: str | None = None, grace: str | float | None = None,
               tls_ca: str | None = None, **settings: Any) -> RankResult:
    """Run one rank of the cluster file `config` in this process, to its end
    (``akorun worker --rank RANK --config FILE``; ``role="ps"`` is ``akorun ps``);
    returns the rank's record::

        import akorun
        record = akorun.run_worker(0, "run/cluster.toml", out="run")
        print(record.rounds, record.accuracy)

    Without a host list (``akorun worker --rendezvous HOST:PORT``), `rank` None takes the
    rank from a rank variable (SLURM_PROCID, JOB_COMPLETION_INDEX, ...) or from the
    order of arrival at the rendezvous::

        record = akorun.run_worker(None, "run/cluster.toml", out="run",
                                   rendezvous="node01:29400")
    """
    from akorun.launching.commands import rank_options, run_rank

    request = _rank_request(rank, config, out, role=role, rendezvous=rendezvous,
                            advertise=advertise, resume=resume, checkpoint_dir=checkpoint_dir,
                            progress_every=progress_every, quiet=quiet, listen=listen,
                            grace=grace, tls_ca=tls_ca)
    layers = _layers("akorun.run_worker", (Tool.AKORUN_RANK,), None, overrides, settings)
    return run_rank(rank_options(request, layers)).rank_result


def _rank_request(rank: int | None, config: PathText, out: PathText | None, *,
                  progress_every: str | float | None = None,
                  grace: str | float | None = None,
                  checkpoint_dir: PathText | None = None, **more: Any) -> RankRequest:
    from akorun.launching.requests import RankRequest, seconds, whole

    return RankRequest(config=Path(config), rank=whole(rank, "rank"),
                       out=None if out is None else Path(out),
                       checkpoint_dir=None if checkpoint_dir is None else Path(checkpoint_dir),
                       progress_every_s=seconds(progress_every, "progress_every"),
                       grace_s=seconds(grace, "grace"), **more)


def _layers(call: str, tools: Sequence[Tool], config: PathText | None,
            overrides: Mapping[str, Any] | None, settings: Mapping[str, Any]) -> list[Given]:
    """A call's settings file, overrides and keywords as settings layers."""
    return [*config_layers(config, overrides), *api_layer(settings, tools, call)]


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

    @takes_settings(Tool.AKORUN_RANK)
    def __init__(self, *, rank: int, cluster: PathText, params: Any,
                 rounds: int | None = None, out: PathText | None = None,
                 evaluate: Callable[[Any], float] | None = None,
                 overrides: Mapping[str, Any] | None = None, **settings: Any) -> None:
        import jax
        import numpy as np
        from jax.flatten_util import ravel_pytree

        flat, unravel = ravel_pytree(jax.tree_util.tree_map(np.asarray, params))
        self._unravel: Callable[[Any], Any] = unravel
        self._init = np.asarray(flat, dtype=np.float32)
        self._user_params = params
        self._evaluate = evaluate
        self._request = _rank_request(rank, cluster, out, quiet=True)
        self._layers = _layers("akorun.Exchange", (Tool.AKORUN_RANK,), None, overrides,
                               {**settings, "rounds": rounds})
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
        from akorun.launching.commands import rank_options
        from akorun.runtime.worker import Worker

        options = rank_options(self._request, self._layers)
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
                from akorun.launching.merge_command import merge_if_complete

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

    from akocore.workloads import ArrayData, Workload
    from akocore.workloads.flat import FlatWorkload, flat_workload

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


__all__ = ["Exchange", "init", "launch", "run_worker"]
