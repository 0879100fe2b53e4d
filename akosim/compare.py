"""The side-by-side question: Ako with its p against the alternatives.

With no --scheme, akosim answers for the same n machines: Ako with the
chosen p (and which constraint chose it), Ako p=1 (all-to-all full
gradients), a parameter server with the best number of server nodes and with
one, and ring all-reduce. Each variant is one `scenario.simulate` call,
except the lockstep baselines on a homogeneous cluster, which
akosim.closed_form computes without simulating (`run_variant`).
"""

from __future__ import annotations

from collections.abc import Callable

from akosim.closed_form import closed_form_run
from akosim.scenario import Setup, SimRun, Variant, ako_variant, simulate

ProgressFactory = Callable[[str, int], Callable[[int], None]]


def ps_server_candidates(nodes: int) -> list[int]:
    """1, 2, 4, ... up to half the machines (the rest must train)."""
    candidates, k = [], 1
    while k <= max(1, nodes // 2):
        candidates.append(k)
        k *= 2
    return candidates


def run_variant(setup: Setup, variant: Variant, *, factory: ProgressFactory | None = None,
                **kwargs) -> SimRun:
    """`variant` in closed form where that gives the simulation's answer, else simulated."""
    exact = closed_form_run(setup, variant, **kwargs)
    if exact is not None:
        return exact
    return simulate(setup, variant, on_progress=_progress(factory, variant.label,
                                                          _rounds(setup)), **kwargs)


def _progress(factory: ProgressFactory | None, label: str, total: int):
    return factory(label, total) if factory is not None else None


def best_ps(setup: Setup, *, ssp: float, factory: ProgressFactory | None = None,
            **kwargs) -> tuple[SimRun, list[SimRun]]:
    """Simulate ps with every candidate server count; the one with most samples/s."""
    runs = []
    for k in ps_server_candidates(setup.nodes):
        variant = Variant("ps", ps_servers=k, ssp=ssp, label=f"ps {k} server(s)")
        runs.append(run_variant(setup, variant, factory=factory, **kwargs))
    best = max(runs, key=lambda r: r.samples_per_s)
    return best, runs


def _rounds(setup: Setup) -> int:
    return setup.stop.rounds or 0


def compare_all(setup: Setup, *, factory: ProgressFactory | None = None,
                **kwargs) -> list[SimRun]:
    """Ako (chosen p), Ako p=1, ps best k, ps k=1, allreduce, wagma: one SimRun each."""
    ssp = setup.config.exchange.ssp
    ps_ssp = ssp if setup.config.exchange.ps_mode == "async" else 0.0
    total = _rounds(setup)
    chosen = ako_variant(setup)
    variants = [chosen]
    if chosen.p_of != (1,) * setup.nodes:
        variants.append(ako_variant(setup, (1,), label="ako p=1"))
    runs = [simulate(setup, v, on_progress=_progress(factory, v.label, total), **kwargs)
            for v in variants]
    best, ps_runs = best_ps(setup, ssp=ps_ssp, factory=factory, **kwargs)
    best.label = f"ps {best.ps_servers} server(s), best of {len(ps_runs)}"
    runs.append(best)
    if best.ps_servers != 1:
        one = next(r for r in ps_runs if r.ps_servers == 1)
        runs.append(one)
    allreduce = Variant("allreduce", label="ring allreduce")
    runs.append(run_variant(setup, allreduce, factory=factory, **kwargs))
    return runs
