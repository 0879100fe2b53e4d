"""Launching: the CLI, cluster files, the local launcher, merging runs, the netns testbed.

``akorun.launch(out=..., **settings)`` is also the public call (akorun.run_api.launch):
calling this package launches every rank on this machine, while ``akorun.launch``
stays the package (the attribute of a package is its subpackage once imported).
"""

from __future__ import annotations

import sys
import types
from importlib import import_module
from typing import Any


class _CallablePackage(types.ModuleType):
    """This package, callable: ``akorun.launch(...)`` is akorun.run_api.launch."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # looked up by name when called: the API is built on this package
        return import_module("akorun.run_api").launch(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
