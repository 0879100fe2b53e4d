"""akorun command line: help text, the cluster file, rank resolution, and one-line errors.

Every user mistake must exit with status 2 and exactly one line on stderr
saying what was wrong (never a traceback). Subprocess tests use
`python -m akorun`, as a user would.
"""

from __future__ import annotations

import argparse
import os
import socket
import stat
import subprocess
import tomllib
from pathlib import Path

import pytest

from akocore.settings.cli_flags import add_shared_arguments
from akocore.settings.key_registry import KEYS, Tool
from akocore.settings.layers import Layer, Origin
from akocore.settings.schema import RunConfig
from akocore.settings.toml_io import config_from_dict
from akorun.errors import UsageError
from akorun.launching.cluster import (
    config_over,
    hosts_from_text,
    new_settings,
    read_cluster_file,
    resolve_rank,
    warn_if_readable_by_others,
    write_cluster_file,
)
from akorun.launching.commands import build_parser, launch_settings, worker_settings
from akorun.testing import REPO_ROOT, akorun_command, child_test_env

pytestmark = pytest.mark.timeout(60)


def akorun(*args: str, env: dict[str, str] | None = None,
           cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(akorun_command(*args), capture_output=True, text=True,
                          env=child_test_env(env), cwd=cwd or REPO_ROOT, timeout=60)


def assert_usage_error(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.fixture(scope="module")
def cluster_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cli") / "cluster.toml"
    result = akorun("init", "--workers", "3", "--rounds", "5", "--out", str(path))
    assert result.returncode == 0, result.stderr
    return path


# ------------------------------------------------------------------------- help


def test_top_level_help_lists_the_commands_with_examples() -> None:
    result = akorun("--help")
    assert result.returncode == 0
    for command in ("init", "worker", "ps", "launch", "examples:"):
        assert command in result.stdout


@pytest.mark.parametrize("command", ["worker", "ps", "launch", "init"])
def test_every_command_help_lists_the_shared_flags_with_units_and_examples(command: str) -> None:
    result = akorun(command, "--help")
    assert result.returncode == 0
    text = result.stdout
    for flag in ("--bandwidth", "--link-bandwidth", "--latency", "--p", "--ssp", "--rounds",
                 "--duration", "--workload", "--set", "--config"):
        assert flag in text, flag
    for unit_example in ("40mbps", "5ms", "300s"):
        assert unit_example in text, unit_example
    assert "examples:" in text
    if command != "init":
        assert "--peer-timeout" in text and "10s" in text


# ------------------------------------------------------------------------- errors


def test_init_writes_a_private_cluster_file_that_reads_back_as_the_same_run(
        cluster_file: Path) -> None:
    assert stat.S_IMODE(os.stat(cluster_file).st_mode) == 0o600
    cluster = read_cluster_file(cluster_file)
    assert cluster.config.cluster.workers == 3
    assert cluster.config.train.rounds == 5
    assert len(cluster.config.cluster.hosts) == 3
    assert all(h.startswith("127.0.0.1:") for h in cluster.config.cluster.hosts)
    assert len(cluster.settings.secret) == 64 and cluster.settings.peer_timeout_s == 10.0
    text = cluster_file.read_text()
    assert ("# the run's secret, from which every pair key derives (keep private: this file "
            'is mode 0600); "none" when each rank has its own key file') in text
    assert "[akorun]" in text and tomllib.loads(text)["akorun"]["run_id"]


@pytest.mark.parametrize("args, needles", [
    (["launch", "--workers", "x", "--out", "{tmp}/r"], ["cluster.workers", "'x'"]),
    (["launch", "--workers", "3", "--workload", "nope", "--out", "{tmp}/r"],
     ["unknown workload 'nope'", "digits-mlp"]),
    (["launch", "--workers", "3", "--bandwidth", "40furlongs", "--out", "{tmp}/r"],
     ["network.bandwidth", "40mbps"]),
    (["launch", "--workers", "3", "--peer-timeout", "5 parsecs", "--out", "{tmp}/r"],
     ["--peer-timeout"]),
    (["launch", "--workers", "3"], ["--out"]),
    (["launch", "--workers", "3", "--ssp", "-1", "--out", "{tmp}/r"], ["exchange.ssp"]),
    (["worker", "--rank", "0", "--config", "{tmp}/missing.toml"], ["not found"]),
    (["worker", "--rank", "0"], ["--config"]),
    (["worker", "--rank", "7", "--config", "{cluster}"], ["--rank 7", "0..2"]),
    (["worker", "--rank", "zero", "--config", "{cluster}"], ["--rank", "whole number"]),
    (["worker", "--config", "{cluster}"], ["no rank"]),
    (["ps", "--rank", "0", "--config", "{cluster}"], ["ps"]),
    (["worker", "--rank", "0", "--config", "{cluster}", "--set", "train.lr=-1"], ["train.lr"]),
    (["init", "--workers", "3", "--hosts", "a,b", "--out", "{tmp}/c.toml"], ["--hosts", "3"]),
    (["init", "--workers", "2", "--out", "{cluster}"], ["exists", "--force"]),
    (["nonsense"], ["invalid choice"]),
])
def test_user_mistakes_exit_2_with_one_line(args: list[str], needles: list[str],
                                            tmp_path: Path, cluster_file: Path) -> None:
    args = [a.replace("{tmp}", str(tmp_path)).replace("{cluster}", str(cluster_file))
            for a in args]
    assert_usage_error(akorun(*args), *needles)


def test_a_plain_run_config_is_not_a_cluster_file(tmp_path: Path) -> None:
    plain = tmp_path / "run.toml"
    plain.write_text("[cluster]\nworkers = 3\n")
    assert_usage_error(akorun("worker", "--rank", "0", "--config", str(plain)),
                       "[akorun]", "akorun init")


def test_a_world_size_that_disagrees_with_the_cluster_file_is_refused(
        cluster_file: Path) -> None:
    result = akorun("worker", "--config", str(cluster_file),
                    env={"RANK": "0", "WORLD_SIZE": "5"})
    assert_usage_error(result, "WORLD_SIZE=5", "3 ranks")


def test_conflicting_rank_variables_exit_2_with_one_line(cluster_file: Path) -> None:
    result = akorun("worker", "--config", str(cluster_file),
                    env={"RANK": "0", "SLURM_PROCID": "1"})
    assert_usage_error(result, "RANK=0", "SLURM_PROCID=1", "--rank")


def test_an_unwritable_out_is_refused_before_training(cluster_file: Path,
                                                       tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory\n")
    result = akorun("worker", "--rank", "0", "--config", str(cluster_file), "--quiet",
                    "--out", str(blocker / "run"))
    assert_usage_error(result, "--out", "cannot write there")


def test_a_secret_file_readable_by_others_gets_one_warning_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    private, shared = tmp_path / "private.keys", tmp_path / "shared.keys"
    for path, mode in ((private, 0o600), (shared, 0o644)):
        path.write_text("{}\n")
        path.chmod(mode)
    assert not warn_if_readable_by_others(private, "a key file")
    assert warn_if_readable_by_others(shared, "a key file")
    assert not warn_if_readable_by_others(shared, "a key file")  # once per file
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and str(shared) in lines[0] and "0644" in lines[0], lines


def test_a_port_in_use_exits_2_naming_the_port(cluster_file: Path) -> None:
    cluster = read_cluster_file(cluster_file)
    host, port = cluster.config.cluster.hosts[0].rsplit(":", 1)
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind((host, int(port)))
        holder.listen(1)
        result = akorun("worker", "--rank", "0", "--config", str(cluster_file), "--quiet")
    assert_usage_error(result, f"port {port}", "in use")


# ------------------------------------------------------------------------- pieces


def test_rank_comes_from_the_flag_then_akorun_then_torchrun_then_slurm() -> None:
    assert resolve_rank(1, {"AKORUN_RANK": "2", "RANK": "0"}, 3) == 1
    assert resolve_rank(None, {"AKORUN_RANK": "2", "RANK": "0"}, 3) == 2
    assert resolve_rank(None, {"RANK": "2", "WORLD_SIZE": "3", "SLURM_PROCID": "2"}, 3) == 2
    with pytest.raises(UsageError, match="conflicting rank variables: RANK=0 and SLURM_PROCID=2"):
        resolve_rank(None, {"RANK": "0", "WORLD_SIZE": "3", "SLURM_PROCID": "2"}, 3)
    assert resolve_rank(None, {"AKORUN_RANK": "1", "RANK": "0", "SLURM_PROCID": "2"}, 3) == 1
    assert resolve_rank(None, {"SLURM_PROCID": "2", "SLURM_NTASKS": "3"}, 3) == 2
    with pytest.raises(UsageError, match="SLURM_NTASKS=4"):
        resolve_rank(None, {"SLURM_PROCID": "2", "SLURM_NTASKS": "4"}, 3)
    with pytest.raises(UsageError, match="no rank"):
        resolve_rank(None, {}, 3)


def test_hosts_without_ports_get_the_base_port_and_repeated_hosts_the_next_ones() -> None:
    assert hosts_from_text("a,b,a", 3, 7000) == ("a:7000", "b:7000", "a:7001")
    assert hosts_from_text("a:9000,b:9001", 2) == ("a:9000", "b:9001")
    with pytest.raises(UsageError):
        hosts_from_text("a,b", 3)


def test_flags_over_a_cluster_file_keep_its_rounds_when_only_a_duration_is_given(
        tmp_path: Path) -> None:
    cfg = config_from_dict({"cluster": {"workers": 2}, "train": {"rounds": 7}})
    path = write_cluster_file(tmp_path / "c.toml", cfg, new_settings())
    cluster = read_cluster_file(path)
    parser = argparse.ArgumentParser()
    add_shared_arguments(parser)
    merged: RunConfig = config_over(cluster.config, cluster.tables,
                                    parser.parse_args(["--duration", "5s", "--lr", "0.2"]))
    assert merged.train.rounds == 7 and merged.train.duration_s == 5.0
    assert merged.train.lr == 0.2


def test_the_parser_builds_without_duplicate_flags() -> None:
    parser = build_parser()
    args = parser.parse_args(["worker", "--rank", "1", "--config", "c.toml", "--ssp", "2",
                              "--no-emulate"])
    assert args.rank == "1" and args.ssp == "2" and args.emulate is False


# ------------------------------------------------------------------------- settings layers


def _subparser(name: str) -> argparse.ArgumentParser:
    action = next(a for a in build_parser()._actions
                  if isinstance(a, argparse._SubParsersAction))
    return action.choices[name]


@pytest.mark.parametrize("command, tool", [("init", Tool.AKORUN_INIT),
                                           ("worker", Tool.AKORUN_RANK),
                                           ("ps", Tool.AKORUN_RANK),
                                           ("launch", Tool.AKORUN_LAUNCH)])
def test_each_command_takes_the_flags_the_registry_gives_it(command: str, tool: Tool) -> None:
    flags = {option for action in _subparser(command)._actions
             for option in action.option_strings}
    for key in KEYS:
        if key.flag:
            assert (key.flag in flags) == (tool in key.tools), (command, key.flag)


def test_worker_duration_clears_the_default_rounds_of_an_init_file(cluster_file: Path,
                                                                   tmp_path: Path) -> None:
    # cluster_file was written by `akorun init --rounds 5`: the file sets rounds
    args = build_parser().parse_args(["worker", "--rank", "0", "--config", str(cluster_file),
                                      "--duration", "40s"])
    assert worker_settings(args)[0].config.train.rounds == 5
    plain = tmp_path / "plain.toml"
    assert akorun("init", "--workers", "3", "--out", str(plain)).returncode == 0
    assert "# rounds = 100" in plain.read_text()
    args = build_parser().parse_args(["worker", "--rank", "0", "--config", str(plain),
                                      "--duration", "40s"])
    resolved, _ = worker_settings(args)
    assert resolved.config.train.rounds is None and resolved.config.train.duration_s == 40.0
    assert resolved.origin("train.rounds").layer is Layer.FLAG
    without = build_parser().parse_args(["worker", "--rank", "0", "--config", str(plain)])
    assert worker_settings(without)[0].config.train.rounds == 100


def test_launch_duration_clears_the_default_rounds_and_the_children_see_it(
        tmp_path: Path) -> None:
    args = build_parser().parse_args(["launch", "--workers", "3", "--duration", "40s",
                                      "--out", str(tmp_path)])
    resolved, settings = launch_settings(args)
    assert resolved.config.train.rounds is None
    path = write_cluster_file(tmp_path / "c.toml", resolved.config, settings,
                              resolved=resolved)
    assert read_cluster_file(path).config.train.rounds is None
    kept = build_parser().parse_args(["launch", "--workers", "3", "--duration", "40s",
                                      "--set", "train.rounds=50", "--out", str(tmp_path)])
    assert launch_settings(kept)[0].config.train.rounds == 50


def test_akorun_settings_layer_file_then_set_then_flag(cluster_file: Path) -> None:
    def rank_settings(*extra: str):  # type: ignore[no-untyped-def]
        args = build_parser().parse_args(["worker", "--rank", "0", "--config",
                                          str(cluster_file), *extra])
        return worker_settings(args)

    resolved, settings = rank_settings()
    assert settings.peer_timeout_s == 10.0 and settings.queue_messages == 64
    assert resolved.origin("akorun.secret").layer is Layer.FILE
    resolved, settings = rank_settings("--set", "akorun.peer_timeout=5s",
                                       "--set", "akorun.queue_messages=8")
    assert settings.peer_timeout_s == 5.0 and settings.queue_messages == 8
    assert resolved.origin("akorun.peer_timeout").layer is Layer.SET
    resolved, settings = rank_settings("--set", "akorun.peer_timeout=5s",
                                       "--peer-timeout", "7s", "--no-emulate")
    assert settings.peer_timeout_s == 7.0 and settings.emulate == "off"
    assert resolved.origin("akorun.peer_timeout") == Origin(Layer.FLAG, "by --peer-timeout")
