"""akorun's DiLoCo beside a torch DiLoCo on the same shaped network, measured in one run.

Three ranks in network namespaces built by akorun's own testbed code (every NIC shaped to
20 Mbit/s up and down by tc, 25 ms one way through akorun's delay line), DiLoCo with H = 10
on digits-mlp with hidden 1024x1024 (1,126,410 parameters, 4.5 MB), inner SGD lr 0.05 at
batch 32, outer SGD lr 0.7 with Nesterov momentum 0.9, 150 inner steps (15 outer syncs):

- akorun: ``akorun launch --testbed netns --scheme diloco --inner-steps 10`` (its outer
  sync is an all-reduce: a reduce-scatter to chunk owners, an all-gather of the means);
- torch: a plain torch.distributed DiLoCo (a gloo all_reduce of the flat pseudo-gradient;
  tests/bench/peer_diloco_torch.py) in a testbed built the same way;
- torchft: torchft 0.2.0's DiLoCo (Manager, ProcessGroupGloo, its lighthouse in rank 0's
  namespace), where its wheel installs here.

Both sides train the same thing: the peers get akocore's digits split, the MLP's initial
parameters and each rank's batches from this process (an .npz). The torch side runs in a
venv of its own that this benchmark installs (tests/bench/peer_env.py), or the module is
skipped with the reason. Each rank gets max(1, cores // 3) threads on both sides (akorun
launch's rule, akocore.rank_threads; the peers' torch.set_num_threads).

Per system, from its own records: the seconds per outer sync (the training wall time not
spent in inner steps, per sync: the sync's messages, waits and outer step), the seconds
per outer round (H inner steps and their sync), the median inner step, and the time to
95% test accuracy (rank 0's model evaluated every H steps before the sync, the clock
paused, as akorun evaluates). The figures are akorun / peer (lower is better),
informational (one run; the machine may be shared: the load is in the note); their goal,
the issue's, is at least torchft's speed. Needs root (namespaces, veth, tc, TUN);
``AKO_BENCH_AKORUN_TREE=DIR`` runs the akorun side from another source tree (a before /
after comparison), ``AKO_BENCH_PEERS_REPEATS`` alternates the systems that many times.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from akocore.rank_threads import threads_per_rank
from akorun.launching.local import host_cores
from akorun.testing import REPO_ROOT
from tests.bench.common import Figure, Skipped
from tests.bench.peer_env import TorchPeer, torch_peer

WORKERS = 3
RATE_BPS = 20e6
LATENCY_S = 0.025
EVERY = 10  # H: inner steps per outer sync
STEPS = 150
HIDDEN = (1024, 1024)
BATCH = 32
TARGET = 0.95
RUN_TIMEOUT_S = 600
PEER_SCRIPT = Path(__file__).with_name("peer_diloco_torch.py")
LIGHTHOUSE_PORT = 47600
RENDEZVOUS_PORT = 47601


@dataclass(frozen=True)
class Side:
    """One system's figures from one run."""

    system: str
    sync_s: float  # training wall time outside inner steps, per outer sync
    round_s: float  # training wall time per outer round (H steps and their sync)
    step_s: float  # median inner step
    time_to_target_s: float | None
    final_accuracy: float | None

    def text(self) -> str:
        reached = ("not reached" if self.time_to_target_s is None
                   else f"{self.time_to_target_s:.1f} s")
        return (f"{self.system}: sync {self.sync_s:.2f} s, round {self.round_s:.2f} s, step "
                f"{self.step_s * 1e3:.0f} ms, {TARGET:.0%} at {reached}")


def time_to(evaluations: list[list[float]], target: float) -> float | None:
    """The first evaluation's seconds at or above `target` ([seconds, step, accuracy])."""
    return next((float(e[0]) for e in evaluations if e[2] >= target), None)


def export_data(path: Path) -> None:
    """What akorun trains (digits-mlp, seed 0): split, initial parameters, each rank's
    first STEPS batches of akocore's batch stream, for the torch ranks."""
    from akocore.data.bundled import load_digits
    from akocore.data.catalog import BatchStream
    from akocore.workloads.models import build_model

    data = load_digits()
    params = build_model("mlp", data.input_shape, 10, hidden=HIDDEN).init(0)
    arrays = {"x_train": data.train_x.reshape(len(data.train_x), -1),
              "y_train": data.train_y, "x_test": data.test_x.reshape(len(data.test_x), -1),
              "y_test": data.test_y}
    for i, layer in enumerate(params):
        arrays[f"w{i}"], arrays[f"b{i}"] = layer["w"], layer["b"]
    for rank in range(WORKERS):
        stream = BatchStream(data, rank, WORKERS, BATCH, 0)
        batches = [stream.next() for _ in range(STEPS)]
        arrays[f"bx{rank}"] = np.stack([b.x.reshape(len(b.x), -1) for b in batches])
        arrays[f"by{rank}"] = np.stack([b.y for b in batches])
    np.savez(path, **arrays)


# ---- akorun --------------------------------------------------------------------------

def run_akorun(out: Path) -> Side:
    tree = Path(os.environ.get("AKO_BENCH_AKORUN_TREE") or REPO_ROOT)
    hidden = "x".join(str(h) for h in HIDDEN)
    command = [sys.executable, "-m", "akorun", "launch", "--testbed", "netns",
               "--workers", str(WORKERS), "--bandwidth", f"{RATE_BPS / 1e6:g}mbps",
               "--latency", f"{LATENCY_S * 1e3:g}ms", "--scheme", "diloco", "--inner-steps",
               str(EVERY), "--workload", "digits-mlp", "--workload-arg", f"hidden={hidden}",
               "--optimizer", "sgd", "--lr", "0.05", "--batch-size", str(BATCH), "--seed",
               "0", "--rounds", str(STEPS), "--set", f"train.eval_every={EVERY}", "--quiet",
               "--timeout", f"{RUN_TIMEOUT_S - 20}s", "--out", str(out), "--force"]
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(tree),
           "AKO_JAX_CACHE": str(REPO_ROOT / ".cache" / "jax")}
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tree,
                          timeout=RUN_TIMEOUT_S + 60)
    if done.returncode != 0:
        raise RuntimeError(f"akorun launch --testbed netns failed:\n{done.stderr[-3000:]}")
    ranks = [json.loads((out / f"worker-{r}.json").read_text()) for r in range(WORKERS)]
    syncs = STEPS // EVERY
    sync_s = statistics.mean((w["round_end_s"][-1] - sum(w["round_compute_s"])) / syncs
                             for w in ranks)
    round_s = statistics.mean(w["round_end_s"][-1] / syncs for w in ranks)
    step_s = statistics.median(s for w in ranks for s in w["round_compute_s"])
    return Side("akorun", sync_s, round_s, step_s, time_to(ranks[0]["evaluations"], TARGET),
                ranks[0]["evaluations"][-1][2] if ranks[0]["evaluations"] else None)


# ---- the torch peers -----------------------------------------------------------------

@contextmanager
def shaped_testbed() -> Iterator[object]:
    """Namespaces, shaping and delay line as `akorun launch --testbed netns` builds them
    for 3 ranks at RATE_BPS with LATENCY_S one way (akorun.launching.testbed)."""
    from akocore.hosttools.shaping import plan_shaping
    from akocore.settings.schema import NetworkConfig
    from akorun.launching.testbed.delaypath import check_delay, line_load_bps
    from akorun.launching.testbed.netns import NetnsTestbed, TestbedNames
    from akorun.launching.testbed.runner import TestbedOptions, _delay_path

    net = NetworkConfig(bandwidth_bps=(RATE_BPS,), latency_s=(LATENCY_S,))
    check_delay(net.latency_matrix(WORKERS),
                line_load_bps(net.uplink_bps(WORKERS), net.link_bps_matrix(WORKERS)), 0.0)
    testbed = NetnsTestbed(TestbedNames.for_pid(os.getpid(), WORKERS))
    line = None
    try:
        testbed.up(bridged=False)
        cfg = SimpleNamespace(network=net, cluster=SimpleNamespace(workers=WORKERS))
        line = _delay_path(testbed, cfg, TestbedOptions())  # type: ignore[arg-type]
        plan = plan_shaping(net, [testbed.names.node(r) for r in range(WORKERS)],
                            downlink=True)
        testbed.apply(plan.commands)
        yield testbed
    finally:
        try:
            if line is not None:
                line.stop()
        finally:
            testbed.down()


def run_torch(peer: TorchPeer, data: Path, out: Path, mode: str) -> Side:
    out.mkdir(parents=True, exist_ok=True)
    threads = threads_per_rank(host_cores(), WORKERS)
    with shaped_testbed() as testbed:
        names = testbed.names  # type: ignore[attr-defined]
        lighthouse = None
        if mode == "torchft":
            assert peer.lighthouse is not None
            lighthouse = subprocess.Popen(
                ["ip", "netns", "exec", names.namespace(0), str(peer.lighthouse),
                 "--min_replicas", str(WORKERS), "--bind", f"[::]:{LIGHTHOUSE_PORT}",
                 "--join_timeout_ms", "60000", "--quorum_tick_ms", "100"],
                stdout=open(out / "lighthouse.log", "w"), stderr=subprocess.STDOUT)
            time.sleep(1.0)
            rendezvous = f"http://{names.address(0)}:{LIGHTHOUSE_PORT}"
        else:
            rendezvous = f"{names.address(0)}:{RENDEZVOUS_PORT}"
        procs = []
        for rank in range(WORKERS):
            command = ["ip", "netns", "exec", names.namespace(rank), str(peer.python),
                       str(PEER_SCRIPT), str(rank), str(WORKERS), str(STEPS), str(EVERY),
                       str(threads), str(out / f"r{rank}.json"), names.device(rank),
                       names.address(rank), rendezvous, str(data), mode]
            procs.append(subprocess.Popen(command, stdout=open(out / f"r{rank}.log", "w"),
                                          stderr=subprocess.STDOUT))
        try:
            codes = [p.wait(timeout=RUN_TIMEOUT_S) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            if lighthouse is not None:
                lighthouse.terminate()
                lighthouse.wait(10)
    if any(codes):
        tails = [(out / f"r{r}.log").read_text()[-600:] for r in range(WORKERS)]
        raise RuntimeError(f"the {mode} peer failed (exit {codes}):\n" + "\n".join(tails))
    ranks = [json.loads((out / f"r{r}.json").read_text()) for r in range(WORKERS)]
    syncs = STEPS // EVERY
    sync_s = statistics.mean(
        (w["train_s"] - (sum(w["step_s"]) - sum(w["sync_s"]))) / syncs for w in ranks)
    round_s = statistics.mean(w["train_s"] / syncs for w in ranks)
    inner = [s for w in ranks for i, s in enumerate(w["step_s"]) if (i + 1) % EVERY]
    evaluations = ranks[0]["evaluations"]
    return Side(mode if mode == "torchft" else "torch", sync_s, round_s,
                statistics.median(inner), time_to(evaluations, TARGET),
                evaluations[-1][2] if evaluations else None)


# ---- the figures ---------------------------------------------------------------------

def side_by_side() -> tuple[list[Side], str, str]:
    """Every system's figures (medians over the repeats), the load, and torchft's absence
    (empty when it ran)."""
    from akorun.launching.testbed.netns import missing_requirements
    from akorun.launching.testbed.runner import missing_tun

    reason = missing_requirements() or missing_tun()
    if reason:
        raise Skipped(f"the netns testbed is unavailable: {reason}")
    peer = torch_peer()
    repeats = int(os.environ.get("AKO_BENCH_PEERS_REPEATS", "1"))
    systems = ["akorun", "plain"] + (["torchft"] if peer.lighthouse is not None else [])
    runs: dict[str, list[Side]] = {name: [] for name in systems}
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="ako-bench-peers-") as tmp:
        data = Path(tmp) / "digits.npz"
        export_data(data)
        for repeat in range(repeats):
            order = systems if repeat % 2 == 0 else systems[::-1]
            for name in order:
                out = Path(tmp) / f"{name}-{repeat}"
                runs[name].append(run_akorun(out) if name == "akorun"
                                  else run_torch(peer, data, out, name))
                loads.append(os.getloadavg()[0])
    sides = [_median_side(found) for found in runs.values()]
    load = (f"load average {min(loads):.1f}-{max(loads):.1f} on {host_cores()} cores, "
            f"{repeats} run(s) of each, torch {peer.torch_version}")
    return sides, load, peer.torchft_missing


def _median_side(sides: list[Side]) -> Side:
    reached = [s.time_to_target_s for s in sides if s.time_to_target_s is not None]
    finals = [s.final_accuracy for s in sides if s.final_accuracy is not None]
    return Side(sides[0].system, statistics.median(s.sync_s for s in sides),
                statistics.median(s.round_s for s in sides),
                statistics.median(s.step_s for s in sides),
                statistics.median(reached) if len(reached) == len(sides) else None,
                statistics.median(finals) if finals else None)


SYNC_GAP = ("akorun's sync is asyncio HTTP messages through Python (a reduce-scatter to "
            "the chunk owners, then an all-gather of the means), each message sealed, "
            "digested and acknowledged; gloo's ring is C++ over raw TCP")
TTA_GAP = "the time to 95% follows the seconds per outer round (the same rounds reach it)"


def run() -> list[Figure]:
    sides, load, torchft_missing = side_by_side()
    akorun = sides[0]
    note = "; ".join([*(side.text() for side in sides), load])
    if torchft_missing:
        note += f"; torchft skipped: {torchft_missing}"
    figures = []
    for peer in sides[1:]:
        goal = 1.0 if peer.system == "torchft" else None
        figures += [
            Figure(f"peers.diloco_sync_s_vs_{peer.system}", akorun.sync_s / peer.sync_s,
                   "x", higher_is_better=False, goal=goal, tolerance=None, known_gap=SYNC_GAP,
                   reference=f"{peer.system} DiLoCo, same testbed",
                   note=note if peer is sides[1] else ""),
            Figure(f"peers.diloco_round_s_vs_{peer.system}", akorun.round_s / peer.round_s,
                   "x", higher_is_better=False, tolerance=None,
                   reference=f"{peer.system} DiLoCo, same testbed"),
            Figure(f"peers.diloco_step_vs_{peer.system}", akorun.step_s / peer.step_s, "x",
                   higher_is_better=False, tolerance=None,
                   reference=f"{peer.system}'s inner step, {WORKERS} ranks on this host"),
        ]
        if akorun.time_to_target_s is not None and peer.time_to_target_s is not None:
            figures.append(Figure(
                f"peers.diloco_tta95_vs_{peer.system}",
                akorun.time_to_target_s / peer.time_to_target_s, "x", higher_is_better=False,
                goal=goal, tolerance=None, known_gap=TTA_GAP,
                reference=f"{peer.system} DiLoCo, same testbed"))
    return figures


if __name__ == "__main__":
    found, where, missing = side_by_side()
    print(json.dumps({"sides": [side.__dict__ for side in found], "load": where,
                      "torchft_missing": missing}, indent=1))
