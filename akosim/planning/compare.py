"""The side-by-side question: Ako with its p against the alternatives.

With no --scheme, akosim answers for the same n machines, for every scheme
of the registry that takes part in the comparison (`Scheme.compared`): Ako
with the chosen p (and which constraint chose it), Ako p=1 (all-to-all full
gradients), a parameter server with the best number of server nodes and with
one, and ring all-reduce. Each variant is one `scenario.simulate` call,
except the lockstep baselines on a homogeneous cluster, which
akosim.sim.closed_form computes without simulating (`run_variant`).
"""

from __future__ import annotations

from collections.abc import Callable

from akocore.schemes.protocol import Scheme
from akocore.schemes.ps_family import PS
from akocore.schemes.registry import registered
from akosim.sim.closed_form import closed_form_run
from akosim.sim.scenario import Setup, SimRun, Variant, ako_variant, simulate

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
            name: str = PS.name, **kwargs) -> tuple[SimRun, list[SimRun]]:
    """Simulate the server scheme `name` with every candidate server count; the one with
    most samples/s."""
    runs = []
    for k in ps_server_candidates(setup.nodes):
        variant = Variant(name, ps_servers=k, ssp=ssp, label=f"{name} {k} server(s)")
        runs.append(run_variant(setup, variant, factory=factory, **kwargs))
    best = max(runs, key=lambda r: r.samples_per_s)
    return best, runs


def _rounds(setup: Setup) -> int:
    return setup.stop.rounds or 0


def compare_all(setup: Setup, *, factory: ProgressFactory | None = None,
                **kwargs) -> list[SimRun]:
    """One SimRun per variant of every scheme in the comparison, in registry order: a
    partitioned scheme (Ako) with the chosen p and with p=1, a scheme with servers (ps)
    with the best number of servers and with one, any other as configured."""
    runs: list[SimRun] = []
    for scheme in registered().values():
        if not scheme.compared:
            continue
        if scheme.partitioned:
            runs += _partitioned_runs(setup, factory, **kwargs)
        elif scheme.has_servers:
            runs += _server_runs(setup, scheme, factory, **kwargs)
        else:
            variant = Variant(scheme.name, label=scheme.variant_label(setup.config.exchange))
            runs.append(run_variant(setup, variant, factory=factory, **kwargs))
    return runs


def _partitioned_runs(setup: Setup, factory: ProgressFactory | None, **kwargs) -> list[SimRun]:
    """Ako with the chosen p, and with p=1 when that is another p."""
    total = _rounds(setup)
    chosen = ako_variant(setup)
    variants = [chosen]
    if chosen.p_of != (1,) * setup.nodes:
        variants.append(ako_variant(setup, (1,), label="ako p=1"))
    return [simulate(setup, v, on_progress=_progress(factory, v.label, total), **kwargs)
            for v in variants]


def _server_runs(setup: Setup, scheme: Scheme, factory: ProgressFactory | None,
                 **kwargs) -> list[SimRun]:
    """The best number of servers, and one server when that is not the best."""
    exchange = setup.config.exchange
    ssp = exchange.ssp if exchange.ps_mode == "async" else 0.0
    best, tried = best_ps(setup, ssp=ssp, factory=factory, name=scheme.name, **kwargs)
    best.label = f"{scheme.name} {best.ps_servers} server(s), best of {len(tried)}"
    runs = [best]
    if best.ps_servers != 1:
        runs.append(next(r for r in tried if r.ps_servers == 1))
    return runs
