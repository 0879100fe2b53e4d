"""The per-message software cost: `MessageCost`, its fit, `akorun measure-messages`."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from akocore.records.jsonrecord import RecordError
from akocore.records.message_cost import (
    MESSAGE_COST_SCHEMA_VERSION,
    MessageCost,
    MessageSample,
    fit_message_cost,
)
from akorun.testing import REPO_ROOT, akorun_command, child_test_env


def _samples(fixed_s: float, per_byte_s: float, sizes: tuple[int, ...] = (1000, 10**5, 10**6),
             noise: tuple[float, ...] = (0.0, 1e-4, -1e-4)) -> list[MessageSample]:
    return [MessageSample(size, fixed_s + per_byte_s * size + extra)
            for size in sizes for extra in noise]


def test_the_fit_recovers_a_line_through_the_per_size_medians() -> None:
    # the 5 s hiccup does not move the median of its size
    samples = _samples(0.5e-3, 2e-9, noise=(0.0, 0.0, 0.0)) + [MessageSample(1000, 5.0)]
    fixed_s, per_byte_s = fit_message_cost(samples)
    assert fixed_s == pytest.approx(0.5e-3, rel=1e-6)
    assert per_byte_s == pytest.approx(2e-9, rel=1e-6)


def test_the_fit_never_gives_a_negative_cost() -> None:
    falling = [MessageSample(1000, 2e-3), MessageSample(10**6, 1e-3)]
    assert fit_message_cost(falling) == (pytest.approx(1.5e-3), 0.0)
    steep = [MessageSample(1000, 1e-6), MessageSample(2000, 1e-3), MessageSample(3000, 2e-3)]
    fixed_s, per_byte_s = fit_message_cost(steep)
    assert fixed_s == 0.0 and per_byte_s > 0
    assert fit_message_cost([MessageSample(500, 3e-3)]) == (3e-3, 0.0)
    with pytest.raises(ValueError):
        fit_message_cost([])


def test_the_record_round_trips_and_refuses_another_version() -> None:
    samples = tuple(_samples(1e-3, 1e-9))
    record = MessageCost(1e-3, 1e-9, samples, "cpu x2", "2026-11-23T00:00:00+00:00", 3)
    data = json.loads(json.dumps(record.to_json()))
    assert data["kind"] == "message_cost"
    assert data["schema_version"] == MESSAGE_COST_SCHEMA_VERSION
    assert MessageCost.from_json(data) == record
    assert record.cost_s(10**6) == pytest.approx(2e-3)
    assert MessageCost(-1.0, 0.0, samples, "", "").cost_s(10) == 0.0
    with pytest.raises(RecordError, match="schema_version"):
        MessageCost.from_json({**data, "schema_version": MESSAGE_COST_SCHEMA_VERSION + 1})
    with pytest.raises(RecordError, match="kind"):
        MessageCost.from_json({**data, "kind": "compute"})
    with pytest.raises(RecordError, match="samples"):
        MessageCost.from_json({**data, "samples": []})
    with pytest.raises(RecordError, match="fixed_s"):
        MessageCost.from_json({**data, "fixed_s": "1 ms"})


def test_measure_messages_writes_a_record_akosim_can_read(tmp_path: Path) -> None:
    out = tmp_path / "cost.json"
    done = subprocess.run(
        akorun_command("measure-messages", "--out", str(out), "--repetitions", "2",
                       "--sizes", "1kB,64kB,600kB"),
        capture_output=True, text=True, timeout=120, cwd=REPO_ROOT, env=child_test_env())
    assert done.returncode == 0, done.stderr
    assert "repetition 2/2" in done.stderr and done.stdout == ""
    record = MessageCost.from_json(json.loads(out.read_text()))
    assert record.repetitions == 2
    assert sorted({s.payload_bytes for s in record.samples}) == [1000, 64000, 600000]
    assert len(record.samples) == 6 and all(s.seconds > 0 for s in record.samples)
    assert record.fixed_s >= 0 and record.per_byte_s >= 0 and record.cost_s(10**6) > 0
    assert record.host and record.measured_at.endswith("+00:00")
    assert (record.fixed_s, record.per_byte_s) == fit_message_cost(record.samples)


@pytest.mark.parametrize("flags, says", [
    (("--repetitions", "0"), "--repetitions"),
    (("--sizes", "1kB"), "at least two"),
    (("--sizes", "1kB,lots"), "--sizes"),
    (("--sizes", "1kB,1TB"), "outside"),
])
def test_measure_messages_refuses_bad_input_with_one_line(tmp_path: Path, flags: tuple[str, ...],
                                                          says: str) -> None:
    done = subprocess.run(
        akorun_command("measure-messages", "--out", str(tmp_path / "c.json"), *flags),
        capture_output=True, text=True, timeout=60, cwd=REPO_ROOT, env=child_test_env())
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and says in done.stderr
    assert not (tmp_path / "c.json").exists()


def test_measure_messages_help_has_an_example() -> None:
    done = subprocess.run(akorun_command("measure-messages", "--help"), capture_output=True,
                          text=True, timeout=60, cwd=REPO_ROOT, env=child_test_env())
    assert done.returncode == 0 and "akorun measure-messages --out" in done.stdout
