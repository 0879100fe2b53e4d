"""What the akosim and akorun command lines share about user mistakes.

A user mistake (a bad flag, an unreadable config, a rank out of range) is
reported as ONE line on stderr, ``PROG: error: what was wrong``, and exit
status 2 (`EXIT_USAGE`), never a traceback. `UsageError` carries such a
mistake from deep inside a command to its entry point; `OneLineParser` is the
argparse parser whose own errors look the same; `fail` prints and exits.
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

EXIT_USAGE = 2


class UsageError(Exception):
    """What the user gave was wrong; the message says what and what is allowed."""


def one_line(error: BaseException | str) -> str:
    """The text of an error on one line (newlines and runs of spaces become one space)."""
    return " ".join(str(error).split())


def fail(message: str, prog: str) -> NoReturn:
    """A user mistake: one line on stderr, exit status 2."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    raise SystemExit(EXIT_USAGE)


class OneLineParser(argparse.ArgumentParser):
    """argparse whose usage errors are one line, ``PROG: error: ... (see PROG --help)``,
    and exit 2, like every other mistake."""

    def error(self, message: str) -> NoReturn:
        fail(f"{message} (see {self.prog} --help)", self.prog)
