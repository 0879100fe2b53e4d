"""Frozen dataclasses <-> JSON objects, checked against their type hints.

A record is a frozen dataclass whose fields carry `meta(unit, meaning, by)`.
`record_to_json` writes every field (non-finite floats as ``"inf"``/``"-inf"``,
NaN as null, tuples as lists, nested records as objects); `record_from_json`
reads one back, checking each value against the field's type and raising
`RecordError` that names the key (``per_worker[2].rounds: expected an
integer, got "3"``). `schema_rows` gives one row per field for the
documentation table. Supported field types: int, float, str, bool,
``X | None``, ``tuple[X, ...]``, fixed tuples (``tuple[X, Y]``),
``Mapping[str, Any]`` and nested records.
No I/O here.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

R = TypeVar("R")


class RecordError(ValueError):
    """A JSON object that is not the record it should be; the message names the key."""


@dataclasses.dataclass(frozen=True)
class FieldDoc:
    unit: str
    meaning: str
    by: str  # "akosim", "akorun" or "both"


def meta(unit: str, meaning: str, by: str = "both") -> dict[str, FieldDoc]:
    """Field metadata: the schema table's unit, meaning and writer."""
    if by not in ("akosim", "akorun", "both"):
        raise ValueError(f"by: got {by!r}, expected akosim, akorun or both")
    return {"doc": FieldDoc(unit, meaning, by)}


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    """The resolved field types of a record class, resolved once per class: writing a
    plan record of thousands of nested records resolved them again for every one
    (typing.get_type_hints compiles each string annotation), and that cost more than
    simulating the plan."""
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = typing.get_type_hints(cls)
    return hints


def _is_record(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _optional_of(tp: Any) -> Any | None:
    """X for ``X | None``, else None."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return args[0]
    return None


def _items(tp: Any, length: int) -> tuple[Any, ...]:
    """The item types of a tuple type for a value of `length` items."""
    args = typing.get_args(tp)
    return (args[0],) * length if Ellipsis in args else args


def _write(value: Any, tp: Any) -> Any:
    inner = _optional_of(tp)
    if inner is not None:
        return None if value is None else _write(value, inner)
    if tp is float:
        if math.isnan(value):
            return None
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return float(value)
    if typing.get_origin(tp) is tuple:
        return [_write(v, item) for v, item in zip(value, _items(tp, len(value)), strict=True)]
    if _is_record(tp):
        return record_to_json(value)
    if typing.get_origin(tp) is Mapping or tp is Mapping:
        return dict(value)
    return value


def record_to_json(record: Any) -> dict[str, Any]:
    """Every field of `record`, JSON-ready, in declaration order."""
    hints = _hints(type(record))
    return {f.name: _write(getattr(record, f.name), hints[f.name])
            for f in dataclasses.fields(record)}


def _read(value: Any, tp: Any, key: str) -> Any:
    inner = _optional_of(tp)
    if inner is not None:
        return None if value is None else _read(value, inner, key)
    if tp is bool:
        if not isinstance(value, bool):
            raise RecordError(f"{key}: expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise RecordError(f"{key}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if value is None:
            return math.nan
        if isinstance(value, str) and value in ("inf", "-inf", "nan"):
            return float(value)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise RecordError(f"{key}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise RecordError(f"{key}: expected a string, got {value!r}")
        return value
    if typing.get_origin(tp) is tuple:
        if not isinstance(value, list | tuple):
            raise RecordError(f"{key}: expected a list, got {value!r}")
        args = typing.get_args(tp)
        if Ellipsis not in args and len(value) != len(args):
            raise RecordError(f"{key}: expected a list of {len(args)} values, got {value!r}")
        return tuple(_read(v, item, f"{key}[{i}]")
                     for i, (v, item) in enumerate(zip(value, _items(tp, len(value)),
                                                       strict=True)))
    if _is_record(tp):
        return record_from_json(tp, value, key)
    if typing.get_origin(tp) is Mapping or tp is Mapping:
        if not isinstance(value, dict):
            raise RecordError(f"{key}: expected an object, got {value!r}")
        return dict(value)
    raise TypeError(f"{key}: unsupported field type {tp!r}")  # a programming error


def record_from_json(cls: type[R], data: Any, where: str = "") -> R:
    """`cls` from a JSON object: unknown keys refused, missing keys take the defaults."""
    prefix = f"{where}." if where else ""
    if not isinstance(data, dict):
        raise RecordError(f"{where or cls.__name__}: expected an object, got {data!r}")
    hints = _hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise RecordError(f"{prefix}{unknown[0]}: not a key of {cls.__name__}")
    values = {}
    for name, f in fields.items():
        if name in data:
            values[name] = _read(data[name], hints[name], prefix + name)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise RecordError(f"{prefix}{name}: missing (required by {cls.__name__})")
    try:
        return cls(**values)
    except (TypeError, ValueError) as error:
        raise RecordError(f"{where or cls.__name__}: {error}") from None


def type_name(tp: Any) -> str:
    """The JSON type of a field type, as the schema table writes it."""
    inner = _optional_of(tp)
    if inner is not None:
        return f"{type_name(inner)} or null"
    if typing.get_origin(tp) is tuple:
        args = typing.get_args(tp)
        if Ellipsis in args:
            return f"list of {type_name(args[0])}"
        return "[" + ", ".join(type_name(a) for a in args) + "]"
    if _is_record(tp):
        return f"{tp.__name__} object"
    names = {int: "integer", float: "number", str: "string", bool: "boolean"}
    if tp in names:
        return names[tp]
    return "object"


def schema_rows(cls: type) -> list[tuple[str, str, str, str, str]]:
    """(key, type, unit, meaning, written by) for every documented field of `cls`."""
    hints = _hints(cls)
    rows = []
    for f in dataclasses.fields(cls):
        doc = f.metadata.get("doc")
        if doc is None:
            raise TypeError(f"{cls.__name__}.{f.name} has no meta(): document it")
        rows.append((f.name, type_name(hints[f.name]), doc.unit, doc.meaning, doc.by))
    return rows
