"""python -m analysis sweep DIR: the summary of an `akosim sweep` folder, plotted.

Reads the sweep's records (DIR/sweep.json), prints the best configuration of each
group (the table `akosim sweep` prints, akosim.sweeping.sweep_summary) and writes
DIR/sweep.png (needs the optional extra 'plot', matplotlib; without it the
command names the extra and exits 2, unless --no-plot): two panels against the
number of workers, one line per other cluster setting (bandwidth, latency):
samples/s of the best configuration, and the staleness bound of that
configuration, each of its points labelled with the choice (ako p and s, or
the baseline; one dark label where coinciding lines chose the same). Lines that
coincide are told apart by marker, dash and a small sideways shift; labels are
stacked so that none covers another.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from akocore.cli_support import OneLineParser
from akocore.extras import MissingExtra, require
from akocore.records.results import RecordError
from akocore.schemes.registry import is_partitioned
from akosim.sweeping.sweep_summary import BestRow, best_per_group, format_summary, read_rows

MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
DASHES = ("-", "--", "-.", ":")
LABEL_GAP_PX = 1.0  # vertical room between two stacked labels


@dataclass(frozen=True)
class Box:
    """A label's box in display pixels: lower-left corner, width, height."""

    x: float
    y: float
    width: float
    height: float

    def overlaps(self, other: Box) -> bool:
        return (self.x < other.x + other.width and other.x < self.x + self.width
                and self.y < other.y + other.height and other.y < self.y + self.height)


def stack_labels(boxes: Sequence[Box]) -> list[float]:
    """The downward shift (pixels, >= 0) of each box so that no two overlap: boxes are
    placed from the top of the page down, each moved down just past any placed box it
    would cover. Pure; the plot measures the boxes and applies the shifts."""
    order = sorted(range(len(boxes)), key=lambda i: (-boxes[i].y, boxes[i].x))
    placed: list[Box] = []
    shifts = [0.0] * len(boxes)
    for i in order:
        box = boxes[i]
        moved = True
        while moved:
            moved = False
            for other in placed:
                if box.overlaps(other):
                    box = Box(box.x, other.y - box.height - LABEL_GAP_PX, box.width,
                              box.height)
                    moved = True
        shifts[i] = boxes[i].y - box.y
        placed.append(box)
    return shifts


def choice_label(row: BestRow) -> str:
    """What the best configuration chose: ``p=4 s=2`` for a partitioned scheme, else the scheme."""
    if not is_partitioned(row.scheme):
        return row.scheme
    ssp = "inf" if math.isinf(row.ssp) else f"{row.ssp:g}"
    return f"p={row.p} s={ssp}"


@dataclass(frozen=True)
class Line:
    """One cluster setting's best configurations, in order of workers."""

    name: str
    workers: tuple[float, ...]
    samples_per_s: tuple[float, ...]
    staleness_rounds: tuple[float, ...]
    labels: tuple[str, ...]


def lines_of(best: Sequence[BestRow]) -> list[Line]:
    """The rows grouped by every grid value but workers, each sorted by workers."""
    grouped: dict[str, list[BestRow]] = {}
    for row in best:
        name = ", ".join(f"{k} {v}" for k, v in row.group if k != "workers") or "all"
        grouped.setdefault(name, []).append(row)
    lines = []
    for name, rows in grouped.items():
        rows.sort(key=lambda r: float(dict(r.group).get("workers", "nan") or "nan"))
        lines.append(Line(
            name=name,
            workers=tuple(float(dict(r.group).get("workers", "nan") or "nan") for r in rows),
            samples_per_s=tuple(r.samples_per_s for r in rows),
            staleness_rounds=tuple(r.staleness_bound_rounds for r in rows),
            labels=tuple(choice_label(r) for r in rows)))
    return lines


def plot(best: list[BestRow], path: Path) -> Path:
    """Samples/s and staleness bound of the best configuration per group against
    workers; MissingExtra (exit 2, naming the extra) without matplotlib."""
    matplotlib = require("matplotlib", "plot", "the sweep plot")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    lines = lines_of(best)
    figure, (speed, stale) = plt.subplots(1, 2, figsize=(12, 5), sharex=True)
    spread = 0.035 * (len(lines) - 1)  # sideways shift, in log2 units of workers
    finite_stale = [s for line in lines for s in line.staleness_rounds if math.isfinite(s)]
    top = max(finite_stale, default=1.0) * 2 + 1
    labels: dict[tuple[float, float, str], list[tuple[float, str]]] = {}
    for i, line in enumerate(lines):
        dodge = 2 ** (-spread / 2 + 0.035 * i) if len(lines) > 1 else 1.0
        xs = [x * dodge for x in line.workers]
        style = {"marker": MARKERS[i % len(MARKERS)], "linestyle": DASHES[i % len(DASHES)],
                 "markersize": 6, "linewidth": 1.4, "alpha": 0.9}
        drawn = speed.plot(xs, line.samples_per_s, label=line.name, **style)[0]
        ys = [s if math.isfinite(s) else top for s in line.staleness_rounds]
        stale.plot(xs, ys, color=drawn.get_color(), label=line.name, **style)
        for x, dodged, y, text in zip(line.workers, xs, ys, line.labels, strict=True):
            if math.isfinite(x):  # coincident points with one choice: one label
                labels.setdefault((x, y, text), []).append((dodged, drawn.get_color()))
    labelled = []
    for (_, y, text), where in labels.items():
        colour = where[0][1] if len(where) == 1 else "0.2"
        labelled.append(stale.annotate(text, (max(x for x, _ in where), y),
                                       textcoords="offset points", xytext=(6, -9),
                                       fontsize=7, color=colour))
    speed.set_ylabel("samples/s of the best configuration")
    stale.set_ylabel("its staleness bound (rounds; top edge: unbounded)")
    stale.set_yscale("symlog", linthresh=1.0)
    plain = ticker.FuncFormatter(lambda value, _: f"{value:g}")
    if len(set(finite_stale)) <= 8:  # few bounds: tick each of them
        stale.set_yticks(sorted(set(finite_stale)))
    stale.yaxis.set_major_formatter(plain)
    finite_x = [x for line in lines for x in line.workers if math.isfinite(x)]
    if finite_x:  # room on the right for the last points' labels
        speed.set_xlim(min(finite_x) / 1.25, max(finite_x) * 1.5)
    for axes in (speed, stale):
        axes.set_xlabel("workers")
        axes.set_xscale("log", base=2)
        axes.xaxis.set_major_formatter(plain)
        axes.grid(True, alpha=0.3)
    speed.set_yscale("log")
    speed.legend(fontsize=8, title="cluster (lines may coincide)", title_fontsize=8)
    speed.set_title("throughput")
    stale.set_title("staleness bound, labelled with the choice")
    figure.suptitle("akosim sweep: the best configuration of each cluster")
    figure.tight_layout()
    _unstack(figure, labelled)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def _unstack(figure: object, labels: list) -> None:  # type: ignore[type-arg]
    """Move the labels down (stack_labels) so that none covers another."""
    if not labels:
        return
    renderer = figure.canvas.get_renderer()  # type: ignore[attr-defined]
    extents = [label.get_window_extent(renderer) for label in labels]
    boxes = [Box(e.x0, e.y0, e.width, e.height) for e in extents]
    dpi_scale = figure.dpi / 72.0  # type: ignore[attr-defined]
    for label, shift in zip(labels, stack_labels(boxes), strict=True):
        if shift:
            x, y = label.xyann
            label.xyann = (x, y - shift / dpi_scale)


def build_parser() -> OneLineParser:
    parser = OneLineParser(prog="python -m analysis sweep", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path, metavar="DIR", help="an akosim sweep --out folder")
    parser.add_argument("--out", type=Path, metavar="FILE.png",
                        help="where to write the plot (default DIR/sweep.png)")
    parser.add_argument("--no-plot", action="store_true",
                        help="print the table only (no matplotlib needed)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        rows = read_rows(args.folder)
    except RecordError as error:
        print(f"{parser.prog}: error: {error}; run akosim sweep --out {args.folder} first",
              file=sys.stderr)
        return 2
    best = best_per_group(rows)
    print(format_summary(best))
    if args.no_plot or not best:
        return 0
    try:
        written = plot(best, args.out or args.folder / "sweep.png")
    except MissingExtra as error:
        print(f"{parser.prog}: error: {error} (or pass --no-plot)", file=sys.stderr)
        return 2
    print(f"wrote {written}")
    return 0
