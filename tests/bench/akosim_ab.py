"""akosim's timing cases, this tree against a git revision, side by side in one run.

    python -m tests.bench.akosim_ab REV                  # random per-pair caps, 10 rounds, 2x
    python -m tests.bench.akosim_ab REV --case homog64 --rounds 1000
    python -m tests.bench.akosim_ab REV --case big1024 --rounds 100 --repeats 1

The revision's tree is exported (git archive) to a temporary folder; each
repeat runs the case once with the revision and once with this tree, each in a
fresh interpreter, alternating, so that both see the same load. It prints the
CPU seconds of each run, the least per side, their ratio, and whether the round
times agree (relative difference <= 1e-9): a speed change must not change
what is simulated. The cases are tests/bench/bench_akosim.py's: `random` is
64 workers with a random per-pair cap U(10,40) Mbit/s under 1 Gbit/s NICs,
`homog64` and `big1024` 64 and 1,024 workers on 40 Mbit/s NICs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CASES = ("random", "homog64", "big1024")

# Runs inside the tree under test (its own akosim); prints one JSON line.
_CHILD = """
import json, sys, time
from tests.bench.bench_akosim import random_links, timed, timing_setup
case, rounds = sys.argv[1], int(sys.argv[2])
if case == "random":
    setup = timing_setup(64, rounds, bandwidth="1gbps", link_matrix=random_links(64))
else:
    setup = timing_setup(64 if case == "homog64" else 1024, rounds)
wall_s, cpu_s, run = timed(setup)
print(json.dumps({"cpu_s": cpu_s, "wall_s": wall_s, "round_time_s": run.round_time_s,
                  "events": run.events}))
"""


def export(revision: str, into: Path) -> None:
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", revision],
                             check=True, capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")


def run_case(tree: Path, case: str, rounds: int) -> dict[str, float]:
    env = {"PYTHONPATH": str(tree), "JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", _CHILD, case, str(rounds)], cwd=tree, env=env,
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.akosim_ab",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("revision", help="git revision to compare with, e.g. main or HEAD~3")
    parser.add_argument("--case", choices=CASES, default="random")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.repeats < 1:
        print("akosim_ab: --rounds and --repeats must be >= 1", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="akosim-ab-") as scratch:
        other = Path(scratch)
        try:
            export(args.revision, other)
        except subprocess.CalledProcessError as error:
            print(f"akosim_ab: cannot export {args.revision!r}: "
                  f"{error.stderr.decode().strip()}", file=sys.stderr)
            return 2
        sides = {args.revision: other, "this tree": ROOT}
        best: dict[str, float] = {name: float("inf") for name in sides}
        round_time_s: dict[str, float] = {}
        started = time.strftime("%H:%M:%S")
        for _ in range(args.repeats):
            for name, tree in sides.items():
                result = run_case(tree, args.case, args.rounds)
                best[name] = min(best[name], result["cpu_s"])
                round_time_s[name] = result["round_time_s"]
                print(f"{name:>12}: {result['cpu_s']:7.2f} CPU s, {result['wall_s']:7.2f} wall s, "
                      f"round {result['round_time_s']!r}, {result['events']}")
    old, new = best[args.revision], best["this tree"]
    times = list(round_time_s.values())
    same = abs(times[0] - times[1]) <= 1e-9 * abs(times[0])
    print(f"{args.case} x {args.rounds} rounds (from {started}): least CPU s "
          f"{old:.2f} ({args.revision}) -> {new:.2f} (this tree), ratio {new / old:.3f}; "
          f"round times {'agree' if same else 'DIFFER'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
