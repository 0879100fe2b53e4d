"""An island's gradient step: one rank's step run data-parallel over several devices.

This module owns what a rank computes when it spans several devices (and processes):
`IslandStep`, the user's gradient step under JAX's own machinery (a
``jax.sharding.Mesh`` over the island's devices, each device's batch a shard of the
island's, ``shard_map`` running the very step a one-device rank runs on each shard and
``lax.pmean`` reducing the gradients inside XLA, so that the island gives ONE
replicated gradient, each leaf fetched to the host once and joined into the flat
vector in NumPy); and `IslandWorkload`, a
`FlatWorkload` whose batches are this process's devices' batches stacked and whose
`grad_step` is the island's. The schemes above see one rank with one gradient, as ever.

Which data each device trains on: device g (0..G-1 over the whole island) of rank r
of n draws the batch stream of worker r*G + g of n*G. An island of G devices so trains
on the batches G one-device ranks would, and its gradient is their mean: under plain
SGD a run of n islands of G devices gives the replicas a run of n*G ranks of one device
gives (up to float rounding: the mean's order of additions differs). Device g's
dropout seed is the rank's step seed plus g * 1_000_003 (device 0 uses the rank's).

Several processes: the island's processes must run every step together (the pmean
is a collective over all of them). The process that talks to other ranks, the leader,
tells the others which batch a step is on and with which parameters through the
`announce` callable it is built with (akorun.runtime.island: a jitted broadcast inside
the island); `IslandWorkload` keeps the keys of the batches it drew for that, and
`batch_at` gives a follower the same batch from its own devices' streams.

Pure: the devices and the announce callable are handed in; no I/O, no clocks.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from akocore.workloads.flat import FlatWorkload, tree_grad_fn

AXIS = "island"  # the mesh axis the batch is sharded along
DEVICE_SEED_STRIDE = 1_000_003
HELD_BATCHES = 16  # batch keys a leader keeps (measure_compute_s cycles 8 batches)

BatchKey = tuple[int, int, int, int]  # (worker, workers, data seed, index in the stream)
Announce = Callable[[BatchKey, np.ndarray, int], np.ndarray]  # -> the island's params


@dataclass(frozen=True)
class StackedBatch:
    """One process's devices' batches stacked on a new first axis (local devices, B, ...)."""

    x: Any
    y: Any


def device_seeds(rng_seed: int, first: int, count: int) -> np.ndarray:
    """The dropout seeds of devices first..first+count-1 for a step seeded `rng_seed`."""
    return np.array([(int(rng_seed) + g * DEVICE_SEED_STRIDE) % (1 << 32)
                     for g in range(first, first + count)], dtype=np.uint32)


@dataclass(frozen=True, eq=False)
class IslandStep:
    """The jitted data-parallel step over `devices` (the island's, in island order), as
    seen from process `process_index`: its devices are `first`..`first + local - 1`."""

    devices: tuple[Any, ...]
    process_index: int
    first: int
    local: int
    _mesh: Any = field(repr=False)
    _fn: Any = field(repr=False)
    _unravel: Callable[[Any], Any] = field(repr=False)

    @property
    def size(self) -> int:
        return len(self.devices)

    def __call__(self, flat_params: np.ndarray, xs: Any, ys: Any,
                 seeds: np.ndarray) -> tuple[float, np.ndarray]:
        """(mean loss, mean flat gradient) of the island: this process gives its
        devices' stacked batches `xs`, `ys` and `seeds`; every process gets the result."""
        import jax
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P

        mesh, size = self._mesh, self.size

        def sharded(local: Any) -> Any:
            local = np.asarray(local)
            return jax.make_array_from_process_local_data(
                NamedSharding(mesh, P(AXIS)), local, (size, *local.shape[1:]))

        replicated = NamedSharding(mesh, P())
        # the parameters go in as the user's pytree of NumPy views of the flat vector, and
        # the gradient's leaves come out: as in FlatWorkload.grad_step, the slicing and
        # the concatenation stay out of XLA (in it, the island's CPU step took 3x longer)
        params = jax.tree_util.tree_map(
            lambda leaf: jax.make_array_from_process_local_data(replicated, leaf),
            self._unravel(np.asarray(flat_params, np.float32)))
        loss, leaves = self._fn(params, jax.tree_util.tree_map(sharded, xs),
                                jax.tree_util.tree_map(sharded, ys), sharded(seeds))
        # the replicated result: one device-to-host copy of this process's replica per leaf
        grad = np.concatenate([np.asarray(leaf.addressable_data(0)).reshape(-1)
                               for leaf in leaves])
        return float(np.asarray(loss.addressable_data(0))), grad


def island_step(workload: FlatWorkload, devices: Sequence[Any],
                process_index: int = 0) -> IslandStep:
    """The island step of `workload` over `devices` (in island order; this process's own,
    those whose process_index is `process_index`, must be consecutive). ValueError when
    this process has none or they are not consecutive."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    devices = tuple(devices)
    mine = [i for i, device in enumerate(devices)
            if getattr(device, "process_index", 0) == process_index]
    if not mine or mine != list(range(mine[0], mine[0] + len(mine))):
        raise ValueError(f"process {process_index} needs its own devices, consecutive in the "
                         f"island's order; got {[str(d) for d in devices]}")
    dtypes = tuple(jnp.dtype(dtype) for _, dtype in workload.param_layout)
    tree_grad = tree_grad_fn(workload.spec, dtypes)

    def per_device(params: Any, xs: Any, ys: Any, seeds: Any) -> tuple[Any, Any]:
        """One device: the one-device rank's step on its own batch, then the island's mean."""
        x, y = jax.tree_util.tree_map(lambda a: a[0], (xs, ys))
        # this device's own copy of the parameters: the gradient stays per device (of
        # the replicated input, shard_map's transpose would sum it over the island)
        own = jax.lax.pcast(params, AXIS, to="varying")
        loss, leaves = tree_grad(own, x, y, seeds[0])
        return jax.lax.pmean(loss, AXIS), [jax.lax.pmean(leaf, AXIS) for leaf in leaves]

    mesh = Mesh(np.array(devices, dtype=object), (AXIS,))
    fn = jax.jit(jax.shard_map(per_device, mesh=mesh,
                               in_specs=(P(), P(AXIS), P(AXIS), P(AXIS)),
                               out_specs=(P(), P())))
    return IslandStep(devices=devices, process_index=process_index, first=mine[0],
                      local=len(mine), _mesh=mesh, _fn=fn, _unravel=workload.unravel)


class IslandBatches:
    """This process's devices' batch streams for rank `worker` of `workers`, stacked."""

    def __init__(self, workload: IslandWorkload, worker: int, workers: int, seed: int) -> None:
        step = workload.step
        self.workload = workload
        self.key = (worker, workers, seed)
        self.index = 0
        self.streams = [workload.spec.data.train_batches(
            worker * step.size + g, workers * step.size, workload.batch_size, seed)
            for g in range(step.first, step.first + step.local)]

    def next(self) -> StackedBatch:
        import jax

        parts = [stream.next() for stream in self.streams]

        def stack(*leaves: Any) -> np.ndarray:
            return np.stack([np.asarray(leaf) for leaf in leaves])

        batch = StackedBatch(x=jax.tree_util.tree_map(stack, *[part.x for part in parts]),
                             y=jax.tree_util.tree_map(stack, *[part.y for part in parts]))
        self.workload._hold(batch, (*self.key, self.index))
        self.index += 1
        return batch

    def skip(self, steps: int) -> None:
        for stream in self.streams:
            stream.skip(steps)
        self.index += steps


@dataclass(frozen=True, eq=False)
class IslandWorkload(FlatWorkload):
    """A FlatWorkload stepping as one island: `batches` stacks this process's devices'
    batches, `grad_step` takes such a stacked batch and gives the island's mean loss and
    gradient. `announce` (the leader of several processes) tells the others each step."""

    island: IslandStep | None = None
    announce: Announce | None = None
    _held: OrderedDict[int, tuple[Any, BatchKey]] = field(default_factory=OrderedDict,
                                                          repr=False)
    _streams: dict[tuple[int, int, int], IslandBatches] = field(default_factory=dict,
                                                                repr=False)
    _drawn: OrderedDict[BatchKey, StackedBatch] = field(default_factory=OrderedDict,
                                                        repr=False)

    @property
    def step(self) -> IslandStep:
        if self.island is None:
            raise RuntimeError("IslandWorkload was not built by island_workload()")
        return self.island

    @property
    def examples_per_step(self) -> int:
        return self.batch_size * self.step.size

    def batches(self, worker: int, workers: int, seed: int | None = None) -> IslandBatches:
        return IslandBatches(self, worker, workers, self.seed if seed is None else seed)

    def grad_step(self, flat_params: np.ndarray, x: Any, y: Any,
                  rng_seed: int = 0) -> tuple[float, np.ndarray]:
        """The island's (mean loss, mean flat gradient) of the stacked batch (x, y)."""
        params = self._check_params(flat_params, stacked=False)
        self._check_stacked(x, y)
        if self.announce is not None:
            params = self.announce(self._key_of(x), params, rng_seed)
        step = self.step
        return step(params, x, y, device_seeds(rng_seed, step.first, step.local))

    def follow_step(self, key: BatchKey, flat_params: np.ndarray, rng_seed: int) -> None:
        """A follower's share of the step the leader announced (batch `key`)."""
        batch = self.batch_at(key)
        step = self.step
        step(flat_params, batch.x, batch.y, device_seeds(rng_seed, step.first, step.local))

    def batch_at(self, key: BatchKey) -> StackedBatch:
        """This process's stacked batch `key` (worker, workers, data seed, index)."""
        if key in self._drawn:
            return self._drawn[key]
        worker, workers, seed, index = key
        stream = self._streams.get((worker, workers, seed))
        if stream is None or stream.index > index:
            stream = self._streams[(worker, workers, seed)] = IslandBatches(
                self, worker, workers, seed)
        stream.skip(index - stream.index)
        batch = stream.next()
        self._drawn[key] = batch
        while len(self._drawn) > HELD_BATCHES:
            self._drawn.popitem(last=False)
        return batch

    def _hold(self, batch: StackedBatch, key: BatchKey) -> None:
        self._held[id(batch.x)] = (batch.x, key)
        while len(self._held) > HELD_BATCHES:
            self._held.popitem(last=False)

    def _key_of(self, x: Any) -> BatchKey:
        held = self._held.get(id(x))
        if held is None or held[0] is not x:
            raise ValueError(f"{self.name}: an island of several processes steps only on "
                             f"batches from its own batches() (the others draw theirs)")
        return held[1]

    def _check_stacked(self, x: Any, y: Any) -> None:
        import jax

        expected = (self.step.local, self.batch_size)
        shapes = [np.shape(leaf) for leaf in jax.tree_util.tree_leaves((x, y))]
        if any(shape[:2] != expected for shape in shapes):
            raise ValueError(f"{self.name}: an island step takes {expected[0]} stacked "
                             f"batches of {expected[1]} examples; got {shapes}")


def island_workload(workload: FlatWorkload, step: IslandStep,
                    announce: Announce | None = None) -> IslandWorkload:
    """`workload` stepping as the island `step` (this process's view of it)."""
    values = {item.name: getattr(workload, item.name)
              for item in dataclasses.fields(FlatWorkload)}
    return IslandWorkload(**values, island=step, announce=announce)
