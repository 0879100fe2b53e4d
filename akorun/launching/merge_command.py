"""The command-line side of merging a run (akorun.launching.run_merge): `akorun merge RUN_DIR`,
and the merge a rank started by hand attempts at its end."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from akocore.cli_support import one_line
from akorun.errors import RunError, UsageError
from akorun.launching.local import summary_table
from akorun.launching.run_merge import merge_ranks, rank_records, records_complete


def merge_if_complete(out: Path, run_id: str, workers: int, *, quiet: bool) -> None:
    """A rank started by hand, at its end: OUT/result.json when OUT holds every rank's
    record of this run, else one line saying how to make it later."""
    if not records_complete(out, run_id, workers):
        if not quiet:
            try:
                held = rank_records(out)
            except UsageError:
                held = {}
            waiting = [r for r in range(workers) if r not in held
                       or held[r].details.get("run_id") != run_id]
            sys.stderr.write(f"result.json: not yet, {out} has no record of rank(s) "
                             f"{', '.join(map(str, waiting))}; the last rank to finish here "
                             f"writes it, or run `akorun merge {out}` once they are together\n")
        return
    try:
        outcome = merge_ranks(out, run_id=run_id)
    except (UsageError, OSError) as error:
        sys.stderr.write(f"result.json: not written ({one_line(error)}); run "
                         f"`akorun merge {out}`\n")
        return
    if outcome.nonfinite is not None:  # said whatever --quiet: the run's model is not usable
        sys.stderr.write(f"wrote {outcome.path}, but {outcome.nonfinite}\n")
    elif not quiet:
        sys.stderr.write(f"wrote {outcome.path} (every rank's record of this run)\n")


def cmd_merge(args: argparse.Namespace) -> int:
    """`akorun merge RUN_DIR`: 0 merged; 1 a replica holds NaN or Inf (result.json written,
    one line naming the ranks); 2 damaged or inconsistent records (one line)."""
    outcome = merge_ranks(Path(args.run_dir))
    if not args.quiet:
        sys.stderr.write(summary_table(outcome.result) + "\n")
    if outcome.nonfinite is not None:
        raise RunError(f"{outcome.nonfinite}; {outcome.path} written")
    if outcome.missing_ranks:
        sys.stderr.write(f"wrote {outcome.path}: partial, rank(s) "
                         f"{', '.join(map(str, outcome.missing_ranks))} left no record in "
                         f"{args.run_dir}\n")
    else:
        sys.stderr.write(f"wrote {outcome.path}: every rank's record\n")
    return 0
