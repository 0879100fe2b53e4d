"""Writing this rank's checkpoint (periodically and at the end), off the event loop.

What the checkpoint holds beyond the common fields is the role's
(`Role.checkpoint`: ako workers add their buffers and delivery log). The file
format is akorun.checkpoint's. What happens when a write fails belongs here.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from akorun.checkpoint import Checkpoint, optimizer_leaves, save_checkpoint
from akorun.runtime.roles import Role


class CheckpointWriter:
    """Checkpoints of one rank into one directory (none without a directory)."""

    def __init__(self, role: Role, directory: Path | None, *, run_id: str,
                 config_hash: str) -> None:
        self.role = role
        self.directory = directory
        self.run_id = run_id
        self.config_hash = config_hash

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
        }
        return self.role.checkpoint(common)

    async def write(self) -> None:
        checkpoint = self.now()
        if checkpoint is None:
            return
        assert self.directory is not None
        await asyncio.to_thread(save_checkpoint, self.directory, checkpoint)
