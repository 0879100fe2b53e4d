"""--compute measure: measured once per machine, cached as a typed record, refreshed on ask.

The cache directory is a tmp folder (AKO_CACHE_DIR) in every test; the
measurement itself is replaced by a counter, so nothing here times JAX.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from akocore.records.calibration import ComputeMeasurement
from akocore.records.results import RecordError
from akosim.cli import main
from akosim.planning import compute_cache
from akosim.planning.compute import StepTiming
from akosim.planning.compute_cache import CacheKey, cache_dir, key_for, load, measured_compute

KEY = CacheKey("synthetic-cnn", 104, "sgd", "Test CPU x2 x86_64", "0.0.1")


def _measure(calls: list[int], seconds: float = 0.25, params: int = 1000):
    def measure() -> tuple[float, int]:
        calls.append(1)
        return seconds, params
    return measure


def test_first_call_measures_then_the_cache_answers(tmp_path: Path) -> None:
    calls: list[int] = []
    first = measured_compute(KEY, _measure(calls), steps=30, directory=tmp_path)
    second = measured_compute(KEY, _measure(calls, 9.0), steps=30, directory=tmp_path)
    assert calls == [1]
    assert first.fresh and not second.fresh
    assert second.record == first.record
    assert second.record.compute_s == 0.25 and second.record.param_count == 1000
    assert "measured here on " in second.provenance()
    assert "cached; --compute remeasure to refresh" in second.provenance()
    assert "measured here now" in first.provenance()


def test_refresh_measures_again_and_rewrites(tmp_path: Path) -> None:
    calls: list[int] = []
    measured_compute(KEY, _measure(calls), steps=30, directory=tmp_path)
    again = measured_compute(KEY, _measure(calls, 0.5), steps=30, refresh=True,
                             directory=tmp_path)
    assert calls == [1, 1] and again.fresh
    assert load(KEY, tmp_path).compute_s == 0.5


@pytest.mark.parametrize("damage", [
    "{not json", "[]", '{"schema_version": 99, "kind": "compute"}',
    '{"schema_version": 1, "kind": "compute", "workload": "x"}',
])
def test_a_corrupt_cache_file_is_measured_again(tmp_path: Path, damage: str) -> None:
    calls: list[int] = []
    (tmp_path / KEY.file_name()).write_text(damage)
    result = measured_compute(KEY, _measure(calls), steps=30, directory=tmp_path)
    assert calls == [1] and result.fresh
    assert load(KEY, tmp_path) == result.record  # rewritten whole


def test_another_machine_or_jax_version_is_another_entry(tmp_path: Path) -> None:
    calls: list[int] = []
    measured_compute(KEY, _measure(calls), steps=30, directory=tmp_path)
    other = CacheKey(KEY.workload, KEY.batch_size, KEY.optimizer, KEY.cpu, "0.0.2")
    assert other.file_name() != KEY.file_name()
    measured_compute(other, _measure(calls), steps=30, directory=tmp_path)
    assert calls == [1, 1]


def test_the_record_round_trips_and_refuses_nonsense() -> None:
    record = ComputeMeasurement("w", 8, "sgd", "cpu", "1", 0.1, 10, 30, "2026-01-01T00:00:00")
    assert ComputeMeasurement.from_json(json.loads(json.dumps(record.to_json()))) == record
    bad = {**record.to_json(), "compute_s": -1.0}
    with pytest.raises(RecordError, match="compute_s"):
        ComputeMeasurement.from_json(bad)


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("AKO_CACHE_DIR", str(tmp_path / "explicit"))
    assert cache_dir() == tmp_path / "explicit"
    monkeypatch.delenv("AKO_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "ako-toolkit"
    assert key_for("w", 8, "sgd").jax_version  # a version string, even "unknown"


def test_akosim_measures_once_says_so_and_reuses_it(monkeypatch, capsys,
                                                    tmp_path: Path) -> None:
    monkeypatch.setenv("AKO_CACHE_DIR", str(tmp_path))
    calls: list[int] = []

    def fake_measure(workload, max_steps: int) -> StepTiming:
        calls.append(1)
        return StepTiming(0.02, 5, 0.0199, 0.0201, 0.9)

    monkeypatch.setattr("akosim.planning.compute.measure_step_timing", fake_measure)
    argv = ["--workers", "4", "--bandwidth", "1gbps", "--workload", "digits-mlp",
            "--scheme", "ako", "--p", "2", "--rounds", "6", "--quiet"]
    assert main(argv) == 0
    first = capsys.readouterr()
    assert "measuring one gradient step of digits-mlp" in first.err
    assert "measured here now (median of 5 steps, within ±0.5% at 90% confidence)" in first.out
    assert main(argv) == 0
    second = capsys.readouterr()
    assert calls == [1]
    assert "measuring" not in second.err
    assert "cached; --compute remeasure to refresh" in second.out
    assert main([*argv, "--compute", "remeasure"]) == 0
    assert calls == [1, 1]
    assert list(tmp_path.glob("compute-digits-mlp-*.json"))
    assert compute_cache.CACHE_ENV == "AKO_CACHE_DIR"
