"""Records -> accuracy-against-time plots, one PNG per network (needs matplotlib).

`plot_networks` imports matplotlib when called, so the rest of the report
works without it (build_report catches the ImportError and says so); the
error it raises (akocore.extras.MissingExtra) names the extra that installs it.
"""

from __future__ import annotations

from pathlib import Path

from akocore.extras import require
from analysis.matrix import (
    ALL_SCHEMES,
    NETWORKS,
    SCALING,
    SCHEME_TITLES,
    SCHEMES,
    TARGET_ACCURACY,
    WORKER_COUNTS,
)
from analysis.records import Record

STYLES = {"akosim": "-", "akorun": "--", "akosim-calibrated": ":"}
COLOURS = {"ps": "tab:red", "ako-p1": "tab:blue", "ako-various": "tab:orange",
           "ako-p4": "tab:green", "ako-pauto": "tab:purple", "wagma": "tab:brown",
           "hogwild": "tab:pink", "downpour": "tab:olive", "adag": "tab:cyan",
           "sdag": "tab:gray", "sync-sgd": "black"}


def plot_networks(records: dict[tuple[str, str], Record], out: Path, *,
                  schemes: tuple[str, ...] = SCHEMES, prefix: str = "accuracy") -> list[Path]:
    """One PNG per network, OUT/<prefix>-<network>.png: accuracy against time of the
    `schemes` columns, a panel per worker count."""
    matplotlib = require("matplotlib", "plot", "the accuracy plots")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for net in NETWORKS:
        mine = [r for r in records.values()
                if r.network == net.name and r.backend in STYLES and r.curve
                and r.scheme in schemes]
        if not mine:
            continue
        fig, axes = plt.subplots(1, len(WORKER_COUNTS), figsize=(15, 4.5), sharey=True)
        for ax, n in zip(axes, WORKER_COUNTS, strict=True):
            for record in sorted(mine, key=lambda r: (r.backend, ALL_SCHEMES.index(r.scheme))):
                if record.workers != n:
                    continue
                ts = [t for t, _, _ in record.curve]
                accs = [a for _, _, a in record.curve]
                ax.plot(ts, accs, STYLES[record.backend], color=COLOURS[record.scheme],
                        label=f"{SCHEME_TITLES[record.scheme]} ({record.backend})", lw=1.3)
            ax.axhline(TARGET_ACCURACY, color="grey", lw=0.8)
            ax.axvline(SCALING.budget_s, color="grey", lw=0.8, ls="-.")
            ax.set_title(f"{net.title}, {n} workers")
            ax.set_xlabel("training time (s, scaled)")
            ax.set_xlim(0, SCALING.budget_s * 1.02)
            ax.set_ylim(0.5, 1.0)
            ax.grid(alpha=0.3)
        axes[0].set_ylabel("test accuracy (first worker's replica)")
        handles, labels = [], []
        for ax in axes:
            for h, label in zip(*ax.get_legend_handles_labels(), strict=True):
                if label not in labels:
                    handles.append(h)
                    labels.append(label)
        fig.legend(handles, labels, loc="lower center", ncol=5, fontsize=8)
        fig.tight_layout(rect=(0, 0.14, 1, 1))
        path = out / f"{prefix}-{net.name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written
