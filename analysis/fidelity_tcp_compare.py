"""Two fidelity-on-real-TCP records side by side, by group: what a model change did.

    python -m analysis.fidelity_tcp_compare BEFORE.json AFTER.json [LABEL=MORE.json ...]

Each argument is a `FidelityTcpRecord` (``fidelity-tcp.json``, written by
analysis.fidelity_tcp) over the same runs, for example the grid before a change
and the same runs predicted again with ``--repredict`` after it. Prints one
markdown table: for every group of scheme, p and s (and all runs), each
record's MAPE and Kendall's tau in each prediction column. Nothing is fitted
here; it only reads the records.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from analysis.fidelity_tcp_record import COLUMNS, FidelityTcpRecord, FidelityTcpRow, summarise
from analysis.fidelity_tcp_report import GROUPINGS

GROUP_KEY = GROUPINGS["scheme/p/s"]


def read_record(path: Path) -> FidelityTcpRecord:
    return FidelityTcpRecord.from_json(json.loads(path.read_text(encoding="utf-8")))


def _cell(rows: list[FidelityTcpRow], column: str) -> str:
    summary = summarise(rows, column)
    tau = "-" if not math.isfinite(summary.kendall_tau) else f"{summary.kendall_tau:.2f}"
    return f"{100 * summary.mape:.1f}% / {tau}"


def comparison_table(records: list[tuple[str, FidelityTcpRecord]]) -> str:
    """MAPE / tau per group (rows) and per record and column (columns)."""
    head = " | ".join(f"{label}: {column}" for label, _ in records for column in COLUMNS)
    lines = [f"| group | n | {head} |",
             "|---|---|" + "---|" * (len(records) * len(COLUMNS))]
    names = sorted({GROUP_KEY(r) for _, record in records for r in record.rows})
    for group in ["all", *names]:
        cells, sizes = [], set()
        for _, record in records:
            rows = [r for r in record.rows if group == "all" or GROUP_KEY(r) == group]
            sizes.add(len(rows))
            cells += [_cell(rows, column) if rows else "-" for column in COLUMNS]
        size = "/".join(str(n) for n in sorted(sizes))
        lines.append(f"| {group} | {size} | {' | '.join(cells)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.fidelity_tcp_compare",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("records", nargs="+", metavar="[LABEL=]RECORD.json",
                        help="fidelity-tcp.json records over the same runs, in order")
    args = parser.parse_args(argv)
    records = []
    for index, text in enumerate(args.records):
        label, _, path = text.rpartition("=") if "=" in text else (f"#{index + 1}", "", text)
        try:
            records.append((label, read_record(Path(path))))
        except (OSError, ValueError) as error:
            print(f"fidelity_tcp_compare: {path}: {error}")
            return 2
    print(comparison_table(records))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
