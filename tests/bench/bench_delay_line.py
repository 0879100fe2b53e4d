"""The testbed's delay line: how close its round trips and rate come to the configured ones.

Two namespaces routed through the delay line (tests/delay_line_probe.py, the testbed's
own code), every NIC shaped by tc htb, at one-way delays of 5, 25 and 50 ms (RTT 10,
50, 100 ms) and rates of 5 and 50 Mbit/s. Per rate, over the three delays:

- ``testbed.delay_line_ping_vs_rtt_*``: the worst median ICMP echo over the configured
  RTT (goal <= 1.1: within 10 %; the excess is the line's and the probes' scheduling);
- ``testbed.delay_line_tcp_rtt_vs_rtt_*``: the worst of the kernel's own smallest TCP RTT
  (tcpi_min_rtt) over the configured RTT (goal <= 1.1);
- ``testbed.delay_line_bulk_vs_shaped_*``: the lowest bulk TCP rate (the receiver's, first
  byte to last) over the shaped rate (no goal: TCP/IP headers and slow start are part of
  it).

The figures vary with the machine's load (a ping waits for the line's process and the
probe's thread to be scheduled): informational, never a regression (no tolerance). The
pass/fail side, what load cannot undo (no round trip shorter than configured, no
transfer above the shaped rate), is tests/test_testbed_delay.py. Needs root,
namespaces and /dev/net/tun; skipped with the reason otherwise.
"""

from __future__ import annotations

import statistics

from tests.bench.common import Figure, Skipped

ONE_WAY_S = (0.005, 0.025, 0.05)
RATES_BPS = (5e6, 50e6)
RTT_GOAL = 1.1


def run() -> list[Figure]:
    from akorun.errors import UsageError
    from tests import delay_line_probe

    reason = delay_line_probe.missing()
    if reason:
        raise Skipped(reason)
    figures: list[Figure] = []
    for rate_bps in RATES_BPS:
        try:
            samples = [delay_line_probe.measure(one_way_s, rate_bps) for one_way_s in ONE_WAY_S]
        except UsageError as error:
            raise Skipped(f"the kernel refused the delayed testbed: {error}") from None
        pings = [statistics.median(s.pings_s) / s.rtt_s for s in samples]
        kernel = [s.kernel_min_rtt_s / s.rtt_s for s in samples]
        bulk = [s.bulk_bytes * 8 / s.bulk_s / rate_bps for s in samples]
        at = ", ".join(f"{2e3 * d:g}" for d in ONE_WAY_S)
        tag = f"{rate_bps / 1e6:g}mbps"
        figures += [
            Figure(f"testbed.delay_line_ping_vs_rtt_{tag}", max(pings), "x configured RTT",
                   higher_is_better=False, goal=RTT_GOAL, tolerance=None,
                   reference="the configured RTT",
                   note=f"median ICMP echo / RTT at RTT {at} ms: "
                        + ", ".join(f"{v:.3f}" for v in pings)),
            Figure(f"testbed.delay_line_tcp_rtt_vs_rtt_{tag}", max(kernel), "x configured RTT",
                   higher_is_better=False, goal=RTT_GOAL, tolerance=None,
                   reference="the configured RTT",
                   note=f"tcpi_min_rtt / RTT at RTT {at} ms: "
                        + ", ".join(f"{v:.3f}" for v in kernel)),
            Figure(f"testbed.delay_line_bulk_vs_shaped_{tag}", min(bulk), "x shaped rate",
                   tolerance=None, reference="the shaped rate",
                   note=f"bulk TCP rate / shaped at RTT {at} ms: "
                        + ", ".join(f"{v:.3f}" for v in bulk)),
        ]
    return figures
