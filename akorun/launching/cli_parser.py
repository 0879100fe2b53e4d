"""akorun's command-line parser: every subcommand's flags, help and examples, and the
parsing of its duration and count flags (the commands themselves: akorun.launching.commands)."""


from __future__ import annotations

import argparse

from akocore.cli_support import OneLineParser
from akocore.records.testbed_record import LATENCY_POLICIES
from akocore.settings.cli_flags import add_akorun_arguments, add_shared_arguments
from akocore.settings.key_registry import Tool
from akocore.units import UnitError, parse_duration
from akorun import message_bench
from akorun.errors import (
    UsageError,
)
from akorun.launching.cluster import (
    DEFAULT_BASE_PORT,
)
from akorun.launching.local import (
    LaunchOptions,
)
from akorun.launching.testbed.runner import TESTBEDS
from akorun.runtime.rank_options import WorkerOptions

ArgumentParser = OneLineParser  # one-line errors: `akorun worker: error: ... (see --help)`, 2

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
  AKORUN_ISLAND_COORDINATOR=node1:6000 AKORUN_ISLAND_PROCESS=1 akorun worker --rank 0 \\
        --config cluster.toml --processes-per-rank 2 --devices-per-rank 8
      process 1 of rank 0's island (process 0, on node1, is the rank; unset, both
      variables come from jax.distributed's own detection: SLURM, Open MPI, Kubernetes)

Writes OUT/worker-R.json (result) and OUT/worker-R.npz (final params). Started by hand
(not by `akorun launch`), each rank at its end merges OUT/result.json when OUT holds every
rank's record of this run (a directory all hosts share): the last rank to finish writes it.
Otherwise run `akorun merge OUT` once the records are together.
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
  sudo akorun launch --testbed netns --workers 3 --bandwidth 20mbps --rounds 50 --out runs/tb
      real kernel TCP: one network namespace per rank on a bridge, tc htb shaping
  sudo akorun launch --testbed netns --workers 3 --bandwidth 40mbps --latency 20ms \\
        --out runs/tb-wan
      with 20 ms one-way latency per pair (40 ms RTT), held by the testbed's delay line
  akorun launch --workers 3 --devices-per-rank 2 --rounds 100 --out runs/islands
      each rank an island of 2 devices (here 2 CPU devices XLA makes): its step runs
      data-parallel over them, one reduced gradient per rank goes to the others
  akorun launch --workers 2 --processes-per-rank 2 --rounds 100 --out runs/dist
      each rank 2 processes joined by jax.distributed; OUT/worker-R.pP.log for P >= 1
  akorun launch --workers 2 --platform gpu --devices-per-rank 4 --out runs/gpu
      2 ranks of 4 GPUs each on an 8-GPU host (each rank sees only its own)

Writes OUT/cluster.toml, OUT/worker-R.log, OUT/worker-R.json, OUT/worker-R.npz and
OUT/result.json (config, per-rank results, summary keys as akosim names them);
with --testbed also OUT/testbed.json (akocore.records.testbed_record: the rates, bursts,
queue limits, addresses, delays and tc commands the testbed applied) and, with
latency, OUT/delay_line.json (the delay line's packets, timer lateness and CPU).
The testbed needs root, `ip` and `tc` (and /dev/net/tun for latency); its
namespaces are deleted when the run ends, fails or is stopped.
Ctrl-C stops the ranks gracefully (SIGTERM, then SIGKILL after --kill-grace).
The ranks die with the launcher: if it is killed (even SIGKILL), each gets SIGTERM,
finishes its round and writes its record; `akorun merge OUT` then writes OUT/result.json.
"""

MERGE_EPILOG = """\
examples:
  akorun merge runs/by-hand
      after `akorun init` and `akorun worker --rank R --out runs/by-hand` on each host
      (a shared directory, or every host's worker-R.json and worker-R.npz copied into it)
  akorun merge runs/three
      a run whose launcher was killed: its ranks wrote their records as they stopped

Writes RUN_DIR/result.json, the same record `akorun launch` writes, which
`akosim predict RUN_DIR` reads. Ranks with no record are merged as failed and the
result is marked partial ("partial": true, "missing_ranks": [...]); the exit status
is 0 unless there is nothing to merge (2).
"""


def parse_duration_arg(text: str, flag: str) -> float:
    try:
        value = parse_duration(text)
    except UnitError as error:
        raise UsageError(f"{flag}: {error}") from None
    if value <= 0:
        raise UsageError(f"{flag}: got {text!r}, expected a duration > 0 such as 10s")
    return value


def parse_whole_arg(text: str | None, flag: str, minimum: int = 0) -> int | None:
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise UsageError(f"{flag}: got {text!r}, expected a whole number >= {minimum}")
    return value


def _add_runtime_flags(parser: argparse.ArgumentParser, tool: Tool) -> None:
    group = parser.add_argument_group(
        "akorun process settings",
        "The [akorun] settings among these (peer and join timeouts, checkpoints, emulation, "
        "send queue, TLS) layer like the run settings: cluster file < --set akorun.KEY=VALUE "
        "< flag.")
    add = group.add_argument
    if tool is Tool.AKORUN_RANK:
        add("--rank", metavar="R", default=None,
            help="this process's rank 0..N-1 (else AKORUN_RANK, RANK, SLURM_PROCID or "
                 "JOB_COMPLETION_INDEX; with --rendezvous and none of these, the order of "
                 "arrival)")
        add("--rendezvous", metavar="HOST:PORT", default=None,
            help="form the run without a host list: every rank registers at this address "
                 "(served by the rank on that machine that binds it first) and gets its rank "
                 "and the others' addresses (else AKORUN_RENDEZVOUS)")
        add("--advertise", metavar="HOST", default=None,
            help="with --rendezvous: the address the others reach this rank at (default: "
                 "this machine's address on the way to the rendezvous)")
        add("--out", metavar="DIR", default=None,
            help="write OUT/worker-R.json and OUT/worker-R.npz here")
        add("--resume", action="store_true",
            help="restart this rank: rejoin the live run from a peer's snapshot, or go on "
                 "from its checkpoint when no peer is alive (scheme ako)")
    add_akorun_arguments(group, tool)
    if tool is Tool.AKORUN_INIT:
        return
    add("--checkpoint-dir", metavar="DIR", default=None,
        help="where checkpoints go (default: OUT/checkpoints)")
    add("--progress-every", metavar="DURATION", default=None,
        help=f"print a progress line this often, e.g. 5s (default "
             f"{WorkerOptions.progress_every_s:g}s; launch {LaunchOptions.progress_every_s:g}s)")
    add("--quiet", action="store_true", help="no progress lines, warnings only")
    if tool is Tool.AKORUN_RANK:
        add("--listen", metavar="HOST", default=None,
            help="address to bind, e.g. 0.0.0.0 (default: this rank's host in cluster.hosts)")
        add("--grace", metavar="DURATION", default=None,
            help="after finishing, keep serving until every peer is done or this long "
                 "(default: the peer timeout)")
        add("--tls-ca", metavar="PEM", default=None,
            help="CA bundle to verify peers' certificates (default: the system CAs and the "
                 "run's own certificate, so a self-signed one works)")


def _shared_flags_help() -> str:
    """The shared run settings, as every subcommand accepts them, for the top-level help."""
    probe = ArgumentParser(prog="akorun COMMAND", add_help=False, formatter_class=_FORMATTER)
    add_shared_arguments(probe, Tool.AKORUN_LAUNCH)
    text = probe.format_help()
    return text[text.index("\n\n") + 2:] if "\n\n" in text else text


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="akorun",
        description="Real-mode Ako: CPU workers train one model with no parameter server, "
                    "exchanging gradient partitions over HTTP with stale-synchronous gating.",
        epilog="examples:\n  akorun launch --workers 3 --rounds 100 --out runs/demo\n"
               "  akorun init --workers 3 --out cluster.toml && "
               "akorun worker --rank 0 --config cluster.toml --out runs/demo\n"
               "  akorun merge runs/demo      (the run's result.json from its ranks' "
               "records)\n\n"
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
    init.add_argument("--force", action="store_true", help="overwrite an existing file")
    init.add_argument("--per-rank-keys", metavar="DIR", default=None,
                      help="also write DIR/rank-R.keys (0600), each holding only rank R's "
                           "pair keys, and leave the secret out of the cluster file: give "
                           "each host the cluster file and its own rank's key file only")
    _add_runtime_flags(init, Tool.AKORUN_INIT)
    add_shared_arguments(init, Tool.AKORUN_INIT)

    for name, help_text, epilog in (
            ("worker", "run one training rank", WORKER_EPILOG),
            ("ps", "run one parameter-server rank (exchange.scheme = ps)", PS_EPILOG)):
        sub = commands.add_parser(name, help=help_text, description=help_text[0].upper()
                                  + help_text[1:] + " from a cluster file.",
                                  epilog=epilog, formatter_class=_FORMATTER)
        _add_runtime_flags(sub, Tool.AKORUN_RANK)
        add_shared_arguments(sub, Tool.AKORUN_RANK)
        sub.set_defaults(role=name)

    run = commands.add_parser("launch", help="run every rank on this machine",
                              description="Start N ranks on loopback as subprocesses, show "
                                          "progress, wait, and merge OUT/result.json.",
                              epilog=LAUNCH_EPILOG, formatter_class=_FORMATTER)
    run.add_argument("--out", metavar="DIR", required=True, help="run directory")
    run.add_argument("--force", action="store_true",
                     help="reuse a run directory that already holds a run (overwriting it)")
    run.add_argument("--kill-grace", metavar="DURATION", default=None,
                     help="after SIGTERM, SIGKILL ranks still running this much later "
                          f"(default {LaunchOptions.kill_grace_s:g}s)")
    run.add_argument("--timeout", metavar="DURATION", default=None,
                     help="stop the whole run after this long, e.g. 10m")
    run.add_argument("--plan", metavar="PLAN.json", default=None,
                     help="run the configuration an `akosim --out PLAN.json` plan recommends: "
                          "its cluster, network, workload, batch and exchange settings and "
                          "the recommended scheme with its p and s (--config, --set and "
                          "flags still override them; the plan's rounds are not taken)")
    run.add_argument("--plan-rank", metavar="N", default=None,
                     help="with --plan: run the configuration the plan's ranking by "
                          "accuracy puts at N (1 = first) instead of the recommended one")
    testbed = run.add_argument_group(
        "real-network testbed",
        "Run the ranks over real kernel TCP instead of loopback with in-process emulation: "
        "one network namespace per rank, veth pairs to a bridge, the config's network made "
        "with tc htb (uplink per node, downlink, per-pair caps). Needs root, ip and tc.")
    testbed.add_argument("--testbed", metavar="KIND", default=None, choices=TESTBEDS,
                         help=f"where the ranks run: {', '.join(TESTBEDS)}")
    testbed.add_argument("--testbed-latency", metavar="POLICY", default=None,
                         choices=LATENCY_POLICIES,
                         help="a config with latency > 0 (one-way, as in akosim): delay "
                              "(default: a delay line holds each packet for its pair's "
                              "latency) or ignore it (recorded in OUT/testbed.json)")
    testbed.add_argument("--testbed-jitter", metavar="DURATION", default=None,
                         help="add uniform +-jitter to each packet's delay, e.g. 2ms (a "
                              "pair's packets keep their order; default 0)")
    testbed.add_argument("--testbed-downlink", metavar="on|off", default=None,
                         choices=("on", "off"),
                         help="shape each rank's incoming side too (default on: the config's "
                              "NICs are symmetric)")
    _add_runtime_flags(run, Tool.AKORUN_LAUNCH)
    add_shared_arguments(run, Tool.AKORUN_LAUNCH)
    merge = commands.add_parser("merge", help="write a run's result.json from its ranks' "
                                              "records",
                                description="Merge the ranks' OUT/worker-R.json and "
                                            "OUT/worker-R.npz into OUT/result.json.",
                                epilog=MERGE_EPILOG, formatter_class=_FORMATTER)
    merge.add_argument("run_dir", metavar="RUN_DIR",
                       help="the directory holding the ranks' records (their --out)")
    merge.add_argument("--quiet", action="store_true", help="no summary table")
    # measure-messages: its own module (akorun.message_bench) owns flags and handler
    message_bench.add_parser(commands, _FORMATTER)
    return parser
