"""The akosim command line: output files, help, and one-line errors for user mistakes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from akosim.cli import main

SMALL = ["--gradient-size", "400KB", "--compute", "50ms", "--rounds", "12", "--quiet"]


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_comparison_table_json_and_trace(capsys, tmp_path: Path) -> None:
    out_file, trace_file = tmp_path / "r.json", tmp_path / "t.json"
    code, out, _ = run_cli(capsys, "--workers", "4", "--bandwidth", "40mbps", "--p", "auto",
                           *SMALL, "--out", str(out_file), "--trace", str(trace_file))
    assert code == 0
    for label in ("ako p=", "ako p=1", "ps ", "ring allreduce"):
        assert label in out
    assert "bound by uplink of worker" in out
    result = json.loads(out_file.read_text())
    schemes = [run["scheme"] for run in result["runs"]]
    assert schemes[0] == "ako" and "ps" in schemes and "allreduce" in schemes
    for run in result["runs"]:
        for key in ("scheme", "p", "ssp", "workers", "round_time_s", "samples_per_s",
                    "bytes_sent_per_worker_per_round", "per_worker", "per_link"):
            assert key in run
        assert run["round_time_s"] > 0 and len(run["per_worker"]) >= 1
    assert result["config"]["cluster"]["workers"] == 4
    trace = json.loads(trace_file.read_text())
    names = {e["name"] for e in trace["traceEvents"]}
    assert {"compute", "send"} <= names
    assert all(e["dur"] >= 0 for e in trace["traceEvents"] if e.get("ph") == "X")


def test_one_scheme_only_when_a_scheme_is_given(capsys, tmp_path: Path) -> None:
    out_file = tmp_path / "r.json"
    code, out, _ = run_cli(capsys, "--workers", "3", "--scheme", "ako", "--p", "2", "--ssp",
                           "inf", *SMALL, "--out", str(out_file))
    assert code == 0
    runs = json.loads(out_file.read_text())["runs"]
    assert [(r["scheme"], r["p"], r["ssp"]) for r in runs] == [("ako", 2, "inf")]


def test_training_mode_reports_accuracy(capsys) -> None:
    code, out, _ = run_cli(capsys, "train", "--workers", "3", "--scheme", "ako", "--rounds",
                           "30", "--compute", "10ms", "--target-accuracy", "0.5", "--quiet")
    assert code == 0
    assert "final acc" in out and "time to target" in out


@pytest.mark.parametrize("argv,needle", [
    (["--bandwidth", "40furlongs"], "bandwidth"),
    (["--workers", "1"], "cluster.workers"),
    (["--p", "999999", "--gradient-size", "4KB"], "--p"),
    (["--scheme", "ring"], "--scheme"),
    (["--compute", "fast"], "duration"),
    (["--gradient-size", "17"], "--gradient-size"),
    (["--target-accuracy", "0.9"], "akosim train"),
    (["--compute-from", "/nonexistent/result.json"], "--compute-from"),
])
def test_user_mistakes_exit_2_with_one_line(capsys, argv: list[str], needle: str) -> None:
    defaults = {"--gradient-size": "40KB", "--compute": "10ms"}
    extra = [x for flag, value in defaults.items() if flag not in argv for x in (flag, value)]
    code, _, err = run_cli(capsys, *argv, *extra, "--quiet")
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0]
    assert "Traceback" not in err


def test_malformed_config_file_exits_2(capsys, tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[network]\nbandwidth = \n")
    code, _, err = run_cli(capsys, "--config", str(bad), *SMALL)
    assert code == 2 and "bad.toml" in err and len(err.strip().splitlines()) == 1


def test_help_lists_the_shared_flags_with_units() -> None:
    done = subprocess.run([sys.executable, "-m", "akosim", "--help"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0
    for flag in ("--workers", "--bandwidth", "--link-bandwidth", "--latency", "--p", "--ssp",
                 "--schedule", "--scheme", "--workload", "--optimizer", "--lr", "--batch-size",
                 "--seed", "--rounds", "--duration", "--target-accuracy", "--set", "--config"):
        assert flag in done.stdout
    for unit in ("40mbps", "5ms", "17MB"):
        assert unit in done.stdout
    assert "examples:" in done.stdout


def test_compute_from_an_akorun_result_gives_ps_servers_the_workers_mean(tmp_path: Path) -> None:
    from akosim.cli import compute_from_result

    result = tmp_path / "result.json"
    result.write_text(json.dumps({"workers": [{"compute_s_per_round": 0.01},
                                              {"compute_s_per_round": 0.03},
                                              {"compute_s_per_round": None}]}))
    assert compute_from_result(str(result), 4) == pytest.approx((0.01, 0.03, 0.02, 0.01))
