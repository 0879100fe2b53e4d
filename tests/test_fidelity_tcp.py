"""analysis.fidelity_tcp: one tiny configuration on the netns testbed end to end (needs
root, `ip` and `tc`: skipped with the reason otherwise), and the report generator on a
hand-made record (no root)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from akorun.launching.testbed import netns
from analysis.fidelity_tcp import DONE_FILE, RECORD_FILE, GridPoint, grid, main, wan_grid
from analysis.fidelity_tcp_record import (
    COLUMNS,
    FidelityTcpRecord,
    FidelityTcpRow,
    summarise,
)
from analysis.fidelity_tcp_report import (
    kept_analysis,
    markdown_report,
    scheme_table,
    summary_table,
)


def _row(name: str, scheme: str, ssp: int, rate: str, measured: float, host: float,
         run: float, maxmin: float) -> FidelityTcpRow:
    return FidelityTcpRow(
        name=name, scheme=scheme, workers=2, nodes=2 if scheme == "ako" else 3, rate=rate,
        bandwidth_bps=(20e6,) * 3, p_configured="1" if scheme == "ako" else "-",
        p_resolved=(1, 1) if scheme == "ako" else (), ssp=ssp, rounds=30,
        measured_round_time_s=measured, host_calibrated_s=host, run_calibrated_s=run,
        maxmin_s=maxmin, run_compute_s=(0.010, 0.012), run_overhead_s=(0.001, 0.001),
        host_compute_s=0.008, message_software_s=(0.002, 0.002),
        bytes_sent_per_round=5e5, uplink_utilisation=0.9, wall_s=12.0)


def test_the_grid_spans_workers_rates_p_s_and_both_schemes():
    points = grid()
    assert len(points) >= 24 and len({p.name for p in points}) == len(points)
    assert {p.workers for p in points} == {2, 3, 4}
    assert {p.rate for p in points} == {"lan", "wan", "het"}
    assert {p.p for p in points if p.scheme == "ako"} == {"1", "auto"}
    assert {p.ssp for p in points} == {0, 2}
    assert {p.scheme for p in points} == {"ako", "ps"}
    ps = GridPoint("ps", 3, "wan", "-", 0)
    assert ps.nodes == 4 and "exchange.ps_mode=async" in ps.launch_flags()


def test_the_wan_grid_spans_round_trips_rates_workers_p_s_and_every_scheme():
    points = wan_grid()
    assert len(points) >= 24 and len({p.name for p in points}) == len(points)
    assert {p.rtt_ms for p in points} == {10.0, 50.0, 100.0}
    assert {p.rate for p in points} == {"5m", "20m", "100m"}
    assert {p.workers for p in points} == {2, 3, 4}
    assert {(p.p, p.ssp) for p in points if p.scheme == "ako"} == {
        ("1", 0), ("1", 2), ("auto", 0), ("auto", 2)}
    assert {p.scheme for p in points} == {"ako", "ps", "allreduce", "diloco",
                                          "streaming-diloco"}
    streaming = next(p for p in points if p.scheme == "streaming-diloco")
    flags = streaming.launch_flags()
    assert flags[flags.index("--inner-steps") + 1] == "4" and "--fragments" in flags
    assert "--latency" in flags and streaming.name.endswith("-H4-s0-rtt50ms")


def test_the_report_of_a_hand_made_record_has_every_column_error_and_group():
    rows = (_row("wan-2w-ako-p1-s0", "ako", 0, "wan", 0.20, 0.18, 0.21, 0.16),
            _row("wan-2w-ako-p1-s2", "ako", 2, "wan", 0.10, 0.11, 0.10, 0.09),
            _row("lan-2w-ps-s0", "ps", 0, "lan", 0.40, 0.50, 0.44, 0.52))
    columns = tuple(summarise(rows, c) for c in COLUMNS)
    host = columns[0]
    assert host.column == "host-calibrated" and host.configurations == 3
    assert math.isclose(host.mape, (0.1 + 0.1 + 0.25) / 3)
    assert math.isclose(host.mean_signed_error, (-0.1 + 0.1 + 0.25) / 3)
    record = FidelityTcpRecord(created="2026-11-23T16:00:00+00:00", workload="digits-cnn",
                               rounds=30, host_calibration="host.json",
                               host_calibration_summary="goodput fraction 0.95",
                               host_compute_s=0.008, uptime=("load average: 1.0",) * 3,
                               rows=rows, columns=columns,
                               colocated_compute=("compute 9.00 ms/step with 3 processes",))
    again = FidelityTcpRecord.from_json(json.loads(json.dumps(record.to_json())))
    assert again == record
    text = markdown_report(record, analysis="The PS is predicted too slow.")
    assert summary_table(record) in text
    assert "| host-calibrated | 3 | 15.0% |" in text
    assert "lan-2w-ps-s0" in text and "+25.0%" in text and "-10.0%" in text
    assert "| scheme | ps | 1 |" in text and "| s | 2 | 1 |" in text
    assert "The PS is predicted too slow." in text and "load average: 1.0" in text
    assert "compute 9.00 ms/step with 3 processes" in text
    regenerated = markdown_report(record, kept_analysis(text))
    assert regenerated == text  # the hand-written analysis survives a regeneration
    assert kept_analysis(markdown_report(record)) == ""


def test_the_scheme_table_ranks_schemes_by_their_share_of_the_error():
    rows = (_row("a", "ako", 0, "wan", 0.20, 0.18, 0.21, 0.16),  # host error 0.1
            _row("b", "ako", 2, "wan", 0.10, 0.11, 0.10, 0.09),  # 0.1
            _row("c", "ako", 0, "lan", 0.30, 0.30, 0.30, 0.30),  # 0
            _row("d", "ps", 0, "lan", 0.40, 0.60, 0.44, 0.52))  # 0.5
    lines = scheme_table(rows).splitlines()
    assert lines[2].startswith("| ps | 1 | 50.0% / - |") and lines[2].endswith("71.4% |")
    # ako: MAPE (0.1 + 0.1 + 0) / 3, tau over its three rows (all pairs concordant)
    assert lines[3].startswith("| ako | 3 | 6.7% / 1.00 |") and lines[3].endswith("28.6% |")


def test_two_records_compare_by_scheme_p_and_s():
    from analysis.fidelity_tcp_compare import comparison_table

    rows = (_row("wan-2w-ako-p1-s0", "ako", 0, "wan", 0.20, 0.18, 0.21, 0.16),
            _row("lan-2w-ps-s0", "ps", 0, "lan", 0.40, 0.50, 0.44, 0.52))
    record = FidelityTcpRecord(created="2026-11-23T16:00:00+00:00", workload="digits-cnn",
                               rounds=30, host_calibration="host.json",
                               host_calibration_summary="", host_compute_s=0.008,
                               uptime=(), rows=rows,
                               columns=tuple(summarise(rows, c) for c in COLUMNS))
    better = replace(record, rows=(replace(rows[0], host_calibrated_s=0.20), rows[1]))
    table = comparison_table([("before", record), ("after", better)])
    lines = table.splitlines()
    assert "before: host-calibrated" in lines[0] and "after: max-min" in lines[0]
    assert lines[3].startswith("| ako-p1-s0 | 1 | 10.0% / - |")
    assert "| 0.0% / - |" in lines[3]  # after: the Ako run is predicted exactly
    assert lines[4].startswith("| ps-s0 | 1 | 25.0% / - |")


@pytest.mark.netns
@pytest.mark.timeout(600)
def test_one_tiny_configuration_end_to_end(tmp_path: Path, capsys):
    missing = netns.missing_requirements()
    if missing:
        pytest.skip(f"the netns testbed {missing}")
    results = tmp_path / "results"
    report = tmp_path / "report.md"
    status = main(["--results", str(results), "--only", "wan-2w-ako-p1-s0", "--workload",
                   "digits-mlp", "--rounds", "5", "--no-message-cost", "--netns-rate", "none",
                   "--report", str(report), "--json", str(tmp_path / "copy.json")])
    printed = capsys.readouterr().out
    if status != 0 and "testbed: `" in printed:
        pytest.skip(f"the kernel refused the testbed: {printed.strip()}")
    assert status == 0, printed
    folder = results / "wan-2w-ako-p1-s0"
    assert (folder / DONE_FILE).exists() and (folder / "run" / "testbed.json").exists()
    record = FidelityTcpRecord.from_json(json.loads((results / RECORD_FILE).read_text()))
    (row,) = record.rows
    assert row.rounds == 5 and row.p_resolved == (1, 1)
    for column in COLUMNS:
        assert row.prediction(column) > 0 and math.isfinite(row.prediction(column))
    assert {c.column for c in record.columns} == set(COLUMNS)
    assert (tmp_path / "copy.json").read_text() == (results / RECORD_FILE).read_text()
    assert "wan-2w-ako-p1-s0" in report.read_text()
    for column in COLUMNS:  # each prediction came from akosim predict, as the runner says
        assert (folder / f"predict-{column}.json").exists()
    # resumable: a second call runs nothing and writes the same row
    assert main(["--results", str(results), "--only", "wan-2w-ako-p1-s0", "--workload",
                 "digits-mlp", "--rounds", "5", "--no-message-cost", "--netns-rate", "none",
                 "--report", str(report)]) == 0
    again = FidelityTcpRecord.from_json(json.loads((results / RECORD_FILE).read_text()))
    assert again.rows == record.rows
