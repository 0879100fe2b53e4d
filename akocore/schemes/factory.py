"""How to build the nodes of one run: `SchemeSpec` and `build_nodes`.

`SchemeSpec` says what a run exchanges; `build_nodes` lays out its nodes
(ranks 0..workers-1, servers last) through the scheme's own builder, found
in the scheme registry (akocore.schemes.registry), and puts the run's codec
on every node's sends (akocore.codecs.exchange). Adding a scheme touches
neither this module nor its callers.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from akocore.codecs.codec_registry import codec_named
from akocore.codecs.exchange import attach_codec
from akocore.optim import FlatOptimizer
from akocore.schemes.base import Replica, SchemeNode
from akocore.schemes.knobs import SchemeSettings
from akocore.schemes.protocol import Scheme, SettingsT
from akocore.schemes.registry import SCHEMES, scheme_named


@dataclass(frozen=True)
class SchemeSpec:
    """Everything needed to build the nodes of one run."""

    scheme: str = "ako"
    workers: int = 4  # total nodes (ps: workers + servers)
    p_of: tuple[int, ...] = (1,)  # ako: one per worker, or one for all
    staleness: float = 0.0
    schedule: str = "staggered"
    reduce: str = "mean"
    ps_servers: int = 1  # the servers of a scheme that has them (exchange.ps_servers resolved)
    wait_avoiding: bool = True  # wagma: False = synchronous group collectives
    # the scheme's own exchange keys that are not fields above, (name, value) in the order
    # of its `keys`: what `knobs` reads over the defaults when `settings` is None
    options: tuple[tuple[str, Any], ...] = ()
    # the scheme's settings object (akocore.resolve.scheme_spec gives the configured one)
    settings: SchemeSettings | None = None
    codec: str = "none"  # what every coded send carries (akocore.codecs), e.g. "int8"

    def __init__(self, *args: Any, **values: Any) -> None:
        """The fields in order or by name; any other keyword is a knob of the scheme's
        settings (``SchemeSpec("ps", 4, ps_mode="async")``), kept in `options`."""
        items = dataclasses.fields(self)
        if len(args) > len(items):
            raise TypeError(f"SchemeSpec takes at most {len(items)} positional arguments")
        for item, arg in zip(items, args, strict=False):
            if item.name in values:
                raise TypeError(f"SchemeSpec got multiple values for {item.name!r}")
            values[item.name] = arg
        for item in items:
            value = values.pop(item.name) if item.name in values else item.default
            object.__setattr__(self, item.name, value)
        if values:
            object.__setattr__(self, "options", (*self.options, *values.items()))
        self.__post_init__()

    def __post_init__(self) -> None:
        scheme_named(self.scheme)  # ValueError naming the known schemes
        object.__setattr__(self, "codec", codec_named(self.codec).name)
        if self.workers < 2:
            raise ValueError(f"workers: got {self.workers}, expected >= 2")
        if self.staleness < 0:
            raise ValueError(f"ssp: got {self.staleness}, expected >= 0 or inf")
        self.kind.check_spec(self)

    @property
    def kind(self) -> Scheme:
        """The scheme object of `scheme` (its builder, bound, label, capabilities)."""
        return scheme_named(self.scheme)

    @property
    def training_workers(self) -> int:
        """Nodes that compute gradients (all but the servers of a scheme that has them)."""
        return self.workers - self.kind.servers(self.ps_servers)

    def knobs(self, kind: type[SettingsT]) -> SettingsT:
        """The scheme's settings of `kind`: `settings` when it is one, else the defaults
        with `options` over them (a spec made by hand)."""
        if isinstance(self.settings, kind):
            return self.settings
        names = kind.names()
        return kind(**{name: value for name, value in self.options if name in names})

    def option(self, name: str, default: Any = None) -> Any:
        """The value of the scheme's own exchange key `name` (see `options`)."""
        return dict(self.options).get(name, default)

    def p_list(self) -> tuple[int, ...]:
        if len(self.p_of) == 1:
            return self.p_of * self.workers
        if len(self.p_of) != self.workers:
            raise ValueError(f"p: got {len(self.p_of)} values, expected 1 or {self.workers}")
        return self.p_of


def build_nodes(spec: SchemeSpec, length: int, params0: np.ndarray | None,
                optimizer: FlatOptimizer | None, *, only: int | None = None) -> list[SchemeNode]:
    """All nodes of a run, ranks 0..workers-1 (servers last).

    With `only`, every other rank's node is timing-only (no parameters): what
    one process of a real run needs, as `build_node` returns it.
    """

    def replica(rank: int, params: np.ndarray | None) -> Replica:
        if params is None or (only is not None and rank != only):
            return Replica(None, None)
        return Replica(params, optimizer)

    if params0 is not None and params0.shape != (length,):
        raise ValueError(f"initial parameters must have shape ({length},)")
    nodes = spec.kind.build(spec, length, params0, replica)
    codec = codec_named(spec.kind.wire_codec(spec))
    for node in nodes:  # the one place a codec meets a scheme's sends
        attach_codec(node, codec)
    return nodes


def build_node(spec: SchemeSpec, rank: int, length: int, params0: np.ndarray,
               optimizer: FlatOptimizer) -> SchemeNode:
    """Rank's node, as build_nodes(spec, ...)[rank] would build it."""
    if not 0 <= rank < spec.workers:
        raise ValueError(f"rank: got {rank}, expected 0..{spec.workers - 1}")
    return build_nodes(spec, length, params0, optimizer, only=rank)[rank]


__all__ = ["SCHEMES", "SchemeSpec", "build_node", "build_nodes"]
