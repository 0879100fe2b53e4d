"""The Scheme protocol: what one exchange scheme is, as one object.

In the spirit of optax's GradientTransformation, a scheme is a small
interface; the scheme registry (akocore.schemes.registry) holds one object
per scheme and the named schemes (akocore.schemes.named) are presets of
their settings. Everything that differs between schemes is a hook or a
capability of that object, so that no other module compares scheme names:

- `build(spec, length, params0, replica)`: its nodes, ranks 0..workers-1
  (its state machines: akocore.schemes.base.SchemeNode);
- `presets`: the named schemes that stand for some of its settings
  (``--scheme adag``: ps with local steps, ...);
- `settings`: its settings class (akocore.schemes.knobs: every knob with its
  default, help, parser and flag; the settings layers generate the rest),
  `keys`: the ``exchange.*`` settings it reads (beside the shared scheme,
  ssp, reduce; by default its settings' knobs), `check_exchange`: how they
  must combine, and `check_spec`: what it refuses in a spec;
- `staleness_bound(exchange, p_max=, ssp=)`: its staleness bound in rounds;
  `lead_rounds(...)`: how far a worker can run ahead of its peers (by default the
  bound); `period_rounds(exchange)`: the rounds after which its waits repeat;
- `label(exchange)` / `variant_label(exchange)`: how tables name a run of it;
- `wire_codec(exchange)`: the codec its sends carry (exchange.codec unless
  the scheme names its own, as sparseloco does);
- capabilities the shells ask instead of its name: `partitioned` (the
  planner chooses p, and s with it), `has_servers` (the last ranks are
  servers that do not train), `needs_every_rank` (a lost rank stops the
  run), `rejoinable` (akorun's ``--resume`` and rejoin snapshots),
  `pattern` (the communication pattern, for closed forms), `compared` (in
  akosim's side-by-side comparison of every scheme).

Adding a scheme is one module (its node classes, its settings class and a
`Scheme` subclass instance) and one entry in the registry. The hooks see the
exchange settings as an `ExchangeView` (akocore.settings.schema's
ExchangeConfig is one): the shared keys, and a scheme's own settings object by
``exchange.knobs(ItsSettings)``. `Scheme` is a base class whose
defaults fit a scheme where every rank trains and nothing is stale; a
scheme overrides what differs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

import numpy as np

from akocore.schemes.base import Replica, SchemeNode
from akocore.schemes.knobs import Preset, SchemeSettings

if TYPE_CHECKING:
    from akocore.schemes.factory import SchemeSpec

SettingsT = TypeVar("SettingsT", bound=SchemeSettings)


class ExchangeView(Protocol):
    """What a scheme's hooks read of the exchange settings (ExchangeConfig is one)."""

    @property
    def scheme(self) -> str: ...

    @property
    def ssp(self) -> float: ...

    def knobs(self, kind: type[SettingsT]) -> SettingsT:
        """The settings object of `kind` (a scheme's settings class)."""
        ...

    def __getattr__(self, name: str) -> Any:
        """Any other exchange key by its name (flat: ``exchange.inner_steps``)."""
        ...


class CodecView(Protocol):
    """What `Scheme.wire_codec` reads: the run's exchange.codec and a scheme's settings
    (an ExchangeView and a SchemeSpec are both one)."""

    @property
    def codec(self) -> str: ...

    def knobs(self, kind: type[SettingsT]) -> SettingsT:
        """The settings object of `kind` (a scheme's settings class)."""
        ...


# (rank, its parameters or None) -> its replica
ReplicaOf = Callable[[int, np.ndarray | None], Replica]


class Scheme:
    """One exchange scheme: its nodes, settings, staleness bound, label and capabilities."""

    name: ClassVar[str]
    summary: ClassVar[str]
    settings: ClassVar[type[SchemeSettings] | None] = None  # its knobs: [exchange.<table>]
    presets: ClassVar[tuple[Preset, ...]] = ()  # names that stand for some of its settings
    pattern: ClassVar[str] = "peer-to-peer"  # "partial-all-to-all", "ring", "servers", ...
    partitioned: ClassVar[bool] = False  # one of p partitions per round: the planner picks p
    has_servers: ClassVar[bool] = False  # the last exchange.ps_servers ranks do not train
    needs_every_rank: ClassVar[bool] = False  # a lost rank stops the run
    rejoinable: ClassVar[bool] = False  # a rank can rejoin (--resume) and donate snapshots
    compared: ClassVar[bool] = True  # a run of it is in akosim's side-by-side comparison

    @property
    def keys(self) -> tuple[str, ...]:
        """The exchange.* keys it reads beyond the shared ones (its settings' knobs)."""
        return self.settings.names() if self.settings is not None else ()

    def check_spec(self, spec: SchemeSpec) -> None:
        """ValueError when `spec` cannot run this scheme (the shared checks are done)."""

    def check_exchange(self, exchange: ExchangeView) -> None:
        """ValueError ("exchange.KEY: got ..., expected ...") when its own keys do not
        combine (each key alone is checked by the settings)."""

    def servers(self, spec_servers: int) -> int:
        """How many of the nodes are servers, given exchange.ps_servers."""
        return spec_servers if self.has_servers else 0

    def build(self, spec: SchemeSpec, length: int, params0: np.ndarray | None,
              replica: ReplicaOf) -> list[SchemeNode]:
        """Every node of a run, ranks 0..spec.workers-1 (servers last)."""
        raise NotImplementedError(f"scheme {self.name} builds no nodes")

    def staleness_bound(self, exchange: ExchangeView, *, p_max: int, ssp: float) -> float:
        """The most rounds of the other workers' updates a worker's parameters can miss."""
        return 0.0

    def lead_rounds(self, exchange: ExchangeView, *, p_max: int, ssp: float) -> float:
        """The most rounds a worker can run ahead of its slowest live peer: how long its
        round time takes to settle (akosim's warm-up and timed rounds). By default the
        staleness bound; a scheme whose gate is tighter than its staleness (sparta waits
        every round, yet a parameter may go unaveraged for long) says so."""
        return self.staleness_bound(exchange, p_max=p_max, ssp=ssp)

    def period_rounds(self, exchange: ExchangeView) -> int:
        """Rounds after which its pattern of waits repeats (DiLoCo: H), so that figures
        per round are taken over whole periods."""
        return 1

    def effective_ssp(self, exchange: ExchangeView) -> float:
        """The SSP bound its workers gate with (exchange.ssp unless the scheme ignores it)."""
        return exchange.ssp

    def plan_grid(self, exchange: ExchangeView) -> Mapping[str, Sequence[Any]]:
        """Values of its own knobs the planner times beside the configured run, by key
        (e.g. {"topk_fraction": (0.01, 0.03)}), each changed alone, for knobs that trade
        bytes or staleness against learning in a way the staleness bound does not show;
        the planner also tries the integer knobs that move the bound (akosim.plan)."""
        return {}

    def wire_codec(self, setting: ExchangeView | CodecView) -> str:
        """The codec its sends carry (akocore.codecs): the run's exchange.codec, unless the
        scheme compresses its own messages and names its codec from its settings
        (sparseloco's chunked top-k); the factory puts it on the nodes and akorun's
        receivers take it."""
        return str(setting.codec)

    def label(self, exchange: ExchangeView) -> str:
        """The knobs that distinguish a run of this scheme, e.g. "G=4 tau=10"; "" if none."""
        return ""

    def variant_label(self, exchange: ExchangeView) -> str:
        """How a table names the configured run of this scheme."""
        return f"{self.name} {self.label(exchange)}".rstrip()

    def __repr__(self) -> str:
        return f"<scheme {self.name}>"
