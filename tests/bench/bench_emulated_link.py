"""akorun's emulated link (akorun.transport.emulated_links.LinkShaper): the rate a receiver sees.

``akorun.emulated_link_vs_configured``: 8 messages of 512 KiB sent through a 40 Mbit/s
LinkShaper to a live receiver on loopback (tests/test_akorun_transport.paced_arrivals),
the receiver's rate from the end of the first message to the end of the last over the
configured rate, REPEATS times; the figure is their median (ideal 1.0: the shaper paces
on a virtual clock, so a late event loop is made up by the next piece). It varies with
the machine's load (a late wake-up delays a message, and the next one catches up), so it
is informational (no tolerance); the pass/fail side, what load cannot undo (no message
earlier than a 40 Mbit/s wire could carry it), is
tests/test_akorun_transport.py::test_an_emulated_40mbps_link_never_delivers_faster_than_40mbps.
"""

from __future__ import annotations

import statistics

from tests.bench.common import Figure

RATE_BPS = 40e6
MESSAGES = 8
LENGTH = 512 * 1024 // 4  # float32 values: 512 KiB a message
REPEATS = 5


def receiver_rate_bps() -> float:
    """One run: bits after the first message over the time from its end to the last's."""
    from tests.test_akorun_transport import paced_arrivals

    _, arrivals = paced_arrivals(RATE_BPS, MESSAGES, LENGTH)
    times = sorted(arrived_s for arrived_s, _, _ in arrivals)
    later_bytes = sum(nbytes for _, nbytes, _ in arrivals) - min(n for _, n, _ in arrivals)
    return 8 * later_bytes / (times[-1] - times[0])


def run() -> list[Figure]:
    ratios = tuple(receiver_rate_bps() / RATE_BPS for _ in range(REPEATS))
    return [Figure("akorun.emulated_link_vs_configured", statistics.median(ratios),
                   "x configured rate", tolerance=None, samples=ratios,
                   reference="the configured rate",
                   note=f"{MESSAGES} x 512 KiB through a {RATE_BPS / 1e6:g} Mbit/s emulated "
                        f"link, the receiver's rate; {REPEATS} runs: "
                        + ", ".join(f"{r:.3f}" for r in ratios))]
