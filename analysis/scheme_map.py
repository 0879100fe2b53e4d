"""Which scheme wins where: a bandwidth x latency map of akosim's schemes, and a small
time-to-accuracy check.

For each cell of a bandwidth x latency grid (8 workers, the seeds' 17 MB gradient, a
fixed 0.3 s compute per step) every configuration (Ako with p chosen and p=1, a
parameter server, ring all-reduce, WAGMA, DiLoCo H=10, Streaming DiLoCo H=10 P=2 tau=1,
each with codec none and int8, and top-k 1 % for Ako and DiLoCo) is simulated through
akosim's public API (`akosim.simulate`, timing only). The winner of a cell is the
highest throughput (samples/s) among the configurations whose staleness bound is
within 64 rounds (the plan's ``--max-staleness`` rule). Then `akosim.train` trains the
built-in digits workload on a few cells to see which scheme reaches 0.9 accuracy first.

Run: ``python -m analysis.scheme_map --out analysis/data --docs docs/reports
--discussion analysis/data/scheme_map_discussion.md [--quick]`` (the discussion is
written by hand from the numbers, so regenerate it when they change).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

BANDWIDTHS = ("10mbps", "40mbps", "100mbps", "1gbps", "10gbps")
LATENCIES = ("0.1ms", "1ms", "10ms", "30ms", "100ms")  # one-way, per message
WORKERS = 8
GRADIENT_SIZE = "17MB"
COMPUTE = "0.3s"
MAX_STALENESS_ROUNDS = 64.0

# (name, the keyword settings of akosim.simulate / akosim.train)
SCHEMES: tuple[tuple[str, dict[str, Any]], ...] = (
    ("ako p=auto", {"scheme": "ako", "p": "auto"}),
    ("ako p=1", {"scheme": "ako", "p": 1}),
    ("ps", {"scheme": "ps"}),
    ("allreduce", {"scheme": "allreduce"}),
    ("wagma", {"scheme": "wagma"}),
    ("diloco H=10", {"scheme": "diloco", "inner_steps": 10}),
    ("streaming-diloco H=10 P=2 tau=1",
     {"scheme": "streaming-diloco", "inner_steps": 10, "fragments": 2, "overlap_steps": 1}),
)
CODECS = ("none", "int8")
TOPK_SCHEMES = ("ako p=auto", "diloco H=10")  # also run with codec topk:0.01
TOPK = "topk:0.01"

QUICK_BANDWIDTHS = ("10mbps", "1gbps")
QUICK_LATENCIES = ("1ms", "30ms")
QUICK_SCHEMES = ("ako p=auto", "allreduce")

TRAIN_CELLS = (("10mbps", "10ms"), ("1gbps", "10ms"))
TRAIN_SCHEMES = ("ako p=auto", "diloco H=10", "allreduce")
TRAIN_WORKLOAD = "digits-mlp"
TRAIN_HIDDEN = (32, 2048)  # the MLP's hidden width: its default, and a 19x larger gradient
TARGET_ACCURACY = 0.9
TRAIN_BUDGET_S = 300.0  # simulated seconds of training per run


@dataclass(frozen=True)
class ConfigRow:
    """One configuration simulated in one cell."""

    scheme: str
    codec: str
    label: str
    samples_per_s: float
    staleness_bound_rounds: float
    bytes_sent_per_worker_per_round: float
    round_time_s: float
    eligible: bool  # staleness bound within the limit


@dataclass(frozen=True)
class Cell:
    """One bandwidth x latency cell: every configuration and the winner."""

    bandwidth: str
    latency: str
    rows: tuple[ConfigRow, ...]
    winner: str | None  # "scheme / codec" of the winner (None: no configuration eligible)
    winner_samples_per_s: float | None
    margin_over_runner_up: float | None  # winner / runner-up throughput - 1
    runner_up: str | None
    best_ako: str | None  # Ako's best eligible configuration
    best_ako_samples_per_s: float | None
    best_other: str | None  # the best eligible configuration that is not Ako
    best_other_samples_per_s: float | None


@dataclass(frozen=True)
class TrainRow:
    """One simulated training run of the time-to-accuracy check."""

    bandwidth: str
    latency: str
    hidden: int
    scheme: str
    label: str
    time_to_target_s: float | None
    final_accuracy: float | None
    simulated_s: float | None
    bytes_sent_per_worker_per_round: float | None
    bytes_to_target_per_worker: float | None  # bytes per round x rounds to target
    rounds_to_target: int | None


@dataclass
class SchemeMap:
    """The record: the grid, its settings, the winners and the training check."""

    workers: int
    gradient_size: str
    compute: str
    max_staleness_rounds: float
    bandwidths: tuple[str, ...]
    latencies: tuple[str, ...]
    cells: list[Cell] = field(default_factory=list)
    training: list[TrainRow] = field(default_factory=list)
    generated_utc: str = ""  # when it ran
    machine: str = ""  # where it ran (the training check's CPU time; the timing is simulated)


def configurations(schemes: Sequence[str]) -> list[tuple[str, str, dict[str, Any]]]:
    """(scheme name, codec, settings) of every configuration of the named schemes."""
    by_name = dict(SCHEMES)
    out: list[tuple[str, str, dict[str, Any]]] = []
    for name in schemes:
        codecs = CODECS + ((TOPK,) if name in TOPK_SCHEMES else ())
        out.extend((name, codec, {**by_name[name], "codec": codec}) for codec in codecs)
    return out


def pick_winner(rows: Sequence[ConfigRow]) -> tuple[ConfigRow | None, ConfigRow | None]:
    """The winner and runner-up: highest samples/s among the rows within the staleness
    limit (ties: the earlier row)."""
    eligible = sorted((r for r in rows if r.eligible), key=lambda r: -r.samples_per_s)
    return (eligible[0] if eligible else None, eligible[1] if len(eligible) > 1 else None)


def _name(row: ConfigRow | None) -> str | None:
    return None if row is None else f"{row.scheme} / {row.codec}"


def simulate_cell(bandwidth: str, latency: str, schemes: Sequence[str], *,
                  max_staleness_rounds: float = MAX_STALENESS_ROUNDS) -> Cell:
    """Every configuration of `schemes` in one cell, and its winner."""
    import akosim

    rows = []
    for name, codec, settings in configurations(schemes):
        run = akosim.simulate(workers=WORKERS, bandwidth=bandwidth, latency=latency,
                              compute=COMPUTE, gradient_size=GRADIENT_SIZE, quiet=True,
                              **settings)
        bound = float(run.staleness_bound_rounds or 0.0)
        rows.append(ConfigRow(
            scheme=name, codec=codec, label=run.label,
            samples_per_s=float(run.samples_per_s or 0.0), staleness_bound_rounds=bound,
            bytes_sent_per_worker_per_round=float(run.bytes_sent_per_worker_per_round or 0.0),
            round_time_s=float(run.round_time_s or 0.0),
            eligible=bound <= max_staleness_rounds))
    winner, runner_up = pick_winner(rows)
    ako = pick_winner([r for r in rows if r.scheme.startswith("ako")])[0]
    other = pick_winner([r for r in rows if not r.scheme.startswith("ako")])[0]
    margin = (winner.samples_per_s / runner_up.samples_per_s - 1.0
              if winner and runner_up and runner_up.samples_per_s > 0 else None)
    return Cell(bandwidth=bandwidth, latency=latency, rows=tuple(rows),
                winner=_name(winner),
                winner_samples_per_s=winner.samples_per_s if winner else None,
                margin_over_runner_up=margin, runner_up=_name(runner_up),
                best_ako=_name(ako), best_ako_samples_per_s=ako.samples_per_s if ako else None,
                best_other=_name(other),
                best_other_samples_per_s=other.samples_per_s if other else None)


def train_check(cells: Sequence[tuple[str, str]], schemes: Sequence[str], *,
                budget_s: float = TRAIN_BUDGET_S,
                hidden_widths: Sequence[int] = TRAIN_HIDDEN) -> list[TrainRow]:
    """`akosim.train` of the digits workload per cell, MLP width and scheme (codec none),
    for `budget_s` simulated seconds; the time to target is the first evaluation at or
    above it (the run does not stop there, so the accuracy is the one after the budget)."""
    import akosim

    by_name = dict(SCHEMES)
    out = []
    for bandwidth, latency in cells:
        for hidden in hidden_widths:
            for name in schemes:
                run = akosim.train(workers=WORKERS, bandwidth=bandwidth, latency=latency,
                                   compute=COMPUTE, workload=TRAIN_WORKLOAD,
                                   workload_args={"hidden": hidden},
                                   duration=f"{budget_s:g}s", eval_every=10, quiet=True,
                                   **by_name[name])
                reached = next((e for e in run.evaluations if e[2] >= TARGET_ACCURACY), None)
                per_round = run.bytes_sent_per_worker_per_round
                out.append(TrainRow(
                    bandwidth=bandwidth, latency=latency, hidden=hidden, scheme=name,
                    label=run.label,
                    time_to_target_s=float(reached[0]) if reached else None,
                    final_accuracy=run.final_accuracy, simulated_s=run.simulated_s,
                    bytes_sent_per_worker_per_round=per_round,
                    bytes_to_target_per_worker=(per_round * reached[1]
                                                if per_round is not None and reached else None),
                    rounds_to_target=int(reached[1]) if reached else None))
    return out


def scheme_map(*, quick: bool = False, train: bool = True) -> SchemeMap:
    """The whole record; `quick`: a 2x2 grid of two schemes and no training check."""
    bandwidths = QUICK_BANDWIDTHS if quick else BANDWIDTHS
    latencies = QUICK_LATENCIES if quick else LATENCIES
    schemes = QUICK_SCHEMES if quick else tuple(name for name, _ in SCHEMES)
    record = SchemeMap(workers=WORKERS, gradient_size=GRADIENT_SIZE, compute=COMPUTE,
                       max_staleness_rounds=MAX_STALENESS_ROUNDS,
                       bandwidths=bandwidths, latencies=latencies,
                       generated_utc=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
                       machine=f"{platform.system()} {platform.machine()}, "
                               f"{os.cpu_count()} cores, Python {platform.python_version()}")
    for bandwidth in bandwidths:
        for latency in latencies:
            record.cells.append(simulate_cell(bandwidth, latency, schemes))
    if train and not quick:
        record.training = train_check(TRAIN_CELLS, TRAIN_SCHEMES)
    return record


# ------------------------------------------------------------------ writing


def bytes_text(value: float | None) -> str:
    """A byte count for a table cell, three significant digits: 463000 -> "463 kB"
    (the time-to-target report's tables too)."""
    if value is None:
        return "-"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if value >= size:
            return f"{value / size:.3g} {unit}"
    return f"{value:.0f} B"


def _fmt(value: float | None, spec: str = ".3g") -> str:
    return "-" if value is None else format(value, spec)


def write_png(record: SchemeMap, path: Path) -> None:
    """Two heat maps: the winner per cell, and the best configuration that is not Ako,
    each cell coloured by its scheme and labelled with its codec and samples/s."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    schemes = [name for name, _ in SCHEMES]
    cells = {(c.bandwidth, c.latency): c for c in record.cells}
    panels = (("winner", "winner_samples_per_s", "Winner"),
              ("best_other", "best_other_samples_per_s", "Best without Ako"))
    fig, axes = plt.subplots(1, 2, figsize=(2.6 * len(record.latencies) + 2.0,
                                            0.9 * len(record.bandwidths) + 1.6))
    for ax, (name_key, rate_key, title) in zip(axes, panels, strict=True):
        grid = np.full((len(record.bandwidths), len(record.latencies)), np.nan)
        for i, bandwidth in enumerate(record.bandwidths):
            for j, latency in enumerate(record.latencies):
                cell = cells[(bandwidth, latency)]
                name = getattr(cell, name_key)
                if name is None:
                    continue
                scheme, codec = name.split(" / ")
                grid[i, j] = schemes.index(scheme)
                short = scheme.replace("streaming-diloco", "s-diloco").split(" P=")[0]
                ax.text(j, i, f"{short}\n{codec}\n{getattr(cell, rate_key):.0f}/s",
                        ha="center", va="center", fontsize=6)
        ax.imshow(grid, cmap="Set3", vmin=0, vmax=11, aspect="auto")
        ax.set_xticks(range(len(record.latencies)), record.latencies)
        ax.set_yticks(range(len(record.bandwidths)), record.bandwidths)
        ax.set_xlabel("one-way latency")
        ax.set_ylabel("bandwidth per NIC")
        ax.set_title(title, fontsize=9)
    fig.suptitle(f"Highest samples/s with staleness <= {record.max_staleness_rounds:g} rounds: "
                 f"{record.workers} workers, {record.gradient_size} gradient, compute "
                 f"{record.compute}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown(record: SchemeMap, png_name: str, discussion: str = "") -> str:
    """The report page."""
    lines = [
        "# Which scheme wins where",
        "",
        f"akosim's timing model over a bandwidth x latency grid: {record.workers} workers, "
        f"the seeds' {record.gradient_size} gradient, a fixed compute time of "
        f"{record.compute} per step. Each cell simulates every configuration: Ako with p "
        "chosen (`p=auto`) and p=1, a parameter server, ring all-reduce, WAGMA, DiLoCo "
        "(H=10) and Streaming DiLoCo (H=10, P=2, tau=1), each with `--codec none` and "
        "`int8`, and `topk:0.01` for Ako p=auto and DiLoCo.",
        "",
        f"Generated {record.generated_utc} on {record.machine} (the timing is simulated, "
        "so the machine matters only for the time the run takes, about 90 s here).",
        "",
        "**The winner rule** (the plan's): the highest throughput (samples/s) among the "
        "configurations whose staleness bound is within "
        f"{record.max_staleness_rounds:g} rounds (`--max-staleness`). The margin is the "
        "winner's throughput over the runner-up's, minus one. Throughput alone does not say "
        "which reaches an accuracy first: see the training check below.",
        "",
        "Regenerate with `python -m analysis.scheme_map --out analysis/data --docs "
        "docs/reports --discussion analysis/data/scheme_map_discussion.md` (the record is "
        "`analysis/data/scheme_map.json`; the discussion is written from its numbers).",
        "",
        f"![winner per cell, and the best without Ako]({png_name})",
        "",
        "| bandwidth | latency | winner | samples/s | margin over runner-up | runner-up "
        "| Ako's best | Ako samples/s | best other | its samples/s |",
        "|---|---|---|---:|---:|---|---|---:|---|---:|",
    ]
    for c in record.cells:
        margin = c.margin_over_runner_up
        lines.append(
            f"| {c.bandwidth} | {c.latency} | {c.winner or '-'} | "
            f"{_fmt(c.winner_samples_per_s, '.0f')} | "
            f"{'-' if margin is None else f'{100 * margin:.1f} %'}"
            f" | {c.runner_up or '-'} | {c.best_ako or '-'} | "
            f"{_fmt(c.best_ako_samples_per_s, '.0f')} | {c.best_other or '-'} | "
            f"{_fmt(c.best_other_samples_per_s, '.0f')} |")
    lines += ["", "## Every configuration in two corners of the grid", ""]
    corners = [record.cells[0], record.cells[-1]]
    for c in corners:
        lines += [f"### {c.bandwidth}, {c.latency}", "",
                  "| configuration | codec | samples/s | staleness bound (rounds) | "
                  "bytes per worker per round | within the limit |",
                  "|---|---|---:|---:|---:|---|"]
        lines += [f"| {r.label} | {r.codec} | {r.samples_per_s:.0f} | "
                  f"{r.staleness_bound_rounds:g} | {bytes_text(r.bytes_sent_per_worker_per_round)}"
                  f" | {'yes' if r.eligible else 'no'} |" for r in c.rows]
        lines.append("")
    if record.training:
        lines += [
            "## Time to accuracy (akosim train, digits)",
            "",
            f"`akosim train` on the built-in `{TRAIN_WORKLOAD}` workload, the same "
            f"{record.workers} workers and {record.compute} compute, target accuracy "
            f"{TARGET_ACCURACY:g}, a budget of {TRAIN_BUDGET_S:g} simulated seconds, "
            "codec none, evaluated every 10 rounds; the MLP's hidden width is its default "
            "(32) or 2048 (a larger gradient, so the network matters more). Bytes to "
            "target = bytes per worker per round x rounds until the first evaluation at "
            "or above the target.",
            "",
            "| bandwidth | latency | hidden | scheme | time to target (s) | accuracy after budget "
            "| rounds to target | bytes per worker per round | bytes to target |",
            "|---|---|---:|---|---:|---:|---:|---:|---:|",
        ]
        lines += [f"| {t.bandwidth} | {t.latency} | {t.hidden} | {t.label} | "
                  f"{_fmt(t.time_to_target_s, '.1f')} | {_fmt(t.final_accuracy, '.3f')} | "
                  f"{t.rounds_to_target if t.rounds_to_target is not None else '-'} | "
                  f"{bytes_text(t.bytes_sent_per_worker_per_round)} | "
                  f"{bytes_text(t.bytes_to_target_per_worker)} |" for t in record.training]
        lines.append("")
    if discussion:
        lines += [discussion.strip(), ""]
    return "\n".join(lines)


def to_json(record: SchemeMap) -> dict[str, Any]:
    return asdict(record)


def write_outputs(record: SchemeMap, out_dir: Path, docs_dir: Path,
                  discussion: str = "") -> dict[str, Path]:
    """scheme_map.json under `out_dir`; scheme-map.md and scheme-map.png under `docs_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    docs_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "scheme_map.json", "png": docs_dir / "scheme-map.png",
             "md": docs_dir / "scheme-map.md"}
    paths["json"].write_text(json.dumps(to_json(record), indent=1) + "\n", encoding="utf-8")
    write_png(record, paths["png"])
    paths["md"].write_text(markdown(record, paths["png"].name, discussion), encoding="utf-8")
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.scheme_map",
                                     description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--out", required=True, help="directory of scheme_map.json")
    parser.add_argument("--docs", help="directory of scheme-map.md and .png (default --out)")
    parser.add_argument("--quick", action="store_true",
                        help="a 2x2 grid of two schemes, no training check")
    parser.add_argument("--no-train", action="store_true", help="skip the training check")
    parser.add_argument("--discussion", help="a Markdown file appended to the page")
    args = parser.parse_args(argv)
    discussion = ""
    if args.discussion:
        try:
            discussion = Path(args.discussion).read_text(encoding="utf-8")
        except OSError as error:
            print(f"--discussion: cannot read {args.discussion}: {error.strerror}",
                  file=sys.stderr)
            return 2
    record = scheme_map(quick=args.quick, train=not args.no_train)
    paths = write_outputs(record, Path(args.out), Path(args.docs or args.out), discussion)
    for path in paths.values():
        print(path)
    return 0


def cells_by_key(record: Mapping[str, Any]) -> dict[tuple[str, str], Mapping[str, Any]]:
    """The JSON record's cells by (bandwidth, latency)."""
    return {(c["bandwidth"], c["latency"]): c for c in record["cells"]}


if __name__ == "__main__":
    sys.exit(main())
