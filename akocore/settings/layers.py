"""Settings resolved in layers that remember where each value came from.

Precedence, lowest first: built-in defaults < config file < ``--set`` items (a
Python call's ``overrides``) < flags (a Python call's keywords, the API layer)
(`Layer`). Each layer is a list of `Given` values (human values, keyed
"section.name", with the text that says where they came from); `resolve`
merges them over the defaults into a `ResolvedSettings`: the `RunConfig`,
akorun's `AkorunConfig`, and the `Origin` of every key.

The stop rule lives here and only here: when some layer sets
``train.duration`` or ``train.target_accuracy`` and no layer sets
``train.rounds``, the default's rounds is cleared, so the run stops by time or
accuracy alone (the origin of rounds then says why).
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from akocore.schemes.named import expansion
from akocore.settings.key_registry import RUN_SECTIONS, SHELL_SECTIONS, Key, current
from akocore.settings.normalise import ConfigError, is_unset, require_unit, show
from akocore.settings.schema import AkorunConfig, AkosimConfig, RunConfig
from akocore.settings.sites import BETWEEN_TABLE, SITE_TABLE, expand, parse_between, parse_site
from akocore.settings.sites import DERIVED_KEYS as SITE_DERIVED_KEYS

STOP_KEYS = ("train.duration", "train.target_accuracy")
ROUNDS_KEY = "train.rounds"


class Layer(enum.IntEnum):
    """Where a value came from; a higher layer wins."""

    DEFAULT = 0
    FILE = 1
    SET = 2
    FLAG = 3
    API = 4  # the keyword settings of a Python call (akosim.plan(workers=8)); no flags meet it


@dataclass(frozen=True)
class Origin:
    """The layer that set a value and the words that say so ("by --lr", "in run.toml")."""

    layer: Layer
    source: str

    def __str__(self) -> str:
        return self.source


DEFAULT_ORIGIN = Origin(Layer.DEFAULT, "built-in default")


@dataclass(frozen=True)
class Given:
    """One value as a layer gives it: human units, not yet checked."""

    key: str  # "section.name"
    value: Any
    layer: Layer
    source: str = ""  # "in run.toml", "by --set train.lr=0.1", "by --lr"; "" = do not say


@dataclass(frozen=True)
class ResolvedSettings:
    """The resolved run config, akorun's settings, and where each value came from."""

    config: RunConfig
    akorun: AkorunConfig = field(default_factory=AkorunConfig)
    origins: Mapping[str, Origin] = field(default_factory=dict)  # keys some layer set
    defaults_origin: Origin = DEFAULT_ORIGIN
    akosim: AkosimConfig = field(default_factory=AkosimConfig)

    def origin(self, dotted: str) -> Origin:
        """Which layer set `dotted` ("train.lr"); KeyError for a key not in the registry."""
        if dotted not in current().by_dotted:
            raise KeyError(dotted)
        return self.origins.get(dotted, self.defaults_origin)

    def given(self, dotted: str) -> bool:
        """True when a layer above the defaults set `dotted`."""
        return self.origin(dotted).layer > Layer.DEFAULT

    def value(self, dotted: str) -> Any:
        """The typed value of one key."""
        key = current().by_dotted[dotted]
        holder = getattr(self, key.section) if key.section in SHELL_SECTIONS \
            else getattr(self.config, key.section)
        return key.value_in(holder)

    def describe(self, sections: Iterable[str] = RUN_SECTIONS) -> list[str]:
        """One line per key: ``section.name = value  (origin)``, for --show-config."""
        lines = []
        for section in sections:
            for key in current().sections[section].values():
                shown = _as_text(key.dump(self.value(key.dotted)))
                lines.append(f"{key.dotted} = {shown}  ({self.origin(key.dotted)})")
        return lines


def _as_text(value: Any) -> str:
    """A human value as TOML-like text: "ako", [4, 2], none."""
    return "none" if value is None else json.dumps(value)


def suggest(name: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def check_key(section: str, name: str) -> Key:
    """The registry Key of section.name; ConfigError with a suggestion if unknown."""
    sections = current().sections
    if section not in sections:
        raise ConfigError(
            f"unknown section [{section}]{suggest(section, sections)}; "
            f"known sections: {', '.join(sections)}",
            section,
        )
    keys = sections[section]
    table, dot, knob = name.partition(".")
    if section == "exchange" and dot:  # exchange.<table>.<knob>
        return keys[table_key(table, knob).partition(".")[2]]
    if name not in keys:
        raise ConfigError(
            f"{section}.{name}: unknown key{suggest(name, keys)}; "
            f"known keys in [{section}]: {', '.join(keys)}",
            f"{section}.{name}",
        )
    return keys[name]


def _expand_named_schemes(givens: Iterable[Given]) -> list[Given]:
    """A named scheme ("adag") as its settings, given first in its layer (akocore.schemes.named)."""
    expanded: list[Given] = []
    rest: list[Given] = []
    for given in givens:
        named = expansion(given.value) if given.key == "exchange.scheme" else None
        if named is None:
            rest.append(given)
            continue
        source = (f"{given.source} {named.name}" if given.source.startswith("by --")
                  else f"{given.source} (scheme = {named.name})" if given.source else named.name)
        expanded += [Given(f"{section}.{name}", value, given.layer, source)
                     for section, body in named.tables.items() for name, value in body.items()]
    return expanded + rest


def _merge(givens: Iterable[Given]) -> dict[str, Given]:
    """The winning Given per key: the highest layer, and within a layer the last."""
    merged: dict[str, Given] = {}
    # stable sort: the order within a layer is kept, a named scheme's settings first
    for given in sorted(_expand_named_schemes(givens), key=lambda g: g.layer):
        section, _, name = given.key.partition(".")
        try:
            key = check_key(section, name)
        except ConfigError as error:
            if not given.source:
                raise
            raise ConfigError(f"{error} (given {given.source})", error.key) from None
        if key.unit and given.layer > Layer.DEFAULT and not (
                given.layer is Layer.API and _si_number(given.value)):
            # units required at the edges; a Python call may give SI numbers (40e6 b/s)
            require_unit(key.dotted, given.value, key.unit, flag=key.flag, source=given.source)
        merged[key.dotted] = given if given.key == key.dotted else dataclasses.replace(
            given, key=key.dotted)
    return merged


def _si_number(value: Any) -> bool:
    """A number, or a list of them, as a Python call gives SI values (not text)."""
    if isinstance(value, list | tuple):
        return all(_si_number(item) for item in value)
    return isinstance(value, int | float) and not isinstance(value, bool)


WORKLOAD_TABLE = "workload"  # [workload] / --workload-arg: arguments of train.workload


def _arg_text(given: Given) -> str:
    """One workload argument as the text of a name's key=value tail."""
    value = given.value
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, list | tuple) and value and all(
            isinstance(v, int) and not isinstance(v, bool) for v in value):
        text = "x".join(str(v) for v in value)
    elif isinstance(value, int | float | str):
        text = str(value)
    else:
        text = ""
    name = given.key.partition(".")[2]
    where = f" (given {given.source})" if given.source else ""
    if not text or "," in text or ":" in text or not name.isidentifier():
        raise ConfigError(f"workload argument {name} = {show(value)}{where}: expected a Python "
                          f"name = a number, true/false, a shape list of ints or text without "
                          f"',' or ':'", "train.workload")
    return f"{name}={text}"


def fold_workload_args(givens: list[Given], defaults: RunConfig | None) -> list[Given]:
    """[workload] tables and --workload-arg items folded into train.workload as its
    ``:key=value,...`` tail (the one stored form every rank reads); a higher layer wins,
    and any of them wins over the name's own tail."""
    args = sorted((g for g in givens if g.key.startswith(WORKLOAD_TABLE + ".")),
                  key=lambda g: g.layer)
    if not args:
        return givens
    rest = [g for g in givens if not g.key.startswith(WORKLOAD_TABLE + ".")]
    named = sorted((g for g in rest if g.key == "train.workload"), key=lambda g: g.layer)
    text = str(named[-1].value) if named else (defaults or RunConfig()).train.workload
    head, colon, tail = text.partition(":")
    factory, _, factory_tail = tail.partition(":")
    builtin_form = not colon or "=" in factory or not factory  # NAME[:key=value,...]
    existing = tail if builtin_form else factory_tail
    joined = ",".join(part for part in (existing, *(_arg_text(g) for g in args)) if part)
    combined = f"{head}:{joined}" if builtin_form else f"{head}:{factory}:{joined}"
    layer = max(args[-1].layer, named[-1].layer if named else Layer.DEFAULT)
    sources = ", ".join(dict.fromkeys(g.source for g in args if g.source))
    return [*rest, Given("train.workload", combined, layer,
                         sources or (named[-1].source if named else ""))]


def fold_sites(givens: list[Any]) -> list[Any]:
    """`givens` with the sites (``site.list`` / ``between.link`` givens, from --site,
    --between or [[site]] / [between]) replaced by the per-node settings they mean, in
    the highest layer that gave either. A per-node setting given in that layer or a
    higher one as well is a conflict (one line naming both); lower ones are overridden."""
    sites = sorted((g for g in givens if g.key == f"{SITE_TABLE}.list"), key=lambda g: g.layer)
    betweens = sorted((g for g in givens if g.key == f"{BETWEEN_TABLE}.link"),
                      key=lambda g: g.layer)
    if not sites and not betweens:
        return givens
    rest = [g for g in givens if g.key not in (f"{SITE_TABLE}.list", f"{BETWEEN_TABLE}.link")]
    site_list = [parse_site(value) for value in (sites[-1].value if sites else [])]
    between = parse_between(betweens[-1].value) if betweens else None
    layer = max(g.layer for g in (*sites[-1:], *betweens[-1:]))
    source = ", ".join(dict.fromkeys(g.source for g in (*sites[-1:], *betweens[-1:])
                                     if g.source))
    values = expand(site_list, between)
    for given in rest:
        if (given.key in SITE_DERIVED_KEYS or given.key in values) and given.layer >= layer:
            raise ConfigError(f"{given.key} (given {given.source or given.layer.name.lower()}) "
                              f"and the sites ({source or 'given'}) both describe the "
                              f"cluster: give one of them", given.key)
    derived = [Given(key, value, layer, source or "by the sites")
               for key, value in values.items()]
    return [*rest, *derived]


def _apply_stop_rule(merged: dict[str, Given]) -> None:
    """Clear the default rounds when a layer stops by duration or accuracy and none sets rounds."""
    if ROUNDS_KEY in merged:
        return
    triggers = [merged[k] for k in STOP_KEYS if k in merged and not is_unset(merged[k].value)]
    if triggers:
        trigger = max(triggers, key=lambda g: g.layer)
        words = f" {trigger.source}" if trigger.source else ""
        merged[ROUNDS_KEY] = Given(ROUNDS_KEY, None, trigger.layer,
                                   f"cleared: {trigger.key} given{words} and train.rounds "
                                   f"by no layer")


def _with_origin(error: ConfigError, merged: Mapping[str, Given]) -> ConfigError:
    given = merged.get(error.key or "")
    if given is None or not given.source or given.source.startswith("cleared"):
        return error
    return ConfigError(f"{error} (given {given.source})", error.key)


def resolve(givens: Iterable[Given], *, defaults: RunConfig | None = None,
            akorun_defaults: AkorunConfig | None = None, stop_rule: bool = True,
            defaults_origin: Origin = DEFAULT_ORIGIN) -> ResolvedSettings:
    """Merge the layers over `defaults` (built-ins if None); errors say which layer gave
    the bad value. With `stop_rule` (the default), rounds is cleared as the module says;
    without it every value changes only its own key (for literal edits)."""
    merged = _merge(fold_sites(fold_workload_args(list(givens), defaults)))
    if stop_rule:
        _apply_stop_rule(merged)
    base = defaults if defaults is not None else RunConfig()
    akorun_base = akorun_defaults if akorun_defaults is not None else AkorunConfig()
    changes: dict[str, dict[str, Any]] = {}
    for dotted, given in merged.items():
        key = current().by_dotted[dotted]
        changes.setdefault(key.section, {})[key.init_name] = given.value
    try:
        sections = {section: _replace(getattr(base, section), changes.get(section))
                    for section in RUN_SECTIONS}
        config = RunConfig(**sections)
        akorun = _replace(akorun_base, changes.get("akorun"))
        akosim = _replace(AkosimConfig(), changes.get("akosim"))
    except ConfigError as error:
        raise _with_origin(error, merged) from None
    origins = {dotted: Origin(given.layer, given.source or given.layer.name.lower())
               for dotted, given in merged.items()}
    return ResolvedSettings(config, akorun, origins, defaults_origin, akosim=akosim)


def _replace(current: Any, changes: Mapping[str, Any] | None) -> Any:
    return dataclasses.replace(current, **changes) if changes else current


def layer_of(tables: Mapping[str, Any], layer: Layer, source: str = "") -> list[Given]:
    """The Givens of a TOML-shaped mapping {"section": {"key": value}}; structure checked.

    A scheme's table, ``[exchange.<table>]`` ({"exchange": {"diloco": {...}}}), gives
    its knobs as the keys exchange.<name>."""
    sections = current().sections
    if not isinstance(tables, Mapping):
        raise ConfigError(
            f"config: got {type(tables).__name__}, expected a table with sections "
            + ", ".join(sections)
        )
    givens = []
    for section, body in tables.items():
        if section == WORKLOAD_TABLE and isinstance(body, Mapping):  # the workload's arguments
            givens += [Given(f"{WORKLOAD_TABLE}.{name}", value, layer, source)
                       for name, value in body.items()]
            continue
        if section == SITE_TABLE and isinstance(body, list):  # [[site]] tables
            givens.append(Given(f"{SITE_TABLE}.list", body, layer, source))
            continue
        if section == BETWEEN_TABLE and isinstance(body, Mapping):  # [between]
            givens.append(Given(f"{BETWEEN_TABLE}.link", dict(body), layer, source))
            continue
        if section not in sections:
            check_key(str(section), "")  # raises: unknown section
        if not isinstance(body, Mapping):
            raise ConfigError(
                f"{section}: got {show(body)}, expected a table of settings "
                f"([{section}] with keys {', '.join(sections[section])})",
                section,
            )
        for name, value in body.items():
            if section == "exchange" and name in current().tables and isinstance(value, Mapping):
                givens += [Given(table_key(str(name), str(knob)), knob_value, layer, source)
                           for knob, knob_value in value.items()]
                continue
            check_key(section, str(name))
            givens.append(Given(f"{section}.{name}", value, layer, source))
    return givens


def table_key(table: str, name: str) -> str:
    """The key exchange.<name> of knob `name` of [exchange.<table>]; ConfigError naming
    the table's knobs when it has no such knob (or there is no such table)."""
    kind = current().tables.get(table)
    if kind is None:
        tables = current().tables
        raise ConfigError(f"exchange.{table}: no scheme has this table{suggest(table, tables)}; "
                          f"scheme tables: {', '.join(tables)}", f"exchange.{table}")
    if name not in kind.names():
        raise ConfigError(f"exchange.{table}.{name}: unknown key{suggest(name, kind.names())}; "
                          f"known keys in [exchange.{table}]: {', '.join(kind.names())}",
                          f"exchange.{table}.{name}")
    return f"exchange.{name}"


def literal(cfg: RunConfig, givens: Sequence[Given]) -> RunConfig:
    """`cfg` with each given value changed and nothing else (no stop rule)."""
    return resolve(givens, defaults=cfg, stop_rule=False).config
