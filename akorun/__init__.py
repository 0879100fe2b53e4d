"""akorun: the real shell (wire format, aiohttp transport, worker loop, launcher, CLI).

The public API mirrors the command line (keyword settings are its flags):

- `launch` runs every rank on this machine and returns the merged `RunResult`;
- `init` writes a cluster file, `run_worker` runs one rank of it in this process;
- `Exchange` puts Ako's exchange inside your own training loop: you compute the
  gradients, akorun exchanges their partitions with the peers and returns the update;
- `merge_run` writes a run's ``result.json`` from its ranks' records (``akorun merge``);
- `load_params` gives back the model a run trained, as the workload's own pytree.

Example::

    import akorun
    run = akorun.launch(out="runs/demo", workers=3, rounds=50, quiet=True)
    print(run.accuracy, run.max_relative_difference)
    params = akorun.load_params("runs/demo")  # the trained model, as init returns it

    path = akorun.merge_run("runs/by-hand")   # runs/by-hand/result.json

Your own loop, on each of the ranks of ``akorun.init("run/cluster.toml", workers=3)``::

    with akorun.Exchange(rank=r, cluster="run/cluster.toml", params=params) as ex:
        for batch in batches:
            params = ex.step(jax.grad(loss)(params, batch))

Each is a plain function or class with its settings as typed keyword parameters
(``help(akorun.launch)`` lists them); the launchers live in akorun.launching.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from akorun.launching.run_merge import merge_run
    from akorun.run_api import Exchange, init, launch, run_worker
    from akorun.run_params import load_params

__all__ = ["Exchange", "init", "launch", "load_params", "merge_run", "run_worker"]


def __getattr__(name: str) -> Any:
    """The public names, imported when first used (``import akorun.transport.wire`` stays light)."""
    if name == "merge_run":
        from akorun.launching.run_merge import merge_run

        return merge_run
    if name == "load_params":
        from akorun.run_params import load_params

        return load_params
    if name in ("Exchange", "init", "launch", "run_worker"):
        from akorun import run_api as api

        return getattr(api, name)
    raise AttributeError(f"module 'akorun' has no attribute {name!r}")
