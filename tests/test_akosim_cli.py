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
    """The rows, their record and trace are the same whatever ranks them (ranked by
    throughput, the plan trains nothing; the default ranking: tests/test_plan_learning.py)."""
    out_file, trace_file = tmp_path / "r.json", tmp_path / "t.json"
    code, out, _ = run_cli(capsys, "--workers", "4", "--bandwidth", "40mbps", "--p", "auto",
                           *SMALL, "--rank-by", "throughput", "--out", str(out_file),
                           "--trace", str(trace_file))
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
    (["--target-accuracy", "0.9"], "--gradient-size is for timing-only plans"),
    (["--compute-from", "/nonexistent/result.json"], "--compute-from"),
    (["--bandwidth", "40"], "--bandwidth 40: add a unit, e.g. 40mbps"),
    (["--latency", "20"], "--latency 20: add a unit, e.g. 20ms"),
    (["--link-bandwidth", "40,20,10"], "--link-bandwidth 40,20,10: add a unit, e.g. 40mbps"),
    (["--compute", "300"], "--compute 300: add a unit, e.g. 300ms"),
    (["--round-overhead", "3"], "--round-overhead 3: add a unit, e.g. 3ms"),
    (["--message-overhead", "2"], "--message-overhead 2: add a unit, e.g. 2ms"),
    (["--duration", "300"], "--duration 300: add a unit, e.g. 300s"),
    (["--set", "network.latency=5"], "--set network.latency=5: add a unit, e.g. 5ms"),
    (["--max-staleness", "-1"], "--max-staleness"),
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


# ------------------------------------------------------------------ commands and settings


def test_plan_is_the_default_command(capsys) -> None:
    argv = ["--workers", "4", "--scheme", "allreduce", *SMALL]
    code, implicit, _ = run_cli(capsys, *argv)
    assert code == 0
    code, explicit, _ = run_cli(capsys, "plan", *argv)
    assert code == 0 and explicit == implicit and "ring allreduce" in explicit


@pytest.mark.parametrize("command", ["plan", "train", "sweep"])
def test_every_command_help_shows_examples(capsys, command: str) -> None:
    code, out, _ = run_cli(capsys, command, "--help")
    assert code == 0 and "examples:" in out and "--workers" in out


def _shown(capsys, *argv: str) -> dict[str, str]:
    code, out, _ = run_cli(capsys, *argv, "--show-config")
    assert code == 0
    return {line.split(" = ")[0]: line.split(" = ", 1)[1] for line in out.splitlines()}


def test_show_config_prints_each_value_with_its_origin(capsys, tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text("[exchange]\nssp = 1\np = 2\n")
    shown = _shown(capsys, "--config", str(path), "--set", "exchange.ssp=2", "--p", "4")
    assert shown["exchange.ssp"] == "2  (by --set exchange.ssp=2)"
    assert shown["exchange.p"] == "[4]  (by --p)"
    assert shown["train.workload"] == '"synthetic-cnn"  (akosim plan default)'
    assert shown["train.rounds"] == ("until each configuration's round time settles, at most "
                                      "3000  (akosim plan default; --rounds N runs exactly N)")


def test_show_config_says_when_the_plan_chooses_s_with_p(capsys) -> None:
    assert _shown(capsys)["exchange.ssp"].startswith("chosen with p when the plan runs")
    assert _shown(capsys, "--ssp", "1")["exchange.ssp"] == "1  (by --ssp)"
    assert _shown(capsys, "--scheme", "ps")["exchange.ssp"] == "0  (akosim plan default)"
    assert _shown(capsys, "--compute", "20ms")["akosim.compute"] == '"20ms"  (by --compute)'


@pytest.mark.parametrize("command", ["plan", "train"])
def test_a_duration_clears_the_default_rounds_unless_a_layer_sets_rounds(
        capsys, tmp_path: Path, command: str) -> None:
    assert _shown(capsys, command, "--duration", "5s")["train.rounds"].startswith(
        "none  (cleared: train.duration given by --duration")
    path = tmp_path / "run.toml"
    path.write_text("[train]\nrounds = 7\n")
    assert _shown(capsys, command, "--config", str(path), "--duration", "5s")[
        "train.rounds"] == f"7  (in {path})"


def test_a_scheme_from_the_config_file_runs_that_scheme_only(capsys, tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text('[exchange]\nscheme = "allreduce"\n')
    code, out, _ = run_cli(capsys, "--config", str(path), "--workers", "4", *SMALL)
    assert code == 0 and "ring allreduce" in out and "ako p=1" not in out


def test_both_command_lines_share_one_usage_error() -> None:
    from akocore.cli_support import UsageError
    from akorun.errors import UsageError as AkorunUsageError
    from akosim.cli import UsageError as AkosimUsageError

    assert AkosimUsageError is UsageError and AkorunUsageError is UsageError
