"""What akorun's commands take beside the run settings, typed: `InitRequest` (``akorun
init``), `RankRequest` (``akorun worker`` / ``ps``) and `LaunchRequest` (``akorun
launch``), in seconds, paths and whole numbers.

The command line reads its flags into them (`*.from_args`, the flags' text parsed
here once) and the Python API builds them from its typed keywords (a duration as text
with its unit or as seconds); both then call the same commands
(akorun.launching.commands) with the settings as layers.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

from akorun.errors import UsageError
from akorun.launching.cli_parser import parse_duration_arg, parse_whole_arg
from akorun.launching.cluster import DEFAULT_BASE_PORT

PathText = str | os.PathLike[str]


def seconds(value: str | float | None, flag: str) -> float | None:
    """A duration > 0 given as text with its unit ("30s") or as seconds; None stays None."""
    if value is None:
        return None
    if isinstance(value, str):
        return parse_duration_arg(value, flag)
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise UsageError(f"{flag}: got {value!r}, expected a duration > 0 such as 10s")
    return float(value)


def whole(value: str | int | None, flag: str, minimum: int = 0) -> int | None:
    """A whole number >= `minimum` given as text or as an int; None stays None."""
    if value is None:
        return None
    if isinstance(value, str):
        return parse_whole_arg(value, flag, minimum)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise UsageError(f"{flag}: got {value!r}, expected a whole number >= {minimum}")
    return value


def _path(value: PathText | None) -> Path | None:
    return None if value is None else Path(value)


@dataclass(frozen=True)
class InitRequest:
    """``akorun init``'s own options: the cluster file to write and its hosts."""

    out: Path
    hosts: str | None = None  # "HOST[:PORT],...": one per rank (default loopback)
    base_port: int = DEFAULT_BASE_PORT  # the port of a host given without one
    per_rank_keys: Path | None = None  # write one key file per rank here, no secret
    force: bool = False  # overwrite an existing file

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> InitRequest:
        return cls(out=Path(args.out), hosts=args.hosts,
                   base_port=whole(args.base_port, "--base-port", 1) or DEFAULT_BASE_PORT,
                   per_rank_keys=_path(args.per_rank_keys), force=args.force)


@dataclass(frozen=True)
class RankRequest:
    """``akorun worker`` / ``ps``'s own options: which rank of which cluster file, where
    its records go, how it meets the others."""

    config: Path  # the cluster file `akorun init` wrote
    role: str = "worker"  # or "ps"
    rank: int | None = None  # None: a rank variable, or the order of arrival
    rendezvous: str | None = None  # HOST:PORT, instead of the file's host list
    advertise: str | None = None  # the address the others reach this rank at
    out: Path | None = None  # OUT/worker-R.json and .npz
    resume: bool = False
    checkpoint_dir: Path | None = None  # default OUT/checkpoints
    progress_every_s: float | None = None
    quiet: bool = False
    listen: str | None = None  # the address to bind
    grace_s: float | None = None  # keep serving after finishing (default: peer timeout)
    tls_ca: str | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RankRequest:
        if args.config is None:
            raise UsageError("--config FILE is required: the cluster file written by "
                             "`akorun init`")
        return cls(config=Path(args.config), role=args.role,
                   rank=whole(args.rank, "--rank"), rendezvous=args.rendezvous,
                   advertise=args.advertise, out=_path(args.out), resume=args.resume,
                   checkpoint_dir=_path(args.checkpoint_dir),
                   progress_every_s=seconds(args.progress_every, "--progress-every"),
                   quiet=args.quiet, listen=args.listen,
                   grace_s=seconds(args.grace, "--grace"), tls_ca=args.tls_ca)


@dataclass(frozen=True)
class LaunchRequest:
    """``akorun launch``'s own options: the run directory, the plan it runs, the testbed."""

    out: Path
    force: bool = False  # reuse a run directory that holds a run
    quiet: bool = False
    timeout_s: float | None = None  # stop the whole run after this long
    kill_grace_s: float | None = None  # SIGKILL this long after SIGTERM
    progress_every_s: float | None = None
    checkpoint_dir: Path | None = None
    plan: Path | None = None  # an akosim plan record: run what it recommends
    plan_rank: int | None = None  # run the plan's ranking's N-th (1 = first)
    testbed: str | None = None  # "netns": real kernel TCP
    testbed_latency: str | None = None  # "delay" (default) or "ignore"
    testbed_jitter_s: float | None = None
    testbed_downlink: bool | None = None  # None: on

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> LaunchRequest:
        downlink = args.testbed_downlink
        return cls(out=Path(args.out), force=args.force, quiet=args.quiet,
                   timeout_s=seconds(args.timeout, "--timeout"),
                   kill_grace_s=seconds(args.kill_grace, "--kill-grace"),
                   progress_every_s=seconds(args.progress_every, "--progress-every"),
                   checkpoint_dir=_path(args.checkpoint_dir), plan=_path(args.plan),
                   plan_rank=whole(args.plan_rank, "--plan-rank", 1), testbed=args.testbed,
                   testbed_latency=args.testbed_latency,
                   testbed_jitter_s=seconds(args.testbed_jitter, "--testbed-jitter"),
                   testbed_downlink=None if downlink is None else downlink == "on")
