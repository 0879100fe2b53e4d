"""The akosim command line: plan (the default command), train, sweep.

    akosim --workers 64 --bandwidth 40mbps --p auto        (the same as akosim plan ...)
    akosim train --workers 16 --target-accuracy 0.9
    akosim sweep --workers 4,16,64 --bandwidth 40mbps,1gbps --p 1,4,auto --out sweep/

One argparse parser with a subparser per command; a command line that does
not start with a command name is a plan. Settings are resolved in layers
(akocore.settings): each command's defaults < --config < --set < flags, and
the resolved settings know which layer set each value (--show-config prints
them). User mistakes exit with status 2 and one line on stderr; a training step
whose loss or gradient is NaN or Inf (the user's data, or a diverged run) exits
with status 1 and one line naming the worker, round and batch; results go
to stdout as a table and, with --out, to a JSON file.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from akocore.cli_support import (
    OneLineParser,
    UsageError,
    check_out_file,
    fail,
    load_scheme_plugins,
    one_line,
)
from akocore.schemes.registry import wire_codec
from akocore.settings.cli_flags import add_akosim_argument, add_shared_arguments, arg_layers
from akocore.settings.key_registry import RUN_SECTIONS, Tool
from akocore.settings.layers import ResolvedSettings
from akocore.units import format_duration, format_size
from akocore.workloads.nonfinite import NonFiniteStep
from akosim.calibration.run_calibration import (  # noqa: F401 (rank_overhead_s: re-exported)
    compute_from_result,
    message_overhead_from_result,
    message_software_from_result,
    overhead_from_result,
    rank_overhead_s,
)
from akosim.planning.runspec import (
    TIMING_DEFAULTS,
    TRAIN_DEFAULTS,
    USER_ERRORS,
    load_workload,
)
from akosim.progress import tracker_factory

if TYPE_CHECKING:
    from akosim.planning import PlanOutcome

__all__ = ["TIMING_DEFAULTS", "TRAIN_DEFAULTS", "USER_ERRORS", "OneLineParser", "UsageError",
           "build_parser", "fail", "load_workload", "main"]

COMMANDS = ("plan", "train", "sweep", "calibrate", "predict")

EPILOG_RUN = """\
examples:
  akosim --workers 64 --bandwidth 40mbps --p auto
      Ako with p chosen for 64 workers on 40 Mbit/s NICs, beside p=1, a parameter
      server, ring all-reduce and DiLoCo (the seed CNN's 17 MB gradient, compute measured
      here), each row trained in simulated time (a proxy model on 8 of the workers) and
      the first predicted to reach the accuracy recommended (--rank-by throughput: the
      most samples/s)
  akosim --workers 4 --link-bandwidth 40,20,10mbps --latency 20ms --compute 0.3s
      the seeds' heterogeneous WAN, with a given compute time per round
  akosim --workers 8 --scheme ako --p 4 --ssp 2 --gradient-size 17MB --trace t.json
      one configuration only, with a Chrome/Perfetto timeline
  akosim --config configs/uniform-wan.toml --out result.json
  akosim --config configs/uniform-wan.toml --set exchange.ssp=2 --show-config
      print every resolved setting and where it came from, then stop

commands (akosim COMMAND --help):
  plan    the default: what p, what round time, how much traffic, how stale
  train   the simulated workers really train; time to accuracy
  sweep   a grid of timing-only simulations, in parallel, resumable
  calibrate  measure the TCP model's parameters on this host once (cached)
  predict    predict an akorun run (RUN_DIR) exactly as it was configured
"""

EPILOG_TRAIN = """\
examples:
  akosim train --workers 16 --target-accuracy 0.9
      16 simulated workers really train the default workload (bundled digits);
      every partial is applied at its simulated arrival; prints time to 90%
  akosim train --workers 4 --bandwidth 40mbps --scheme ako --p 4 --duration 300s
"""

PLAN_DESCRIPTION = ("What-if simulator for decentralised training with partial gradient "
                    "exchange (Ako), parameter servers and all-reduce. Without a command "
                    "(or with `plan`) it plans: what p, what round time, how much traffic, "
                    "how stale, and which configuration is predicted to reach the accuracy "
                    "first.")
TRAIN_DESCRIPTION = ("Training mode: the simulated workers really train the shared JAX "
                     "workload; accuracy against simulated time predicts time to accuracy.")


def _add_sim_arguments(parser: argparse.ArgumentParser) -> None:
    add_shared_arguments(parser, Tool.AKOSIM)
    group = parser.add_argument_group("simulation")
    add = group.add_argument
    add("--gradient-size", metavar="SIZE",
        help="gradient bytes per worker, e.g. 17MB or 4MiB (default: from --workload)")
    add_akosim_argument(group, "compute")
    add("--compute-from", metavar="RESULT.json",
        help="take each worker's measured compute time (and its per-round overhead and "
             "per-message overhead, when the file has them) from an akorun result file")
    add("--round-overhead", metavar="DURATION",
        help="per-round time each worker spends outside the gradient (dispatch, inbox, "
             "optimizer, event loop), spent before the round's sends leave, e.g. 3ms "
             "(default 0, or what --compute-from's result measured)")
    add_akosim_argument(group, "message_overhead")
    add("--compute-jitter", type=float, default=0.0, metavar="FRACTION",
        help="relative standard deviation of each round's compute time, e.g. 0.1")
    add("--speeds", metavar="F1,F2,...",
        help="per-worker compute time multipliers assigned in turn, e.g. 1,1,2 (a slow third)")
    add("--stragglers", metavar="RANKS", help="ranks slowed by --straggler-factor, e.g. 3,7")
    add("--straggler-factor", type=float, default=4.0, metavar="X",
        help="compute time multiplier of the stragglers (default 4)")
    add_akosim_argument(group, "coalesce")
    add("--max-staleness", type=int, default=None, metavar="ROUNDS",
        help="the most rounds a gradient may take to reach every peer (p - 1 + s; H - 1 "
             "for DiLoCo): p = auto stays within it (the largest p that fits), the plan "
             "recommends only configurations within it, and a given p beyond it is called "
             "too stale with the cheapest ways out (default 64)")
    add("--host-calibration", metavar="FILE.json",
        help="--network-model tcp: the model's parameters from this `akosim calibrate "
             "--out` file (default: this host's cached calibration, else defaults)")
    add("--out", metavar="FILE.json", help="write every simulated configuration as JSON")
    add("--trace", metavar="FILE.json",
        help="write a Chrome trace (compute, sends, waits per worker); opens in Perfetto")
    add("--show-config", action="store_true",
        help="print every resolved setting and the layer it came from (default, --config, "
             "--set or a flag), then stop")
    add("--quiet", action="store_true", help="no progress bars")


def _add_ranking_arguments(parser: argparse.ArgumentParser) -> None:
    """akosim plan only: rank by simulated training, and the longer explanation."""
    group = parser.add_argument_group("ranking by accuracy")
    add = group.add_argument
    add("--rank-by", metavar="accuracy|throughput", default="accuracy",
        help="accuracy (default): train every row of the comparison in simulated time "
             "(the workload itself when small, else a proxy, on up to 8 of the workers) and "
             "recommend the first to reach the best row's accuracy less --accuracy-margin "
             "points, so never a row that ends further below the best; throughput: the "
             "highest samples/s within --max-staleness, whatever it learns")
    add("--accuracy-margin", metavar="POINTS", type=float, default=None,
        help="--rank-by accuracy never recommends a row whose accuracy is more than this "
             "many points below the best row's (default 2)")
    add("--time-budget", metavar="DURATION",
        help="rank the schemes by the accuracy their simulated training reaches within "
             "this much simulated time, e.g. 60s (with --target-accuracy: the target must "
             "be reached within it); --target-accuracy alone ranks by time to the target. "
             "Up to three configurations of each scheme within --max-staleness (the "
             "fastest, the least stale not much slower, one between) train the workload "
             "for at most --rounds rounds (default 300)")
    add("--explain", action="store_true",
        help="the longer explanation: what p, s, H, tau, staleness and the codec mean for "
             "this run, what bounds each configuration (compute, NIC, latency, staleness) "
             "and why the winner won")


def build_parser() -> OneLineParser:
    """The akosim parser: one subparser per command (main puts `plan` first when none is named)."""
    from akosim.sweeping.sweep_flags import DESCRIPTION as SWEEP_DESCRIPTION
    from akosim.sweeping.sweep_flags import EPILOG as SWEEP_EPILOG
    from akosim.sweeping.sweep_flags import add_sweep_arguments

    formatter = argparse.RawDescriptionHelpFormatter
    parser = OneLineParser(prog="akosim", description=PLAN_DESCRIPTION, epilog=EPILOG_RUN,
                           formatter_class=formatter)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True,
                                     parser_class=OneLineParser)
    plan = commands.add_parser("plan", prog="akosim", help="plan (the default command)",
                               description=PLAN_DESCRIPTION, epilog=EPILOG_RUN,
                               formatter_class=formatter)
    _add_sim_arguments(plan)
    _add_ranking_arguments(plan)
    plan.set_defaults(handler=lambda args: run_plan(args, training=False))
    train = commands.add_parser("train", help="simulate and really train",
                                description=TRAIN_DESCRIPTION, epilog=EPILOG_TRAIN,
                                formatter_class=formatter)
    _add_sim_arguments(train)
    train.set_defaults(handler=lambda args: run_plan(args, training=True))
    sweep = commands.add_parser("sweep", help="a grid of timing-only simulations",
                                description=SWEEP_DESCRIPTION, epilog=SWEEP_EPILOG,
                                formatter_class=formatter)
    add_sweep_arguments(sweep)
    sweep.set_defaults(handler=_sweep_handler)
    from akosim import prediction as predict
    from akosim.calibration import host_calibrate

    calibrate = commands.add_parser("calibrate", help="measure the TCP model on this host",
                                    description=host_calibrate.DESCRIPTION,
                                    epilog=host_calibrate.EPILOG, formatter_class=formatter)
    host_calibrate.add_calibrate_arguments(calibrate)
    calibrate.set_defaults(handler=host_calibrate.calibrate_command)
    predict_parser = commands.add_parser("predict", help="predict an akorun run",
                                         description=predict.DESCRIPTION,
                                         epilog=predict.EPILOG, formatter_class=formatter)
    predict.add_predict_arguments(predict_parser)
    predict_parser.set_defaults(handler=predict.predict_command)
    return parser


def _sweep_handler(args: argparse.Namespace) -> int:
    from akosim.sweeping.sweep_grid import sweep_command

    return sweep_command(args)


# --------------------------------------------------------------------- helpers


def progress_factory(quiet: bool) -> Callable[[str, int], Callable[[int], None]] | None:
    """Each simulated configuration's rounds: a bar on a terminal, plain lines elsewhere
    (akosim.progress), nothing when `quiet`."""
    tracker = tracker_factory(quiet)
    if tracker is None:
        return None
    return lambda label, total: tracker(label, total, "round")


# -------------------------------------------------------------------- commands


def resolve_settings(args: argparse.Namespace, *, training: bool) -> ResolvedSettings:
    """The command's settings: its defaults < the run --compute-from names < --config <
    --set < flags (akosim.planning.resolution, as the API's), each value with its origin."""
    from akosim.planning.resolution import resolve_settings as resolve_layers

    return resolve_layers(arg_layers(args), training=training,
                          compute_from=getattr(args, "compute_from", None),
                          time_budget=bool(getattr(args, "time_budget", None)))


def describe_settings(resolved: ResolvedSettings, *, training: bool) -> list[str]:
    """--show-config: every run and [akosim] setting with its origin, as the plan runs it
    (an s the plan chooses with p, and rounds the plan settles, say so instead of showing
    the default they replace)."""
    from akosim.planning import chooses_ssp_with_p, settles
    from akosim.sim.settling import SETTLE_CAP_ROUNDS

    lines = resolved.describe((*RUN_SECTIONS, "akosim"))
    if chooses_ssp_with_p(resolved, training=training):
        lines = [("exchange.ssp = chosen with p when the plan runs (the smallest s that lets "
                  "sending overlap compute; give --ssp to fix it)")
                 if line.startswith("exchange.ssp = ") else line for line in lines]
    if settles(resolved, training=training) and resolved.config.train.rounds is not None:
        lines = [(f"train.rounds = until each configuration's round time settles, at most "
                  f"{SETTLE_CAP_ROUNDS}  (akosim plan default; --rounds N runs exactly N)")
                 if line.startswith("train.rounds = ") else line for line in lines]
    return lines


def run_plan(args: argparse.Namespace, *, training: bool = False) -> int:
    """akosim plan / train: the API's plan_outcome of the flags, printed (and written)."""
    from akosim.planning import SimulationOptions, plan_outcome

    resolved = resolve_settings(args, training=training)
    if args.show_config:
        print("\n".join(describe_settings(resolved, training=training)))
        return 0
    if args.out:  # refused now, not after the whole plan
        check_out_file(args.out)
    if args.trace:
        check_out_file(args.trace, "--trace")
    if training:
        from akocore.process_setup import enable_compilation_cache

        cache = Path.home() / ".cache" / "akosim" / "jax"
        enable_compilation_cache(str(cache))
    factory = progress_factory(bool(args.quiet))
    outcome = plan_outcome(resolved, SimulationOptions.from_args(args, resolved),
                           training=training, trace=bool(args.trace), factory=factory,
                           max_staleness_rounds=args.max_staleness,
                           time_budget_s=time_budget_s(args),
                           explain_more=bool(getattr(args, "explain", False)),
                           announce=None if args.quiet else _to_stderr,
                           rank_by=getattr(args, "rank_by", "accuracy"),
                           accuracy_margin_points=getattr(args, "accuracy_margin", None))
    _print_outcome(args, outcome, training)
    return 0


def time_budget_s(args: argparse.Namespace) -> float | None:
    """--time-budget in seconds (None: not given); a bare number is refused."""
    from akosim.planning.runspec import parse_duration_flag

    text = getattr(args, "time_budget", None)
    return None if text is None else parse_duration_flag("--time-budget", text)


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _print_outcome(args: argparse.Namespace, outcome: PlanOutcome, training: bool) -> None:
    from akosim.network.island_reduce import describe_islands, has_islands
    from akosim.planning.result_tables import format_table, json_safe, unsettled_lines, write_json
    from akosim.planning.trace import write_trace
    from akosim.sim.settling import settle_words

    setup, runs = outcome.planned.setup, outcome.planned.runs
    compute = setup.compute
    workers = setup.config.cluster.workers
    print(f"akosim: {workers} nodes, gradient {format_size(setup.gradient_bytes)} "
          f"({setup.length:,} float32), compute {format_duration(compute.mean_s(workers))}"
          f"/round, batch {setup.batch_size}"
          + (" per device, " if has_islands(setup.config) else ", ")
          + (f"{setup.stop.rounds} rounds" if setup.stop.rounds else "")
          + (f" up to {format_duration(setup.stop.duration_s)}" if setup.stop.duration_s
             else "")
          + (settle_words(setup.stop.settle) if setup.stop.settle else ""))
    if setup.compute_source:
        print(f"akosim: {setup.compute_source}")
    for line in describe_islands(setup.config, setup.batch_size, setup.gradient_bytes):
        print(f"akosim: {line}")
    codec = wire_codec(setup.config.exchange)
    if codec != "none":
        print(f"akosim: codec {codec} on gradients, pushes, reduce steps and pseudo-gradients "
              f"(parameters, models and all-gather steps travel as float32), error feedback on")
    print(format_table(runs, training=training))
    for line in unsettled_lines(runs):
        print(line)
    if training and setup.plan is not None:
        from akosim.planning.advice import held_by_staleness

        if held_by_staleness(setup.plan):
            print(f"akosim: p = auto held to {setup.plan.p}: p bound by "
                  f"{setup.plan.binding}")
    if outcome.explanation is not None:
        print(outcome.explanation.line)
        for line in outcome.explanation.advice:
            print(line)
    if outcome.ranking is not None:
        from akosim.planning.accuracy_ranking import format_ranking

        if outcome.ranking.ranked:
            print(format_ranking(outcome.ranking))
        for line in outcome.ranking.verdict():
            print(line)
    if outcome.learning is not None:
        for line in (*outcome.learning.caveat(), outcome.learning.table()):
            print(line)
    for line in outcome.caveats:
        print(line)
    for line in outcome.recommendation:
        print(line)
    for line in outcome.explained:
        print(line)
    if args.out:
        write_json(args.out, json_safe(outcome.record.to_json()))
        print(f"wrote {args.out}")
    if args.trace:
        write_trace(args.trace, runs)
        print(f"wrote {args.trace} (open in https://ui.perfetto.dev)")


def _bound(value: float) -> str:
    return "inf" if math.isinf(value) else f"{value:g}"


def with_command(argv: Sequence[str]) -> list[str]:
    """`argv` with `plan` put first when it names no command (plan is the default)."""
    argv = list(argv)
    return argv if argv and argv[0] in COMMANDS else ["plan", *argv]


def main(argv: Sequence[str] | None = None) -> int:
    argv = with_command(sys.argv[1:] if argv is None else argv)
    load_scheme_plugins(os.environ, "akosim")
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args))
    except USER_ERRORS as error:
        fail(str(error), "akosim")
    except NonFiniteStep as error:  # the user's data or loss went NaN/Inf: one line, exit 1
        print(f"akosim {args.command}: failed: {one_line(error)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("akosim: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
