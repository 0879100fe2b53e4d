"""Named schemes: what ``--scheme NAME`` stands for, read from the registered schemes.

The core schemes (ako, ps, allreduce, wagma, ...) are state machines of their
own; the systems of the Distributed TensorFlow Guide and elastic averaging
are settings of the ps scheme. Each scheme lists its presets
(`Scheme.presets`, akocore.schemes.knobs.Preset: a name and the settings it
stands for, as TOML-shaped tables), and configs/presets/NAME.toml holds the
same settings as a file (a test checks that both resolve to the same run).
The settings layers expand a name where it is given (`--scheme adag`,
``scheme = "adag"`` in a file, ``--set exchange.scheme=adag``): its settings
count as given there, before that layer's other values, so any value given in
the same place or a higher layer wins (``--config`` with ``scheme = "adag"``
and ``push_every = 8`` is ADAG with lambda = 8).

`named_schemes` and `scheme_choices` read the registry when asked;
`NAMED_SCHEMES` and `SCHEME_NAMES` are those of the built-in schemes.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from akocore.schemes.knobs import Preset
from akocore.schemes.registry import SCHEMES as CORE_SCHEMES
from akocore.schemes.registry import registered

NamedScheme = Preset  # one name: the settings it stands for and a one-line description


def named_schemes() -> Mapping[str, Preset]:
    """Every registered scheme's presets by name, in registry order."""
    return MappingProxyType({named.name: named for scheme in registered().values()
                             for named in scheme.presets})


def scheme_choices() -> tuple[str, ...]:
    """Every value --scheme takes: the registered schemes, then the named ones that are
    not schemes of their own."""
    schemes = tuple(registered())
    return schemes + tuple(name for name in named_schemes() if name not in schemes)


NAMED_SCHEMES: Mapping[str, Preset] = named_schemes()
# every value --scheme takes: the core schemes, then the named ones that are not core
SCHEME_NAMES = scheme_choices()


def expansion(name: Any) -> Preset | None:
    """The named scheme `name` stands for; None for a registered scheme or anything else."""
    if not isinstance(name, str) or name in registered():
        return None
    return named_schemes().get(name)


__all__ = ["CORE_SCHEMES", "NAMED_SCHEMES", "SCHEME_NAMES", "NamedScheme", "expansion",
           "named_schemes", "scheme_choices"]
