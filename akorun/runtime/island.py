"""A rank that spans several devices and processes: its island, set up in this process.

This module owns the process side of an island (the step itself is
akocore.workloads.island_step's): joining the rank's processes with ``jax.distributed`` (CPU
collectives over gloo, so that islands of CPU processes work on loopback too),
choosing the island's devices (the first ``akorun.devices_per_rank`` local devices
of every process, in process order), and, with several processes, the protocol
between them.

Only the island's leader (process 0) talks to other ranks. It runs the whole akorun
rank (join, exchange, every scheme, results); the other processes, followers, run
nothing but the island's step: before each step the leader broadcasts a small header
(which batch, which seed) and the parameters inside the island with a jitted
collective (``multihost_utils.broadcast_one_to_all``), every process then steps on
its own devices' batches and XLA's pmean gives every process the island's gradient.
Why the leader alone: the island's gradient is one vector, and it is the same in
every process once XLA has reduced it; sharing the exchange among the processes
would split one message per peer into M and need the scheme's state (owed partials,
logs, rejoin) to be split the same way, for a wire that is the slow part anyway.
The cost of the choice is one broadcast of the parameters per step inside the
island (its fast network), measured in the development guide's device check.

A follower needs no port, writes no result and ignores SIGTERM: it ends when the
leader broadcasts the stop (the leader's finish, or its error), and a follower
whose leader died is ended by the launcher. Where the processes meet: the leader's
``AKORUN_ISLAND_COORDINATOR`` (host:port, set by `akorun launch`) and each one's
``AKORUN_ISLAND_PROCESS``; with neither set, ``jax.distributed.initialize()`` finds
them itself on SLURM, Open MPI or Kubernetes.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from akocore.workloads.flat import FlatWorkload
from akocore.workloads.island_step import (
    BatchKey,
    IslandStep,
    IslandWorkload,
    island_step,
    island_workload,
)
from akorun.errors import UsageError

log = logging.getLogger("akorun")

COORDINATOR_ENV = "AKORUN_ISLAND_COORDINATOR"  # host:port of the island's process 0
PROCESS_ENV = "AKORUN_ISLAND_PROCESS"  # this process's index in its island
OP_STOP, OP_STEP = 0, 1
HEADER_WORDS = 11  # op, then worker, workers, data seed, index, rng seed as int64 pairs
MEMORY_LINE = "island: peak device memory:"  # the line tools/device_check.py reads


def device_memory_line(devices: tuple[Any, ...] | None = None) -> str:
    """The peak memory of this process's `devices` (default: its first), the allocator's
    own figure (CPU devices keep none: n/a), in one line the device check reads."""
    import jax

    if devices is None:
        devices = tuple(jax.local_devices()[:1])
    parts = []
    for device in devices:
        if getattr(device, "process_index", 0) != jax.process_index():
            continue
        stats = device.memory_stats() or {}
        peak = stats.get("peak_bytes_in_use", stats.get("bytes_in_use"))
        parts.append(f"{device} " + ("n/a" if peak is None else f"{peak / 1e6:.1f} MB"))
    return f"{MEMORY_LINE} " + ", ".join(parts)


@dataclass(frozen=True)
class IslandShape:
    """What the settings ask of a rank: devices per process, processes, platform."""

    devices_per_process: int = 1
    processes: int = 1
    platform: str = "cpu"

    @property
    def single(self) -> bool:
        return self.devices_per_process == 1 and self.processes == 1


def island_process_index(env: Mapping[str, str]) -> int:
    """This process's index in its island as the launcher set it (0 when unset)."""
    text = env.get(PROCESS_ENV, "").strip()
    if not text:
        return 0
    try:
        return int(text)
    except ValueError:
        raise UsageError(f"{PROCESS_ENV}={text!r}: expected this process's index in its "
                         f"rank's island, a whole number >= 0") from None


def _encode_header(op: int, key: BatchKey, rng_seed: int) -> np.ndarray:
    words = np.array([*key, rng_seed], dtype=np.int64).view(np.int32)
    return np.concatenate([np.array([op], np.int32), words])


def _decode_header(header: np.ndarray) -> tuple[int, BatchKey, int]:
    values = np.asarray(header[1:], dtype=np.int32).view(np.int64).tolist()
    worker, workers, seed, index, rng_seed = (int(v) for v in values)
    return int(header[0]), (worker, workers, seed, index), rng_seed


class Island:
    """This process's place in its rank's island: the devices, the step, the protocol."""

    def __init__(self, shape: IslandShape, process_index: int, devices: tuple[Any, ...]):
        self.shape = shape
        self.process_index = process_index
        self.devices = devices
        self.workload: IslandWorkload | None = None
        self.closed = False

    @property
    def leader(self) -> bool:
        return self.process_index == 0

    @property
    def distributed(self) -> bool:
        return self.shape.processes > 1

    def describe(self) -> str:
        kinds = sorted({getattr(device, "platform", "?") for device in self.devices})
        return (f"island of {len(self.devices)} {'/'.join(kinds)} device(s) in "
                f"{self.shape.processes} process(es); this is process {self.process_index}")

    def wrap(self, workload: FlatWorkload) -> IslandWorkload:
        """`workload` stepping as this island (the leader announces each step)."""
        step: IslandStep = island_step(workload, self.devices, self.process_index)
        announce = self._announce if self.distributed and self.leader else None
        self.workload = island_workload(workload, step, announce)
        return self.workload

    def _broadcast(self, value: np.ndarray) -> np.ndarray:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.broadcast_one_to_all(value,
                                                                is_source=self.leader))

    def _announce(self, key: BatchKey, params: np.ndarray, rng_seed: int) -> np.ndarray:
        self._broadcast(_encode_header(OP_STEP, key, rng_seed))
        return np.array(self._broadcast(params), dtype=np.float32)

    def follow(self) -> int:
        """A follower's life: the leader's steps until it says stop; the steps taken."""
        workload = self.workload
        assert workload is not None and not self.leader
        blank_header = np.zeros(HEADER_WORDS, np.int32)
        blank_params = np.zeros(workload.param_count, np.float32)
        steps = 0
        while True:
            op, key, rng_seed = _decode_header(self._broadcast(blank_header))
            if op == OP_STOP:
                return steps
            params = np.array(self._broadcast(blank_params), dtype=np.float32)
            workload.follow_step(key, params, rng_seed)
            steps += 1

    def close(self) -> None:
        """The leader tells the followers to stop (once); every process leaves the island."""
        if self.closed:
            return
        self.closed = True
        if not self.distributed:
            return
        import jax

        if self.leader:
            try:
                self._broadcast(_encode_header(OP_STOP, (0, 0, 0, 0), 0))
            except Exception as error:  # a follower gone: they end with the launcher
                log.warning("island: could not tell the other processes to stop: %s", error)
        try:
            jax.distributed.shutdown()
        except Exception as error:
            log.warning("island: leaving jax.distributed: %s", error)


def island_workload_of(island: Island, train: Any) -> IslandWorkload:
    """The configured workload (`train`, the run's TrainConfig) stepping as `island`."""
    from akocore.workloads.flat import build_workload

    try:
        workload = build_workload(train.workload, batch_size=train.batch_size,
                                  seed=train.seed, data_path=train.data_path)
    except ValueError as error:  # unknown workload or option, a broken factory, DataError
        raise UsageError(f"train.workload: {error}") from None
    log.info("%s", island.describe())
    return island.wrap(workload)


def follow_leader(island: Island, train: Any) -> int:
    """A follower process: the configured workload (`train`, the run's TrainConfig) as the
    island, the leader's steps until it says stop, then out of the island."""
    island_workload_of(island, train)
    log.info("island: following the leader's steps")
    try:
        steps = island.follow()
        log.info("%s", device_memory_line(island.devices))
    finally:
        island.close()
    log.info("island: the leader said stop after %d steps", steps)
    return steps


def island_devices(per_process: int, processes: int) -> tuple[Any, ...]:
    """The first `per_process` devices of each process, in process order; UsageError when
    a process has fewer."""
    import jax

    by_process: dict[int, list[Any]] = {}
    for device in jax.devices():
        by_process.setdefault(device.process_index, []).append(device)
    chosen: list[Any] = []
    for process in range(processes):
        own = sorted(by_process.get(process, []), key=lambda d: d.id)
        if len(own) < per_process:
            raise UsageError(f"akorun.devices_per_rank = {per_process}: process {process} of "
                             f"this rank sees {len(own)} {jax.default_backend()} device(s); "
                             f"give at most that many (on CPU, `akorun launch` makes them)")
        chosen += own[:per_process]
    return tuple(chosen)


def open_island(shape: IslandShape, env: Mapping[str, str] | None = None) -> Island | None:
    """This process's island (None for a rank of one device in one process): joins the
    rank's processes with jax.distributed first. UsageError for a mistake."""
    if shape.single:
        return None
    env = os.environ if env is None else env
    import jax

    process_index = island_process_index(env)
    if shape.processes > 1:
        if process_index >= shape.processes:
            raise UsageError(f"{PROCESS_ENV}={process_index}: this rank has "
                             f"akorun.processes_per_rank = {shape.processes} processes")
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        # JAX's preemption service would take SIGTERM for itself (a C++ handler): the
        # leader's graceful stop (finish the round, flush, checkpoint) is akorun's own
        jax.config.update("jax_enable_preemption_service", False)
        coordinator = env.get(COORDINATOR_ENV, "").strip()
        if coordinator:
            jax.distributed.initialize(coordinator_address=coordinator,
                                       num_processes=shape.processes,
                                       process_id=process_index)
        else:  # SLURM, Open MPI, Kubernetes: JAX finds the coordinator and the index
            jax.distributed.initialize()
            process_index = jax.process_index()
        if jax.process_count() != shape.processes:
            raise UsageError(f"akorun.processes_per_rank = {shape.processes}, but "
                             f"jax.distributed joined {jax.process_count()} processes")
    elif process_index != 0:
        raise UsageError(f"{PROCESS_ENV}={process_index} needs akorun.processes_per_rank > 1")
    island = Island(shape, process_index,
                    island_devices(shape.devices_per_process, shape.processes))
    if not island.leader:  # the leader's finish or error stops a follower
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return island
