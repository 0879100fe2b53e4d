"""Optional extras: import a module that only an extra installs, or say how to get it.

`require(module, extra, purpose)` returns the imported module, or raises
`MissingExtra`, a user mistake (akocore.cli_support.UsageError: one line,
exit 2 in every command line) that names the extra and the command that
installs it, e.g. ``python -m analysis sweep: the plot needs matplotlib, in the
optional extra 'plot': pip install 'ako-toolkit[plot]'``. It is also an
ImportError, so code that already treats a missing module as "skip that part"
keeps working.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from akocore.cli_support import UsageError

DISTRIBUTION = "ako-toolkit"  # pyproject.toml's [project] name

__all__ = ["DISTRIBUTION", "MissingExtra", "install_command", "require"]


class MissingExtra(UsageError, ImportError):
    """A module of an optional extra is not installed; the message says how to install it."""

    def __init__(self, message: str, *, module: str, extra: str) -> None:
        super().__init__(message)
        self.module = module
        self.extra = extra


def install_command(extra: str) -> str:
    """The command that installs an extra, e.g. ``pip install 'ako-toolkit[plot]'``."""
    return f"pip install '{DISTRIBUTION}[{extra}]'"


def require(module: str, extra: str, purpose: str) -> ModuleType:
    """`module` imported, or MissingExtra: "`purpose` needs `module`, in the optional
    extra `extra`: pip install 'ako-toolkit[extra]'"."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        missing = MissingExtra(f"{purpose} needs {module.split('.')[0]}, in the optional extra "
                               f"'{extra}': {install_command(extra)}", module=module,
                               extra=extra)
        raise missing from error
