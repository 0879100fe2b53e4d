"""The Flax CNN of examples/flax_cnn from Python, cell by cell: plan it, simulate one
configuration, train it on 3 local ranks, read the result and the trained model.

    python examples/notebook_style.py            # about a minute on a laptop
    python examples/notebook_style.py --rounds 6 --out runs/notebook

Every call mirrors a command (keyword settings are its flags) and returns a typed
record (akocore.records.results): akosim.plan -> PlanResult, akosim.simulate -> RunResult,
akorun.launch -> RunResult, akocore.read_result(path) -> the record in a file,
akorun.load_params(path) -> the trained model as the model's pytree.
Needs Flax: pip install 'ako-toolkit[flax]'.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import akocore
import akorun
import akosim

MODEL = f"{Path(__file__).resolve().parent / 'flax_cnn' / 'mymodel.py'}:make"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=60, help="rounds of the real run")
    parser.add_argument("--out", default="runs/notebook", help="run directory")
    args = parser.parse_args()

    # --- 1. plan: 8 machines on 100 Mbit/s NICs; the step is measured here, once (cached)
    plan = akosim.plan(workload=MODEL, workers=8, bandwidth="100mbps", quiet=True)
    for run in plan.runs:
        print(f"{run.label:<28} round {run.round_time_s * 1e3:8.2f} ms   "
              f"NIC {100 * (run.nic_utilisation or 0):3.0f}%")
    print(plan.explanation)

    # --- 2. simulate one configuration: Ako with p = 2, s = 1
    run = akosim.simulate(workload=MODEL, workers=8, bandwidth="100mbps", scheme="ako", p=2,
                          ssp=1, rounds=50)
    print(f"{run.label}: {run.samples_per_s:.0f} samples/s, "
          f"{run.bytes_sent_per_worker_per_round / 1e3:.1f} kB sent per round")

    # --- 3. train for real: 3 ranks on this machine, plain SGD
    result = akorun.launch(out=args.out, workload=MODEL, workers=3, rounds=args.rounds,
                           optimizer="sgd", lr=0.1, p=2, ssp=1, quiet=True, force=True)
    print(f"akorun: accuracy {result.accuracy:.3f}, replicas within "
          f"{result.max_relative_difference:.1g} of each other")

    # --- 4. read it back, as a later session would
    again = akocore.read_result(args.out)
    assert isinstance(again, akocore.RunResult)
    print(f"{args.out}/result.json: {again.training_workers} workers, "
          f"round {again.round_time_s * 1e3:.1f} ms, accuracy {again.accuracy:.3f}")
    params = akorun.load_params(args.out)  # rank 0's trained CNN, as the model's init gives it
    print("trained parameters:", {layer: {name: leaf.shape for name, leaf in leaves.items()}
                                  for layer, leaves in params.items()})


if __name__ == "__main__":
    main()
