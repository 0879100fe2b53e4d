"""The scheme registry: every exchange scheme once, by name.

`REGISTRY` maps a name to its `Scheme` object (akocore.schemes.protocol);
`scheme_named` is how every other module gets at a scheme's builder,
settings, staleness bound, label and capabilities. This is the one module
allowed to know the schemes by name: adding a scheme is its module and one
entry in `_ALL` below.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

from akocore.schemes.ako import AKO
from akocore.schemes.allreduce import ALLREDUCE
from akocore.schemes.diloco import DILOCO, STREAMING_DILOCO
from akocore.schemes.protocol import Scheme
from akocore.schemes.ps_family import PS
from akocore.schemes.wagma import WAGMA

if TYPE_CHECKING:
    from akocore.settings.schema import ExchangeConfig

_ALL: tuple[Scheme, ...] = (AKO, PS, ALLREDUCE, WAGMA, DILOCO, STREAMING_DILOCO)

REGISTRY: Mapping[str, Scheme] = MappingProxyType({scheme.name: scheme for scheme in _ALL})
SCHEMES: tuple[str, ...] = tuple(REGISTRY)  # every value of exchange.scheme, in this order


def scheme_names() -> tuple[str, ...]:
    """Every value exchange.scheme takes, read from the registry when asked."""
    return tuple(REGISTRY)


def registered() -> Mapping[str, Scheme]:
    """Every registered scheme by name, read now (so a registry patched in a test is seen
    and then forgotten: callers never keep their own copy)."""
    return REGISTRY


def scheme_named(name: str) -> Scheme:
    """The scheme called `name`; ValueError naming the known ones otherwise."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"scheme: got {name!r}, expected one of "
                         f"{', '.join(scheme_names())}") from None


def staleness_bound_rounds(scheme: str, exchange: ExchangeConfig, *, p_max: int,
                           ssp: float) -> float:
    """The staleness bound of `scheme` run with `exchange`'s knobs, largest p and SSP bound."""
    return scheme_named(scheme).staleness_bound(exchange, p_max=p_max, ssp=ssp)


def scheme_label(exchange: ExchangeConfig) -> str:
    """The knobs that distinguish a run of the configured scheme, e.g. "G=4 tau=10"."""
    return scheme_named(exchange.scheme).label(exchange)


def is_partitioned(name: str) -> bool:
    """Whether runs of the scheme called `name` have a p (False for a name not known here,
    as a result file from elsewhere may hold)."""
    scheme = REGISTRY.get(name)
    return scheme is not None and scheme.partitioned


def has_servers(name: str) -> bool:
    """Whether runs of the scheme called `name` have server ranks that do not train."""
    scheme = REGISTRY.get(name)
    return scheme is not None and scheme.has_servers
