"""Where the TCP model's parameters come from: a host calibration file, the cache, or defaults.

`akosim calibrate` writes a `HostCalibration` record (akocore.records.host_calibration)
to the user's cache directory (the rule of akosim.planning.compute_cache: $AKO_CACHE_DIR,
$XDG_CACHE_HOME/ako-toolkit or ~/.cache/ako-toolkit), one file per host
fingerprint, or to ``--out F``. `tcp_parameters(path)` gives the commands what
the TCP model uses: the file named by ``--host-calibration``, else this host's
cached calibration, else the documented defaults, with a provenance line to
print, as the compute cache prints its own. A named file that cannot be read
is a user error; a cached one that cannot be read is ignored (defaults).
`read_message_cost` reads what ``akorun measure-messages`` writes.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import tempfile
from dataclasses import dataclass
from pathlib import Path

from akocore.cli_support import UsageError
from akocore.hostinfo import cpu_fingerprint
from akocore.records.host_calibration import HostCalibration, TcpParameters
from akocore.records.jsonrecord import RecordError
from akocore.records.message_cost import MessageCost
from akosim.planning.compute_cache import cache_dir

RECALIBRATE_HINT = "akosim calibrate to refresh"


def host_fingerprint() -> str:
    """Host name, CPU and kernel: what the TCP stack's behaviour rests on."""
    return f"{platform.node() or 'unknown host'}; {cpu_fingerprint()}; {platform.system()} " \
           f"{platform.release()}"


def cache_file(directory: Path | None = None) -> Path:
    digest = hashlib.sha256(host_fingerprint().encode()).hexdigest()[:20]
    return (directory or cache_dir()) / f"host-calibration-{digest}.json"


def read_host_calibration(path: str | Path) -> HostCalibration:
    """The record in `path`; UsageError (one line) when it is missing or not one."""
    try:
        return HostCalibration.from_json(json.loads(Path(path).read_text(encoding="utf-8")))
    except FileNotFoundError:
        raise UsageError(f"--host-calibration: no file {path}") from None
    except (OSError, ValueError) as error:  # RecordError, JSON errors are ValueErrors
        raise UsageError(f"--host-calibration: {path} is not a host calibration "
                         f"({error})") from None


def write_host_calibration(record: HostCalibration, path: str | Path) -> Path:
    """Write `record` atomically (temp file, then rename)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(record.to_json(), handle, indent=1)
        handle.write("\n")
    os.replace(tmp, target)
    return target


def cached_host_calibration(directory: Path | None = None) -> HostCalibration | None:
    try:
        return HostCalibration.from_json(json.loads(cache_file(directory).read_text(
            encoding="utf-8")))
    except (OSError, ValueError, RecordError):
        return None


@dataclass(frozen=True)
class TcpSource:
    """The TCP model's parameters and where they came from, in words."""

    params: TcpParameters
    provenance: str


def tcp_parameters(path: str | Path | None = None) -> TcpSource:
    """`--host-calibration path`, else this host's cached calibration, else defaults."""
    if path:
        record = read_host_calibration(path)
        return TcpSource(record.tcp, f"{record.provenance()}, from {path}")
    cached = cached_host_calibration()
    if cached is not None:
        return TcpSource(cached.tcp, f"{cached.provenance()}, cached; {RECALIBRATE_HINT}")
    params = TcpParameters()
    return TcpSource(params, f"tcp model: documented defaults (goodput "
                             f"{100 * params.bandwidth_factor:.1f}% of line rate, IW10, no "
                             f"message cost); run akosim calibrate to measure this host")


@dataclass(frozen=True)
class MessageCostFigures:
    """What akosim uses of akorun's MessageCost record (akocore.records.message_cost)."""

    fixed_s: float
    per_byte_s: float


def read_message_cost(path: str | Path) -> MessageCostFigures:
    """The per-message software cost in an ``akorun measure-messages --out`` file.

    Read with akocore.records.message_cost.MessageCost; UsageError (one line) when the file
    is not one."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"--message-cost: no file {path}") from None
    except (OSError, ValueError) as error:
        raise UsageError(f"--message-cost: {path} is not JSON ({error})") from None
    try:
        record = MessageCost.from_json(data)
        fixed, per_byte = float(record.fixed_s), float(record.per_byte_s)
    except (KeyError, TypeError, ValueError) as error:
        reason = " ".join(str(error).split())
        raise UsageError(f"--message-cost: {path} is not an akorun message cost "
                         f"({reason})") from None
    if not (math.isfinite(fixed) and fixed >= 0 and math.isfinite(per_byte) and per_byte >= 0):
        raise UsageError(f"--message-cost: {path}: expected fixed_s and per_byte_s >= 0, got "
                         f"{fixed!r} and {per_byte!r}")
    return MessageCostFigures(fixed, per_byte)
