"""The akosim command line: plan (default), train, sweep.

    akosim --workers 64 --bandwidth 40mbps --p auto
    akosim train --workers 16 --target-accuracy 0.9
    akosim sweep --workers 4,16,64 --bandwidth 40mbps,1gbps --p 1,4,auto --out sweep/

User mistakes exit with status 2 and one line on stderr; results go to
stdout as a table and, with --out, to a JSON file.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from akocore.config import (
    ConfigError,
    RunConfig,
    TrainConfig,
    add_shared_arguments,
    config_from_args,
    config_to_dict,
)
from akocore.data import DataError
from akocore.partition import PartitionError
from akocore.units import UnitError, format_duration, format_size, parse_duration, parse_size
from akosim.calibration import (  # noqa: F401 (rank_overhead_s: re-exported)
    CalibrationError,
    compute_from_result,
    message_overhead_from_result,
    overhead_from_result,
    rank_overhead_s,
)

# timing-only planning defaults to the seeds' CNN (17 MB gradient) at their batch size; the
# steady state of a deterministic round is reached within a few rounds
TIMING_DEFAULTS = RunConfig(train=TrainConfig(workload="synthetic-cnn", batch_size=104, rounds=30))
TRAIN_DEFAULTS = RunConfig()
MEASURE_STEPS = 30  # --compute measure: median of this many gradient steps (after warm-up)


STALE_WARNING_P = 64  # above this, say what such a p means


class UsageError(Exception):
    """A user mistake: reported as one line, exit status 2."""


USER_ERRORS = (UsageError, ConfigError, UnitError, DataError, PartitionError, CalibrationError)

EPILOG_RUN = """\
examples:
  akosim --workers 64 --bandwidth 40mbps --p auto
      Ako with p chosen for 64 workers on 40 Mbit/s NICs, beside p=1, a parameter
      server and ring all-reduce (the seed CNN's 17 MB gradient, compute measured here)
  akosim --workers 4 --link-bandwidth 40,20,10mbps --latency 20ms --compute 0.3s
      the seeds' heterogeneous WAN, with a given compute time per round
  akosim --workers 8 --scheme ako --p 4 --ssp 2 --gradient-size 17MB --trace t.json
      one configuration only, with a Chrome/Perfetto timeline
  akosim --config configs/uniform-wan.toml --out result.json
"""

EPILOG_TRAIN = """\
examples:
  akosim train --workers 16 --target-accuracy 0.9
      16 simulated workers really train the default workload (bundled digits);
      every partial is applied at its simulated arrival; prints time to 90%
  akosim train --workers 4 --bandwidth 40mbps --scheme ako --p 4 --duration 300s
"""


def fail(message: str, prog: str = "akosim") -> NoReturn:
    """A user mistake: one line on stderr, exit status 2."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


class OneLineParser(argparse.ArgumentParser):
    """argparse whose usage errors are one line and exit 2, like every other mistake."""

    def error(self, message: str) -> NoReturn:
        fail(f"{message} (see {self.prog} --help)", self.prog)


def _add_sim_arguments(parser: argparse.ArgumentParser) -> None:
    add_shared_arguments(parser)
    group = parser.add_argument_group("simulation")
    add = group.add_argument
    add("--gradient-size", metavar="SIZE",
        help="gradient bytes per worker, e.g. 17MB or 4MiB (default: from --workload)")
    add("--compute", metavar="DURATION|measure", default="measure",
        help="compute seconds per round, e.g. 0.3s or 250ms; 'measure' times the real "
             "--workload gradient step on this machine (default)")
    add("--compute-from", metavar="RESULT.json",
        help="take each worker's measured compute time (and its per-round overhead and "
             "per-message overhead, when the file has them) from an akorun result file")
    add("--round-overhead", metavar="DURATION",
        help="per-round time each worker spends outside the gradient (dispatch, inbox, "
             "optimizer, event loop), spent before the round's sends leave, e.g. 3ms "
             "(default 0, or what --compute-from's result measured)")
    add("--message-overhead", metavar="DURATION",
        help="per-message time beyond the wire (software stack: HTTP, verification, "
             "apply), added to every link's latency, e.g. 2ms (default 0, or what "
             "--compute-from's result measured)")
    add("--compute-jitter", type=float, default=0.0, metavar="FRACTION",
        help="relative standard deviation of each round's compute time, e.g. 0.1")
    add("--speeds", metavar="F1,F2,...",
        help="per-worker compute time multipliers assigned in turn, e.g. 1,1,2 (a slow third)")
    add("--stragglers", metavar="RANKS", help="ranks slowed by --straggler-factor, e.g. 3,7")
    add("--straggler-factor", type=float, default=4.0, metavar="X",
        help="compute time multiplier of the stragglers (default 4)")
    add("--coalesce", type=float, default=None, metavar="FRACTION",
        help="messages whose remaining transfer is within this fraction of their own "
             "duration finish together (default 1e-4); 0.01-0.03 makes networks where "
             "every link has its own rate much faster to simulate, each message at most "
             "1-3%% early")
    add("--out", metavar="FILE.json", help="write every simulated configuration as JSON")
    add("--trace", metavar="FILE.json",
        help="write a Chrome trace (compute, sends, waits per worker); opens in Perfetto")
    add("--quiet", action="store_true", help="no progress bars")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="akosim",
        description="What-if simulator for decentralised training with partial gradient "
                    "exchange (Ako), parameter servers and all-reduce. Without a subcommand "
                    "it plans: what p, what round time, how much traffic, how stale.",
        epilog=EPILOG_RUN, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_sim_arguments(parser)
    return parser


def build_train_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="akosim train",
        description="Training mode: the simulated workers really train the shared JAX "
                    "workload; accuracy against simulated time predicts time to accuracy.",
        epilog=EPILOG_TRAIN, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_sim_arguments(parser)
    return parser


# --------------------------------------------------------------------- helpers


def progress_factory(enabled: bool) -> Callable[[str, int], Callable[[int], None]] | None:
    if not enabled:
        return None
    from tqdm import tqdm

    def make(label: str, total: int) -> Callable[[int], None]:
        bar = tqdm(total=total or None, desc=f"{label:<28}", unit="round", leave=False,
                   file=sys.stderr, mininterval=0.2)

        def update(rounds_done: int) -> None:
            bar.update(rounds_done - bar.n)
            if total and rounds_done >= total:
                bar.close()
        return update
    return make


def _compute_model(args: argparse.Namespace, workers: int, workload_factory):
    from akosim.compute import ComputeModel, measure_compute_s

    per_worker: tuple[float, ...] = ()
    compute_s = 0.0
    overhead: float | tuple[float, ...] = 0.0
    if args.compute_from:
        per_worker = compute_from_result(args.compute_from, workers)
        overhead = overhead_from_result(args.compute_from, workers) or 0.0
    elif args.compute == "measure":
        compute_s = measure_compute_s(workload_factory(), steps=MEASURE_STEPS)
    else:
        compute_s = parse_duration(args.compute)
    if getattr(args, "round_overhead", None) is not None:
        overhead = parse_duration(args.round_overhead)
        if overhead < 0:
            raise UsageError(f"--round-overhead: got {args.round_overhead}, expected >= 0")
    speeds = _floats(args.speeds, "--speeds") if args.speeds else ()
    stragglers = tuple(int(x) for x in _floats(args.stragglers, "--stragglers")) \
        if args.stragglers else ()
    for rank in stragglers:
        if not 0 <= rank < workers:
            raise UsageError(f"--stragglers: rank {rank} is not a worker (0..{workers - 1})")
    if args.compute_jitter < 0:
        raise UsageError(f"--compute-jitter: got {args.compute_jitter}, expected >= 0")
    try:
        return ComputeModel(compute_s, speeds, args.compute_jitter, stragglers,
                            args.straggler_factor, per_worker, overhead_s=overhead)
    except ValueError as error:
        raise UsageError(str(error)) from None


def _floats(text: str, flag: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise UsageError(f"{flag}: got {text!r}, expected numbers separated by commas") \
            from None


def _message_overhead(args: argparse.Namespace, nodes: int) -> tuple[float, ...]:
    if getattr(args, "message_overhead", None) is not None:
        value = parse_duration(args.message_overhead)
        if value < 0:
            raise UsageError(f"--message-overhead: got {args.message_overhead}, expected >= 0")
        return (value,)
    if getattr(args, "compute_from", None):
        return message_overhead_from_result(args.compute_from, nodes)
    return ()


def load_workload(cfg: RunConfig):
    """The configured workload, or a one-line UsageError naming what is wrong."""
    from akocore.workload import build_workload

    try:
        return build_workload(cfg.train.workload, batch_size=cfg.train.batch_size,
                              seed=cfg.train.seed, data_path=cfg.train.data_path)
    except (ValueError, TypeError) as error:
        raise UsageError(f"--workload: {error}") from None


def _setup(args: argparse.Namespace, cfg: RunConfig, *, training: bool):
    from akosim.engine import StopRule
    from akosim.fluid import COALESCE_REL
    from akosim.scenario import Setup

    cache: dict[str, Any] = {}

    def workload():
        if "w" not in cache:
            cache["w"] = load_workload(cfg)
        return cache["w"]

    if training:
        if args.gradient_size:
            raise UsageError("--gradient-size is for timing-only runs; akosim train takes "
                             "the gradient of --workload")
        length = workload().param_count
    elif args.gradient_size:
        size = parse_size(args.gradient_size)
        if size < 4 or size % 4:
            raise UsageError(f"--gradient-size: got {args.gradient_size}, expected a whole "
                             f"number of float32 values (a multiple of 4 bytes)")
        length = size // 4
    else:
        length = workload().param_count
    if not training and cfg.train.target_accuracy is not None:
        raise UsageError("--target-accuracy needs training mode: akosim train "
                         "--target-accuracy ...")
    compute = _compute_model(args, cfg.cluster.workers, workload)
    rounds = cfg.train.rounds
    if training and rounds is None and cfg.train.duration_s is None:
        rounds = 10_000  # bounded by the target accuracy
    stop = StopRule(rounds=rounds, duration_s=cfg.train.duration_s, drain=training)
    coalesce = COALESCE_REL if args.coalesce is None else args.coalesce
    if not 0 <= coalesce < 0.5:
        raise UsageError(f"--coalesce: got {args.coalesce}, expected a fraction 0 <= x < 0.5, "
                         f"e.g. 0.01")
    setup = Setup(cfg, length, compute, cfg.train.batch_size, stop, coalesce_rel=coalesce,
                  message_overhead_s=_message_overhead(args, cfg.cluster.workers))
    return setup, (workload() if training else None)


def _check_p(cfg: RunConfig, length: int) -> None:
    p = cfg.exchange.p
    if isinstance(p, tuple) and max(p) > length:
        raise UsageError(f"--p: got {max(p)}, but the gradient has only {length} elements; "
                         f"expected 1..{length} or auto")
    if cfg.cluster.workers > length:
        raise UsageError(f"--workers: {cfg.cluster.workers} workers need a gradient of at "
                         f"least that many elements (have {length})")


# -------------------------------------------------------------------- commands


def run_plan(argv: Sequence[str], *, training: bool = False) -> int:
    from akosim.compare import compare_all
    from akosim.scenario import SimRun, Variant, ako_variant, simulate

    parser = build_train_parser() if training else build_parser()
    args = parser.parse_args(argv)
    cfg = config_from_args(args, defaults=TRAIN_DEFAULTS if training else TIMING_DEFAULTS)
    if training:
        from akocore.process_setup import enable_compilation_cache

        cache = Path.home() / ".cache" / "akosim" / "jax"
        enable_compilation_cache(str(cache))
    setup, workload = _setup(args, cfg, training=training)
    _check_p(cfg, setup.length)
    factory = progress_factory(not args.quiet and sys.stderr.isatty())
    kwargs: dict[str, Any] = dict(trace=bool(args.trace))
    if training:
        kwargs.update(workload=workload, eval_every=cfg.train.eval_every,
                      target_accuracy=cfg.train.target_accuracy)
    scheme_given = args.scheme is not None or _config_names_scheme(args)
    runs: list[SimRun]
    if scheme_given:
        scheme = cfg.exchange.scheme
        if scheme == "ako":
            variant = ako_variant(setup)
        elif scheme == "ps":
            servers = cfg.exchange.ps_servers
            if servers == "best":
                from akosim.compare import best_ps

                ssp = cfg.exchange.ssp if cfg.exchange.ps_mode == "async" else 0.0
                best, _ = best_ps(setup, ssp=ssp, factory=factory, **kwargs)
                runs = [best]
                return _finish(args, cfg, setup, runs, training)
            variant = Variant("ps", ps_servers=int(servers), ssp=cfg.exchange.ssp
                              if cfg.exchange.ps_mode == "async" else 0.0,
                              label=f"ps {servers} server(s)")
        else:
            variant = Variant("allreduce", label="ring allreduce")
        progress = factory(variant.label, setup.stop.rounds or 0) if factory else None
        runs = [simulate(setup, variant, on_progress=progress, **kwargs)]
    else:
        runs = compare_all(setup, factory=factory, **kwargs)
    return _finish(args, cfg, setup, runs, training)


def _config_names_scheme(args: argparse.Namespace) -> bool:
    """True when --config or --set chose a scheme (then no comparison is run)."""
    if any(item.strip().startswith("exchange.scheme") for item in (args.set or [])):
        return True
    if args.config:
        import tomllib

        try:
            data = tomllib.loads(Path(args.config).read_text())
        except (OSError, tomllib.TOMLDecodeError):
            return False
        return "scheme" in data.get("exchange", {})
    return False


def _finish(args: argparse.Namespace, cfg: RunConfig, setup, runs, training: bool) -> int:
    from akosim.report import explain_p, format_table, json_safe, plan_result, write_json
    from akosim.trace import write_trace

    compute = setup.compute
    workers = cfg.cluster.workers
    print(f"akosim: {workers} nodes, gradient {format_size(setup.gradient_bytes)} "
          f"({setup.length:,} float32), compute {format_duration(compute.mean_s(workers))}"
          f"/round, batch {setup.batch_size}, "
          + (f"{setup.stop.rounds} rounds" if setup.stop.rounds else "")
          + (f" up to {format_duration(setup.stop.duration_s)}" if setup.stop.duration_s
             else ""))
    print(format_table(runs, training=training))
    for run in runs:
        line = explain_p(run)
        if line:
            print(line + f"; staleness bound p-1+s = {_bound(run.staleness_bound_rounds)} "
                         f"rounds")
            if run.p > STALE_WARNING_P:
                print(f"note: with p={run.p} each gradient component reaches a peer up to "
                      f"{run.p - 1} rounds late; the network cannot carry more of it per "
                      f"round. Larger batches (longer compute per round), faster links or "
                      f"fewer workers lower p; --p N trades throughput for freshness.")
    if args.out:
        plan = plan_result(runs, config=config_to_dict(cfg), training=training,
                           gradient_bytes=setup.gradient_bytes,
                           compute_s=[compute.base_s(i) for i in range(workers)],
                           batch_size=setup.batch_size)
        write_json(args.out, json_safe(plan.to_json()))
        print(f"wrote {args.out}")
    if args.trace:
        write_trace(args.trace, runs)
        print(f"wrote {args.trace} (open in https://ui.perfetto.dev)")
    return 0


def _bound(value: float) -> str:
    return "inf" if math.isinf(value) else f"{value:g}"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] == "train":
            return run_plan(argv[1:], training=True)
        if argv and argv[0] == "sweep":
            from akosim.sweep import run_sweep

            return run_sweep(argv[1:])
        if argv and argv[0] == "plan":
            argv = argv[1:]
        return run_plan(argv)
    except USER_ERRORS as error:
        fail(str(error))
    except KeyboardInterrupt:
        print("akosim: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
