"""A rank's checkpoint as an Orbax checkpoint, swapped into place atomically.

Layout in the checkpoint directory, for rank R::

    worker-R.ckpt            a symbolic link to the current checkpoint below
    worker-R.ckpt.d/N-PID-T  Orbax checkpoints (StandardCheckpointer), N = next round

Each checkpoint is one pytree: ``params`` (the user's parameter pytree, float32
leaves as trained, or the flat vector where no structure was given: a parameter
server's shard), ``optimizer`` (the optimizer state's leaves, jax.tree_util
order), ``scheme`` (the ako buffers ``unsent`` and ``inbox``, when the scheme
has them), ``round`` (the next round) and ``meta`` (the metadata JSON as
uint8 bytes, so the checkpoint alone is complete). Orbax writes each
checkpoint to a temporary directory and renames it when finished; the link is
then replaced with ``os.replace`` (atomic), and only after that are older
checkpoints removed: a crash at any moment leaves the link on a complete
checkpoint. Orbax alone restores it::

    import orbax.checkpoint as ocp
    state = ocp.StandardCheckpointer().restore(Path("worker-0.ckpt").resolve())
    params = state["params"]

``orbax.checkpoint`` (about half a second to import) is imported here, on the
first write or read, never when the command line starts; its INFO lines are off.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

LINK_SUFFIX = ".ckpt"
DATA_SUFFIX = ".ckpt.d"


def link_path(directory: str | Path, rank: int) -> Path:
    """The path a user restores: ``worker-R.ckpt`` (a link to the current checkpoint)."""
    return Path(directory) / f"worker-{rank}{LINK_SUFFIX}"


def data_folder(directory: str | Path, rank: int) -> Path:
    return Path(directory) / f"worker-{rank}{DATA_SUFFIX}"


def current(directory: str | Path, rank: int) -> Path | None:
    """The checkpoint the link points at (resolved), None if there is no link."""
    link = link_path(directory, rank)
    if not link.is_symlink() and not link.is_dir():
        return None
    return link.resolve()


def write_orbax(directory: str | Path, rank: int, state: dict[str, Any], next_round: int,
                before_replace: Callable[[Path], None] | None = None) -> Path:
    """Write `state` as a new Orbax checkpoint, point the link at it, remove the old one;
    returns the link. `before_replace(new)` runs once the checkpoint is complete and
    before the link moves (a test hook: akorun.faults kill_mid_checkpoint)."""
    ocp = _orbax()
    folder = data_folder(directory, rank)
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{next_round}-{os.getpid()}-{time.time_ns()}"
    checkpointer = _checkpointer(ocp)
    try:
        checkpointer.save(target.absolute(), state)
        checkpointer.wait_until_finished()
    finally:
        checkpointer.close()
    if before_replace is not None:
        before_replace(target)
    link = link_path(directory, rank)
    temp_link = link.with_name(f".{link.name}.{os.getpid()}.tmp")
    temp_link.unlink(missing_ok=True)
    os.symlink(Path(folder.name) / target.name, temp_link)
    os.replace(temp_link, link)
    _fsync_directory(link.parent)
    remove_unreferenced(directory, rank)
    return link


def remove_unreferenced(directory: str | Path, rank: int) -> list[Path]:
    """Remove what a killed or finished writer left beside the current checkpoint:
    older checkpoints, Orbax's unfinished temporary directories, a temporary link;
    the removed paths."""
    keep = current(directory, rank)
    folder = data_folder(directory, rank)
    removed = []
    entries = list(folder.iterdir()) if folder.is_dir() else []
    link = link_path(directory, rank)
    entries += list(link.parent.glob(f".{link.name}.*.tmp"))
    for entry in entries:
        if keep is not None and entry.resolve() == keep:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        removed.append(entry)
    return removed


def unreferenced(directory: str | Path, rank: int) -> list[Path]:
    """The checkpoints beside the current one (what a writer killed mid-write leaves)."""
    keep = current(directory, rank)
    folder = data_folder(directory, rank)
    if not folder.is_dir():
        return []
    return [entry for entry in folder.iterdir() if entry.resolve() != keep]


def read_orbax(path: Path) -> dict[str, Any]:
    """The checkpoint's pytree as Orbax restores it without a target (NumPy leaves)."""
    checkpointer = _checkpointer(_orbax())
    try:
        return dict(checkpointer.restore(path.resolve()))
    finally:
        checkpointer.close()


def flat_params(restored: Any, like: Any) -> np.ndarray:
    """The restored ``params`` as the flat float32 vector in `like`'s leaf order
    (jax.flatten_util.ravel_pytree's): each of `like`'s leaves is looked up by its
    path (Orbax restores dicts, lists and named tuples as dicts and lists);
    ValueError if one is missing or of another shape."""
    import jax

    if isinstance(restored, np.ndarray):
        return np.asarray(restored, dtype=np.float32).ravel()
    if like is None:
        leaves = jax.tree_util.tree_leaves(restored)
        return np.concatenate([np.asarray(x, dtype=np.float32).ravel() for x in leaves])
    parts = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(like)[0]:
        node = restored
        for key in path:
            node = _child(node, key)
        value = np.asarray(node, dtype=np.float32)
        if value.shape != np.shape(leaf):
            raise ValueError(f"{jax.tree_util.keystr(path)} has shape {value.shape}, "
                             f"the model {np.shape(leaf)}")
        parts.append(value.ravel())
    return np.concatenate(parts) if parts else np.zeros(0, np.float32)


def _child(node: Any, key: Any) -> Any:
    name = getattr(key, "key", getattr(key, "name", getattr(key, "idx", key)))
    try:
        if isinstance(node, dict):
            return node[name] if name in node else node[str(name)]
        return node[int(name)]
    except (KeyError, IndexError, ValueError, TypeError):
        raise ValueError(f"the checkpoint's params have no entry {name!r}") from None


def meta_of(restored: dict[str, Any]) -> dict[str, Any]:
    return dict(json.loads(bytes(np.asarray(restored["meta"], dtype=np.uint8)).decode("utf-8")))


def _orbax() -> Any:
    """orbax.checkpoint, imported now, its step-by-step INFO lines (absl's logger) off."""
    import orbax.checkpoint as ocp

    logging.getLogger("absl").setLevel(logging.WARNING)
    return ocp


def _checkpointer(ocp: Any) -> Any:
    """A StandardCheckpointer of this process alone: in an island of several processes
    (jax.distributed) only its leader writes the rank's checkpoint, and Orbax would
    otherwise wait at a barrier for the island's other processes, which never come."""
    import jax

    if jax.process_count() == 1:
        return ocp.StandardCheckpointer()
    me = jax.process_index()
    return ocp.StandardCheckpointer(multiprocessing_options=ocp.options.MultiprocessingOptions(
        primary_host=me, active_processes={me}))


def _fsync_directory(folder: Path) -> None:
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
