"""The keyword settings of a Python call as a settings layer, and the signature they give.

A public call (``akosim.plan``, ``akorun.launch``, ...) takes every run setting its
command offers by the key's name (``workers=8``, ``bandwidth="40mbps"`` or ``40e6`` in
SI, ``p="auto"``), the settings with no flag whose name no other section shares
(``eval_every=20``), ``site`` / ``between`` / ``workload_args`` (the sites and the
workload's arguments), a settings file and ``overrides`` (dotted keys,
``{"exchange.ssp": 2}``). They enter `akocore.settings.layers.resolve` directly, with
no flag text in between: the file as the FILE layer, the overrides as the SET layer and
the keywords as the API layer, whose origin says "api" (``--show-config``, the record).

`takes_settings` gives the call a signature that lists those settings by name, with
their types (units as text or SI numbers) and None ("not given: the layer below
decides"), read from the key registry, so that ``help()`` and ``inspect.signature``
name every setting a call takes; `api_layer` turns the keywords into the layer.
"""

from __future__ import annotations

import inspect
import os
import types
import typing
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from akocore.settings.key_registry import (
    RUN_SECTIONS,
    SECTION_TYPES,
    FlagKind,
    Key,
    Tool,
    current,
)
from akocore.settings.layers import WORKLOAD_TABLE, Given, Layer
from akocore.settings.sites import BETWEEN_TABLE, SITE_TABLE
from akocore.settings.toml_io import file_layer, split_dotted

F = TypeVar("F", bound=Callable[..., Any])
API_SOURCE = "api"  # the origin of a keyword setting: "api: workers=8"
# keywords beside the registry's keys: the sites, the link between them, the workload's
# arguments (--site, --between, --workload-arg on the command line)
SITE_KEYWORDS: dict[str, Any] = {
    "site": str | Sequence[str] | None,
    "between": str | None,
    "workload_args": Mapping[str, Any] | None,
}


def settings_keys(tools: Iterable[Tool]) -> dict[str, Key]:
    """Keyword name -> Key of the settings a call of `tools` takes: every key with a flag
    one of the tools offers, then the run settings with no flag whose name is unique
    across the run sections (eval_every -> train.eval_every)."""
    wanted = frozenset(tools)
    keys = current().keys
    named: dict[str, Key] = {keyword_of(key): key for key in keys
                             if key.flag is not None and key.tools & wanted}
    flagless: dict[str, list[Key]] = {}
    for key in keys:
        if key.section in RUN_SECTIONS:
            flagless.setdefault(key.name, []).append(key)
    for name, found in flagless.items():
        if len(found) == 1 and name not in named and found[0].flag is None:
            named[name] = found[0]
    return named


def _field_type(key: Key) -> Any:
    holder = key.holder or SECTION_TYPES[key.section]
    try:
        hints = typing.get_type_hints(holder)
    except (NameError, TypeError):  # a plugin's forward reference: say nothing wrong
        return Any
    return hints.get(key.name if key.table else key.field, Any)


def annotation(key: Key) -> Any:
    """The type a call takes `key` as: its field's type, a tuple's items also one by one
    or as any sequence, a value with a unit also as text ("40mbps"); None (not given)."""
    kinds: list[Any] = []
    field_type = _field_type(key)
    union_kinds = (typing.get_args(field_type)
                   if typing.get_origin(field_type) in (typing.Union, types.UnionType)
                   else (field_type,))
    for kind in union_kinds:
        if kind is type(None):
            continue
        items = typing.get_args(kind)
        if typing.get_origin(kind) is tuple and items:
            kinds += [items[0], Sequence[items[0]]]  # type: ignore[valid-type]
        else:
            kinds.append(kind)
    if key.unit:
        kinds.append(str)
    if key.kind is FlagKind.SWITCH:  # --NAME / --no-NAME: True is "on", False "off"
        kinds.append(bool)
    union: Any = kinds[0]
    for kind in dict.fromkeys(kinds[1:]):
        union = union | kind
    return union | None


def keyword_of(key: Key) -> str:
    """The keyword a call takes `key` by: its flag's name (``network_model`` for
    ``--network-model``), else its name."""
    return key.flag.removeprefix("--").replace("-", "_") if key.flag else key.name


def settings_parameters(tools: Iterable[Tool], *, without: Collection[str] = ()
                        ) -> list[inspect.Parameter]:
    """The keyword-only parameters of `tools`' settings (default None: not given)."""
    keyword = inspect.Parameter.KEYWORD_ONLY
    params = [inspect.Parameter(name, keyword, default=None, annotation=annotation(key))
              for name, key in settings_keys(tools).items() if name not in without]
    params += [inspect.Parameter(name, keyword, default=None, annotation=kind)
               for name, kind in SITE_KEYWORDS.items() if name not in without]
    return params


def takes_settings(*tools: Tool, options: Sequence[Callable[..., Any]] = ()
                   ) -> Callable[[F], F]:
    """Give the decorated call (``def plan(config=None, *, overrides=None, ...,
    **settings)``) a signature that lists, after its own parameters, the keyword-only
    parameters of the functions in `options` (typed options of the application layer,
    with their defaults) and the settings of `tools`; its ``**settings`` takes them."""

    def decorate(call: F) -> F:
        own = [_evaluated(p, call) for p in inspect.signature(call).parameters.values()
               if p.kind is not inspect.Parameter.VAR_KEYWORD]
        names = {p.name for p in own}
        extra: list[inspect.Parameter] = []
        for option in options:
            extra += [_evaluated(p, option) for p in inspect.signature(option).parameters.values()
                      if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name not in names]
        names |= {p.name for p in extra}
        extra += settings_parameters(tools, without=names)
        returns = _evaluated_text(inspect.signature(call).return_annotation, call)
        call.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [*own, *extra], return_annotation=returns)
        return call

    return decorate


def _evaluated(parameter: inspect.Parameter, owner: Callable[..., Any]) -> inspect.Parameter:
    return parameter.replace(annotation=_evaluated_text(parameter.annotation, owner))


def _evaluated_text(text: Any, owner: Callable[..., Any]) -> Any:
    """An annotation written as text (``from __future__ import annotations``) as the type
    it names in `owner`'s module, or the text when it names one imported for type
    checking only."""
    if not isinstance(text, str):
        return text
    try:
        return eval(text, getattr(owner, "__globals__", {}))  # noqa: S307 (own source)
    except Exception:  # a name imported under TYPE_CHECKING: keep the text
        return text


def typed(call: F) -> F:
    """Give `call` the signature its source writes, its annotations evaluated (types, not
    the text ``from __future__ import annotations`` leaves), for a call that takes no
    registry settings beside its own parameters."""
    signature = inspect.signature(call)
    call.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[_evaluated(p, call) for p in signature.parameters.values()],
        return_annotation=_evaluated_text(signature.return_annotation, call))
    return call


def api_layer(settings: Mapping[str, Any], tools: Iterable[Tool], call: str, *,
              options: Collection[str] = ()) -> list[Given]:
    """Keyword settings as the API layer (None: not given); TypeError for a keyword no
    setting of `tools` has, naming those there are (and the call's own `options`)."""
    keys = settings_keys(tools)
    givens: list[Given] = []
    for name, value in settings.items():
        if value is None:
            continue
        source = f"{API_SOURCE}: {name}={_shown(value)}"
        if name == "site":
            sites = [value] if isinstance(value, str) else list(value)
            givens.append(Given(f"{SITE_TABLE}.list", sites, Layer.API, source))
        elif name == "between":
            givens.append(Given(f"{BETWEEN_TABLE}.link", value, Layer.API, source))
        elif name == "workload_args":
            givens += [Given(f"{WORKLOAD_TABLE}.{arg}", arg_value, Layer.API,
                             f"{API_SOURCE}: workload_args[{arg!r}]")
                       for arg, arg_value in dict(value).items()]
        elif name in keys:
            plain = list(value) if isinstance(value, tuple) else value
            if keys[name].kind is FlagKind.SWITCH and isinstance(value, bool):
                plain = "on" if value else "off"  # as the flag and its --no- twin say
            givens.append(Given(keys[name].dotted, plain, Layer.API, source))
        elif name == "set":
            raise TypeError(f"{call}: no setting 'set'; dotted settings are "
                            f"overrides={{'section.key': value}}")
        else:
            known = ", ".join(sorted({*keys, *SITE_KEYWORDS, *options}))
            raise TypeError(f"{call}: no setting {name!r}; the settings are {known}")
    return givens


def config_layers(config: str | os.PathLike[str] | None,
                  overrides: Mapping[str, Any] | None) -> list[Given]:
    """A call's settings file (the FILE layer) and its dotted overrides (the SET layer,
    ``{"exchange.ssp": 2, "exchange.diloco.inner_steps": 5}``)."""
    givens = file_layer(os.fspath(config)) if config is not None else []
    for dotted, value in (overrides or {}).items():
        section, name = split_dotted(dotted, f"overrides {dotted!r}")
        plain = list(value) if isinstance(value, tuple) else value
        givens.append(Given(f"{section}.{name}", plain, Layer.SET,
                            f"{API_SOURCE}: overrides[{dotted!r}]"))
    return givens


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
