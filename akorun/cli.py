"""The `akorun` command line: init, worker, ps, launch.

This module owns argument parsing and exit statuses, nothing else: each
subcommand turns its flags into the dataclasses of the module that does the
work (akorun.cluster, akorun.worker, akorun.launch). Every subcommand takes
the shared run flags of akocore.config (the same vocabulary as akosim).

Exit statuses: 0 done; 1 the run failed (one line naming the rank and why;
launch adds the tail of the failed rank's log); 2 a user mistake (ONE line on
stderr saying what was wrong and what is allowed, never a traceback);
130 interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from akocore.config import ConfigError, add_shared_arguments, config_from_args
from akocore.units import UnitError, parse_duration
from akocore.workload import WORKLOAD_NAMES, parse_workload_spec
from akorun.cluster import (
    DEFAULT_BASE_PORT,
    EMULATE_MODES,
    config_over,
    hosts_from_text,
    loopback_hosts,
    new_settings,
    read_cluster_file,
    resolve_rank,
    run_config_from_args,
    should_emulate,
    with_hosts,
    write_cluster_file,
)
from akorun.errors import (
    EXIT_INTERRUPTED,
    EXIT_RUN_FAILED,
    EXIT_USAGE,
    Interrupted,
    RunError,
    UsageError,
)
from akorun.faults import faults_for
from akorun.launch import LaunchOptions, launch, worker_flags
from akorun.roles import check_role
from akorun.worker import TLSOptions, Worker, WorkerOptions, summary_line


class ArgumentParser(argparse.ArgumentParser):
    """argparse with one-line errors: `akorun worker: error: ... (see --help)`, status 2."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message} (see {self.prog} --help)\n")
        sys.exit(EXIT_USAGE)


_FORMATTER = argparse.RawDescriptionHelpFormatter

INIT_EPILOG = """\
examples:
  akorun init --workers 3 --out cluster.toml
      loopback, free ports picked now
  akorun init --workers 4 --hosts node1,node2,node3,node4 --out cluster.toml \\
      --link-bandwidth 40mbps --p auto --ssp 2
      one rank per host, port 7070 on each
  akorun init --workers 3 --hosts 10.0.0.1:7000,10.0.0.2:7000,10.0.0.3:7000 \\
      --scheme ps --set exchange.ps_servers=1 --out cluster.toml

The file holds the run's secret (mode 0600): copy it unchanged to every host.
"""

WORKER_EPILOG = """\
examples:
  akorun worker --rank 0 --config cluster.toml --out runs/a
  AKORUN_RANK=2 akorun worker --config cluster.toml
  srun -n 4 akorun worker --config cluster.toml --out runs/a      (rank from SLURM_PROCID)
  torchrun-style: RANK=1 WORLD_SIZE=4 akorun worker --config cluster.toml
  akorun worker --rank 2 --config cluster.toml --resume --checkpoint-dir runs/a/checkpoints

Writes OUT/worker-R.json (result) and OUT/worker-R.npz (final params).
Serves GET /metrics (Prometheus) and GET /status (JSON), read-only and unauthenticated.
Shared flags given here override the cluster file and must be the same on every rank
(the hello handshake refuses a rank whose config differs).
Test hook: AKORUN_FAULT (see akorun/faults.py), e.g. AKORUN_FAULT=kill_after_round:5.
"""

PS_EPILOG = """\
examples:
  akorun ps --rank 3 --config cluster.toml --out runs/ps
      rank 3 of a 4-rank config with exchange.scheme = "ps" and ps_servers = 1

Parameter servers are the last exchange.ps_servers ranks; the others run `akorun worker`.
"""

LAUNCH_EPILOG = """\
examples:
  akorun launch --workers 3 --rounds 200 --out runs/three
  akorun launch --workers 4 --link-bandwidth 40mbps --p auto --ssp 2 --out runs/wan
  akorun launch --config configs/uniform-lan.toml --optimizer sgd --out runs/lan
  akorun launch --workers 3 --scheme ps --set exchange.ps_servers=1 --out runs/ps

Writes OUT/cluster.toml, OUT/worker-R.log, OUT/worker-R.json, OUT/worker-R.npz and
OUT/result.json (config, per-rank results, summary keys as akosim names them).
Ctrl-C stops the ranks gracefully (SIGTERM, then SIGKILL after --kill-grace).
"""


def _duration(text: str, flag: str) -> float:
    try:
        value = parse_duration(text)
    except UnitError as error:
        raise UsageError(f"{flag}: {error}") from None
    if value <= 0:
        raise UsageError(f"{flag}: got {text!r}, expected a duration > 0 such as 10s")
    return value


def _whole(text: str | None, flag: str, minimum: int = 0) -> int | None:
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise UsageError(f"{flag}: got {text!r}, expected a whole number >= {minimum}")
    return value


def _add_runtime_flags(parser: argparse.ArgumentParser, *, launch: bool) -> None:
    group = parser.add_argument_group("akorun process settings")
    add = group.add_argument
    if not launch:
        add("--rank", metavar="R", default=None,
            help="this process's rank 0..N-1 (else AKORUN_RANK, RANK or SLURM_PROCID)")
        add("--out", metavar="DIR", default=None,
            help="write OUT/worker-R.json and OUT/worker-R.npz here")
        add("--resume", action="store_true",
            help="restart this rank: rejoin the live run from a peer's snapshot, or go on "
                 "from its checkpoint when no peer is alive (scheme ako)")
    add("--peer-timeout", metavar="DURATION", default=None,
        help="a peer silent this long leaves the SSP gate until it speaks again, e.g. 10s "
             "(default: the cluster file's, 10s)")
    add("--checkpoint-every", metavar="N", default=None,
        help="write a checkpoint every N rounds, 0 = only the final one (default: the "
             "cluster file's, 0)")
    add("--checkpoint-dir", metavar="DIR", default=None,
        help="where checkpoints go (default: OUT/checkpoints)")
    add("--join-timeout", metavar="DURATION", default=None,
        help="how long to wait for every rank's hello at start, e.g. 120s (default 120s)")
    emulate = group.add_mutually_exclusive_group()
    emulate.add_argument("--emulate", dest="emulate", action="store_const", const=True,
                         default=None,
                         help="shape every send in-process to [network] (bandwidth in bits/s, "
                              "latency per message), default on loopback")
    emulate.add_argument("--no-emulate", dest="emulate", action="store_const", const=False,
                         help="send at the real network's speed (default with real hosts)")
    add("--progress-every", metavar="DURATION", default=None,
        help="print a progress line this often, e.g. 5s (default 5s; launch 2s)")
    add("--quiet", action="store_true", help="no progress lines, warnings only")
    if not launch:
        add("--listen", metavar="HOST", default=None,
            help="address to bind, e.g. 0.0.0.0 (default: this rank's host in cluster.hosts)")
        add("--grace", metavar="DURATION", default=None,
            help="after finishing, keep serving until every peer is done or this long "
                 "(default: the peer timeout)")
        add("--tls-cert", metavar="PEM", default=None,
            help="serve HTTPS with this certificate (default: the cluster file's tls_cert)")
        add("--tls-key", metavar="PEM", default=None, help="private key of --tls-cert")
        add("--tls-ca", metavar="PEM", default=None,
            help="CA bundle to verify peers' certificates (default: the system CAs and the "
                 "run's own certificate, so a self-signed one works)")
        add("--queue-messages", metavar="N", default=None,
            help="messages owed to one peer before sending waits (backpressure), default 64")


def _shared_flags_help() -> str:
    """The shared run settings, as every subcommand accepts them, for the top-level help."""
    probe = ArgumentParser(prog="akorun COMMAND", add_help=False, formatter_class=_FORMATTER)
    add_shared_arguments(probe)
    text = probe.format_help()
    return text[text.index("\n\n") + 2:] if "\n\n" in text else text


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="akorun",
        description="Real-mode Ako: CPU workers train one model with no parameter server, "
                    "exchanging gradient partitions over HTTP with stale-synchronous gating.",
        epilog="examples:\n  akorun launch --workers 3 --rounds 100 --out runs/demo\n"
               "  akorun init --workers 3 --out cluster.toml && "
               "akorun worker --rank 0 --config cluster.toml\n\n"
               "every command also takes the " + _shared_flags_help(),
        formatter_class=_FORMATTER)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    init = commands.add_parser("init", help="write a cluster file for a run",
                               description="Write a complete cluster file: the run config "
                                           "tables plus an [akorun] table with a fresh run id "
                                           "and secret.",
                               epilog=INIT_EPILOG, formatter_class=_FORMATTER)
    init.add_argument("--out", metavar="FILE", required=True, help="cluster file to write")
    init.add_argument("--hosts", metavar="HOST[:PORT],...", default=None,
                      help="one host per rank, e.g. a,b,c or a:7000,b:7000 (default: loopback "
                           "with free ports)")
    init.add_argument("--base-port", metavar="PORT", default=str(DEFAULT_BASE_PORT),
                      help=f"port for hosts given without one (default {DEFAULT_BASE_PORT})")
    init.add_argument("--peer-timeout", metavar="DURATION", default="10s",
                      help="silence before a peer leaves the SSP gate, e.g. 10s")
    init.add_argument("--checkpoint-every", metavar="N", default="0",
                      help="checkpoint every N rounds (0 = only the final one)")
    init.add_argument("--emulate", choices=EMULATE_MODES, default="auto",
                      help="shape sends in-process: auto (loopback only), on, off")
    init.add_argument("--tls-cert", metavar="PEM", default=None,
                      help="certificate every rank serves with (HTTPS)")
    init.add_argument("--tls-key", metavar="PEM", default=None, help="its private key")
    init.add_argument("--force", action="store_true", help="overwrite an existing file")
    add_shared_arguments(init)
    init.set_defaults(handler=cmd_init)

    for name, help_text, epilog in (
            ("worker", "run one training rank", WORKER_EPILOG),
            ("ps", "run one parameter-server rank (exchange.scheme = ps)", PS_EPILOG)):
        sub = commands.add_parser(name, help=help_text, description=help_text[0].upper()
                                  + help_text[1:] + " from a cluster file.",
                                  epilog=epilog, formatter_class=_FORMATTER)
        _add_runtime_flags(sub, launch=False)
        add_shared_arguments(sub)
        sub.set_defaults(handler=cmd_worker, role=name)

    run = commands.add_parser("launch", help="run every rank on this machine",
                              description="Start N ranks on loopback as subprocesses, show "
                                          "progress, wait, and merge OUT/result.json.",
                              epilog=LAUNCH_EPILOG, formatter_class=_FORMATTER)
    run.add_argument("--out", metavar="DIR", required=True, help="run directory")
    run.add_argument("--kill-grace", metavar="DURATION", default="20s",
                     help="after SIGTERM, SIGKILL ranks still running this much later")
    run.add_argument("--timeout", metavar="DURATION", default=None,
                     help="stop the whole run after this long, e.g. 10m")
    _add_runtime_flags(run, launch=True)
    add_shared_arguments(run)
    run.set_defaults(handler=cmd_launch)
    return parser


# ------------------------------------------------------------------------ commands


def cmd_init(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    _check_workload(cfg.train.workload)
    n = cfg.cluster.workers
    base_port = _whole(args.base_port, "--base-port", 1)
    if args.hosts is not None:
        hosts = hosts_from_text(args.hosts, n, base_port or DEFAULT_BASE_PORT)
    elif cfg.cluster.hosts:
        hosts = cfg.cluster.hosts
    else:
        hosts = loopback_hosts(n)
    try:
        cfg = with_hosts(cfg, hosts)
    except ConfigError as error:
        raise UsageError(f"--hosts: {error}") from None
    if (args.tls_cert is None) != (args.tls_key is None):
        raise UsageError("--tls-cert and --tls-key: give both or neither")
    for path in (args.tls_cert, args.tls_key):
        if path is not None and not os.path.isfile(path):
            raise UsageError(f"{path}: TLS file not found")
    settings = new_settings(peer_timeout_s=_duration(args.peer_timeout, "--peer-timeout"),
                            checkpoint_every=_whole(args.checkpoint_every, "--checkpoint-every"),
                            emulate=args.emulate, tls_cert=args.tls_cert, tls_key=args.tls_key)
    path = write_cluster_file(args.out, cfg, settings, force=args.force)
    sys.stderr.write(f"wrote {path} (mode 0600): {n} ranks at {', '.join(hosts)}\n"
                     f"start each with: akorun worker --rank R --config {path}\n")
    return 0


def _setup_logging(prefix: str, quiet: bool) -> None:
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING if quiet else logging.INFO,
                        format=f"%(asctime)s {prefix} %(levelname)s %(message)s",
                        datefmt="%H:%M:%S", force=True)


def cmd_worker(args: argparse.Namespace) -> int:
    if args.config is None:
        raise UsageError("--config FILE is required: the cluster file written by `akorun init`")
    cluster = read_cluster_file(args.config)
    cfg = config_over(cluster.config, cluster.tables, args)
    _check_workload(cfg.train.workload)
    settings = cluster.settings
    rank = resolve_rank(_whole(args.rank, "--rank"), os.environ, cfg.cluster.workers)
    role = check_role(cfg, rank, args.role)
    out = Path(args.out) if args.out else None
    checkpoint_dir = Path(args.checkpoint_dir) if args.checkpoint_dir else (
        out / "checkpoints" if out else None)
    if args.resume and checkpoint_dir is None:
        checkpoint_dir = Path(".")
    peer_timeout_s = _duration(args.peer_timeout, "--peer-timeout") if args.peer_timeout \
        else settings.peer_timeout_s
    every = _whole(args.checkpoint_every, "--checkpoint-every")
    tls = TLSOptions(cert=args.tls_cert or settings.tls_cert,
                     key=args.tls_key or settings.tls_key, ca=args.tls_ca)
    if (tls.cert is None) != (tls.key is None):
        raise UsageError("--tls-cert and --tls-key: give both or neither")
    for path in (tls.cert, tls.key, tls.ca):
        if path is not None and not os.path.isfile(path):
            raise UsageError(f"{path}: TLS file not found")
    options = WorkerOptions(
        rank=rank, config=cfg, settings=settings, out_dir=out, checkpoint_dir=checkpoint_dir,
        checkpoint_every=every if every is not None else settings.checkpoint_every,
        resume=args.resume, listen_host=args.listen,
        emulate=should_emulate(settings, cfg, args.emulate), peer_timeout_s=peer_timeout_s,
        join_timeout_s=_duration(args.join_timeout, "--join-timeout")
        if args.join_timeout else 120.0,
        grace_s=_duration(args.grace, "--grace") if args.grace else None,
        progress_every_s=_duration(args.progress_every, "--progress-every")
        if args.progress_every else 5.0,
        quiet=args.quiet, tls=tls, faults=faults_for(rank, os.environ),
        queue_messages=_whole(args.queue_messages, "--queue-messages", 1) or 64)
    _setup_logging(f"akorun[{role} {rank}]", args.quiet)
    worker = Worker(options)
    worker.prepare()
    asyncio.run(worker.run())
    if out is not None and not args.quiet:
        sys.stderr.write(summary_line(worker.rank_result) + "\n")
    return 0


def _check_workload(name: str) -> None:
    """Refuse an unknown workload before starting any process (options are checked later)."""
    base, _ = parse_workload_spec(name)
    if base not in WORKLOAD_NAMES:
        raise UsageError(f"train.workload: unknown workload {base!r}; expected one of "
                         f"{', '.join(WORKLOAD_NAMES)}")


def cmd_launch(args: argparse.Namespace) -> int:
    cfg, file_settings = run_config_from_args(args)
    _check_workload(cfg.train.workload)
    changes: dict[str, object] = {}
    if file_settings is not None:
        changes = {"peer_timeout_s": file_settings.peer_timeout_s,
                   "checkpoint_every": file_settings.checkpoint_every,
                   "emulate": file_settings.emulate}
    if args.peer_timeout:
        changes["peer_timeout_s"] = _duration(args.peer_timeout, "--peer-timeout")
    every = _whole(args.checkpoint_every, "--checkpoint-every")
    if every is not None:
        changes["checkpoint_every"] = every
    if args.emulate is not None:
        changes["emulate"] = "on" if args.emulate else "off"
    settings = new_settings(**changes)
    progress_s = _duration(args.progress_every, "--progress-every") if args.progress_every \
        else 2.0
    options = LaunchOptions(
        out_dir=Path(args.out), quiet=args.quiet, progress_every_s=progress_s,
        kill_grace_s=_duration(args.kill_grace, "--kill-grace"),
        timeout_s=_duration(args.timeout, "--timeout") if args.timeout else None,
        worker_args=worker_flags(
            quiet=args.quiet, join_timeout=args.join_timeout,
            checkpoint_dir=args.checkpoint_dir,
            progress_every_s=_duration(args.progress_every, "--progress-every")
            if args.progress_every else None))
    launch(cfg, settings, options)
    return 0


# ------------------------------------------------------------------------ main


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split())


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    prog = f"akorun {args.command}"
    try:
        return int(args.handler(args))
    except (UsageError, ConfigError, UnitError) as error:
        sys.stderr.write(f"{prog}: error: {_one_line(error)}\n")
        return EXIT_USAGE
    except RunError as error:
        sys.stderr.write(f"{prog}: failed: {error}\n")
        return EXIT_RUN_FAILED
    except Interrupted as error:
        sys.stderr.write(f"{prog}: interrupted: {error}\n")
        return EXIT_INTERRUPTED
    except KeyboardInterrupt:
        sys.stderr.write(f"{prog}: interrupted\n")
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
