"""The faults real networks and machines make, on real kernel TCP between network namespaces.

Three ako ranks, each in its own network namespace, joined through a bridge in
a fourth; in-process emulation off, so every byte crosses the kernel. Faults:
an iptables cut between two ranks healed after 2 s, 10 s and 20 s, SIGSTOP/SIGCONT
shorter and longer than the peer timeout (and past the others' end with s = inf),
SIGKILL of one rank early, mid-send, mid-checkpoint and after its last round,
kill mid-checkpoint + --resume, a live rank stuck (the gate's give-up), 10 % random
loss (iptables statistic DROP, no netem here), a full checkpoint disk (a tiny
tmpfs, filled, then freed), and absences that leave hundreds of rounds owed
(fast rounds: a pause of 5 peer timeouts, a cut, a one-way cut, an interface
taken down), which the returning peer gets back folded into one message
(akorun.transport.sender.OwedGap). Every surviving rank must exit 0 with the same
number of rounds and replicas equal within `replica_rtol(rounds)` (plain
SGD). The stall (the longest gap between two round ends of a rank), the
stall after the return (the longest gap from the fault's end on), the owed
rounds folded and the final replica difference are measured and, when
FAULT_FIGURES names a file, appended there as JSON lines; they are figures,
not pass/fail thresholds (docs/reference/faults.md tabulates them).

The equality bound. Replicas of one run apply the same gradients in different
groupings (what arrived before each step), so float32 rounding makes them
drift apart like a random walk: about sqrt(rounds) roundings of one ulp
(2**-23 relative) each. A fault-free run of 36,000 rounds drifts 1.1e-5, one
of 100 rounds under 1e-6. The bound is

    replica_rtol(rounds) = 1e-5 + 4 * sqrt(rounds) * 2**-23

(1.5e-5 at 100 rounds, 1.1e-4 at 36,000), while one lost or doubled partial
moves a replica by 1e-3 or more on these workloads (2.6e-3 and 4.0e-3 in
the cases that found such bugs): the bound still tells loss from rounding.

Needs root, `ip`, `iptables` and network namespaces (tmpfs for the disk
case): skipped with the reason otherwise. The namespaces, bridge and veths
are the testbed's (akorun.launching.testbed.netns, unshaped here): names unique to
this process, removed in a finally, like the mount.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from akocore.settings.toml_io import config_from_dict
from akorun.launching.cluster import new_settings, write_cluster_file
from akorun.launching.testbed import netns
from akorun.runtime.records.checkpoint_orbax import unreferenced
from akorun.runtime.records.result_files import max_relative_difference
from akorun.testing import REPO_ROOT, akorun_command, child_test_env

# hang detectors, not speed limits: generous, since the suite runs two tests at a time
pytestmark = [pytest.mark.netns, pytest.mark.timeout(300)]

WORKERS = 3
PEER_TIMEOUT_S = 2.0
ROUND_SLEEP_S = 0.05  # paces the rounds (AKORUN_FAULT sleep_per_round) so faults land mid-run
FAULT_AT_ROUND = 15
FAST_ROUND_SLEEP_S = 0.01  # absences that leave hundreds of rounds owed
_ROUND = re.compile(r"\] \w+\s+round (\d+)")


def replica_rtol(rounds: int) -> float:
    """The replica-equality bound of a run of `rounds` rounds (see the module docstring)."""
    return 1e-5 + 4.0 * math.sqrt(max(rounds, 1)) * 2.0 ** -23


def _run(*command: str) -> None:
    subprocess.run(command, check=True, capture_output=True, timeout=20)


class Net:
    """Three rank namespaces on one bridge in a hub namespace (akorun.launching.testbed.netns),
    unshaped, with iptables faults."""

    def __init__(self) -> None:
        self.testbed = netns.NetnsTestbed(netns.TestbedNames.for_pid(os.getpid(), WORKERS))
        self.names = [self.testbed.names.namespace(r) for r in range(WORKERS)]
        self.addresses = [self.testbed.names.address(r) for r in range(WORKERS)]

    def up(self) -> None:
        self.testbed.up()
        self.iptables(0, "-L")  # fails here (skip) if iptables cannot work in a namespace

    def iptables(self, rank: int, *args: str) -> None:
        _run("ip", "netns", "exec", self.names[rank], "iptables", "-w", *args)

    def cut(self, a: int, b: int) -> None:
        self.iptables(a, "-A", "INPUT", "-s", self.addresses[b], "-j", "DROP")
        self.iptables(a, "-A", "OUTPUT", "-d", self.addresses[b], "-j", "DROP")

    def cut_one_way(self, a: int, b: int) -> None:
        """Drop what `b` sends to `a` (only at `a`'s input; `a`'s packets still go out)."""
        self.iptables(a, "-A", "INPUT", "-s", self.addresses[b], "-j", "DROP")

    def link(self, rank: int, state: str) -> None:
        """Take rank's interface down or bring it up again (its address is kept)."""
        device = self.testbed.names.device(rank)
        _run("ip", "netns", "exec", self.names[rank], "ip", "link", "set", device, state)

    def heal(self, rank: int) -> None:
        self.iptables(rank, "-F")

    def lose(self, rank: int, probability: float) -> None:
        self.iptables(rank, "-A", "INPUT", "-m", "statistic", "--mode", "random",
                      "--probability", f"{probability}", "-j", "DROP")

    def down(self) -> None:
        self.testbed.down()  # deleting the namespaces removes their veth ends and the bridge


@pytest.fixture
def net() -> Iterator[Net]:
    if os.geteuid() != 0:
        pytest.skip("needs root to create network namespaces and iptables rules")
    for tool in ("ip", "iptables"):
        if shutil.which(tool) is None:
            pytest.skip(f"needs the `{tool}` command (iproute2, iptables)")
    network = Net()
    try:
        try:
            network.up()
        except netns.TestbedError as error:
            pytest.skip(f"network namespaces, veth or bridges unavailable here: {error}")
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as error:
            stderr = getattr(error, "stderr", b"") or b""
            pytest.skip(f"network namespaces, veth, bridges or iptables unavailable here: "
                        f"{stderr.decode(errors='replace').strip() or error}")
        yield network
    finally:
        network.down()


class Run:
    """One akorun run of three ranks in the namespaces of `net`."""

    def __init__(self, net: Net, directory: Path, rounds: int, *flags: str,
                 faults: str = "", exchange: dict[str, Any] | None = None,
                 round_sleep_s: float = ROUND_SLEEP_S) -> None:
        self.net = net
        self.directory = directory
        self.rounds = rounds
        cfg = config_from_dict({
            "cluster": {"workers": WORKERS, "hosts": [f"{a}:7071" for a in net.addresses]},
            "exchange": exchange or {"p": 3, "ssp": 2},
            "train": {"workload": "digits-mlp", "optimizer": "sgd", "lr": 0.05,
                      "rounds": rounds, "eval_every": 100000},
        })
        self.path = write_cluster_file(directory / "cluster.toml", cfg,
                                       new_settings(peer_timeout_s=PEER_TIMEOUT_S,
                                                    emulate="off"))
        self.out = directory / "out"
        self.flags = flags
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        fault_env = f"sleep_per_round:{round_sleep_s}" + (f";{faults}" if faults else "")
        self.fault_end_s: float | None = None  # wall time the fault ended (stall after it)
        for rank in range(WORKERS):
            self.start(rank, fault_env)

    def start(self, rank: int, fault_env: str, *more_flags: str) -> None:
        """Start (or restart: the log is appended to) rank `rank` in its namespace."""
        command = ["ip", "netns", "exec", self.net.names[rank], *akorun_command(
            "worker", "--rank", str(rank), "--config", str(self.path), "--out",
            str(self.out), "--progress-every", "0.2s", "--queue-messages", "4", *self.flags,
            *more_flags)]
        with open(self.log_path(rank), "ab") as log:
            self.procs[rank] = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT,
                env=child_test_env({"AKORUN_FAULT": fault_env}))

    def log_path(self, rank: int) -> Path:
        return self.directory / f"rank-{rank}.log"

    def log(self, rank: int) -> str:
        return self.log_path(rank).read_text(encoding="utf-8", errors="replace")

    def wait_log(self, rank: int, text: str, timeout_s: float = 90) -> None:
        deadline = time.monotonic() + timeout_s
        while text not in self.log(rank):
            if time.monotonic() > deadline:
                raise AssertionError(f"rank {rank} never logged {text!r}:\n{self.logs()}")
            time.sleep(0.05)

    def round_of(self, rank: int) -> int:
        found = _ROUND.findall(self.log(rank))
        return int(found[-1]) if found else -1

    def wait_round(self, rank: int, round_: int, timeout_s: float = 90) -> None:
        deadline = time.monotonic() + timeout_s
        while self.round_of(rank) < round_:
            if time.monotonic() > deadline or self.procs[rank].poll() is not None:
                raise AssertionError(f"rank {rank} did not reach round {round_}:\n"
                                     f"{self.logs()}")
            time.sleep(0.05)

    def logs(self) -> str:
        return "\n".join(f"--- rank {r} ---\n{self.log(r)[-3000:]}" for r in range(WORKERS))

    def wait(self, ranks: list[int], timeout_s: float = 200) -> dict[int, int]:
        deadline = time.monotonic() + timeout_s
        codes = {}
        for rank in ranks:
            try:
                codes[rank] = self.procs[rank].wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise AssertionError(f"rank {rank} still running:\n{self.logs()}") from None
        return codes

    def kill(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
                proc.wait()

    def params(self, rank: int) -> np.ndarray:
        with np.load(self.out / f"worker-{rank}.npz") as data:
            return np.array(data["params"])

    def fault_ended(self) -> None:
        self.fault_end_s = time.time()

    def check(self, fault: str, ranks: list[int], *, held_round: int | None = None,
              exited: tuple[int, ...] = (), absent: tuple[int, ...] = ()) -> dict[str, Any]:
        """Exit 0, every round, replicas of `ranks` equal; the figures of this fault.
        `exited`: more ranks that must exit 0 but need not be equal. A gap ending at
        `held_round` (the test held every rank there) is left out of the stall."""
        codes = self.wait([*ranks, *exited])
        assert codes == {r: 0 for r in [*ranks, *exited]}, self.logs()
        results = {r: json.loads((self.out / f"worker-{r}.json").read_text()) for r in ranks}
        assert all(results[r].get("first_round", 0) + results[r]["rounds"] == self.rounds
                   for r in ranks), self.logs()
        difference = max_relative_difference([self.params(r) for r in ranks])
        stall_s, after_s = {}, {}
        for rank in ranks:
            ends = np.array([0.0, *results[rank]["round_end_s"]])
            gaps = np.diff(ends)
            if held_round is not None:
                gaps = np.delete(gaps, held_round - results[rank].get("first_round", 0))
            stall_s[rank] = round(float(np.max(gaps)), 3)
            if self.fault_end_s is not None and rank not in absent:
                # round ends as wall times: the training start is wall_s before the end
                # (the result is written right after its wall_s is taken: its mtime)
                written_s = (self.out / f"worker-{rank}.json").stat().st_mtime
                start_wall_s = written_s - results[rank]["wall_s"]
                later = np.flatnonzero(start_wall_s + ends[1:] > self.fault_end_s)
                if later.size:
                    after_s[rank] = round(float(np.max(np.diff(ends)[later])), 3)
        rounds = max(results[r].get("first_round", 0) + results[r]["rounds"] for r in ranks)
        figures = {"fault": fault, "stall_s": stall_s, "stall_after_return_s": after_s,
                   "rounds": rounds, "rtol": replica_rtol(rounds),
                   "replica_difference": difference,
                   "peer_timeouts": {r: results[r]["peer_timeouts"] for r in ranks},
                   "folded": {r: sum(c.get("overflow", 0)
                                     for c in results[r]["send_dropped"].values())
                              for r in ranks},
                   "wall_s": {r: round(results[r]["wall_s"], 2) for r in ranks}}
        _record(figures)
        assert difference <= replica_rtol(rounds), (figures, self.logs())
        return figures


def _record(figures: dict[str, Any]) -> None:
    """Append `figures` to the file FAULT_FIGURES names (if any), one JSON line."""
    report = os.environ.get("FAULT_FIGURES")
    if report:
        with open(report, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(figures) + "\n")


def _rounds_for(fault_s: float) -> int:
    """Enough rounds that the run outlasts the fault by a few peer timeouts."""
    return FAULT_AT_ROUND + int((fault_s + 3 * PEER_TIMEOUT_S) / ROUND_SLEEP_S)


HELD_ROUND = FAULT_AT_ROUND + 25  # long cuts: every rank waits here until the heal
ROUNDS_AFTER_HELD = 20


# about one peer timeout; past it, with full queues folded; and past the client's
# idle-connection limit (akorun.transport.datapath_client.IDLE_S, 15 s) with TCP's
# retransmission backoff (200 ms doubling: retries at 12.6 s, 25.4 s, ...) leaving the
# send outstanding when the cut heals, so it must go anew on a new connection
CUTS_S = (2.0, 10.0, 20.0)


@pytest.mark.parametrize("cut_s", CUTS_S)
def test_a_cut_between_two_ranks_healed_later_ends_equal(net: Net, tmp_path: Path,
                                                         cut_s: float) -> None:
    """Ranks 0 and 1 cut apart at round 15; they suspend each other and go on (rank 2
    still links them) for 25 rounds, folding what their full queues drop, then every
    rank waits before round 40 until the heal (so a 20 s cut needs no 400 rounds);
    once 0 and 1 hear each other again, 20 more rounds."""
    go = tmp_path / "go"
    run = Run(net, tmp_path, HELD_ROUND + ROUNDS_AFTER_HELD,
              faults=f"pause_before_round:{HELD_ROUND}:{go}")
    try:
        run.wait_round(0, FAULT_AT_ROUND)
        net.cut(0, 1)
        time.sleep(cut_s)
        net.heal(0)
        if cut_s > PEER_TIMEOUT_S:
            run.wait_log(0, "peer 1 speaks again")
            run.wait_log(1, "peer 0 speaks again")
        go.touch()
        figures = run.check(f"cut {cut_s:g} s", [0, 1, 2], held_round=HELD_ROUND)
        if cut_s > 4 * PEER_TIMEOUT_S:  # long enough that full queues folded (the old gap)
            assert figures["folded"][0] > 0 and figures["folded"][1] > 0, figures
    finally:
        run.kill()


@pytest.mark.parametrize("scheme,cut", [("diloco", "healed"), ("streaming-diloco", "healed"),
                                        ("diloco", "past the end")])
def test_a_diloco_cut_between_two_ranks_ends_with_one_anchor_or_fails_loudly(
        net: Net, tmp_path: Path, scheme: str, cut: str) -> None:
    """Ranks 0 and 2 of a DiLoCo run cut apart for 5 T (rank 1 still hears both): while
    their views differ a sync gives them different means (and the re-formed
    all-reduce stalls); after the heal the anchors are compared with the lowest live
    rank's and re-synced (akorun.runtime.recovery.anchor_sync). No rank hangs; each ends exit 0
    or exit 1 with a line naming why (left behind, replicas disagree, given up), and
    the ranks that exit 0 hold one model: never exit 0 with replicas apart. A cut that
    outlasts the run leaves 0 and 2 each training on without the other: at most one
    side holds the majority's model, the other fails (no majority)."""
    exchange: dict[str, Any] = {"scheme": scheme, "inner_steps": 4}
    if scheme == "streaming-diloco":
        exchange.update(fragments=2, overlap_steps=1)
    run = Run(net, tmp_path, 400, exchange=exchange, round_sleep_s=0.01)
    try:
        run.wait_round(0, FAULT_AT_ROUND)
        net.cut(0, 2)
        if cut == "healed":
            time.sleep(5 * PEER_TIMEOUT_S)
            net.heal(0)
        codes = run.wait([0, 1, 2])
        net.heal(0)
        passed = [rank for rank in range(WORKERS) if codes[rank] == 0]
        for rank in range(WORKERS):
            if codes[rank] != 0:
                assert codes[rank] == 1 and re.search(
                    r"syncs behind|replicas disagree|gave it up|never completed|no majority",
                    run.log(rank)), run.logs()
        if cut == "past the end":
            assert codes[0] != 0 or codes[2] != 0, run.logs()  # never both sides of the cut
        if scheme == "diloco" and passed:  # ends on a full sync: the parameters are the anchor
            first = run.params(passed[0])  # (streaming: the exit 0s say the anchors agree)
            for rank in passed[1:]:
                np.testing.assert_array_equal(run.params(rank), first, err_msg=run.logs())
        _record({"fault": f"{scheme} cut 0-2 " + (f"for {5 * PEER_TIMEOUT_S:g} s" if cut ==
                                                  "healed" else "past the end of the run"),
                 "exit_codes": codes, "resyncs": {
                     rank: run.log(rank).count("re-synced") for rank in range(WORKERS)}})
    finally:
        run.kill()


@pytest.mark.parametrize("pause_s", [0.5 * PEER_TIMEOUT_S, 2.5 * PEER_TIMEOUT_S])
def test_a_paused_rank_resumed_later_ends_equal(net: Net, tmp_path: Path,
                                                pause_s: float) -> None:
    run = Run(net, tmp_path, _rounds_for(pause_s))
    try:
        run.wait_round(1, FAULT_AT_ROUND)
        run.procs[1].send_signal(signal.SIGSTOP)
        time.sleep(pause_s)
        run.procs[1].send_signal(signal.SIGCONT)
        run.check(f"pause {pause_s:g} s", [0, 1, 2])
    finally:
        run.kill()


def test_a_sigkilled_rank_leaves_the_others_ending_equal(net: Net, tmp_path: Path) -> None:
    run = Run(net, tmp_path, _rounds_for(0.0))
    try:
        run.wait_round(2, FAULT_AT_ROUND)
        run.procs[2].send_signal(signal.SIGKILL)
        run.check("SIGKILL one rank", [0, 1])
    finally:
        run.kill()


KILLS = {"start": "2@kill_before_round:4",  # the SSP gate (s = 2): all ranks are training
         "mid-send": f"2@kill_mid_send:{FAULT_AT_ROUND}",
         "mid-checkpoint": f"2@kill_mid_checkpoint:{FAULT_AT_ROUND}",
         "end": "2@kill_at_end"}


@pytest.mark.parametrize("when", list(KILLS))
def test_a_rank_sigkilled_at_any_moment_leaves_the_others_ending_equal(
        net: Net, tmp_path: Path, when: str) -> None:
    """Rank 2 kills itself (AKORUN_FAULT, keyed by rounds) before round 4 (all ranks train by then),
    after ONE peer acknowledged a round's message, inside a checkpoint write, or
    after its last round; ranks 0 and 1 end equal."""
    rounds = FAULT_AT_ROUND + 10
    run = Run(net, tmp_path, rounds, "--checkpoint-every", "5", "--checkpoint-dir",
              str(tmp_path / "ckpt"), faults=KILLS[when])
    try:
        assert run.wait([2])[2] == -signal.SIGKILL, run.logs()
        assert "test hook: SIGKILL" in run.log(2)
        run.check(f"SIGKILL {when}", [0, 1])
        if when == "mid-checkpoint":
            assert unreferenced(tmp_path / "ckpt", 2), run.logs()
    finally:
        run.kill()


def test_a_rank_killed_mid_checkpoint_rejoins_with_resume_and_all_end_equal(
        net: Net, tmp_path: Path) -> None:
    """Rank 2 dies inside its checkpoint after round 15 (its temp file left behind,
    the checkpoint of round 15 in place); 0 and 1 go on past the peer timeout and wait
    before round 40; rank 2 restarts with --resume in its namespace, rejoins from a
    donor, and the three end equal; the stale temp file is gone."""
    go = tmp_path / "go"
    ckpt = tmp_path / "ckpt"
    held = FAULT_AT_ROUND + 25
    run = Run(net, tmp_path, held + ROUNDS_AFTER_HELD, "--checkpoint-every", "5",
              "--checkpoint-dir", str(ckpt),
              faults=f"2@kill_mid_checkpoint:{FAULT_AT_ROUND};"
                     f"0@pause_before_round:{held}:{go};1@pause_before_round:{held}:{go}")
    try:
        assert run.wait([2])[2] == -signal.SIGKILL, run.logs()
        assert unreferenced(ckpt, 2)
        run.wait_log(0, "peer 2 silent")
        run.start(2, f"sleep_per_round:{ROUND_SLEEP_S}", "--resume")
        run.wait_log(2, "rejoining")
        go.touch()
        run.check("SIGKILL mid-checkpoint, then --resume", [0, 1, 2], held_round=held)
        assert not unreferenced(ckpt, 2)
    finally:
        run.kill()


def test_a_rank_paused_with_unbounded_staleness_finishes_alone_without_hanging(
        net: Net, tmp_path: Path) -> None:
    """s = inf: rank 1 is stopped (SIGSTOP) at round 15; 0 and 2 never wait for it,
    finish, wait the finish grace and give it up; resumed after that, rank 1 finishes
    its rounds alone and exits 0 (no hang). 0 and 2 end equal; rank 1 misses what
    they sent after they left (docs/guide/failure.md says so), so it is not compared."""
    run = Run(net, tmp_path, FAULT_AT_ROUND + 40, exchange={"p": 3, "ssp": "inf"})
    try:
        run.wait_round(1, FAULT_AT_ROUND)
        run.procs[1].send_signal(signal.SIGSTOP)
        run.wait([0, 2])
        run.procs[1].send_signal(signal.SIGCONT)
        figures = run.check("pause past the others' end, s = inf", [0, 2], exited=(1,))
        assert all("finished without peer(s) [1]" in run.log(r) for r in (0, 2))
        late = max_relative_difference([run.params(0), run.params(1)])
        figures["late_rank_difference"] = late
        _record({"fault": "pause past the others' end, s = inf (rank 1 vs 0)",
                 "replica_difference": late})
    finally:
        run.kill()


def test_a_live_rank_that_makes_no_progress_is_taken_out_of_the_gate(
        net: Net, tmp_path: Path) -> None:
    """Rank 1 stays alive (answers heartbeats) but holds before round 15 (a stuck
    rank); 0 and 2 block at the SSP gate, and after GATE_STALL_TIMEOUTS peer timeouts
    without progress give it up (its answers do not put it back) and go on; released
    4 s later, rank 1 catches up and all three end equal."""
    go = tmp_path / "go"
    run = Run(net, tmp_path, FAULT_AT_ROUND + 30,
              faults=f"1@pause_before_round:{FAULT_AT_ROUND}:{go}")
    try:
        run.wait_log(0, "given up on")  # busy past 3 T, or blocking the gate 3 T
        run.wait_log(2, "given up on")
        assert run.round_of(0) > FAULT_AT_ROUND + 2  # the gate let them go on
        go.touch()
        run.check("live rank without progress (gate give-up)", [0, 1, 2])
    finally:
        run.kill()


def test_ten_percent_packet_loss_only_slows_the_run(net: Net, tmp_path: Path) -> None:
    for rank in range(WORKERS):
        net.lose(rank, 0.10)
    run = Run(net, tmp_path, 60)
    try:
        run.check("10% loss", [0, 1, 2])
    finally:
        run.kill()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs")
    mount = tmp_path / "disk"
    mount.mkdir()
    try:
        _run("mount", "-t", "tmpfs", "-o", "size=4m", f"akf{os.getpid()}", str(mount))
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as error:
        pytest.skip(f"cannot mount a tmpfs here: {error}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True, timeout=20)


def test_a_full_checkpoint_disk_is_survived_and_retried(net: Net, tmp_path: Path,
                                                        small_disk: Path) -> None:
    filler = small_disk / "filler"
    with open(filler, "wb", buffering=0) as handle:  # fill it: checkpoint writes fail
        try:
            while True:
                handle.write(b"\0" * 4096)
        except OSError:
            pass
    checkpoints = small_disk / "ckpt"
    freed = tmp_path / "disk-freed"  # every rank waits before round 40 until space is back
    run = Run(net, tmp_path, 60, "--checkpoint-every", "5", "--checkpoint-dir",
              str(checkpoints), faults=f"pause_before_round:40:{freed}")
    try:
        run.wait_round(0, 25)
        filler.unlink()  # space again: the next periodic checkpoint retries and succeeds
        freed.touch()
        run.check("full checkpoint disk", [0, 1, 2])
        assert all("checkpoint not written" in run.log(r) for r in range(WORKERS))
        assert sorted(p.name for p in checkpoints.iterdir() if p.name.startswith(".")) == []
        assert all((checkpoints / f"worker-{r}.ckpt").exists() for r in range(WORKERS))
    finally:
        run.kill()


# --------------------------------------------------------------------------- long absences
# Fast rounds (FAST_ROUND_SLEEP_S): an absence of 5 peer timeouts leaves several hundred
# rounds owed each way, which the returning peer gets back folded into one message.

LONG_S = 5 * PEER_TIMEOUT_S


def _fast_rounds() -> int:
    """Rounds enough that the run outlasts a long absence by two peer timeouts at least
    (at the pacing alone: the steps and the exchange only lengthen each round)."""
    return FAULT_AT_ROUND + int((LONG_S + 2 * PEER_TIMEOUT_S) / FAST_ROUND_SLEEP_S)


def test_a_long_pause_with_many_rounds_owed_ends_equal(net: Net, tmp_path: Path) -> None:
    run = Run(net, tmp_path, _fast_rounds(), round_sleep_s=FAST_ROUND_SLEEP_S)
    try:
        run.wait_round(1, FAULT_AT_ROUND)
        run.procs[1].send_signal(signal.SIGSTOP)
        time.sleep(LONG_S)
        run.procs[1].send_signal(signal.SIGCONT)
        run.fault_ended()
        figures = run.check(f"pause {LONG_S:g} s (5 T)", [0, 1, 2], absent=(1,))
        assert figures["folded"][0] > 0 and figures["folded"][2] > 0, figures
    finally:
        run.kill()


def test_a_long_cut_with_many_rounds_owed_ends_equal(net: Net, tmp_path: Path) -> None:
    run = Run(net, tmp_path, _fast_rounds(), round_sleep_s=FAST_ROUND_SLEEP_S)
    try:
        run.wait_round(0, FAULT_AT_ROUND)
        net.cut(0, 1)
        time.sleep(LONG_S)
        net.heal(0)
        run.fault_ended()
        figures = run.check(f"cut {LONG_S:g} s (5 T)", [0, 1, 2])
        assert figures["folded"][0] > 0 and figures["folded"][1] > 0, figures
    finally:
        run.kill()


def test_a_long_one_way_cut_ends_equal(net: Net, tmp_path: Path) -> None:
    run = Run(net, tmp_path, _fast_rounds(), round_sleep_s=FAST_ROUND_SLEEP_S)
    try:
        run.wait_round(0, FAULT_AT_ROUND)
        net.cut_one_way(0, 1)  # rank 1's packets to rank 0 are dropped
        time.sleep(LONG_S)
        net.heal(0)
        run.fault_ended()
        run.check(f"one-way cut {LONG_S:g} s (5 T)", [0, 1, 2])
    finally:
        run.kill()


def test_an_interface_down_for_long_ends_equal(net: Net, tmp_path: Path) -> None:
    """Rank 0's interface goes down: it and the others each go on alone, then meet."""
    run = Run(net, tmp_path, _fast_rounds(), round_sleep_s=FAST_ROUND_SLEEP_S)
    try:
        run.wait_round(0, FAULT_AT_ROUND)
        net.link(0, "down")
        time.sleep(LONG_S)
        net.link(0, "up")
        run.fault_ended()
        run.check(f"interface down {LONG_S:g} s (5 T)", [0, 1, 2])
    finally:
        run.kill()


def test_a_rank_killed_and_resumed_after_long_ends_equal(net: Net, tmp_path: Path) -> None:
    """Rank 2 is SIGKILLed at round 15 and restarted with --resume 4 T later (about
    four hundred rounds on): it rejoins from a donor and the three end equal."""
    ckpt = tmp_path / "ckpt"
    run = Run(net, tmp_path, _fast_rounds(), "--checkpoint-every", "5",
              "--checkpoint-dir", str(ckpt), faults=f"2@kill_after_round:{FAULT_AT_ROUND}",
              round_sleep_s=FAST_ROUND_SLEEP_S)
    try:
        assert run.wait([2])[2] == -signal.SIGKILL, run.logs()
        time.sleep(4 * PEER_TIMEOUT_S)
        run.start(2, f"sleep_per_round:{FAST_ROUND_SLEEP_S}", "--resume")
        run.wait_log(2, "rejoin")
        run.fault_ended()
        run.check(f"SIGKILL, --resume after {4 * PEER_TIMEOUT_S:g} s (4 T)", [0, 1, 2],
                  absent=(2,))
    finally:
        run.kill()
