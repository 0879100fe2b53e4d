"""The schema of a run: frozen dataclasses, one per settings section, in SI units.

This module owns what a run *is* and every built-in default (each written
once, as a field default here; the key registry reads them from these
classes). It runs past ~500 lines because it is the one place every section's
fields and checks are written, side by side; the schemes' own knobs live in
their modules (akocore.schemes.knobs), not here. Inside, every value is SI with
its unit in the field name (``bandwidth_bps``, ``latency_s``, ``duration_s``).

- `RunConfig` (sections cluster, network, exchange, train) is what both
  akosim and akorun run; its hash identifies a run.
- `AkorunConfig` (section akorun) holds akorun's process settings (peer and
  join timeouts, send queue, checkpoints, emulation, TLS, the run's id and
  secret); akosim reads and ignores it, and it is not part of the run hash.
- `AkosimConfig` (section akosim) holds how akosim simulates a run beyond the
  run itself (where compute time comes from, the per-message overhead, the
  fluid model's coalescing); akorun ignores it, and it is not part of the run
  hash either.

Every dataclass normalises and validates itself in ``__post_init__`` (lists
become tuples, numeric text becomes numbers, human units are read), so a
config can never exist in an invalid state; errors are `ConfigError` naming
the key. Nothing here reads a file, a flag or a clock.

Each scheme's own knobs are not here: they live in the scheme's settings class
(akocore.schemes.knobs) and `ExchangeConfig.tables` holds one object per
registered scheme's table.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from akocore.codecs.codec_registry import CODEC_CHOICES, codec_named
from akocore.schemes.knobs import SchemeTables, tables_with
from akocore.schemes.protocol import SettingsT
from akocore.schemes.registry import scheme_named, scheme_names, settings_tables
from akocore.settings.normalise import (
    EMULATE_MODES,
    HOST_RE,
    OPTIMIZERS,
    REDUCTIONS,
    SCHEDULES,
    ConfigError,
    as_choice,
    as_duration,
    as_float,
    as_int,
    as_items,
    as_network_model,
    as_p,
    as_ssp,
    bad_value,
    bandwidths,
    check_nodes,
    durations,
    is_unset,
    matrix_of,
    read_latency,
    read_link_cap,
    set_field,
    show,
    unit_error,
)
from akocore.units import UnitError, parse_duration, parse_size

SECRET_MIN_BYTES = 16
ALLOW_HOSTS = "hosts"  # akorun.allow: every address of cluster.hosts


@dataclass(frozen=True)
class ClusterConfig:
    """How many workers and, for akorun, where each rank listens."""

    workers: int = 4
    hosts: tuple[str, ...] = ()  # "host:port" per rank; empty = loopback
    # each rank is an island of this many data-parallel devices (round robin over ranks)
    devices_per_rank: tuple[int, ...] = (1,)

    def __post_init__(self) -> None:
        workers = as_int("cluster.workers", self.workers, 2)
        devices = tuple(as_int("cluster.devices_per_rank", d, 1,
                               "a whole number of devices >= 1 per rank")
                        for d in as_items(self.devices_per_rank))
        if not devices:
            raise bad_value("cluster.devices_per_rank", self.devices_per_rank,
                            "a whole number of devices >= 1, or one per rank")
        set_field(self, "devices_per_rank", devices)
        hosts = tuple(as_items(self.hosts))
        for host in hosts:
            if not isinstance(host, str) or HOST_RE.match(host.strip()) is None:
                raise bad_value(
                    "cluster.hosts", host, 'entries of the form "host:port", e.g. "10.0.0.2:7000"'
                )
            port = int(host.rsplit(":", 1)[1])
            if not 1 <= port <= 65535:
                raise bad_value("cluster.hosts", host, "a port between 1 and 65535")
        hosts = tuple(host.strip() for host in hosts)
        if hosts and len(hosts) != workers:
            raise ConfigError(
                f"cluster.hosts: got {len(hosts)} hosts, expected one per worker "
                f"(cluster.workers = {workers}) or none for loopback",
                "cluster.hosts",
            )
        duplicates = sorted({h for h in hosts if hosts.count(h) > 1})
        if duplicates:
            raise ConfigError(
                f"cluster.hosts: {', '.join(duplicates)} appears more than once; "
                f"every rank needs its own host:port",
                "cluster.hosts",
            )
        set_field(self, "workers", workers)
        set_field(self, "hosts", hosts)

    def devices_of(self, rank: int) -> int:
        """The devices of rank `rank`'s island (the list goes round robin)."""
        return self.devices_per_rank[rank % len(self.devices_per_rank)]


@dataclass(frozen=True)
class NetworkConfig:
    """Node NICs, per-pair caps and per-message latency, all in SI units.

    Lists are assigned round robin: node i gets ``bandwidth_bps[i % len]``;
    unordered pair number k in the order (0,1), (0,2), ..., (0,n-1), (1,2), ...
    gets ``link_bandwidth_bps[k % len]`` and ``latency_s[k % len]`` in both
    directions. A full matrix (ordered: row = sender, column = receiver)
    overrides the matching list.
    """

    bandwidth_bps: tuple[float, ...] = (1e9,)
    link_bandwidth_bps: tuple[float, ...] = ()
    latency_s: tuple[float, ...] = (0.0,)
    link_bandwidth_matrix_bps: tuple[tuple[float, ...], ...] | None = None
    latency_matrix_s: tuple[tuple[float, ...], ...] | None = None
    # akosim only: how the simulated network shares: maxmin, tcp, or LAYER+LAYER...
    model: str = "maxmin"
    # akosim only: each rank's inside network joining its island's devices (round robin
    # over ranks; only ranks of cluster.devices_per_rank > 1 use it); inf = free
    inside_bandwidth_bps: tuple[float, ...] = (math.inf,)
    inside_latency_s: tuple[float, ...] = (0.0,)

    def __post_init__(self) -> None:
        set_field(self, "model", as_network_model("network.model", self.model))
        set_field(self, "bandwidth_bps", bandwidths("network.bandwidth", self.bandwidth_bps, False))
        set_field(
            self,
            "link_bandwidth_bps",
            bandwidths("network.link_bandwidth", self.link_bandwidth_bps, True),
        )
        set_field(self, "latency_s", durations("network.latency", self.latency_s))
        set_field(self, "inside_bandwidth_bps", tuple(
            read_cap("network.inside_bandwidth", entry)
            for entry in as_items(self.inside_bandwidth_bps)) or (math.inf,))
        set_field(self, "inside_latency_s",
                  durations("network.inside_latency", self.inside_latency_s))
        set_field(
            self,
            "link_bandwidth_matrix_bps",
            matrix_of(
                "network.link_bandwidth_matrix",
                self.link_bandwidth_matrix_bps,
                read_link_cap,
                math.inf,
                'a bandwidth such as "40mbps" or "inf" for no cap',
            ),
        )
        set_field(
            self,
            "latency_matrix_s",
            matrix_of(
                "network.latency_matrix",
                self.latency_matrix_s,
                read_latency,
                0.0,
                'a duration such as "5ms"',
            ),
        )

    def _check_matrix(self, key: str, matrix: tuple[tuple[float, ...], ...], n: int) -> None:
        if len(matrix) != n:
            raise ConfigError(
                f"{key}: got a {len(matrix)}x{len(matrix)} matrix, expected {n}x{n} "
                f"(one row and one column per node; cluster.workers = {n})",
                key,
            )

    def inside_of(self, rank: int) -> tuple[float, float]:
        """Rank `rank`'s inside network: (bandwidth in bits/s, one-way latency in s)."""
        bandwidths_bps, latencies_s = self.inside_bandwidth_bps, self.inside_latency_s
        return (bandwidths_bps[rank % len(bandwidths_bps)],
                latencies_s[rank % len(latencies_s)])

    def uplink_bps(self, n: int) -> np.ndarray:
        """Each of n nodes' uplink capacity in bits/s, shape (n,)."""
        n = check_nodes(n)
        values = self.bandwidth_bps
        return np.array([values[i % len(values)] for i in range(n)], dtype=np.float64)

    def downlink_bps(self, n: int) -> np.ndarray:
        """Each of n nodes' downlink capacity in bits/s, shape (n,) (NICs are symmetric)."""
        return self.uplink_bps(n)

    def link_bps_matrix(self, n: int) -> np.ndarray:
        """Per ordered pair cap in bits/s, shape (n, n); inf = no cap, and on the diagonal."""
        n = check_nodes(n)
        if self.link_bandwidth_matrix_bps is not None:
            self._check_matrix("network.link_bandwidth_matrix", self.link_bandwidth_matrix_bps, n)
            matrix = np.array(self.link_bandwidth_matrix_bps, dtype=np.float64)
        else:
            matrix = _pair_matrix(self.link_bandwidth_bps, n, fill=math.inf)
        np.fill_diagonal(matrix, math.inf)
        return matrix

    def latency_matrix(self, n: int) -> np.ndarray:
        """Per ordered pair latency in seconds, shape (n, n); zeros on the diagonal."""
        n = check_nodes(n)
        if self.latency_matrix_s is not None:
            self._check_matrix("network.latency_matrix", self.latency_matrix_s, n)
            matrix = np.array(self.latency_matrix_s, dtype=np.float64)
        else:
            matrix = _pair_matrix(self.latency_s, n, fill=0.0)
        np.fill_diagonal(matrix, 0.0)
        return matrix


def read_cap(key: str, entry: object) -> float:
    """A bandwidth with its unit, or "inf" for no limit; ConfigError naming `key`."""
    try:
        cap = read_link_cap(entry)
    except (UnitError, TypeError, ValueError):
        raise bad_value(key, entry, 'a bandwidth such as "100gbps", or "inf" for no '
                                    'limit; a list goes round robin over ranks') from None
    if not cap > 0:
        raise bad_value(key, entry, "a bandwidth > 0")
    return cap


def _pair_matrix(values: tuple[float, ...], n: int, fill: float) -> np.ndarray:
    """Symmetric (n, n) matrix with pair k of (0,1),(0,2),...,(1,2),... = values[k % len]."""
    matrix = np.full((n, n), fill, dtype=np.float64)
    if values:
        rows, cols = np.triu_indices(n, 1)  # the pairs in the order of the docstring
        pair_values = np.asarray(values, dtype=np.float64)[np.arange(rows.size) % len(values)]
        matrix[rows, cols] = pair_values
        matrix[cols, rows] = pair_values
    return matrix


@dataclass(frozen=True)
class ExchangeConfig:
    """Which exchange scheme runs, the keys every scheme shares, and each registered
    scheme's own settings (`tables`: one settings object per ``[exchange.<table>]``,
    akocore.schemes.knobs).

    A scheme's knob is also read and given by its name alone, as the flat key
    ``exchange.<name>`` always was: ``ExchangeConfig(scheme="diloco", inner_steps=4)``,
    ``exchange.inner_steps`` and ``dataclasses.replace(exchange, inner_steps=4)`` all
    work; `knobs(DilocoSettings)` gives the typed settings object.
    """

    scheme: str = "ako"
    p: str | tuple[int, ...] = "auto"
    ssp: float = 0.0
    schedule: str = "staggered"
    reduce: str = "mean"
    utilisation: float = 0.9
    p_max: int = 1024
    codec: str = "none"  # what gradient-like sends carry: none, fp16, bf16, int8, topk:F
    tables: SchemeTables | None = None  # every registered scheme's settings (None: defaults)

    def __init__(self, **values: Any) -> None:
        """The fields by name, and any registered scheme's knob by its name."""
        for item in dataclasses.fields(self):
            if item.name in values:
                value = values.pop(item.name)
            elif item.default is not dataclasses.MISSING:
                value = item.default
            else:
                value = item.default_factory()  # type: ignore[misc,operator]
            set_field(self, item.name, value)
        tables, unknown = tables_with(settings_tables(), self.tables, values)
        if unknown:
            raise TypeError(f"ExchangeConfig got unexpected keyword arguments "
                            f"{', '.join(sorted(unknown))} (not a key of any registered "
                            f"scheme)")
        set_field(self, "tables", tables)
        self.__post_init__()

    def __getattr__(self, name: str) -> Any:
        """A registered scheme's knob by its name (``exchange.inner_steps``)."""
        tables = self.__dict__.get("tables")
        if name.startswith("__") or tables is None:
            raise AttributeError(name)
        found, value = tables.knob(name)
        if not found:
            raise AttributeError(f"'ExchangeConfig' object has no attribute {name!r}")
        return value

    def knobs(self, kind: type[SettingsT]) -> SettingsT:
        """The settings object of `kind` (a registered scheme's settings class); its
        defaults for a class registered after this config was made."""
        assert self.tables is not None
        found = self.tables.get(kind.table)
        return found if isinstance(found, kind) else kind()

    def __post_init__(self) -> None:
        try:
            set_field(self, "codec", codec_named(str(self.codec)).name)
        except ValueError as error:
            raise bad_value("exchange.codec", self.codec, CODEC_CHOICES) from error
        set_field(self, "scheme", as_choice("exchange.scheme", self.scheme, scheme_names()))
        try:  # how the scheme's own keys combine (e.g. fragments divides inner_steps)
            scheme_named(self.scheme).check_exchange(self)
        except ValueError as error:
            raise ConfigError(str(error), str(error).split(":")[0]) from None
        set_field(self, "p", as_p("exchange.p", self.p))
        set_field(self, "ssp", as_ssp("exchange.ssp", self.ssp))
        set_field(self, "schedule", as_choice("exchange.schedule", self.schedule, SCHEDULES))
        set_field(self, "reduce", as_choice("exchange.reduce", self.reduce, REDUCTIONS))
        set_field(self, "utilisation", as_float("exchange.utilisation", self.utilisation,
                                                lambda u: 0 < u <= 1,
                                                "a fraction 0 < u <= 1, e.g. 0.9"))
        set_field(self, "p_max", as_int("exchange.p_max", self.p_max, 1))


@dataclass(frozen=True)
class TrainConfig:
    """What is trained, how, and when the run stops (first of rounds, duration, accuracy)."""

    workload: str = "digits-mlp"
    optimizer: str = "sgd"
    lr: float = 0.05
    batch_size: int = 32
    seed: int = 0
    rounds: int | None = 100
    duration_s: float | None = None
    target_accuracy: float | None = None
    eval_every: int = 10
    data_path: str | None = None  # user file for cifar10/mnist

    def __post_init__(self) -> None:
        if not isinstance(self.workload, str) or not self.workload.strip():
            raise bad_value("train.workload", self.workload, 'a workload name such as "digits-mlp"')
        set_field(self, "workload", self.workload.strip())
        set_field(self, "optimizer", as_choice("train.optimizer", self.optimizer, OPTIMIZERS))
        set_field(
            self,
            "lr",
            as_float("train.lr", self.lr, lambda x: x > 0, "a learning rate > 0, e.g. 0.05"),
        )
        set_field(self, "batch_size", as_int("train.batch_size", self.batch_size, 1))
        set_field(self, "seed", as_int("train.seed", self.seed, 0))
        set_field(
            self,
            "rounds",
            None
            if is_unset(self.rounds)
            else as_int("train.rounds", self.rounds, 1, 'an integer >= 1 or "none"'),
        )
        duration_s: float | None = None
        if not is_unset(self.duration_s):
            try:
                duration_s = parse_duration(self.duration_s)  # type: ignore[arg-type]
            except UnitError as error:
                raise unit_error("train.duration", error) from None
            if duration_s <= 0:
                raise bad_value("train.duration", self.duration_s, 'a duration > 0 such as "300s"')
        set_field(self, "duration_s", duration_s)
        set_field(
            self,
            "target_accuracy",
            None
            if is_unset(self.target_accuracy)
            else as_float(
                "train.target_accuracy",
                self.target_accuracy,
                lambda x: 0 < x <= 1,
                "a fraction 0 < x <= 1, e.g. 0.9",
            ),
        )
        set_field(self, "eval_every", as_int("train.eval_every", self.eval_every, 1))
        if is_unset(self.data_path):
            set_field(self, "data_path", None)
        elif not isinstance(self.data_path, str):
            raise bad_value("train.data_path", self.data_path, "a file path")
        if self.rounds is None and self.duration_s is None and self.target_accuracy is None:
            raise ConfigError(
                "train: no stopping condition; set at least one of rounds, duration and "
                'target_accuracy (e.g. rounds = 100 or duration = "300s")',
                "train.rounds",
            )


@dataclass(frozen=True)
class RunConfig:
    """One run: cluster, network, exchange and training, checked against each other."""

    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    exchange: ExchangeConfig = field(default_factory=ExchangeConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def __post_init__(self) -> None:
        n = self.cluster.workers
        p = self.exchange.p
        if isinstance(p, tuple) and len(p) not in (1, n):
            raise ConfigError(
                f"exchange.p: got {len(p)} values {show(p)}, expected 1 value for all "
                f"workers or one per worker (cluster.workers = {n})",
                "exchange.p",
            )
        assert self.exchange.tables is not None
        for settings in self.exchange.tables:  # e.g. fewer ps servers than ranks
            settings.check_workers(n)
        for key, matrix in (
            ("network.link_bandwidth_matrix", self.network.link_bandwidth_matrix_bps),
            ("network.latency_matrix", self.network.latency_matrix_s),
        ):
            if matrix is not None:
                self.network._check_matrix(key, matrix, n)


@dataclass(frozen=True)
class AkorunConfig:
    """The ``[akorun]`` section: akorun's process settings, the same on every rank.

    ``run_id`` and ``secret`` are None until `akorun init` (or launch) makes
    them; akorun refuses to start a rank without them.
    """

    run_id: str | None = None  # uuid4 hex; every message carries it
    secret: str | None = None  # hex; every pair key of the run derives from it
    peer_timeout_s: float = 10.0
    join_timeout_s: float = 120.0
    checkpoint_every: int = 0
    emulate: str = "auto"
    queue_messages: int = 64
    tls_cert: str | None = None
    tls_key: str | None = None
    keys: str | None = None  # this rank's key file (`akorun init --per-rank-keys`); {rank}
    allow: tuple[str, ...] = ()  # peer addresses/networks let in; "hosts" = cluster.hosts'
    relay_budget_bytes: int = 0  # the relay's copies of peers' partials; 0 = 2s+2 rounds
    devices_per_rank: int = 1  # devices each process of a rank steps on (its island)
    processes_per_rank: int = 1  # processes of one rank, joined by jax.distributed
    platform: str = "cpu"  # cpu | gpu | auto (JAX's own choice)

    def __post_init__(self) -> None:
        run_id = None if is_unset(self.run_id) else str(self.run_id)
        if run_id is not None:
            try:
                uuid.UUID(run_id)
            except (ValueError, AttributeError, TypeError):
                raise ConfigError(f"akorun.run_id: got {run_id!r}, expected a uuid such as "
                                  f"{uuid.uuid4().hex!r}", "akorun.run_id") from None
        set_field(self, "run_id", run_id)
        secret = None if is_unset(self.secret) else str(self.secret)
        if secret is not None:
            try:
                raw = bytes.fromhex(secret)
            except (ValueError, TypeError):
                raw = b""
            if len(raw) < SECRET_MIN_BYTES:
                raise ConfigError(f"akorun.secret: expected at least {2 * SECRET_MIN_BYTES} "
                                  f"hex digits (akorun init writes 64)", "akorun.secret")
        set_field(self, "secret", secret)
        set_field(self, "peer_timeout_s", as_duration(
            "akorun.peer_timeout", self.peer_timeout_s, 'a duration > 0 such as "10s"'))
        set_field(self, "join_timeout_s", as_duration(
            "akorun.join_timeout", self.join_timeout_s, 'a duration > 0 such as "120s"'))
        set_field(self, "checkpoint_every", as_int(
            "akorun.checkpoint_every", self.checkpoint_every, 0,
            "a whole number of rounds >= 0"))
        set_field(self, "emulate", as_choice("akorun.emulate", self.emulate, EMULATE_MODES))
        set_field(self, "queue_messages", as_int(
            "akorun.queue_messages", self.queue_messages, 1, "a whole number of messages >= 1"))
        for name in ("tls_cert", "tls_key"):
            value = getattr(self, name)
            set_field(self, name, None if is_unset(value) else str(value))
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("akorun.tls_cert and akorun.tls_key: give both or neither",
                              "akorun.tls_cert")
        set_field(self, "keys", None if is_unset(self.keys) else str(self.keys))
        allow = tuple(str(item).strip() for item in as_items(self.allow) if str(item).strip())
        for item in allow:
            if item == ALLOW_HOSTS:
                continue
            try:
                ipaddress.ip_network(item, strict=False)
            except ValueError:
                raise bad_value("akorun.allow", item, 'IP addresses or networks, e.g. '
                                '"10.0.0.1" or "10.0.0.0/24", or "hosts"') from None
        set_field(self, "allow", allow)
        budget = self.relay_budget_bytes
        try:
            budget_bytes = parse_size(budget) if isinstance(budget, str) else int(budget)
        except (UnitError, TypeError, ValueError):
            budget_bytes = -1
        if budget_bytes < 0 or isinstance(budget, bool):
            raise bad_value("akorun.relay_budget", budget,
                            'a size such as "256MB", or 0 for the default window')
        set_field(self, "relay_budget_bytes", budget_bytes)
        set_field(self, "devices_per_rank", as_int(
            "akorun.devices_per_rank", self.devices_per_rank, 1,
            "a whole number of devices >= 1 (each process of a rank uses that many)"))
        set_field(self, "processes_per_rank", as_int(
            "akorun.processes_per_rank", self.processes_per_rank, 1,
            "a whole number of processes >= 1"))
        set_field(self, "platform", as_choice("akorun.platform", self.platform, PLATFORMS))


PLATFORMS = ("cpu", "gpu", "auto")  # akorun.platform: where a rank's JAX steps run


COMPUTE_MEASURES = ("measure", "remeasure")  # akosim.compute: time the workload's step here


@dataclass(frozen=True)
class AkosimConfig:
    """The ``[akosim]`` section: how akosim simulates a run beyond the run itself."""

    # seconds per round, or "measure" (this machine's step, cached) / "remeasure"
    compute: float | str = "measure"
    message_overhead_s: float | None = None  # per message beyond the wire; None = 0 or the run's
    coalesce: float | None = None  # None = akosim.network.fluid.COALESCE_REL

    def __post_init__(self) -> None:
        compute = self.compute
        if isinstance(compute, str) and compute.strip().lower() in COMPUTE_MEASURES:
            set_field(self, "compute", compute.strip().lower())
        else:
            set_field(self, "compute", as_duration(
                "akosim.compute", compute, 'a duration >= 0 such as "300ms", or measure or '
                "remeasure", allow_zero=True))
        if is_unset(self.message_overhead_s):
            set_field(self, "message_overhead_s", None)
        else:
            set_field(self, "message_overhead_s", as_duration(
                "akosim.message_overhead", self.message_overhead_s,
                'a duration >= 0 such as "2ms"', allow_zero=True))
        if is_unset(self.coalesce):
            set_field(self, "coalesce", None)
        else:
            set_field(self, "coalesce", as_float(
                "akosim.coalesce", self.coalesce, lambda x: 0 <= x < 0.5,
                "a fraction 0 <= x < 0.5, e.g. 0.01"))
