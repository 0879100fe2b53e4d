"""`akorun launch --testbed netns` on this kernel: real TCP between namespaces, tc htb shaping.

Needs root, `ip`, `tc` and network namespaces: skipped with the reason
otherwise. Every run's namespaces carry its own pid-based tag; the tests check
that none of them (and no veth or bridge of the run) is left afterwards, after
a clean end and after a SIGTERM mid-run. The measured TCP rate between two
shaped namespaces is a figure (printed, and appended as a JSON line to the
file TESTBED_FIGURES names), not a pass/fail threshold; to rerun it:
TESTBED_FIGURES=figures.jsonl pytest -s tests/test_testbed_netns.py -k transfer
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from akocore.hosttools.shaping import plan_shaping
from akocore.records.results import RunResult
from akocore.records.testbed_record import TESTBED_RECORD_FILE
from akocore.records.testbed_record import TestbedRecord as Record
from akocore.settings.toml_io import config_from_dict
from akorun.errors import Interrupted
from akorun.launching.cluster import new_settings
from akorun.launching.local import LaunchOptions
from akorun.launching.testbed import netns, runner
from akorun.launching.testbed.probe import measure_transfer
from akorun.testing import REPO_ROOT, child_test_env

pytestmark = [pytest.mark.netns, pytest.mark.timeout(240)]

RATE = "20mbps"
RATE_BPS = 20e6
WORKERS = 3


@pytest.fixture(autouse=True)
def _requirements() -> None:
    missing = netns.missing_requirements()
    if missing:
        pytest.skip(f"the netns testbed {missing}")


def _leftovers(tag: str, short: str) -> list[str]:
    """Namespaces of the run still listed, and links of it in the root namespace."""
    names = [n for n in netns.namespaces() if n.startswith(tag)]
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True,
                           check=True).stdout
    return names + [line for line in links.splitlines() if short in line]


def _launch_command(out: Path, *flags: str) -> list[str]:
    return [sys.executable, "-m", "akorun", "launch", "--testbed", "netns", "--workers",
            str(WORKERS), "--bandwidth", RATE, "--workload", "digits-mlp", "--optimizer",
            "sgd", "--lr", "0.05", "--set", "train.eval_every=1000", "--out", str(out), *flags]


def _skip_if_the_kernel_refuses(stderr: str) -> None:
    if "testbed: `" in stderr:  # a command the kernel refused: no netns, veth, bridge or htb
        pytest.skip(f"the kernel refused the testbed: {stderr.strip()}")


def test_a_launch_on_the_testbed_ends_equal_records_its_shaping_and_leaves_nothing(
        tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = subprocess.run(_launch_command(out, "--rounds", "8", "--quiet"), cwd=REPO_ROOT,
                          env=child_test_env(), capture_output=True, text=True, timeout=200,
                          check=False)
    _skip_if_the_kernel_refuses(done.stderr)
    assert done.returncode == 0, done.stderr
    record = Record.from_json(json.loads((out / TESTBED_RECORD_FILE).read_text()))
    result = RunResult.from_json(json.loads((out / "result.json").read_text()))
    assert all(r.rounds == 8 and not r.failed for r in result.per_worker)
    assert result.max_relative_difference is not None
    assert result.max_relative_difference <= 1e-5
    assert [(q.rank, q.direction, q.ceil_bps) for q in record.queues] == [
        (r, d, RATE_BPS) for r in range(WORKERS) for d in ("uplink", "downlink")]
    assert all(q.burst_bytes > 0 and q.queue_limit_bytes > 0 for q in record.queues)
    assert [n.address for n in record.nodes] == [f"10.77.0.{r + 1}" for r in range(WORKERS)]
    assert not record.in_process_emulation and record.latency_ignored_s == 0.0
    applied = [c for c in record.commands if c.startswith("tc ")]
    assert sum("htb rate 20000000bit" in c for c in applied) == 4 * WORKERS  # root + leaf
    assert list(result.config["cluster"]["hosts"]) == [f"{n.address}:{n.port}"
                                                       for n in record.nodes]
    assert _leftovers(record.tag, record.bridge[:-2]) == []


def test_a_sigterm_mid_run_stops_the_ranks_and_leaves_nothing(tmp_path: Path) -> None:
    out = tmp_path / "run"
    log = tmp_path / "launch.log"
    with open(log, "wb") as handle:
        proc = subprocess.Popen(_launch_command(out, "--rounds", "100000", "--progress-every",
                                                "0.5s", "--kill-grace", "20s"),
                                cwd=REPO_ROOT, env=child_test_env(), stdout=handle,
                                stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 150
        # mid-run: a progress line shows every rank training (a SIGTERM that lands while a
        # rank is still starting: tests/test_launch_sigterm_startup.py)
        while not any(line.count("running r") == 3 for line in log.read_text().splitlines()):
            if proc.poll() is not None or time.monotonic() > deadline:
                _skip_if_the_kernel_refuses(log.read_text())
                raise AssertionError(f"the ranks never ran:\n{log.read_text()}")
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert code == 130, text
    record = Record.from_json(json.loads((out / TESTBED_RECORD_FILE).read_text()))
    assert _leftovers(record.tag, record.bridge[:-2]) == [], text
    result = RunResult.from_json(json.loads((out / "result.json").read_text()))
    assert all(0 < r.rounds < 100000 for r in result.per_worker), text


@pytest.fixture
def two_shaped_namespaces() -> Iterator[netns.NetnsTestbed]:
    names = netns.TestbedNames.for_pid(os.getpid(), 2)
    testbed = netns.NetnsTestbed(names)
    cfg = config_from_dict({"cluster": {"workers": 2}, "network": {"bandwidth": RATE}})
    try:
        try:
            testbed.up()
            testbed.apply(plan_shaping(cfg.network, [names.node(0), names.node(1)],
                                       downlink=True).commands)
        except netns.TestbedError as error:
            pytest.skip(f"the kernel refused the testbed: {error}")
        yield testbed
    finally:
        assert testbed.down() == []
        assert _leftovers(names.tag, names.short) == []


def test_a_tcp_transfer_between_shaped_namespaces_is_measured(
        two_shaped_namespaces: netns.NetnsTestbed) -> None:
    names = two_shaped_namespaces.names
    nbytes = 4_000_000
    transfer = measure_transfer(names.namespace(0), names.namespace(1), names.address(1),
                                nbytes)
    assert transfer.nbytes == nbytes and transfer.seconds > 0
    figure = {"figure": "testbed TCP goodput / shaped rate", "shaped_bps": RATE_BPS,
              "measured_bps": round(transfer.rate_bps), "bytes": nbytes,
              "ratio": round(transfer.rate_bps / RATE_BPS, 4)}
    print(figure)
    report = os.environ.get("TESTBED_FIGURES")
    if report:
        with open(report, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(figure) + "\n")


def test_what_a_killed_run_left_is_removed_and_a_live_runs_namespaces_are_kept() -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()  # its pid names a run that no longer lives
    stale = netns.TestbedNames.for_pid(dead.pid, 1)
    live = netns.TestbedNames.for_pid(os.getpid(), 1)
    created = [stale.hub, live.hub]
    try:
        for name in created:
            netns.run_command(("ip", "netns", "add", name))
        removed = netns.remove_stale()
        assert stale.hub in removed and live.hub not in removed
        assert live.hub in netns.namespaces() and stale.hub not in netns.namespaces()
    finally:
        for name in created:
            subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)


def test_a_sigterm_while_the_testbed_is_built_tears_it_down(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGTERM arrives (sent to this process) while the shaping is applied: the build
    stops with Interrupted and every namespace made so far is deleted."""
    built: list[netns.TestbedNames] = []

    def apply_then_signal(self: netns.NetnsTestbed, commands: object) -> None:
        built.append(self.names)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises before this ends

    monkeypatch.setattr(netns.NetnsTestbed, "apply", apply_then_signal)
    cfg = config_from_dict({"cluster": {"workers": 2}, "network": {"bandwidth": RATE}})
    previous = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Interrupted, match="SIGTERM while building"):
        runner.launch_on_testbed(cfg, new_settings(), LaunchOptions(out_dir=tmp_path / "run",
                                                                    quiet=True),
                                 runner.TestbedOptions())
    assert signal.getsignal(signal.SIGTERM) == previous
    assert built and _leftovers(built[0].tag, built[0].short) == []
    assert not (tmp_path / "run").exists()
