"""The built-in workload of real size: a small transformer language model (synthetic-lm).

This module owns `lm_workload`: a decoder-only transformer written in plain
``jax.numpy`` (pre-LayerNorm blocks of causal multi-head attention and a 4x GELU
MLP, learned positions, output tied to the token embedding) trained on next-token
cross-entropy over a corpus it generates itself: token sequences from a random
second-order Markov chain with a few likely successors per context, drawn from a
fixed seed so every rank builds the same corpus. Evaluation is next-token accuracy.

With the defaults (vocab 4096, d_model 512, 8 layers, 8 heads, 64 tokens) it has
27,350,016 parameters: 109.4 MB of float32 gradient per round. Options: vocab,
d_model, layers, heads, seq_len, train_sequences, test_sequences.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from akocore.workloads.sources import ArrayData
from akocore.workloads.spec import Workload

LM_OPTIONS = ("vocab", "d_model", "layers", "heads", "seq_len", "train_sequences",
              "test_sequences")
BRANCHING = 4  # likely successors of each context in the generated corpus


def markov_corpus(sequences: int, seq_len: int, vocab: int,
                  rng: np.random.Generator) -> np.ndarray:
    """int32 (sequences, seq_len + 1) token sequences of a random second-order Markov chain:
    each (previous, current) pair has BRANCHING likely successors (90% of the mass)."""
    tokens = np.empty((sequences, seq_len + 1), dtype=np.int64)
    tokens[:, :2] = rng.integers(0, vocab, (sequences, 2))
    salt = rng.integers(1, 2**31 - 1, BRANCHING)
    for position in range(2, seq_len + 1):
        context = tokens[:, position - 2] * vocab + tokens[:, position - 1]
        choice = rng.integers(0, BRANCHING, sequences)
        likely = (context * 2654435761 + salt[choice]) % vocab
        noise = rng.integers(0, vocab, sequences)
        tokens[:, position] = np.where(rng.random(sequences) < 0.9, likely, noise)
    return tokens.astype(np.int32)


def _init(seed: int, vocab: int, d_model: int, layers: int, seq_len: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)

    def normal(shape: tuple[int, ...], std: float) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(std))

    residual_std = 0.02 / math.sqrt(2 * layers)
    blocks = []
    for _ in range(layers):
        blocks.append({
            "ln1": {"scale": np.ones(d_model, np.float32), "bias": np.zeros(d_model, np.float32)},
            "qkv": normal((d_model, 3 * d_model), 0.02),
            "qkv_bias": np.zeros(3 * d_model, np.float32),
            "proj": normal((d_model, d_model), residual_std),
            "proj_bias": np.zeros(d_model, np.float32),
            "ln2": {"scale": np.ones(d_model, np.float32), "bias": np.zeros(d_model, np.float32)},
            "up": normal((d_model, 4 * d_model), 0.02),
            "up_bias": np.zeros(4 * d_model, np.float32),
            "down": normal((4 * d_model, d_model), residual_std),
            "down_bias": np.zeros(d_model, np.float32),
        })
    return {"embed": normal((vocab, d_model), 0.02), "pos": normal((seq_len, d_model), 0.01),
            "blocks": blocks,
            "ln_f": {"scale": np.ones(d_model, np.float32), "bias": np.zeros(d_model, np.float32)}}


def _forward(params: Any, tokens: Any, heads: int) -> Any:
    import jax
    import jax.numpy as jnp

    def norm(x: Any, p: Any) -> Any:
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) * jax.lax.rsqrt(var + 1e-5) * p["scale"] + p["bias"]

    batch, length = tokens.shape
    d_model = params["embed"].shape[1]
    head_dim = d_model // heads
    causal = jnp.tril(jnp.ones((length, length), dtype=bool))
    x = params["embed"][tokens] + params["pos"][:length]
    for block in params["blocks"]:
        h = norm(x, block["ln1"]) @ block["qkv"] + block["qkv_bias"]
        q, k, v = (part.reshape(batch, length, heads, head_dim) for part in jnp.split(h, 3, -1))
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(head_dim)
        weights = jax.nn.softmax(jnp.where(causal, scores, -1e9), axis=-1)
        attended = jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(batch, length, d_model)
        x = x + attended @ block["proj"] + block["proj_bias"]
        h = jax.nn.gelu(norm(x, block["ln2"]) @ block["up"] + block["up_bias"])
        x = x + h @ block["down"] + block["down_bias"]
    return norm(x, params["ln_f"]) @ params["embed"].T


def lm_workload(*, seed: int = 0, vocab: int = 4096, d_model: int = 512, layers: int = 8,
                heads: int = 8, seq_len: int = 64, train_sequences: int = 4096,
                test_sequences: int = 256) -> Workload:
    """The synthetic-lm workload (see the module docstring); `seed` picks the initial
    parameters only, the corpus is the same for every seed."""
    for label, value in (("vocab", vocab), ("d_model", d_model), ("layers", layers),
                         ("heads", heads), ("seq_len", seq_len),
                         ("train_sequences", train_sequences),
                         ("test_sequences", test_sequences)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"synthetic-lm {label} must be a positive integer, got {value!r}")
    if d_model % heads:
        raise ValueError(f"synthetic-lm d_model {d_model} must be a multiple of heads {heads}")
    corpus = markov_corpus(train_sequences + test_sequences, seq_len, vocab,
                           np.random.default_rng(31337))
    inputs, targets = corpus[:, :-1], corpus[:, 1:]

    def loss(params: Any, batch: Any, rng: Any) -> Any:
        import optax

        x, y = batch
        return optax.softmax_cross_entropy_with_integer_labels(
            _forward(params, x, heads), y).mean()

    def evaluate(params: Any, batch: Any) -> dict[str, Any]:
        import jax.numpy as jnp
        import optax

        x, y = batch
        logits = _forward(params, x, heads)
        return {"accuracy": jnp.mean(jnp.argmax(logits, -1) == y),
                "loss": optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()}

    data = ArrayData(inputs[:train_sequences], targets[:train_sequences],
                     inputs[train_sequences:], targets[train_sequences:], name="markov-corpus")
    return Workload(init=lambda s: _init(s, vocab, d_model, layers, seq_len), loss=loss,
                    evaluate=evaluate, data=data, eval_batch_size=32)
