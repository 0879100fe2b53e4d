"""python -m analysis [--results DIR] [--out DIR] [--summary FILE] [--page PAGE] [--force]
python -m analysis new-schemes [--results DIR] [--out DIR] [--baseline FILE] [--page PAGE]
python -m analysis sweep DIR [--out FILE.png]


Regenerates the report (tables, fidelity, plots) from the result files; the
experiments themselves run with `python -m analysis.run` (or `nox -s experiments`).
Paths are relative to the current directory. The report is not replaced by one
made from fewer runs (exit status 2) unless --force. `new-schemes` writes only the
page of the new columns (WAGMA, the Dist-TF scheme: analysis.new_schemes) from a
results folder that may hold only them, and its block of PAGE; the seeds' report
and block stay as they are. The report's pages live in the documentation site
(docs/reports/experiments/, the generated blocks in its index.md); the records behind
them in analysis/data/experiments-summary.json. `sweep DIR` prints and plots
the best configuration per group of an `akosim sweep` folder (analysis.sweep_plot).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from analysis.page_block import REPORT_DIR, REPORT_PAGE
from analysis.report import FewerResults, build_report


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "new-schemes":
        return _new_schemes(argv[1:])
    if argv and argv[0] == "sweep":
        from analysis.sweep_plot import main as sweep_main

        return sweep_main(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m analysis", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, default=Path("results/experiments"),
                        help="the results folder (default results/experiments)")
    parser.add_argument("--out", type=Path, default=REPORT_DIR,
                        help=f"the report folder (default {REPORT_DIR})")
    parser.add_argument("--summary", type=Path, default=None, metavar="FILE.json",
                        help="where the report's records go (default "
                             "analysis/data/experiments-summary.json for the default --out, "
                             "else OUT/summary.json)")
    parser.add_argument("--no-plots", action="store_true", help="tables only")
    parser.add_argument("--page", type=Path, metavar="PAGE.md",
                        help=f"also fill this page's experiments block with the main tables "
                             f"(the site's is {REPORT_PAGE})")
    parser.add_argument("--force", action="store_true",
                        help="replace the report even when fewer runs are found than it has")
    args = parser.parse_args(argv)
    try:
        tables = build_report(args.results, args.out, summary=args.summary,
                              plots=not args.no_plots, page=args.page, force=args.force)
    except FewerResults as error:
        print(f"{parser.prog}: error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {tables}")
    return 0



def _new_schemes(argv: list[str]) -> int:
    from analysis.new_schemes import build_new_schemes_report

    parser = argparse.ArgumentParser(prog="python -m analysis new-schemes",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, default=Path("results/experiments"))
    parser.add_argument("--out", type=Path, default=REPORT_DIR)
    parser.add_argument("--baseline", type=Path, default=None, metavar="SUMMARY.json",
                        help="records of the PS and Ako columns when the results lack them "
                             "(default analysis/data/experiments-summary.json, the committed "
                             "report's, for the default --out; else OUT/summary.json)")
    parser.add_argument("--no-plots", action="store_true", help="tables only")
    parser.add_argument("--page", type=Path, metavar="PAGE.md",
                        help=f"also fill this page's new-schemes block (the site's is "
                             f"{REPORT_PAGE})")
    args = parser.parse_args(argv)
    try:
        page = build_new_schemes_report(args.results, args.out, baseline=args.baseline,
                                        plots=not args.no_plots, page=args.page)
    except ValueError as error:
        print(f"{parser.prog}: error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {page}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
