"""python -m analysis sweep DIR: the summary of an `akosim sweep` folder, plotted.

Reads the sweep's records (DIR/sweep.json), prints the best configuration of each group (the table
`akosim sweep` prints, akosim.sweep_summary) and, with matplotlib, writes
DIR/sweep.png: samples/s of the best configuration against the number of
workers, one line per other cluster setting (bandwidth, latency), each point
labelled with its choice (ako p, s or the baseline).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from akocore.results import RecordError
from akocore.schemes.registry import is_partitioned
from akosim.sweep_summary import BestRow, best_per_group, format_summary, read_rows


def plot(best: list[BestRow], path: Path) -> Path | None:
    """The best samples/s per group against workers; None without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines: dict[str, list[tuple[float, float, str]]] = {}
    for row in best:
        values = dict(row.group)
        x = float(values.get("workers", "nan") or "nan")
        name = ", ".join(f"{k} {v}" for k, v in row.group if k != "workers") or "all"
        label = f"p={row.p}" if is_partitioned(row.scheme) else row.scheme
        lines.setdefault(name, []).append((x, row.samples_per_s, label))
    figure, axes = plt.subplots(figsize=(7, 4.5))
    for name, points in lines.items():
        points.sort()
        xs = [p[0] for p in points]
        ys = [p[1] for p in points]
        axes.plot(xs, ys, marker="o", label=name)
        for x, y, text in points:
            if math.isfinite(x):
                axes.annotate(text, (x, y), textcoords="offset points", xytext=(4, 4),
                              fontsize=7)
    axes.set_xlabel("workers")
    axes.set_ylabel("samples/s (best configuration)")
    axes.set_xscale("log", base=2)
    axes.set_yscale("log")
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=8)
    axes.set_title("akosim sweep: best configuration per cluster")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis sweep", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path, metavar="DIR", help="an akosim sweep --out folder")
    parser.add_argument("--out", type=Path, metavar="FILE.png",
                        help="where to write the plot (default DIR/sweep.png)")
    args = parser.parse_args(argv)
    try:
        rows = read_rows(args.folder)
    except RecordError as error:
        print(f"{parser.prog}: error: {error}; run akosim sweep --out {args.folder} first",
              file=sys.stderr)
        return 2
    best = best_per_group(rows)
    print(format_summary(best))
    written = plot(best, args.out or args.folder / "sweep.png") if best else None
    if written is not None:
        print(f"wrote {written}")
    return 0
