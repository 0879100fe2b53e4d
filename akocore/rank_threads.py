"""How many CPU threads each rank's XLA client may use when ranks share a host's cores.

This module owns the rule the shells apply before a rank (or a compute measurement that
stands for one) imports JAX. XLA's CPU client sizes its intra-op thread pool to all the
cores the process may run on (or to the ``NPROC`` environment variable when set), so ranks
that share a host each start a pool of every core and their threads compete for the
cores. How much that costs depends on how much of the step XLA splits over the pool: with
the step's large copies inside XLA (before akocore.workloads.flat moved them to NumPy), 3 ranks
of the 1.13M-parameter digits MLP (batch 32) on 2 busy cores took 180-470 ms of wall time
per step with XLA's default pools and 21-28 ms with one thread each; with the copies in
NumPy both are 12-13 ms there. Turning off ``--xla_cpu_multi_thread_eigen`` alone does not
shrink the pool.

The rule: each of R ranks on C cores gets max(1, C // R) threads (``NPROC``), and a rank
held to one thread also runs XLA's single-threaded Eigen (``XLA_FLAGS``). A rank that has
the cores to itself (C // R >= C) gets nothing: XLA's default, unchanged. Variables the
user set win: ``NPROC`` and ``XLA_FLAGS`` are never overwritten, and
``AKO_THREADS_PER_RANK=N`` sets the threads per rank instead of the rule.

Pure: the caller passes the cores (``len(os.sched_getaffinity(0))``) and its environment.
"""

from __future__ import annotations

from collections.abc import Mapping

THREADS_ENV = "AKO_THREADS_PER_RANK"  # the user's override: threads per rank
NPROC_ENV = "NPROC"  # what XLA's CPU client sizes its thread pool to
SINGLE_THREAD_XLA_FLAGS = "--xla_cpu_multi_thread_eigen=false"


def threads_per_rank(cores: int, ranks_on_host: int) -> int:
    """The threads each of `ranks_on_host` ranks gets on `cores` cores (at least one)."""
    return max(1, cores // max(1, ranks_on_host))


def threads_override(env: Mapping[str, str]) -> int | None:
    """AKO_THREADS_PER_RANK as a positive int, None when unset; ValueError (one line)
    when it is not one."""
    text = env.get(THREADS_ENV, "").strip()
    if not text:
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{THREADS_ENV}={text!r}: expected a whole number of threads >= 1 "
                         f"(or unset for {THREADS_ENV}= cores // ranks on the host)")
    return value


def rank_thread_env(cores: int, ranks_on_host: int, env: Mapping[str, str]) -> dict[str, str]:
    """The variables to add to the environment of each of `ranks_on_host` ranks sharing
    `cores` cores, given the environment `env` they would inherit (none of its own
    NPROC or XLA_FLAGS is overridden). Empty when every rank has all the cores."""
    override = threads_override(env)
    threads = override if override is not None else threads_per_rank(cores, ranks_on_host)
    if override is None and threads >= cores:
        return {}
    added: dict[str, str] = {}
    if NPROC_ENV not in env:
        added[NPROC_ENV] = str(threads)
    if threads == 1 and "XLA_FLAGS" not in env:
        added["XLA_FLAGS"] = SINGLE_THREAD_XLA_FLAGS
    return added
