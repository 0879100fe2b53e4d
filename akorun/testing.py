"""Helpers for multi-process tests and benchmarks of akorun (not used by akorun itself).

`SinkHost` stands in for a worker behind a real akorun.transport.server.Server.
`one_rank_context` gives a test of one collaborator of a rank (runtime.lifecycle.join, ...) the
`RankContext` the worker would, with a role whose node exists once `BuiltWhen` says so.
`LocalCluster` writes a loopback cluster file with free ports into a
directory and starts ranks as ``python -m akorun worker|ps`` subprocesses
(single-threaded XLA, the project's JAX compilation cache), so a test can
kill, restart and inspect individual ranks. `status` reads a rank's
read-only ``/status``; `wait_for` polls a condition with a deadline instead
of sleeping a fixed time.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from akocore.messages import Partial
from akocore.rank_threads import NPROC_ENV, SINGLE_THREAD_XLA_FLAGS
from akocore.settings.schema import RunConfig
from akocore.settings.toml_io import config_from_dict
from akorun.launching.cluster import (
    AkorunSettings,
    loopback_hosts,
    new_settings,
    read_cluster_file,
    with_hosts,
    write_cluster_file,
)
from akorun.launching.local import child_env
from akorun.metrics import Metrics, render_prometheus
from akorun.runtime.lifecycle.phase import PhaseMachine
from akorun.runtime.node_plan import role_of
from akorun.runtime.rank_context import RankContext
from akorun.transport.control import ControlError, ControlKind
from akorun.transport.keys import RequestVerifier, RunKeys, Signer
from akorun.transport.routing import ControlAnswerBody, ControlTable

REPO_ROOT = Path(__file__).resolve().parent.parent
RANK_VARIABLES = ("AKORUN_RANK", "AKORUN_WORLD_SIZE", "RANK", "WORLD_SIZE", "SLURM_PROCID",
                  "SLURM_NTASKS", "JOB_COMPLETION_INDEX", "AKORUN_RENDEZVOUS")


class BuiltWhen:
    """A stand-in role whose node exists once `built` holds anything (a Join's test)."""

    def __init__(self, built: Sequence[object] = ()) -> None:
        self.built = built

    @property
    def node(self) -> object | None:
        return object() if self.built else None


def one_rank_context(rank: int, peers: Sequence[int], *, role: Any = None,
                     phase: PhaseMachine | None = None, **settings: Any) -> RankContext:
    """The context of rank `rank` for a test of one of its collaborators: its own metrics,
    phase and events, background tasks refused; `settings` are RankContext fields."""
    def spawn(coroutine: Any) -> None:
        coroutine.close()
        raise AssertionError("this test's rank starts no background task")

    chosen: Any = role if role is not None else BuiltWhen()  # a stand-in, not a Role
    return RankContext(rank=rank, peers=tuple(peers), role=chosen,
                       phase=phase if phase is not None else PhaseMachine(),
                       metrics=Metrics(rank, "worker"), spawn=spawn, **settings)


def child_test_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for akorun children in tests: CPU, one XLA thread, shared JAX cache,
    no rank variables or fault hooks inherited from the caller."""
    env = {k: v for k, v in child_env(1, {}).items() if k not in RANK_VARIABLES}
    env["XLA_FLAGS"] = SINGLE_THREAD_XLA_FLAGS
    env[NPROC_ENV] = "1"  # XLA's thread pool: one thread, as launch gives ranks sharing cores
    env["JAX_PLATFORMS"] = "cpu"
    env.setdefault("AKO_JAX_CACHE", str(REPO_ROOT / ".cache" / "jax"))
    env.pop("AKORUN_FAULT", None)
    env.update(extra or {})
    return env


def akorun_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "akorun", *args]


def wait_for(condition: Callable[[], Any], timeout_s: float, what: str,
             poll_s: float = 0.05) -> Any:
    """Poll `condition` until it returns something truthy; AssertionError after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(poll_s)


def launched_rank_status(cluster_file: Path, rank: int) -> dict[str, Any]:
    """The ``/status`` of rank `rank` of a run `akorun launch` started from `cluster_file`,
    or {} while it does not answer."""
    hosts = read_cluster_file(cluster_file).config.cluster.hosts
    try:
        with urllib.request.urlopen(f"http://{hosts[rank]}/status", timeout=2) as reply:
            return dict(json.loads(reply.read()))
    except OSError:
        return {}


class LocalCluster:
    """A loopback run in `directory`: cluster file, rank processes, their logs and outputs."""

    def __init__(self, directory: Path, tables: dict[str, Any], *,
                 settings: AkorunSettings | None = None) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        cfg = config_from_dict(tables)
        self.config: RunConfig = with_hosts(cfg, loopback_hosts(cfg.cluster.workers))
        self.settings = settings or new_settings(peer_timeout_s=3.0)
        self.path = write_cluster_file(self.directory / "cluster.toml", self.config,
                                       self.settings)
        self.out = self.directory / "out"
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.starts: dict[int, int] = {}

    @property
    def workers(self) -> int:
        return self.config.cluster.workers

    def url(self, rank: int) -> str:
        return f"http://{self.config.cluster.hosts[rank]}"

    def log_path(self, rank: int) -> Path:
        return self.directory / f"rank-{rank}.{self.starts.get(rank, 0)}.log"

    def start(self, rank: int, *flags: str, env: dict[str, str] | None = None) -> None:
        self.starts[rank] = self.starts.get(rank, 0) + 1
        command = akorun_command(role_of(self.config, rank), "--rank", str(rank), "--config",
                                 str(self.path), "--out", str(self.out), "--progress-every",
                                 "1s", *flags)
        with open(self.log_path(rank), "wb") as log_file:
            self.procs[rank] = subprocess.Popen(command, stdout=log_file,
                                                stderr=subprocess.STDOUT, env=child_test_env(env),
                                                cwd=REPO_ROOT)

    def start_all(self, *flags: str, env: dict[str, str] | None = None,
                  ranks: Sequence[int] | None = None) -> None:
        for rank in ranks if ranks is not None else range(self.workers):
            self.start(rank, *flags, env=env)

    def status(self, rank: int, digest: bool = False) -> dict[str, Any] | None:
        query = "?digest=1" if digest else ""
        try:
            with urllib.request.urlopen(self.url(rank) + "/status" + query,
                                        timeout=2.0) as response:
                value = json.loads(response.read())
                return value if isinstance(value, dict) else None
        except (OSError, ValueError):
            return None

    def wait(self, rank: int, timeout_s: float) -> int:
        proc = self.procs[rank]
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"rank {rank} still running after {timeout_s:g} s; its log:\n"
                                 f"{self.log(rank)}") from None

    def wait_all(self, timeout_s: float) -> dict[int, int]:
        deadline = time.monotonic() + timeout_s
        return {rank: self.wait(rank, max(0.1, deadline - time.monotonic()))
                for rank in sorted(self.procs)}

    def log(self, rank: int) -> str:
        return self.log_path(rank).read_text(encoding="utf-8", errors="replace")

    def logs(self) -> str:
        return "\n".join(f"--- rank {rank} ---\n{self.log(rank)[-4000:]}"
                         for rank in sorted(self.procs))

    def params(self, rank: int) -> np.ndarray:
        with np.load(self.out / f"worker-{rank}.npz") as data:
            return np.array(data["params"])

    def result(self, rank: int) -> dict[str, Any]:
        return json.loads((self.out / f"worker-{rank}.json").read_text(encoding="utf-8"))

    def kill_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
        for proc in self.procs.values():
            proc.wait()

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill_all()



class SinkHost:
    """Just enough of akorun.runtime.worker.Worker for akorun.transport.server.Server: it
    records what
    arrives (loop time, bytes, key) and answers duplicates, for transport tests and
    benchmarks. The first `not_ready_answers` partials are answered 503 "starting"."""

    def __init__(self, secret: bytes, run_id: bytes, wire_hash: bytes, *,
                 max_body_bytes: int = 1 << 26, not_ready_answers: int = 0,
                 world: int = 2) -> None:
        self.rank = 1
        self.world = world
        self.secret = secret
        self.keys = RunKeys.from_secret(secret, run_id, self.rank, self.world, wire_hash)
        self.verifier = RequestVerifier(self.keys, world=self.world)
        handlers = {kind: self._control_handler(kind) for kind in ControlKind}
        self.control_table = ControlTable(handlers, rank=self.rank, world=self.world)
        self.downlink = None
        self.codec = None  # float32 bodies only
        self.metrics = Metrics(1, "worker")
        self.not_ready_answers = not_ready_answers
        self.cap = max_body_bytes
        self.arrivals: list[tuple[float, int, tuple[int, int, int]]] = []
        self.seen: set[tuple[int, int, int]] = set()
        self.controls: list[tuple[str, dict[str, Any]]] = []

    def peer_signer(self, rank: int = 0) -> Signer:
        """A signer of rank `rank` of the same run that knows this host's current nonce."""
        keys = RunKeys.from_secret(self.secret, self.keys.run_id, rank, self.world,
                                   self.keys.wire_hash)
        keys.sessions.learn(self.rank, self.verifier.sessions.nonce)
        return Signer(keys)

    def not_accepting(self) -> str | None:
        if self.not_ready_answers > 0:
            self.not_ready_answers -= 1
            return "starting"
        return None

    def max_body_bytes(self) -> int:
        return self.cap

    def note_endorsements(self, key: tuple[int, int, int], text: str | None) -> None:
        return None

    async def on_partial(self, partial: Partial, nbytes: int) -> bool:
        self.arrivals.append((asyncio.get_running_loop().time(), nbytes, partial.key))
        if partial.key in self.seen:
            return False
        self.seen.add(partial.key)
        return True

    def _control_handler(self, kind: ControlKind
                         ) -> Callable[[int, dict[str, Any]], Awaitable[ControlAnswerBody]]:
        async def record(sender: int, payload: dict[str, Any]) -> ControlAnswerBody:
            self.controls.append((kind, payload))
            if kind is ControlKind.STOP:
                raise ControlError(409, "not now")
            return {"ok": True, "name": kind.value}
        return record

    def status(self, digest: bool = False) -> dict[str, Any]:
        return {"rank": self.rank, "received": len(self.arrivals)}

    def prometheus(self) -> str:
        return render_prometheus(self.metrics, {})
