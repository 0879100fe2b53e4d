"""Writing this rank's checkpoint (periodically and at the end), off the event loop.

What the checkpoint holds beyond the common fields is the role's
(`Role.checkpoint`: ako workers add their buffers and delivery log). The format
is akorun.runtime.records.checkpoint_file's (an Orbax checkpoint whose ``params`` are the
user's pytree: the writer is given the workload's `unravel`).

A failed periodic write (a full or broken disk: any OSError, or any error Orbax
raises for one) is logged as one
line, counted (`failures`), its temp file removed, and training goes on: the
next periodic checkpoint is the retry, and the last good checkpoint stays in
place (writes are atomic). The final write raises `CheckpointFailed`, which
the finisher turns into exit status 1 after telling its peers ``done``.
Temp files a killed process left behind are removed when a writer is made.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from akocore.workloads.flat import FlatWorkload
from akorun.runtime.records.checkpoint_file import (
    Checkpoint,
    checkpoint_path,
    optimizer_leaves,
    remove_stale_temp_files,
    save_checkpoint,
)
from akorun.runtime.roles import Role

log = logging.getLogger("akorun")


class CheckpointFailed(Exception):
    """A checkpoint could not be written (the message names the file and the error)."""


class CheckpointWriter:
    """Checkpoints of one rank into one directory (none without a directory)."""

    def __init__(self, role: Role, directory: Path | None, workload: FlatWorkload | None = None,
                 *, run_id: str, config_hash: str) -> None:
        self.role = role
        # flat vector -> the user's pytree (for a full model, not a parameter server's shard)
        self.structure = None if workload is None else workload.unravel
        self.param_count = 0 if workload is None else workload.param_count
        self.directory = directory
        self.run_id = run_id
        self.config_hash = config_hash
        self.failures = 0
        # the run's training seconds so far, across resumes (akorun.runtime.lifecycle.training)
        self.trained_s: Callable[[], float] = lambda: 0.0
        if directory is not None:
            remove_stale_temp_files(directory, role.rank)

    def now(self) -> Checkpoint | None:
        node = self.role.node
        if node is None or node.params is None or self.directory is None:
            return None
        p_of = self.role.p_of
        common: dict[str, Any] = {
            "rank": self.role.rank, "run_id": self.run_id,
            "config_hash": self.config_hash, "scheme": self.role.cfg.exchange.scheme,
            "p_of": tuple(p_of) if p_of else (),
            "optimizer_leaves": optimizer_leaves(node.replica.state),
            "written_unix_s": time.time(),
            "trained_s": self.trained_s(),
        }
        return self.role.checkpoint(common)

    async def write(self, *, final: bool = False,
                    before_replace: Callable[[Path], None] | None = None) -> None:
        """Write a checkpoint now; a periodic failure is logged, a final one raised.
        `before_replace` is a test hook (akorun.faults: kill_mid_checkpoint)."""
        checkpoint = self.now()
        if checkpoint is None:
            return
        assert self.directory is not None
        whole = checkpoint.params.size == self.param_count
        try:
            await asyncio.to_thread(save_checkpoint, self.directory, checkpoint,
                                    before_replace, self.structure if whole else None)
        except Exception as error:  # noqa: BLE001 -- OSError, or Orbax's error for one
            self.failures += 1
            where = checkpoint_path(self.directory, self.role.rank)
            reason = getattr(error, "strerror", None) or str(error).splitlines()[0]
            message = f"{where}: checkpoint not written: {reason}"
            if final:
                raise CheckpointFailed(message) from None
            log.error("%s -- training goes on; the next periodic checkpoint retries "
                      "(the last good one stays in place)", message)
