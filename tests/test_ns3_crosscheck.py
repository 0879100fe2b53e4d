"""The ns-3 cross-check (analysis/ns3_crosscheck): akosim side, record, table, CLI;
the ns-3 side runs only where the `ns3` extra is installed."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from akosim.network.fluidnet import FluidNetwork
from akosim.network.netspec import NetworkSpec
from analysis.ns3_crosscheck.__main__ import main
from analysis.ns3_crosscheck.akosim_run import MODELS, register_model, run_akosim
from analysis.ns3_crosscheck.ns3_run import ns3_available
from analysis.ns3_crosscheck.ns3_scenario import (
    Message,
    Pattern,
    Star,
    ako_rounds,
    all_to_all,
    parameter_server,
)
from analysis.ns3_crosscheck.record import (
    CaseResult,
    CrossCheckRecord,
    ModelTime,
    RecordError,
    read_record,
    write_record,
)
from analysis.ns3_crosscheck.table import case_table, summary_table

BITS = 8
needs_ns3 = pytest.mark.skipif(
    not ns3_available(),
    reason="ns-3 bindings not installed (pip install '.[ns3]' or nox -s ns3)")


def test_all_to_all_on_maxmin_takes_the_uplink_time_plus_latency():
    pattern = all_to_all(4, 10e6, 2e6, 0.02)
    assert len(pattern.messages) == 12
    assert max(run_akosim(pattern)) == pytest.approx(3 * 2e6 * BITS / 10e6 + 0.02)


def test_ako_rounds_wait_for_every_partition_then_compute():
    pattern = ako_rounds(3, 10e6, 2e6, 2, 3, 0.1, 0.02)
    arrivals = run_akosim(pattern)
    per_round_s = 2 * 1e6 * BITS / 10e6 + 0.02
    assert pattern.network_s(max(arrivals)) == pytest.approx(per_round_s)
    assert max(arrivals) == pytest.approx(3 * (0.1 + per_round_s))
    for index, message in enumerate(pattern.messages):
        for before in message.after:
            assert arrivals[index] >= arrivals[before] + message.gap_s


def test_parameter_server_pushes_then_replies_through_one_server_nic():
    pattern = parameter_server(3, 10e6, 2e6, 2, 0.1, 0.02)
    assert pattern.star.hosts == 4
    one_way_s = 3 * 2e6 * BITS / 10e6 + 0.02
    assert pattern.network_s(max(run_akosim(pattern))) == pytest.approx(2 * one_way_s)


def test_a_second_model_plugs_in_by_name():
    def half_rate(env, spec: NetworkSpec) -> FluidNetwork:
        return FluidNetwork(env, NetworkSpec(spec.uplink_bps / 2, spec.downlink_bps / 2,
                                             spec.link_bps, spec.latency_s))

    register_model("half-rate-test", half_rate)
    try:
        pattern = all_to_all(3, 10e6, 1e6, 0.0)
        assert max(run_akosim(pattern, "half-rate-test")) == pytest.approx(
            2 * max(run_akosim(pattern, "maxmin")))
    finally:
        del MODELS["half-rate-test"]
    with pytest.raises(ValueError, match="unknown akosim model"):
        run_akosim(pattern, "half-rate-test")


def test_patterns_refuse_bad_messages():
    star = Star(2, 1e6, 0.0)
    with pytest.raises(ValueError, match="itself"):
        Pattern("ako", "x", star, (Message(0, 0, 1.0, 0),), 1, 0.0, 1.0)
    with pytest.raises(ValueError, match="does not precede"):
        Pattern("ako", "x", star, (Message(0, 1, 1.0, 0, after=(0,)),), 1, 0.0, 1.0)
    with pytest.raises(ValueError, match="family"):
        Pattern("ring", "x", star, (), 1, 0.0, 1.0)


def _case(family: str, name: str, latency_s: float, ns3_s: float, maxmin_s: float,
          rounds: int = 1, compute_s: float = 0.0) -> CaseResult:
    return CaseResult(family=family, name=name, hosts=3, rate_bps=10e6, latency_s=latency_s,
                      size_bytes=1e6, partitions=1, rounds=rounds, compute_s=compute_s,
                      ns3_makespan_s=ns3_s, ns3_wall_s=0.5,
                      akosim=(ModelTime("maxmin", maxmin_s),))


def _record() -> CrossCheckRecord:
    cases = (
        _case("all-to-all", "a", 1e-4, 1.1, 1.0),
        _case("all-to-all", "b", 1e-4, 1.5, 1.0),
        _case("all-to-all", "c", 1e-4, 1.2, 1.0),
        _case("ako", "d", 0.02, 2.6, 1.6, rounds=2, compute_s=0.3),  # (2.0/2) / (1.0/2)
    )
    return CrossCheckRecord(grid="hand", ns3_version="3.44.post0",
                            congestion_control="ns3::TcpCubic", segment_bytes=1448,
                            buffer_bytes=131072, models=("maxmin",), cases=cases, wall_s=1.0,
                            load="test")


def test_ratio_compares_network_time_per_round():
    assert _record().cases[3].ratio("maxmin") == pytest.approx(2.0)
    with pytest.raises(KeyError, match="tcp"):
        _record().cases[0].ratio("tcp")


def test_summary_table_gives_median_range_and_furthest_case():
    lines = summary_table(_record()).splitlines()
    assert lines[0].startswith("| pattern | latency | cases | ns-3 / akosim maxmin")
    assert lines[2] == ("| all-to-all round | 0.1 ms | 3 | 1.20 (1.10-1.50) | b: 1.50 |")
    assert lines[3] == "| Ako rounds (s = 0) | 20 ms | 1 | 2.00 (2.00-2.00) | d: 2.00 |"
    assert len(lines) == 4
    assert "| d | 2 | 0.3 | 1 | 0.5 | 2.00 |" in case_table(_record())


def test_record_round_trips_and_refuses_other_versions(tmp_path):
    path = tmp_path / "record.json"
    write_record(_record(), path)
    assert read_record(path) == _record()
    data = json.loads(path.read_text())
    data["schema_version"] = 99
    path.write_text(json.dumps(data))
    with pytest.raises(RecordError, match="schema version"):
        read_record(path)


def test_cli_table_prints_and_refuses_bad_input(tmp_path, capsys):
    path = tmp_path / "record.json"
    write_record(_record(), path)
    assert main(["table", str(path), "--cases"]) == 0
    out = capsys.readouterr().out
    assert "| b: 1.50 |" in out and "| case | rounds |" in out
    assert main(["table", str(tmp_path / "missing.json")]) == 2
    assert main(["run", "--grid", "huge"]) == 2
    assert main(["run", "--model", "nosuch"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 3


@needs_ns3
def test_tiny_scenario_runs_in_ns3_and_akosim_and_round_trips(tmp_path):
    from analysis.ns3_crosscheck.grid import run_case
    from analysis.ns3_crosscheck.ns3_run import run_ns3

    pattern = ako_rounds(3, 100e6, 0.4e6, 2, 2, 0.01, 1e-4)
    arrivals = run_ns3(pattern)
    assert all(math.isfinite(t) and t > 0 for t in arrivals)
    for index, message in enumerate(pattern.messages):
        for before in message.after:
            assert arrivals[index] >= arrivals[before] + message.gap_s
    case = run_case(pattern, ("maxmin",))
    assert case.ns3_makespan_s == max(arrivals)  # ns-3 is deterministic
    # TCP cannot beat the fluid bound: the link rate carries headers too.
    assert case.ratio("maxmin") >= 1.0
    record = CrossCheckRecord(grid="tiny", ns3_version="test", congestion_control="ns3::TcpCubic",
                              segment_bytes=1448, buffer_bytes=131072, models=("maxmin",),
                              cases=(case,), wall_s=case.ns3_wall_s, load="test")
    path = tmp_path / "tiny.json"
    write_record(record, path)
    assert read_record(path) == record


def test_the_tcp_model_is_slower_than_max_min_by_its_overheads():
    pattern = all_to_all(3, 100e6, 0.5e6, 0.02)
    maxmin_s = max(run_akosim(pattern, "maxmin"))
    tcp_s = max(run_akosim(pattern, "tcp"))
    # goodput 1448/1502 of the line, ACKs on the way back, a handshake RTT and slow start
    assert tcp_s > maxmin_s / (1448 / 1502) + 0.04


def test_rescore_adds_a_model_and_keeps_the_ns3_times(tmp_path):
    from analysis.ns3_crosscheck.grid import GRIDS, rescore

    cases = tuple(
        CaseResult(family=p.family, name=p.name, hosts=p.star.hosts, rate_bps=p.star.rate_bps,
                   latency_s=p.star.latency_s, size_bytes=p.size_bytes,
                   partitions=p.partitions, rounds=p.rounds, compute_s=p.compute_s,
                   ns3_makespan_s=9.0 + index, ns3_wall_s=0.1,
                   akosim=(ModelTime("maxmin", max(run_akosim(p, "maxmin"))),))
        for index, p in enumerate(GRIDS["tiny"]()))
    record = CrossCheckRecord(grid="tiny", ns3_version="3.44.post0",
                              congestion_control="ns3::TcpCubic", segment_bytes=1448,
                              buffer_bytes=131072, models=("maxmin",), cases=cases,
                              wall_s=1.0, load="test")
    updated = rescore(record, ("tcp",))
    assert updated.models == ("maxmin", "tcp")
    for before, after in zip(record.cases, updated.cases, strict=True):
        assert after.ns3_makespan_s == before.ns3_makespan_s
        assert after.akosim_makespan_s("maxmin") == before.akosim_makespan_s("maxmin")
        assert after.akosim_makespan_s("tcp") > before.akosim_makespan_s("maxmin")
    path = tmp_path / "record.json"
    write_record(record, path)
    assert main(["rescore", str(path), "--model", "tcp"]) == 0
    assert read_record(path).models == ("maxmin", "tcp")
    with pytest.raises(ValueError, match="grid"):
        rescore(replace(record, grid="hand"), ("tcp",))
