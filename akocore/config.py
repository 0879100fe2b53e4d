"""Run configuration: frozen dataclasses, TOML files, --set overrides and shared CLI flags.

This module owns what a run *is*: how many workers, what network, which
exchange scheme and how to train, and how a user says so. Inside, every value
is SI with its unit in the field name (``bandwidth_bps``, ``latency_s``,
``duration_s``); at the edges (TOML, ``--set``, flags, the echoed result) the
human names and units are used (``bandwidth = "40mbps"``, ``latency = "5ms"``,
``duration = "300s"``).

A TOML file has four tables, every key optional::

    [cluster]
    workers = 4
    hosts = []                       # "host:port" per rank; empty = loopback
    [network]
    bandwidth = "1gbps"              # each node's NIC; a list goes round robin
    link_bandwidth = "40,20,10mbps"  # per-pair cap; pairs (0,1),(0,2),...
    latency = "5ms"                  # per message; pairs as above
    # link_bandwidth_matrix = [["-", "40mbps"], ["40mbps", "-"]]  # n x n
    # latency_matrix = [[0, "5ms"], ["5ms", 0]]                   # n x n
    [exchange]
    scheme = "ako"                   # ako | ps | allreduce
    p = "auto"                       # auto | auto-per-worker | 4 | [4, 2, 1, 1]
    ssp = 0                          # rounds; "inf" = fully asynchronous
    [train]
    workload = "digits-mlp"
    rounds = 100
    duration = "300s"

Precedence, lowest first: built-in defaults < ``--config`` file < ``--set``
items < explicit flags. A layer that sets ``duration`` or
``target_accuracy`` but no layer that sets ``rounds`` means "stop by those":
the built-in ``rounds`` is cleared.

Every dataclass normalises and validates itself in ``__post_init__`` (lists
become tuples, numeric text becomes numbers, human units are read), so a
config can never exist in an invalid state, and all errors are `ConfigError`
naming the key (``exchange.p``), what was given and what is allowed.
Nothing here opens a socket or reads a clock; reading a TOML file is the only I/O.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import difflib
import hashlib
import json
import math
import re
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from akocore.units import (
    UnitError,
    bandwidth_exact_text,
    duration_exact_text,
    parse_bandwidth,
    parse_bandwidth_list,
    parse_duration,
    parse_duration_list,
)

__all__ = [
    "ClusterConfig",
    "ConfigError",
    "ExchangeConfig",
    "NetworkConfig",
    "RunConfig",
    "TrainConfig",
    "add_shared_arguments",
    "apply_overrides",
    "config_from_args",
    "config_from_dict",
    "config_hash",
    "config_to_dict",
    "load_config",
    "parse_toml_text",
    "replace_in",
]

SCHEMES = ("ako", "ps", "allreduce")
P_AUTO_MODES = ("auto", "auto-per-worker")
SCHEDULES = ("staggered", "aligned")
REDUCTIONS = ("mean", "sum")
PS_MODES = ("sync", "async")
OPTIMIZERS = ("sgd", "momentum", "adam")


class ConfigError(ValueError):
    """A configuration value is wrong; `key` is the "section.key" it concerns, if any."""

    def __init__(self, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


# ---------------------------------------------------------------------------
# Normalisers: human or typed value in, typed value out, ConfigError on error.


def _show(value: object) -> str:
    """A given value as it appears in an error message: 'ring', 1, [4, 2, 1]."""
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_show(item) for item in value) + "]"
    return repr(value)


def _bad(key: str, value: object, expected: str) -> ConfigError:
    return ConfigError(f"{key}: got {_show(value)}, expected {expected}", key)


def _is_unset(value: object) -> bool:
    """True for the spellings of "not set": None (JSON null), "none" and ""."""
    return value is None or (isinstance(value, str) and value.strip().lower() in ("", "none"))


def _as_int(key: str, value: object, minimum: int, expected: str | None = None) -> int:
    expected = expected or f"an integer >= {minimum}"
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d+\s*", value):
        number = int(value)
    if number is None or number < minimum:
        raise _bad(key, value, expected)
    return number


def _as_float(key: str, value: object, ok: Callable[[float], bool], expected: str) -> float:
    number: float | None = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            number = None
    if number is None or not math.isfinite(number) or not ok(number):
        raise _bad(key, value, expected)
    return number


def _as_choice(key: str, value: object, choices: Sequence[str]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise _bad(key, value, "one of " + ", ".join(choices))
    return value


def _as_items(value: object) -> list[Any]:
    """A list-valued setting: a comma-separated string, a sequence, or one value."""
    if isinstance(value, str):
        return [item.strip() for item in value.split(",")] if value.strip() else []
    if isinstance(value, list | tuple):
        return list(value)
    return [value]


def _unit_error(key: str, error: UnitError) -> ConfigError:
    return ConfigError(f"{key}: {error}", key)


def _bandwidths(key: str, value: object, allow_empty: bool) -> tuple[float, ...]:
    if allow_empty and (_is_unset(value) or value == [] or value == ()):
        return ()
    try:
        return parse_bandwidth_list(value)  # type: ignore[arg-type]
    except UnitError as error:
        raise _unit_error(key, error) from None


def _durations(key: str, value: object) -> tuple[float, ...]:
    try:
        return parse_duration_list(value)  # type: ignore[arg-type]
    except UnitError as error:
        raise _unit_error(key, error) from None


def _matrix(
    key: str,
    value: object,
    read: Callable[[object], float],
    diagonal: float,
    expected_entry: str,
) -> tuple[tuple[float, ...], ...] | None:
    """An n x n matrix of human values; the diagonal is ignored and set to `diagonal`."""
    if _is_unset(value):
        return None
    if isinstance(value, np.ndarray):
        value = value.tolist()
    shape_hint = "a square list of rows, one row and one column per node (diagonal ignored)"
    if not isinstance(value, list | tuple) or not value:
        raise _bad(key, value, shape_hint)
    n = len(value)
    rows: list[tuple[float, ...]] = []
    for i, row in enumerate(value):
        if not isinstance(row, list | tuple) or len(row) != n:
            length = len(row) if isinstance(row, list | tuple) else "not a list"
            raise ConfigError(
                f"{key}: row {i} has {length} entries but the matrix has {n} rows; "
                f"expected {shape_hint}",
                key,
            )
        entries = []
        for j, entry in enumerate(row):
            if i == j:
                entries.append(diagonal)
                continue
            try:
                entries.append(read(entry))
            except (UnitError, ConfigError) as error:
                raise ConfigError(
                    f"{key}[{i}][{j}]: got {_show(entry)}, expected {expected_entry} ({error})",
                    key,
                ) from None
        rows.append(tuple(entries))
    return tuple(rows)


def _read_link_cap(entry: object) -> float:
    if (isinstance(entry, float) and entry == math.inf) or (
        isinstance(entry, str) and entry.strip().lower() == "inf"
    ):
        return math.inf
    return parse_bandwidth(entry)  # type: ignore[arg-type]


def _read_latency(entry: object) -> float:
    return parse_duration(entry)  # type: ignore[arg-type]


def _matrix_to_text(
    matrix: tuple[tuple[float, ...], ...] | None, text: Callable[[float], str]
) -> list[list[str]] | None:
    if matrix is None:
        return None
    return [["inf" if math.isinf(v) else text(v) for v in row] for row in matrix]


def _check_nodes(n: int) -> int:
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 1:
        raise ValueError(f"number of nodes must be an integer >= 1, got {n!r}")
    return int(n)


_HOST_RE = re.compile(r"^(?P<host>\[[0-9A-Fa-f:.]+\]|[^\s:\[\]]+):(?P<port>\d{1,5})$")


def _set(obj: object, name: str, value: object) -> None:
    """Store a normalised value on a frozen dataclass during __post_init__."""
    object.__setattr__(obj, name, value)


# ---------------------------------------------------------------------------
# The configuration


@dataclass(frozen=True)
class ClusterConfig:
    """How many workers and, for akorun, where each rank listens."""

    workers: int = 4
    hosts: tuple[str, ...] = ()  # "host:port" per rank; empty = loopback

    def __post_init__(self) -> None:
        workers = _as_int("cluster.workers", self.workers, 2)
        hosts = tuple(_as_items(self.hosts))
        for host in hosts:
            if not isinstance(host, str) or _HOST_RE.match(host.strip()) is None:
                raise _bad(
                    "cluster.hosts", host, 'entries of the form "host:port", e.g. "10.0.0.2:7000"'
                )
            port = int(host.rsplit(":", 1)[1])
            if not 1 <= port <= 65535:
                raise _bad("cluster.hosts", host, "a port between 1 and 65535")
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
        _set(self, "workers", workers)
        _set(self, "hosts", hosts)


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

    def __post_init__(self) -> None:
        _set(self, "bandwidth_bps", _bandwidths("network.bandwidth", self.bandwidth_bps, False))
        _set(
            self,
            "link_bandwidth_bps",
            _bandwidths("network.link_bandwidth", self.link_bandwidth_bps, True),
        )
        _set(self, "latency_s", _durations("network.latency", self.latency_s))
        _set(
            self,
            "link_bandwidth_matrix_bps",
            _matrix(
                "network.link_bandwidth_matrix",
                self.link_bandwidth_matrix_bps,
                _read_link_cap,
                math.inf,
                'a bandwidth such as "40mbps" or "inf" for no cap',
            ),
        )
        _set(
            self,
            "latency_matrix_s",
            _matrix(
                "network.latency_matrix",
                self.latency_matrix_s,
                _read_latency,
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

    def uplink_bps(self, n: int) -> np.ndarray:
        """Each of n nodes' uplink capacity in bits/s, shape (n,)."""
        n = _check_nodes(n)
        values = self.bandwidth_bps
        return np.array([values[i % len(values)] for i in range(n)], dtype=np.float64)

    def downlink_bps(self, n: int) -> np.ndarray:
        """Each of n nodes' downlink capacity in bits/s, shape (n,) (NICs are symmetric)."""
        return self.uplink_bps(n)

    def link_bps_matrix(self, n: int) -> np.ndarray:
        """Per ordered pair cap in bits/s, shape (n, n); inf = no cap, and on the diagonal."""
        n = _check_nodes(n)
        if self.link_bandwidth_matrix_bps is not None:
            self._check_matrix("network.link_bandwidth_matrix", self.link_bandwidth_matrix_bps, n)
            matrix = np.array(self.link_bandwidth_matrix_bps, dtype=np.float64)
        else:
            matrix = _pair_matrix(self.link_bandwidth_bps, n, fill=math.inf)
        np.fill_diagonal(matrix, math.inf)
        return matrix

    def latency_matrix(self, n: int) -> np.ndarray:
        """Per ordered pair latency in seconds, shape (n, n); zeros on the diagonal."""
        n = _check_nodes(n)
        if self.latency_matrix_s is not None:
            self._check_matrix("network.latency_matrix", self.latency_matrix_s, n)
            matrix = np.array(self.latency_matrix_s, dtype=np.float64)
        else:
            matrix = _pair_matrix(self.latency_s, n, fill=0.0)
        np.fill_diagonal(matrix, 0.0)
        return matrix


def _pair_matrix(values: tuple[float, ...], n: int, fill: float) -> np.ndarray:
    """Symmetric (n, n) matrix with pair k of (0,1),(0,2),...,(1,2),... = values[k % len]."""
    matrix = np.full((n, n), fill, dtype=np.float64)
    if values:
        rows, cols = np.triu_indices(n, 1)  # the pairs in the order of the docstring
        pair_values = np.asarray(values, dtype=np.float64)[np.arange(rows.size) % len(values)]
        matrix[rows, cols] = pair_values
        matrix[cols, rows] = pair_values
    return matrix


def _as_p(key: str, value: object) -> str | tuple[int, ...]:
    expected = (
        'auto, auto-per-worker, or whole numbers >= 1: one for all workers or one per '
        'worker (e.g. 4 or [4, 2, 1, 1] or "4,2,1,1")'
    )
    if isinstance(value, str) and value.strip() in P_AUTO_MODES:
        return value.strip()
    items = _as_items(value)
    if not items:
        raise _bad(key, value, expected)
    result = []
    for item in items:
        try:
            result.append(_as_int(key, item, 1))
        except ConfigError:
            raise _bad(key, value, expected) from None
    return tuple(result)


def _as_ssp(key: str, value: object) -> float:
    expected = "a whole number of rounds >= 0, or inf (fully asynchronous)"
    if isinstance(value, str) and value.strip().lower() == "inf":
        return math.inf
    if isinstance(value, float) and value == math.inf:
        return math.inf
    number = _as_float(key, value, lambda x: x >= 0 and x == int(x), expected)
    return float(number)


@dataclass(frozen=True)
class ExchangeConfig:
    """Which exchange scheme runs and its knobs (Ako's p and SSP bound, PS shards)."""

    scheme: str = "ako"
    p: str | tuple[int, ...] = "auto"
    ssp: float = 0.0
    schedule: str = "staggered"
    reduce: str = "mean"
    utilisation: float = 0.9
    p_max: int = 1024
    ps_servers: int | str = 1
    ps_mode: str = "sync"
    push_every: int = 1
    fetch_every: int = 1

    def __post_init__(self) -> None:
        _set(self, "scheme", _as_choice("exchange.scheme", self.scheme, SCHEMES))
        _set(self, "p", _as_p("exchange.p", self.p))
        _set(self, "ssp", _as_ssp("exchange.ssp", self.ssp))
        _set(self, "schedule", _as_choice("exchange.schedule", self.schedule, SCHEDULES))
        _set(self, "reduce", _as_choice("exchange.reduce", self.reduce, REDUCTIONS))
        _set(
            self,
            "utilisation",
            _as_float(
                "exchange.utilisation",
                self.utilisation,
                lambda u: 0 < u <= 1,
                "a fraction 0 < u <= 1, e.g. 0.9",
            ),
        )
        _set(self, "p_max", _as_int("exchange.p_max", self.p_max, 1))
        if isinstance(self.ps_servers, str) and self.ps_servers.strip() == "best":
            _set(self, "ps_servers", "best")
        else:
            _set(
                self,
                "ps_servers",
                _as_int(
                    "exchange.ps_servers",
                    self.ps_servers,
                    1,
                    'an integer >= 1 (and < cluster.workers) or "best"',
                ),
            )
        _set(self, "ps_mode", _as_choice("exchange.ps_mode", self.ps_mode, PS_MODES))
        _set(self, "push_every", _as_int("exchange.push_every", self.push_every, 1))
        _set(self, "fetch_every", _as_int("exchange.fetch_every", self.fetch_every, 1))


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
            raise _bad("train.workload", self.workload, 'a workload name such as "digits-mlp"')
        _set(self, "workload", self.workload.strip())
        _set(self, "optimizer", _as_choice("train.optimizer", self.optimizer, OPTIMIZERS))
        _set(
            self,
            "lr",
            _as_float("train.lr", self.lr, lambda x: x > 0, "a learning rate > 0, e.g. 0.05"),
        )
        _set(self, "batch_size", _as_int("train.batch_size", self.batch_size, 1))
        _set(self, "seed", _as_int("train.seed", self.seed, 0))
        _set(
            self,
            "rounds",
            None
            if _is_unset(self.rounds)
            else _as_int("train.rounds", self.rounds, 1, 'an integer >= 1 or "none"'),
        )
        duration_s: float | None = None
        if not _is_unset(self.duration_s):
            try:
                duration_s = parse_duration(self.duration_s)  # type: ignore[arg-type]
            except UnitError as error:
                raise _unit_error("train.duration", error) from None
            if duration_s <= 0:
                raise _bad("train.duration", self.duration_s, 'a duration > 0 such as "300s"')
        _set(self, "duration_s", duration_s)
        _set(
            self,
            "target_accuracy",
            None
            if _is_unset(self.target_accuracy)
            else _as_float(
                "train.target_accuracy",
                self.target_accuracy,
                lambda x: 0 < x <= 1,
                "a fraction 0 < x <= 1, e.g. 0.9",
            ),
        )
        _set(self, "eval_every", _as_int("train.eval_every", self.eval_every, 1))
        if _is_unset(self.data_path):
            _set(self, "data_path", None)
        elif not isinstance(self.data_path, str):
            raise _bad("train.data_path", self.data_path, "a file path")
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
                f"exchange.p: got {len(p)} values {_show(p)}, expected 1 value for all "
                f"workers or one per worker (cluster.workers = {n})",
                "exchange.p",
            )
        servers = self.exchange.ps_servers
        if isinstance(servers, int) and servers >= n:
            raise ConfigError(
                f"exchange.ps_servers: got {servers}, expected fewer servers than "
                f"cluster.workers ({n}) so that at least one node trains, or \"best\"",
                "exchange.ps_servers",
            )
        for key, matrix in (
            ("network.link_bandwidth_matrix", self.network.link_bandwidth_matrix_bps),
            ("network.latency_matrix", self.network.latency_matrix_s),
        ):
            if matrix is not None:
                self.network._check_matrix(key, matrix, n)


# ---------------------------------------------------------------------------
# Human (TOML) names <-> dataclass fields


@dataclass(frozen=True)
class _Key:
    field: str  # dataclass field name
    dump: Callable[[Any], Any]  # typed value -> JSON/TOML-style human value


def _plain(value: Any) -> Any:
    return value


def _dump_p(value: str | tuple[int, ...]) -> Any:
    return value if isinstance(value, str) else list(value)


def _dump_ssp(value: float) -> Any:
    return "inf" if math.isinf(value) else int(value)


_SECTIONS: dict[str, dict[str, _Key]] = {
    "cluster": {
        "workers": _Key("workers", _plain),
        "hosts": _Key("hosts", list),
    },
    "network": {
        "bandwidth": _Key("bandwidth_bps", lambda v: [bandwidth_exact_text(x) for x in v]),
        "link_bandwidth": _Key(
            "link_bandwidth_bps", lambda v: [bandwidth_exact_text(x) for x in v]
        ),
        "latency": _Key("latency_s", lambda v: [duration_exact_text(x) for x in v]),
        "link_bandwidth_matrix": _Key(
            "link_bandwidth_matrix_bps", lambda m: _matrix_to_text(m, bandwidth_exact_text)
        ),
        "latency_matrix": _Key(
            "latency_matrix_s", lambda m: _matrix_to_text(m, duration_exact_text)
        ),
    },
    "exchange": {
        "scheme": _Key("scheme", _plain),
        "p": _Key("p", _dump_p),
        "ssp": _Key("ssp", _dump_ssp),
        "schedule": _Key("schedule", _plain),
        "reduce": _Key("reduce", _plain),
        "utilisation": _Key("utilisation", _plain),
        "p_max": _Key("p_max", _plain),
        "ps_servers": _Key("ps_servers", _plain),
        "ps_mode": _Key("ps_mode", _plain),
        "push_every": _Key("push_every", _plain),
        "fetch_every": _Key("fetch_every", _plain),
    },
    "train": {
        "workload": _Key("workload", _plain),
        "optimizer": _Key("optimizer", _plain),
        "lr": _Key("lr", _plain),
        "batch_size": _Key("batch_size", _plain),
        "seed": _Key("seed", _plain),
        "rounds": _Key("rounds", _plain),
        "duration": _Key("duration_s", lambda v: None if v is None else duration_exact_text(v)),
        "target_accuracy": _Key("target_accuracy", _plain),
        "eval_every": _Key("eval_every", _plain),
        "data_path": _Key("data_path", _plain),
    },
}


def _suggest(name: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _check_structure(d: object) -> None:
    """Unknown sections or keys, and sections that are not tables, are errors."""
    if not isinstance(d, Mapping):
        raise ConfigError(
            f"config: got {type(d).__name__}, expected a table with sections "
            + ", ".join(_SECTIONS)
        )
    for section, body in d.items():
        if section not in _SECTIONS:
            raise ConfigError(
                f"unknown section [{section}]{_suggest(str(section), _SECTIONS)}; "
                f"known sections: {', '.join(_SECTIONS)}",
                str(section),
            )
        if not isinstance(body, Mapping):
            raise ConfigError(
                f"{section}: got {_show(body)}, expected a table of settings "
                f"([{section}] with keys {', '.join(_SECTIONS[section])})",
                section,
            )
        for key in body:
            if key not in _SECTIONS[section]:
                raise ConfigError(
                    f"{section}.{key}: unknown key{_suggest(str(key), _SECTIONS[section])}; "
                    f"known keys in [{section}]: {', '.join(_SECTIONS[section])}",
                    f"{section}.{key}",
                )


def _build(d: Mapping[str, Any], base: RunConfig, clear_default_rounds: bool) -> RunConfig:
    """Apply the human values in `d` on top of `base`.

    With `clear_default_rounds`, a train section giving duration or
    target_accuracy but not rounds clears rounds (stop by those alone).
    """
    _check_structure(d)
    sections: dict[str, Any] = {}
    for section, keys in _SECTIONS.items():
        given: Mapping[str, Any] = d.get(section, {})
        changes = {keys[key].field: value for key, value in given.items()}
        if (
            section == "train"
            and clear_default_rounds
            and "rounds" not in given
            and any(not _is_unset(given.get(k)) for k in ("duration", "target_accuracy"))
        ):
            changes["rounds"] = None
        current = getattr(base, section)
        sections[section] = dataclasses.replace(current, **changes) if changes else current
    return RunConfig(**sections)


def config_from_dict(d: Mapping[str, Any], base: RunConfig | None = None) -> RunConfig:
    """Build a RunConfig from the TOML structure {"cluster": {...}, "network": {...}, ...}.

    Values are human (``bandwidth = "40mbps"``, ``latency = "5ms"``,
    ``ssp = "inf"``); missing keys keep the value of `base` (built-in
    defaults if None). A train table with duration or target_accuracy but no
    rounds stops by those alone (rounds = None).
    """
    return _build(d, base if base is not None else RunConfig(), clear_default_rounds=True)


def config_to_dict(cfg: RunConfig) -> dict[str, dict[str, Any]]:
    """The resolved config as a human, JSON-serialisable dict (TOML key names, inf as "inf").

    Every key is present; unset optional values are None (JSON null, read back
    as "not set"). ``config_from_dict(config_to_dict(cfg)) == cfg``.
    """
    result: dict[str, dict[str, Any]] = {}
    for section, keys in _SECTIONS.items():
        values = getattr(cfg, section)
        result[section] = {
            key: spec.dump(getattr(values, spec.field)) for key, spec in keys.items()
        }
    return result


def config_hash(cfg: RunConfig) -> str:
    """Stable hex sha256 of the canonical JSON of config_to_dict, without cluster.hosts.

    Two ranks of one run on different hosts share it; any other change alters it.
    """
    d = config_to_dict(cfg)
    del d["cluster"]["hosts"]
    canonical = json.dumps(d, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def replace_in(cfg: RunConfig, dotted_key: str, value: Any) -> RunConfig:
    """A copy of cfg with one human-named setting changed: replace_in(cfg, "train.lr", 0.1).

    `value` may be human ("40mbps") or SI (40e6); nothing else is touched.
    """
    section, key = _split_dotted(dotted_key, f"replace_in key {dotted_key!r}")
    return _build({section: {key: value}}, cfg, clear_default_rounds=False)


# ---------------------------------------------------------------------------
# TOML files and --set overrides


def _loads(text: str, source: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{source}: not valid TOML: {error}") from None


def read_toml(path: str | Path) -> dict[str, Any]:
    """A TOML file as a dict; ConfigError if missing, unreadable or not TOML."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"{path}: cannot read config file: {error}") from None
    return _loads(text, str(path))


def _read_toml_file(path: str | Path) -> dict[str, Any]:
    d = read_toml(path)
    try:
        _check_structure(d)
    except ConfigError as error:
        raise ConfigError(f"{path}: {error}", error.key) from None
    return d


def load_config(path: str | Path) -> RunConfig:
    """Read a TOML config file over the built-in defaults; errors name the file (and line)."""
    d = _read_toml_file(path)
    try:
        return config_from_dict(d)
    except ConfigError as error:
        raise ConfigError(f"{path}: {error}", error.key) from None


def parse_toml_text(text: str) -> RunConfig:
    """Read TOML config text over the built-in defaults."""
    return config_from_dict(_loads(text, "<config text>"))


_SET_FORM = "expected section.key=value, e.g. train.lr=0.1 or network.bandwidth=40mbps"


def _split_dotted(dotted: str, what: str) -> tuple[str, str]:
    parts = dotted.strip().split(".")
    if len(parts) != 2 or not all(parts):
        raise ConfigError(f"{what}: {_SET_FORM}")
    return parts[0], parts[1]


def _parse_set_value(text: str) -> Any:
    """A --set value: a TOML value if it is one (4, 0.1, "x", [1, 2], inf), else the bare text."""
    text = text.strip()
    if "\n" in text or "\r" in text:
        return text
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text
    if isinstance(value, datetime.date | datetime.time):  # datetime is a date
        return text
    return value


def _parse_set_item(item: str) -> tuple[str, str, Any]:
    dotted, sep, value = item.partition("=")
    if not sep:
        raise ConfigError(f"--set {item!r}: no '='; {_SET_FORM}")
    section, key = _split_dotted(dotted, f"--set {item!r}")
    return section, key, _parse_set_value(value)


def apply_overrides(cfg: RunConfig, sets: Sequence[str]) -> RunConfig:
    """Apply ``section.key=value`` items in order (later wins); values read as in TOML.

    Literal: each item changes only its own key (rounds is not cleared by a
    duration here; see config_from_args for the layered rule).
    """
    layer: dict[str, dict[str, Any]] = {}
    for item in sets:
        section, key, value = _parse_set_item(item)
        layer.setdefault(section, {})[key] = value
    return _build(layer, cfg, clear_default_rounds=False)


# ---------------------------------------------------------------------------
# The shared CLI vocabulary of akosim and akorun

# argparse dest -> (section, key, flag)
_FLAGS: dict[str, tuple[str, str, str]] = {
    "workers": ("cluster", "workers", "--workers"),
    "bandwidth": ("network", "bandwidth", "--bandwidth"),
    "link_bandwidth": ("network", "link_bandwidth", "--link-bandwidth"),
    "latency": ("network", "latency", "--latency"),
    "p": ("exchange", "p", "--p"),
    "ssp": ("exchange", "ssp", "--ssp"),
    "schedule": ("exchange", "schedule", "--schedule"),
    "scheme": ("exchange", "scheme", "--scheme"),
    "workload": ("train", "workload", "--workload"),
    "optimizer": ("train", "optimizer", "--optimizer"),
    "lr": ("train", "lr", "--lr"),
    "batch_size": ("train", "batch_size", "--batch-size"),
    "seed": ("train", "seed", "--seed"),
    "rounds": ("train", "rounds", "--rounds"),
    "duration": ("train", "duration", "--duration"),
    "target_accuracy": ("train", "target_accuracy", "--target-accuracy"),
}


def add_shared_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the run settings both akosim and akorun take, in group "shared run settings".

    Every default is None so that only flags actually given override the
    config; see config_from_args.
    """
    group = parser.add_argument_group(
        "shared run settings",
        "Precedence, lowest first: built-in defaults < --config < --set < these flags.",
    )
    add = group.add_argument
    add("--config", metavar="FILE", default=None,
        help="TOML file with [cluster] [network] [exchange] [train] tables, "
             "e.g. configs/uniform-wan.toml")
    add("--set", metavar="SECTION.KEY=VALUE", action="append", default=None, dest="set",
        help="override one config value, repeatable, e.g. --set train.lr=0.1 "
             "--set network.latency=5ms (values in the config file's units)")
    add("--workers", metavar="N", default=None,
        help="number of worker nodes (>= 2), e.g. 8")
    add("--bandwidth", metavar="RATE[,RATE...]", default=None,
        help="each node's NIC (uplink and downlink), e.g. 40mbps, 1gbps, 800Mbit/s, 10MB/s "
             "(b = bits, B = bytes); a list is assigned to nodes in turn")
    add("--link-bandwidth", metavar="RATE[,RATE...]", default=None,
        help="per-pair link cap in bits/s, e.g. 40,20,10mbps; a list is assigned to pairs "
             "(0,1),(0,2),...,(1,2),... in turn; none = no cap")
    add("--latency", metavar="DURATION[,DURATION...]", default=None,
        help="per-message latency of each link, e.g. 5ms or 100us; a list is assigned "
             "to pairs (0,1),(0,2),... in turn")
    add("--p", metavar="{auto,auto-per-worker,N,N1,N2,...}", default=None,
        help="partitions per gradient (each round sends 1/p of it): auto, auto-per-worker, "
             "one number for all workers or one per worker, e.g. 4 or 4,2,1,1")
    add("--ssp", metavar="{N,inf}", default=None,
        help="staleness bound in rounds (0 = lockstep, inf = fully asynchronous), e.g. 2")
    add("--schedule", choices=SCHEDULES, default=None,
        help="which partition a worker sends in round t: staggered (t+i mod p) or "
             "aligned (t mod p)")
    add("--scheme", choices=SCHEMES, default=None,
        help="gradient exchange: ako (partial all-to-all), ps (parameter servers) or "
             "allreduce (ring)")
    add("--workload", metavar="NAME", default=None,
        help="model and dataset, e.g. digits-mlp")
    add("--optimizer", choices=OPTIMIZERS, default=None,
        help="optimizer applied to each update, e.g. sgd")
    add("--lr", metavar="FLOAT", default=None,
        help="learning rate (> 0, per update step), e.g. 0.05")
    add("--batch-size", metavar="N", default=None,
        help="examples per worker per round, e.g. 32")
    add("--seed", metavar="N", default=None,
        help="random seed (integer >= 0) for initial parameters and data order, e.g. 0")
    add("--rounds", metavar="N", default=None,
        help="stop after N rounds per worker, e.g. 100")
    add("--duration", metavar="DURATION", default=None,
        help="stop after this much run time, e.g. 300s or 5m; if rounds is not given "
             "(flag, --set or file) the run stops by time alone")
    add("--target-accuracy", metavar="FRACTION", default=None,
        help="stop once test accuracy reaches this fraction (0 < x <= 1), e.g. 0.9")


def config_from_args(args: argparse.Namespace, defaults: RunConfig | None = None) -> RunConfig:
    """The final config: `defaults` (built-ins if None) < --config < --set items < flags.

    Flag values are validated exactly like TOML values. If duration or
    target_accuracy is given by any layer and rounds by none, rounds is
    cleared so the run stops by time or accuracy. Errors say which layer
    gave the bad value.
    """
    base = defaults if defaults is not None else RunConfig()
    layered: dict[str, dict[str, Any]] = {}
    origin: dict[str, str] = {}

    def put(section: str, key: str, value: Any, where: str) -> None:
        layered.setdefault(section, {})[key] = value
        origin[f"{section}.{key}"] = where

    config_path = getattr(args, "config", None)
    if config_path is not None:
        for section, body in _read_toml_file(config_path).items():
            for key, value in body.items():
                put(section, key, value, f"in {config_path}")
    for item in getattr(args, "set", None) or []:
        section, key, value = _parse_set_item(item)
        put(section, key, value, f"by --set {item}")
    for dest, (section, key, flag) in _FLAGS.items():
        value = getattr(args, dest, None)
        if value is not None:
            if isinstance(value, str) and key != "workload":
                value = _parse_set_value(value)  # "1" -> 1, "inf" -> inf, "40mbps" stays
            put(section, key, value, f"by {flag}")
    try:
        return _build(layered, base, clear_default_rounds=True)
    except ConfigError as error:
        where = origin.get(error.key or "")
        if where is None:
            raise
        raise ConfigError(f"{error} (given {where})", error.key) from None
