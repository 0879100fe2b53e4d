"""Worker checkpoints: one npz per rank, written atomically, plus a JSON sidecar.

``DIR/worker-R.ckpt.npz`` holds the arrays ``params``, ``unsent``, ``inbox``
(ako workers), ``opt_0 ... opt_k`` (the optimizer state's leaves in
jax.tree_util order) and ``meta`` (the metadata JSON as utf-8 bytes, so the
npz alone is complete and consistent). ``DIR/worker-R.ckpt.json`` repeats the
metadata for humans: next round, delivery log, final rounds, p per worker,
config hash, run id. Both are written to a temporary file in the same
directory and moved into place with os.replace, so a crash leaves either the
old or the new checkpoint, never half of one. Nothing is pickled.
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

from akorun.errors import UsageError

FORMAT_VERSION = 1

DeliveryRecord = dict[int, tuple[int, dict[int, list[int]]]]


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
        }


def log_to_json(log: Mapping[int, tuple[int, Mapping[int, list[int]]]]) -> dict[str, Any]:
    return {str(j): [int(c), {str(r): sorted(int(x) for x in parts)
                              for r, parts in pending.items()}]
            for j, (c, pending) in log.items()}


def log_from_json(data: Mapping[str, Any]) -> DeliveryRecord:
    return {int(j): (int(c), {int(r): [int(x) for x in parts] for r, parts in pending.items()})
            for j, (c, pending) in data.items()}


def checkpoint_path(directory: str | Path, rank: int) -> Path:
    return Path(directory) / f"worker-{rank}.ckpt.npz"


def _replace_atomically(target: Path, write: Any,
                        before_replace: Callable[[Path], None] | None = None) -> None:
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        if before_replace is not None:  # a test hook (akorun.faults: kill_mid_checkpoint)
            before_replace(tmp)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def remove_stale_temp_files(target: Path) -> list[Path]:
    """Remove the temp files of `target` (and its .json sidecar) that a killed writer
    left behind (names `.NAME.PID.tmp`); the removed paths."""
    removed = []
    for name in (target.name, target.with_suffix(".json").name):
        for stale in target.parent.glob(f".{name}.*.tmp"):
            try:
                stale.unlink()
                removed.append(stale)
            except OSError:
                pass
    return removed


def save_checkpoint(directory: str | Path, checkpoint: Checkpoint,
                    before_replace: Callable[[Path], None] | None = None) -> Path:
    """Write the checkpoint of `checkpoint.rank` (atomically); returns the npz path.
    `before_replace(temp)` runs once the npz temp file is written (a test hook)."""
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    meta = checkpoint.meta()
    meta_bytes = json.dumps(meta, sort_keys=True).encode("utf-8")
    arrays: dict[str, np.ndarray] = {
        "params": np.asarray(checkpoint.params, dtype=np.float32),
        "meta": np.frombuffer(meta_bytes, dtype=np.uint8),
    }
    if checkpoint.unsent is not None:
        arrays["unsent"] = np.asarray(checkpoint.unsent, dtype=np.float32)
    if checkpoint.inbox is not None:
        arrays["inbox"] = np.asarray(checkpoint.inbox, dtype=np.float32)
    for index, leaf in enumerate(checkpoint.optimizer_leaves):
        arrays[f"opt_{index}"] = np.asarray(leaf)
    target = checkpoint_path(folder, checkpoint.rank)
    _replace_atomically(target, lambda handle: np.savez(handle, **arrays),  # type: ignore[arg-type]
                        before_replace)
    sidecar = target.with_suffix(".json")
    _replace_atomically(sidecar, lambda handle: handle.write(
        json.dumps(meta, indent=1, sort_keys=True).encode("utf-8")))
    return target


def load_checkpoint(directory: str | Path, rank: int) -> Checkpoint:
    """Read rank's checkpoint; UsageError naming the file if missing or unreadable."""
    path = checkpoint_path(directory, rank)
    if not path.exists():
        raise UsageError(f"{path}: no checkpoint of rank {rank} (give --checkpoint-dir where "
                         f"the worker wrote them)")
    try:
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(bytes(data["meta"]).decode("utf-8"))
            leaves = tuple(np.array(data[f"opt_{i}"]) for i in range(meta["optimizer_leaves"]))
            return Checkpoint(
                rank=int(meta["rank"]),
                next_round=int(meta["next_round"]),
                params=np.array(data["params"], dtype=np.float32),
                run_id=str(meta["run_id"]),
                config_hash=str(meta["config_hash"]),
                scheme=str(meta["scheme"]),
                p_of=tuple(int(p) for p in meta["p_of"]),
                unsent=np.array(data["unsent"], dtype=np.float32) if "unsent" in data else None,
                inbox=np.array(data["inbox"], dtype=np.float32) if "inbox" in data else None,
                log=log_from_json(meta["log"]),
                final_round={int(k): int(v) for k, v in meta["final_round"].items()},
                optimizer_leaves=leaves,
                written_unix_s=float(meta.get("written_unix_s", 0.0)),
            )
    except Exception as error:  # noqa: BLE001 -- any unreadable file is the user's to fix
        raise UsageError(f"{path}: unreadable checkpoint ({type(error).__name__}: "
                         f"{error})") from None


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
