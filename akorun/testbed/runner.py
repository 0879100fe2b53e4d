"""`akorun launch --testbed netns`: a run over real kernel TCP between network namespaces.

This module owns the order of one testbed run: check the config and the
machine (a usage error, exit status 2, before anything is created), remove
what a killed earlier run left, build the namespaces and bridge
(akorun.testbed.netns), apply the shaping (akorun.testbed.shaping), write
``OUT/testbed.json`` (akocore.testbed_record), run the ranks with
akorun.launch (one `ip netns exec NS` prefix per rank, in-process emulation
off), and tear everything down: on success, failure, Ctrl-C and SIGTERM.

Signals: while the testbed is being built, SIGINT/SIGTERM interrupt the build
(the teardown still runs); while the ranks run, akorun.launch stops them
gracefully; during the teardown they are ignored so that it completes.
`_Interrupts` stays installed around launch (which puts its own in place for
the ranks' lifetime), so no moment is left with Python's default.
A SIGKILL leaves the namespaces behind: the next testbed run removes them
(`remove_stale`).

Latency: this kernel has no netem, so tc cannot delay packets. A config with
a latency above zero is refused (one line) unless the latency policy is
``ignore``; then the run goes on without it and the record says how much
latency it left out (`latency_ignored_s`).
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

from akocore.config import ResolvedSettings, RunConfig
from akocore.results import RunResult
from akocore.testbed_record import (
    LATENCY_POLICIES,
    TESTBED_RECORD_FILE,
    TestbedNode,
    TestbedRecord,
)
from akorun.cluster import AkorunSettings
from akorun.errors import Interrupted, UsageError
from akorun.keys import restrict_new_files
from akorun.launch import LaunchOptions, Placement, launch, status_of
from akorun.testbed.netns import (
    MTU_BYTES,
    RANK_PORT,
    SUBNET,
    NetnsTestbed,
    TestbedError,
    TestbedNames,
    entered,
    missing_requirements,
    remove_stale,
)
from akorun.testbed.shaping import HTB_QUANTUM_BYTES, plan_shaping

TESTBEDS = ("netns",)
SIGNALS = (signal.SIGINT, signal.SIGTERM)


@dataclass(frozen=True)
class TestbedOptions:
    """How the testbed realises the config's network."""

    kind: str = "netns"
    downlink: bool = True  # shape the bridge-side egress towards each rank (its NIC in)
    latency: str = "refuse"  # or "ignore": run without the config's latency


def check_testbed(cfg: RunConfig, settings: AkorunSettings, options: TestbedOptions) -> float:
    """UsageError when the testbed cannot run `cfg` here; the latency it will leave out."""
    if options.kind not in TESTBEDS:
        raise UsageError(f"--testbed: got {options.kind!r}, expected one of "
                         f"{', '.join(TESTBEDS)}")
    if options.latency not in LATENCY_POLICIES:
        raise UsageError(f"--testbed-latency: got {options.latency!r}, expected one of "
                         f"{', '.join(LATENCY_POLICIES)}")
    if settings.emulate == "on":
        raise UsageError("--testbed netns: akorun.emulate = on would shape twice; the testbed "
                         "runs with in-process emulation off (leave emulate at auto or off)")
    latency_s = float(cfg.network.latency_matrix(cfg.cluster.workers).max())
    if latency_s > 0 and options.latency == "refuse":
        raise UsageError(f"--testbed netns: network latency up to {latency_s * 1e3:g} ms, "
                         f"which this kernel cannot add (no netem); pass --testbed-latency "
                         f"ignore to run without it, or set network.latency = 0")
    missing = missing_requirements()
    if missing is not None:
        raise TestbedError(f"--testbed netns: {missing}")
    return latency_s


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
            latency_ignored_s: float, queues: Any) -> TestbedRecord:
    names = testbed.names
    n = names.workers
    uplink = cfg.network.uplink_bps(n)
    downlink = cfg.network.downlink_bps(n)
    nodes = tuple(TestbedNode(
        rank=r, namespace=names.namespace(r), device=names.device(r),
        bridge_port=names.bridge_port(r), address=names.address(r), port=RANK_PORT,
        uplink_bps=float(uplink[r]),
        downlink_bps=float(downlink[r]) if options.downlink else None) for r in range(n))
    return TestbedRecord(
        testbed=options.kind, tag=names.tag, hub_namespace=names.hub, bridge=names.bridge,
        subnet=SUBNET, mtu=MTU_BYTES, nodes=nodes, queues=tuple(queues),
        downlink_shaped=options.downlink, latency_policy=options.latency,
        latency_ignored_s=latency_ignored_s, in_process_emulation=False,
        htb_quantum_bytes=HTB_QUANTUM_BYTES,
        tcp_congestion_control=testbed.read_sysctl(0, "net.ipv4.tcp_congestion_control"),
        kernel=platform.release(), commands=tuple(testbed.commands))


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


def launch_on_testbed(cfg: RunConfig, settings: AkorunSettings, options: LaunchOptions,
                      testbed_options: TestbedOptions, *,
                      resolved: ResolvedSettings | None = None) -> RunResult:
    """Build the testbed, run every rank in it, tear it down; akorun.launch's result."""
    latency_ignored_s = check_testbed(cfg, settings, testbed_options)
    removed = remove_stale()
    if removed and not options.quiet:
        sys.stderr.write(f"[testbed] removed what a killed run left: {', '.join(removed)}\n")
    testbed = NetnsTestbed(TestbedNames.for_pid(os.getpid(), cfg.cluster.workers))
    interrupts = _Interrupts()
    with _signals(interrupts):  # launch installs its own while the ranks run
        try:
            testbed.up()
            plan = plan_shaping(cfg.network, [testbed.names.node(r)
                                              for r in range(cfg.cluster.workers)],
                                downlink=testbed_options.downlink)
            testbed.apply(plan.commands)
            record = _record(testbed, cfg, testbed_options, latency_ignored_s, plan.queues)
            restrict_new_files()
            options.out_dir.mkdir(parents=True, exist_ok=True)
            (options.out_dir / TESTBED_RECORD_FILE).write_text(
                json.dumps(record.to_json(), indent=1) + "\n", encoding="utf-8")
            if not options.quiet:
                sys.stderr.write(f"[testbed] {cfg.cluster.workers} namespaces "
                                 f"{testbed.names.tag}* on bridge {testbed.names.bridge}, "
                                 f"{len(plan.queues)} htb classes; record "
                                 f"{options.out_dir / TESTBED_RECORD_FILE}\n")
            return launch(cfg, replace(settings, emulate="off"), options, resolved=resolved,
                          placement=placement_of(testbed.names))
        finally:
            interrupts.armed = False  # the teardown runs to its end
            left = testbed.down()
            if left:
                sys.stderr.write(f"[testbed] could not delete {', '.join(left)}; the next "
                                 f"testbed run removes them\n")
