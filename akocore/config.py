"""Run configuration: the names the toolkit imports, gathered from akocore.settings.

What a run is (the frozen dataclasses), how a user says so (TOML files,
``--set`` items, flags) and where each value came from live in the
akocore.settings package, one job per module; this module only re-exports
them so that ``from akocore.config import RunConfig, config_from_args`` keeps
working. Precedence, lowest first: built-in defaults < ``--config`` file <
``--set`` items < explicit flags; see akocore.settings.layers.
"""

from __future__ import annotations

from akocore.schemes.ps_family import PS_MODES
from akocore.schemes.registry import SCHEMES
from akocore.settings.cli_flags import (
    add_akorun_arguments,
    add_akosim_argument,
    add_shared_arguments,
    config_from_args,
    flag_layer,
    resolve_args,
    workload_arg_layer,
)
from akocore.settings.key_registry import Tool
from akocore.settings.layers import Given, Layer, Origin, ResolvedSettings, resolve
from akocore.settings.normalise import (
    EMULATE_MODES,
    OPTIMIZERS,
    REDUCTIONS,
    SCHEDULES,
    ConfigError,
)
from akocore.settings.schema import (
    AkorunConfig,
    AkosimConfig,
    ClusterConfig,
    ExchangeConfig,
    NetworkConfig,
    RunConfig,
    TrainConfig,
)
from akocore.settings.toml_io import (
    apply_overrides,
    config_from_dict,
    config_hash,
    config_to_dict,
    file_layer,
    load_config,
    parse_toml_text,
    read_toml,
    replace_in,
    set_layer,
)

__all__ = [
    "EMULATE_MODES",
    "OPTIMIZERS",
    "PS_MODES",
    "REDUCTIONS",
    "SCHEDULES",
    "SCHEMES",
    "AkorunConfig",
    "AkosimConfig",
    "ClusterConfig",
    "ConfigError",
    "ExchangeConfig",
    "Given",
    "Layer",
    "NetworkConfig",
    "Origin",
    "ResolvedSettings",
    "RunConfig",
    "Tool",
    "TrainConfig",
    "add_akorun_arguments",
    "add_akosim_argument",
    "add_shared_arguments",
    "apply_overrides",
    "config_from_args",
    "config_from_dict",
    "config_hash",
    "config_to_dict",
    "file_layer",
    "flag_layer",
    "workload_arg_layer",
    "load_config",
    "parse_toml_text",
    "read_toml",
    "replace_in",
    "resolve",
    "resolve_args",
    "set_layer",
]
