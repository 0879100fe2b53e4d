"""What a measurement made on this machine rests on: the CPU model, logical cores and
machine type, read from the cpuinfo file it is given. Both shells key their cached
measurements (compute, per-message cost, host calibration) with it."""

from __future__ import annotations

import os
import platform
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")

__all__ = ["CPUINFO", "cpu_fingerprint", "host_fingerprint"]


def cpu_fingerprint(cpuinfo: Path = CPUINFO) -> str:
    """"<CPU model> x<logical cores> <machine>"; the model from `cpuinfo`'s first "model
    name" line, else what the platform says, else "unknown CPU"."""
    model = platform.processor() or ""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.lower().startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{model or 'unknown CPU'} x{os.cpu_count() or 0} {platform.machine()}"


def host_fingerprint() -> str:
    """CPU model, logical cores, machine type and Python: what a measured cost rests on."""
    return f"{cpu_fingerprint()} Python {platform.python_version()}"
