"""A cluster of sites: ``--site 4x1gbps --site 4x50mbps --between 30ms,50mbps`` or ``[[site]]``.

People who train across slow links think in sites: a few machines on a fast
network at each site, slow links between sites. This module owns that
description and what it means in the per-node settings every tool already
reads, so the plan, `akosim train`, sweeps, predictions and akorun's real-TCP
testbed all understand it without a line of their own:

- a `Site` is ``workers`` nodes with ``bandwidth`` NICs (up and down) and a
  one-way ``latency`` between two nodes of the site (default 0);
- `Between` is the one-way ``latency`` between two nodes of different sites
  and, optionally, a ``bandwidth`` cap on each such pair (the slow link);
- `site_givens` expands them into ``cluster.workers`` (the sum),
  ``network.bandwidth`` (one per node, sites in order: site 0's nodes are
  ranks 0..w0-1), ``network.latency_matrix`` and, with a cap between sites,
  ``network.link_bandwidth_matrix``, in the layer that gave the sites.

Text forms: a site is ``COUNTxBANDWIDTH[,LATENCY]`` ("4x1gbps", "4x1gbps,0.1ms");
between is ``LATENCY[,BANDWIDTH]`` ("30ms", "30ms,50mbps"). TOML::

    [[site]]
    workers = 4
    bandwidth = "1gbps"
    [[site]]
    workers = 4
    bandwidth = "50mbps"
    [between]
    latency = "30ms"
    bandwidth = "50mbps"

Limits: the cap between sites applies to each pair of nodes, not to a link the
site's nodes share (akosim's network has NICs and per-pair caps, not a
topology); a site's own inside network is its NICs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from akocore.settings.normalise import ConfigError
from akocore.units import (
    UnitError,
    bandwidth_exact_text,
    duration_exact_text,
    parse_bandwidth,
    parse_duration,
)

SITE_TABLE = "site"  # [[site]] / --site
BETWEEN_TABLE = "between"  # [between] / --between
SITE_FORM = 'COUNTxBANDWIDTH[,LATENCY], e.g. "4x1gbps" or "4x1gbps,0.1ms"'
BETWEEN_FORM = 'LATENCY[,BANDWIDTH], e.g. "30ms" or "30ms,50mbps"'
DERIVED_KEYS = ("cluster.workers", "network.bandwidth", "network.latency_matrix",
                "network.link_bandwidth_matrix")


@dataclass(frozen=True)
class Site:
    """`workers` nodes with `bandwidth_bps` NICs, `latency_s` one-way between two of them."""

    workers: int
    bandwidth_bps: float
    latency_s: float = 0.0


@dataclass(frozen=True)
class Between:
    """One-way latency between nodes of different sites, and an optional per-pair cap."""

    latency_s: float
    bandwidth_bps: float = math.inf


def _bandwidth(text: Any, where: str) -> float:
    try:
        return parse_bandwidth(str(text))
    except (UnitError, ValueError) as error:
        raise ConfigError(f"{where}: {error}", SITE_TABLE) from None


def _duration(text: Any, where: str) -> float:
    try:
        return parse_duration(str(text))
    except (UnitError, ValueError) as error:
        raise ConfigError(f"{where}: {error}", SITE_TABLE) from None


def parse_site(value: Any) -> Site:
    """A site from its text form or its TOML table; ConfigError saying the form."""
    if isinstance(value, Mapping):
        unknown = set(value) - {"workers", "bandwidth", "latency"}
        if unknown or "workers" not in value or "bandwidth" not in value:
            raise ConfigError(f"[[site]] {dict(value)}: expected workers = N, bandwidth = "
                              f'"1gbps" and optionally latency = "0.1ms"', SITE_TABLE)
        count, bandwidth, latency = value["workers"], value["bandwidth"], value.get("latency", 0)
        where = f"[[site]] {dict(value)}"
    else:
        text = str(value).strip()
        head, _, latency = text.partition(",")
        count, x, bandwidth = head.partition("x")
        where = f"--site {text}"
        if not x or not latency and "," in text:
            raise ConfigError(f"{where}: expected {SITE_FORM}", SITE_TABLE)
        latency = latency or 0
    try:
        workers = int(count)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: the count must be a whole number; expected {SITE_FORM}",
                          SITE_TABLE) from None
    if workers < 1:
        raise ConfigError(f"{where}: a site needs at least 1 worker", SITE_TABLE)
    return Site(workers, _bandwidth(bandwidth, where),
                0.0 if latency in (0, "0") else _duration(latency, where))


def parse_between(value: Any) -> Between:
    """The link between sites from its text form or its TOML table."""
    if isinstance(value, Mapping):
        unknown = set(value) - {"latency", "bandwidth"}
        if unknown or "latency" not in value:
            raise ConfigError(f'[between] {dict(value)}: expected latency = "30ms" and '
                              f'optionally bandwidth = "50mbps"', BETWEEN_TABLE)
        where = f"[between] {dict(value)}"
        latency, bandwidth = value["latency"], value.get("bandwidth")
    else:
        text = str(value).strip()
        latency, _, bandwidth = text.partition(",")
        where = f"--between {text}"
        if not latency:
            raise ConfigError(f"{where}: expected {BETWEEN_FORM}", BETWEEN_TABLE)
    cap = math.inf if not bandwidth else _bandwidth(bandwidth, where)
    return Between(_duration(latency, where), cap)


def site_of_nodes(sites: Sequence[Site]) -> list[int]:
    """The site of each node, sites in order."""
    return [index for index, site in enumerate(sites) for _ in range(site.workers)]


def _latency_text(seconds: float) -> str:
    return "0s" if seconds == 0 else duration_exact_text(seconds)


def expand(sites: Sequence[Site], between: Between | None) -> dict[str, Any]:
    """The per-node settings the sites mean, as human values keyed by dotted key."""
    if not sites:
        raise ConfigError("no site given: --between needs --site (or [between] needs "
                          "[[site]] tables)", SITE_TABLE)
    if len(sites) > 1 and between is None:
        raise ConfigError(f"{len(sites)} sites but no link between them: add --between "
                          f"{BETWEEN_FORM} (or a [between] table)", BETWEEN_TABLE)
    of_node = site_of_nodes(sites)
    n = len(of_node)
    latency = [[_latency_text(0.0 if i == j else sites[of_node[i]].latency_s
                              if of_node[i] == of_node[j] else between.latency_s)  # type: ignore[union-attr]
                for j in range(n)] for i in range(n)]
    values: dict[str, Any] = {
        "cluster.workers": n,
        "network.bandwidth": [bandwidth_exact_text(sites[s].bandwidth_bps) for s in of_node],
        "network.latency_matrix": latency,
    }
    if between is not None and math.isfinite(between.bandwidth_bps):
        cap = bandwidth_exact_text(between.bandwidth_bps)
        values["network.link_bandwidth_matrix"] = [
            ["inf" if of_node[i] == of_node[j] else cap for j in range(n)] for i in range(n)]
    return values

