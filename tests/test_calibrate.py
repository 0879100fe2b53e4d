"""`akosim calibrate`: a short loopback calibration writes a valid HostCalibration, takes
akorun's per-message cost from a MessageCost file, and the TCP model then uses it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from akocore.records.host_calibration import HostCalibration, TcpParameters
from akocore.records.message_cost import MessageCost, MessageSample
from akosim.calibration import host_calibration_io
from akosim.calibration.host_calibrate import calibrate
from akosim.cli import main

pytestmark = pytest.mark.timeout(120)


def message_cost_file(folder: Path, fixed_s: float = 0.0015,
                      per_byte_s: float = 2e-9) -> Path:
    """What `akorun measure-messages --out` writes (akocore.records.message_cost.MessageCost)."""
    path = folder / "message-cost.json"
    record = MessageCost(fixed_s=fixed_s, per_byte_s=per_byte_s,
                         samples=(MessageSample(1000, fixed_s + 1000 * per_byte_s),),
                         host="test", measured_at="2026-11-23T00:00:00Z")
    path.write_text(json.dumps(record.to_json()))
    return path


def test_calibrate_measures_loopback_and_records_what_it_measured(tmp_path: Path):
    record = calibrate(message_cost=str(message_cost_file(tmp_path)), repeats=1,
                       sizes=(4096, 65536), bulk_bytes=1 << 20)
    assert record.loopback_rtt_s is not None and 0 < record.loopback_rtt_s < math.inf
    assert record.tcp.base_rtt_s == record.loopback_rtt_s
    assert [t.size_bytes for t in record.transfers] == [4096, 65536]
    assert all(t.fresh_s > 0 and t.warm_s > 0 for t in record.transfers)
    assert (record.tcp.message_fixed_s, record.tcp.message_per_byte_s) == (0.0015, 2e-9)
    assert {"base_rtt_s", "message_fixed_s", "message_per_byte_s"} <= set(record.measured)
    assert HostCalibration.from_json(json.loads(json.dumps(record.to_json()))) == record


def test_calibrate_command_writes_the_file_and_plan_uses_it(tmp_path: Path, capsys,
                                                             monkeypatch):
    monkeypatch.setenv("AKO_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "host.json"
    assert main(["calibrate", "--out", str(out), "--repeats", "1",
                 "--message-cost", str(message_cost_file(tmp_path))]) == 0
    printed = capsys.readouterr().out
    assert f"wrote {out}" in printed and "loopback RTT" in printed
    record = HostCalibration.from_json(json.loads(out.read_text()))
    assert record.tcp.message_fixed_s == 0.0015
    assert main(["--workers", "3", "--scheme", "ako", "--p", "1", "--compute", "10ms",
                 "--gradient-size", "1MB", "--bandwidth", "40mbps", "--quiet",
                 "--network-model", "tcp", "--host-calibration", str(out)]) == 0
    assert f"from {out}" in capsys.readouterr().out


def test_calibrate_without_akorun_records_the_cost_as_not_measured(tmp_path: Path,
                                                                     monkeypatch):
    monkeypatch.setenv("AKO_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path))  # no akorun command
    assert main(["calibrate", "--repeats", "1"]) == 0
    cached = host_calibration_io.cached_host_calibration()
    assert cached is not None
    assert "message_fixed_s" not in cached.measured and cached.tcp.message_fixed_s == 0.0
    assert any("not measured" in note for note in cached.notes)
    source = host_calibration_io.tcp_parameters()
    assert source.params == cached.tcp and "cached" in source.provenance


def test_tcp_parameters_fall_back_to_documented_defaults(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("AKO_CACHE_DIR", str(tmp_path / "empty"))
    source = host_calibration_io.tcp_parameters()
    assert source.params == TcpParameters() and "defaults" in source.provenance


@pytest.mark.parametrize("content, words", [
    (None, "no file"),
    ("{", "not JSON"),
    ('{"fixed_s": 1}', "not an akorun message cost"),
    ('{"schema_version": 1, "kind": "message_cost", "fixed_s": -1, "per_byte_s": 0, '
     '"samples": [{"payload_bytes": 1, "seconds": 1}], "host": "h", "measured_at": "t"}',
     "fixed_s"),
])
def test_a_bad_message_cost_file_is_one_line_and_exit_2(tmp_path: Path, capsys, content,
                                                        words):
    path = tmp_path / "cost.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(SystemExit) as stop:
        main(["calibrate", "--out", str(tmp_path / "h.json"), "--repeats", "1",
              "--message-cost", str(path)])
    assert stop.value.code == 2
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and words in error


def test_a_bad_host_calibration_file_is_one_line_and_exit_2(tmp_path: Path, capsys):
    path = tmp_path / "host.json"
    path.write_text('{"schema_version": 1, "kind": "compute"}')
    with pytest.raises(SystemExit) as stop:
        main(["--workers", "3", "--compute", "10ms", "--gradient-size", "1MB", "--quiet",
              "--network-model", "tcp", "--host-calibration", str(path)])
    assert stop.value.code == 2
    assert "is not a host calibration" in capsys.readouterr().err


def test_netns_rate_measures_the_goodput_fraction_of_a_shaped_link(tmp_path: Path):
    from akosim.calibration.netns_probe import netns_available

    why = netns_available()
    if why is not None:
        pytest.skip(f"the namespace probe {why}")
    record = calibrate(measure_messages=False, repeats=1, sizes=(4096,), bulk_bytes=1 << 20,
                       netns_rate_bps=20e6, netns_seconds=1.5, netns_passes=1,
                       netns_sharing_rounds=2)
    fraction = record.tcp.measured_goodput_fraction
    assert fraction is not None and 0 < fraction <= 1  # payload can never beat the line
    assert record.tcp.bandwidth_factor == fraction and record.shaped_rate_bps == 20e6
    assert "measured_goodput_fraction" in record.measured
    # 1-4 flows through one port shaped as the testbed does: one flow is the reference
    sharing = record.tcp.flow_sharing_efficiency
    assert len(sharing) == 4 and sharing[0] == 1.0 and all(0 < e <= 1 for e in sharing)
    assert "flow_sharing_efficiency" in record.measured
    assert any(note.startswith("flow sharing: k = 1..4") for note in record.notes)


def test_netns_rate_needs_a_unit(tmp_path: Path, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["calibrate", "--out", str(tmp_path / "h.json"), "--netns-rate", "20"])
    assert stop.value.code == 2
    assert "add a unit" in capsys.readouterr().err
