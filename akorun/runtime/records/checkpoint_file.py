"""Worker checkpoints: one Orbax checkpoint per rank, swapped in atomically, a JSON sidecar.

`save_checkpoint` writes ``DIR/worker-R.ckpt``, an Orbax checkpoint (layout
and atomicity: akorun.runtime.records.checkpoint_orbax) whose ``params`` are the
user's parameter pytree when the writer knows its structure, and
``DIR/worker-R.ckpt.json``, the metadata again for humans (next round,
delivery log, final rounds, p per worker, config hash, run id), written to a
temporary file and moved into place with os.replace. `load_checkpoint` reads
the Orbax checkpoint, or the npz an older akorun wrote
(akorun.runtime.records.checkpoint_npz) where there is no Orbax one. Nothing is pickled.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from akocore.schemes.recovery import DeliveryRecord
from akorun.errors import UsageError
from akorun.runtime.records.checkpoint_npz import npz_path, read_npz
from akorun.runtime.records.checkpoint_orbax import (
    current,
    flat_params,
    link_path,
    meta_of,
    read_orbax,
    remove_unreferenced,
    write_orbax,
)

FORMAT_VERSION = 2  # 1: the npz of akorun.runtime.records.checkpoint_npz


@dataclass(frozen=True, eq=False)
class Checkpoint:
    """One worker's state at a round boundary."""

    rank: int
    next_round: int
    params: np.ndarray
    run_id: str
    config_hash: str
    scheme: str
    p_of: tuple[int, ...]
    unsent: np.ndarray | None = None
    inbox: np.ndarray | None = None
    log: DeliveryRecord = field(default_factory=dict)
    final_round: dict[int, int] = field(default_factory=dict)
    optimizer_leaves: tuple[np.ndarray, ...] = ()
    written_unix_s: float = 0.0
    trained_s: float = 0.0  # training seconds of the run so far (across resumes): --duration

    def meta(self) -> dict[str, Any]:
        return {
            "format": FORMAT_VERSION,
            "rank": self.rank,
            "next_round": self.next_round,
            "run_id": self.run_id,
            "config_hash": self.config_hash,
            "scheme": self.scheme,
            "p_of": list(self.p_of),
            "log": log_to_json(self.log),
            "final_round": {str(k): v for k, v in self.final_round.items()},
            "optimizer_leaves": len(self.optimizer_leaves),
            "written_unix_s": self.written_unix_s or time.time(),
            "trained_s": self.trained_s,
        }


def log_to_json(log: Mapping[int, tuple[int, Mapping[int, list[int]]]]) -> dict[str, Any]:
    return {str(j): [int(c), {str(r): sorted(int(x) for x in parts)
                              for r, parts in pending.items()}]
            for j, (c, pending) in log.items()}


def log_from_json(data: Mapping[str, Any]) -> DeliveryRecord:
    return {int(j): (int(c), {int(r): [int(x) for x in parts] for r, parts in pending.items()})
            for j, (c, pending) in data.items()}


def checkpoint_path(directory: str | Path, rank: int) -> Path:
    """The checkpoint a user restores with Orbax (a link to the current one)."""
    return link_path(directory, rank)


def sidecar_path(directory: str | Path, rank: int) -> Path:
    return Path(directory) / f"worker-{rank}.ckpt.json"


def checkpoint_exists(directory: str | Path, rank: int) -> bool:
    """An Orbax checkpoint or an older npz one of `rank` is in `directory`."""
    return current(directory, rank) is not None or npz_path(directory, rank).exists()


def _replace_atomically(target: Path, write: Any) -> None:
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def remove_stale_temp_files(directory: str | Path, rank: int) -> list[Path]:
    """Remove what a killed writer of `rank` left behind (a checkpoint the link does not
    point at, a temporary link or sidecar named `.NAME.PID.tmp`); the removed paths."""
    sidecar = sidecar_path(directory, rank)
    removed = remove_unreferenced(directory, rank)
    for stale in sidecar.parent.glob(f".{sidecar.name}.*.tmp"):
        try:
            stale.unlink()
            removed.append(stale)
        except OSError:
            pass
    return removed


def save_checkpoint(directory: str | Path, checkpoint: Checkpoint,
                    before_replace: Callable[[Path], None] | None = None,
                    structure: Callable[[np.ndarray], Any] | None = None) -> Path:
    """Write the checkpoint of `checkpoint.rank` (atomically); returns its path.
    `structure(flat)` gives the user's pytree of the flat parameters (the workload's
    `unravel`); without it the parameters are saved as the flat vector.
    `before_replace(new)` runs once the new checkpoint is written (a test hook)."""
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    meta = checkpoint.meta()
    flat = np.asarray(checkpoint.params, dtype=np.float32)
    state: dict[str, Any] = {
        "params": flat if structure is None else structure(flat.copy()),
        "optimizer": [np.asarray(leaf) for leaf in checkpoint.optimizer_leaves],
        "round": np.int64(checkpoint.next_round),
        "meta": np.frombuffer(json.dumps(meta, sort_keys=True).encode("utf-8"),
                              dtype=np.uint8),
    }
    scheme = {name: np.asarray(value, dtype=np.float32)
              for name, value in (("unsent", checkpoint.unsent), ("inbox", checkpoint.inbox))
              if value is not None}
    if scheme:
        state["scheme"] = scheme
    target = write_orbax(folder, checkpoint.rank, state, checkpoint.next_round, before_replace)
    _replace_atomically(sidecar_path(folder, checkpoint.rank), lambda handle: handle.write(
        json.dumps(meta, indent=1, sort_keys=True).encode("utf-8")))
    return target


def load_checkpoint(directory: str | Path, rank: int, like: Any = None) -> Checkpoint:
    """Read rank's checkpoint (Orbax, else an older npz); `like` is a pytree of the
    model's structure (the parameters' leaf order); UsageError naming the file if
    missing or unreadable."""
    orbax_checkpoint = current(directory, rank)
    path = npz_path(directory, rank) if orbax_checkpoint is None else link_path(directory, rank)
    if orbax_checkpoint is None and not path.exists():
        raise UsageError(f"{path}: no checkpoint of rank {rank} (give --checkpoint-dir where "
                         f"the worker wrote them)")
    try:
        if orbax_checkpoint is None:
            meta, arrays = read_npz(path)
            params = arrays["params"]
            leaves = tuple(arrays[f"opt_{i}"] for i in range(meta["optimizer_leaves"]))
        else:
            restored = read_orbax(orbax_checkpoint)
            meta = meta_of(restored)
            params = flat_params(restored["params"], like)
            arrays = dict(restored.get("scheme", {}))
            leaves = tuple(np.asarray(leaf) for leaf in restored["optimizer"])
        return _from_meta(meta, params, arrays, leaves)
    except Exception as error:  # noqa: BLE001 -- any unreadable file is the user's to fix
        raise UsageError(f"{path}: unreadable checkpoint ({type(error).__name__}: "
                         f"{str(error).splitlines()[0] if str(error) else ''})") from None


def _from_meta(meta: dict[str, Any], params: np.ndarray, arrays: dict[str, np.ndarray],
               leaves: tuple[np.ndarray, ...]) -> Checkpoint:
    def buffer(name: str) -> np.ndarray | None:
        return np.array(arrays[name], dtype=np.float32) if name in arrays else None

    return Checkpoint(
        rank=int(meta["rank"]),
        next_round=int(meta["next_round"]),
        params=np.array(params, dtype=np.float32),
        run_id=str(meta["run_id"]),
        config_hash=str(meta["config_hash"]),
        scheme=str(meta["scheme"]),
        p_of=tuple(int(p) for p in meta["p_of"]),
        unsent=buffer("unsent"),
        inbox=buffer("inbox"),
        log=log_from_json(meta["log"]),
        final_round={int(k): int(v) for k, v in meta["final_round"].items()},
        optimizer_leaves=leaves,
        written_unix_s=float(meta.get("written_unix_s", 0.0)),
        trained_s=float(meta.get("trained_s", 0.0)),  # 0 in a checkpoint from before
    )


def optimizer_leaves(state: Any) -> tuple[np.ndarray, ...]:
    """The optimizer state's leaves as numpy arrays (jax.tree_util order)."""
    import jax

    return tuple(np.asarray(leaf) for leaf in jax.tree_util.tree_leaves(state))


def restore_optimizer_state(template: Any, leaves: tuple[np.ndarray, ...]) -> Any:
    """`template`'s tree structure filled with `leaves`; ValueError if they do not fit."""
    import jax
    import jax.numpy as jnp

    old_leaves, treedef = jax.tree_util.tree_flatten(template)
    if len(old_leaves) != len(leaves):
        raise ValueError(f"checkpoint has {len(leaves)} optimizer leaves, the optimizer "
                         f"{len(old_leaves)}")
    new = []
    for old, leaf in zip(old_leaves, leaves, strict=True):
        if np.shape(old) != leaf.shape:
            raise ValueError(f"optimizer leaf of shape {leaf.shape}, expected {np.shape(old)}")
        new.append(jnp.asarray(leaf, dtype=jnp.asarray(old).dtype))
    return jax.tree_util.tree_unflatten(treedef, new)
