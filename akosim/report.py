"""Human tables and result files for simulated runs.

`format_table` prints the side-by-side comparison a user reads first;
`write_json` writes the full result (config echoed, one entry per simulated
configuration in `runs`, per-worker and per-link breakdowns) atomically, so
an interrupted run never leaves half a file.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

from akocore.units import format_duration, format_size
from akosim.scenario import SimRun


def _stale(value: float) -> str:
    return "inf" if math.isinf(value) else f"{value:g}"


def format_table(runs: list[SimRun], *, training: bool = False) -> str:
    headers = ["configuration", "round time", "samples/s", "sent/worker/round", "NIC use",
               "staleness", "bottleneck"]
    if training:
        headers[1:1] = ["time to target", "final acc"]
    rows = []
    for run in runs:
        row = [run.label, format_duration(run.round_time_s), f"{run.samples_per_s:,.1f}",
               format_size(run.bytes_sent_per_worker_per_round),
               f"{100 * run.nic_utilisation:.0f}%",
               f"<= {_stale(run.staleness_bound_rounds)} rounds", run.bottleneck]
        if training:
            ttt = "not reached" if run.time_to_target_s is None else format_duration(
                run.time_to_target_s)
            acc = "-" if run.final_accuracy is None else f"{100 * run.final_accuracy:.1f}%"
            row[1:1] = [ttt, acc]
        rows.append(row)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)


def explain_p(run: SimRun) -> str:
    if run.scheme != "ako" or not run.p_reason or run.p_reason == "given":
        return ""
    return f"p={run.p} for {run.label.split(' (')[0]}: bound by {run.p_reason}"


def write_json(path: str | Path, payload: dict[str, Any]) -> None:
    """Write JSON atomically (temp file in the same folder, then rename)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(payload, handle, indent=1, default=_default, allow_nan=False)
            handle.write("\n")
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _default(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


def json_safe(value: Any) -> Any:
    """Replace inf/nan (not JSON) by strings, recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return "inf" if value > 0 else ("-inf" if value < 0 else "nan")
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value
