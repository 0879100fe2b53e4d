"""Results as data: the records akosim and akorun write and analysis reads.

One vocabulary for both backends (the same key means the same thing and has
the same type wherever it appears):

- `RankResult`: one rank of a run (akorun's ``worker-R.json``; an entry of a
  run's ``per_worker``);
- `RunResult`: one run, config echoed, the summary figures and ``per_worker``
  (akorun's merged ``result.json``; one entry of akosim's ``runs``);
- `PlanResult`: akosim's ``--out`` file, the simulated configurations of one
  question in ``runs``;
- `Calibration`: what a real run tells the simulator (per-rank compute time,
  per-round and per-message overheads, the resolved p, compute jitter), read by
  ``akosim --compute-from``;
- `ComputeMeasurement`: one cached ``--compute measure`` (workload, batch,
  optimizer, CPU fingerprint, JAX version -> seconds per gradient step), the
  file akosim keeps in the user's cache directory.

Counts are integers (``workers`` is the number of nodes, ``p`` the largest p of
any worker, ``p_of`` each worker's p). Every record's JSON carries
``schema_version`` (`SCHEMA_VERSION`) and ``kind``; `read_result` refuses
another version and converts, once, the files written before there was a
schema (no ``schema_version``: akorun's ``workers`` list, akosim's
``runs``, the experiment runner's calibration ``compute.json``). The field
metadata (unit, meaning, writer) generates docs/reference/result-schema.md
(`schema_markdown`). `Figures` carries the steady-state summary of one rank
(`rank_figures`) or one run (`merged_figures`) into those records; the derived
figures shared by all three live in akocore.figures. No I/O here: callers
read and write the files.

Past ~500 lines on purpose: these records are the one schema both backends and
the analysis share, versioned together (one `SCHEMA_VERSION`, one pre-schema
conversion, one generated docs/reference/result-schema.md); split across modules, a
change to one record could ship without its version bump or its documentation.

This module is over 500 lines because the schema is its documentation: every
field carries its unit, meaning and writer, and the legacy conversion sits
beside the fields it converts to.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from akocore.figures import (
    fill_missing,
    mean_of_known,
    relative_std,
    steady_mean,
    steady_round_time_s,
    tile,
    warmup_rounds,
)
from akocore.jsonrecord import (
    RecordError,
    meta,
    record_from_json,
    record_to_json,
    schema_rows,
)
from akocore.message_cost import MessageCost, MessageSample
from akocore.schemes.registry import is_partitioned

SCHEMA_VERSION = 3
# versions this toolkit reads: 1 lacks only the plan's ranking by accuracy (its fields
# default to "no ranking"), 2 only a simulated run's simulated_rounds, settled and
# warmup_rounds (they default to null: not recorded), so older files read as written
READABLE_VERSIONS = (1, 2, 3)

__all__ = [
    "READABLE_VERSIONS", "SCHEMA_VERSION", "SUMMARY_FIELDS", "Calibration",
    "ComputeMeasurement", "Figures", "LinkResult", "PlanResult", "RankCalibration",
    "RankResult", "RankedRun", "RecordError", "RunResult",
    "rank_overhead_s", "read_result", "run_compute_jitter", "run_fields", "schema_markdown",
]

Evaluation = tuple[float, int, float]  # (seconds since training start, round, accuracy)


def _check_header(data: Mapping[str, Any], kind: str, where: str) -> None:
    version = data.get("schema_version")
    if type(version) is not int or version not in READABLE_VERSIONS:
        raise RecordError(f"{where}schema_version: this toolkit reads version "
                          f"{SCHEMA_VERSION} (and {', '.join(map(str, READABLE_VERSIONS[:-1]))})"
                          f", the file has {version!r}")
    if data.get("kind", kind) != kind:
        raise RecordError(f"{where}kind: expected {kind!r}, got {data.get('kind')!r}")


# ---------------------------------------------------------------------- one rank


@dataclass(frozen=True)
class RankResult:
    """One rank's result. akorun writes every field it measures plus free-form
    diagnostics (`details`); akosim fills the figures it simulates."""

    rank: int = field(metadata=meta("", "rank of the node in the cluster (0-based)"))
    role: str = field(default="worker", metadata=meta(
        "", '"worker" (trains) or "ps" (a parameter-server shard)'))
    scheme: str = field(default="", metadata=meta("", "ako, ps or allreduce"))
    p: int = field(default=1, metadata=meta(
        "partitions", "largest p of any worker (1 for ps and allreduce: whole gradients)"))
    p_of: tuple[int, ...] = field(default=(), metadata=meta(
        "partitions", "each training worker's p (ako; empty for ps and allreduce)"))
    ssp: float = field(default=0.0, metadata=meta(
        "rounds", 'staleness bound s ("inf": asynchronous)'))
    workers: int = field(default=0, metadata=meta("nodes", "nodes in the cluster (a count)"))
    training_workers: int = field(default=0, metadata=meta(
        "nodes", "nodes that train (workers minus parameter servers)"))
    batch_size: int = field(default=0, metadata=meta(
        "samples", "samples per gradient step of one device (a rank of d devices: d x it)"))
    rounds: int = field(default=0, metadata=meta("rounds", "rounds completed"))
    round_time_s: float | None = field(default=None, metadata=meta(
        "s", "mean seconds per round, steady state (warm-up rounds skipped)"))
    samples_per_s: float | None = field(default=None, metadata=meta(
        "samples/s", "batch_size x the devices of the training ranks / round_time_s"))
    bytes_sent_per_worker_per_round: float | None = field(default=None, metadata=meta(
        "B", "bytes sent per round during the rounds (final flush excluded)"))
    compute_s_per_round: float | None = field(default=None, metadata=meta(
        "s", "mean gradient-step seconds per round (null: computes none, a server)"))
    wait_s_per_round: float | None = field(default=None, metadata=meta(
        "s", "mean seconds per round at the staleness gate"))
    overhead_s_per_round: float | None = field(default=None, metadata=meta(
        "s", "mean seconds per round outside the gradient step and the gate, steady "
             "state (dispatch, inbox, optimizer, event loop)", "akorun"))
    compute_s: float = field(default=0.0, metadata=meta(
        "s", "total seconds in gradient steps"))
    wait_s: float = field(default=0.0, metadata=meta("s", "total seconds at the gate"))
    bytes_sent: float = field(default=0.0, metadata=meta("B", "total bytes sent"))
    bytes_received: float = field(default=0.0, metadata=meta("B", "total bytes received"))
    bytes_sent_rounds: float | None = field(default=None, metadata=meta(
        "B", "bytes handed to the senders during the rounds", "akorun"))
    bytes_sent_flush: float | None = field(default=None, metadata=meta(
        "B", "bytes of the final flush (what node.finish owes), apart", "akorun"))
    message_overhead_s: float | None = field(default=None, metadata=meta(
        "s", "mean seconds a delivered message cost beyond the emulated wire (null "
             "without in-process emulation: on a real network that time holds the "
             "network's own; use message_software_s)", "akorun"))
    message_software_s: float | None = field(default=None, metadata=meta(
        "s", "mean software seconds per message, sender and receiver added: encode, "
             "seal, answer check, the receiver's seal check, hashing, decode, apply and "
             "sealed answer; time waiting for bytes and emulated holds excluded, so it "
             "never holds network time (emulated or not)", "akorun"))
    round_end_s: tuple[float, ...] = field(default=(), metadata=meta(
        "s", "end of each round since training start", "akorun"))
    round_compute_s: tuple[float, ...] = field(default=(), metadata=meta(
        "s", "gradient-step seconds of each round", "akorun"))
    round_wait_s: tuple[float, ...] = field(default=(), metadata=meta(
        "s", "gate seconds of each round", "akorun"))
    round_overhead_s: tuple[float, ...] = field(default=(), metadata=meta(
        "s", "seconds of each round outside gradient and gate", "akorun"))
    round_stride: int = field(default=1, metadata=meta(
        "rounds", "rounds between two entries of the round_* series: 1 (every round) "
                  "until they fill, then every stride-th round, the stride doubling each "
                  "time (entry i is round (i + 1) x stride - 1), so a long run's record "
                  "stays bounded; the totals and means count every round", "akorun"))
    evaluations: tuple[Evaluation, ...] = field(default=(), metadata=meta(
        "[s, round, fraction]", "test accuracy of this replica: [time, round, accuracy]",
        "akorun"))
    final_accuracy: float | None = field(default=None, metadata=meta(
        "fraction", "test accuracy of the final replica", "akorun"))
    stop_reason: str | None = field(default=None, metadata=meta(
        "", "why the rank stopped (rounds, duration, signal, ...)", "akorun"))
    exit_code: int | None = field(default=None, metadata=meta(
        "", "the rank's process exit status (akorun launch)", "akorun"))
    failed: bool = field(default=False, metadata=meta(
        "", "true when the rank wrote no result (only rank, role, exit_code are known)",
        "akorun"))
    first_round: int | None = field(default=None, metadata=meta(
        "rounds", "the first round this process trained (after --resume: the round it "
                  "rejoined at)", "akorun"))
    wall_s: float | None = field(default=None, metadata=meta(
        "s", "wall seconds from training start to the result", "akorun"))
    p_auto_compute_s: float | None = field(default=None, metadata=meta(
        "s", "gradient seconds per round p auto planned with (null: p given or not ako)",
        "akorun"))
    peer_timeouts: int | None = field(default=None, metadata=meta(
        "", "times a peer was suspended for silence past the peer timeout", "akorun"))
    suspended_at_end: tuple[int, ...] = field(default=(), metadata=meta(
        "", "ranks still suspended when this rank finished", "akorun"))
    peak_rss_bytes: int | None = field(default=None, metadata=meta(
        "B", "peak resident memory of the rank's process", "akorun"))
    model_bytes: int | None = field(default=None, metadata=meta(
        "B", "bytes of one full gradient (the model's parameters as float32)", "akorun"))
    uplink_utilisation: float | None = field(default=None, metadata=meta(
        "fraction", "busy fraction of the uplink (simulated time)", "akosim"))
    downlink_utilisation: float | None = field(default=None, metadata=meta(
        "fraction", "busy fraction of the downlink", "akosim"))
    max_lag_rounds: int | None = field(default=None, metadata=meta(
        "rounds", "largest lag behind the freshest peer", "akosim"))
    mean_lag_rounds: float | None = field(default=None, metadata=meta(
        "rounds", "mean lag behind the freshest peer", "akosim"))
    details: Mapping[str, Any] = field(default_factory=dict, metadata=meta(
        "", "akorun's other per-rank diagnostics "
        "(akorun.runtime.records.result_files.RankDiagnostics), written "
            "beside the keys above (peers, retries, warmup_s, params_sha256, ...); "
            "free-form, not compared", "akorun"))

    def __post_init__(self) -> None:
        clash = sorted(set(self.details) & _RANK_KEYS)
        if clash:
            raise ValueError(f"details: {clash[0]!r} is a field, not a detail")

    def to_json(self) -> dict[str, Any]:
        data = record_to_json(self)
        details = data.pop("details")
        return {"schema_version": SCHEMA_VERSION, "kind": "rank", **data, **details}

    @property
    def accuracy(self) -> float | None:
        """This rank's final test accuracy: `final_accuracy` (the name in result files)."""
        return self.final_accuracy

    @classmethod
    def from_json(cls, data: Any, where: str = "") -> RankResult:
        """The record from its JSON (keys that are no field go to `details`)."""
        if not isinstance(data, dict):
            raise RecordError(f"{where or 'rank'}: expected an object, got {data!r}")
        prefix = f"{where}." if where else ""
        _check_header(data, "rank", prefix)
        known = {k: v for k, v in data.items() if k in _RANK_KEYS and k != "details"}
        details = {k: v for k, v in data.items()
                   if k not in _RANK_KEYS and k not in ("schema_version", "kind")}
        return record_from_json(cls, {**known, "details": details}, where)


_RANK_KEYS = frozenset(f.name for f in fields(RankResult))


# ---------------------------------------------------------------------- one run


@dataclass(frozen=True)
class LinkResult:
    """Traffic on one directed link of a simulated run."""

    src: int = field(metadata=meta("", "sending node"))
    dst: int = field(metadata=meta("", "receiving node"))
    bytes: float = field(metadata=meta("B", "bytes carried"))
    cap_bps: float | None = field(metadata=meta("bit/s", "link capacity (null: unlimited)"))
    utilisation: float | None = field(metadata=meta("fraction", "busy fraction"))


@dataclass(frozen=True)
class RunResult:
    """One run: akorun's merged result.json, or one simulated configuration of akosim."""

    tool: str = field(metadata=meta("", 'who wrote it: "akosim" or "akorun"'))
    scheme: str = field(metadata=meta("", "ako, ps or allreduce"))
    mode: str = field(default="train", metadata=meta(
        "", '"train" (gradients computed) or "timing" (akosim without gradients)'))
    label: str = field(default="", metadata=meta(
        "", "what the run is, e.g. ako p=4 (auto) or ps 1 server(s)"))
    config: Mapping[str, Any] = field(default_factory=dict, metadata=meta(
        "", "the configuration echoed, as akocore.config.config_to_dict writes it"))
    run_id: str | None = field(default=None, metadata=meta("", "the launch's run id", "akorun"))
    p: int = field(default=1, metadata=meta(
        "partitions", "largest p of any worker (1 for ps and allreduce)"))
    p_of: tuple[int, ...] = field(default=(), metadata=meta(
        "partitions", "each training worker's p (ako; empty for ps and allreduce)"))
    p_reason: str = field(default="", metadata=meta(
        "", "what bound p auto (given, bandwidth, incast, ...)", "akosim"))
    ssp: float = field(default=0.0, metadata=meta(
        "rounds", 'staleness bound s ("inf": asynchronous)'))
    workers: int = field(default=0, metadata=meta("nodes", "nodes in the cluster (a count)"))
    training_workers: int = field(default=0, metadata=meta("nodes", "nodes that train"))
    ps_servers: int = field(default=0, metadata=meta(
        "nodes", "parameter-server nodes (0 unless ps)"))
    batch_size: int = field(default=0, metadata=meta(
        "samples", "samples per gradient step of one device (a rank of d devices: d x it)"))
    round_time_s: float | None = field(default=None, metadata=meta(
        "s", "mean steady-state seconds per round over the training workers"))
    samples_per_s: float | None = field(default=None, metadata=meta(
        "samples/s", "batch_size x the devices of the training ranks / round_time_s"))
    bytes_sent_per_worker_per_round: float | None = field(default=None, metadata=meta(
        "B", "bytes a training worker sends per round (final flush excluded)"))
    compute_s_per_round: float | None = field(default=None, metadata=meta(
        "s", "mean gradient-step seconds per round over the training workers"))
    wait_s_per_round: float | None = field(default=None, metadata=meta(
        "s", "mean seconds per round at the staleness gate"))
    overhead_s_per_round: float | None = field(default=None, metadata=meta(
        "s", "mean seconds per round outside gradient and gate", "akorun"))
    final_accuracy: float | None = field(default=None, metadata=meta(
        "fraction", "test accuracy of the first training worker's final replica"))
    evaluations: tuple[Evaluation, ...] = field(default=(), metadata=meta(
        "[s, round, fraction]", "the first training worker's accuracy: [time since "
                                "training start (akosim: simulated), round, accuracy]"))
    time_to_target_s: float | None = field(default=None, metadata=meta(
        "s", "simulated seconds to the target accuracy (null: not reached)", "akosim"))
    max_relative_difference: float | None = field(default=None, metadata=meta(
        "", "largest max-norm difference between a training replica and the first, "
            "relative to the first's max-norm (inf: a replica holds NaN or Inf)", "akorun"))
    nic_utilisation: float | None = field(default=None, metadata=meta(
        "fraction", "mean busy fraction of the training workers' uplinks", "akosim"))
    max_uplink_utilisation: float | None = field(default=None, metadata=meta(
        "fraction", "busiest uplink", "akosim"))
    max_downlink_utilisation: float | None = field(default=None, metadata=meta(
        "fraction", "busiest downlink", "akosim"))
    staleness_bound_rounds: float | None = field(default=None, metadata=meta(
        "rounds", 'how late a gradient component can be applied (p - 1 + s; "inf")',
        "akosim"))
    max_lag_rounds: int | None = field(default=None, metadata=meta(
        "rounds", "largest lag any worker had", "akosim"))
    bottleneck: str | None = field(default=None, metadata=meta(
        "", "the most utilised resource, in words", "akosim"))
    simulated_s: float | None = field(default=None, metadata=meta(
        "s", "simulated seconds of the steady part", "akosim"))
    simulated_rounds: int | None = field(default=None, metadata=meta(
        "rounds", "rounds every training worker ended (a timing plan without --rounds: "
                  "where its round time settled)", "akosim"))
    settled: bool | None = field(default=None, metadata=meta(
        "", "whether the round time settled (one window's mean within 1% of the one "
            "before) within the settle cap; false: it did not, the figure is over the "
            "capped run; null: fixed rounds or duration", "akosim"))
    warmup_rounds: int | None = field(default=None, metadata=meta(
        "rounds", "a settling run: the rounds before the span round_time_s is the mean "
                  "over (the staleness bound + 1, in whole periods)", "akosim"))
    wall_s: float | None = field(default=None, metadata=meta(
        "s", "wall seconds the simulation took", "akosim"))
    events: Mapping[str, Any] = field(default_factory=dict, metadata=meta(
        "", "simulator event counts (rate solves, messages, ...)", "akosim"))
    partial: bool = field(default=False, metadata=meta(
        "", "some ranks left no record: the figures are of the others (`missing_ranks`)",
        "akorun"))
    missing_ranks: tuple[int, ...] = field(default=(), metadata=meta(
        "", "ranks that left no record (their `per_worker` entries say `failed`)", "akorun"))
    per_worker: tuple[RankResult, ...] = field(default=(), metadata=meta(
        "", "one RankResult per rank (akorun: every rank; akosim: the training workers)"))
    per_link: tuple[LinkResult, ...] = field(default=(), metadata=meta(
        "", "traffic per directed link", "akosim"))

    def to_json(self) -> dict[str, Any]:
        data = record_to_json(self)
        data["per_worker"] = [rank.to_json() for rank in self.per_worker]
        return {"schema_version": SCHEMA_VERSION, "kind": "run", **data}

    @classmethod
    def from_json(cls, data: Any, where: str = "") -> RunResult:
        if not isinstance(data, dict):
            raise RecordError(f"{where or 'run'}: expected an object, got {data!r}")
        prefix = f"{where}." if where else ""
        _check_header(data, "run", prefix)
        body = {k: v for k, v in data.items()
                if k not in ("schema_version", "kind", "per_worker")}
        ranks = data.get("per_worker", [])
        if not isinstance(ranks, list):
            raise RecordError(f"{prefix}per_worker: expected a list, got {ranks!r}")
        run = record_from_json(cls, body, where)
        return replace(run, per_worker=tuple(
            RankResult.from_json(r, f"{prefix}per_worker[{i}]") for i, r in enumerate(ranks)))

    @property
    def accuracy(self) -> float | None:
        """The run's final test accuracy: `final_accuracy` (the name in result files)."""
        return self.final_accuracy

    @property
    def training_ranks(self) -> tuple[RankResult, ...]:
        return tuple(r for r in self.per_worker if r.role == "worker")


@dataclass(frozen=True)
class RankedRun:
    """One candidate of the plan's ranking by accuracy: its simulated training run."""

    position: int = field(metadata=meta("", "1 = the winner", "akosim"))
    label: str = field(metadata=meta("", "the configuration, as the comparison names it",
                                     "akosim"))
    scheme: str = field(metadata=meta("", "its scheme", "akosim"))
    reached: bool = field(metadata=meta(
        "", "whether it reached the target accuracy within the round (and time) budget "
            "and ended at or above it", "akosim"))
    time_to_target_s: float | None = field(metadata=meta(
        "s", "simulated seconds to the target accuracy (null: not reached or no target)",
        "akosim"))
    accuracy: float | None = field(metadata=meta(
        "fraction", "accuracy when its training stopped (at the target, the time budget or "
                    "the round budget)", "akosim"))
    rounds: int = field(metadata=meta("rounds", "rounds its first worker trained", "akosim"))
    simulated_s: float = field(metadata=meta("s", "simulated seconds it trained", "akosim"))
    samples_per_s: float = field(metadata=meta(
        "samples/s", "its throughput in the timing comparison", "akosim"))
    staleness_bound_rounds: float = field(metadata=meta(
        "rounds", "its staleness bound (within max_staleness_rounds)", "akosim"))
    evaluations: tuple[tuple[float, int, float], ...] = field(default=(), metadata=meta(
        "", "(simulated seconds, round, accuracy) of each evaluation", "akosim"))
    exchange: Mapping[str, Any] = field(default_factory=dict, metadata=meta(
        "", "the exchange settings it trained with (TOML keys: scheme, p, ssp, H, ...), "
            "what `akorun launch --plan` runs (empty in records written before it)",
        "akosim"))


@dataclass(frozen=True)
class PlanResult:
    """akosim's --out file: the simulated configurations of one question."""

    config: Mapping[str, Any] = field(metadata=meta("", "the configuration echoed", "akosim"))
    mode: str = field(metadata=meta("", '"timing" or "train"', "akosim"))
    gradient_bytes: int = field(metadata=meta("B", "gradient bytes per worker", "akosim"))
    compute_s: tuple[float, ...] = field(metadata=meta(
        "s", "each node's base compute seconds per round", "akosim"))
    runs: tuple[RunResult, ...] = field(metadata=meta(
        "", "one RunResult per simulated configuration", "akosim"))
    tool: str = field(default="akosim", metadata=meta("", '"akosim"', "akosim"))
    compute_source: str = field(default="", metadata=meta(
        "", "where the compute time came from (given, measured here on DATE, cached, ...)",
        "akosim"))
    explanation: str = field(default="", metadata=meta(
        "", "the plan in one line: round time, NIC use, propagation, what bound p "
            '("" without an Ako plan)', "akosim"))
    chosen_ssp: float | None = field(default=None, metadata=meta(
        "rounds", "the staleness bound s the plan chose with p (null: no Ako plan)",
        "akosim"))
    propagation_rounds: float | None = field(default=None, metadata=meta(
        "rounds", "rounds until one round's gradient has fully reached every peer "
                  "(p - 1 + s of the chosen plan)", "akosim"))
    propagation_s: float | None = field(default=None, metadata=meta(
        "s", "propagation_rounds x the chosen plan's round time", "akosim"))
    max_staleness_rounds: float | None = field(default=None, metadata=meta(
        "rounds", "--max-staleness: the propagation a user accepts", "akosim"))
    advice: tuple[str, ...] = field(default=(), metadata=meta(
        "", "when propagation exceeds max_staleness_rounds: the cheapest ways out, "
            "each quantified", "akosim"))
    recommendation: tuple[str, ...] = field(default=(), metadata=meta(
        "", "the comparison's winner and what p, s, H and staleness mean: by default "
            "the first predicted to reach the target accuracy among the runs within "
            "--max-staleness and --accuracy-margin of the best; with --rank-by "
            "throughput the highest throughput among the runs within --max-staleness "
            "(never one outside it)", "akosim"))
    target_accuracy: float | None = field(default=None, metadata=meta(
        "fraction", "--target-accuracy, or the default ranking's target (90% of the best "
                    "accuracy a row reached): the ranking orders by time to it (null: no "
                    "ranking by accuracy)", "akosim"))
    time_budget_s: float | None = field(default=None, metadata=meta(
        "s", "--time-budget: the ranking orders by accuracy within it (null: none)",
        "akosim"))
    ranking_rounds: int | None = field(default=None, metadata=meta(
        "rounds", "the round budget each candidate trained within (null: no ranking)",
        "akosim"))
    ranking: tuple[RankedRun, ...] = field(default=(), metadata=meta(
        "", "the candidates in the order of the ranking, first to the target first: "
            "with --target-accuracy or --time-budget up to three configurations of each "
            "scheme within --max-staleness (its fastest, the least stale not much slower, "
            "one between); by default every row of the comparison, its time to target "
            "predicted as rounds to target x its round time", "akosim"))
    ranking_verdict: tuple[str, ...] = field(default=(), metadata=meta(
        "", "the ranking in words: the winner, or that no candidate reached the target",
        "akosim"))
    explained: tuple[str, ...] = field(default=(), metadata=meta(
        "", "--explain: what p, s, H, tau, staleness and the codec mean for this run and "
            "which resource bounds each configuration", "akosim"))

    def to_json(self) -> dict[str, Any]:
        data = record_to_json(self)
        data["runs"] = [run.to_json() for run in self.runs]
        return {"schema_version": SCHEMA_VERSION, "kind": "plan", **data}

    @classmethod
    def from_json(cls, data: Any) -> PlanResult:
        if not isinstance(data, dict):
            raise RecordError(f"plan: expected an object, got {data!r}")
        _check_header(data, "plan", "")
        runs = data.get("runs")
        if not isinstance(runs, list):
            raise RecordError(f"runs: expected a list, got {runs!r}")
        body = {k: v for k, v in data.items() if k not in ("schema_version", "kind", "runs")}
        plan = record_from_json(cls, {**body, "runs": []})
        return replace(plan, runs=tuple(RunResult.from_json(r, f"runs[{i}]")
                                        for i, r in enumerate(runs)))


def run_fields(*names: str) -> tuple[str, ...]:
    """`names`, each a field of RunResult (a typo fails where it is called, at import)."""
    known = {f.name for f in fields(RunResult)}
    unknown = [name for name in names if name not in known]
    if unknown:
        raise ValueError(f"not fields of RunResult: {', '.join(unknown)}")
    return names


# The headline figures of a run, in the order a table of runs shows them (akosim sweep's
# sweep.csv columns).
SUMMARY_FIELDS: tuple[str, ...] = run_fields(
    "scheme", "p", "ssp", "workers", "round_time_s", "samples_per_s",
    "bytes_sent_per_worker_per_round", "nic_utilisation", "staleness_bound_rounds",
    "bottleneck",
)


# ---------------------------------------------------------------------- calibration


@dataclass(frozen=True)
class RankCalibration:
    """What one real rank tells the simulator; gaps already filled (see Calibration)."""

    rank: int = field(metadata=meta("", "rank of the node"))
    role: str = field(default="worker", metadata=meta("", '"worker" or "ps"'))
    compute_s_per_round: float | None = field(default=None, metadata=meta(
        "s", "gradient-step seconds per round"))
    overhead_s_per_round: float | None = field(default=None, metadata=meta(
        "s", "seconds per round outside gradient and gate"))
    message_overhead_s: float | None = field(default=None, metadata=meta(
        "s", "seconds a message costs beyond the wire"))


@dataclass(frozen=True)
class Calibration:
    """A real run's measurements as the simulator uses them (akosim --compute-from).

    Per rank: compute, per-round and per-message overheads. A rank without a value
    (a parameter server computes no gradient) got the others' mean when the
    calibration was made (akocore.figures.fill_missing); a figure no rank has is
    null everywhere. `compute_s(nodes)` etc. spread the ranks over `nodes`.
    """

    source: str = field(metadata=meta("", "the result file it was made from"))
    per_worker: tuple[RankCalibration, ...] = field(metadata=meta("", "one entry per rank"))
    p_of: tuple[int, ...] = field(default=(), metadata=meta(
        "partitions", "each worker's resolved p (empty: not ako)"))
    compute_jitter: float = field(default=0.0, metadata=meta(
        "fraction", "relative std of the steady per-round compute time"))

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, "kind": "calibration",
                **record_to_json(self)}

    @classmethod
    def from_json(cls, data: Any) -> Calibration:
        if not isinstance(data, dict):
            raise RecordError(f"calibration: expected an object, got {data!r}")
        _check_header(data, "calibration", "")
        return record_from_json(cls, {k: v for k, v in data.items()
                                      if k not in ("schema_version", "kind")})

    @classmethod
    def from_run(cls, run: RunResult, source: str = "") -> Calibration:
        """Each rank's measurements, gaps filled with the other ranks' means. A rank
        without compute time (a server) also gets the mean per-round overhead."""
        ranks = run.per_worker
        compute = fill_missing([r.compute_s_per_round for r in ranks])
        overhead = fill_missing([rank_overhead_s(r) if r.compute_s_per_round is not None
                                 else None for r in ranks])
        message = fill_missing([r.message_overhead_s for r in ranks])
        none = (None,) * len(ranks)
        return cls(source, tuple(
            RankCalibration(r.rank, r.role, c, o, m)
            for r, c, o, m in zip(ranks, compute or none, overhead or none, message or none,
                                  strict=True)),
            p_of=run.p_of if is_partitioned(run.scheme) else (),
            compute_jitter=run_compute_jitter(run))

    def _spread(self, values: Sequence[float | None], nodes: int) -> tuple[float, ...] | None:
        known = fill_missing(values) if values else None
        return tile(known, nodes) if known else None

    def compute_s(self, nodes: int) -> tuple[float, ...] | None:
        """Per-node compute seconds per round, or None when no rank measured any."""
        return self._spread([r.compute_s_per_round for r in self.per_worker], nodes)

    def overhead_s(self, nodes: int) -> tuple[float, ...] | None:
        return self._spread([r.overhead_s_per_round for r in self.per_worker], nodes)

    def message_overhead_s(self, nodes: int) -> tuple[float, ...] | None:
        return self._spread([r.message_overhead_s for r in self.per_worker], nodes)


# ---------------------------------------------------------------------- compute cache


@dataclass(frozen=True)
class ComputeMeasurement:
    """One ``--compute measure`` result as akosim caches it (one file per key)."""

    workload: str = field(metadata=meta("", "the workload measured", "akosim"))
    batch_size: int = field(metadata=meta("samples", "samples per gradient step", "akosim"))
    optimizer: str = field(metadata=meta("", "the optimizer configured", "akosim"))
    cpu: str = field(metadata=meta("", "CPU fingerprint (model, cores, machine)", "akosim"))
    jax_version: str = field(metadata=meta("", "JAX version that ran the step", "akosim"))
    compute_s: float = field(metadata=meta("s", "median seconds of one gradient step",
                                           "akosim"))
    param_count: int = field(metadata=meta(
        "float32", "gradient elements of the workload", "akosim"))
    steps: int = field(metadata=meta("steps", "timed steps behind the median", "akosim"))
    measured_at: str = field(metadata=meta("", "when, ISO 8601 UTC", "akosim"))

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, "kind": "compute", **record_to_json(self)}

    @classmethod
    def from_json(cls, data: Any) -> ComputeMeasurement:
        if not isinstance(data, dict):
            raise RecordError(f"compute: expected an object, got {data!r}")
        _check_header(data, "compute", "")
        record = record_from_json(cls, {k: v for k, v in data.items()
                                        if k not in ("schema_version", "kind")})
        if not (math.isfinite(record.compute_s) and record.compute_s > 0):
            raise RecordError(f"compute_s: expected seconds > 0, got {record.compute_s!r}")
        if record.param_count < 1:
            raise RecordError(f"param_count: expected >= 1, got {record.param_count!r}")
        return record


# ---------------------------------------------------------------------- derived figures


def rank_overhead_s(rank: RankResult | RunResult) -> float | None:
    """Seconds per round outside the gradient and the gate: ``overhead_s_per_round``
    when recorded, else round_time_s - compute - wait (the same steady-state means, for
    results written before akorun measured it); None without either."""
    if rank.overhead_s_per_round is not None:
        return rank.overhead_s_per_round
    parts = (rank.round_time_s, rank.compute_s_per_round, rank.wait_s_per_round)
    if any(v is None or not math.isfinite(v) for v in parts):
        return None
    total, compute, wait = parts
    return total - compute - wait  # type: ignore[operator]


def run_compute_jitter(run: RunResult) -> float:
    """Relative standard deviation of the per-round gradient time over the steady rounds,
    mean over the ranks that have one (0.0 when none)."""
    cvs = [relative_std(list(r.round_compute_s[warmup_rounds(len(r.round_compute_s)):]))
           for r in run.per_worker]
    known = [cv for cv in cvs if cv is not None]
    return sum(known) / len(known) if known else 0.0


@dataclass(frozen=True)
class Figures:
    """The steady-state summary figures of one rank (`rank_figures`) or one run
    (`merged_figures`): the fields of RankResult and RunResult with the same names."""

    round_time_s: float | None
    samples_per_s: float | None
    bytes_sent_per_worker_per_round: float | None
    compute_s_per_round: float | None
    wait_s_per_round: float | None
    overhead_s_per_round: float | None

    def as_fields(self) -> dict[str, Any]:
        """Keyword arguments of RankResult / RunResult."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def rank_figures(*, round_end_s: Sequence[float], compute_s: Sequence[float],
                 wait_s: Sequence[float], overhead_s: Sequence[float] | None,
                 training_workers: int, batch_size: int,
                 bytes_sent_rounds: float, round_stride: int = 1,
                 rounds: int | None = None) -> Figures:
    """The steady-state summary figures of one rank from its per-round series (a sampled
    series holds every `round_stride`-th of `rounds` rounds; the means are the samples')."""
    if rounds is None:
        rounds = len(round_end_s) * round_stride
    round_time_s = steady_round_time_s(round_end_s) / round_stride

    def finite(value: float) -> float | None:
        return value if math.isfinite(value) else None

    return Figures(
        round_time_s=finite(round_time_s),
        samples_per_s=finite(training_workers * batch_size / round_time_s)
        if round_time_s > 0 else None,
        bytes_sent_per_worker_per_round=bytes_sent_rounds / rounds if rounds else None,
        compute_s_per_round=finite(steady_mean(compute_s)),
        wait_s_per_round=finite(steady_mean(wait_s)),
        overhead_s_per_round=finite(steady_mean(overhead_s))
        if overhead_s is not None else None)


def merged_figures(training: Sequence[RankResult], batch_size: int) -> Figures:
    """A run's summary figures: the means over its training ranks."""
    round_time = mean_of_known([r.round_time_s for r in training])
    return Figures(
        round_time_s=round_time,
        samples_per_s=len(training) * batch_size / round_time if round_time else None,
        bytes_sent_per_worker_per_round=mean_of_known(
            [r.bytes_sent_per_worker_per_round for r in training]),
        compute_s_per_round=mean_of_known([r.compute_s_per_round for r in training]),
        wait_s_per_round=mean_of_known([r.wait_s_per_round for r in training]),
        overhead_s_per_round=mean_of_known([r.overhead_s_per_round for r in training]))


# ---------------------------------------------------------------------- reading files


def read_result(data: Any) -> PlanResult | RunResult | RankResult | Calibration:
    """Any result JSON object as its record; files without ``schema_version`` (written
    before the schema) are converted from their old layout. (`akocore.read_result` also
    takes the path of a file.)"""
    if not isinstance(data, dict):
        raise RecordError(f"result: expected a JSON object, got {type(data).__name__}")
    if "schema_version" not in data:
        data = _upgrade(data)
    readers = {"plan": PlanResult.from_json, "run": RunResult.from_json,
               "rank": RankResult.from_json, "calibration": Calibration.from_json}
    kind = data.get("kind")
    if kind not in readers:
        raise RecordError(f"kind: expected one of {', '.join(readers)}, got {kind!r}")
    _check_header(data, str(kind), "")
    return readers[kind](data)  # type: ignore[no-any-return,operator]


def _upgrade(old: dict[str, Any]) -> dict[str, Any]:
    """A pre-schema file in the current layout (then checked by from_json)."""
    if "runs" in old:
        return _upgrade_plan(old)
    if "source" in old:
        return {"schema_version": SCHEMA_VERSION, "kind": "calibration",
                "source": old["source"], "p_of": old.get("p") or [],
                "compute_jitter": old.get("compute_jitter", 0.0),
                "per_worker": [_pick(w, RankCalibration, rank=i)
                               for i, w in enumerate(_list(old, "workers"))]}
    if isinstance(old.get("workers"), list):
        return _upgrade_akorun_run(old)
    return _upgrade_rank(old, 0)


def _list(data: Mapping[str, Any], key: str) -> list[Any]:
    value = data.get(key, [])
    if not isinstance(value, list):
        raise RecordError(f"{key}: expected a list, got {value!r}")
    return value


def _pick(data: Any, cls: type, **defaults: Any) -> dict[str, Any]:
    """The keys of `data` that are fields of `cls` (None dropped where a field takes no
    None, so its default applies), over `defaults`."""
    if not isinstance(data, dict):
        return data  # from_json names the bad entry
    names = {f.name for f in fields(cls)}
    nullable = {f.name for f in fields(cls) if "None" in str(f.type)}
    return {**defaults, **{k: v for k, v in data.items()
                           if k in names and (v is not None or k in nullable)}}


def _p_fields(p: Any) -> dict[str, Any]:
    """Old akorun's ``p`` (a list per worker, or null) as p and p_of."""
    if isinstance(p, list) and p:
        return {"p": max(p) if all(isinstance(x, int) for x in p) else p, "p_of": p}
    return {}


def _upgrade_rank(old: Any, index: int) -> Any:
    if not isinstance(old, dict):
        return old
    rank = _pick(old, RankResult, rank=index)
    rank.pop("p", None)
    rank.update(_p_fields(old.get("p")))
    if isinstance(old.get("workers"), list):
        rank.pop("workers", None)
    details = {k: v for k, v in old.items() if k not in _RANK_KEYS and k != "p"}
    evaluations = old.get("evaluations")
    if isinstance(evaluations, list):  # old akosim: {sim_time_s, round, accuracy}
        rank["evaluations"] = [_evaluation(e) for e in evaluations]
    return {"schema_version": SCHEMA_VERSION, "kind": "rank", **details, **rank}


def _evaluation(entry: Any) -> Any:
    if isinstance(entry, dict):
        return [entry.get("sim_time_s", entry.get("time_s")), entry.get("round"),
                entry.get("accuracy")]
    return entry


def _upgrade_akorun_run(old: dict[str, Any]) -> dict[str, Any]:
    ranks = [_upgrade_rank(w, i) for i, w in enumerate(_list(old, "workers"))]
    run = _pick(old, RunResult, tool="akorun", scheme=old.get("scheme") or "")
    run.pop("workers", None)
    run.pop("p", None)
    run.update(_p_fields(old.get("p")))
    counts = [r.get("workers") for r in ranks if isinstance(r, dict)]
    if counts and isinstance(counts[0], int):
        run["workers"] = counts[0]
    run["training_workers"] = sum(1 for r in ranks
                                  if isinstance(r, dict) and r.get("role") == "worker")
    first = next((r for r in ranks if isinstance(r, dict) and r.get("role") == "worker"), None)
    run["final_accuracy"] = first.get("final_accuracy") if first else None
    return {"schema_version": SCHEMA_VERSION, "kind": "run", **run, "per_worker": ranks}


def _upgrade_plan(old: dict[str, Any]) -> dict[str, Any]:
    runs = []
    for i, entry in enumerate(_list(old, "runs")):
        if not isinstance(entry, dict):
            raise RecordError(f"runs[{i}]: expected an object, got {entry!r}")
        run = _pick(entry, RunResult, tool="akosim", mode=old.get("mode", "train"),
                    config=old.get("config", {}))
        run["evaluations"] = [_evaluation(e) for e in entry.get("evaluations") or []]
        run["per_worker"] = [_upgrade_rank(w, j) for j, w in
                             enumerate(entry.get("per_worker") or [])]
        runs.append({"schema_version": SCHEMA_VERSION, "kind": "run", **run})
    plan = _pick(old, PlanResult)
    return {"schema_version": SCHEMA_VERSION, "kind": "plan", **plan, "runs": runs}


# ---------------------------------------------------------------------- the schema table


def schema_markdown() -> str:
    """docs/reference/result-schema.md: one table per record, one row per key."""
    out = ["# Result schema (generated from akocore/results.py; "
           "tests/test_result_schema.py checks it)", "",
           f"Every record's JSON carries `schema_version` ({SCHEMA_VERSION}; version 1 files, "
           "which lack the plan's ranking, are read too) and `kind` "
           "(`plan`, `run`, `rank`, `calibration`, `compute`). Files without `schema_version` were "
           "written before the schema and are converted when read. Non-finite numbers are "
           'written as "inf" / "-inf"; a figure that could not be measured is null.', ""]
    for cls, title in ((PlanResult, "`akosim --out FILE.json` (kind `plan`)"),
                       (RankedRun, "one candidate of a plan's `ranking` (akosim plan's "
                                   "default ranking, --target-accuracy or --time-budget)"),
                       (RunResult, "one run (kind `run`): akorun's `OUT/result.json`, "
                                   "each of akosim's `runs`"),
                       (RankResult, "one rank (kind `rank`): akorun's `OUT/worker-R.json`, "
                                    "each entry of `per_worker`"),
                       (LinkResult, "one link: each entry of akosim's `per_link`"),
                       (Calibration, "a calibration (kind `calibration`): what "
                                     "`akosim --compute-from` reads"),
                       (RankCalibration, "one rank of a calibration's `per_worker`"),
                       (ComputeMeasurement, "a cached `--compute measure` (kind `compute`), "
                                            "in the user's cache directory"),
                       (MessageCost, "`akorun measure-messages --out FILE.json` (kind "
                                     "`message_cost`, versioned by its own `schema_version`; "
                                     "akocore/message_cost.py)"),
                       (MessageSample, "one timed message of a message cost's `samples`")):
        out += [f"## {cls.__name__}: {title}", "",
                "| key | type | unit | meaning | written by |", "|---|---|---|---|---|"]
        out += [f"| `{k}` | {t} | {u or '-'} | {m} | {b} |"
                for k, t, u, m, b in schema_rows(cls)]
        out.append("")
    return "\n".join(out)
