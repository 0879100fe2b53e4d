"""akosim: predict what a cluster will do before renting it (a simulation of links, NICs and
partition rounds, timing only or really training).

The public API mirrors the command line (keyword settings are its flags; ``config=`` a
settings file, ``overrides=`` dotted settings) and returns typed records (akocore.records.results):

- `plan` compares the schemes and recommends p and s (a `PlanResult`: its ``runs`` are
  the table's rows, ``explanation`` and ``advice`` the recommendation);
- `simulate` times one configuration (a `RunResult`);
- `train` really trains the workload in simulated time (a `RunResult` with accuracy);
- `sweep` simulates a grid of configurations, resumably (the `Sweep` of sweep.json);
- `predict` predicts an akorun run from its directory (a `Prediction`).

Example::

    import akosim
    plan = akosim.plan(workers=64, bandwidth="40mbps", p="auto", compute="0.3s",
                       gradient_size="17MB")
    print(plan.explanation)
    run = akosim.simulate(workers=8, scheme="ako", p=4, compute="50ms",
                          gradient_size="4MB", bandwidth="100mbps", rounds=50)
    print(run.round_time_s)

Each is a plain function with its settings as typed keyword parameters
(``help(akosim.plan)`` lists them); the application layer they are built on is
akosim.planning, ``akosim predict``'s module akosim.prediction, ``akosim sweep``'s
package akosim.sweeping.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from akosim.sim_api import plan, predict, simulate, sweep, train

__all__ = ["plan", "predict", "simulate", "sweep", "train"]


def __getattr__(name: str) -> Any:
    """The public calls, imported when first used (``import akosim`` stays light)."""
    if name in __all__:
        from akosim import sim_api as api

        return getattr(api, name)
    raise AttributeError(f"module 'akosim' has no attribute {name!r}")
