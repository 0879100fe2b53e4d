"""Pick the Distributed-TensorFlow-Guide scheme for the matrix: each candidate in akosim.

    python -m analysis.dist_tf_pick --results /work/results/dist-tf-pick [--jobs 2]

Runs every scheme of `PICK_CANDIDATES` on the cells `CELLS` (the matrix's
scaled configs, written to RESULTS/configs/) with ``akosim train`` and the
matrix's compute time (RESULTS/compute.json's value, default the committed
matrix's measurement), then prints time to target and accuracy after the
budget per candidate (a quarter of the matrix's budget, `PICK_BUDGET_S`).
Simulated time does not depend on the machine's load, so this can run on a
busy machine, but each run costs several CPU-minutes. The choice
(`analysis.matrix.DIST_TF`) and the figures that finished are in
docs/reports/experiments/scaling.md.
"""

from __future__ import annotations

import argparse
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from akocore.records.result_reader import read_result
from akocore.records.results import PlanResult
from analysis.akosim_calls import call_akosim
from analysis.matrix import (
    DIST_TF_CANDIDATES,
    NETWORK_BY_NAME,
    SCALING,
    TARGET_ACCURACY,
    Experiment,
    config_text,
)
from analysis.records import accuracy_at, time_to

# the most network-bound cell: where the exchange scheme matters most (on the LANs every
# asynchronous scheme is compute-bound); one cell, because CPU is scarce here
CELLS = (("hetero-wan", 4),)
# synchronous SGD is left out: it pushes every round like Hogwild and also waits for the
# slowest worker, so it cannot reach the target sooner; SDAG stands for the sync family
PICK_CANDIDATES = tuple(s for s in DIST_TF_CANDIDATES if s != "sync-sgd")
# a quarter of the matrix's budget: an akosim training run costs about as much CPU as the
# real one (every gradient is computed), and asynchronous workers never wait, so a full
# budget is ~4,800 gradient steps per worker
PICK_BUDGET_S = round(SCALING.budget_s / 4, 2)
# akosim's --compute measure of digits-cnn (single-thread XLA) behind the committed matrix
MATRIX_COMPUTE_S = 0.006982361499467515


def _run(results: Path, exp: Experiment, compute_s: float) -> tuple[Experiment, Path]:
    config = results / "configs" / f"{exp.network.name}-{exp.workers}w-{exp.scheme}.toml"
    out = results / "runs" / f"{exp.network.name}-{exp.workers}w-{exp.scheme}.json"
    if not out.exists():
        config.parent.mkdir(parents=True, exist_ok=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(config_text(exp))
        argv = ["train", "--config", str(config), "--quiet", "--compute", f"{compute_s!r}s",
                "--duration", f"{PICK_BUDGET_S:g}s", "--out", str(out)]
        code = call_akosim(argv)
        if code != 0:
            raise RuntimeError(f"akosim {' '.join(argv)} failed (exit {code})")
    return exp, out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.dist_tf_pick",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, required=True)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--compute-s", type=float, default=MATRIX_COMPUTE_S)
    args = parser.parse_args(argv)
    experiments = [Experiment(NETWORK_BY_NAME[net], n, scheme)
                   for net, n in CELLS for scheme in PICK_CANDIDATES]
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        done = list(pool.map(lambda e: _run(args.results, e, args.compute_s), experiments))
    print(f"| cell | {' | '.join(PICK_CANDIDATES)} |")
    print("|---|" + "---|" * len(PICK_CANDIDATES))
    rows: dict[str, list[str]] = {}
    for exp, out in done:
        plan = read_result(json.loads(out.read_text()))
        assert isinstance(plan, PlanResult)
        curve = [(float(t), int(r), float(a)) for t, r, a in plan.runs[0].evaluations]
        hit = time_to(curve, TARGET_ACCURACY, PICK_BUDGET_S)
        final = accuracy_at(curve, PICK_BUDGET_S)
        cell = f"{exp.network.name}/{exp.workers}w"
        rows.setdefault(cell, []).append(
            f"{'-' if hit is None else f'{hit[0]:.1f} s'} / "
            f"{'-' if final is None else f'{100 * final:.1f}%'}")
    for cell, cells in rows.items():
        print(f"| {cell} | {' | '.join(cells)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
