"""What a rank is doing before its server answers /status, for `akorun launch`'s progress.

A rank imports JAX, builds the workload, measures its step (p auto), compiles and
reads its checkpoint before it listens; for all that time /status cannot answer
(from its server's start it says the rank's state itself: joining, running, ...). The
rank says each of these phases in one short file, `worker-R.phase` in its output
directory (rewritten whole by a rename, so a reader never sees half a line), and the
launcher shows it (akorun.launching.progress_line); once the rank's server answers
/status, the file is removed. Display only: a file that cannot be written is skipped
silently.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

LOADING = "loading the workload"
MEASURING = "measuring its step"
COMPILING = "compiling"
READING_CHECKPOINT = "reading its checkpoint"


def phase_path(out_dir: Path, rank: int) -> Path:
    return Path(out_dir) / f"worker-{rank}.phase"


class StartupPhase:
    """The phase file of rank `rank` in `out_dir` (none without an output directory)."""

    def __init__(self, out_dir: Path | None, rank: int) -> None:
        self.path = None if out_dir is None else phase_path(out_dir, rank)

    def say(self, words: str) -> None:
        if self.path is None:
            return
        temporary = self.path.with_name(self.path.name + ".tmp")
        with contextlib.suppress(OSError):
            temporary.write_text(words + "\n", encoding="utf-8")
            os.replace(temporary, self.path)


    def clear(self) -> None:
        """The rank's server answers /status now: the file goes."""
        if self.path is not None:
            with contextlib.suppress(OSError):
                self.path.unlink()


def read_phase(out_dir: Path, rank: int) -> str | None:
    """The phase rank `rank` last said, or None (nothing said yet, or unreadable)."""
    try:
        text = phase_path(out_dir, rank).read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return text or None
