"""The scheme registry: every exchange scheme once, by name.

`REGISTRY` maps a name to its `Scheme` object (akocore.schemes.protocol);
`scheme_named` is how every other module gets at a scheme's builder,
settings, staleness bound, label and capabilities. This is the one module
allowed to know the schemes by name: adding a scheme is its module (with its
settings class, akocore.schemes.knobs) and one entry in `_ALL` below. The
settings layers read every registered scheme's settings from here
(`settings_tables`): the TOML tables, the keys, the flags and the reference.

A scheme from outside the toolkit joins with `register` (for good: what a
module named by ``$AKO_SCHEME_MODULES`` does when the shells start, see
`load_scheme_modules`) or `registering` as a context (for the length of a
test).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from types import MappingProxyType

from akocore.schemes.ako import AKO
from akocore.schemes.allreduce import ALLREDUCE
from akocore.schemes.diloco import DILOCO, STREAMING_DILOCO
from akocore.schemes.knobs import SchemeSettings
from akocore.schemes.noloco import NOLOCO
from akocore.schemes.protocol import ExchangeView, Scheme
from akocore.schemes.ps_family import PS
from akocore.schemes.quorum_diloco import QUORUM_DILOCO
from akocore.schemes.sparseloco import SPARSELOCO
from akocore.schemes.sparta import SPARTA
from akocore.schemes.wagma import WAGMA

_ALL: tuple[Scheme, ...] = (AKO, PS, ALLREDUCE, WAGMA, DILOCO, STREAMING_DILOCO,
                            QUORUM_DILOCO, SPARSELOCO, SPARTA, NOLOCO)

REGISTRY: Mapping[str, Scheme] = MappingProxyType({scheme.name: scheme for scheme in _ALL})
SCHEMES: tuple[str, ...] = tuple(REGISTRY)  # the built-in values of exchange.scheme
SCHEME_MODULES_ENV = "AKO_SCHEME_MODULES"  # modules whose SCHEMES the shells register
# exchange keys every scheme shares: no table or knob may take these names
SHARED_EXCHANGE_KEYS = ("scheme", "p", "ssp", "schedule", "reduce", "utilisation", "p_max",
                        "codec")


def scheme_names() -> tuple[str, ...]:
    """Every value exchange.scheme takes, read from the registry when asked."""
    return tuple(REGISTRY)


def registered() -> Mapping[str, Scheme]:
    """Every registered scheme by name, read now (so a registry patched in a test is seen
    and then forgotten: callers never keep their own copy)."""
    return REGISTRY


def settings_tables() -> dict[str, type[SchemeSettings]]:
    """Every registered scheme's settings class by its table ([exchange.<table>]), in
    registry order; schemes that share a class (diloco, streaming-diloco) share its table."""
    tables: dict[str, type[SchemeSettings]] = {}
    for scheme in REGISTRY.values():
        if scheme.settings is not None:
            tables.setdefault(scheme.settings.table, scheme.settings)
    return tables


def _checked(schemes: Iterable[Scheme]) -> dict[str, Scheme]:
    """The registry with `schemes` added; ValueError when a name, a table or a knob is
    taken (a knob's name is also its key exchange.<name>, so it is unique)."""
    added = dict(REGISTRY)
    for scheme in schemes:
        if not isinstance(scheme, Scheme):
            raise ValueError(f"register: got {scheme!r}, expected a Scheme object")
        if scheme.name in added and added[scheme.name] is not scheme:
            raise ValueError(f"scheme {scheme.name!r} is registered already")
        added[scheme.name] = scheme
    owner: dict[str, str] = {name: "the shared exchange keys" for name in SHARED_EXCHANGE_KEYS}
    seen: dict[str, type[SchemeSettings]] = {}
    for scheme in added.values():
        kind = scheme.settings
        if kind is None or seen.get(kind.table) is kind:
            continue
        if kind.table in seen or kind.table in owner:
            raise ValueError(f"scheme {scheme.name}: settings table {kind.table!r} is taken")
        seen[kind.table] = kind
        for name in kind.names():
            if name in owner:
                raise ValueError(f"scheme {scheme.name}: knob {name!r} is taken by "
                                 f"{owner[name]}")
            owner[name] = f"[exchange.{kind.table}]"
    return added


def register(*schemes: Scheme) -> None:
    """Add `schemes` to the registry for the rest of the process."""
    global REGISTRY
    REGISTRY = MappingProxyType(_checked(schemes))


@contextmanager
def registering(*schemes: Scheme) -> Iterator[None]:
    """`schemes` in the registry inside the block, and the registry as it was after."""
    global REGISTRY
    before = REGISTRY
    REGISTRY = MappingProxyType(_checked(schemes))
    try:
        yield
    finally:
        REGISTRY = before


def load_scheme_modules(names: str | Iterable[str]) -> None:
    """Import each module named (comma-separated text, or a list) and register the
    schemes of its ``SCHEMES`` tuple: how a scheme from outside the toolkit reaches
    every process of a run (the shells pass ``$AKO_SCHEME_MODULES``)."""
    items = names.split(",") if isinstance(names, str) else list(names)
    for name in (item.strip() for item in items):
        if not name:
            continue
        try:
            module = importlib.import_module(name)
        except ImportError as error:
            raise ValueError(f"{SCHEME_MODULES_ENV}: cannot import {name!r}: {error}") from None
        schemes = getattr(module, "SCHEMES", None)
        if not isinstance(schemes, tuple | list):
            raise ValueError(f"{SCHEME_MODULES_ENV}: module {name!r} has no SCHEMES tuple "
                             f"of Scheme objects")
        register(*(scheme for scheme in schemes if REGISTRY.get(scheme.name) is not scheme))


def scheme_named(name: str) -> Scheme:
    """The scheme called `name`; ValueError naming the known ones otherwise."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"scheme: got {name!r}, expected one of "
                         f"{', '.join(scheme_names())}") from None


def staleness_bound_rounds(scheme: str, exchange: ExchangeView, *, p_max: int,
                           ssp: float) -> float:
    """The staleness bound of `scheme` run with `exchange`'s knobs, largest p and SSP bound."""
    return scheme_named(scheme).staleness_bound(exchange, p_max=p_max, ssp=ssp)


def wire_codec(exchange: ExchangeView) -> str:
    """The codec the configured scheme's sends carry: exchange.codec, or the one the
    scheme names from its own settings (`Scheme.wire_codec`)."""
    return scheme_named(exchange.scheme).wire_codec(exchange)


def is_partitioned(name: str) -> bool:
    """Whether runs of the scheme called `name` have a p (False for a name not known here,
    as a result file from elsewhere may hold)."""
    scheme = REGISTRY.get(name)
    return scheme is not None and scheme.partitioned


def has_servers(name: str) -> bool:
    """Whether runs of the scheme called `name` have server ranks that do not train."""
    scheme = REGISTRY.get(name)
    return scheme is not None and scheme.has_servers
