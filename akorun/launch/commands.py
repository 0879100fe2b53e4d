"""The `akorun` command line: init, worker, ps, launch, merge, measure-messages.

This module owns the commands and exit statuses (the flags and help are
akorun.launch.cli_parser's): each subcommand turns its flags into the dataclasses
of the module that does the work (akorun.launch.cluster, akorun.runtime.worker,
akorun.launch.local). Every subcommand takes the shared run flags of
akocore.config (the same vocabulary as akosim).

Exit statuses: 0 done; 1 the run failed (one line naming the rank and why;
launch adds the tail of the failed rank's log); 2 a user mistake (ONE line on
stderr saying what was wrong and what is allowed, never a traceback);
130 interrupted.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from akocore.cli_support import check_out_directory, load_scheme_plugins, one_line
from akocore.config import (
    ConfigError,
    ResolvedSettings,
    RunConfig,
    TrainConfig,
    resolve_args,
)
from akocore.results import RunResult
from akocore.units import UnitError
from akorun.errors import (
    EXIT_INTERRUPTED,
    EXIT_RUN_FAILED,
    EXIT_USAGE,
    Interrupted,
    RunError,
    UsageError,
)
from akorun.faults import faults_for
from akorun.launch.cli_parser import build_parser, parse_duration_arg, parse_whole_arg
from akorun.launch.cluster import (
    DEFAULT_BASE_PORT,
    AkorunSettings,
    check_distinct_endpoints,
    free_ports,
    hosts_from_text,
    loopback_hosts,
    new_settings,
    requested_rank,
    resolve_rank,
    settings_of,
    should_emulate,
    split_host,
    warn_if_readable_by_others,
    with_hosts,
    write_cluster_file,
)
from akorun.launch.devices import device_env
from akorun.launch.local import (
    LaunchOptions,
    check_run_directory,
    launch,
    share_host_cores,
    worker_flags,
)
from akorun.launch.merge_command import cmd_merge
from akorun.launch.rendezvous import address_from
from akorun.launch.testbed.runner import TestbedOptions, launch_on_testbed
from akorun.runtime.island import (
    IslandShape,
    device_memory_line,
    follow_leader,
    island_process_index,
    island_workload_of,
    open_island,
)
from akorun.runtime.node_plan import check_role
from akorun.runtime.worker import TLSOptions, WorkerOptions, run_rank
from akorun.transport.keys import rank_key_file, write_rank_key_files
from akorun.transport.port_check import check_port_free

# ------------------------------------------------------------------------ commands


def _check_tls_files(*paths: str | None) -> None:
    for path in paths:
        if path is not None and not os.path.isfile(path):
            raise UsageError(f"{path}: TLS file not found")


def cmd_init(args: argparse.Namespace) -> int:
    resolved = resolve_args(args)
    cfg = resolved.config
    _check_workload(cfg.train)
    _check_site_devices(cfg, new_settings(resolved.akorun))
    n = cfg.cluster.workers
    base_port = parse_whole_arg(args.base_port, "--base-port", 1)
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
    settings = new_settings(resolved.akorun)
    _check_tls_files(settings.tls_cert, settings.tls_key)
    if args.per_rank_keys is None:
        path = write_cluster_file(args.out, cfg, settings, force=args.force, resolved=resolved)
        sys.stderr.write(f"wrote {path} (mode 0600): {n} ranks at {', '.join(hosts)}\n"
                         f"start each with: akorun worker --rank R --config {path}\n")
        return 0
    key_dir = Path(args.per_rank_keys)
    taken = [rank_key_file(key_dir, rank) for rank in range(n)
             if rank_key_file(key_dir, rank).exists()]
    if taken and not args.force:
        raise UsageError(f"{taken[0]} exists; pass --force to overwrite the key files")
    path = write_cluster_file(args.out, cfg, dataclasses.replace(settings, secret=None),
                              force=args.force, resolved=resolved)
    write_rank_key_files(key_dir, settings.secret_bytes, settings.run_id_bytes, n)
    sys.stderr.write(f"wrote {path} (mode 0600, no secret): {n} ranks at {', '.join(hosts)}, "
                     f"and {rank_key_file(key_dir, 'R')} (0600) for R = 0..{n - 1}\n"
                     f"copy to host R only its own key file; start each with: akorun worker "
                     f"--rank R --config {path} --keys {rank_key_file(key_dir, 'R')}\n")
    return 0


def _setup_logging(prefix: str, quiet: bool) -> None:
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING if quiet else logging.INFO,
                        format=f"%(asctime)s {prefix} %(levelname)s %(message)s",
                        datefmt="%H:%M:%S", force=True)


def worker_settings(args: argparse.Namespace) -> tuple[ResolvedSettings, AkorunSettings]:
    """A rank's settings: the cluster file < --set < flags, and its [akorun] settings."""
    if args.config is None:
        raise UsageError("--config FILE is required: the cluster file written by `akorun init`")
    resolved = resolve_args(args)
    settings = settings_of(resolved, args.config)
    if settings.secret is not None:
        warn_if_readable_by_others(args.config, "the cluster file (it holds the run's secret)")
    return resolved, settings


def rank_options(args: argparse.Namespace) -> WorkerOptions:
    """One rank's options from `akorun worker` / `akorun ps` flags (the cluster file <
    --set < flags); UsageError for a mistake, before anything starts."""
    resolved, settings = worker_settings(args)
    cfg = resolved.config
    try:
        check_distinct_endpoints(cfg.cluster.hosts)
    except ConfigError as error:
        raise UsageError(f"{args.config}: {error}") from None
    rank_flag = parse_whole_arg(args.rank, "--rank")
    address = address_from(args.rendezvous, os.environ)
    wanted = requested_rank(rank_flag, os.environ, cfg.cluster.workers)
    if address is not None and args.resume:
        raise UsageError("--resume cannot meet the others at a rendezvous (it serves a run's "
                         "start only): restart the rank with --rank R and a cluster file "
                         "that lists the hosts")
    if address is None:
        rank = resolve_rank(rank_flag, os.environ, cfg.cluster.workers)
        check_role(cfg, rank, args.role)
    # a rank started by hand gets its devices before JAX starts (launch's children have them)
    shape = island_shape(settings, args.role)
    os.environ.update(device_env(shape.platform, shape.devices_per_process, os.environ))
    _check_workload(cfg.train)
    _check_site_devices(cfg, settings)
    out = Path(args.out) if args.out else None
    if out is not None:
        check_out_directory(out)  # before training, not after it
    if address is not None:  # every check that can fail here is done: now meet the others
        cfg, rank = _rendezvous(args, address, cfg, settings, wanted)
        check_role(cfg, rank, args.role)
    island_process = island_process_index(os.environ)
    if island_process == 0 and rank < len(cfg.cluster.hosts):  # none: the rank says so
        host, port = split_host(cfg.cluster.hosts[rank])
        check_port_free(args.listen or host, port, rank)  # before the workload or JAX loads
    settings.rank_keys(rank, cfg.cluster.workers)  # a missing or foreign key file: exit 2 now
    checkpoint_dir = Path(args.checkpoint_dir) if args.checkpoint_dir else (
        out / "checkpoints" if out else None)
    if args.resume and checkpoint_dir is None:
        checkpoint_dir = Path(".")
    tls = TLSOptions(cert=settings.tls_cert, key=settings.tls_key, ca=args.tls_ca)
    _check_tls_files(tls.cert, tls.key, tls.ca)
    optional: dict[str, Any] = {}
    if args.progress_every:
        optional["progress_every_s"] = parse_duration_arg(args.progress_every, "--progress-every")
    return WorkerOptions(
        rank=rank, config=cfg, settings=settings, out_dir=out, checkpoint_dir=checkpoint_dir,
        checkpoint_every=settings.checkpoint_every, resume=args.resume,
        listen_host=args.listen, emulate=should_emulate(settings, cfg),
        peer_timeout_s=settings.peer_timeout_s, join_timeout_s=settings.join_timeout_s,
        grace_s=parse_duration_arg(args.grace, "--grace") if args.grace else None,
        quiet=args.quiet, tls=tls, faults=faults_for(rank, os.environ),
        queue_messages=settings.queue_messages, **optional)


def _rendezvous(args: argparse.Namespace, address_text: str, cfg: RunConfig,
                settings: AkorunSettings, wanted: int | None) -> tuple[RunConfig, int]:
    """Meet the other ranks at the rendezvous: the run config with every rank's host, and
    this process's rank (`wanted`, when a flag or variable gave one)."""
    from akorun.launch.rendezvous import ENV_ADDRESS, meet, parse_address, route_address

    address = parse_address(address_text, "--rendezvous" if args.rendezvous else ENV_ADDRESS)
    if settings.secret is None:
        raise UsageError("--rendezvous needs the run's secret in the cluster file (one written "
                         "without --per-rank-keys)")
    host = args.advertise or route_address(*address)
    try:
        port = free_ports(1, args.listen or host)[0]
    except OSError as error:
        raise UsageError(f"--advertise {host}: not an address of this machine to listen on "
                         f"({error.strerror or error}); give --listen 0.0.0.0 too") from None
    endpoint = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    joined = meet(address, secret=settings.secret_bytes, run_id=settings.run_id,
                  run_id_bytes=settings.run_id_bytes, world=cfg.cluster.workers,
                  wanted=wanted, endpoint=endpoint, timeout_s=settings.join_timeout_s)
    if not args.quiet:
        sys.stderr.write(f"akorun: rendezvous at {address[0]}:{address[1]}: rank {joined.rank} "
                         f"of {len(joined.hosts)}, listening on {endpoint}; the ranks' hosts: "
                         f"{','.join(joined.hosts)}\n")
    return with_hosts(cfg, joined.hosts), joined.rank


def island_shape(settings: AkorunSettings, role: str) -> IslandShape:
    """The island a rank of `role` forms (a parameter server is one process, one device)."""
    if role != "worker":
        return IslandShape(platform=settings.platform)
    return IslandShape(devices_per_process=settings.devices_per_rank,
                       processes=settings.processes_per_rank, platform=settings.platform)


def cmd_worker(args: argparse.Namespace) -> int:
    options = rank_options(args)
    shape = island_shape(options.settings, args.role)
    share_host_cores(options.config.cluster.hosts, options.rank)
    process = island_process_index(os.environ)
    suffix = f".{process}" if shape.processes > 1 else ""
    _setup_logging(f"akorun[{args.role} {options.rank}{suffix}]", args.quiet)
    island = open_island(shape)
    if island is not None and not island.leader:
        follow_leader(island, options.config.train)
        return 0
    try:
        run_rank(options, None if island is None
                 else island_workload_of(island, options.config.train))
        if "jax" in sys.modules:  # what the devices held at their peak
            logging.getLogger("akorun").info(
                "%s", device_memory_line(island.devices if island is not None else None))
    finally:
        if island is not None:
            island.close()
    return 0


def _check_site_devices(cfg: RunConfig, settings: AkorunSettings) -> None:
    """The sites' devices per rank (a site's DEVICESdev@, what akosim plans) must be the
    island akorun runs (--devices-per-rank x --processes-per-rank), or be left at one."""
    devices = set(cfg.cluster.devices_per_rank)
    island = settings.devices_per_rank * settings.processes_per_rank
    if devices == {1} or devices == {island}:
        return
    listed = ", ".join(map(str, cfg.cluster.devices_per_rank))
    raise UsageError(f"cluster.devices_per_rank = {listed} (the sites' devices per rank), but "
                     f"akorun runs islands of {island} device(s): give --devices-per-rank "
                     f"(and --processes-per-rank) so that each rank has "
                     f"{max(devices)} devices, or sites of one device per rank")


def _check_workload(train: TrainConfig) -> None:
    """Refuse an unknown workload or a broken factory before starting any process (a
    built-in's options and data are checked when each rank builds it)."""
    from akocore.workloads.naming import WorkloadError, load_workload_spec, parse_workload_name

    try:
        name = parse_workload_name(train.workload)
        if name.builtin is None:  # import the user's file and call the factory once
            load_workload_spec(name, seed=train.seed, data_path=train.data_path)
    except WorkloadError as error:
        raise UsageError(f"train.workload: {error}") from None


def launch_settings(args: argparse.Namespace) -> tuple[ResolvedSettings, AkorunSettings]:
    """What `akorun launch` runs: defaults < --plan (the configuration an akosim plan
    recommends) < --config (a run config or a cluster file) < --set < flags, with a fresh
    run id and secret."""
    below = []
    if getattr(args, "plan", None):
        from akorun.launch.plan_layer import plan_layer

        rank = parse_whole_arg(getattr(args, "plan_rank", None), "--plan-rank", minimum=1)
        below = plan_layer(args.plan, rank)
    elif getattr(args, "plan_rank", None) is not None:
        raise UsageError("--plan-rank needs --plan PLAN.json (the plan whose ranking it "
                         "picks from)")
    resolved = resolve_args(args, below=below)
    return resolved, new_settings(resolved.akorun)


def launch_run(args: argparse.Namespace) -> RunResult:
    """Every rank of `akorun launch` flags on this machine, to the merged result (the one
    path of `akorun launch` and `akorun.launch`)."""
    resolved, settings = launch_settings(args)
    cfg = resolved.config
    _check_workload(cfg.train)
    _check_site_devices(cfg, settings)
    progress: dict[str, Any] = {}  # given process flags; LaunchOptions holds the defaults
    if args.progress_every:
        progress["progress_every_s"] = parse_duration_arg(args.progress_every, "--progress-every")
    if args.kill_grace:
        progress["kill_grace_s"] = parse_duration_arg(args.kill_grace, "--kill-grace")
    out_dir = Path(args.out)
    check_run_directory(out_dir, force=args.force)
    check_out_directory(out_dir, keep=False)  # before any rank starts; made when written
    options = LaunchOptions(
        out_dir=out_dir, quiet=args.quiet,
        timeout_s=parse_duration_arg(args.timeout, "--timeout") if args.timeout else None,
        worker_args=worker_flags(quiet=args.quiet, checkpoint_dir=args.checkpoint_dir,
                                 progress_every_s=progress.get("progress_every_s")),
        **progress)
    if args.testbed is None:
        given = [flag for flag, value in (("--testbed-latency", args.testbed_latency),
                                          ("--testbed-downlink", args.testbed_downlink),
                                          ("--testbed-jitter", args.testbed_jitter))
                 if value is not None]
        if given:
            raise UsageError(f"{given[0]} needs --testbed netns")
        return launch(cfg, settings, options, resolved=resolved)
    jitter_s = (parse_duration_arg(args.testbed_jitter, "--testbed-jitter")
                if args.testbed_jitter else 0.0)
    testbed = TestbedOptions(kind=args.testbed, latency=args.testbed_latency or "delay",
                             downlink=args.testbed_downlink != "off", jitter_s=jitter_s)
    return launch_on_testbed(cfg, settings, options, testbed, resolved=resolved)


def cmd_launch(args: argparse.Namespace) -> int:
    launch_run(args)
    return 0


# ------------------------------------------------------------------------ main

HANDLERS: dict[str, Any] = {"init": cmd_init, "worker": cmd_worker, "ps": cmd_worker,
                            "launch": cmd_launch, "merge": cmd_merge}


def main(argv: Sequence[str] | None = None) -> int:
    load_scheme_plugins(os.environ, "akorun")
    parser = build_parser()
    args = parser.parse_args(argv)
    prog = f"akorun {args.command}"
    try:
        handler = getattr(args, "handler", None) or HANDLERS[args.command]
        return int(handler(args))
    except (UsageError, ConfigError, UnitError) as error:
        sys.stderr.write(f"{prog}: error: {one_line(error)}\n")
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
