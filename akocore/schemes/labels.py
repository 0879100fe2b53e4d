"""One-line descriptions of a configured scheme for tables and labels."""

from __future__ import annotations

from akocore.settings.schema import ExchangeConfig


def scheme_label(exchange: ExchangeConfig) -> str:
    """The knobs that distinguish a run of this scheme, e.g. "G=4 tau=10"."""
    if exchange.scheme == "wagma":
        return f"G={exchange.group_size} tau={exchange.global_every}"
    if exchange.scheme == "ps" and exchange.ps_mode == "elastic":
        return f"elastic tau={exchange.push_every}"
    if exchange.scheme == "ps" and exchange.local_steps:
        avg = " averaged" if exchange.push_average else ""
        if exchange.ps_mode == "sync":
            return f"sync local steps, exchange every {exchange.push_every}{avg}"
        return f"local steps, push {exchange.push_every}{avg}, fetch {exchange.fetch_every}"
    return ""

