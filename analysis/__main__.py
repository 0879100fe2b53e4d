"""python -m analysis --results results/experiments --out docs/experiments --readme README.md

Regenerates the report (tables, fidelity, plots) from the result files; the
experiments themselves run with `python -m analysis.run` (or `nox -s experiments`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from analysis.report import build_report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, default=Path("results/experiments"))
    parser.add_argument("--out", type=Path, default=Path("docs/experiments"))
    parser.add_argument("--no-plots", action="store_true", help="tables only")
    parser.add_argument("--readme", type=Path, metavar="README.md",
                        help="also fill this file's experiments block with the main tables")
    args = parser.parse_args(argv)
    readme = build_report(args.results, args.out, plots=not args.no_plots,
                          project_readme=args.readme)
    print(f"wrote {readme}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
