"""Command line: `python -m analysis.ns3_crosscheck run|table`.

run    plays a grid of patterns in ns-3 and akosim, writes the record
       (needs `pip install .[ns3]`; `nox -s ns3` does both).
table  prints the markdown tables of a record (no ns-3 needed).
rescore  recomputes akosim's side of a record for --model (ns-3's times kept; no
       ns-3 needed), e.g. `rescore --model tcp` adds the TCP-aware model's column.

`--model NAME` picks a registered akosim model (analysis.ns3_crosscheck.akosim_run);
`--model NAME=package.module:factory` registers one first, e.g. a TCP-aware
network with FluidNetwork's constructor and `send`.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from dataclasses import replace
from pathlib import Path

from akocore.extras import install_command
from analysis.ns3_crosscheck.akosim_run import MODELS, register_model
from analysis.ns3_crosscheck.ns3_run import DEFAULT_TCP
from analysis.ns3_crosscheck.record import CaseResult, RecordError, read_record, write_record
from analysis.ns3_crosscheck.table import case_table, summary_table

DEFAULT_RECORD = Path("analysis/data/ns3_crosscheck.json")


def _model(spec: str) -> str:
    """NAME, or NAME=module:attr (registered here); the model's name."""
    name, _, target = spec.partition("=")
    if target:
        module_name, _, attribute = target.partition(":")
        try:
            factory = getattr(importlib.import_module(module_name), attribute)
        except (ImportError, AttributeError) as error:
            raise SystemExit(f"--model {spec}: cannot load {target}: {error}") from error
        register_model(name, factory)
    if name not in MODELS:
        raise SystemExit(f"--model {name}: unknown; known: {sorted(MODELS)}")
    return name


def _fail(message: str) -> int:
    print(f"ns3_crosscheck: {message}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.ns3_crosscheck",
                                     description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run a grid in ns-3 and akosim")
    run.add_argument("--grid", default="default", help="default, full, quick or tiny")
    run.add_argument("--buffer-bytes", type=int, default=DEFAULT_TCP.buffer_bytes,
                     help="TCP send and receive buffer (default: ns-3's 131072)")
    run.add_argument("--segment-bytes", type=int, default=DEFAULT_TCP.segment_bytes,
                     help="TCP maximum segment size (default 1448)")
    run.add_argument("--model", action="append", default=None,
                     help="akosim model (repeatable; default: maxmin)")
    run.add_argument("--out", type=Path, default=DEFAULT_RECORD)
    table = commands.add_parser("table", help="print the markdown tables of a record")
    table.add_argument("record", type=Path, nargs="?", default=DEFAULT_RECORD)
    table.add_argument("--cases", action="store_true", help="also list every case")
    rescore = commands.add_parser("rescore", help="recompute akosim's models in a record")
    rescore.add_argument("record", type=Path, nargs="?", default=DEFAULT_RECORD)
    rescore.add_argument("--model", action="append", required=True,
                         help="akosim model to (re)compute (repeatable)")
    args = parser.parse_args(argv)

    if args.command == "rescore":
        from analysis.ns3_crosscheck.grid import rescore as rescore_record

        try:
            models = tuple(_model(spec) for spec in args.model)
            updated = rescore_record(read_record(args.record), models)
        except SystemExit as error:
            return _fail(str(error))
        except (RecordError, ValueError) as error:
            return _fail(str(error))
        write_record(updated, args.record)
        print(f"wrote {args.record} (models: {', '.join(updated.models)})")
        print(summary_table(updated))
        return 0

    if args.command == "table":
        try:
            record = read_record(args.record)
        except RecordError as error:
            return _fail(str(error))
        print(summary_table(record))
        if args.cases:
            print()
            print(case_table(record))
        return 0

    from analysis.ns3_crosscheck.grid import GRIDS, run_grid
    from analysis.ns3_crosscheck.ns3_run import ns3_available

    try:
        models = tuple(_model(spec) for spec in (args.model or ["maxmin"]))
    except SystemExit as error:
        return _fail(str(error))
    if args.grid not in GRIDS:
        return _fail(f"unknown grid {args.grid!r}; known: {', '.join(sorted(GRIDS))}")
    if not ns3_available():
        return _fail("the ns-3 cross-check needs the ns-3 bindings, in the optional extra "
                     f"'ns3': {install_command('ns3')} (or nox -s ns3)")

    def progress(case: CaseResult) -> None:
        print(f"  {case.name}: ns-3 / {models[0]} = {case.ratio(models[0]):.3f} "
              f"({case.ns3_wall_s:.1f} s)", flush=True)

    if args.buffer_bytes < args.segment_bytes or args.segment_bytes < 1:
        return _fail("--buffer-bytes must be at least --segment-bytes, and both positive")
    tcp = replace(DEFAULT_TCP, buffer_bytes=args.buffer_bytes,
                  segment_bytes=args.segment_bytes)
    record = run_grid(args.grid, models, tcp, progress=progress)
    write_record(record, args.out)
    print(f"wrote {args.out} ({len(record.cases)} cases, {record.wall_s:.0f} s)")
    print(summary_table(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
