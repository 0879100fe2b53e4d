"""Use Ako's exchange in my own loop: a plain JAX training loop, akorun.Exchange in it.

You keep the loop, the model, the data and the gradient; akorun sends a partition of
each gradient to every peer, applies the peers' gradients (plain SGD here) and gates on
staleness. Run all three ranks on this machine:

    python examples/own_loop.py                 # writes runs/own-loop/, checks the replicas

or, by hand, one rank per host (the cluster file from `akorun init` on each):

    akorun init --workers 3 --rounds 30 --optimizer sgd --lr 0.05 --p 2 --out cluster.toml
    python examples/own_loop.py --rank R --cluster cluster.toml --out runs/own-loop
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

import akorun

FEATURES = 16


def my_data(rank: int, examples: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """This rank's own examples of one linear problem (y = x @ w_true + noise)."""
    w_true = np.random.default_rng(0).normal(size=FEATURES).astype(np.float32)
    rng = np.random.default_rng(1 + rank)
    x = rng.normal(size=(examples, FEATURES)).astype(np.float32)
    y = x @ w_true + 0.01 * rng.normal(size=examples).astype(np.float32)
    return x, y


def my_loss(params: dict, x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.mean((x @ params["w"] + params["b"] - y) ** 2)


def explained(params: dict, x: np.ndarray, y: np.ndarray) -> float:
    """The fraction of the variance of y the model explains (R^2): the record's accuracy."""
    return 1.0 - float(my_loss(params, x, y)) / float(np.var(y))


def train_rank(rank: int, cluster: str, out: str | None) -> np.ndarray:
    """One rank: my loop, my gradients, Ako's exchange. Returns the final parameters."""
    x, y = my_data(rank)
    params = {"w": jnp.zeros(FEATURES), "b": jnp.zeros(())}  # the same on every rank
    grad = jax.jit(jax.grad(my_loss))
    batch = 32
    with akorun.Exchange(rank=rank, cluster=cluster, params=params, out=out,
                         evaluate=lambda p: explained(p, x, y)) as exchange:
        params = exchange.params
        for step in range(exchange.rounds):
            start = (step * batch) % len(x)
            grads = grad(params, x[start:start + batch], y[start:start + batch])
            params = exchange.step(grads, loss=float(my_loss(params, x, y)))
    print(f"rank {rank}: loss {float(my_loss(params, x, y)):.4f} after {exchange.rounds} "
          f"rounds, {exchange.result.bytes_sent / 1e3:.1f} kB sent")
    flat = np.asarray(ravel_pytree(params)[0])  # the order akorun keeps them in
    if out is not None:
        np.save(Path(out) / f"own-loop-{rank}.npy", flat)
    return flat


def all_ranks(out: Path, rounds: int) -> None:
    """Write a cluster file, start the three ranks, check their replicas agree."""
    out.mkdir(parents=True, exist_ok=True)
    cluster = akorun.init(out / "cluster.toml", workers=3, rounds=rounds, optimizer="sgd",
                          lr=0.05, p=2, ssp=1, force=True)
    ranks = [subprocess.Popen([sys.executable, __file__, "--rank", str(rank), "--cluster",
                               str(cluster), "--out", str(out)]) for rank in range(3)]
    if any(rank.wait() != 0 for rank in ranks):
        raise SystemExit("a rank failed")
    replicas = [np.load(out / f"own-loop-{rank}.npy") for rank in range(3)]
    spread = max(float(np.max(np.abs(r - replicas[0]))) for r in replicas)
    print(f"largest difference between replicas: {spread:.2g}")
    if spread > 1e-5:
        raise SystemExit("the replicas differ")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, help="run this rank only (with --cluster)")
    parser.add_argument("--cluster", help="the cluster file (akorun init)")
    parser.add_argument("--out", default="runs/own-loop", help="run directory")
    parser.add_argument("--rounds", type=int, default=30, help="steps of every rank")
    args = parser.parse_args()
    if args.rank is None:
        all_ranks(Path(args.out), args.rounds)
    else:
        train_rank(args.rank, args.cluster, args.out)


if __name__ == "__main__":
    main()
