"""The command line of `akosim sweep`: its grid flags, what every point shares, its help.

akosim.sweeping.sweep_grid runs the grid these flags describe; akosim.cli adds the
same flags to its ``sweep`` subcommand (`add_sweep_arguments`).
"""

from __future__ import annotations

import argparse

from akocore.cli_support import OneLineParser

# Grid flags in nesting order (first = outermost): argparse dest and flag.
GRID_FLAGS: tuple[tuple[str, str], ...] = (
    ("workers", "--workers"),
    ("bandwidth", "--bandwidth"),
    ("p", "--p"),
    ("ssp", "--ssp"),
    ("scheme", "--scheme"),
    ("latency", "--latency"),
)
# Single-valued run settings a sweep passes on to every point.
FIXED_FLAGS: tuple[str, ...] = ("rounds", "workload", "batch_size")

DESCRIPTION = """\
Simulate every point of a parameter grid (timing only) and collect the results.
A comma in a grid flag (--workers --bandwidth --p --ssp --scheme --latency)
separates grid VALUES: --bandwidth 40mbps,1gbps is two points, not two NICs.
Per-node bandwidth lists, per-link caps and per-worker p lists therefore come
from --config files or --set (e.g. --set network.link_bandwidth=40,20,10mbps).
Each point runs ONE configuration: the scheme of its config (ako unless
--scheme, --config or --set choose another), not the side-by-side comparison
of plain `akosim`; put --scheme ako,ps,allreduce in the grid to compare.
Results: DIR/points/<id>.json per point (the id hashes the resolved config and
the simulation settings), then DIR/sweep.json (every point in DIR/points) and
DIR/sweep.csv (one row per point). Points already in DIR are skipped, so
running the same command again resumes an interrupted sweep."""

EPILOG = """\
examples:
  akosim sweep --workers 4,16,64 --bandwidth 40mbps,1gbps --p 1,4,auto \\
      --compute 0.3s --out sweep/
      3 x 2 x 3 = 18 Ako points on every core; run it again to resume
  akosim sweep --workers 16 --scheme ako,ps,allreduce --latency 0ms,20ms \\
      --gradient-size 17MB --compute 0.3s --out schemes/
      the three schemes side by side at two latencies (6 points)
  akosim sweep --config configs/hetero-wan.toml --workers 4,8 --p 1,2,4,auto --out wan/
      per-link caps and per-node NICs from the preset, p and n swept
  sbatch --array=0-7 --wrap 'akosim sweep --workers 8,16,32,64 --p 1,2,4,8,auto \\
      --out big/ --shard $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT'
      one eighth of the points per array task (array ids must run 0..N-1); then
      run the same command once without --shard: every point is skipped and
      sweep.json and sweep.csv are written for all of them
"""



def build_parser() -> argparse.ArgumentParser:
    """The parser of `akosim sweep` alone (akosim.cli adds the same flags to its subparser)."""
    parser = OneLineParser(prog="akosim sweep", description=DESCRIPTION, epilog=EPILOG,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    add_sweep_arguments(parser)
    return parser


def add_sweep_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of akosim sweep: grid values, what every point shares, how to run."""
    grid = parser.add_argument_group(
        "grid (a comma separates values; the grid is every combination)")
    add = grid.add_argument
    add("--workers", metavar="N[,N...]", help="numbers of nodes, e.g. 4,16,64")
    add("--bandwidth", metavar="RATE[,RATE...]",
        help="every node's NIC, one value per point, e.g. 40mbps,1gbps")
    add("--p", metavar="P[,P...]",
        help="partitions per gradient: numbers or auto / auto-per-worker, e.g. 1,4,auto")
    add("--ssp", metavar="S[,S...]",
        help="staleness bounds in rounds, e.g. 0,2,inf (default for ako: chosen with p, "
             "the smallest s that lets sending overlap compute, as the plan does)")
    add("--scheme", metavar="NAME[,NAME...]",
        help="exchange schemes among ako, ps, allreduce (default: the config's, ako)")
    add("--latency", metavar="DURATION[,DURATION...]",
        help="one-way latency of every link, e.g. 0ms,20ms")
    fixed = parser.add_argument_group("every point")
    add = fixed.add_argument
    add("--config", metavar="FILE",
        help="TOML run config under every point (grid flags override it), e.g. "
             "configs/uniform-wan.toml")
    add("--set", metavar="SECTION.KEY=VALUE", action="append", dest="set",
        help="override one config value for every point, repeatable, e.g. "
             "--set network.link_bandwidth=40,20,10mbps")
    add("--compute", metavar="DURATION|measure|remeasure", default="measure",
        help="compute seconds per round, e.g. 0.3s; 'measure' takes the --workload's "
             "gradient step on this machine from the compute cache the plan command uses "
             "(measured once and cached when absent), for every point (default); "
             "'remeasure' times it again and refreshes the cache")
    add("--gradient-size", metavar="SIZE",
        help="gradient bytes per worker, e.g. 17MB (default: the --workload's)")
    add("--rounds", metavar="N", help="simulated rounds per point, exactly (default: until "
        "each point's round time settles, at most 3000)")
    add("--workload", metavar="NAME",
        help="workload whose gradient size and compute time are used "
             "(default synthetic-cnn, the seeds' 17 MB CNN)")
    add("--workload-arg", metavar="KEY=VALUE", action="append", dest="workload_arg",
        help="an argument of the workload, repeatable, e.g. --workload-arg width=64")
    add("--batch-size", metavar="N", help="examples per worker per round (default 104)")
    add("--max-staleness", metavar="ROUNDS", type=int, default=None,
        help="hold p = auto within this staleness bound in rounds (p - 1 + s), as akosim "
             "plan does: the largest p that fits, the NIC then pacing the rounds "
             "(default: no limit; the plan's default is 64)")
    run = parser.add_argument_group("running")
    add = run.add_argument
    add("--out", metavar="DIR", required=True,
        help="result folder: points/<id>.json, sweep.json, sweep.csv")
    add("--jobs", metavar="N", type=int, default=None,
        help="points simulated at once, in separate processes (default: every CPU; "
             "1 runs them in this process)")
    add("--shard", metavar="I/N",
        help="run only the points whose index modulo N is I, e.g. 0/4; for a SLURM "
             "array: --shard $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT")
    add("--quiet", action="store_true", help="no progress bar")


# ------------------------------------------------------------------ the grid
