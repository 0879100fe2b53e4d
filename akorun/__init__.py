"""akorun: the real shell (wire format, aiohttp transport, worker loop, launcher, CLI).

`merge_run(run_dir)` writes a run's ``result.json`` from its ranks' records (what
``akorun merge RUN_DIR`` does), for ranks started by hand::

    import akorun
    path = akorun.merge_run("runs/by-hand")   # runs/by-hand/result.json
"""

from __future__ import annotations

from typing import Any

__all__ = ["merge_run"]


def __getattr__(name: str) -> Any:
    """The public names, imported when first used (``import akorun.wire`` stays light)."""
    if name == "merge_run":
        from akorun.run_merge import merge_run

        return merge_run
    raise AttributeError(f"module 'akorun' has no attribute {name!r}")
