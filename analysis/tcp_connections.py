"""One POST in flight per peer (one connection) against two (two connections), on real TCP.

Three akorun ranks, each in its own network namespace on one bridge, each rank's egress
shaped by the kernel (`tc tbf`, 20 Mbit/s by default, a burst of 10 ms at the rate and at
least 32 KiB: akocore.hosttools.shaping.tbf_root), in-process emulation off,
digits-cnn, p in {1, 3} and s in {0, 2}. For every configuration the two senders run
side by side (window 1, then window 2, via ``AKORUN_SEND_WINDOW``, `akorun.transport.sender`), so
both see the same machine load. Per run it reports the steady round time (rank 0's
round ends, the first `WARMUP_ROUNDS` and the last skipped): mean, coefficient of variation, and the
alternation index (mean |d_t - d_{t-1}| / mean d: 0 for steady rounds, near 2 for
"slow, fast, slow, ..."), and writes them as JSON lines to ``--out``.

Needs root, ``ip`` and ``tc`` (iproute2) and network namespaces; every namespace it
creates carries this process's id and is deleted on exit. Run it on a quiet machine:

    sudo env PYTHONPATH=$PWD JAX_PLATFORMS=cpu python -m analysis.tcp_connections \\
        --out tcp_connections.jsonl --rounds 40

The figures it printed when the default was chosen are in docs/guide/testbed.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from akocore.hosttools.netns_commands import (
    address_up,
    bridge_port,
    bridge_up,
    missing_requirements,
    namespace_add,
    namespace_delete,
    veth_pair,
)
from akocore.hosttools.shaping import tbf_root
from akocore.settings.toml_io import config_from_dict
from akorun.launching.cluster import new_settings, write_cluster_file
from akorun.testing import REPO_ROOT, akorun_command, child_test_env
from akorun.transport.sender import DATA_PATH_ENV, WINDOW_ENV

WORKERS = 3
WARMUP_ROUNDS = 5
PORT = 7072


def _run(command: tuple[str, ...]) -> None:
    subprocess.run(command, check=True, capture_output=True, timeout=20)


class Testbed:
    """`WORKERS` rank namespaces on one bridge (in a hub namespace), egress tbf-shaped
    (the commands are akocore.hosttools', as the netns testbed and the calibration
    probe build theirs)."""

    def __init__(self, tag: str, rate_mbit: float) -> None:
        self.tag = tag
        self.rate_mbit = rate_mbit
        self.hub = f"akc{tag}h"
        self.names = [f"akc{tag}n{r}" for r in range(WORKERS)]
        self.addresses = [f"10.233.0.{r + 1}" for r in range(WORKERS)]
        self.created: list[str] = []

    def up(self) -> None:
        for name in (self.hub, *self.names):
            _run(namespace_add(name))
            self.created.append(name)
        for command in bridge_up(self.hub, "br0"):
            _run(command)
        for rank, (name, address) in enumerate(zip(self.names, self.addresses, strict=True)):
            inner, outer = f"akc{self.tag}r{rank}", f"akc{self.tag}b{rank}"
            _run(veth_pair(inner, name, outer, self.hub))
            _run(bridge_port(self.hub, outer, "br0"))
            for command in address_up(name, inner, address):
                _run(command)
            _run(tbf_root(name, inner, self.rate_mbit * 1e6))

    def down(self) -> None:
        for name in self.created:  # deleting a namespace removes its veth ends too
            subprocess.run(namespace_delete(name), capture_output=True, timeout=20)


@dataclass(frozen=True)
class RoundFigures:
    """Rank 0's steady round times of one run."""

    window: int
    p: int
    ssp: int
    rounds: int
    mean_s: float
    cv: float
    alternation: float
    round_s: tuple[float, ...]
    wall_s: float


def round_figures(round_end_s: list[float]) -> tuple[float, float, float, list[float]]:
    """(mean, coefficient of variation, alternation index, steady durations)."""
    ends = [0.0, *round_end_s]
    # the last round ends at the final flush, not at a gate: left out like the warm-up
    durations = [b - a for a, b in zip(ends, ends[1:], strict=False)][WARMUP_ROUNDS:-1]
    mean = statistics.fmean(durations)
    cv = statistics.pstdev(durations) / mean if mean > 0 else 0.0
    steps = [abs(b - a) for a, b in zip(durations, durations[1:], strict=False)]
    alternation = statistics.fmean(steps) / mean if steps and mean > 0 else 0.0
    return mean, cv, alternation, durations


def run_once(bed: Testbed, directory: Path, *, window: int, p: int, ssp: int,
             rounds: int, workload: str) -> RoundFigures:
    cfg = config_from_dict({
        "cluster": {"workers": WORKERS, "hosts": [f"{a}:{PORT}" for a in bed.addresses]},
        "exchange": {"p": p, "ssp": ssp},
        "train": {"workload": workload, "optimizer": "sgd", "lr": 0.05, "rounds": rounds,
                  "eval_every": 100000},
    })
    directory.mkdir(parents=True, exist_ok=True)
    path = write_cluster_file(directory / "cluster.toml", cfg,
                              new_settings(peer_timeout_s=30.0, emulate="off"))
    out = directory / "out"
    procs = []
    started = time.monotonic()
    try:
        for rank in range(WORKERS):
            command = ["ip", "netns", "exec", bed.names[rank], *akorun_command(
                "worker", "--rank", str(rank), "--config", str(path), "--out", str(out),
                "--quiet")]
            with open(directory / f"rank-{rank}.log", "wb") as log:
                procs.append(subprocess.Popen(
                    command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT,
                    # POSTs over HTTP: there a window of 2 is two connections (the data
                    # path pipelines any window on its one connection)
                    env=child_test_env({WINDOW_ENV: str(window), DATA_PATH_ENV: "http"})))
        codes = [proc.wait(timeout=600) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    if codes != [0] * WORKERS:
        raise RuntimeError(f"ranks exited {codes}; logs in {directory}")
    result = json.loads((out / "worker-0.json").read_text())
    mean, cv, alternation, durations = round_figures(result["round_end_s"])
    return RoundFigures(window, p, ssp, len(result["round_end_s"]), mean, cv, alternation,
                        tuple(round(d, 4) for d in durations), time.monotonic() - started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="example: python -m analysis.tcp_connections --out tcp.jsonl --rounds 40")
    parser.add_argument("--out", type=Path, required=True, help="JSON lines, one per run")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--rate-mbit", type=float, default=20.0)
    parser.add_argument("--workload", default="digits-cnn")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args(argv)
    if args.rounds <= WARMUP_ROUNDS + 2 or args.rate_mbit <= 0 or args.repeats < 1:
        print(f"error: --rounds must exceed {WARMUP_ROUNDS + 2}, --rate-mbit and --repeats "
              f"be positive", file=sys.stderr)
        return 2
    why = missing_requirements(os.geteuid(), lambda tool: shutil.which(tool) is not None)
    if why is not None:
        print(f"error: {why}", file=sys.stderr)
        return 2
    bed = Testbed(f"{os.getpid() % 100000}", args.rate_mbit)
    try:
        bed.up()
        with tempfile.TemporaryDirectory(prefix="ako-tcpconn-") as scratch:
            for repeat in range(args.repeats):
                for p in (1, 3):
                    for ssp in (0, 2):
                        for window in (1, 2):
                            figures = run_once(
                                bed, Path(scratch) / f"r{repeat}-p{p}-s{ssp}-w{window}",
                                window=window, p=p, ssp=ssp, rounds=args.rounds,
                                workload=args.workload)
                            print(f"window {window} p {p} s {ssp}: mean "
                                  f"{figures.mean_s:.3f} s  cv {figures.cv:.2f}  "
                                  f"alternation {figures.alternation:.2f}",
                                  file=sys.stderr, flush=True)
                            with open(args.out, "a", encoding="utf-8") as out:
                                out.write(json.dumps({**asdict(figures),
                                                      "rate_mbit": args.rate_mbit,
                                                      "repeat": repeat}) + "\n")
    finally:
        bed.down()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
