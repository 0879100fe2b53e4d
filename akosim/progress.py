"""Progress of akosim's long work (simulated rounds, sweep points) on standard error.

On a terminal a tqdm bar that redraws in place; elsewhere (a log file, CI, a pipe,
a notebook's captured stream) plain lines, one at most every `LINE_EVERY_S` per
task (a task done sooner says nothing: a plan times dozens of short ones), so a
long `akosim train` or sweep never sits silent; `--quiet` shows nothing.
`tracker_factory` gives what makes a task's tracker, `(label, total, unit)` -> a
callable that takes the count done so far.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

LINE_EVERY_S = 10.0  # plain lines: at most one per task this often (and at the end)

Update = Callable[[int], None]


class ProgressLines:
    """Plain progress lines for one task: ``akosim: LABEL: DONE/TOTAL UNIT (P%)``."""

    def __init__(self, label: str, total: int, unit: str, *, stream: TextIO | None = None,
                 every_s: float = LINE_EVERY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.label, self.total, self.unit = label.strip(), total, unit
        self.stream = stream
        self.every_s = every_s
        self.clock = clock
        self.next_s = clock() + every_s
        self.finished = False

    def __call__(self, done: int) -> None:
        if self.finished or self.clock() < self.next_s:
            return
        self.next_s = self.clock() + self.every_s
        self.finished = bool(self.total) and done >= self.total
        of = f"/{self.total}" if self.total else ""
        share = f" ({100 * done / self.total:.0f}%)" if self.total else ""
        stream = self.stream if self.stream is not None else sys.stderr
        stream.write(f"akosim: {self.label}: {done}{of} {self.unit}{share}\n")
        stream.flush()


def _bar(label: str, total: int, unit: str) -> Update:
    from tqdm import tqdm

    bar = tqdm(total=total or None, desc=f"{label:<28}", unit=unit, leave=False,
               file=sys.stderr, mininterval=0.2)

    def update(done: int) -> None:
        bar.update(done - bar.n)
        if total and done >= total:
            bar.close()
    return update


def tracker_factory(quiet: bool, terminal: bool | None = None
                    ) -> Callable[[str, int, str], Update] | None:
    """What makes a task's progress callable: None when `quiet`, a bar on a terminal
    (`terminal` None: whether standard error is one), else plain lines."""
    if quiet:
        return None
    if terminal is None:
        terminal = sys.stderr.isatty()
    if terminal:
        return _bar
    return lambda label, total, unit: ProgressLines(label, total, unit)
