"""The kinds of failure an akorun command reports, and their exit statuses.

`UsageError` is a user mistake (a bad flag value, an unreadable config, a rank
out of range, a port in use): the CLI prints its message as ONE line on stderr
and exits with status 2; it is akocore.cli_support's, the same class akosim
raises. `RunError` is a run that could not complete (a peer refused the
handshake, a join timed out, a worker failed): one line, status 1.
`Interrupted` is a run stopped early on request: status 130.
Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

from akocore.cli_support import EXIT_USAGE, UsageError

__all__ = ["EXIT_INTERRUPTED", "EXIT_OK", "EXIT_RUN_FAILED", "EXIT_USAGE", "Interrupted",
           "RunError", "UsageError"]

EXIT_OK = 0
EXIT_RUN_FAILED = 1
EXIT_INTERRUPTED = 130


class RunError(Exception):
    """The run could not complete; the message says why and what to look at."""


class Interrupted(Exception):
    """Stopped early by a signal (Ctrl-C, SIGTERM) or a timeout; results were written."""
