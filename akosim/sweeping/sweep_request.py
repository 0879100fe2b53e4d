"""What one sweep asks for, typed: `SweepRequest`, the grid's axes, the settings under
every point, how a point's grid values enter the settings, and the simulation and
running options (compute seconds, gradient bytes, the staleness limit, processes, shard).

``akosim sweep``'s flags are read into it by `SweepRequest.from_args` (the grid values
and a point's values as flags, "by --workers"); the Python call `akosim.sweep` builds
one from its typed keywords (a point's values as the API layer, "api: workers=8").
akosim.sweeping.sweep_grid runs it.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from akocore.cli_support import UsageError
from akocore.settings.cli_flags import flag_layer, workload_arg_layer
from akocore.settings.layers import Given
from akocore.settings.toml_io import file_layer, set_layer
from akosim.planning.setup import compute_setting, gradient_bytes_of
from akosim.sweeping.sweep_flags import FIXED_FLAGS, GRID_FLAGS

_EXAMPLES = {"workers": "4,16,64", "bandwidth": "40mbps,1gbps", "p": "1,4,auto",
             "ssp": "0,2,inf", "scheme": "ako,ps,allreduce", "latency": "0ms,20ms"}
Axes = tuple[tuple[str, tuple[Any, ...]], ...]  # (grid dest, values) in nesting order


@dataclass(frozen=True)
class SweepRequest:
    """One sweep: its axes (GRID_FLAGS' dests, in nesting order), the layers under every
    point, the layer a point's values make, and how it is simulated and run."""

    out: Path
    axes: Axes
    layers: tuple[Given, ...]  # under every point: file < set < the fixed settings
    point_layer: Callable[[Mapping[str, Any]], list[Given]]  # a point's grid values
    compute: float | str = "measure"  # seconds per round, "measure" or "remeasure"
    gradient_bytes: int | None = None  # None: the workload's
    max_staleness: int | None = None  # hold p = auto within it (None: no limit)
    jobs: int | None = None  # processes (None: every CPU)
    shard: tuple[int, int] = (0, 1)  # (I, N): the points whose index modulo N is I
    quiet: bool = False  # no progress bar
    report: bool = True  # print what ran, what was written and the summary table

    def __post_init__(self) -> None:
        if self.jobs is not None and self.jobs < 1:
            raise UsageError(f"--jobs: got {self.jobs}, expected a number of processes >= 1")
        if self.max_staleness is not None and self.max_staleness < 0:
            raise UsageError(f"--max-staleness: got {self.max_staleness}, expected "
                             f"rounds >= 0")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> SweepRequest:
        """The request of ``akosim sweep``'s flags (their text read here once)."""
        fixed = argparse.Namespace(**{dest: getattr(args, dest) for dest in FIXED_FLAGS})
        layers = [*(file_layer(args.config) if args.config else []), *set_layer(args.set),
                  *flag_layer(fixed), *workload_arg_layer(getattr(args, "workload_arg", None))]
        return cls(out=Path(args.out), axes=grid_values(args), layers=tuple(layers),
                   point_layer=lambda values: flag_layer(argparse.Namespace(**values)),
                   compute=compute_setting(args.compute),
                   gradient_bytes=None if not args.gradient_size
                   else gradient_bytes_of(args.gradient_size),
                   max_staleness=getattr(args, "max_staleness", None), jobs=args.jobs,
                   shard=parse_shard(args.shard), quiet=args.quiet)


def grid_values(args: argparse.Namespace) -> Axes:
    """(dest, values) of every grid flag given, in nesting order."""
    axes = []
    for dest, flag in GRID_FLAGS:
        text = getattr(args, dest, None)
        if text is None:
            continue
        values = tuple(value.strip() for value in text.split(","))
        if not all(values):
            raise UsageError(f"{flag}: got {text!r}, expected values separated by commas, "
                             f"e.g. {_EXAMPLES[dest]} (per-node lists go in --config or --set)")
        axes.append((dest, values))
    return tuple(axes)


def parse_shard(text: str | None) -> tuple[int, int]:
    """"I/N" -> (I, N) with 0 <= I < N; None -> (0, 1)."""
    if text is None:
        return 0, 1
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if match is None or not 0 <= int(match[1]) < int(match[2]):
        raise UsageError(f"--shard: got {text!r}, expected I/N with 0 <= I < N, e.g. 0/4 "
                         f"(SLURM: --shard $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT "
                         f"with --array=0-(N-1))")
    return int(match[1]), int(match[2])
