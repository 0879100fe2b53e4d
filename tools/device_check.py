"""Device check: a short island launch on this machine's accelerators, in one command.

    python tools/device_check.py                     # GPUs when there are, else CPU
    python tools/device_check.py --platform cpu      # 2 ranks of 2 CPU devices each
    python tools/device_check.py --platform cpu --compare   # and 4 ranks of 1 device

Runs `akorun launch` (2 ranks by default, each an island of --devices-per-rank devices:
on a GPU host the GPUs shared out among the ranks, on CPU 2 forced host devices) and
prints, per rank, the step time (its island's data-parallel gradient step, ms per
round), the exchange time (the rest of the round: the scheme's sends, the wait for the
peers and the update, ms per round), the bytes it sent per round, and the peak memory
of each of its devices (the allocator's figure; CPU devices keep none: n/a). With
--compare it runs the same rounds again with every device a rank of its own and
prints both side by side. Exit status 0 when the run ended with equal replicas.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from akorun.launching.devices import host_gpu_count  # noqa: E402
from akorun.runtime.island import MEMORY_LINE  # noqa: E402

EQUAL_RTOL = 1e-5  # replicas of plain SGD: equal up to float rounding


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--platform", choices=("cpu", "gpu", "auto"), default="auto")
    parser.add_argument("--workers", type=int, default=2, help="ranks (default 2)")
    parser.add_argument("--devices-per-rank", type=int, default=None,
                        help="default: the host's GPUs shared out among the ranks (at least "
                             "1), or 2 CPU devices")
    parser.add_argument("--processes-per-rank", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=64, help="per device")
    parser.add_argument("--workload", default="digits-mlp")
    parser.add_argument("--scheme", default="allreduce")
    parser.add_argument("--compare", action="store_true",
                        help="also run every device as a rank of its own, side by side")
    parser.add_argument("--out", default=None, help="run directory (default: a temporary one)")
    return parser.parse_args(argv)


def _launch(out: Path, args: argparse.Namespace, workers: int, devices: int) -> dict[str, Any]:
    from akorun.run_api import launch  # what akorun.launch(...) calls

    launch(out=out, workers=workers, devices_per_rank=devices,
           processes_per_rank=args.processes_per_rank, platform=args.platform,
           rounds=args.rounds, batch_size=args.batch_size, workload=args.workload,
           scheme=args.scheme, optimizer="sgd", force=True)  # logs at INFO: memory
    result: dict[str, Any] = json.loads((out / "result.json").read_text())
    return result


def _memory(out: Path, rank: int) -> str:
    """The peak device memory lines of rank's processes (its log and its followers')."""
    found = []
    for log in sorted(out.glob(f"worker-{rank}.log")) + sorted(out.glob(f"worker-{rank}.p*.log")):
        for line in log.read_text(errors="replace").splitlines():
            if MEMORY_LINE in line:
                found.append(line.split(MEMORY_LINE, 1)[1].strip())
    return "; ".join(found) or "-"


def _table(title: str, out: Path, result: dict[str, Any]) -> list[str]:
    lines = [title, f"{'rank':>4} {'step ms':>8} {'exchange ms':>11} {'round ms':>9} "
                    f"{'MB/round':>8}  peak memory per device"]
    for record in result["per_worker"]:
        step_s = record.get("compute_s_per_round") or 0.0
        round_s = record.get("round_time_s") or 0.0
        sent = record.get("bytes_sent_per_worker_per_round") or 0.0
        lines.append(f"{record['rank']:>4} {step_s * 1e3:>8.2f} {(round_s - step_s) * 1e3:>11.2f} "
                     f"{round_s * 1e3:>9.2f} {sent / 1e6:>8.3f}  {_memory(out, record['rank'])}")
    lines.append(f"samples/s {result.get('samples_per_s') or 0:.1f}, max relative difference "
                 f"between replicas {result.get('max_relative_difference') or 0:.3g}")
    return lines


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    gpus = host_gpu_count() if args.platform in ("gpu", "auto") else 0
    devices = args.devices_per_rank or (max(1, gpus // args.workers) if gpus else 2)
    platform = args.platform if args.platform != "auto" or gpus else "cpu"
    args.platform = platform
    root = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="device-check-"))
    print(f"device check: {args.workers} ranks x {args.processes_per_rank} process(es) x "
          f"{devices} device(s), platform {platform} ({gpus} GPU(s) listed), "
          f"{args.workload}, batch {args.batch_size} per device, {args.rounds} rounds, "
          f"{args.scheme}; runs in {root}", flush=True)
    island = _launch(root / "island", args, args.workers, devices)
    lines = _table(f"-- {args.workers} ranks, each an island of {devices} device(s) x "
                   f"{args.processes_per_rank} process(es)", root / "island", island)
    results = [island]
    if args.compare:
        ranks = args.workers * devices * args.processes_per_rank
        saved = args.processes_per_rank
        args.processes_per_rank = 1
        single = _launch(root / "ranks", args, ranks, 1)
        args.processes_per_rank = saved
        lines += ["", *_table(f"-- {ranks} ranks of 1 device each (the same devices' batches)",
                              root / "ranks", single)]
        results.append(single)
    print("\n".join(lines))
    equal = all((r.get("max_relative_difference") or 0.0) < EQUAL_RTOL for r in results)
    print("replicas equal" if equal else "replicas DIFFER")
    return 0 if equal else 1


if __name__ == "__main__":
    sys.exit(main())
