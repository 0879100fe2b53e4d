"""Results as data: the run, rank and plan records akosim and akorun write and analysis reads.

One vocabulary for both backends (the same key means the same thing and has
the same type wherever it appears):

- `RankResult`: one rank of a run (akorun's ``worker-R.json``; an entry of a
  run's ``per_worker``);
- `RunResult`: one run, config echoed, the summary figures and ``per_worker``
  (akorun's merged ``result.json``; one entry of akosim's ``runs``);
- `PlanResult`: akosim's ``--out`` file, the simulated configurations of one
  question in ``runs``.

Counts are integers (``workers`` is the number of nodes, ``p`` the largest p of
any worker, ``p_of`` each worker's p). Every record's JSON carries
``schema_version`` (`SCHEMA_VERSION`, one for every record of akocore.records)
and ``kind``; `check_header` refuses another version. Beside these records:
akocore.records.calibration (`Calibration`, `ComputeMeasurement`),
akocore.records.run_figures (the summary figures of a rank or a run),
akocore.records.legacy_reading (any result object as its record, the files
written before the schema converted) and akocore.records.schema_table
(docs/reference/result-schema.md from the field metadata: unit, meaning,
writer). No I/O here: callers read and write the files.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from akocore.records.jsonrecord import (
    RecordError,
    meta,
    record_from_json,
    record_to_json,
)

SCHEMA_VERSION = 3
# versions this toolkit reads: 1 lacks only the plan's ranking by accuracy (its fields
# default to "no ranking"), 2 only a simulated run's simulated_rounds, settled and
# warmup_rounds (they default to null: not recorded), so older files read as written
READABLE_VERSIONS = (1, 2, 3)

__all__ = [
    "READABLE_VERSIONS", "SCHEMA_VERSION", "SUMMARY_FIELDS", "LinkResult", "PlanResult",
    "RankResult", "RankedRun", "RecordError", "RunResult", "check_header", "run_fields",
]

Evaluation = tuple[float, int, float]  # (seconds since training start, round, accuracy)


def check_header(data: Mapping[str, Any], kind: str, where: str) -> None:
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
        clash = sorted(set(self.details) & RANK_KEYS)
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
        check_header(data, "rank", prefix)
        known = {k: v for k, v in data.items() if k in RANK_KEYS and k != "details"}
        details = {k: v for k, v in data.items()
                   if k not in RANK_KEYS and k not in ("schema_version", "kind")}
        return record_from_json(cls, {**known, "details": details}, where)


RANK_KEYS = frozenset(f.name for f in fields(RankResult))


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
        "", "the configuration echoed, as akocore.settings.toml_io.config_to_dict writes it"))
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
        check_header(data, "run", prefix)
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
        check_header(data, "plan", "")
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
