"""The `akorun` command line: init, worker, ps, launch, merge, measure-messages.

This module owns the commands and exit statuses (the flags and help are
akorun.launching.cli_parser's): each subcommand turns its flags into the dataclasses
of the module that does the work (akorun.launching.cluster, akorun.runtime.worker,
akorun.launching.local). Every subcommand takes the shared run flags of
akocore.settings.cli_flags (the same vocabulary as akosim).

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
from akocore.records.results import RunResult
from akocore.settings.cli_flags import arg_layers
from akocore.settings.layers import Given, ResolvedSettings, resolve
from akocore.settings.normalise import ConfigError
from akocore.settings.schema import RunConfig, TrainConfig
from akocore.settings.toml_io import file_layer
from akocore.units import UnitError
from akocore.workloads.flat import FlatWorkload
from akorun.errors import (
    EXIT_INTERRUPTED,
    EXIT_RUN_FAILED,
    EXIT_USAGE,
    Interrupted,
    RunError,
    UsageError,
)
from akorun.faults import faults_for
from akorun.launching.cli_parser import build_parser
from akorun.launching.cluster import (
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
from akorun.launching.devices import device_env
from akorun.launching.local import (
    LAUNCHER_PID_ENV,
    LaunchOptions,
    check_run_directory,
    launch,
    share_host_cores,
    worker_flags,
)
from akorun.launching.merge_command import cmd_merge, merge_if_complete
from akorun.launching.rendezvous import address_from
from akorun.launching.requests import InitRequest, LaunchRequest, RankRequest
from akorun.launching.testbed.runner import TestbedOptions, launch_on_testbed
from akorun.runtime.island import (
    IslandShape,
    device_memory_line,
    follow_leader,
    island_process_index,
    island_workload_of,
    open_island,
)
from akorun.runtime.node_plan import check_role
from akorun.runtime.rank_options import TLSOptions, WorkerOptions
from akorun.runtime.worker import Worker
from akorun.runtime.worker import run_rank as run_rank_here
from akorun.transport.keys import rank_key_file, write_rank_key_files
from akorun.transport.port_check import check_port_free

# ------------------------------------------------------------------------ commands


def _check_tls_files(*paths: str | None) -> None:
    for path in paths:
        if path is not None and not os.path.isfile(path):
            raise UsageError(f"{path}: TLS file not found")


def cmd_init(args: argparse.Namespace) -> int:
    init_cluster(InitRequest.from_args(args), arg_layers(args))
    return 0


def init_cluster(request: InitRequest, layers: Sequence[Given]) -> Path:
    """Write the cluster file of `layers` (`akorun init` and `akorun.init`); its path."""
    resolved = resolve(layers)
    cfg = resolved.config
    _check_workload(cfg.train)
    _check_site_devices(cfg, new_settings(resolved.akorun))
    n = cfg.cluster.workers
    if request.hosts is not None:
        hosts = hosts_from_text(request.hosts, n, request.base_port)
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
    if request.per_rank_keys is None:
        path = write_cluster_file(request.out, cfg, settings, force=request.force,
                                  resolved=resolved)
        sys.stderr.write(f"wrote {path} (mode 0600): {n} ranks at {', '.join(hosts)}\n"
                         f"start each with: akorun worker --rank R --config {path}\n")
        return Path(path)
    key_dir = request.per_rank_keys
    taken = [rank_key_file(key_dir, rank) for rank in range(n)
             if rank_key_file(key_dir, rank).exists()]
    if taken and not request.force:
        raise UsageError(f"{taken[0]} exists; pass --force to overwrite the key files")
    path = write_cluster_file(request.out, cfg, dataclasses.replace(settings, secret=None),
                              force=request.force, resolved=resolved)
    write_rank_key_files(key_dir, settings.secret_bytes, settings.run_id_bytes, n)
    sys.stderr.write(f"wrote {path} (mode 0600, no secret): {n} ranks at {', '.join(hosts)}, "
                     f"and {rank_key_file(key_dir, 'R')} (0600) for R = 0..{n - 1}\n"
                     f"copy to host R only its own key file; start each with: akorun worker "
                     f"--rank R --config {path} --keys {rank_key_file(key_dir, 'R')}\n")
    return Path(path)


def _setup_logging(prefix: str, quiet: bool) -> None:
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING if quiet else logging.INFO,
                        format=f"%(asctime)s {prefix} %(levelname)s %(message)s",
                        datefmt="%H:%M:%S", force=True)


def worker_settings(args: argparse.Namespace) -> tuple[ResolvedSettings, AkorunSettings]:
    """A rank's settings: the cluster file < --set < flags, and its [akorun] settings."""
    request = RankRequest.from_args(args)
    return rank_settings(request.config, [*file_layer(request.config),
                                          *arg_layers(args, config_file=False)])


def rank_settings(cluster_file: Path, layers: Sequence[Given],
                  ) -> tuple[ResolvedSettings, AkorunSettings]:
    """A rank's settings (`layers`: the cluster file's, then those above it) and its
    [akorun] settings."""
    resolved = resolve(layers)
    settings = settings_of(resolved, str(cluster_file))
    if settings.secret is not None:
        warn_if_readable_by_others(str(cluster_file),
                                   "the cluster file (it holds the run's secret)")
    return resolved, settings


def rank_options(request: RankRequest, layers: Sequence[Given] = ()) -> WorkerOptions:
    """One rank's options (`akorun worker` / `ps` and the API): the cluster file <
    `layers` (--set and flags, or a call's overrides and keywords); UsageError for a
    mistake, before anything starts."""
    resolved, settings = rank_settings(request.config,
                                       [*file_layer(request.config), *layers])
    cfg = resolved.config
    try:
        check_distinct_endpoints(cfg.cluster.hosts)
    except ConfigError as error:
        raise UsageError(f"{request.config}: {error}") from None
    rank_flag = request.rank
    address = address_from(request.rendezvous, os.environ)
    wanted = requested_rank(rank_flag, os.environ, cfg.cluster.workers)
    if address is not None and request.resume:
        raise UsageError("--resume cannot meet the others at a rendezvous (it serves a run's "
                         "start only): restart the rank with --rank R and a cluster file "
                         "that lists the hosts")
    if address is None:
        rank = resolve_rank(rank_flag, os.environ, cfg.cluster.workers)
        check_role(cfg, rank, request.role)
    # a rank started by hand gets its devices before JAX starts (launch's children have them)
    shape = island_shape(settings, request.role)
    os.environ.update(device_env(shape.platform, shape.devices_per_process, os.environ))
    _check_workload(cfg.train)
    _check_site_devices(cfg, settings)
    out = request.out
    if out is not None:
        check_out_directory(out)  # before training, not after it
    if address is not None:  # every check that can fail here is done: now meet the others
        cfg, rank = _rendezvous(request, address, cfg, settings, wanted)
        check_role(cfg, rank, request.role)
    island_process = island_process_index(os.environ)
    if island_process == 0 and rank < len(cfg.cluster.hosts):  # none: the rank says so
        host, port = split_host(cfg.cluster.hosts[rank])
        check_port_free(request.listen or host, port, rank)  # before the workload or JAX loads
    settings.rank_keys(rank, cfg.cluster.workers)  # a missing or foreign key file: exit 2 now
    checkpoint_dir = request.checkpoint_dir or (out / "checkpoints" if out else None)
    if request.resume and checkpoint_dir is None:
        checkpoint_dir = Path(".")
    tls = TLSOptions(cert=settings.tls_cert, key=settings.tls_key, ca=request.tls_ca)
    _check_tls_files(tls.cert, tls.key, tls.ca)
    optional: dict[str, Any] = {}
    if request.progress_every_s:
        optional["progress_every_s"] = request.progress_every_s
    return WorkerOptions(
        rank=rank, config=cfg, settings=settings, out_dir=out, checkpoint_dir=checkpoint_dir,
        checkpoint_every=settings.checkpoint_every, resume=request.resume,
        listen_host=request.listen, emulate=should_emulate(settings, cfg),
        peer_timeout_s=settings.peer_timeout_s, join_timeout_s=settings.join_timeout_s,
        grace_s=request.grace_s, quiet=request.quiet, tls=tls,
        faults=faults_for(rank, os.environ), queue_messages=settings.queue_messages,
        **optional)


def _rendezvous(request: RankRequest, address_text: str, cfg: RunConfig,
                settings: AkorunSettings, wanted: int | None) -> tuple[RunConfig, int]:
    """Meet the other ranks at the rendezvous: the run config with every rank's host, and
    this process's rank (`wanted`, when a flag or variable gave one)."""
    from akorun.launching.rendezvous import ENV_ADDRESS, meet, parse_address, route_address

    address = parse_address(address_text,
                            "--rendezvous" if request.rendezvous else ENV_ADDRESS)
    if settings.secret is None:
        raise UsageError("--rendezvous needs the run's secret in the cluster file (one written "
                         "without --per-rank-keys)")
    host = request.advertise or route_address(*address)
    try:
        port = free_ports(1, request.listen or host)[0]
    except OSError as error:
        raise UsageError(f"--advertise {host}: not an address of this machine to listen on "
                         f"({error.strerror or error}); give --listen 0.0.0.0 too") from None
    endpoint = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    joined = meet(address, secret=settings.secret_bytes, run_id=settings.run_id,
                  run_id_bytes=settings.run_id_bytes, world=cfg.cluster.workers,
                  wanted=wanted, endpoint=endpoint, timeout_s=settings.join_timeout_s)
    if not request.quiet:
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


def run_rank(options: WorkerOptions, workload: FlatWorkload | None = None) -> Worker:
    """Run one rank to its end (akorun.runtime.worker.run_rank), then merge the run's
    records when this rank's out dir holds every rank's and no launcher will (a rank
    started by hand, or by a scheduler)."""
    worker = run_rank_here(options, workload)
    out = options.out_dir
    if out is not None and LAUNCHER_PID_ENV not in os.environ:
        merge_if_complete(out, options.settings.run_id, options.config.cluster.workers,
                          quiet=options.quiet)
    return worker


def cmd_worker(args: argparse.Namespace) -> int:
    options = rank_options(RankRequest.from_args(args), arg_layers(args, config_file=False))
    assert isinstance(options.settings, AkorunSettings)  # what rank_options builds
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
    """What `akorun launch` flags run (`run_settings`)."""
    return run_settings(LaunchRequest.from_args(args), arg_layers(args))


def run_settings(request: LaunchRequest, layers: Sequence[Given],
                 ) -> tuple[ResolvedSettings, AkorunSettings]:
    """What a launch runs: defaults < the plan's layer (the configuration an akosim plan
    recommends) < `layers` (a run config or a cluster file < --set < flags, or a call's
    file < overrides < keywords), with a fresh run id and secret."""
    below = []
    if request.plan is not None:
        from akorun.launching.plan_layer import plan_layer

        below = plan_layer(str(request.plan), request.plan_rank)
    elif request.plan_rank is not None:
        raise UsageError("--plan-rank needs --plan PLAN.json (the plan whose ranking it "
                         "picks from)")
    resolved = resolve([*below, *layers])
    return resolved, new_settings(resolved.akorun)


def launch_run(request: LaunchRequest, layers: Sequence[Given]) -> RunResult:
    """Every rank of a launch on this machine, to the merged result (the one path of
    `akorun launch` and `akorun.launch`)."""
    resolved, settings = run_settings(request, layers)
    cfg = resolved.config
    _check_workload(cfg.train)
    _check_site_devices(cfg, settings)
    progress: dict[str, Any] = {}  # given process options; LaunchOptions holds the defaults
    if request.progress_every_s:
        progress["progress_every_s"] = request.progress_every_s
    if request.kill_grace_s:
        progress["kill_grace_s"] = request.kill_grace_s
    out_dir = request.out
    check_run_directory(out_dir, force=request.force)
    check_out_directory(out_dir, keep=False)  # before any rank starts; made when written
    options = LaunchOptions(
        out_dir=out_dir, quiet=request.quiet, timeout_s=request.timeout_s,
        worker_args=worker_flags(quiet=request.quiet,
                                 checkpoint_dir=None if request.checkpoint_dir is None
                                 else str(request.checkpoint_dir),
                                 progress_every_s=progress.get("progress_every_s")),
        **progress)
    if request.testbed is None:
        given = [flag for flag, value in (("--testbed-latency", request.testbed_latency),
                                          ("--testbed-downlink", request.testbed_downlink),
                                          ("--testbed-jitter", request.testbed_jitter_s))
                 if value is not None]
        if given:
            raise UsageError(f"{given[0]} needs --testbed netns")
        return launch(cfg, settings, options, resolved=resolved)
    testbed = TestbedOptions(kind=request.testbed, latency=request.testbed_latency or "delay",
                             downlink=request.testbed_downlink is not False,
                             jitter_s=request.testbed_jitter_s or 0.0)
    return launch_on_testbed(cfg, settings, options, testbed, resolved=resolved)


def cmd_launch(args: argparse.Namespace) -> int:
    launch_run(LaunchRequest.from_args(args), arg_layers(args))
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
