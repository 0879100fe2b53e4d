"""What the akosim and akorun command lines share about user mistakes.

A user mistake (a bad flag, an unreadable config, a rank out of range) is
reported as ONE line on stderr, ``PROG: error: what was wrong``, and exit
status 2 (`EXIT_USAGE`), never a traceback. `UsageError` carries such a
mistake from deep inside a command to its entry point; `OneLineParser` is the
argparse parser whose own errors look the same; `fail` prints and exits.

`check_out_directory` and `check_out_file` refuse an ``--out`` that cannot be
written before a command does any work (one line, exit 2), never a traceback
after a run or a plan.

`OneLineParser` takes flags only whole (no prefix matching: ``--worker 8`` is
refused, not read as ``--workers 8``), on every subcommand too, and an unknown
flag gets a did-you-mean line from the flags of the (sub)command that was given.
"""

from __future__ import annotations

import argparse
import difflib
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from akocore.schemes.registry import SCHEME_MODULES_ENV, load_scheme_modules

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


def load_scheme_plugins(environ: Any, prog: str) -> None:
    """Register the schemes of the modules ``$AKO_SCHEME_MODULES`` names (comma-separated,
    each with a SCHEMES tuple), before any parser is built: how a scheme from outside
    the toolkit reaches akosim, akorun and every rank akorun starts. A module that
    cannot be imported or has no SCHEMES exits 2 with one line."""
    names = str(environ.get(SCHEME_MODULES_ENV, ""))
    if not names.strip():
        return
    try:
        load_scheme_modules(names)
    except ValueError as error:
        fail(one_line(error), prog)


_FLAG_OWNER = "_one_line_flag_owner"  # namespace key: the deepest (sub)command parsed


def did_you_mean(unknown: Sequence[str], known: Sequence[str]) -> str:
    """``did you mean --bandwidth?`` for the first unknown flag close to a known one, or ""."""
    for token in unknown:
        if not token.startswith("-"):
            continue
        flag = token.split("=", 1)[0]
        close = difflib.get_close_matches(flag, known, n=1, cutoff=0.6)
        if close:
            return f"did you mean {close[0]}?"
    return ""


class OneLineParser(argparse.ArgumentParser):
    """argparse whose usage errors are one line, ``PROG: error: ... (see PROG --help)``,
    and exit 2, like every other mistake; flags are taken only whole (``allow_abbrev``
    is off here and on every subparser, which are of this class too), and an unknown
    flag gets a did-you-mean suggestion."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None,
                         ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        if not hasattr(parsed, _FLAG_OWNER):  # a subcommand's parser has set it already
            setattr(parsed, _FLAG_OWNER, self)
        return parsed, extras

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        parsed, extras = self.parse_known_args(args, namespace)
        owner = getattr(parsed, _FLAG_OWNER, self)
        delattr(parsed, _FLAG_OWNER)
        if extras:
            message = f"unrecognized arguments: {' '.join(extras)}"
            hint = did_you_mean(extras, owner.known_flags())
            (owner if isinstance(owner, OneLineParser) else self).error(
                f"{message}; {hint}" if hint else message)
        return parsed

    def known_flags(self) -> list[str]:
        """The long flags this parser takes (its subcommands' not included)."""
        return sorted(flag for flag in self._option_string_actions if flag.startswith("--"))

    def error(self, message: str) -> NoReturn:
        fail(f"{message} (see {self.prog} --help)", self.prog)


def _writable_directory(directory: Path, what: str, *, keep: bool = True) -> None:
    """Make `directory` (and its parents) and write a scratch file in it; UsageError
    naming `what` (the flag and its value) and the reason if that fails. Without `keep`,
    the folders this made are removed again (the command makes them when it writes)."""
    ancestor = directory
    missing: list[Path] = []
    while not ancestor.exists() and ancestor != ancestor.parent:
        missing.append(ancestor)
        ancestor = ancestor.parent
    if ancestor.exists() and not ancestor.is_dir():
        raise UsageError(f"{what}: cannot write there ({ancestor} is a file, not a "
                         f"directory)")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".ako-write-check-"):
            pass
    except OSError as error:
        raise UsageError(f"{what}: cannot write there ({error.strerror or error}); give a "
                         f"path this user can write") from None
    finally:
        if not keep:
            for made in missing:  # deepest first
                try:
                    made.rmdir()
                except OSError:
                    break


def check_out_directory(directory: str | Path, flag: str = "--out", *,
                        keep: bool = True) -> None:
    """Refuse (UsageError, one line) a directory a command writes its results into
    that cannot be made or written; makes it (and its parents) otherwise, or, without
    `keep`, leaves no folder behind (a later refusal then leaves nothing either)."""
    _writable_directory(Path(directory), f"{flag} {directory}", keep=keep)


def check_out_file(path: str | Path, flag: str = "--out") -> None:
    """Refuse (UsageError, one line) a file a command writes at its end that it could
    not write: a directory, or in a folder that cannot be made or written (made here)."""
    target = Path(path)
    if target.is_dir():
        raise UsageError(f"{flag} {path}: is a directory; give a file name, e.g. "
                         f"{target / 'result.json'}")
    _writable_directory(target.parent, f"{flag} {path}")
