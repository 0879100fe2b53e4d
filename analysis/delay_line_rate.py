"""What the testbed's delay line sustains: bulk TCP through it, its CPU and timer lateness.

Builds a delayed testbed of `--ranks` namespaces with the testbed's own code
(akorun.launching.testbed.netns, delaypath, shaping), shapes every NIC to `--rate`
(or leaves it unshaped with ``--rate none``), and sends `--seconds` worth of
bulk TCP from each rank r to rank r+1 at once (one connection each), for each
one-way `--delay`. One JSON line per configuration: the aggregate and per-flow
rates as fractions of the shaped rate, and the delay line's statistics (CPU
seconds, packets, late releases). Needs root and /dev/net/tun.

    sudo python -m analysis.delay_line_rate --ranks 2 --rate 100mbps --delay 10ms,50ms
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

from akocore.hosttools.shaping import plan_shaping
from akocore.settings.toml_io import config_from_dict
from akocore.units import parse_bandwidth, parse_duration
from akorun.launching.testbed import delaypath
from akorun.launching.testbed.delayline import DelaySchedule
from akorun.launching.testbed.netns import SUBNET, SUBNET_PREFIX, NetnsTestbed, TestbedNames
from akorun.launching.testbed.probe import Transfer, measure_transfer


def measure(ranks: int, rate_bps: float | None, one_way_s: float, seconds: float,
            raise_priority: bool = True) -> dict:
    testbed = NetnsTestbed(TestbedNames.for_pid(os.getpid(), ranks))
    names = testbed.names
    line = None
    try:
        testbed.up(bridged=False)
        ports = [delaypath.RankPort(rank=r, namespace=names.namespace(r),
                                    device=names.device(r), hub_port=names.bridge_port(r),
                                    address=names.address(r)) for r in range(ranks)]
        path = delaypath.plan_delay_path(names.hub, names.tun, ports, SUBNET, SUBNET_PREFIX)
        testbed.apply(path.before_line)
        if rate_bps is not None:
            cfg = config_from_dict({"cluster": {"workers": ranks},
                                    "network": {"bandwidth": f"{rate_bps / 1e6:g}mbps"}})
            testbed.apply(plan_shaping(cfg.network, [names.node(r) for r in range(ranks)],
                                       downlink=True).commands)
        matrix = [[0.0 if i == j else one_way_s for j in range(ranks)] for i in range(ranks)]
        line = delaypath.DelayLineProcess(
            names.hub, names.tun,
            DelaySchedule.from_matrix([names.address(r) for r in range(ranks)], matrix),
            raise_priority=raise_priority)
        line.start()
        testbed.apply(path.after_line)
        nbytes = int((rate_bps or 1e9) / 8 * seconds)
        results: list[Transfer | None] = [None] * ranks
        flows = ranks if ranks > 2 else 1

        def send(r: int) -> None:
            peer = (r + 1) % ranks
            results[r] = measure_transfer(names.namespace(r), names.namespace(peer),
                                          names.address(peer), nbytes, port=7300 + r,
                                          timeout_s=300.0)

        threads = [threading.Thread(target=send, args=(r,)) for r in range(flows)]
        start = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        wall_s = time.perf_counter() - start
        stats = line.stop()
        line = None
        rates = [t.rate_bps for t in results if t is not None]
        return {"figure": "delay_line_rate", "ranks": ranks, "flows": flows,
                "rate_mbps": None if rate_bps is None else rate_bps / 1e6,
                "one_way_ms": one_way_s * 1e3, "bytes_per_flow": nbytes,
                "flow_mbps": [r / 1e6 for r in rates],
                "aggregate_mbps": flows * nbytes * 8 / wall_s / 1e6,
                "fraction_of_shaped": (None if rate_bps is None
                                       else min(rates) / rate_bps),
                "priority": "raise" if raise_priority else "keep",
                "line": stats, "load": os.getloadavg()[0]}
    finally:
        if line is not None:
            line.stop()
        testbed.down()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.delay_line_rate")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--rate", default="100mbps", help="every NIC, or none (unshaped)")
    parser.add_argument("--delay", default="10ms,50ms", help="one-way delays to measure")
    parser.add_argument("--seconds", type=float, default=3.0,
                        help="bytes per flow = this many seconds at the rate")
    parser.add_argument("--priority", choices=("raise", "keep"), default="raise",
                        help="the line's scheduling: raise (SCHED_FIFO, as the testbed runs "
                             "it) or keep (an ordinary process, to see what that costs)")
    args = parser.parse_args(argv)
    rate = None if args.rate == "none" else parse_bandwidth(args.rate)
    for text in args.delay.split(","):
        print(json.dumps(measure(args.ranks, rate, parse_duration(text), args.seconds,
                                    args.priority == "raise")),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
