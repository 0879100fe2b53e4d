"""Named schemes: what ``--scheme NAME`` stands for, defined once.

The core schemes (ako, ps, allreduce, wagma) are state machines of their own;
the systems of the Distributed TensorFlow Guide and elastic averaging are
settings of the ps scheme. `NAMED_SCHEMES` maps each name to the settings it
stands for, as TOML-shaped tables ({"exchange": {...}, "train": {...}}), and
configs/presets/NAME.toml holds the same settings as a file (a test checks
that both resolve to the same run). The settings layers expand a name where
it is given (`--scheme adag`, ``scheme = "adag"`` in a file, ``--set
exchange.scheme=adag``): its settings count as given there, before that
layer's other values, so any value given in the same place or a higher layer
wins (``--config`` with ``scheme = "adag"`` and ``push_every = 8`` is ADAG
with lambda = 8).

This module imports only the scheme registry (the core names), so the
settings layers can read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from akocore.schemes.registry import SCHEMES as CORE_SCHEMES


@dataclass(frozen=True)
class NamedScheme:
    """One name: the settings it stands for and a one-line description."""

    name: str
    summary: str
    tables: Mapping[str, Mapping[str, Any]]  # {"exchange": {"scheme": "ps", ...}, ...}

    @property
    def core_scheme(self) -> str:
        """The state machine that runs it (exchange.scheme after expansion)."""
        return str(self.tables["exchange"]["scheme"])


def _named(name: str, summary: str, exchange: Mapping[str, Any],
           train: Mapping[str, Any] | None = None) -> NamedScheme:
    tables: dict[str, Mapping[str, Any]] = {"exchange": MappingProxyType(dict(exchange))}
    if train:
        tables["train"] = MappingProxyType(dict(train))
    return NamedScheme(name, summary, MappingProxyType(tables))


_ASYNC_PS = {"scheme": "ps", "ps_servers": 1, "ps_mode": "async", "ssp": "inf"}

NAMED_SCHEMES: Mapping[str, NamedScheme] = MappingProxyType({named.name: named for named in (
    _named("wagma", "WAGMA-SGD: wait-avoiding butterfly group model averaging, G = 4, "
           "global average every tau = 10 rounds",
           {"scheme": "wagma", "group_size": 4, "global_every": 10}),
    _named("easgd", "asynchronous elastic averaging (AEASGD): pulled towards the server's "
           "centre every tau = 4 rounds",
           {"scheme": "ps", "ps_servers": 1, "ps_mode": "elastic", "push_every": 4,
            "elastic_alpha": 0}),
    _named("hogwild", "Hogwild: asynchronous ps, push and fetch every round, lock-free",
           {**_ASYNC_PS, "push_every": 1, "fetch_every": 1}),
    _named("downpour", "DOWNPOUR: local Adagrad steps, push every 2, fetch every 4, "
           "asynchronous", {**_ASYNC_PS, "local_steps": True, "push_every": 2,
                             "fetch_every": 4},
           {"optimizer": "adagrad"}),
    _named("adag", "ADAG / AGN: lambda = 4 local steps, push the update / lambda, "
           "asynchronous", {**_ASYNC_PS, "local_steps": True, "push_average": True,
                             "push_every": 4, "fetch_every": 4}),
    _named("sdag", "SDAG / SAGN: lambda = 4 local steps, push the update / lambda, "
           "synchronous mean", {"scheme": "ps", "ps_servers": 1, "ps_mode": "sync",
                                 "local_steps": True, "push_average": True,
                                 "push_every": 4}),
    _named("sync-sgd", "synchronous SGD: every round the server applies the mean gradient",
           {"scheme": "ps", "ps_servers": 1, "ps_mode": "sync"}),
    _named("sync-sgd-lr-per-worker", "synchronous SGD, worker i's gradient scaled by "
           "worker_lr_scale[i] (1, 1, 0.5, 0.5 in turn)",
           {"scheme": "ps", "ps_servers": 1, "ps_mode": "sync",
            "worker_lr_scale": [1.0, 1.0, 0.5, 0.5]}),
)})

# every value --scheme takes: the core schemes, then the named ones that are not core
SCHEME_NAMES = CORE_SCHEMES + tuple(name for name in NAMED_SCHEMES if name not in CORE_SCHEMES)


def expansion(name: Any) -> NamedScheme | None:
    """The named scheme `name` stands for; None for a core scheme or anything else."""
    if not isinstance(name, str) or name in CORE_SCHEMES:
        return None
    return NAMED_SCHEMES.get(name)
