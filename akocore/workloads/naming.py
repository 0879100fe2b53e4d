"""One way to name a workload everywhere: a built-in name or the user's factory.

This module owns reading ``--workload`` / ``train.workload`` and turning it into a
`Workload`:

- ``NAME`` is a built-in (akocore.workloads.builtin), ``NAME:key=value,...`` a
  built-in with options (the older form, kept: its part after the colon holds ``=``);
- ``package.module:factory`` imports a module on ``sys.path``;
- ``path/to/file.py:factory`` imports a file (relative to the working directory;
  its folder goes first on ``sys.path`` so it can import its neighbours).

- ``<object>:NAME`` is a `Workload` object a Python call was given (``akosim.plan(
  workload=my_workload)``), kept by `given_workload_name` in this process's table of
  given objects (never a module: no file or import stands behind it).

The factory's arguments are ``--workload-arg key=value`` (repeatable), a
``:key=value,...`` tail after the factory (``mymodel.py:make:width=64``), or both
(the flag wins). A factory may also take ``seed`` (the run's seed) and
``data_path`` (``train.data_path``): they are passed when its signature names them.
Every failure (no such file or module, no such function, the factory raising or
returning something else than a Workload) is a `WorkloadError` of one line naming
the factory. Importing the user's code is the one impure thing here; both shells
name workloads through this module so every rank loads the same one.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from akocore.data.catalog import DataError
from akocore.workloads.builtin import BUILTIN_NAMES, builtin_workload
from akocore.workloads.spec import Workload

_IDENTIFIER = re.compile(r"[A-Za-z_]\w*\Z")
FORMS = ("a built-in name (" + ", ".join(BUILTIN_NAMES) + "), package.module:factory "
         "or path/to/file.py:factory")


GIVEN_SOURCE = "<object>"  # the "module" of a Workload object given to a Python call
_GIVEN: dict[str, Workload] = {}  # this process's given objects, by factory name


def given_workload_name(workload: Workload) -> str:
    """The name ``<object>:NAME`` under which this process keeps `workload` (a Workload
    object a Python call was given), so that the settings can carry it; the same object
    keeps its name. TypeError for anything but an `akocore.Workload`."""
    if not isinstance(workload, Workload):
        raise TypeError(f"workload: expected a name or an akocore.Workload, got "
                        f"{type(workload).__name__}")
    for factory, kept in _GIVEN.items():
        if kept is workload:
            return f"{GIVEN_SOURCE}:{factory}"
    stem = re.sub(r"\W", "_", workload.name or "workload").strip("_") or "workload"
    factory = f"{stem if stem[0].isalpha() else 'w'}_{len(_GIVEN) + 1}"
    _GIVEN[factory] = workload
    return f"{GIVEN_SOURCE}:{factory}"


class WorkloadError(ValueError):
    """A workload could not be named, imported or built (one line for the user)."""


@dataclass(frozen=True)
class WorkloadName:
    """A parsed workload name: a built-in or a factory, with its arguments."""

    text: str  # as given, without arguments: "digits-mlp", "mymodel.py:make"
    builtin: str | None  # the built-in's name, or None for a factory
    source: str = ""  # module path or file of a factory
    factory: str = ""  # the factory's name
    args: tuple[tuple[str, Any], ...] = ()

    @property
    def is_file(self) -> bool:
        return self.source.endswith(".py") or "/" in self.source or os.sep in self.source


def parse_workload_name(text: str, args: Mapping[str, Any] | None = None) -> WorkloadName:
    """Read a workload name; `args` (from --workload-arg) override those of the text."""
    text = text.strip()
    if not text:
        raise WorkloadError(f"an empty workload name; expected {FORMS}")
    head, colon, rest = text.partition(":")
    extra = dict(args or {})
    if not colon:
        if head in BUILTIN_NAMES:
            return WorkloadName(head, head, args=tuple(sorted(extra.items())))
        raise WorkloadError(f"unknown workload {head!r}; expected {FORMS}")
    factory, _, tail = rest.partition(":")
    if head in BUILTIN_NAMES or "=" in factory or not factory.strip():  # NAME:key=value,...
        if head not in BUILTIN_NAMES:
            raise WorkloadError(f"unknown workload {head!r}; key=value options follow a "
                                f"built-in name; expected {FORMS}")
        options = {**parse_options(rest, text), **extra}
        return WorkloadName(head, head, args=tuple(sorted(options.items())))
    factory = factory.strip()
    if not _IDENTIFIER.match(factory):
        raise WorkloadError(f"workload {text!r}: {factory!r} is not a Python function name; "
                            f"expected {FORMS}")
    options = {**parse_options(tail, text), **extra}
    return WorkloadName(f"{head}:{factory}", None, head, factory,
                        tuple(sorted(options.items())))


def parse_options(text: str, spec: str) -> dict[str, Any]:
    """ "key=value,key=value" -> options. Values: "16x16x1" -> (16, 16, 1), "64" -> 64,
    "0.5" -> 0.5, "true"/"false" -> bool, anything else stays a string."""
    options: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise WorkloadError(f"bad workload option {item!r} in {spec!r}; expected "
                                f"key=value, e.g. synthetic-mlp:train_size=2000")
        options[key.strip()] = parse_value(value.strip())
    return options


def parse_workload_args(items: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """``--workload-arg`` items ("key=value" each) -> arguments."""
    args: dict[str, Any] = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key.strip() or not _IDENTIFIER.match(key.strip()):
            raise WorkloadError(f"--workload-arg {item!r}: expected key=value with a Python "
                                f"name as key, e.g. --workload-arg width=64")
        args[key.strip()] = parse_value(value.strip())
    return args


def parse_value(text: str) -> Any:
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    parts = lowered.split("x")
    if len(parts) > 1 and all(p.isdigit() for p in parts):
        return tuple(int(p) for p in parts)
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return text


def load_workload_spec(name: WorkloadName, *, seed: int = 0,
                       data_path: str | None = None) -> Workload:
    """The `Workload` `name` stands for, or a WorkloadError of one line."""
    if name.builtin is not None:
        try:
            spec = builtin_workload(name.builtin, seed=seed, data_path=data_path,
                                    **dict(name.args))
        except DataError:
            raise
        except (ValueError, TypeError) as error:
            raise WorkloadError(str(error)) from None
        return replace(spec, name=name.text)
    if name.source == GIVEN_SOURCE:
        if name.factory not in _GIVEN:
            raise WorkloadError(f"workload {name.text}: no Workload object of that name was "
                                f"given to a Python call in this process")
        return replace(_GIVEN[name.factory], name=name.text)
    function = _import_factory(name)
    kwargs = dict(name.args)
    accepted = _parameters(function)
    for key, value in (("seed", seed), ("data_path", data_path)):
        if key in accepted and key not in kwargs and (value is not None or key == "seed"):
            kwargs[key] = value
    try:
        result = function(**kwargs)
    except Exception as error:  # the user's code: any failure is reported in one line
        raise WorkloadError(f"workload factory {name.text} raised "
                            f"{type(error).__name__}: {_one_line(error)}") from None
    if not isinstance(result, Workload):
        raise WorkloadError(f"workload factory {name.text} returned "
                            f"{type(result).__name__}, expected an akocore.Workload")
    return replace(result, name=name.text)


def cache_identity(text: str) -> str:
    """`text` plus a digest of the factory's source file, so a cache keyed by it (akosim's
    measured step) is not reused after the user edits the file; built-ins unchanged."""
    try:
        name = parse_workload_name(text)
    except WorkloadError:
        return text
    if name.builtin is not None or name.source == GIVEN_SOURCE:
        return text
    if name.is_file:
        origin: str | None = str(Path(name.source).expanduser().resolve())
    else:
        try:
            found = importlib.util.find_spec(name.source)
        except (ImportError, ValueError):
            found = None
        origin = found.origin if found is not None else None
    try:
        source = Path(origin).read_bytes() if origin else b""
    except OSError:
        source = b""
    return f"{text}@{hashlib.sha256(source).hexdigest()[:16]}"


def _parameters(function: Callable[..., Any]) -> set[str]:
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return set()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return {"seed", "data_path"}
    return {p.name for p in parameters}


def _import_factory(name: WorkloadName) -> Callable[..., Any]:
    if name.is_file:
        module = _import_file(name)
    else:
        try:
            module = importlib.import_module(name.source)
        except Exception as error:
            raise WorkloadError(f"workload factory {name.text}: cannot import module "
                                f"{name.source} ({type(error).__name__}: "
                                f"{_one_line(error)})") from None
    function = getattr(module, name.factory, None)
    if function is None:
        raise WorkloadError(f"workload factory {name.text}: {name.source} has no "
                            f"{name.factory}")
    if not callable(function):
        raise WorkloadError(f"workload factory {name.text}: {name.factory} in {name.source} "
                            f"is a {type(function).__name__}, not a function")
    return function


def _import_file(name: WorkloadName) -> Any:
    path = Path(name.source).expanduser().resolve()
    if not path.is_file():
        raise WorkloadError(f"workload factory {name.text}: no file {name.source} "
                            f"(looked for {path})")
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:12]
    module_name = f"akocore_user_workload_{path.stem}_{digest}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise WorkloadError(f"workload factory {name.text}: {name.source} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as error:
        del sys.modules[module_name]
        raise WorkloadError(f"workload factory {name.text}: importing {name.source} raised "
                            f"{type(error).__name__}: {_one_line(error)}") from None
    return module


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return text if len(text) <= 300 else text[:297] + "..."
