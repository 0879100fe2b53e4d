"""From resolved settings to a runnable simulation setup, in one place.

Every akosim entry point (plan, train, sweep, predict, the analysis and the
public API) builds its simulation here, so each setting is read and checked
once:

- `SimulationOptions`: what akosim takes beside the run settings (where the
  compute time comes from, per-round and per-message overheads, speeds and
  stragglers, coalescing, the TCP calibration file), typed;
- `measured_compute`: the workload's gradient step timed on this machine
  through the per-machine compute cache (akosim.planning.compute_cache), at most
  MEASURE_STEPS steps, the count, warm-up and stopping rule akorun's p auto uses too
  (akocore.workloads.step_timing); plan, train, sweep and predict share the cache entry;
- `tcp_parameters_for`: the TCP-aware network model's parameters when the
  config asks for that model (akosim.calibration.host_calibration_io), else None;
- `chooses_ssp_with_p`: the rule that lets akosim choose s together with p
  (a partitioned scheme, timing only, and no layer set exchange.ssp);
- `settles` / `stop_rule`: when a simulation stops; timing without rounds or a
  duration from any layer runs each configuration until its round time settles
  (akosim.sim.settling), an explicit ``--rounds`` exactly that many rounds;
- `build_setup`: the only constructor of akosim.sim.scenario.Setup; `with_plan`
  resolves p once for the setup (the choice of s, the runs, the advice);
- `simulation_setup`: the whole path from a resolved config and the options
  to a setup (and the workload when the workers really train).
"""

from __future__ import annotations

import inspect
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from akocore.cli_support import UsageError
from akocore.records.host_calibration import TcpParameters
from akocore.schemes.registry import scheme_named
from akocore.settings.layers import ResolvedSettings
from akocore.settings.normalise import network_layers
from akocore.settings.schema import AkosimConfig, RunConfig
from akocore.units import format_duration
from akocore.workloads.step_timing import MEASURE_STEPS
from akosim.calibration.run_calibration import (
    compute_from_result,
    message_overhead_from_result,
    message_software_from_result,
    overhead_from_result,
)
from akosim.network.island_reduce import has_islands, island_batch_config
from akosim.planning.runspec import (
    gradient_length_of_size,
    load_workload,
    parse_duration_flag,
)

if TYPE_CHECKING:
    from akocore.workloads.flat import FlatWorkload as Workload
    from akosim.planning.compute import ComputeModel
    from akosim.planning.compute_cache import Measured
    from akosim.sim.engine import StopRule
    from akosim.sim.scenario import Setup

TRAINING_ROUNDS_CAP = 10_000  # akosim train without rounds or duration: bounded by accuracy


@dataclass(frozen=True)
class SimulationOptions:
    """What akosim takes beside the run settings, typed (seconds, bytes, tuples); the
    command line's flags and the API's keywords are read into it by `simulation_options`."""

    # the [akosim] settings (resolved and checked by the key registry, akocore.settings)
    compute: float | str = "measure"  # seconds per round, "measure" or "remeasure"
    message_overhead_s: float | None = None  # None: 0, or what compute_from's run measured
    coalesce: float | None = None  # None: akosim.network.fluid.COALESCE_REL
    # the command's own options
    compute_from: str | None = None  # an akorun result: its measured compute and overheads
    round_overhead_s: float | None = None  # None: 0, or what compute_from's run measured
    compute_jitter: float = 0.0
    speeds: tuple[float, ...] = ()  # per-worker compute multipliers, in turn
    stragglers: tuple[int, ...] = ()  # ranks slowed by straggler_factor
    straggler_factor: float = 4.0
    gradient_bytes: int | None = None  # None: the workload's
    host_calibration: str | None = None  # an `akosim calibrate --out` file

    @classmethod
    def from_args(cls, args: Any, resolved: ResolvedSettings | None = None,
                  ) -> SimulationOptions:
        """The options of resolved settings' [akosim] section and the command's own flags
        in an argparse namespace (a flag a command lacks keeps its default)."""
        names = inspect.signature(simulation_options).parameters
        own = {name: getattr(args, name) for name in names
               if name != "akosim" and getattr(args, name, None) is not None}
        return simulation_options(resolved.akosim if resolved is not None else AkosimConfig(),
                                  **own)


def simulation_options(akosim: AkosimConfig, *, gradient_size: str | int | None = None,
                       compute_from: str | os.PathLike[str] | None = None,
                       round_overhead: str | float | None = None,
                       compute_jitter: float = 0.0,
                       speeds: str | Sequence[float] | None = None,
                       stragglers: str | Sequence[int] | None = None,
                       straggler_factor: float = 4.0,
                       host_calibration: str | os.PathLike[str] | None = None,
                       ) -> SimulationOptions:
    """The typed options, read once here from a flag's text or a Python value:
    `gradient_size` "17MB" or bytes, `round_overhead` "3ms" or seconds, `speeds` "1,1,2"
    or numbers, `stragglers` "3,7" or ranks; UsageError for a value out of range."""
    overhead = None
    if round_overhead is not None:
        overhead = seconds_of(round_overhead, "--round-overhead")
        if overhead < 0:
            raise UsageError(f"--round-overhead: got {round_overhead}, expected >= 0")
    jitter = _number(compute_jitter, "--compute-jitter")
    if jitter < 0:
        raise UsageError(f"--compute-jitter: got {compute_jitter}, expected >= 0")
    ranks = _numbers(stragglers, "--stragglers")
    if any(rank != int(rank) for rank in ranks):
        raise UsageError(f"--stragglers: got {stragglers}, expected ranks (whole numbers)")
    return SimulationOptions(
        compute=akosim.compute, message_overhead_s=akosim.message_overhead_s,
        coalesce=akosim.coalesce,
        compute_from=None if compute_from is None else os.fspath(compute_from),
        round_overhead_s=overhead, compute_jitter=jitter,
        speeds=_numbers(speeds, "--speeds"), stragglers=tuple(int(rank) for rank in ranks),
        straggler_factor=_number(straggler_factor, "--straggler-factor"),
        gradient_bytes=None if gradient_size is None else gradient_bytes_of(gradient_size),
        host_calibration=None if host_calibration is None else os.fspath(host_calibration))


def gradient_bytes_of(size: str | int) -> int:
    """``--gradient-size`` ("17MB", or a number of bytes) -> whole float32 values' bytes."""
    from akocore.messages import FLOAT_BYTES

    if isinstance(size, str):
        return gradient_length_of_size(size) * FLOAT_BYTES
    if isinstance(size, bool) or not isinstance(size, int) or size < FLOAT_BYTES \
            or size % FLOAT_BYTES:
        raise UsageError(f"gradient_size: got {size!r}, expected a whole number of float32 "
                         f"values (bytes, a multiple of 4) or text with a unit, e.g. 17MB")
    return size


def seconds_of(value: str | float, flag: str) -> float:
    """A duration given as text with its unit ("3ms"; a bare number is refused) or as
    seconds (a Python number)."""
    if isinstance(value, str):
        return parse_duration_flag(flag, value)
    return _number(value, flag)


def _number(value: Any, flag: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise UsageError(f"{flag}: got {value!r}, expected a number") from None


def _numbers(value: str | Sequence[float] | None, flag: str) -> tuple[float, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return _floats(value, flag)
    return tuple(_number(item, flag) for item in value)


# ------------------------------------------------------------------ compute


def compute_setting(value: str | float) -> float | str:
    """``--compute TEXT`` (or a Python call's seconds) read as the [akosim] compute
    setting (the key registry's check, the same as plan's): seconds per round, "measure"
    or "remeasure"."""
    from akocore.settings.layers import Given, Layer, resolve

    given = (Given("akosim.compute", value, Layer.FLAG, "by --compute")
             if isinstance(value, str) else
             Given("akosim.compute", value, Layer.API, f"api: compute={value!r}"))
    return resolve([given]).akosim.compute


def measured_compute(cfg: RunConfig, *, load: Callable[[], Workload] | None = None,
                     refresh: bool = False, announce: bool = True) -> Measured:
    """The configured workload's gradient step on this machine, from the per-machine cache
    or measured now (MEASURE_STEPS steps) and cached; `load` builds the workload."""
    from akosim.planning.compute import StepTiming, measure_step_timing
    from akosim.planning.compute_cache import key_for
    from akosim.planning.compute_cache import measured_compute as cached_or_measured

    train = cfg.train
    key = key_for(train.workload, train.batch_size, train.optimizer)

    def measure() -> tuple[StepTiming, int]:
        # a broken factory stops here, before the notice
        workload = load() if load is not None else load_workload(cfg)
        if announce:
            print(f"akosim: measuring one gradient step of {train.workload} (batch "
                  f"{train.batch_size}) on this machine until its median is known within "
                  f"±5% (5 to {MEASURE_STEPS} steps); the result is cached for later "
                  f"calls...", file=sys.stderr, flush=True)
        return measure_step_timing(workload, MEASURE_STEPS), workload.param_count

    return cached_or_measured(key, measure, steps=MEASURE_STEPS, refresh=refresh)


def compute_model(options: SimulationOptions, workers: int, compute_s: float) -> ComputeModel:
    """Each worker's compute time per round: the base, compute_from's, speeds, stragglers,
    jitter and the per-round overhead; UsageError for a value out of range."""
    from akosim.planning.compute import ComputeModel

    per_worker: tuple[float, ...] = ()
    overhead: float | tuple[float, ...] = 0.0
    if options.compute_from:
        per_worker = compute_from_result(options.compute_from, workers)
        overhead = overhead_from_result(options.compute_from, workers) or 0.0
    if options.round_overhead_s is not None:
        overhead = options.round_overhead_s
    for rank in options.stragglers:
        if not 0 <= rank < workers:
            raise UsageError(f"--stragglers: rank {rank} is not a worker (0..{workers - 1})")
    try:
        return ComputeModel(compute_s, options.speeds, options.compute_jitter,
                            options.stragglers, options.straggler_factor, per_worker,
                            overhead_s=overhead)
    except ValueError as error:
        raise UsageError(str(error)) from None


def fixed_compute(compute_s: float | tuple[float, ...], *, jitter: float = 0.0,
                  overhead_s: float | tuple[float, ...] = 0.0) -> ComputeModel:
    """A compute model of given seconds per round (one for all, or one per worker)."""
    from akosim.planning.compute import ComputeModel

    if isinstance(compute_s, tuple):
        return ComputeModel(0.0, jitter=jitter, per_worker_s=compute_s, overhead_s=overhead_s)
    return ComputeModel(compute_s, jitter=jitter, overhead_s=overhead_s)


def _floats(text: str, flag: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise UsageError(f"{flag}: got {text!r}, expected numbers separated by commas") \
            from None


# ------------------------------------------------------------------ network


def message_overhead_s(options: SimulationOptions, nodes: int, *,
                       real_network: bool = False) -> tuple[float, ...]:
    """--message-overhead, else what --compute-from's run measured: under the max-min
    model (an emulated run) its message_overhead_s; under the TCP model (a real
    network, whose time message_overhead_s contains) only message_software_s."""
    if options.message_overhead_s is not None:
        return (options.message_overhead_s,)
    if options.compute_from:
        if real_network:
            return message_software_from_result(options.compute_from, nodes) or ()
        return message_overhead_from_result(options.compute_from, nodes)
    return ()


@dataclass(frozen=True)
class TcpChoice:
    """The TCP model's parameters and where they came from, in words."""

    params: TcpParameters
    provenance: str


def tcp_parameters_for(cfg: RunConfig, host_calibration: str | None = None, *,
                       without_message_cost: bool = False) -> TcpChoice | None:
    """The TCP-aware model's parameters when cfg's network model has the tcp layer
    (--host-calibration, else this host's cached calibration, else defaults); None for
    the max-min model.
    `without_message_cost` drops the host's per-message figures (when the message cost is
    given or measured by the run, they would count twice)."""
    if "tcp-core" not in network_layers(cfg.network.model):
        return None
    from akosim.calibration.host_calibration_io import tcp_parameters

    source = tcp_parameters(host_calibration)
    params = source.params
    if without_message_cost:
        params = replace(params, message_fixed_s=0.0, message_per_byte_s=0.0)
    return TcpChoice(params, source.provenance)


# ------------------------------------------------------------------ the setup


def chooses_ssp_with_p(resolved: ResolvedSettings, *, training: bool = False) -> bool:
    """Whether akosim chooses s together with p (the smallest s that lets sending overlap
    compute): a partitioned scheme, timing only, and no layer set exchange.ssp."""
    scheme = scheme_named(resolved.config.exchange.scheme)
    return not training and scheme.partitioned and not resolved.given("exchange.ssp")


def settles(resolved: ResolvedSettings, *, training: bool = False) -> bool:
    """Whether each configuration is simulated until its round time settles (akosim.sim.
    settling): timing only, no duration, and no rounds from any layer (none given, or
    cleared by a target accuracy)."""
    train = resolved.config.train
    return (not training and train.duration_s is None
            and (train.rounds is None or not resolved.given("train.rounds")))


def stop_rule(cfg: RunConfig, *, training: bool = False, settle: bool = False) -> StopRule:
    """When the simulation stops: with `settle` (see `settles`), once each configuration's
    round time has settled; else the configured rounds or duration (training drains)."""
    from akosim.sim.engine import StopRule
    from akosim.sim.settling import SettleRule

    rounds = cfg.train.rounds
    if not training and (settle or (rounds is None and cfg.train.duration_s is None)):
        return StopRule(drain=False, settle=SettleRule())
    if rounds is None and cfg.train.duration_s is None:
        rounds = TRAINING_ROUNDS_CAP  # training: bounded by accuracy
    return StopRule(rounds=rounds, duration_s=cfg.train.duration_s, drain=training)


def build_setup(config: RunConfig, *, length: int, compute: ComputeModel, stop: StopRule,
                batch_size: int | None = None, coalesce_rel: float | None = None,
                message_overhead_s: tuple[float, ...] = (), compute_source: str = "",
                tcp: TcpParameters | None = None, network_model: str | None = None) -> Setup:
    """The setup every variant of one question shares (the one place that builds it).
    `network_model` (a preset or LAYER+LAYER...) defaults to the configured one. Ranks
    that are islands of several devices get their inside all-reduce charged each round
    (akosim.network.island_reduce) unless `compute` already has it."""
    from akocore.messages import FLOAT_BYTES
    from akosim.network.fluid import COALESCE_REL
    from akosim.network.island_reduce import inside_times_s
    from akosim.sim.scenario import Setup

    coalesce = COALESCE_REL if coalesce_rel is None else coalesce_rel
    if has_islands(config) and not compute.inside_s:  # each island reduces inside
        compute = replace(compute, inside_s=inside_times_s(config, length * FLOAT_BYTES))
    return Setup(config, length, compute,
                 config.train.batch_size if batch_size is None else batch_size, stop,
                 coalesce_rel=coalesce, message_overhead_s=message_overhead_s,
                 compute_source=compute_source, tcp=tcp,
                 network_model=config.network.model if network_model is None else network_model)


def simulation_setup(cfg: RunConfig, options: SimulationOptions, *, training: bool = False,
                     settle: bool = False, announce: Callable[[str], None] = print,
                     length: int | None = None) -> tuple[Setup, Workload | None]:
    """The setup of `cfg` with `options`, and the workload when the workers really train;
    with `settle` (`settles` of the resolved settings) each configuration runs until its
    round time settles instead of cfg's rounds; `length`: the gradient's float32 values
    when the caller has them already (a sweep's points share the sweep's)."""
    cache: dict[str, Any] = {}

    def workload() -> Workload:
        if "w" not in cache:
            cache["w"] = load_workload(cfg)
        return cache["w"]

    trained_cfg = training_config(cfg) if training else cfg  # an island: every device's batch
    if training and options.gradient_bytes:
        raise UsageError("--gradient-size is for timing-only runs; akosim train takes "
                         "the gradient of --workload")
    if options.gradient_bytes and cfg.train.target_accuracy is not None:
        raise UsageError("--gradient-size is for timing-only plans; ranking by "
                         "--target-accuracy trains the gradient of --workload")
    compute_s, source, param_count = 0.0, "", None
    if options.compute_from:
        source = f"compute measured by akorun ({options.compute_from})"
    elif options.compute in ("measure", "remeasure"):
        measured = measured_compute(cfg, load=workload, refresh=options.compute == "remeasure")
        compute_s, param_count = measured.record.compute_s, measured.record.param_count
        source = measured.provenance()
    else:
        assert isinstance(options.compute, float)  # checked by the [akosim] section
        compute_s = options.compute
        source = f"compute {format_duration(compute_s)}/round given"
    if training:
        length = workload().param_count
    elif length is not None:
        pass
    elif options.gradient_bytes:
        length = options.gradient_bytes // 4  # float32 values
    elif param_count is not None:
        length = param_count  # cached with the measurement: no need to build the model
    else:
        length = workload().param_count
    compute = compute_model(options, cfg.cluster.workers, compute_s)
    stop = stop_rule(cfg, training=training, settle=settle)
    real_network = "tcp-core" in network_layers(cfg.network.model)
    overhead = message_overhead_s(options, cfg.cluster.workers, real_network=real_network)
    tcp = None
    if real_network:
        # given or the run's own message cost: the host's figure would count twice
        choice = tcp_parameters_for(cfg, options.host_calibration,
                                    without_message_cost=bool(overhead))
        assert choice is not None
        tcp = choice.params
        announce(f"akosim: {choice.provenance}")
    elif options.host_calibration:
        raise UsageError("--host-calibration is for a network model with the tcp layer "
                         "(--network-model tcp)")
    setup = build_setup(cfg, length=length, compute=compute, stop=stop,
                        coalesce_rel=options.coalesce, message_overhead_s=overhead,
                        compute_source=source, tcp=tcp)
    if not training:
        return setup, None
    return setup, workload() if trained_cfg is cfg else load_workload(trained_cfg)


def training_config(cfg: RunConfig) -> RunConfig:
    """`cfg` with the batch one simulated rank trains on: an island's, every device's batch
    (akosim.network.island_reduce.island_batch_config); UsageError when the ranks' islands
    differ."""
    try:
        return island_batch_config(cfg)
    except ValueError as error:
        raise UsageError(str(error)) from None


def with_plan(setup: Setup) -> Setup:
    """`setup` with the planner's answer for its configured p, resolved once here; the
    choice of s, the runs and the advice read it from the setup."""
    if setup.plan is not None:
        return setup
    return replace(setup, plan=setup.configured_plan())
