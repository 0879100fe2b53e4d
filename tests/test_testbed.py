"""The testbed's pure parts: names, the tc plan, the record, and the refusals (no root needed)."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from akocore.hosttools.shaping import (
    MIN_QUEUE_BYTES,
    burst_bytes,
    plan_shaping,
    queue_limit_bytes,
)
from akocore.records import testbed_record
from akocore.records.jsonrecord import RecordError
from akocore.records.testbed_record import ShapedQueue
from akocore.settings.toml_io import config_from_dict
from akorun.errors import UsageError
from akorun.launching.cluster import new_settings
from akorun.launching.testbed import netns, runner
from akorun.launching.testbed.netns import missing_requirements
from akorun.launching.testbed.runner import check_testbed
from akorun.testing import REPO_ROOT, child_test_env


def _cfg(**network: object) -> object:
    return config_from_dict({"cluster": {"workers": 3}, "network": network,
                             "train": {"workload": "digits-mlp"}})


def _nodes(workers: int = 3) -> list:
    names = netns.TestbedNames.for_pid(4194303, workers)
    return [names.node(r) for r in range(workers)]


def test_names_fit_the_kernel_and_carry_the_run_tag() -> None:
    names = netns.TestbedNames.for_pid(4194303, 250)  # the largest pid, the most ranks
    devices = [names.bridge, names.device(249), names.bridge_port(249)]
    assert all(len(d) <= 15 for d in devices), devices
    assert all(n.startswith("akotb4194303") for n in names.all_namespaces())
    assert len(set(names.all_namespaces())) == 251
    assert names.address(0) == "10.77.0.1" and names.address(249) == "10.77.0.250"


def test_uplink_and_downlink_classes_carry_the_configured_rate() -> None:
    cfg = _cfg(bandwidth="20mbps,40mbps")
    plan = plan_shaping(cfg.network, _nodes(), downlink=True)
    uplinks = [q for q in plan.queues if q.direction == "uplink"]
    downlinks = [q for q in plan.queues if q.direction == "downlink"]
    assert [q.ceil_bps for q in uplinks] == [20e6, 40e6, 20e6]
    assert [q.ceil_bps for q in downlinks] == [20e6, 40e6, 20e6]
    assert all(q.rate_bps == q.ceil_bps for q in plan.queues)  # one leaf each
    assert {q.namespace for q in downlinks} == {_nodes()[0].hub_namespace}
    assert all(q.queue_limit_bytes == queue_limit_bytes(q.ceil_bps) for q in plan.queues)
    commands = [" ".join(c) for c in plan.commands]
    assert sum("htb rate 20000000bit ceil 20000000bit" in c for c in commands) == 8
    assert not any("filter" in c for c in commands)  # no pair caps, no filters
    assert len(plan_shaping(cfg.network, _nodes(), downlink=False).queues) == 3


def test_a_pair_cap_is_a_filtered_class_under_the_senders_uplink() -> None:
    cfg = _cfg(bandwidth="100mbps", link_bandwidth_matrix=[
        ["inf", "10mbps", "inf"], ["inf", "inf", "500mbps"], ["inf", "inf", "inf"]])
    plan = plan_shaping(cfg.network, _nodes(), downlink=False)
    pair = [q for q in plan.queues if q.direction == "pair"]
    assert [(q.rank, q.peer, q.ceil_bps) for q in pair] == [(0, 1, 10e6), (1, 2, 100e6)]
    default = [q for q in plan.queues if q.direction == "uplink" and q.rank == 0][0]
    assert default.ceil_bps == 100e6 and default.rate_bps == 50e6  # two leaves share
    assert pair[0].rate_bps == 10e6  # a guaranteed rate never exceeds the ceiling
    filters = [c for c in plan.commands if "filter" in c]
    assert len(filters) == 2
    assert filters[0][filters[0].index("dst") + 1] == f"{_nodes()[1].address}/32"
    assert filters[0][-1] == "1:11"


def test_bursts_and_queues_have_floors_and_grow_with_the_rate() -> None:
    assert burst_bytes(1e6) == 3028 and burst_bytes(1e9) == 125000
    assert queue_limit_bytes(1e6) == MIN_QUEUE_BYTES and queue_limit_bytes(1e9) == 12_500_000


def test_the_record_round_trips_and_refuses_a_foreign_file() -> None:
    queue = ShapedQueue(rank=0, direction="pair", peer=1, namespace="n", device="d",
                        classid="1:11", rate_bps=1e6, ceil_bps=math.inf, burst_bytes=3028,
                        queue_limit_bytes=131072)
    node = testbed_record.TestbedNode(
        rank=0, namespace="n", device="d", bridge_port="p", address="10.77.0.1",
                       port=7070, uplink_bps=2e7, downlink_bps=None)
    record = testbed_record.TestbedRecord(testbed="netns", tag="akotb1", hub_namespace="akotb1h",
                           bridge="tb1br", subnet="10.77.0.0/24", mtu=1500, nodes=(node,),
                           queues=(queue,), downlink_shaped=False, latency_policy="ignore",
                           latency_ignored_s=0.002, in_process_emulation=False,
                           htb_quantum_bytes=1514, tcp_congestion_control="cubic",
                           kernel="6", commands=("ip netns add akotb1h",))
    assert testbed_record.TestbedRecord.from_json(record.to_json()) == record
    assert record.queue(0, "pair", 1) == queue and record.queue(0, "uplink") is None
    with pytest.raises(RecordError, match="kind"):
        testbed_record.TestbedRecord.from_json({**record.to_json(), "kind": "run"})
    with pytest.raises(RecordError, match="peer"):
        ShapedQueue(rank=0, direction="uplink", peer=1, namespace="n", device="d",
                    classid="1:2", rate_bps=1.0, ceil_bps=1.0, burst_bytes=1,
                    queue_limit_bytes=1)


def test_latency_the_delay_line_cannot_realise_is_refused_and_emulation_on_too() -> None:
    options = runner.TestbedOptions()
    with pytest.raises(UsageError, match="below the delay line's floor"):
        check_testbed(_cfg(bandwidth="20mbps", latency="1ms"), new_settings(), options)
    with pytest.raises(UsageError, match="above the delay line's"):
        check_testbed(_cfg(bandwidth="20mbps", latency="2s"), new_settings(), options)
    with pytest.raises(UsageError, match="delay line carries at most"):
        check_testbed(_cfg(bandwidth="400mbps", latency="20ms"), new_settings(), options)
    with pytest.raises(UsageError, match="--testbed-jitter"):
        check_testbed(_cfg(bandwidth="20mbps", latency="5ms"), new_settings(),
                      runner.TestbedOptions(jitter_s=0.01))
    with pytest.raises(UsageError, match="--testbed-jitter: needs a latency"):
        check_testbed(_cfg(bandwidth="20mbps"), new_settings(),
                      runner.TestbedOptions(jitter_s=0.001))
    ignored = check_testbed(_cfg(bandwidth="1gbps", latency="1ms"), new_settings(),
                            runner.TestbedOptions(latency="ignore"))
    assert ignored == 0.001  # what an ignored latency leaves out
    with pytest.raises(UsageError, match="emulate = on"):
        check_testbed(_cfg(), new_settings(emulate="on"), runner.TestbedOptions(latency="ignore"))


def test_missing_root_is_named() -> None:
    assert missing_requirements(euid=1000) == ("needs root (network namespaces, veth, bridges "
                                               "and tc qdiscs)")


def _launch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "akorun", "launch", *args],
                          capture_output=True, text=True, env=child_test_env(), cwd=REPO_ROOT,
                          timeout=120, check=False)


def test_the_cli_refuses_unrealisable_latency_and_stray_testbed_flags_with_one_line(
        tmp_path) -> None:
    done = _launch("--testbed", "netns", "--workers", "2", "--latency", "500us",
                   "--out", str(tmp_path / "a"))
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "floor" in done.stderr
    done = _launch("--testbed-latency", "ignore", "--workers", "2", "--out", str(tmp_path / "b"))
    assert done.returncode == 2 and "needs --testbed netns" in done.stderr, done.stderr
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_the_calibration_probe_shapes_its_link_with_the_testbeds_own_commands(
        monkeypatch) -> None:
    """``akosim calibrate --netns-rate`` builds its pair with akocore.hosttools: each end's
    egress is the tree the testbed gives an uplink of that rate without pair caps."""
    from akosim.calibration import netns_probe

    ran: list[tuple[str, ...]] = []
    monkeypatch.setattr(netns_probe, "netns_available", lambda: None)
    monkeypatch.setattr(netns_probe, "_run", ran.append)
    monkeypatch.setattr(netns_probe.subprocess, "run", lambda *args, **kwargs: None)
    with netns_probe._shaped_pair(20e6, testbed_queues=True) as (ns_a, _):
        pass
    veth = next(argv for argv in ran if argv[:3] == ("ip", "link", "add"))
    assert veth[4:6] == ("netns", ns_a)  # each end made inside its namespace
    probe_tree = [argv for argv in ran if argv[:3] == ("tc", "-n", ns_a)]
    node = netns.TestbedNames.for_pid(4194303, 1).node(0)
    testbed = plan_shaping(_cfg(bandwidth="20mbps").network, [node], downlink=False)
    mine = [argv for argv in testbed.commands if argv[2] == node.namespace]
    assert [argv[3:] for argv in probe_tree] == [
        tuple(veth[3] if word == node.device else word for word in argv[3:]) for argv in mine]


def test_the_host_requirements_are_said_once_for_every_netns_tool() -> None:
    from akocore.hosttools.netns_commands import missing_requirements as host_lacks

    assert host_lacks(0, lambda tool: True) is None
    assert host_lacks(0, lambda tool: tool != "tc") == "needs the `tc` command (iproute2)"
    assert host_lacks(1000, lambda tool: True) == missing_requirements(euid=1000)
