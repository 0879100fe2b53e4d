"""The design card's first answer: `akosim --workers 64 --bandwidth 40mbps --p auto`.

`plan_figures()` times the whole command in a fresh interpreter (imports,
the cached compute measurement, the Ako rows, the closed-form baselines,
the printed table), second call of two so the compute cache is warm, in a
throwaway cache directory. Beside it, in the same run, a bare SimPy loop of
a fixed size (`bare_simpy_events_per_s`'s loop) gives the reference: the
figure `plan.design_card_over_bare_simpy` is the command's wall time over
the reference's, so it travels across machines; the raw seconds are
reported against the issue's goal (<= 3 s on the 2-core machine).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.bench.common import Figure, best_of

ROOT = Path(__file__).resolve().parents[2]
DESIGN_CARD = ("--workers", "64", "--bandwidth", "40mbps", "--p", "auto", "--quiet")
GOAL_S = 3.0  # issue 10: first answer on screen within 3 s (compute cached)


def _card_s(cache_dir: str) -> float:
    env = {**os.environ, "AKO_CACHE_DIR": cache_dir, "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": str(ROOT)}
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "akosim", *DESIGN_CARD], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    return time.perf_counter() - started


def _bare_simpy_s() -> float:
    import simpy

    def loop() -> None:
        env = simpy.Environment()

        def proc(env: simpy.Environment):
            for _ in range(200):
                yield env.timeout(1)
        for _ in range(1_000):
            env.process(proc(env))
        env.run()
    # CPU time, best of 5: the loop runs in this process, so other jobs' share of the
    # cores does not count (its wall time swung 0.22-0.38 s between two quiet runs).
    return best_of(5, loop, clock=time.process_time)


def plan_figures(repeats: int = 5) -> list[Figure]:
    """The design card's cached wall time, raw and over a bare SimPy loop's."""
    with tempfile.TemporaryDirectory(prefix="ako-bench-cache-") as cache_dir:
        _card_s(cache_dir)  # the first call measures compute and fills the cache
        # each call paired with a reference measured right after it: the VM's speed
        # drifts by a third within a minute, and a pair shares the moment
        pairs = [(_card_s(cache_dir), _bare_simpy_s()) for _ in range(repeats)]
    card_s = min(card for card, _ in pairs)
    ratio = statistics.median(card / reference for card, reference in pairs)
    reference_s = statistics.median(reference for _, reference in pairs)
    return [
        # One figure: the regression check is the ratio (a wall time in a fresh
        # interpreter, imports included, swings by a third on a quiet machine, hence the
        # wider tolerance); the goal is on the raw seconds.
        Figure("plan.design_card_over_bare_simpy", ratio, "x bare SimPy loop",
               higher_is_better=False, goal=GOAL_S, absolute=card_s, absolute_unit="s",
               tolerance=0.6,
               note=f"akosim --workers 64 --bandwidth 40mbps --p auto, compute cached: the "
                    f"median over {repeats} calls of each call's wall time over a bare SimPy "
                    f"loop of 200k timeouts timed right after it (median {reference_s:.3f} "
                    f"CPU s, each the best of 5); the goal on the fastest call"),
    ]


def run() -> list[Figure]:
    return plan_figures()


if __name__ == "__main__":
    for figure in plan_figures():
        print(f"{figure.name} = {figure.value:.3g} {figure.unit}, {figure.absolute:.3g} s "
              f"(goal {figure.goal} s)")
