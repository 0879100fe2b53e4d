"""Each scheme's staleness bound, defined once (akosim's tables, docs/guide/schemes.md).

The bound is the most rounds of the other workers' updates a worker's
parameters can miss when it computes a gradient:

- ako: p - 1 + s (a partition reaches a peer within p rounds, the SSP gate adds s)
- allreduce, ps sync: 0 (everyone waits every round)
- ps sync with local steps (SDAG / SAGN): lambda - 1, lambda = push_every (the
  workers step alone for lambda - 1 rounds between synchronous exchanges)
- ps async, DOWNPOUR, ADAG, elastic: s (the SSP gate on fetches and exchanges)
- wagma: tau - 1 (a blocking global average every tau = global_every rounds)
"""

from __future__ import annotations

from akocore.settings.schema import ExchangeConfig


def staleness_bound_rounds(scheme: str, exchange: ExchangeConfig, *, p_max: int,
                           ssp: float) -> float:
    """The staleness bound of `scheme` run with `exchange`'s knobs, largest p and SSP bound."""
    if scheme == "ako":
        return p_max - 1 + ssp
    if scheme == "wagma":
        return float(exchange.global_every - 1)
    if scheme == "ps" and exchange.ps_mode == "sync":
        return float(exchange.push_every - 1) if exchange.local_steps else 0.0
    if scheme == "ps":
        return ssp
    return 0.0
