"""Which devices a rank's process sees: the environment set before it imports JAX.

This module owns the rule `akorun launch` applies to its children and a rank started
by hand (`akorun worker`) applies to itself, from ``akorun.platform`` and
``akorun.devices_per_rank``:

- ``cpu``: ``JAX_PLATFORMS=cpu`` (the user's own JAX_PLATFORMS wins), and for N > 1
  devices per process ``--xla_force_host_platform_device_count=N`` added to
  ``XLA_FLAGS``: XLA's CPU client then shows N devices, each a share of the same
  cores (the island's parallelism is then XLA's, not more cores).
- ``gpu``: ``JAX_PLATFORMS=cuda``; several processes on one host do not preallocate
  75% of a GPU each (``XLA_PYTHON_CLIENT_PREALLOCATE=false``, unless set), and when
  the host has a GPU for every device of every process (``nvidia-smi -L``), process i
  sees only its own N (``CUDA_VISIBLE_DEVICES``, unless set).
- ``auto``: JAX's own choice (no JAX_PLATFORMS): an accelerator when there is one.
  The CPU device count is set as for cpu, in case JAX falls back to the CPU.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping

DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"


def host_gpu_count() -> int:
    """The NVIDIA GPUs `nvidia-smi -L` lists on this host (0 without the tool)."""
    tool = shutil.which("nvidia-smi")
    if tool is None:
        return 0
    try:
        listing = subprocess.run([tool, "-L"], capture_output=True, text=True, timeout=20,
                                 check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in listing.splitlines() if line.startswith("GPU "))


def with_device_count(xla_flags: str, devices: int) -> str:
    """`xla_flags` asking XLA's CPU client for `devices` devices (a count already there
    is the user's and wins)."""
    if DEVICE_COUNT_FLAG in xla_flags:
        return xla_flags
    return f"{xla_flags} {DEVICE_COUNT_FLAG}={devices}".strip()


def device_env(platform: str, devices: int, env: Mapping[str, str], *,
               processes_on_host: int = 1, process_slot: int | None = None,
               gpus_on_host: int = 0) -> dict[str, str]:
    """The variables to add for one process of `devices` devices on `platform`, given the
    environment `env` it would inherit; `process_slot` (0..processes_on_host-1) picks
    its own GPUs when the host's `gpus_on_host` cover every process."""
    added: dict[str, str] = {}
    if platform == "cpu" and "JAX_PLATFORMS" not in env:
        added["JAX_PLATFORMS"] = "cpu"
    if platform == "gpu" and "JAX_PLATFORMS" not in env:
        added["JAX_PLATFORMS"] = "cuda"
    if platform in ("cpu", "auto") and devices > 1:
        added["XLA_FLAGS"] = with_device_count(env.get("XLA_FLAGS", ""), devices)
    if platform in ("gpu", "auto") and processes_on_host > 1:
        if "XLA_PYTHON_CLIENT_PREALLOCATE" not in env:
            added["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
        if process_slot is not None and "CUDA_VISIBLE_DEVICES" not in env \
                and gpus_on_host >= processes_on_host * devices:
            first = process_slot * devices
            added["CUDA_VISIBLE_DEVICES"] = ",".join(str(first + i) for i in range(devices))
    return added
