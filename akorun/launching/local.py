"""`akorun launch`: N ranks on this machine as subprocesses, one merged result.

This module owns the single-machine run: it writes ``DIR/cluster.toml``
(loopback, free ports, a fresh run id and secret), starts one
``python -m akorun worker|ps`` per rank with its output in ``DIR/worker-R.log``,
shows one progress line (polling every rank's read-only ``/status``), waits
for all, and merges ``DIR/result.json`` (akorun.launching.run_merge). Ctrl-C or SIGTERM
stops the children gracefully: SIGTERM to each (they finish their round,
flush and checkpoint), then SIGKILL after a grace period (the log says so). A
rank stopped before it joined exits 130 after telling the peers that are up
that it leaves, so that none waits for it (akorun.runtime.lifecycle.join); while
stopping, that exit (and a rank our SIGTERM ended before it could catch
signals) counts as interrupted, not failed. The exit status is
non-zero if any rank failed, and the message names it and shows the tail of
its log.

The public call ``akorun.launch(out="runs/demo", workers=3)``
(`akorun.run_api.launch`) runs here (keyword settings, the merged RunResult back).

The ranks die with the launcher: they share one process group of their own
(``kill -- -PGID`` stops them all; the terminal's Ctrl-C reaches only the
launcher, which stops them as above), and each asks Linux for SIGTERM when the
launcher dies (prctl PR_SET_PDEATHSIG, set between fork and exec), so even a
SIGKILLed launcher leaves no rank running: each finishes its round, writes its
record and exits, and ``akorun merge DIR`` makes the result from those records.
The ranks see ``AKORUN_LAUNCHER_PID`` and leave the merge to the launcher.

Where the ranks run is a `Placement`: loopback by default; the real-network
testbed (akorun.launching.testbed) gives each rank a host in its own network namespace,
a command prefix that starts it there, and a way to poll its /status.

Children get ``JAX_PLATFORMS=cpu`` and, when the ranks share the cores, a share of
them each for XLA's thread pool (akocore.rank_threads: ``NPROC`` = cores // ranks,
single-threaded XLA flags at one thread; the user's NPROC, XLA_FLAGS or
AKO_THREADS_PER_RANK win), so N processes do not oversubscribe the cores.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from akocore.rank_threads import rank_thread_env
from akocore.records.results import RunResult
from akocore.settings.layers import ResolvedSettings
from akocore.settings.schema import RunConfig
from akocore.workloads.nonfinite import is_nonfinite_stop
from akorun.errors import EXIT_INTERRUPTED, Interrupted, RunError, UsageError
from akorun.launching.cluster import AkorunSettings, loopback_hosts, with_hosts, write_cluster_file
from akorun.launching.island_layout import island_layout
from akorun.launching.progress_line import ProgressBoard
from akorun.launching.run_merge import MergeOutcome, merge_ranks
from akorun.runtime.node_plan import role_of
from akorun.transport.keys import restrict_new_files

LOG_TAIL_LINES = 15
GRACE_RAN_OUT = "the kill grace ran out"  # launch's log line when it must SIGKILL ranks
LAUNCHER_PID_ENV = "AKORUN_LAUNCHER_PID"  # set in every rank launch starts: it merges
FOLLOWER_GRACE_S = 10.0  # a follower outliving its island's leader this long is killed
PR_SET_PDEATHSIG = 1  # linux/prctl.h


@dataclass(frozen=True)
class LaunchOptions:
    out_dir: Path
    quiet: bool = False
    progress_every_s: float = 2.0
    kill_grace_s: float = 20.0
    timeout_s: float | None = None
    worker_args: tuple[str, ...] = ()  # extra flags for every child
    env: dict[str, str] = field(default_factory=dict)  # extra environment for every child


StatusProbe = Callable[[int, str], "dict[str, Any] | None"]  # (rank, url) -> /status


@dataclass(frozen=True)
class Placement:
    """Where the ranks run: their hosts, the command prefix that starts rank R there,
    and how the launcher reads rank R's /status (default: loopback, no prefix)."""

    hosts: tuple[str, ...]
    prefixes: tuple[tuple[str, ...], ...] = ()  # one per rank, or none
    status: StatusProbe | None = None

    def prefix(self, rank: int) -> tuple[str, ...]:
        return self.prefixes[rank] if self.prefixes else ()


RUN_FILES = ("cluster.toml", "result.json")  # a directory holding one of these holds a run


def check_run_directory(out_dir: Path, *, force: bool) -> None:
    """UsageError when `out_dir` is not a directory, or already holds a run (no --force);
    one that cannot be made or written is akocore.cli_support.check_out_directory's."""
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"--out {out_dir}: is a file; give a directory for the run")
    if not force and out_dir.is_dir():
        held = [name for name in RUN_FILES if (out_dir / name).exists()]
        if held or any(out_dir.glob("worker-*.json")):
            what = ", ".join(held) or "worker results"
            raise UsageError(f"--out {out_dir}: already holds a run ({what}); pass --force "
                             f"to overwrite it or choose another directory")


def host_cores() -> int:
    """The cores this process may run on (its CPU affinity, as XLA counts them)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def child_env(workers: int, extra: dict[str, str], platform: str = "cpu") -> dict[str, str]:
    """The environment of `workers` processes on this host: CPU JAX unless `platform`
    says otherwise (each process's devices are akorun.launching.devices'), their share of
    the cores for XLA (akocore.rank_threads), the package on PYTHONPATH, then `extra`."""
    env = dict(os.environ)
    if platform == "cpu":
        env.setdefault("JAX_PLATFORMS", "cpu")
    try:
        env.update(rank_thread_env(host_cores(), workers, {**env, **extra}))
    except ValueError as error:
        raise UsageError(str(error)) from None
    package_root = str(Path(__file__).resolve().parent.parent)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if package_root not in paths:
        env["PYTHONPATH"] = os.pathsep.join([package_root, *paths])
    env.update(extra)
    return env


def share_host_cores(hosts: Sequence[str], rank: int) -> dict[str, str]:
    """For a rank started by hand (`akorun worker`): set, in this process's environment,
    its share of the host's cores for XLA among the ranks of `hosts` ("host:port") that
    name its host (akocore.rank_threads; what `akorun launch` gives its children, which
    is kept). Called before JAX starts its CPU client. The variables it set."""
    from akorun.runtime.endpoints import split_host

    mine = split_host(hosts[rank])[0]
    sharing = sum(1 for entry in hosts if split_host(entry)[0] == mine)
    try:
        added = rank_thread_env(host_cores(), sharing, os.environ)
    except ValueError as error:
        raise UsageError(str(error)) from None
    os.environ.update(added)
    return added


def status_of(url: str) -> dict[str, Any] | None:
    """A rank's read-only /status, or None when it does not answer."""
    try:
        with urllib.request.urlopen(url + "/status", timeout=0.5) as response:
            value = json.loads(response.read())
            return value if isinstance(value, dict) else None
    except (OSError, ValueError):
        return None


def _libc_prctl() -> Callable[..., int] | None:
    """libc's prctl on Linux (looked up before any fork), else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl  # type: ignore[no-any-return]
    except (OSError, AttributeError):
        return None


def dies_with_parent(parent_pid: int) -> Callable[[], None]:
    """A Popen preexec_fn: the child gets SIGTERM when its parent (`parent_pid`) dies,
    and SIGTERM at once when the parent died before the child could ask (no-op off Linux)."""
    prctl = _libc_prctl()

    def preexec() -> None:
        if prctl is None:
            return
        prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent_pid:  # the parent is gone already
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join("    " + line for line in text[-lines:])


class Launcher:
    """Starts, watches and stops the ranks of one loopback run."""

    def __init__(self, cfg: RunConfig, settings: AkorunSettings, options: LaunchOptions,
                 resolved: ResolvedSettings | None = None, placement: Placement | None = None):
        self.options = options
        self.placement = placement or Placement(loopback_hosts(cfg.cluster.workers))
        self.cfg = with_hosts(cfg, self.placement.hosts)
        self.settings = settings
        self.resolved = resolved  # where each setting came from (the cluster file says so)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.process_group: int | None = None  # the ranks' (rank 0's pid)
        self.stopping = False
        self.stop_signal_time_s: float | None = None
        self.killed_after_grace = False  # the grace ran out: SIGKILL (said once in the log)
        # the processes of each rank (its island's) and their devices; a mistake before
        # anything is written
        self.layout = island_layout(self.cfg, settings, self.placement.hosts)
        self.followers: list[tuple[int, int, subprocess.Popen[bytes]]] = []  # (rank, p, proc)
        self.leader_gone_s: dict[int, float] = {}  # rank -> when its leader was seen gone

    @property
    def cluster_path(self) -> Path:
        return self.options.out_dir / "cluster.toml"

    def start(self) -> None:
        out = self.options.out_dir
        restrict_new_files()  # logs, results and parameters: the owner's only
        out.mkdir(parents=True, exist_ok=True)
        write_cluster_file(self.cluster_path, self.cfg, self.settings, resolved=self.resolved)
        n = self.cfg.cluster.workers
        layout = self.layout
        env = child_env(len(layout.processes), self.options.env, self.settings.platform)
        env[LAUNCHER_PID_ENV] = str(os.getpid())
        preexec = dies_with_parent(os.getpid())
        for slot, (rank, process) in enumerate(layout.processes):
            command = [*self.placement.prefix(rank), sys.executable, "-m", "akorun",
                       role_of(self.cfg, rank), "--rank", str(rank), "--config",
                       str(self.cluster_path), "--out", str(out),
                       *self.options.worker_args]
            own_env = {**env, **layout.env(slot, env)}
            name = f"worker-{rank}.log" if process == 0 else f"worker-{rank}.p{process}.log"
            with open(out / name, "wb") as log_file:
                proc = self._popen(command, log_file, own_env, preexec)
            if process == 0:
                self.procs.append(proc)
            else:
                self.followers.append((rank, process, proc))
            if self.process_group is None:
                self.process_group = proc.pid
        assert len(self.procs) == n

    def _popen(self, command: list[str], log_file: Any, env: dict[str, str],
               preexec: Callable[[], None]) -> subprocess.Popen[bytes]:
        """One rank in the ranks' process group (a new one for rank 0: not the terminal's
        foreground group, so Ctrl-C reaches the launcher only), dying with the launcher."""
        try:
            return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log_file,
                                    stderr=subprocess.STDOUT, env=env, preexec_fn=preexec,
                                    process_group=self.process_group or 0)
        except PermissionError:  # the group is gone (its ranks all exited): a new one
            return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log_file,
                                    stderr=subprocess.STDOUT, env=env, preexec_fn=preexec,
                                    process_group=0)

    def _on_signal(self, signum: int, frame: object) -> None:
        if not self.stopping:
            self.stopping = True
            self.stop_signal_time_s = time.monotonic()
            sys.stderr.write(f"[launch] {signal.Signals(signum).name}: stopping the ranks "
                             f"(SIGTERM, SIGKILL after {self.options.kill_grace_s:g} s)\n")
            self.terminate()
        else:
            self.kill()

    def terminate(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    proc.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass

    def kill(self) -> None:
        for proc in self.all_procs():
            if proc.poll() is None:
                try:
                    proc.kill()
                except ProcessLookupError:
                    pass

    def all_procs(self) -> list[subprocess.Popen[bytes]]:
        """Every process started: the ranks (their island leaders) and the followers."""
        return [*self.procs, *(proc for _, _, proc in self.followers)]

    def end_orphaned_followers(self, now_s: float) -> None:
        """SIGKILL the followers of a leader gone for FOLLOWER_GRACE_S (a leader's normal
        end tells them to stop; one that died could not)."""
        for rank, _, proc in self.followers:
            if proc.poll() is not None or self.procs[rank].poll() is None:
                continue
            gone_s = self.leader_gone_s.setdefault(rank, now_s)
            if now_s - gone_s > FOLLOWER_GRACE_S:
                proc.kill()

    def wait(self) -> None:
        """Wait for every rank, printing progress; enforce the grace and the timeout."""
        options = self.options
        start_s = time.monotonic()
        next_progress_s = start_s + options.progress_every_s
        urls = [f"http://{h}" for h in self.cfg.cluster.hosts]
        probe = self.placement.status or (lambda rank, url: status_of(url))
        board = ProgressBoard(self.cfg.train.rounds, options.out_dir)
        while any(proc.poll() is None for proc in self.all_procs()):
            time.sleep(0.1)
            now = time.monotonic()
            self.end_orphaned_followers(now)
            if options.timeout_s is not None and now - start_s > options.timeout_s \
                    and not self.stopping:
                sys.stderr.write(f"[launch] timeout of {options.timeout_s:g} s: stopping\n")
                self.stopping = True
                self.stop_signal_time_s = now
                self.terminate()
            if self.stopping and self.stop_signal_time_s is not None \
                    and now - self.stop_signal_time_s > options.kill_grace_s:
                if not self.killed_after_grace:
                    self.killed_after_grace = True
                    running = [r for r, proc in enumerate(self.procs) if proc.poll() is None]
                    sys.stderr.write(f"[launch] {GRACE_RAN_OUT} ({options.kill_grace_s:g} s "
                                     f"after SIGTERM): SIGKILL to rank(s) {running}\n")
                self.kill()
            if not options.quiet and now >= next_progress_s and not self.stopping:
                codes = [proc.poll() for proc in self.procs]
                statuses = [probe(rank, url) if code is None else None
                            for rank, (url, code) in enumerate(zip(urls, codes, strict=True))]
                sys.stderr.write(board.line(statuses, codes) + "\n")
                next_progress_s = now + options.progress_every_s

    def merge(self) -> MergeOutcome:
        """OUT/result.json from the ranks' records of this run and their exit statuses
        (a rank with no record is merged as failed, the result marked partial)."""
        codes = {rank: proc.returncode for rank, proc in enumerate(self.procs)}
        return merge_ranks(self.options.out_dir, config=self.cfg, run_id=self.settings.run_id,
                           exit_codes=codes, allow_empty=True)

    def failures(self) -> list[tuple[int, int, str]]:
        """(rank, exit status, tail of its log) of every rank that failed. While stopping,
        a rank that says it was interrupted (exit 130: stopped before it joined), or that
        our SIGTERM ended before it could catch signals, stopped as asked: not a failure."""
        failed = []
        for rank, proc in enumerate(self.procs):
            if self.stopping and proc.returncode in (EXIT_INTERRUPTED, -signal.SIGTERM):
                continue
            if proc.returncode != 0:
                log_path = self.options.out_dir / f"worker-{rank}.log"
                failed.append((rank, proc.returncode, f"{log_path}:\n{_tail(log_path)}"))
        for rank, process, proc in self.followers:
            if proc.returncode != 0 and rank not in {entry[0] for entry in failed} \
                    and rank not in self.leader_gone_s:
                log_path = self.options.out_dir / f"worker-{rank}.p{process}.log"
                failed.append((rank, proc.returncode, f"{log_path}:\n{_tail(log_path)}"))
        return failed


def run_failure_cause(merged: RunResult) -> str:
    """What made the run fail, as the first words of its error line, when a rank's
    record says so (its loss went NaN/Inf: the line of akocore.workloads.nonfinite); else ""."""
    for record in merged.per_worker:
        if is_nonfinite_stop(record.stop_reason):
            return f"{record.stop_reason}; "
    return ""


def summary_table(merged: RunResult) -> str:
    lines = [f"{'rank':>4} {'role':>6} {'rounds':>7} {'ms/round':>9} {'compute ms':>10} "
             f"{'wait ms':>8} {'MB sent':>8} {'accuracy':>8}"]

    def ms(value: float | None) -> str:
        return f"{value * 1e3:.2f}" if value is not None else "-"

    for result in merged.per_worker:
        accuracy = result.final_accuracy
        lines.append(
            f"{result.rank:>4} {result.role:>6} "
            f"{'-' if result.failed else result.rounds:>7} {ms(result.round_time_s):>9} "
            f"{ms(result.compute_s_per_round):>10} {ms(result.wait_s_per_round):>8} "
            f"{'-' if result.failed else f'{result.bytes_sent / 1e6:.2f}':>8} "
            f"{(f'{accuracy:.4f}' if accuracy is not None else '-'):>8}")
    lines.append(f"samples/s {merged.samples_per_s or 0:.1f}   max relative difference "
                 f"between replicas {merged.max_relative_difference or 0:.3g}")
    return "\n".join(lines)


def launch(cfg: RunConfig, settings: AkorunSettings, options: LaunchOptions, *,
           resolved: ResolvedSettings | None = None,
           placement: Placement | None = None) -> RunResult:
    """Run every rank, merge the results; RunError naming the failed ranks, or the ranks
    whose final parameters hold NaN or Inf.

    With `resolved`, the cluster file writes the settings no layer chose as
    comments (their built-in defaults), as `akorun init` does. `placement`:
    where the ranks run (default: loopback subprocesses).
    """
    launcher = Launcher(cfg, settings, options, resolved, placement)
    previous = {signum: signal.signal(signum, launcher._on_signal)
                for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        launcher.start()
        if not options.quiet:
            sys.stderr.write(f"[launch] {cfg.cluster.workers} ranks, cluster file "
                             f"{launcher.cluster_path}, logs {options.out_dir}/worker-R.log\n")
        launcher.wait()
    finally:
        launcher.kill()
        for proc in launcher.all_procs():
            proc.wait()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    outcome = launcher.merge()
    merged = outcome.result
    if not options.quiet:
        sys.stderr.write(summary_table(merged) + "\n")
        sys.stderr.write(f"[launch] result: {options.out_dir / 'result.json'}\n")
    failed = launcher.failures()
    if failed:
        names = ", ".join(f"rank {rank} (exit status {code})" for rank, code, _ in failed)
        tails = "\n".join(tail for _, _, tail in failed)
        raise RunError(f"{run_failure_cause(merged)}{names} failed; the end of their "
                       f"logs:\n{tails}")
    if outcome.nonfinite is not None:  # every rank exited 0, yet no usable model
        raise RunError(f"{outcome.nonfinite}; the results are in "
                       f"{options.out_dir / 'result.json'}")
    if launcher.stopping:
        raise Interrupted("stopped before the end (signal or --timeout); every rank stopped "
                          "after its current round (a rank still starting, with 0 rounds) and "
                          f"the results are in {options.out_dir / 'result.json'}")
    return merged


def worker_flags(*, progress_every_s: float | None = None, checkpoint_dir: str | None = None,
                 quiet: bool = False, extra: Sequence[str] = ()) -> tuple[str, ...]:
    """The process flags every child rank gets (its settings come from the cluster file)."""
    flags: list[str] = []
    if quiet:
        flags.append("--quiet")
    if progress_every_s is not None:
        flags += ["--progress-every", f"{progress_every_s}s"]
    if checkpoint_dir is not None:
        flags += ["--checkpoint-dir", checkpoint_dir]
    flags += list(extra)
    return tuple(flags)
