"""The 2026 baselines analysis (analysis.tta_map, analysis.tta_report): a one-cell akosim
map of two schemes really trains, and the report is written from it and from testbed
rows (made up here: the testbed itself needs root and minutes)."""

from __future__ import annotations

import json

import pytest

from analysis.tta_map import (
    MapRow,
    TtaMap,
    merge_maps,
    read_map,
    settings_of,
    tta_map,
    winner,
)
from analysis.tta_report import main as report_main
from analysis.tta_report import scheme_errors
from analysis.tta_testbed import CONFIGS, TtaRow, relative_error, time_to_target


def _row(config: str, codec: str, tta: float | None) -> MapRow:
    return MapRow(bandwidth="10mbps", latency="1ms", config=config, codec=codec, label=config,
                  time_to_target_s=tta, rounds_to_target=None if tta is None else 10,
                  final_accuracy=0.9, round_time_s=0.1, bytes_sent_per_worker_per_round=1e3,
                  bytes_to_target_per_worker=None if tta is None else 1e4)


def test_the_winner_is_the_first_to_the_target_and_codec_none_excludes_codecs() -> None:
    rows = [_row("allreduce", "none", 3.0), _row("ako-int8", "int8", 1.0),
            _row("diloco", "none", 2.0), _row("ps", "none", None)]
    first, plain = winner(rows), winner(rows, codecs=False)
    assert first is not None and first.config == "ako-int8"
    assert plain is not None and plain.config == "diloco"
    assert winner([_row("ps", "none", None)]) is None


def test_merging_new_configurations_replaces_only_their_rows_in_grid_order() -> None:
    def record(rows: list[MapRow], elapsed_s: float) -> TtaMap:
        return TtaMap(workload="w", workers=3, target_accuracy=0.92, budget_s=60.0,
                      bandwidths=("10mbps",), latencies=("1ms",), rows=rows,
                      elapsed_s=elapsed_s)

    old = record([_row("allreduce", "none", 3.0), _row("diloco-int8", "int8", 9.0),
                  _row("ps", "none", None)], 100.0)
    new = record([_row("diloco-int8", "int8", 1.0)], 10.0)
    merged = merge_maps(old, new)
    assert [(r.config, r.time_to_target_s) for r in merged.rows] == [
        ("allreduce", 3.0), ("ps", None), ("diloco-int8", 1.0)]  # CONFIGS order
    assert merged.elapsed_s == 110.0
    other = record([], 1.0)
    other.latencies = ("10ms",)
    with pytest.raises(ValueError, match="another grid"):
        merge_maps(old, other)


def test_an_unknown_configuration_is_a_user_mistake(tmp_path, capsys) -> None:
    from analysis.tta_map import main as map_main

    assert map_main(["--out", str(tmp_path / "m.json"), "--configs", "diloco-int4"]) == 2
    assert "unknown diloco-int4; allowed:" in capsys.readouterr().err
    assert not (tmp_path / "m.json").exists()


def test_time_to_target_and_errors() -> None:
    evaluations = [(0.5, 10, 0.8), (1.0, 20, 0.93), (1.5, 30, 0.91)]
    assert time_to_target(evaluations, 0.92) == 1.0
    assert time_to_target(evaluations, 0.95) is None
    assert relative_error(1.1, 1.0) == pytest.approx(0.1)
    assert relative_error(None, 1.0) is None
    assert relative_error(1.0, None) is None


def test_configuration_flags_become_akosim_train_keywords() -> None:
    streaming = next(c for c in CONFIGS if c.name == "streaming-diloco")
    assert settings_of(streaming) == {"scheme": "streaming-diloco", "inner_steps": "10",
                                      "fragments": "2", "overlap_steps": "1",
                                      "codec": "none"}
    assert next(c for c in CONFIGS if c.scheme == "ps").nodes == 4  # 3 workers + a server


def _testbed_row(config: str, measured: float, predicted: float,
                 tta: tuple[float | None, float | None]) -> TtaRow:
    return TtaRow(
        name=f"n10m-rtt50--{config}", network="n10m-rtt50", config=config, scheme=config,
        codec="none", label=config, rounds=100, measured_round_time_s=measured,
        bytes_sent_per_worker_per_round=2e5,
        measured_evaluations=((0.5, 10, 0.5), (tta[0] or 9.0, 20, 0.95 if tta[0] else 0.9)),
        measured_time_to_target_s=tta[0], measured_final_accuracy=0.95,
        predicted_round_time_s=predicted, predicted_compute_s=4e-4,
        predicted_evaluations=((0.6, 10, 0.6), (tta[1] or 9.0, 20, 0.95 if tta[1] else 0.9)),
        predicted_time_to_target_s=tta[1], predicted_final_accuracy=0.95,
        predicted_train_round_time_s=predicted, uptime_before="load average: 3.0, 2, 1",
        uptime_after="load average: 3.1, 2, 1", wall_s=30.0)


def test_errors_per_configuration() -> None:
    rows = [_testbed_row("diloco", 0.10, 0.12, (2.0, 1.5)),
            _testbed_row("allreduce", 0.40, 0.36, (None, 8.0))]
    errors = {e["config"]: e for e in scheme_errors(rows)}
    assert errors["diloco"]["round_mean_abs"] == pytest.approx(0.2)
    assert errors["diloco"]["tta_mean_abs"] == pytest.approx(0.25)
    assert errors["allreduce"]["tta_both"] == 0
    assert errors["allreduce"]["reached_disagree"] == 1


def test_a_one_cell_map_trains_and_the_report_is_written(tmp_path) -> None:
    record = tta_map(quick=True)
    assert [r.config for r in record.rows] == ["allreduce", "diloco"]
    assert all(r.final_accuracy is not None and r.round_time_s for r in record.rows)
    map_path = tmp_path / "map.json"
    from dataclasses import asdict

    map_path.write_text(json.dumps(asdict(record)))
    assert isinstance(read_map(map_path), TtaMap)
    testbed = tmp_path / "tta_testbed.json"
    rows = [_testbed_row("diloco", 0.10, 0.12, (2.0, 1.5)),
            _testbed_row("allreduce", 0.40, 0.36, (None, 8.0))]
    testbed.write_text(json.dumps({"notes": {}, "rows": [asdict(r) for r in rows]}))
    docs, data = tmp_path / "docs", tmp_path / "data"
    assert report_main(["--testbed", str(testbed), "--map", str(map_path), "--data",
                        str(data), "--docs", str(docs), "--discussion",
                        str(tmp_path / "none.md")]) == 0
    page = (docs / "experiments-2026.md").read_text()
    best = winner(record.rows)
    assert f"| 10mbps | 10ms | {best.config if best else '-'} |" in page
    assert "| diloco | 1 | 20 % |" in page  # the error table
    assert "First to 0.92: akorun **diloco**, akosim **diloco**" in page
    for png in ("tta-map.png", "tta-testbed.png", "tta-curves.png"):
        assert (docs / png).stat().st_size > 1000
    assert len(json.loads((data / "tta_testbed.json").read_text())["rows"]) == 2


def test_a_missing_testbed_record_is_one_line_and_exit_2(tmp_path, capsys) -> None:
    assert report_main(["--testbed", str(tmp_path / "absent")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_the_goodput_table_divides_by_the_fault_free_run_of_the_same_scheme() -> None:
    from analysis.fault_goodput import GoodputRow, markdown

    def row(scheme: str, fault: str, samples_per_s: float,
            codes: dict[str, int | None]) -> GoodputRow:
        return GoodputRow(scheme=scheme, fault=fault, exit_codes=codes, rounds={},
                          useful_samples=0, wall_s=60.0, samples_per_s=samples_per_s,
                          time_to_target_s=None, final_accuracy=0.9, load_before="1.0")

    table = markdown([row("diloco", "none", 1000.0, {"0": 0, "1": 0, "2": 0}),
                      row("diloco", "kill", 600.0, {"0": 0, "1": 0, "2": None}),
                      row("quorum-diloco", "none", 2000.0, {"0": 0, "1": 0, "2": 0}),
                      row("quorum-diloco", "pause", 1500.0, {"0": 0, "1": 0, "2": 1})])
    lines = table.splitlines()
    assert "| diloco | kill | 0, 0, killed | 600 | 60% |" in lines[3]
    assert "| quorum-diloco | pause | 0, 0, 1 | 1,500 | 75% |" in lines[5]
    assert "| 100% |" in lines[2] and "| 100% |" in lines[4]
