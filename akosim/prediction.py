"""`akosim predict RUN_DIR`: predict one akorun run exactly as it was configured.

The run's merged ``result.json`` (akocore.records.results.RunResult) says what ran:
its configuration echo (workload, batch, optimizer, scheme, network, rounds),
each rank's resolved p, the staleness bound, and each rank's measured compute
seconds per round and per-round overhead. predict simulates that run and prints
the predicted steady round time beside the measured one.

What is taken from where, so that nothing is counted twice:
- compute and per-round overhead: the run's own ranks (not network time), or
  with ``--compute measure`` akosim's own cached measurement of the run's
  workload on this host and no per-round overhead (a host-calibrated
  prediction: nothing timed by the run, only its configuration and resolved p);
  on the testbed every rank ran on this host, so when the training ranks fill
  its cores the step is the one measured with as many processes stepping at
  once (`colocated_compute_s`), varying from step to step as much as measured
  there (the compute jitter), and the host's per-message cost is stretched by
  the same measured slowdown and charged as the ranks' CPU;
- the network: the one the kernel realised when the run directory holds the
  testbed's ``testbed.json`` (akocore.records.testbed_record: each node's uplink, the
  per-pair caps, no latency, since this kernel's testbed ignores it), else the
  run's [network] settings; shared by the TCP-aware model (akosim.network.tcpmodel, the
  default here: a real run is real TCP) or max-min;
- the per-message software cost: each rank's ``message_software_s`` (measured
  by akorun without network time) when the result has it (and compute comes
  from the run), else the host calibration's (``akosim calibrate``). Never
  ``message_overhead_s``: on a real network it contains the network time, which
  the model adds itself. On a testbed whose ranks fill the host's cores the
  host's cost is also charged as CPU of the ranks (akosim.network.rank_cpu); the run's
  own stays a per-message delay, since the run's measured compute already holds
  the time its message handling took from the steps.

Flags that restate the run are accepted; one that contradicts it (``--workers
8`` for a 3-rank run) is a user error, as is a run directory without a result.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from akocore.cli_support import UsageError
from akocore.records.calibration import Calibration
from akocore.records.host_calibration import TcpParameters
from akocore.records.jsonrecord import RecordError
from akocore.records.result_reader import read_result
from akocore.records.results import PlanResult, RunResult
from akocore.records.testbed_record import TESTBED_RECORD_FILE, TestbedRecord
from akocore.schemes.registry import is_partitioned
from akocore.settings.cli_flags import add_shared_arguments, arg_layers
from akocore.settings.key_registry import Tool
from akocore.settings.layers import Given, Layer, Origin, resolve
from akocore.settings.normalise import network_layers
from akocore.settings.schema import NetworkConfig, RunConfig
from akocore.settings.toml_io import config_from_dict, config_to_dict
from akocore.units import format_duration
from akosim.calibration.host_calibration_io import tcp_parameters
from akosim.calibration.run_calibration import run_message_software_s

DESCRIPTION = ("Predict an akorun run exactly as it was configured (workload, batch, "
               "optimizer, scheme, each rank's p, s, rounds, network, each rank's compute) "
               "and print the predicted round time beside the measured one.")
EPILOG = """\
examples:
  akosim predict runs/ako-3w               the run's result.json, TCP-aware model
  akosim predict runs/ako-3w --network-model maxmin --out prediction.json
  akosim predict runs/ako-3w --host-calibration host.json
  akosim predict runs/ako-3w --compute measure   host-calibrated: no timing from the run
"""
LOOPBACK_PREFIXES = ("127.", "localhost", "[::1]", "::1")
# keys that are about the simulation, not the run: never a contradiction
SIMULATION_KEYS = frozenset({"network.model"})
COMPUTE_SOURCES = ("run", "measure")


def add_predict_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR",
                        help="an akorun run directory (its result.json) or the result file")
    add_shared_arguments(parser, Tool.AKOSIM)
    add = parser.add_argument
    add("--host-calibration", metavar="FILE.json",
        help="the TCP model's parameters from this `akosim calibrate --out` file (default: "
             "this host's cached calibration, else documented defaults)")
    add("--compute", metavar="run|measure", default="run", dest="compute_source",
        help="compute per round from the run's ranks (default), or 'measure': akosim's own "
             "cached measurement of the run's workload on this host, with the per-message "
             "cost from the host calibration (a host-calibrated prediction: nothing timed "
             "by the run is used)")
    add("--out", metavar="FILE.json", help="write the prediction (a plan record) as JSON")


def result_path(run_dir: str) -> Path:
    path = Path(run_dir)
    return path / "result.json" if path.is_dir() else path


def read_run(path: Path) -> RunResult:
    """The RunResult in `path`; UsageError (one line) otherwise."""
    import json

    try:
        record = read_result(json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        raise UsageError(f"predict: no result at {path} (an akorun run directory holds "
                         f"result.json)") from None
    except (OSError, ValueError) as error:  # RecordError and JSON errors are ValueErrors
        raise UsageError(f"predict: {path} is not an akorun result ({error})") from None
    if not isinstance(record, RunResult) or record.tool != "akorun":
        raise UsageError(f"predict: {path} holds no akorun run result")
    if not record.config:
        raise UsageError(f"predict: {path} does not record the run's configuration")
    return record


def run_config(run: RunResult, where: Path) -> RunConfig:
    """The run's configuration as it ran (configured p, not yet resolved)."""
    try:
        return config_from_dict(run.config)
    except (ValueError, TypeError) as error:
        raise UsageError(f"predict: the configuration recorded in {where} is not readable "
                         f"({error})") from None


def check_no_contradiction(layers: Sequence[Given], cfg: RunConfig, where: Path) -> str:
    """The network model asked for; UsageError when a value of `layers` (a flag, --set or
    --config value, or a Python call's keyword) differs from what the run used."""
    # hosts are the run's business: without them a --workers that differs reaches the
    # comparison below instead of failing as "one host per worker"
    base = replace(cfg, cluster=replace(cfg.cluster, hosts=()))
    try:
        resolved = resolve(layers, defaults=base,
                           defaults_origin=Origin(Layer.DEFAULT, "the run"))
    except ValueError as error:  # ConfigError: a value no run could have used
        raise UsageError(f"predict: {error}") from None
    for key in sorted(resolved.origins):
        if key in SIMULATION_KEYS or key == "cluster.hosts":
            continue
        section, field_name = key.split(".", 1)
        given = resolved.value(key)
        from akocore.settings.key_registry import current

        by_dotted = current().by_dotted

        ran = by_dotted[key].value_in(getattr(base, section))
        if given != ran:
            dump = by_dotted[key].dump
            raise UsageError(f"predict: {field_name} {dump(given)!r} ({resolved.origin(key)}) "
                             f"contradicts the run, which used {dump(ran)!r} ({where}); "
                             f"predict takes the run as it was")
    return resolved.config.network.model if resolved.given("network.model") else "tcp"


def measured_rounds(run: RunResult) -> int:
    ranks = run.training_ranks or run.per_worker
    rounds = max((r.rounds for r in ranks), default=0)
    if rounds < 1:
        raise UsageError("predict: the run completed no round; nothing to predict")
    return rounds


def read_testbed(run_dir: Path) -> TestbedRecord | None:
    """The run's testbed.json (what the real-network testbed configured), or None when the
    run had none; UsageError (one line) when the file is there but not readable."""
    import json

    path = run_dir / TESTBED_RECORD_FILE
    if not path.is_file():
        return None
    try:
        return TestbedRecord.from_json(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, RecordError) as error:
        raise UsageError(f"predict: {path} is not a testbed record ({error})") from None


def testbed_network(record: TestbedRecord, configured: NetworkConfig,
                    nodes: int) -> tuple[NetworkConfig, list[str]]:
    """The network the testbed realised, as akosim's settings, and notes on what akosim
    cannot express: each node's uplink ceiling, each pair class's ceiling (already
    min(pair cap, uplink)), the one-way delays its delay line held packets for (none when
    the run had no delay line: `latency_ignored_s` says what it left out)."""
    by_rank = {node.rank: node for node in record.nodes}
    if sorted(by_rank) != list(range(nodes)):
        raise UsageError(f"predict: the testbed record has ranks {sorted(by_rank)}, the run "
                         f"{nodes} nodes")
    uplinks = tuple(by_rank[rank].uplink_bps for rank in range(nodes))
    pairs = [q for q in record.queues if q.direction == "pair"]
    matrix: tuple[tuple[float, ...], ...] | None = None
    if pairs:
        caps = [[math.inf] * nodes for _ in range(nodes)]
        for queue in pairs:
            assert queue.peer is not None  # a pair class names its destination
            caps[queue.rank][queue.peer] = queue.ceil_bps
        matrix = tuple(tuple(row) for row in caps)
    notes: list[str] = []
    if not record.downlink_shaped:
        notes.append("the testbed left downlinks unshaped; akosim's NICs are symmetric, "
                     "so downlinks are modelled at the uplink rates")
    elif any(by_rank[r].downlink_bps not in (None, by_rank[r].uplink_bps)
             for r in range(nodes)):
        notes.append("a testbed downlink differs from its uplink; akosim models "
                     "downlinks at the uplink rates")
    if record.latency_ignored_s > 0:
        notes.append(f"configured latency {format_duration(record.latency_ignored_s)} "
                     f"not realised by the testbed: predicted with none")
    delays = record.latency_matrix_s
    if delays is not None and len(delays) != nodes:
        raise UsageError(f"predict: the testbed record's latency matrix is "
                         f"{len(delays)}x{len(delays)}, the run has {nodes} nodes")
    network = replace(configured, bandwidth_bps=uplinks, link_bandwidth_bps=(),
                      link_bandwidth_matrix_bps=matrix, latency_s=(0.0,),
                      latency_matrix_s=delays)
    return network, notes


def host_measured_compute_s(cfg: RunConfig) -> tuple[float, int, str]:
    """akosim's own cached measurement of the run's workload, batch and optimizer on this
    host (measured now when not cached): seconds per step, gradient elements, provenance."""
    from akosim.planning.setup import measured_compute

    measured = measured_compute(cfg, announce=False)
    return measured.record.compute_s, measured.record.param_count, \
        f"{measured.provenance()} (akosim's own, not the run's)"


@dataclass(frozen=True)
class Colocation:
    """How the testbed's co-located ranks stretch akosim's single-process figures."""

    compute_s: float  # the step with `ranks` processes stepping at once on this host
    slowdown: float  # that over one process alone, measured side by side (>= 1)
    provenance: str
    step_cv: float = 0.0  # relative standard deviation of one such step (0: not measured)


def colocated_compute_s(cfg: RunConfig, training_ranks: int) -> Colocation:
    """The run's workload stepped by `training_ranks` processes at once on this host
    (akosim.calibration.colocated_compute: measured once, cached beside the compute cache), as the
    testbed ran every rank here; never timed by the run being predicted."""
    from akosim.calibration.colocated_compute import colocated_compute

    train = cfg.train
    record, fresh = colocated_compute(train.workload, train.batch_size, train.optimizer,
                                      training_ranks)
    return Colocation(record.compute_s, record.slowdown,
                      record.provenance() + ("" if fresh else ", cached"), record.step_cv)


def message_cpu_stretched(tcp: TcpParameters, slowdown: float) -> TcpParameters:
    """The host's per-message software cost (measured by one process alone) stretched
    by the co-located ranks' measured slowdown (charged as their CPU by the network
    model's message-cpu layer: they fill the host's cores, the handling takes its time
    from the steps)."""
    return replace(tcp, message_fixed_s=tcp.message_fixed_s * slowdown,
                   message_per_byte_s=tcp.message_per_byte_s * slowdown)


def with_message_cpu(model: str) -> str:
    """Network model `model` with the message-cpu layer (it has the tcp layer)."""
    layers = network_layers(model)
    if "message-cpu" in layers:
        return model
    return "+".join(network_layers("+".join((*layers, "message-cpu"))))


def _loopback(cfg: RunConfig) -> bool:
    return bool(cfg.cluster.hosts) and all(h.startswith(LOOPBACK_PREFIXES)
                                           for h in cfg.cluster.hosts)


@dataclass(frozen=True)
class Prediction:
    """What `akosim predict` found: the predicted and measured round times, the prediction
    as a plan record (its one run; `explanation` is the prediction line) and the lines the
    command prints before its table (what was taken from where)."""

    predicted_round_time_s: float
    measured_round_time_s: float | None
    record: PlanResult
    lines: tuple[str, ...]
    runs: tuple[Any, ...]  # akosim.sim.scenario.SimRun: the table's rows

    @property
    def relative_error(self) -> float | None:
        """predicted / measured - 1 (None when the run measured no round time)."""
        measured = self.measured_round_time_s
        if measured is None or not math.isfinite(measured) or measured <= 0:
            return None
        return self.predicted_round_time_s / measured - 1


def predict_run(run_dir: str | os.PathLike[str], layers: Sequence[Given] = (), *,
                compute_source: str = "run", host_calibration: str | None = None,
                ) -> Prediction:
    """The prediction of the run `run_dir` names, with the settings `layers` restate (the
    one path of `akosim predict` and `akosim.predict`); `compute_source` "run" (the run's
    compute) or "measure" (akosim's own); UsageError for a mistake."""
    from akosim.planning.result_tables import plan_result
    from akosim.planning.runspec import configured_runs, load_workload
    from akosim.planning.setup import build_setup, fixed_compute, stop_rule, tcp_parameters_for

    path = result_path(os.fspath(run_dir))
    if compute_source not in COMPUTE_SOURCES:
        raise UsageError(f"predict: --compute: got {compute_source!r}, expected "
                         f"{' or '.join(COMPUTE_SOURCES)} (the run's compute or akosim's own)")
    run = read_run(path)
    configured = run_config(run, path)
    model = check_no_contradiction(layers, configured, path)
    rounds = measured_rounds(run)
    exchange = configured.exchange
    if is_partitioned(run.scheme) and run.p_of:
        exchange = replace(exchange, p=tuple(run.p_of))
    testbed = read_testbed(path.parent)
    network = configured.network
    testbed_notes: list[str] = []
    if testbed is not None:
        network, testbed_notes = testbed_network(testbed, network, configured.cluster.workers)
    cfg = replace(configured, exchange=replace(exchange, ssp=run.ssp),
                  train=replace(configured.train, rounds=rounds, duration_s=None,
                                target_accuracy=None),
                  network=replace(network, model=model))
    workers = cfg.cluster.workers
    from_run = compute_source == "run"
    colocation: Colocation | None = None
    calibration = Calibration.from_run(run, source=str(path))
    gradient_bytes = next((r.model_bytes for r in run.per_worker if r.model_bytes), None)
    if from_run:
        compute_s = calibration.compute_s(workers)
        if not compute_s:
            raise UsageError(f"predict: {path} lists no rank with a measured compute time")
        overhead = calibration.overhead_s(workers) or 0.0
        jitter = calibration.compute_jitter
        length = gradient_bytes // 4 if gradient_bytes else load_workload(cfg).param_count
        software = run_message_software_s(run, workers)
        compute_line = f"compute and per-round overhead measured by the run ({path})"
    else:
        host_compute_s, length, compute_line = host_measured_compute_s(cfg)
        training = run.training_workers or len(run.training_ranks) or workers
        # every rank ran on this host and filled its cores: they shared them
        if testbed is not None and training >= (os.cpu_count() or 1):
            colocation = colocated_compute_s(cfg, training)
            host_compute_s = colocation.compute_s
            compute_line = f"{colocation.provenance} (akosim's own, not the run's)"
        compute_s, overhead, jitter, software = (host_compute_s,) * workers, 0.0, 0.0, None
        if colocation is not None:
            # the co-located step varies as measured: it breaks the lockstep that equal
            # steps keep under fair sharing (the asynchronous PS on delayed paths)
            jitter = colocation.step_cv
    run_measured_software = software is not None
    tcp: TcpParameters | None = None
    sources = [compute_line]
    if testbed is not None:
        sources.append(f"network: as the testbed realised it ({path.parent / TESTBED_RECORD_FILE})"
                       + "".join(f"; {note}" for note in testbed_notes))
    else:
        sources.append("network: the run's configuration (no testbed.json)")
    choice = tcp_parameters_for(cfg, host_calibration,
                                # the run measured it: the host's figure would count twice
                                without_message_cost=software is not None)
    if choice is not None:
        tcp = choice.params
        if software is None and colocation is not None:
            tcp = message_cpu_stretched(tcp, colocation.slowdown)
            model = with_message_cpu(model)
            sources.append(f"per-message software cost x{colocation.slowdown:.2f} (the "
                           f"co-located ranks' measured slowdown), charged as the ranks' CPU")
        sources.append(choice.provenance)
    elif host_calibration or software is None:
        host = tcp_parameters(host_calibration).params
        software = software or ((host.message_fixed_s,) if host.message_fixed_s else None)
    sources.append("per-message software cost: " + (
        "the run's message_software_s" if run_measured_software
        else "the host calibration" if (tcp is not None and tcp.message_fixed_s) or software
        else "not measured (0)"))
    setup = build_setup(cfg, length=length,
                        compute=fixed_compute(tuple(compute_s), jitter=jitter,
                                              overhead_s=overhead),
                        stop=stop_rule(cfg),  # the run's rounds, no drain
                        batch_size=run.batch_size or cfg.train.batch_size,
                        message_overhead_s=software or (), compute_source="; ".join(sources),
                        tcp=tcp, network_model=model)
    runs = configured_runs(setup)
    predicted = runs[0].round_time_s
    measured = run.round_time_s
    label = run.label if run.label and run.label != run.scheme else ""
    lines = [f"akosim predict: {path}: {run.scheme} {label}".rstrip()
             + f", {workers} nodes, {rounds} rounds, network model {model}"]
    lines += [f"akosim: {line}" for line in sources]
    if "tcp-core" in network_layers(model) and testbed is None and _loopback(cfg):
        lines.append("akosim: note: the run's ranks are on loopback, where akorun emulates "
                     "the network in-process by default (a fluid model); --network-model "
                     "maxmin predicts an emulated run")
    line = prediction_line(predicted, measured)
    plan = plan_result(runs, config=config_to_dict(cfg), training=False,
                       gradient_bytes=length * 4, compute_s=list(compute_s),
                       batch_size=setup.batch_size, compute_source=setup.compute_source)
    return Prediction(predicted, measured, replace(plan, explanation=line), tuple(lines),
                      tuple(runs))


def predict_command(args: argparse.Namespace) -> int:
    """`akosim predict`: print the prediction (and write it with --out)."""
    from akosim.planning.result_tables import format_table, json_safe, write_json

    prediction = predict_run(args.run_dir, arg_layers(args), compute_source=args.compute_source,
                             host_calibration=args.host_calibration)
    for line in prediction.lines:
        print(line)
    print(format_table(list(prediction.runs), training=False))
    print(prediction.record.explanation)
    if args.out:
        write_json(args.out, json_safe(prediction.record.to_json()))
        print(f"wrote {args.out}")
    return 0


def prediction_line(predicted_s: float, measured_s: float | None) -> str:
    if measured_s is None or not math.isfinite(measured_s) or measured_s <= 0:
        return f"predicted round time {format_duration(predicted_s)} (the run measured none)"
    error = predicted_s / measured_s - 1
    return (f"predicted round time {format_duration(predicted_s)}, measured "
            f"{format_duration(measured_s)} ({100 * error:+.1f}%)")


__all__ = ["COMPUTE_SOURCES", "Colocation", "DESCRIPTION", "EPILOG", "add_predict_arguments",
           "colocated_compute_s", "host_measured_compute_s", "message_cpu_stretched",
           "with_message_cpu", "Prediction", "predict_command", "predict_run",
           "prediction_line", "read_run", "read_testbed", "testbed_network"]
