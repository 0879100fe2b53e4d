"""Datasets for the built-in workloads: what one is, where it comes from, in which order.

- `dataset`: `Dataset` (float32 inputs, int32 labels, in memory) and `DataError`;
- `catalog`: datasets by name and the deterministic per-worker batch order;
- `bundled`: datasets that need no user file (the bundled digits, generated data);
- `files`: datasets read from files the user supplies (cifar10, mnist).

Nothing is re-exported here: import the module that owns the name.
"""
