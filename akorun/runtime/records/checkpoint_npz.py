"""The npz checkpoints akorun wrote before its checkpoints were Orbax's: read for --resume.

``DIR/worker-R.ckpt.npz`` holds the arrays ``params`` (the flat vector),
``unsent``, ``inbox`` (ako workers), ``opt_0 ... opt_k`` (the optimizer
state's leaves in jax.tree_util order) and ``meta`` (the metadata JSON as
utf-8 bytes). Nothing in it is pickled. `write_npz` writes that format (tests
and anyone converting old runs use it); akorun itself writes Orbax checkpoints.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np


def npz_path(directory: str | Path, rank: int) -> Path:
    return Path(directory) / f"worker-{rank}.ckpt.npz"


def write_npz(path: Path, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
    """`arrays` (params, unsent, inbox, opt_i) and `meta` as one npz at `path`."""
    meta_bytes = json.dumps(meta, sort_keys=True).encode("utf-8")
    with open(path, "wb") as handle:
        np.savez(handle, meta=np.frombuffer(meta_bytes, dtype=np.uint8),
                 **arrays)  # type: ignore[arg-type]


def read_npz(path: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(meta, arrays) of an npz checkpoint; any error propagates (the caller names the file)."""
    with np.load(path, allow_pickle=False) as data:
        meta = json.loads(bytes(data["meta"]).decode("utf-8"))
        arrays = {name: np.array(data[name]) for name in data.files if name != "meta"}
    return meta, arrays
