"""The gradient step timed with k processes stepping at once on this host (co-location).

On the netns testbed every rank is a process on this one host, so k training
ranks share its cores: a rank's step takes longer than akosim's single-process
measurement (``--compute measure``) by however much the host's scheduler, caches
and memory bandwidth make it, not by a guessed k / cores. `measure_colocated`
starts k processes running the workload's gradient step under the XLA threading
akorun gives its ranks (single-threaded when processes >= cores); every process
compiles and warms up first, then windows alternate: one process steps alone,
then all k step at once, three times each. Each window's figure is the mean
step time in it (a mean, not a median: a rank's round pays every slow step, and
the runs report means); the record keeps the medians of both kinds, measured
side by side in one call, so `slowdown` (k processes over 1) is a ratio under
one machine load even when other jobs come and go, and the 1-minute load
average before the measurement (other jobs share the cores).

`colocated_compute` caches the record next to akosim's compute cache
(akosim.planning.compute_cache: one JSON file per workload, batch size, optimizer, CPU
fingerprint, JAX version and k), as ``kind: colocated-compute``; it is a host
measurement made once, never a figure taken from a run being predicted.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from akocore.rank_threads import rank_thread_env
from akocore.records.jsonrecord import RecordError, meta, record_from_json, record_to_json
from akosim.planning.compute_cache import CacheKey, cache_dir, key_for, store_json

COLOCATED_VERSION = 1
KIND = "colocated-compute"
WINDOW_S = 2.0  # seconds of one measuring window
REPEATS = 3  # windows of each kind (one alone, all at once), alternating
WARMUP_STEPS = 5
START_TIMEOUT_S = 300.0

__all__ = ["COLOCATED_VERSION", "ColocatedCompute", "colocated_compute", "measure_colocated"]


@dataclass(frozen=True)
class ColocatedCompute:
    """The workload's step with `processes` processes stepping at once, and with one."""

    workload: str = field(metadata=meta("", "the workload measured", "akosim"))
    batch_size: int = field(metadata=meta("samples", "samples per gradient step", "akosim"))
    optimizer: str = field(metadata=meta("", "the optimizer configured", "akosim"))
    cpu: str = field(metadata=meta("", "CPU fingerprint (model, cores, machine)", "akosim"))
    jax_version: str = field(metadata=meta("", "JAX version that ran the step", "akosim"))
    processes: int = field(metadata=meta("processes", "processes stepping at once", "akosim"))
    cores: int = field(metadata=meta("cores", "logical cores of this host", "akosim"))
    compute_s: float = field(metadata=meta(
        "s", "mean step seconds per process, all `processes` stepping at once", "akosim"))
    single_compute_s: float = field(metadata=meta(
        "s", "mean step seconds of one process alone, measured in the same call", "akosim"))
    window_s: float = field(metadata=meta(
        "s", "wall seconds of each window (alone and together alternate)", "akosim"))
    repeats: int = field(metadata=meta(
        "windows", "windows of each kind behind the medians", "akosim"))
    xla_flags: str = field(metadata=meta("", "XLA_FLAGS the processes ran with", "akosim"))
    load_average: float = field(metadata=meta(
        "", "1-minute load average just before the measurement (other jobs)", "akosim"))
    measured_at: str = field(metadata=meta("", "when, ISO 8601 UTC", "akosim"))
    step_cv: float = field(default=0.0, metadata=meta(
        "fraction", "relative standard deviation of one step, all `processes` stepping at "
        "once (median over the windows; 0: not measured, an older record)", "akosim"))

    @property
    def slowdown(self) -> float:
        """How much longer a step takes with `processes` at once than alone (>= 1)."""
        return max(1.0, self.compute_s / self.single_compute_s)

    def provenance(self) -> str:
        return (f"compute {self.compute_s * 1e3:.2f} ms/step with {self.processes} processes "
                f"stepping at once on this host's {self.cores} cores (x{self.slowdown:.2f} "
                f"over one alone, {self.single_compute_s * 1e3:.2f} ms, side by side; load "
                f"average {self.load_average:.2f}; measured {self.measured_at[:16]}"
                + (f"; step varies by {self.step_cv:.2f} (relative std)" if self.step_cv
                   else "") + ")")

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": COLOCATED_VERSION, "kind": KIND, **record_to_json(self)}

    @classmethod
    def from_json(cls, data: Any) -> ColocatedCompute:
        if not isinstance(data, dict):
            raise RecordError(f"{KIND}: expected an object, got {data!r}")
        if data.get("schema_version") != COLOCATED_VERSION or data.get("kind") != KIND:
            raise RecordError(f"{KIND}: expected version {COLOCATED_VERSION} of kind {KIND!r}")
        record = record_from_json(cls, {k: v for k, v in data.items()
                                        if k not in ("schema_version", "kind")})
        if not (record.compute_s > 0 and record.single_compute_s > 0 and record.processes >= 1):
            raise RecordError(f"{KIND}: expected step seconds > 0 and processes >= 1")
        return record


# the child: build the workload, warm up, print "ready", read the windows (a JSON list
# of [start, end, steps?] in wall-clock seconds), step in every window it is active in
# and idle in the others, print each window's [mean step seconds, relative standard
# deviation of a step] (null when idle)
_CHILD = r"""
import json, sys, time
from akocore.workloads.flat import build_workload
name, batch, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
workload = build_workload(name, batch_size=batch, seed=seed)
stream = workload.batches(0, 1)
batches = [stream.next() for _ in range(8)]
for step in range(WARMUP):
    b = batches[step % 8]
    workload.grad_step(workload.init_params, b.x, b.y, step)
print("ready", flush=True)
windows = json.loads(sys.stdin.readline())
means = []
for start_at, end_at, active in windows:
    while time.time() < start_at:
        time.sleep(0.001)
    if not active:
        means.append(None)
        continue
    steps, spent, squares = 0, 0.0, 0.0
    while time.time() < end_at:
        b = batches[steps % 8]
        began = time.perf_counter()
        workload.grad_step(workload.init_params, b.x, b.y, 100 + steps)
        took = time.perf_counter() - began
        spent += took
        squares += took * took
        steps += 1
    if not steps:
        means.append(None)
        continue
    mean = spent / steps
    var = max(0.0, squares / steps - mean * mean)
    means.append([mean, var ** 0.5 / mean if mean > 0 else 0.0])
print(json.dumps(means), flush=True)
""".replace("WARMUP", str(WARMUP_STEPS))


def _interleaved_step_s(workload: str, batch_size: int, processes: int, env: dict[str, str],
                        window_s: float, repeats: int) -> tuple[float, float, float]:
    """(one process alone, `processes` at once): mean step seconds, medians over
    `repeats` pairs of windows that alternate (one alone, then all), so a load that
    changes slowly weighs on both alike; and the relative standard deviation of a step
    with all at once (median over those windows of the processes' mean). Every process
    starts and compiles first."""
    children = [subprocess.Popen([sys.executable, "-c", _CHILD, workload, str(batch_size),
                                  str(rank)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 text=True, env=env) for rank in range(processes)]
    try:
        for child in children:
            assert child.stdout is not None
            line = child.stdout.readline().strip()
            if line != "ready":
                raise RuntimeError(f"a step process did not start (exit {child.poll()})")
        gap_s = 0.1  # idle between windows, so no step runs over into the next
        start_at = time.time() + 0.3
        plan = []  # (start, end, together?)
        for _ in range(repeats):
            for together in (False, True):
                plan.append((start_at, start_at + window_s, together))
                start_at += window_s + gap_s
        for rank, child in enumerate(children):
            assert child.stdin is not None
            child.stdin.write(json.dumps([[a, b, together or rank == 0]
                                          for a, b, together in plan]) + "\n")
            child.stdin.flush()
        means = []
        for child in children:
            out, _ = child.communicate(timeout=start_at - time.time() + START_TIMEOUT_S)
            means.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    alone_s: list[float] = []
    together_s: list[float] = []
    together_cv: list[float] = []
    for window, (_a, _b, all_step) in enumerate(plan):
        figures = [m[window] for m in means if m[window] is not None]
        if not figures:
            raise RuntimeError("a step process finished no step in a window")
        (together_s if all_step else alone_s).append(
            sum(f[0] for f in figures) / len(figures))
        if all_step:
            together_cv.append(sum(f[1] for f in figures) / len(figures))
    return (statistics.median(alone_s), statistics.median(together_s),
            statistics.median(together_cv))


def measure_colocated(workload: str, batch_size: int, optimizer: str, processes: int, *,
                      window_s: float = WINDOW_S, repeats: int = REPEATS) -> ColocatedCompute:
    """Time the step with one process alone and with `processes` at once, in alternating
    windows of one call (`repeats` of each; medians)."""
    if processes < 1:
        raise ValueError(f"processes: expected >= 1, got {processes}")
    cores = os.cpu_count() or 1
    env = dict(os.environ)
    env.setdefault("JAX_PLATFORMS", "cpu")
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([root, *[p for p in env.get(
        "PYTHONPATH", "").split(os.pathsep) if p and p != root]])
    # akorun's rule (akorun.launching.local): the ranks share the cores' XLA threads
    env.update(rank_thread_env(cores, processes, env))
    load = os.getloadavg()[0]
    single, together, cv = _interleaved_step_s(workload, batch_size, processes, env, window_s,
                                           repeats)
    key = key_for(workload, batch_size, optimizer)
    return ColocatedCompute(
        workload=workload, batch_size=batch_size, optimizer=optimizer, cpu=key.cpu,
        jax_version=key.jax_version, processes=processes, cores=cores, compute_s=together,
        single_compute_s=single, window_s=window_s, repeats=repeats,
        xla_flags=env.get("XLA_FLAGS", ""),
        load_average=load, measured_at=datetime.now(UTC).isoformat(timespec="seconds"),
        step_cv=cv)


def _file_name(key: CacheKey, processes: int) -> str:
    text = json.dumps([key.workload, key.batch_size, key.optimizer, key.cpu,
                       key.jax_version, processes])
    digest = hashlib.sha256(text.encode()).hexdigest()[:20]
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", key.workload)[:60]  # a user's path
    return f"colocated-{stem}-b{key.batch_size}-k{processes}-{digest}.json"


def _load(path: Path, key: CacheKey, processes: int) -> ColocatedCompute | None:
    try:
        record = ColocatedCompute.from_json(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, RecordError):
        return None
    same = (record.workload, record.batch_size, record.optimizer, record.cpu,
            record.jax_version, record.processes) == (key.workload, key.batch_size,
                                                      key.optimizer, key.cpu,
                                                      key.jax_version, processes)
    return record if same else None


def colocated_compute(workload: str, batch_size: int, optimizer: str, processes: int, *,
                      directory: Path | None = None,
                      refresh: bool = False) -> tuple[ColocatedCompute, bool]:
    """The cached co-located measurement (record, False), or a new one stored (record,
    True). A file that cannot be read as the record is measured again."""
    key = key_for(workload, batch_size, optimizer)
    folder = directory or cache_dir()
    path = folder / _file_name(key, processes)
    if not refresh:
        cached = _load(path, key, processes)
        if cached is not None:
            return cached, False
    record = measure_colocated(workload, batch_size, optimizer, processes)
    store_json(path, record.to_json())  # an unwritable cache measures again next time
    return record, True
