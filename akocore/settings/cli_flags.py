"""Command-line flags generated from the key registry, and the layers they feed.

`add_shared_arguments` gives a parser ``--config``, ``--set`` and one flag
per run setting the registry offers its `Tool`; `add_akorun_arguments` adds
the ``[akorun]`` settings' flags (peer timeout, join timeout, ...) and
`add_akosim_argument` one ``[akosim]`` setting's flag (``--compute``). Every
generated flag defaults to None, so only flags actually given form the FLAG
layer; `resolve_args` stacks defaults < ``--config`` < ``--set`` < flags.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Sequence
from typing import Any

from akocore.settings.key_registry import (
    RUN_SECTIONS,
    FlagKind,
    Key,
    Tool,
    current,
    flag_keys,
)
from akocore.settings.layers import (
    DEFAULT_ORIGIN,
    WORKLOAD_TABLE,
    Given,
    Layer,
    Origin,
    ResolvedSettings,
    resolve,
)
from akocore.settings.normalise import ConfigError
from akocore.settings.schema import RunConfig
from akocore.settings.sites import BETWEEN_TABLE, SITE_TABLE
from akocore.settings.toml_io import file_layer, parse_set_value, set_layer

SHARED_GROUP = "shared run settings"


def _default_text(key: Key) -> str:
    shown = key.dump(key.default)
    return f" (default {shown})" if shown not in (None, "") else ""


def add_key_flag(group: Any, key: Key) -> None:
    """One registry key's flag (dest = the key's name, default None)."""
    assert key.flag is not None
    help_text = key.flag_help
    if key.section == "akorun":
        help_text += _default_text(key)
    if key.kind is FlagKind.SWITCH:
        switch = group.add_mutually_exclusive_group()
        switch.add_argument(key.flag, dest=key.name, nargs="?", const=True, default=None,
                            choices=key.choices, metavar="MODE", help=help_text)
        switch.add_argument("--no-" + key.flag.removeprefix("--"), dest=key.name,
                            action="store_const", const=False,
                            help=f"the same as {key.flag} off")
        return
    group.add_argument(key.flag, dest=key.name, metavar=key.metavar, choices=key.choices,
                       default=None, help=help_text)


def add_shared_arguments(parser: argparse.ArgumentParser, tool: Tool = Tool.AKOSIM) -> None:
    """Add --config, --set and the run settings `tool` takes, in group "shared run settings"."""
    group = parser.add_argument_group(
        SHARED_GROUP,
        "Precedence, lowest first: built-in defaults < --config < --set < these flags.",
    )
    add = group.add_argument
    add("--config", metavar="FILE", default=None,
        help="TOML file with [cluster] [network] [exchange] [train] tables, "
             "e.g. configs/uniform-wan.toml")
    add("--set", metavar="SECTION.KEY=VALUE", action="append", default=None, dest="set",
        help="override one config value, repeatable, e.g. --set train.lr=0.1 "
             "--set network.latency=5ms (values in the config file's units)")
    add("--site", metavar="[RANKSx][DEVICESdev@]BANDWIDTH[,LATENCY][,inside=BW[/LAT]][,repeat=N]",
        action="append", default=None, dest="site",
        help="a site of the cluster, repeatable, in rank order: RANKS ranks (default 1) with "
             "BANDWIDTH NICs (the uplink) and LATENCY one-way between two of them; each rank "
             "an island of DEVICES devices (default 1; batch size per device) that reduce "
             "their gradient over an inside network of BW and LAT each round; repeat=N "
             "lays out N such sites. E.g. --site 4x1gbps --site 4x50mbps --between "
             "30ms,50mbps, or 4 sites of 8 devices: --site 8dev@1gbps,inside=100gbps/5us,"
             "repeat=4 --between 30ms (sets --workers, the per-node bandwidths, the latency "
             "matrix and the islands; [[site]] tables in a config file)")
    add("--between", metavar="LATENCY[,BANDWIDTH]", default=None, dest="between",
        help="the link between sites: one-way latency and an optional cap on each pair of "
             "nodes of different sites, in either order, e.g. 30ms,50mbps or 1gbps,30ms "
             "([between] in a config file)")
    for key in flag_keys(tool):
        if key.section in RUN_SECTIONS:
            add_key_flag(group, key)
            if key.dotted == "train.workload":
                add("--workload-arg", metavar="KEY=VALUE", action="append", default=None,
                    dest="workload_arg",
                    help="an argument of the workload (a built-in's option or the "
                         "factory's keyword argument), repeatable, e.g. --workload-arg "
                         "width=64; the same as a :key=value,... tail after the name")


def add_akorun_arguments(group: Any, tool: Tool) -> None:
    """Add the flags of the [akorun] settings `tool` takes to `group`."""
    for key in flag_keys(tool, "akorun"):
        add_key_flag(group, key)


def add_akosim_argument(group: Any, name: str) -> None:
    """Add the flag of one [akosim] setting (``--compute``, ``--message-overhead``,
    ``--coalesce``) to `group`, where the command lists it among its own flags."""
    add_key_flag(group, current().sections["akosim"][name])


def _flag_value(key: Key, value: Any) -> Any:
    if key.kind is FlagKind.SWITCH and isinstance(value, bool):
        return "on" if value else "off"
    if key.kind is FlagKind.VALUE and isinstance(value, str):
        return parse_set_value(value)  # "1" -> 1, "inf" -> inf, "40mbps" stays
    return value


def flag_layer(args: argparse.Namespace, keys: Iterable[Key] | None = None) -> list[Given]:
    """The registry flags given in `args` (those not None) as the FLAG layer."""
    keys = current().keys if keys is None else keys
    return [Given(key.dotted, _flag_value(key, getattr(args, key.name)), Layer.FLAG,
                  f"by {key.flag}")
            for key in keys
            if key.flag is not None and getattr(args, key.name, None) is not None]


def resolve_args(args: argparse.Namespace, defaults: RunConfig | None = None, *,
                 defaults_origin: Origin = DEFAULT_ORIGIN,
                 below: Sequence[Given] = ()) -> ResolvedSettings:
    """defaults (built-ins if None) < `below` (values a command adopts, e.g. from a run it
    calibrates with) < --config < --set items < flags, with origins."""
    return resolve([*below, *arg_layers(args)], defaults=defaults,
                   defaults_origin=defaults_origin)


def arg_layers(args: argparse.Namespace, *, config_file: bool = True) -> list[Given]:
    """The layers a command line gives: --config (unless not `config_file`: a command
    that reads it itself) < --set items < flags (the registry's flags, --workload-arg,
    --site and --between)."""
    givens: list[Given] = []
    config_path = getattr(args, "config", None)
    if config_path is not None and config_file:
        givens += file_layer(config_path)
    givens += set_layer(getattr(args, "set", None))
    givens += flag_layer(args)
    givens += workload_arg_layer(getattr(args, "workload_arg", None))
    givens += site_layer(getattr(args, "site", None), getattr(args, "between", None))
    return givens


def site_layer(sites: list[str] | None, between: str | None) -> list[Given]:
    """``--site`` items and ``--between`` as FLAG givens (expanded into the per-node
    settings by akocore.settings.sites.fold_sites)."""
    givens = []
    if sites:
        givens.append(Given(f"{SITE_TABLE}.list", list(sites), Layer.FLAG,
                            "by " + " ".join(f"--site {s}" for s in sites)))
    if between is not None:
        givens.append(Given(f"{BETWEEN_TABLE}.link", between, Layer.FLAG,
                            f"by --between {between}"))
    return givens


def workload_arg_layer(items: list[str] | None) -> list[Given]:
    """``--workload-arg key=value`` items as FLAG givens of the workload's arguments
    (folded into train.workload by akocore.settings.layers.fold_workload_args)."""
    givens = []
    for item in items or ():
        key, eq, value = item.partition("=")
        if not eq or not key.strip().isidentifier():
            raise ConfigError(f"--workload-arg {item!r}: expected key=value with a Python "
                              f"name as key, e.g. --workload-arg width=64", "train.workload")
        givens.append(Given(f"{WORKLOAD_TABLE}.{key.strip()}", value.strip(), Layer.FLAG,
                            f"by --workload-arg {item}"))
    return givens


def config_from_args(args: argparse.Namespace, defaults: RunConfig | None = None) -> RunConfig:
    """The final config: `defaults` (built-ins if None) < --config < --set items < flags.

    Flag values are validated exactly like TOML values. If duration or
    target_accuracy is given by any layer and rounds by none, rounds is
    cleared so the run stops by time or accuracy. Errors say which layer
    gave the bad value.
    """
    return resolve_args(args, defaults).config
