"""The cache of ``--compute measure``: one measurement per machine, reused by every call.

Timing the workload's gradient step takes seconds (JAX import, compile, 5 to
20 steps until the median is known within ±5%: akocore.workloads.step_timing)
and varies a little from call to call, so the plan changed with it.
This module keeps each measurement as a `ComputeMeasurement` record (kind
``compute``, akocore.records.results) in the user's cache directory, one JSON file
per key (workload, batch size, optimizer, CPU fingerprint, JAX version):

    $AKO_CACHE_DIR  or  $XDG_CACHE_HOME/ako-toolkit  or  ~/.cache/ako-toolkit

A file that cannot be read as that record (corrupt, another schema, another
key) is measured again and rewritten, never an error. Writes are atomic
(temp file, then rename), so two calls at once leave one whole file.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from akocore.hostinfo import cpu_fingerprint
from akocore.records.calibration import ComputeMeasurement
from akocore.records.results import RecordError
from akocore.workloads.step_timing import StepTiming

CACHE_ENV = "AKO_CACHE_DIR"  # tests and users point the cache elsewhere with this
CACHE_SUBDIR = "ako-toolkit"
REFRESH_HINT = "--compute remeasure to refresh"


@dataclass(frozen=True)
class CacheKey:
    """What a measurement depends on; the file name is a hash of it."""

    workload: str
    batch_size: int
    optimizer: str
    cpu: str
    jax_version: str

    def file_name(self) -> str:
        text = json.dumps([self.workload, self.batch_size, self.optimizer, self.cpu,
                           self.jax_version])
        digest = hashlib.sha256(text.encode()).hexdigest()[:20]
        stem = re.sub(r"[^A-Za-z0-9._-]+", "_", self.workload)[:60]  # a user's path
        return f"compute-{stem}-b{self.batch_size}-{digest}.json"

    def matches(self, record: ComputeMeasurement) -> bool:
        return (record.workload, record.batch_size, record.optimizer, record.cpu,
                record.jax_version) == (self.workload, self.batch_size, self.optimizer,
                                        self.cpu, self.jax_version)


def cache_dir() -> Path:
    """$AKO_CACHE_DIR, else $XDG_CACHE_HOME/ako-toolkit, else ~/.cache/ako-toolkit."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / CACHE_SUBDIR


def jax_version() -> str:
    try:
        return metadata.version("jax")
    except metadata.PackageNotFoundError:
        return "unknown"


def key_for(workload: str, batch_size: int, optimizer: str) -> CacheKey:
    """The key of a measurement; a user's factory is keyed with a digest of its file."""
    from akocore.workloads.naming import cache_identity

    return CacheKey(cache_identity(workload), batch_size, optimizer, cpu_fingerprint(),
                    jax_version())


def load(key: CacheKey, directory: Path | None = None) -> ComputeMeasurement | None:
    """The cached measurement of `key`, or None (absent, unreadable, or another key)."""
    path = (directory or cache_dir()) / key.file_name()
    try:
        record = ComputeMeasurement.from_json(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, RecordError):  # JSONDecodeError is a ValueError
        return None
    return record if key.matches(record) else None


def store(record: ComputeMeasurement, directory: Path | None = None) -> Path | None:
    """Write `record` atomically; None (and no error) when the cache cannot be written."""
    key = CacheKey(record.workload, record.batch_size, record.optimizer, record.cpu,
                   record.jax_version)
    target = (directory or cache_dir()) / key.file_name()
    return target if store_json(target, record.to_json()) else None


def store_json(target: Path, payload: dict[str, Any]) -> bool:
    """Write a cache entry atomically (temp file, then rename); False, never an error,
    when the cache cannot be written (an unwritable cache measures again next time)."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(payload, handle, indent=1)
            handle.write("\n")
        os.replace(tmp, target)
    except OSError:
        return False
    return True


@dataclass(frozen=True)
class Measured:
    """A measurement and whether this call made it (False: read from the cache), with
    how closely a fresh one knows its median (StepTiming.describe) when it says."""

    record: ComputeMeasurement
    fresh: bool
    detail: str = ""

    def provenance(self) -> str:
        """The line a user reads: where the compute time came from and how to refresh it."""
        when = self.record.measured_at[:10]
        if self.fresh:
            how = self.detail or f"{self.record.steps} steps"
            return (f"compute {self.record.compute_s * 1e3:.1f} ms/step measured here now "
                    f"({how}), cached for the next calls")
        return (f"compute {self.record.compute_s * 1e3:.1f} ms/step measured here on {when}, "
                f"cached; {REFRESH_HINT}")


def measured_compute(key: CacheKey, measure: Callable[[], tuple[float | StepTiming, int]], *,
                     steps: int, refresh: bool = False,
                     directory: Path | None = None) -> Measured:
    """The cached measurement of `key`, or a new one from `measure()` -> (seconds per
    step, or a StepTiming that also says how many steps and how close; gradient
    elements), stored for the next call. `refresh` measures anyway. `steps` is
    recorded for a measurement given as plain seconds."""
    if not refresh:
        cached = load(key, directory)
        if cached is not None:
            return Measured(cached, fresh=False)
    timing, param_count = measure()
    detail = ""
    if isinstance(timing, StepTiming):
        compute_s, steps, detail = timing.compute_s, timing.steps, timing.describe()
    else:
        compute_s = timing
    record = ComputeMeasurement(
        workload=key.workload, batch_size=key.batch_size, optimizer=key.optimizer,
        cpu=key.cpu, jax_version=key.jax_version, compute_s=float(compute_s),
        param_count=int(param_count), steps=steps,
        measured_at=datetime.now(UTC).isoformat(timespec="seconds"))
    store(record, directory)
    return Measured(record, fresh=True, detail=detail)
