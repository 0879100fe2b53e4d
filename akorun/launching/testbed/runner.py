"""`akorun launch --testbed netns`: a run over real kernel TCP between network namespaces.

This module owns the order of one testbed run: check the config and the
machine (a usage error, exit status 2, before anything is created), remove
what a killed earlier run left, build the namespaces and bridge
(akorun.launching.testbed.netns), apply the shaping (akocore.hosttools.shaping), write
``OUT/testbed.json`` (akocore.records.testbed_record), run the ranks with
akorun.launching.local (one `ip netns exec NS` prefix per rank, in-process emulation
off), and tear everything down: on success, failure, Ctrl-C and SIGTERM.

Signals: while the testbed is being built, SIGINT/SIGTERM interrupt the build
(the teardown still runs); while the ranks run, akorun.launching.local stops them
gracefully; during the teardown they are ignored so that it completes.
`_Interrupts` stays installed around launch (which puts its own in place for
the ranks' lifetime), so no moment is left with Python's default.
A SIGKILL leaves the namespaces behind: the next testbed run removes them
(`remove_stale`).

Latency: this kernel has no netem, so tc cannot delay packets. A config with
a latency above zero is run with the hub routing through the delay line
(akorun.launching.testbed.delaypath, akorun.launching.testbed.delayline), which holds each packet
for its pair's one-way latency (`network.latency`/`latency_matrix`, one-way as
in akosim); what it cannot realise faithfully is refused (one line). With the
latency policy ``ignore`` the run goes on without latency and the record says
how much it left out (`latency_ignored_s`). The line's statistics (packets,
timer lateness, CPU) go to ``OUT/delay_line.json`` when it stops.
"""

from __future__ import annotations

import json
import os
import platform
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from types import FrameType
from typing import Any

from akocore.hosttools.shaping import HTB_QUANTUM_BYTES, plan_shaping
from akocore.records.results import RunResult
from akocore.records.testbed_record import (
    LATENCY_POLICIES,
    TESTBED_RECORD_FILE,
    TestbedNode,
    TestbedRecord,
)
from akocore.settings.layers import ResolvedSettings
from akocore.settings.schema import RunConfig
from akorun.errors import Interrupted, UsageError
from akorun.launching.cluster import AkorunSettings
from akorun.launching.local import LaunchOptions, Placement, launch, status_of
from akorun.launching.testbed.delayline import DelaySchedule
from akorun.launching.testbed.delaypath import (
    DelayLineProcess,
    RankPort,
    check_delay,
    line_load_bps,
    plan_delay_path,
)
from akorun.launching.testbed.netns import (
    MTU_BYTES,
    RANK_PORT,
    SUBNET,
    SUBNET_PREFIX,
    NetnsTestbed,
    TestbedError,
    TestbedNames,
    entered,
    missing_requirements,
    remove_stale,
)
from akorun.transport.keys import restrict_new_files

TESTBEDS = ("netns",)
SIGNALS = (signal.SIGINT, signal.SIGTERM)
DELAY_LINE_FILE = "delay_line.json"  # the delay line's statistics, in the run directory


@dataclass(frozen=True)
class TestbedOptions:
    """How the testbed realises the config's network."""

    kind: str = "netns"
    downlink: bool = True  # shape the bridge-side egress towards each rank (its NIC in)
    latency: str = "delay"  # or "ignore": run without the config's latency
    jitter_s: float = 0.0  # uniform +- jitter on each packet's delay (the delay line)


def check_testbed(cfg: RunConfig, settings: AkorunSettings, options: TestbedOptions) -> float:
    """UsageError when the testbed cannot run `cfg` here; the latency it will leave out
    (0 when the delay line realises it, or there is none)."""
    if options.kind not in TESTBEDS:
        raise UsageError(f"--testbed: got {options.kind!r}, expected one of "
                         f"{', '.join(TESTBEDS)}")
    if options.latency not in LATENCY_POLICIES:
        raise UsageError(f"--testbed-latency: got {options.latency!r}, expected one of "
                         f"{', '.join(LATENCY_POLICIES)}")
    if settings.emulate == "on":
        raise UsageError("--testbed netns: akorun.emulate = on would shape twice; the testbed "
                         "runs with in-process emulation off (leave emulate at auto or off)")
    n = cfg.cluster.workers
    latency = cfg.network.latency_matrix(n)
    latency_s = float(latency.max())
    if options.jitter_s > 0 and (latency_s == 0 or options.latency == "ignore"):
        raise UsageError("--testbed-jitter: needs a latency above zero that the testbed "
                         "realises (network.latency, and not --testbed-latency ignore)")
    if latency_s > 0 and options.latency == "delay":
        check_delay(latency, line_load_bps(cfg.network.uplink_bps(n),
                                           cfg.network.link_bps_matrix(n)), options.jitter_s)
    missing = missing_requirements()
    if missing is not None:
        raise TestbedError(f"--testbed netns: {missing}")
    tun_missing = missing_tun() if latency_s > 0 and options.latency == "delay" else None
    if tun_missing is not None:
        raise TestbedError(f"--testbed netns: the delay line {tun_missing}")
    return latency_s if options.latency == "ignore" else 0.0


def missing_tun() -> str | None:
    """What the delay line lacks here (a TUN device), in one line, or None."""
    if not os.path.exists("/dev/net/tun"):
        return "needs /dev/net/tun (the tun module)"
    return None


def delayed(cfg: RunConfig, options: TestbedOptions) -> bool:
    """Whether the run goes through the delay line."""
    return options.latency == "delay" and \
        float(cfg.network.latency_matrix(cfg.cluster.workers).max()) > 0


class _Interrupts:
    """A SIGINT/SIGTERM handler: raises Interrupted while armed, else (teardown) ignores."""

    def __init__(self) -> None:
        self.armed = True

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.armed:
            raise Interrupted(f"{signal.Signals(signum).name} while building the testbed; "
                              f"torn down")


@contextmanager
def _signals(handler: Any) -> Iterator[None]:
    previous = {signum: signal.signal(signum, handler) for signum in SIGNALS}
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


def _record(testbed: NetnsTestbed, cfg: RunConfig, options: TestbedOptions,
            latency_ignored_s: float, queues: Any, delay_line: bool) -> TestbedRecord:
    names = testbed.names
    n = names.workers
    uplink = cfg.network.uplink_bps(n)
    downlink = cfg.network.downlink_bps(n)
    nodes = tuple(TestbedNode(
        rank=r, namespace=names.namespace(r), device=names.device(r),
        bridge_port=names.bridge_port(r), address=names.address(r), port=RANK_PORT,
        uplink_bps=float(uplink[r]),
        downlink_bps=float(downlink[r]) if options.downlink else None) for r in range(n))
    latency = tuple(tuple(float(v) for v in row) for row in cfg.network.latency_matrix(n))
    return TestbedRecord(
        testbed=options.kind, tag=names.tag, hub_namespace=names.hub,
        bridge="" if delay_line else names.bridge,
        subnet=SUBNET, mtu=MTU_BYTES, nodes=nodes, queues=tuple(queues),
        downlink_shaped=options.downlink, latency_policy=options.latency,
        latency_ignored_s=latency_ignored_s, in_process_emulation=False,
        htb_quantum_bytes=HTB_QUANTUM_BYTES,
        tcp_congestion_control=testbed.read_sysctl(0, "net.ipv4.tcp_congestion_control"),
        kernel=platform.release(), commands=tuple(testbed.commands),
        latency_matrix_s=latency if delay_line else None,
        delay_jitter_s=options.jitter_s if delay_line else 0.0,
        delay_device=names.tun if delay_line else "")


def _delay_path(testbed: NetnsTestbed, cfg: RunConfig,
                options: TestbedOptions) -> DelayLineProcess:
    """Route the hub through the delay line and start it."""
    names = testbed.names
    n = names.workers
    ports = [RankPort(rank=r, namespace=names.namespace(r), device=names.device(r),
                      hub_port=names.bridge_port(r), address=names.address(r))
             for r in range(n)]
    plan = plan_delay_path(names.hub, names.tun, ports, SUBNET, SUBNET_PREFIX)
    testbed.apply(plan.before_line)
    schedule = DelaySchedule.from_matrix([names.address(r) for r in range(n)],
                                         cfg.network.latency_matrix(n).tolist(),
                                         options.jitter_s)
    line = DelayLineProcess(names.hub, names.tun, schedule)
    line.start()
    try:
        testbed.apply(plan.after_line)
    except BaseException:
        line.stop()
        raise
    return line


def placement_of(names: TestbedNames) -> Placement:
    """Rank R runs under `ip netns exec` in its namespace; /status is polled from inside."""

    def status(rank: int, url: str) -> dict[str, Any] | None:
        try:
            with entered(names.namespace(rank)):
                return status_of(url)
        except OSError:
            return None

    return Placement(
        hosts=tuple(f"{names.address(r)}:{RANK_PORT}" for r in range(names.workers)),
        prefixes=tuple(("ip", "netns", "exec", names.namespace(r))
                       for r in range(names.workers)),
        status=status)


def _keep_stats(line: DelayLineProcess, out_dir: Any) -> None:
    """Stop the delay line; its statistics into OUT/delay_line.json."""
    stats = line.stop()
    if stats is not None and out_dir.is_dir():
        (out_dir / DELAY_LINE_FILE).write_text(json.dumps(stats, indent=1) + "\n",
                                               encoding="utf-8")


def launch_on_testbed(cfg: RunConfig, settings: AkorunSettings, options: LaunchOptions,
                      testbed_options: TestbedOptions, *,
                      resolved: ResolvedSettings | None = None) -> RunResult:
    """Build the testbed, run every rank in it, tear it down; akorun.launching.local's result."""
    latency_ignored_s = check_testbed(cfg, settings, testbed_options)
    removed = remove_stale()
    if removed and not options.quiet:
        sys.stderr.write(f"[testbed] removed what a killed run left: {', '.join(removed)}\n")
    testbed = NetnsTestbed(TestbedNames.for_pid(os.getpid(), cfg.cluster.workers))
    delay_line = delayed(cfg, testbed_options)
    line: DelayLineProcess | None = None
    interrupts = _Interrupts()
    with _signals(interrupts):  # launch installs its own while the ranks run
        try:
            testbed.up(bridged=not delay_line)
            if delay_line:
                line = _delay_path(testbed, cfg, testbed_options)
            plan = plan_shaping(cfg.network, [testbed.names.node(r)
                                              for r in range(cfg.cluster.workers)],
                                downlink=testbed_options.downlink)
            testbed.apply(plan.commands)
            record = _record(testbed, cfg, testbed_options, latency_ignored_s, plan.queues,
                             delay_line)
            restrict_new_files()
            options.out_dir.mkdir(parents=True, exist_ok=True)
            (options.out_dir / TESTBED_RECORD_FILE).write_text(
                json.dumps(record.to_json(), indent=1) + "\n", encoding="utf-8")
            if not options.quiet:
                joined = (f"routed through the delay line {testbed.names.tun} "
                          f"({line.priority})" if line is not None
                          else f"on bridge {testbed.names.bridge}")
                sys.stderr.write(f"[testbed] {cfg.cluster.workers} namespaces "
                                 f"{testbed.names.tag}* {joined}, "
                                 f"{len(plan.queues)} htb classes; record "
                                 f"{options.out_dir / TESTBED_RECORD_FILE}\n")
            return launch(cfg, replace(settings, emulate="off"), options, resolved=resolved,
                          placement=placement_of(testbed.names))
        finally:
            interrupts.armed = False  # the teardown runs to its end
            try:
                if line is not None:
                    _keep_stats(line, options.out_dir)
            finally:
                left = testbed.down()
                if left:
                    sys.stderr.write(f"[testbed] could not delete {', '.join(left)}; the "
                                     f"next testbed run removes them\n")
