"""Reading a result from where it is: a path (a file, or a run directory's result.json) or
a parsed JSON object, into its typed record (akocore.records.results).

The one place in akocore that opens a result file, kept apart so akocore.records.results stays
free of I/O.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from akocore.records.calibration import Calibration
from akocore.records.legacy_reading import record_of
from akocore.records.results import PlanResult, RankResult, RecordError, RunResult


def read_result(source: Any) -> PlanResult | RunResult | RankResult | Calibration:
    """The record of a result: `source` is a parsed JSON object or the path of a result file
    (a directory means its ``result.json``). RecordError says what is wrong with it::

        import akocore
        run = akocore.read_result("runs/mine")        # runs/mine/result.json
        print(run.accuracy, run.round_time_s)
        plan = akocore.read_result("plan.json")       # akosim --out plan.json
        print([r.label for r in plan.runs])

    Result files keep the name ``final_accuracy``; `RunResult.accuracy` and
    `RankResult.accuracy` read it.
    """
    if isinstance(source, (str, os.PathLike)):
        source = _load_json(Path(source))
    return record_of(source)


def _load_json(path: Path) -> Any:
    if path.is_dir():
        path = path / "result.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise RecordError(f"{path}: no such result file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise RecordError(f"{path}: not a readable JSON result ({error})") from None
