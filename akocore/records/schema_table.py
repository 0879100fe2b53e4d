"""docs/reference/result-schema.md, generated from the records' field metadata.

One table per record (unit, meaning, writer of every key); tests/test_result_schema.py
checks the committed page against `schema_markdown`.
"""

from __future__ import annotations

from akocore.records.calibration import Calibration, ComputeMeasurement, RankCalibration
from akocore.records.jsonrecord import schema_rows
from akocore.records.message_cost import MessageCost, MessageSample
from akocore.records.results import (
    SCHEMA_VERSION,
    LinkResult,
    PlanResult,
    RankedRun,
    RankResult,
    RunResult,
)


def schema_markdown() -> str:
    """docs/reference/result-schema.md: one table per record, one row per key."""
    out = ["# Result schema (generated from akocore/records/schema_table.py; "
           "tests/test_result_schema.py checks it)", "",
           f"Every record's JSON carries `schema_version` ({SCHEMA_VERSION}; version 1 files, "
           "which lack the plan's ranking, are read too) and `kind` "
           "(`plan`, `run`, `rank`, `calibration`, `compute`). Files without `schema_version` were "
           "written before the schema and are converted when read. Non-finite numbers are "
           'written as "inf" / "-inf"; a figure that could not be measured is null.', ""]
    for cls, title in ((PlanResult, "`akosim --out FILE.json` (kind `plan`)"),
                       (RankedRun, "one candidate of a plan's `ranking` (akosim plan's "
                                   "default ranking, --target-accuracy or --time-budget)"),
                       (RunResult, "one run (kind `run`): akorun's `OUT/result.json`, "
                                   "each of akosim's `runs`"),
                       (RankResult, "one rank (kind `rank`): akorun's `OUT/worker-R.json`, "
                                    "each entry of `per_worker`"),
                       (LinkResult, "one link: each entry of akosim's `per_link`"),
                       (Calibration, "a calibration (kind `calibration`): what "
                                     "`akosim --compute-from` reads"),
                       (RankCalibration, "one rank of a calibration's `per_worker`"),
                       (ComputeMeasurement, "a cached `--compute measure` (kind `compute`), "
                                            "in the user's cache directory"),
                       (MessageCost, "`akorun measure-messages --out FILE.json` (kind "
                                     "`message_cost`, versioned by its own `schema_version`; "
                                     "akocore/records/message_cost.py)"),
                       (MessageSample, "one timed message of a message cost's `samples`")):
        out += [f"## {cls.__name__}: {title}", "",
                "| key | type | unit | meaning | written by |", "|---|---|---|---|---|"]
        out += [f"| `{k}` | {t} | {u or '-'} | {m} | {b} |"
                for k, t, u, m, b in schema_rows(cls)]
        out.append("")
    return "\n".join(out)
