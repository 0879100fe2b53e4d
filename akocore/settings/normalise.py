"""Normalisers of setting values: a human or typed value in, a typed value out.

Each function takes the dotted key it reads ("exchange.p") so that a wrong
value raises a `ConfigError` naming the key, what was given and what is
allowed. The schema dataclasses (akocore.settings.schema) call them in their
``__post_init__``; nothing here knows about files, flags or layers.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from akocore.units import (
    UnitError,
    parse_bandwidth,
    parse_bandwidth_list,
    parse_duration,
    parse_duration_list,
    refuse_bare_number,
)

P_AUTO_MODES = ("auto", "auto-per-worker")
SCHEDULES = ("staggered", "aligned")
FLUSH_MODES = ("average", "full")  # ako's final flush, or a fraction 0 < w <= 1
REDUCTIONS = ("mean", "sum")
OPTIMIZERS = ("sgd", "momentum", "adam", "adagrad", "muon")
# akosim's network models: a stack of layers over the max-min fluid network, named
# by a preset or written out as LAYER+LAYER+... (akosim.network.netmodel builds them)
NETWORK_LAYERS = (
    "tcp-core",  # TCP's goodput and window caps, software cost, sharing loss
    "slow-start",  # fresh connections pay the handshake and slow start (pooled: once a pair)
    "fresh-connections",  # every message opens a fresh connection (with slow-start)
    "one-per-connection",  # a pair's next message waits for the previous one's answer
    "message-cpu",  # the software cost is also CPU time of the ranks
    "fifo",  # a node's messages leave its NIC first come, first sent
)
_NEEDS_TCP = frozenset(NETWORK_LAYERS) - {"tcp-core", "fifo"}
NETWORK_PRESETS: dict[str, tuple[str, ...]] = {
    "maxmin": (),
    "tcp": ("tcp-core", "slow-start", "one-per-connection", "fifo"),
}
NETWORK_MODELS = tuple(NETWORK_PRESETS)


def network_layers(model: str) -> tuple[str, ...]:
    """The layers of network model `model` (a preset, or layers joined by "+", "maxmin"
    allowed as the first: the fluid network itself); ValueError saying what is allowed."""
    if model in NETWORK_PRESETS:
        return NETWORK_PRESETS[model]
    names = [name.strip() for name in model.split("+")]
    if names and names[0] == "maxmin":
        names = names[1:]
    allowed = (f"expected {', '.join(NETWORK_MODELS)}, or layers joined by '+' from "
               f"{', '.join(NETWORK_LAYERS)}")
    unknown = [name for name in names if name not in NETWORK_LAYERS]
    if not names or unknown:
        raise ValueError(f"network model {model!r}: {allowed}")
    if len(set(names)) != len(names):
        raise ValueError(f"network model {model!r}: a layer appears twice")
    if "tcp-core" not in names and _NEEDS_TCP & set(names):
        raise ValueError(f"network model {model!r}: {', '.join(sorted(_NEEDS_TCP & set(names)))}"
                         f" work only over the tcp-core layer")
    return tuple(name for name in NETWORK_LAYERS if name in names)


def as_network_model(key: str, value: object) -> str:
    """A network model name (`network_layers` accepts it), as given."""
    if not isinstance(value, str):
        raise bad_value(key, value, "a network model name, e.g. " + " or ".join(NETWORK_MODELS))
    try:
        network_layers(value)
    except ValueError as error:
        raise ConfigError(f"{key}: {error}", key) from None
    return value
EMULATE_MODES = ("auto", "on", "off")  # akorun: shape sends in-process (auto = loopback only)


class ConfigError(ValueError):
    """A configuration value is wrong; `key` is the "section.key" it concerns, if any."""

    def __init__(self, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


# ---------------------------------------------------------------------------
# Normalisers: human or typed value in, typed value out, ConfigError on error.


def show(value: object) -> str:
    """A given value as it appears in an error message: 'ring', 1, [4, 2, 1]."""
    if isinstance(value, list | tuple):
        return "[" + ", ".join(show(item) for item in value) + "]"
    return repr(value)


def bad_value(key: str, value: object, expected: str) -> ConfigError:
    return ConfigError(f"{key}: got {show(value)}, expected {expected}", key)


def is_unset(value: object) -> bool:
    """True for the spellings of "not set": None (JSON null), "none" and ""."""
    return value is None or (isinstance(value, str) and value.strip().lower() in ("", "none"))


def as_int(key: str, value: object, minimum: int, expected: str | None = None) -> int:
    expected = expected or f"an integer >= {minimum}"
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d+\s*", value):
        number = int(value)
    if number is None or number < minimum:
        raise bad_value(key, value, expected)
    return number


def as_float(key: str, value: object, ok: Callable[[float], bool], expected: str) -> float:
    number: float | None = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            number = None
    if number is None or not math.isfinite(number) or not ok(number):
        raise bad_value(key, value, expected)
    return number


def as_choice(key: str, value: object, choices: Sequence[str]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise bad_value(key, value, "one of " + ", ".join(choices))
    return value


def as_items(value: object) -> list[Any]:
    """A list-valued setting: a comma-separated string, a sequence, or one value."""
    if isinstance(value, str):
        return [item.strip() for item in value.split(",")] if value.strip() else []
    if isinstance(value, list | tuple):
        return list(value)
    return [value]


def unit_error(key: str, error: UnitError) -> ConfigError:
    return ConfigError(f"{key}: {error}", key)


def require_unit(key: str, value: object, unit: str, *, flag: str | None, source: str) -> None:
    """Refuse a bare number given for a key with a unit (a flag, --set or a config file):
    ConfigError "--bandwidth 40: add a unit, e.g. 40mbps". `source` is the layer's
    words ("by --bandwidth", "by --set network.latency=20", "in run.toml")."""
    if source.startswith("by --set "):
        where = "--set " + source.removeprefix("by --set ")
    elif flag and source == f"by {flag}":
        where = f"{flag} {_flag_text(value)}"
    else:
        where = f"{key} = {show(value)}" + (f" ({source})" if source else "")
    try:
        if isinstance(value, list | tuple) and _is_matrix(value):  # diagonal: ignored
            for i, row in enumerate(value):
                for j, entry in enumerate(row):
                    if i != j:
                        refuse_bare_number(f"{where}, entry [{i}][{j}] {show(entry)}", entry,
                                           unit)
        else:
            refuse_bare_number(where, value, unit)
    except UnitError as error:
        raise ConfigError(str(error), key) from None


def _is_matrix(value: object) -> bool:
    return isinstance(value, list | tuple) and all(isinstance(row, list | tuple)
                                                   for row in value)


def _flag_text(value: object) -> str:
    if isinstance(value, list | tuple):
        return ",".join(_flag_text(item) for item in value)
    return str(value)


def bandwidths(key: str, value: object, allow_empty: bool) -> tuple[float, ...]:
    if allow_empty and (is_unset(value) or value == [] or value == ()):
        return ()
    try:
        return parse_bandwidth_list(value)  # type: ignore[arg-type]
    except UnitError as error:
        raise unit_error(key, error) from None


def durations(key: str, value: object) -> tuple[float, ...]:
    try:
        return parse_duration_list(value)  # type: ignore[arg-type]
    except UnitError as error:
        raise unit_error(key, error) from None


def matrix_of(
    key: str,
    value: object,
    read: Callable[[object], float],
    diagonal: float,
    expected_entry: str,
) -> tuple[tuple[float, ...], ...] | None:
    """An n x n matrix of human values; the diagonal is ignored and set to `diagonal`."""
    if is_unset(value):
        return None
    if isinstance(value, np.ndarray):
        value = value.tolist()
    shape_hint = "a square list of rows, one row and one column per node (diagonal ignored)"
    if not isinstance(value, list | tuple) or not value:
        raise bad_value(key, value, shape_hint)
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
                    f"{key}[{i}][{j}]: got {show(entry)}, expected {expected_entry} ({error})",
                    key,
                ) from None
        rows.append(tuple(entries))
    return tuple(rows)


def read_link_cap(entry: object) -> float:
    if (isinstance(entry, float) and entry == math.inf) or (
        isinstance(entry, str) and entry.strip().lower() == "inf"
    ):
        return math.inf
    return parse_bandwidth(entry)  # type: ignore[arg-type]


def read_latency(entry: object) -> float:
    return parse_duration(entry)  # type: ignore[arg-type]


def matrix_to_text(
    matrix: tuple[tuple[float, ...], ...] | None, text: Callable[[float], str]
) -> list[list[str]] | None:
    if matrix is None:
        return None
    return [["inf" if math.isinf(v) else text(v) for v in row] for row in matrix]


def check_nodes(n: int) -> int:
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 1:
        raise ValueError(f"number of nodes must be an integer >= 1, got {n!r}")
    return int(n)


HOST_RE = re.compile(r"^(?P<host>\[[0-9A-Fa-f:.]+\]|[^\s:\[\]]+):(?P<port>\d{1,5})$")


def set_field(obj: object, name: str, value: object) -> None:
    """Store a normalised value on a frozen dataclass during __post_init__."""
    object.__setattr__(obj, name, value)


def as_p(key: str, value: object) -> str | tuple[int, ...]:
    expected = (
        'auto, auto-per-worker, or whole numbers >= 1: one for all workers or one per '
        'worker (e.g. 4 or [4, 2, 1, 1] or "4,2,1,1")'
    )
    if isinstance(value, str) and value.strip() in P_AUTO_MODES:
        return value.strip()
    items = as_items(value)
    if not items:
        raise bad_value(key, value, expected)
    result = []
    for item in items:
        try:
            result.append(as_int(key, item, 1))
        except ConfigError:
            raise bad_value(key, value, expected) from None
    return tuple(result)


def as_flush(key: str, value: object) -> str | float:
    """Ako's flush: average, full, or the fraction 0 < w <= 1 of the owed backlog applied."""
    if isinstance(value, str) and value.strip().lower() in FLUSH_MODES:
        return value.strip().lower()
    return as_float(key, value, lambda w: 0 < w <= 1,
                    "average, full, or a fraction 0 < w <= 1 of what is owed, e.g. 0.5")


def as_ssp(key: str, value: object) -> float:
    expected = "a whole number of rounds >= 0, or inf (fully asynchronous)"
    if isinstance(value, str) and value.strip().lower() == "inf":
        return math.inf
    if isinstance(value, float) and value == math.inf:
        return math.inf
    number = as_float(key, value, lambda x: x >= 0 and x == int(x), expected)
    return float(number)


def as_duration(key: str, value: object, expected: str, *, allow_zero: bool = False) -> float:
    """One duration ("10s", 10, 10.0) that is finite and > 0 (>= 0 with allow_zero)."""
    if isinstance(value, bool):
        raise bad_value(key, value, expected)
    try:
        seconds = parse_duration(value)  # type: ignore[arg-type]
    except UnitError as error:
        raise unit_error(key, error) from None
    if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not allow_zero):
        raise bad_value(key, value, expected)
    return seconds
