"""Settings as TOML: reading files and ``--set`` items into layers, writing configs back.

A TOML file has up to five tables, every key optional (the registry,
akocore.settings.key_registry, lists them all)::

    [cluster]
    workers = 4
    hosts = []                       # "host:port" per rank; empty = loopback
    [network]
    bandwidth = "1gbps"              # each node's NIC; a list goes round robin
    link_bandwidth = "40,20,10mbps"  # per-pair cap; pairs (0,1),(0,2),...
    latency = "5ms"                  # per message; pairs as above
    [exchange]
    scheme = "ako"                   # ako | ps | allreduce | wagma | diloco | ...
    p = "auto"                       # auto | auto-per-worker | 4 | [4, 2, 1, 1]
    ssp = 0                          # rounds; "inf" = fully asynchronous
    [exchange.diloco]                # a scheme's own knobs, in its table
    inner_steps = 10                 # (or flat in [exchange]: inner_steps = 10)
    [train]
    workload = "digits-mlp"
    rounds = 100
    duration = "300s"
    [akorun]                         # akorun only (akosim ignores it)
    peer_timeout = "10s"

A ``--set section.key=value`` item is read as a TOML value when it is one
(4, 0.1, "x", [1, 2], inf), else as the bare text. Reading a file is the
only I/O here.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from akocore.settings.key_registry import RUN_SECTIONS, current
from akocore.settings.layers import Given, Layer, layer_of, literal, resolve
from akocore.settings.normalise import ConfigError
from akocore.settings.schema import RunConfig

SET_FORM = "expected section.key=value, e.g. train.lr=0.1 or network.bandwidth=40mbps"


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


def file_layer(path: str | Path) -> list[Given]:
    """The values of a TOML config file as the FILE layer; errors name the file."""
    tables = read_toml(path)
    try:
        return layer_of(tables, Layer.FILE, f"in {path}")
    except ConfigError as error:
        raise ConfigError(f"{path}: {error}", error.key) from None


def split_dotted(dotted: str, what: str) -> tuple[str, str]:
    """("section", "key") of "section.key"; a scheme's knob may be named in its table,
    "exchange.<table>.<key>" (then the key is "<table>.<key>")."""
    parts = dotted.strip().split(".")
    if not all(parts) or not (len(parts) == 2 or (len(parts) == 3 and parts[0] == "exchange")):
        raise ConfigError(f"{what}: {SET_FORM}")
    return parts[0], ".".join(parts[1:])


def parse_set_value(text: str) -> Any:
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


def set_layer(items: Sequence[str] | None, *, say_where: bool = True) -> list[Given]:
    """``section.key=value`` items as the SET layer, in order (a later item wins)."""
    givens = []
    for item in items or ():
        dotted, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--set {item!r}: no '='; {SET_FORM}")
        section, key = split_dotted(dotted, f"--set {item!r}")
        givens.append(Given(f"{section}.{key}", parse_set_value(value), Layer.SET,
                            f"by --set {item}" if say_where else ""))
    return givens


# --------------------------------------------------------------------------- RunConfig API


def config_from_dict(d: Mapping[str, Any], base: RunConfig | None = None) -> RunConfig:
    """Build a RunConfig from the TOML structure {"cluster": {...}, "network": {...}, ...}.

    Values are human (``bandwidth = "40mbps"``, ``latency = "5ms"``,
    ``ssp = "inf"``); missing keys keep the value of `base` (built-in
    defaults if None). A train table with duration or target_accuracy but no
    rounds stops by those alone (rounds = None). An [akorun] table is checked
    and otherwise ignored.
    """
    return resolve(layer_of(d, Layer.FILE), defaults=base).config


def load_config(path: str | Path) -> RunConfig:
    """Read a TOML config file over the built-in defaults; errors name the file (and line)."""
    givens = file_layer(path)
    try:
        return resolve([Given(g.key, g.value, g.layer) for g in givens]).config
    except ConfigError as error:
        raise ConfigError(f"{path}: {error}", error.key) from None


def parse_toml_text(text: str) -> RunConfig:
    """Read TOML config text over the built-in defaults."""
    return config_from_dict(_loads(text, "<config text>"))


def apply_overrides(cfg: RunConfig, sets: Sequence[str]) -> RunConfig:
    """Apply ``section.key=value`` items in order (later wins); values read as in TOML.

    Literal: each item changes only its own key (rounds is not cleared by a
    duration here; the layered rule is akocore.settings.layers.resolve's).
    """
    return literal(cfg, set_layer(sets, say_where=False))


def replace_in(cfg: RunConfig, dotted_key: str, value: Any) -> RunConfig:
    """A copy of cfg with one human-named setting changed: replace_in(cfg, "train.lr", 0.1).

    `value` may be human ("40mbps") or SI (40e6); nothing else is touched.
    """
    section, key = split_dotted(dotted_key, f"replace_in key {dotted_key!r}")
    return literal(cfg, [Given(f"{section}.{key}", value, Layer.SET)])


def config_to_dict(cfg: RunConfig) -> dict[str, dict[str, Any]]:
    """The resolved config as a human, JSON-serialisable dict (TOML key names, inf as "inf").

    Every key of the run sections is present; unset optional values are None
    (JSON null, read back as "not set"). ``config_from_dict(config_to_dict(cfg)) == cfg``.
    """
    sections = current().sections
    return {section: {name: key.dump(key.value_in(getattr(cfg, section)))
                      for name, key in sections[section].items()}
            for section in RUN_SECTIONS}


# akosim's description of each island's inside network: how akosim times a run, not the run
INSIDE_ONLY_KEYS = (("network", "inside_bandwidth"), ("network", "inside_latency"))


def config_hash(cfg: RunConfig) -> str:
    """Stable hex sha256 of the canonical JSON of config_to_dict, without cluster.hosts,
    network.model and the islands' inside network (how akosim simulates the network is
    not part of the run), and without cluster.devices_per_rank while it is 1 (so a run
    of one device per rank keeps the hash it had before islands).

    Two ranks of one run on different hosts share it; any other change alters it.
    """
    d = config_to_dict(cfg)
    del d["cluster"]["hosts"]
    del d["network"]["model"]
    for section, name in INSIDE_ONLY_KEYS:  # how akosim times an island's inside
        del d[section][name]
    if d["cluster"]["devices_per_rank"] == [1]:  # the keys runs had before islands
        del d["cluster"]["devices_per_rank"]
    canonical = json.dumps(d, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()
