"""The testbed's delay line: latency without netem, measured through real kernel TCP.

The first tests need nothing (the schedule, the routes planned, the loop on a
SOCK_SEQPACKET pair standing in for the TUN device). The tests marked netns
need root, `ip`, `tc`, network namespaces and /dev/net/tun, and are skipped
with the reason otherwise: they build two namespaces routed through the delay
line with the testbed's own code (tests/delay_line_probe.py), shape them with
tc htb, and measure the round trip (TCP connect, a one-byte request/answer, ICMP
echo) and a bulk TCP transfer. What they assert is what scheduling noise cannot
undo: no round trip is shorter than the configured one, no transfer faster than
the shaped rate. How close the round trips and the rate come to the configured
values are figures of the benchmark (``python -m tests.bench --only delay_line``).
"""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from akocore.records.results import RunResult
from akocore.records.testbed_record import TESTBED_RECORD_FILE
from akocore.records.testbed_record import TestbedRecord as Record
from akorun.errors import UsageError
from akorun.launching.testbed import delaypath, netns
from akorun.launching.testbed.delayline import VNET_HDR_BYTES, DelayLine, DelaySchedule, pair_of
from akorun.launching.testbed.netns import SUBNET, SUBNET_PREFIX
from akorun.launching.testbed.runner import DELAY_LINE_FILE
from akorun.testing import REPO_ROOT, child_test_env
from tests import delay_line_probe

A, B = "10.77.0.1", "10.77.0.2"


def _packet(src: str, dst: str, payload: bytes = b"") -> bytes:
    ip = bytes([0x45, 0]) + struct.pack("!H", 20 + len(payload)) + bytes(8) + \
        socket.inet_aton(src) + socket.inet_aton(dst)
    return bytes(VNET_HDR_BYTES) + ip + payload


# ------------------------------------------------------------------ pure parts


def test_the_schedule_delays_each_ordered_pair_and_keeps_a_pairs_order() -> None:
    schedule = DelaySchedule.from_matrix([A, B], [[0.0, 0.01], [0.03, 0.0]], jitter_s=0.004)
    pair = pair_of(_packet(A, B))
    back = pair_of(_packet(B, A))
    assert pair is not None and back is not None
    assert schedule.release_s(pair, 1.0, 0.0, 0.5) == pytest.approx(1.01)
    assert schedule.release_s(back, 1.0, 0.0, 0.5) == pytest.approx(1.03)
    assert schedule.release_s(pair, 1.0, 0.0, 0.0) == pytest.approx(1.006)  # -jitter
    assert schedule.release_s(pair, 1.0, 0.0, 1.0) == pytest.approx(1.014)  # +jitter
    assert schedule.release_s(pair, 1.0, 1.02, 0.0) == 1.02  # never before the previous one
    assert schedule.release_s((pair[0], socket.inet_aton("10.9.9.9")), 1.0, 0.0, 0.5) is None
    assert pair_of(bytes(VNET_HDR_BYTES) + bytes([0x60]) + bytes(40)) is None  # IPv6
    assert DelaySchedule.from_json(json.loads(json.dumps(schedule.to_json()))) == schedule


def test_the_line_holds_every_packet_its_delay_and_keeps_their_order() -> None:
    ours, line_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    stop_r, stop_w = os.pipe()
    schedule = DelaySchedule.from_matrix([A, B], [[0.0, 0.02], [0.05, 0.0]])
    line = DelayLine(line_end.fileno(), schedule)
    line_end.setblocking(False)
    thread = threading.Thread(target=line.run, args=(stop_r,), daemon=True)
    thread.start()
    sent: dict[bytes, float] = {}
    for k in range(5):
        for src, dst in ((A, B), (B, A)):
            packet = _packet(src, dst, bytes([k]) * 100)
            sent[packet] = time.monotonic()
            ours.send(packet)
    ours.send(bytes(VNET_HDR_BYTES) + bytes([0x60]) + bytes(40))  # not IPv4: dropped
    ours.settimeout(5.0)
    back = []
    for _ in range(10):
        packet = ours.recv(4096)
        back.append((packet, time.monotonic()))
    os.write(stop_w, b"x")
    thread.join(5.0)
    for packet, arrived in back:
        delay = 0.02 if packet[VNET_HDR_BYTES + 12:VNET_HDR_BYTES + 16] == \
            socket.inet_aton(A) else 0.05
        assert arrived - sent[packet] >= delay
    forward = [p[-1] for p, _ in back if pair_of(p) == pair_of(_packet(A, B))]
    assert forward == [0, 1, 2, 3, 4]
    assert [pair_of(p) for p, _ in back][:5] == [pair_of(_packet(A, B))] * 5  # 20 ms first
    assert line.stats.packets == 10 and line.stats.dropped_foreign == 1
    assert line.stats.bytes == 10 * 120
    ours.close()
    line_end.close()


def test_the_routes_send_every_rank_to_rank_packet_through_the_tun_device() -> None:
    ports = [delaypath.RankPort(rank=r, namespace=f"n{r}", device=f"r{r}", hub_port=f"p{r}",
                                address=f"10.77.0.{r + 1}") for r in range(2)]
    plan = delaypath.plan_delay_path("hub", "tun", ports, SUBNET, SUBNET_PREFIX)
    commands = [" ".join(c) for c in plan.before_line + plan.after_line]
    assert [c[:6] for c in plan.after_line][0] == ("ip", "-n", "hub", "link", "set", "tun")
    assert not any("tun" in c and " up" in c for c in map(" ".join, plan.before_line))
    assert "ip -n hub rule add pref 100 iif tun lookup main" in commands
    assert "ip -n hub route add default dev tun table 200" in commands
    assert "ip -n n1 route add 10.77.0.0/24 via 10.77.0.254 dev r1" in commands
    assert (f"ip -n n1 neigh add 10.77.0.254 lladdr {delaypath.hub_mac(1)} dev r1 nud "
            f"permanent") in commands
    assert (f"ip -n hub neigh add 10.77.0.2 lladdr {delaypath.rank_mac(1)} dev p1 nud "
            f"permanent") in commands
    assert delaypath.rank_mac(258) == "02:77:00:00:01:02"


def test_the_line_load_is_each_uplink_or_its_pair_caps_where_smaller() -> None:
    caps = np.array([[np.inf, 40e6, 40e6], [40e6, np.inf, 40e6], [40e6, 40e6, np.inf]])
    assert delaypath.line_load_bps(np.array([1e9] * 3), caps) == 240e6
    assert delaypath.line_load_bps(np.array([20e6] * 3), caps) == 60e6
    with pytest.raises(UsageError, match="at most 1000 Mbit/s"):
        delaypath.check_delay(np.full((3, 3), 0.02), 1.2e9, 0.0)
    delaypath.check_delay(np.array([[0.0, 0.0], [0.02, 0.0]]), 100e6, 0.002)  # zeros allowed


# ------------------------------------------------------------------ on the kernel


def _requirements() -> None:
    reason = delay_line_probe.missing()
    if reason:
        pytest.skip(reason)


ONE_WAY_S = (0.005, 0.025, 0.05)  # RTT 10, 50, 100 ms
RATES_BPS = (5e6, 50e6)
KERNEL_RTT_RESOLUTION_S = 1e-6  # tcpi_min_rtt is whole microseconds (rounded down)
# htb passes at most its bucket (1 ms at the rate) above the rate, and the payload is less
# than the shaped bytes (headers): 2% over the rate is never reached by a working shaper
RATE_SLACK = 0.02


@pytest.mark.netns
@pytest.mark.timeout(600)
@pytest.mark.parametrize("rate_bps", RATES_BPS)
def test_the_delay_line_never_shortens_a_round_trip_and_the_rate_stays_under_its_cap(
        rate_bps: float) -> None:
    """Every round trip through the line takes at least twice the one-way delay (the line
    holds each packet its delay by the monotonic clock the probes read; load can only
    add to it): each ICMP echo, each one-byte TCP request/answer, the TCP connect and
    the kernel's own smallest TCP RTT. A bulk TCP transfer, timed from before its sockets
    were made until it returned (load can only lengthen that), is not faster than the
    shaped rate. How close to the configured RTT and rate they come is the benchmark's
    (tests/bench/bench_delay_line.py: testbed.delay_line_*)."""
    _requirements()
    for one_way_s in ONE_WAY_S:
        try:
            sample = delay_line_probe.measure(one_way_s, rate_bps)
        except UsageError as error:
            pytest.skip(f"the kernel refused the delayed testbed: {error}")
        figures = sample.figures()
        rtt_s = sample.rtt_s
        assert min(sample.pings_s) >= rtt_s, figures
        assert min(sample.answers_s) >= rtt_s, figures
        assert sample.connect_s >= rtt_s, figures
        assert sample.kernel_min_rtt_s >= rtt_s - KERNEL_RTT_RESOLUTION_S, figures
        assert sample.bulk_bytes * 8 / sample.bulk_outer_s <= rate_bps * (1 + RATE_SLACK), \
            figures
        stats = sample.line
        assert stats is not None and stats["packets"] > 0 and stats["write_errors"] == 0


@pytest.mark.netns
@pytest.mark.timeout(400)
def test_a_launch_with_latency_and_jitter_ends_with_equal_replicas_and_records_the_delays(
        tmp_path: Path) -> None:
    _requirements()
    out = tmp_path / "run"
    command = [sys.executable, "-m", "akorun", "launch", "--testbed", "netns", "--workers", "3",
               "--bandwidth", "20mbps", "--latency", "10ms,20ms,5ms", "--testbed-jitter", "2ms",
               "--workload", "digits-mlp", "--optimizer", "sgd", "--lr", "0.05", "--rounds", "8",
               "--set", "train.eval_every=1000", "--quiet", "--out", str(out)]
    done = subprocess.run(command, cwd=REPO_ROOT, env=child_test_env(), capture_output=True,
                          text=True, timeout=380, check=False)
    if "testbed: `" in done.stderr:
        pytest.skip(f"the kernel refused the testbed: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    record = Record.from_json(json.loads((out / TESTBED_RECORD_FILE).read_text()))
    assert record.latency_matrix_s == ((0.0, 0.01, 0.02), (0.01, 0.0, 0.005),
                                       (0.02, 0.005, 0.0))
    assert record.bridge == "" and record.delay_device and record.latency_ignored_s == 0.0
    assert record.delay_jitter_s == 0.002
    result = RunResult.from_json(json.loads((out / "result.json").read_text()))
    assert all(r.rounds == 8 and not r.failed for r in result.per_worker)
    assert result.max_relative_difference is not None
    assert result.max_relative_difference <= 1e-5
    stats = json.loads((out / DELAY_LINE_FILE).read_text())
    assert stats["packets"] > 0 and stats["write_errors"] == 0
    assert not [n for n in netns.namespaces() if n.startswith(record.tag)]
