"""A scheme's own settings: a frozen dataclass whose fields say everything about a knob.

A scheme with knobs of its own declares one `SchemeSettings` subclass in its
module, each field made by `knob(default, help=..., parse=...)`: its default,
the one-line help (cluster files, ``--show-config``, the settings reference),
how a human value is read and checked (`parse`, e.g. `whole(1)`), how it is
written back (`dump`), its unit, and the flag that sets it (``--inner-steps``)
with its help text. The class's `table` names its TOML table,
``[exchange.<table>]``; every knob is also the key ``exchange.<name>`` (the
flat spelling older configs use, and the one records and the run hash keep).

The settings layers (akocore.settings) generate the key registry, the flags
of akosim and akorun and the settings reference from the settings classes of
the registered schemes (akocore.schemes.registry); nothing outside the
scheme's module names a knob. `SchemeTables` is what a resolved
``ExchangeConfig`` holds: one settings object per table. A `Preset` is a name
that stands for some of a scheme's settings (``--scheme adag``).

Values are checked by the normalisers of akocore.settings.normalise, so an
error reads like any other setting's: ``exchange.inner_steps: got 0, expected
an integer >= 1``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar

from akocore.settings.normalise import (
    as_choice,
    as_float,
    as_int,
    as_items,
    bad_value,
    set_field,
)

KNOB = "ako.knob"  # the metadata key of a knob's field

Parse = Callable[[str, Any], Any]  # (dotted key, human or typed value) -> typed value


def _as_given(key: str, value: Any) -> Any:
    return value


def _plain(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class Knob:
    """What the edges need to know about one knob (the field's metadata)."""

    help: str  # one line: what the value means
    parse: Parse = _as_given
    dump: Callable[[Any], Any] = _plain  # typed value -> human (TOML/JSON) value
    unit: str = ""  # a unit example ("ms"): a bare number is refused from every layer
    flag: str | None = None  # "--inner-steps"; None = only a file or --set give it
    flag_help: str = ""
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    text: bool = False  # the flag's value is kept as given (names, paths)


def knob(default: Any, *, help: str, parse: Parse = _as_given,
         dump: Callable[[Any], Any] = _plain, unit: str = "", flag: str | None = None,
         flag_help: str = "", metavar: str | None = None,
         choices: tuple[str, ...] | None = None, text: bool = False) -> Any:
    """A settings field: its default and its `Knob` (help, parser, flag) as metadata."""
    meta = Knob(help, parse, dump, unit, flag, flag_help or help, metavar, choices, text)
    if isinstance(default, list | dict | set):
        raise TypeError("a knob's default is immutable: a tuple, a number or text")
    return dataclasses.field(default=default, metadata={KNOB: meta})


def knob_of(item: dataclasses.Field[Any]) -> Knob:
    """The `Knob` of one settings field; TypeError for a field made without `knob()`."""
    try:
        return item.metadata[KNOB]  # type: ignore[no-any-return]
    except KeyError:
        raise TypeError(f"settings field {item.name}: make it with knob(...)") from None


# ---------------------------------------------------------------------------- parsers


def whole(least: int, expected: str | None = None) -> Parse:
    """An integer >= `least` ("4" and 4 alike)."""
    return lambda key, value: as_int(key, value, least, expected)


def real(ok: Callable[[float], bool], expected: str) -> Parse:
    """A finite number for which `ok` holds; `expected` says which, e.g. "a rate > 0"."""
    return lambda key, value: as_float(key, value, ok, expected)


def one_of(choices: Sequence[str]) -> Parse:
    """One of `choices`, as given."""
    return lambda key, value: as_choice(key, value, tuple(choices))


def truth(key: str, value: Any) -> bool:
    """true or false (the words too, as a flag or --set gives them)."""
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        value = value.strip().lower() == "true"
    if not isinstance(value, bool):
        raise bad_value(key, value, "true or false")
    return value


def reals(ok: Callable[[float], bool], expected: str) -> Parse:
    """A list of numbers ("1,0.5", [1, 0.5] or one number) for which `ok` holds."""
    return lambda key, value: tuple(as_float(key, item, ok, expected)
                                    for item in as_items(value))


# ---------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class SchemeSettings:
    """A scheme's knobs. A subclass sets `table` and makes every field with `knob()`;
    each value is read by its knob's parser when the object is made, so settings are
    never invalid. `check_workers` refuses what cannot run on a cluster of n ranks."""

    table: ClassVar[str]  # [exchange.<table>] in TOML

    def __post_init__(self) -> None:
        for item in dataclasses.fields(self):
            value = knob_of(item).parse(f"exchange.{item.name}", getattr(self, item.name))
            set_field(self, item.name, value)

    def check_workers(self, workers: int) -> None:
        """ConfigError when these settings cannot run with `workers` ranks."""

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """Its knobs' names, in field order."""
        return tuple(item.name for item in dataclasses.fields(cls))


@dataclass(frozen=True)
class SchemeTables:
    """One settings object per table, in the registry's order (what ExchangeConfig holds)."""

    items: tuple[tuple[str, SchemeSettings], ...] = ()

    def __iter__(self) -> Iterator[SchemeSettings]:
        return (settings for _, settings in self.items)

    def get(self, table: str) -> SchemeSettings | None:
        return next((settings for name, settings in self.items if name == table), None)

    def knob(self, name: str) -> tuple[bool, Any]:
        """(True, value) of the knob called `name` in one of the tables, else (False, None)."""
        for settings in self:
            if name in settings.names():
                return True, getattr(settings, name)
        return False, None


@dataclass(frozen=True)
class Preset:
    """A named scheme: a name that stands for settings of a scheme (``--scheme adag``),
    as TOML-shaped tables ({"exchange": {"scheme": "ps", ...}, "train": {...}}); a
    scheme lists its own in `Scheme.presets` (akocore.schemes.named reads them)."""

    name: str
    summary: str
    tables: Mapping[str, Mapping[str, Any]]

    @property
    def core_scheme(self) -> str:
        """The state machine that runs it (exchange.scheme after expansion)."""
        return str(self.tables["exchange"]["scheme"])


def preset(name: str, summary: str, exchange: Mapping[str, Any],
           train: Mapping[str, Any] | None = None) -> Preset:
    """A `Preset` of `exchange` settings (and `train` ones, e.g. DOWNPOUR's Adagrad)."""
    tables: dict[str, Mapping[str, Any]] = {"exchange": MappingProxyType(dict(exchange))}
    if train:
        tables["train"] = MappingProxyType(dict(train))
    return Preset(name, summary, MappingProxyType(tables))


def tables_with(types: Mapping[str, type[SchemeSettings]], current: SchemeTables | None,
                flat: Mapping[str, Any]) -> tuple[SchemeTables, dict[str, Any]]:
    """The tables of `types` (table -> settings class): `current`'s values (defaults
    where it has none) with the knobs named in `flat` changed; and what `flat` held
    that no table knows."""
    rest = dict(flat)
    items = []
    for table, kind in types.items():
        now = current.get(table) if current is not None else None
        changes = {name: rest.pop(name) for name in kind.names() if name in rest}
        if now is None or not isinstance(now, kind):
            items.append((table, kind(**changes)))
        else:
            items.append((table, dataclasses.replace(now, **changes) if changes else now))
    return SchemeTables(tuple(items)), rest
