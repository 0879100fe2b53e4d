"""Sweeps: the grid, its runs in a process pool or as cluster array shards, the summary."""
