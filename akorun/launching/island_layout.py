"""The processes `akorun launch` starts when ranks are islands, and each one's environment.

This module owns the launcher's side of ``akorun.devices_per_rank``,
``akorun.processes_per_rank`` and ``akorun.platform``: every training rank is
``processes_per_rank`` processes (its leader, process 0, is the rank as before; the
others follow it, akorun.runtime.island), a parameter server one; and each process
gets its island's meeting point (a free loopback port for the coordinator of
``jax.distributed``, ``AKORUN_ISLAND_COORDINATOR``), its index in the island
(``AKORUN_ISLAND_PROCESS``) and its devices (akorun.launching.devices: a CPU device count
in XLA_FLAGS, or its own GPUs when the host has enough).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from akocore.settings.schema import RunConfig
from akorun.errors import UsageError
from akorun.launching.cluster import AkorunSettings, free_ports
from akorun.launching.devices import device_env, host_gpu_count
from akorun.runtime.endpoints import split_host
from akorun.runtime.island import COORDINATOR_ENV, PROCESS_ENV
from akorun.runtime.node_plan import role_of


@dataclass(frozen=True)
class IslandLayout:
    """(rank, process in its island) of every process to start, rank by rank, each rank's
    leader first; the coordinator port of each rank of several processes."""

    processes: tuple[tuple[int, int], ...]
    coordinators: Mapping[int, int]  # rank -> loopback port of its jax.distributed coordinator
    platform: str
    devices_per_process: Mapping[int, int]  # rank -> devices of each of its processes
    gpus_on_host: int = 0

    def env(self, slot: int, inherited: Mapping[str, str]) -> dict[str, str]:
        """The variables process `slot` (its index in `processes`) adds to `inherited`."""
        rank, process = self.processes[slot]
        added = device_env(self.platform, self.devices_per_process[rank], inherited,
                           processes_on_host=len(self.processes), process_slot=slot,
                           gpus_on_host=self.gpus_on_host)
        if rank in self.coordinators:
            added[COORDINATOR_ENV] = f"127.0.0.1:{self.coordinators[rank]}"
            added[PROCESS_ENV] = str(process)
        return added


def island_layout(cfg: RunConfig, settings: AkorunSettings,
                  hosts: Sequence[str]) -> IslandLayout:
    """The processes of a run on this machine (`hosts`: the ranks' host:port, whose ports
    the coordinators avoid)."""
    processes: list[tuple[int, int]] = []
    devices: dict[int, int] = {}
    islands = []
    for rank in range(cfg.cluster.workers):
        trains = role_of(cfg, rank) == "worker"
        count = settings.processes_per_rank if trains else 1
        devices[rank] = settings.devices_per_rank if trains else 1
        processes += [(rank, process) for process in range(count)]
        if count > 1:
            islands.append(rank)
    taken = {split_host(entry)[1] for entry in hosts}
    ports = [port for port in free_ports(len(islands) + len(taken)) if port not in taken]
    gpus = host_gpu_count() if settings.platform in ("gpu", "auto") else 0
    if settings.platform == "gpu" and gpus == 0 and "CUDA_VISIBLE_DEVICES" not in os.environ:
        raise UsageError("akorun.platform = gpu: nvidia-smi lists no GPU on this host; use "
                         "--platform cpu, or auto (an accelerator when JAX finds one)")
    return IslandLayout(processes=tuple(processes),
                        coordinators=dict(zip(islands, ports, strict=False)),
                        platform=settings.platform, devices_per_process=devices,
                        gpus_on_host=gpus)
