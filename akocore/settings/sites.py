"""A cluster of sites: ``--site 4x1gbps --site 4x50mbps --between 30ms,50mbps`` or ``[[site]]``.

People who train across slow links think in sites: a few machines on a fast
network at each site, slow links between sites. This module owns that
description and what it means in the per-node settings every tool already
reads, so the plan, `akosim train`, sweeps, predictions and akorun's real-TCP
testbed all understand it without a line of their own:

- a `Site` is ``ranks`` nodes with ``bandwidth`` NICs (up and down; the
  site's uplink) and a one-way ``latency`` between two ranks of the site
  (default 0); each rank is an island of ``devices_per_rank`` devices
  (default 1) joined by an inside network (``inside_bandwidth``,
  ``inside_latency``) over which the island reduces its gradient each round
  (akosim.network.island_reduce times it); ``repeat`` lays out that many such sites;
- `Between` is the one-way ``latency`` between two nodes of different sites
  and, optionally, a ``bandwidth`` cap on each such pair (the slow link);
- `expand` turns them into ``cluster.workers`` (the sum),
  ``network.bandwidth`` (one per node, sites in order: site 0's nodes are
  ranks 0..w0-1), ``network.latency_matrix`` and, with a cap between sites,
  ``network.link_bandwidth_matrix``, and, when a site has islands of several
  devices, ``cluster.devices_per_rank``, ``network.inside_bandwidth`` and
  ``network.inside_latency`` (one per node), in the layer that gave the sites.

Text forms (`SITE_FORM`, `BETWEEN_FORM`)::

    [RANKSx][DEVICESdev@]BANDWIDTH[,LATENCY][,inside=BANDWIDTH[/LATENCY]][,repeat=N]
        "4x1gbps"           4 ranks of one device, 1 Gbit/s NICs
        "4x1gbps,0.1ms"     the same, 0.1 ms between two of them
        "8dev@1gbps,inside=100gbps/5us,repeat=4"
                            4 sites, each one rank: an island of 8 devices on a
                            100 Gbit/s, 5 us inside network, with a 1 Gbit/s uplink
    between: LATENCY[,BANDWIDTH] in either order ("30ms", "30ms,50mbps", "1gbps,30ms")

TOML (``workers`` and ``ranks`` are one key under two names)::

    [[site]]
    ranks = 1
    devices_per_rank = 8
    bandwidth = "1gbps"
    inside_bandwidth = "100gbps"
    inside_latency = "5us"
    repeat = 4
    [between]
    latency = "30ms"

Limits: the cap between sites applies to each pair of nodes, not to a link the
site's nodes share (akosim's network has NICs and per-pair caps, not a
topology); a site's ranks talk over their NICs; an island's inside network is
timed in closed form (a ring), not simulated message by message.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
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
SITE_FORM = ('[RANKSx][DEVICESdev@]BANDWIDTH[,LATENCY][,inside=BANDWIDTH[/LATENCY]]'
             '[,repeat=N], e.g. "4x1gbps", "4x1gbps,0.1ms" or '
             '"8dev@1gbps,inside=100gbps/5us,repeat=4"')
BETWEEN_FORM = 'LATENCY[,BANDWIDTH] in either order, e.g. "30ms" or "30ms,50mbps"'
SITE_KEYS = ("workers", "ranks", "devices_per_rank", "bandwidth", "latency",
             "inside_bandwidth", "inside_latency", "repeat")
DERIVED_KEYS = ("cluster.workers", "network.bandwidth", "network.latency_matrix",
                "network.link_bandwidth_matrix")
ISLAND_KEYS = ("cluster.devices_per_rank", "network.inside_bandwidth",
               "network.inside_latency")  # derived when a site has islands of devices


@dataclass(frozen=True)
class Site:
    """`workers` ranks with `bandwidth_bps` NICs, `latency_s` one-way between two of them;
    each rank an island of `devices_per_rank` devices on an inside network of
    `inside_bandwidth_bps` and `inside_latency_s`; `repeat` such sites in a row."""

    workers: int
    bandwidth_bps: float
    latency_s: float = 0.0
    devices_per_rank: int = 1
    inside_bandwidth_bps: float = math.inf
    inside_latency_s: float = 0.0
    repeat: int = 1


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


def _whole(text: Any, what: str, where: str) -> int:
    try:
        number = int(text)
    except (TypeError, ValueError):
        number = 0
    if isinstance(text, bool) or number < 1 or str(text).strip() != str(number):
        raise ConfigError(f"{where}: {what} must be a whole number >= 1, got {text!r}; "
                          f"expected {SITE_FORM}", SITE_TABLE)
    return number


def _site_table(value: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    """The fields of a [[site]] table, by the text form's names."""
    where = f"[[site]] {dict(value)}"
    unknown = set(value) - set(SITE_KEYS)
    both = "workers" in value and "ranks" in value
    if unknown or both or "bandwidth" not in value:
        raise ConfigError(f'{where}: expected workers = N (or ranks = N), bandwidth = "1gbps" '
                          f'and optionally latency = "0.1ms", devices_per_rank = 8, '
                          f'inside_bandwidth = "100gbps", inside_latency = "5us", repeat = 4',
                          SITE_TABLE)
    fields = {"ranks": value.get("ranks", value.get("workers", 1)),
              "devices": value.get("devices_per_rank", 1), "bandwidth": value["bandwidth"],
              "latency": value.get("latency", 0), "repeat": value.get("repeat", 1),
              "inside_bandwidth": value.get("inside_bandwidth"),
              "inside_latency": value.get("inside_latency", 0)}
    return fields, where


def _site_text(text: str) -> dict[str, Any]:
    """The fields of a site's text form (checked by `parse_site`)."""
    where = f"--site {text}"
    head, *rest = text.split(",")
    count, x, tail = head.rpartition("x") if "x" in head else ("1", "", head)
    devices, at, bandwidth = tail.partition("@") if "@" in tail else ("1dev", "", tail)
    if not devices.endswith("dev") or not bandwidth or not count:
        raise ConfigError(f"{where}: expected {SITE_FORM}", SITE_TABLE)
    fields: dict[str, Any] = {"ranks": count, "devices": devices[:-len("dev")],
                              "bandwidth": bandwidth, "latency": 0, "repeat": 1,
                              "inside_bandwidth": None, "inside_latency": 0}
    for index, part in enumerate(rest):
        name, equals, item = part.partition("=")
        if equals and name.strip() == "inside" and item:
            bandwidth_text, _, latency_text = item.partition("/")
            fields["inside_bandwidth"] = bandwidth_text
            fields["inside_latency"] = latency_text or 0
        elif equals and name.strip() == "repeat":
            fields["repeat"] = item
        elif not equals and index == 0 and part.strip():
            fields["latency"] = part
        else:
            raise ConfigError(f"{where}: cannot read {part!r}; expected {SITE_FORM}",
                              SITE_TABLE)
    return fields


def parse_site(value: Any) -> Site:
    """A site from its text form or its TOML table; ConfigError saying the form."""
    if isinstance(value, Mapping):
        fields, where = _site_table(value)
    else:
        text = str(value).strip()
        fields, where = _site_text(text), f"--site {text}"
    workers = _whole(fields["ranks"], "the count of ranks", where)
    devices = _whole(fields["devices"], "the devices per rank", where)
    repeat = _whole(fields["repeat"], "repeat", where)
    inside = fields["inside_bandwidth"]
    if devices > 1 and inside is None:
        raise ConfigError(f"{where}: a rank of {devices} devices needs its inside network: "
                          f"add inside=BANDWIDTH[/LATENCY], e.g. inside=100gbps/5us "
                          f"(inside_bandwidth and inside_latency in a [[site]] table)",
                          SITE_TABLE)
    if devices == 1 and inside is not None:
        raise ConfigError(f"{where}: an inside network joins the devices of a rank, and "
                          f"its ranks have one device: give DEVICESdev@ first, e.g. "
                          f"8dev@1gbps,inside=100gbps/5us", SITE_TABLE)
    latency = fields["latency"]
    inside_latency = fields["inside_latency"]
    return Site(workers, _bandwidth(fields["bandwidth"], where),
                0.0 if latency in (0, "0") else _duration(latency, where),
                devices_per_rank=devices,
                inside_bandwidth_bps=math.inf if inside is None else _bandwidth(inside, where),
                inside_latency_s=0.0 if inside_latency in (0, "0")
                else _duration(inside_latency, where),
                repeat=repeat)


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
        where = f"--between {text}"
        parts = [part.strip() for part in text.split(",")]
        if len(parts) > 2 or not all(parts):
            raise ConfigError(f"{where}: expected {BETWEEN_FORM}", BETWEEN_TABLE)
        rates = [part for part in parts if _is_bandwidth(part)]
        latencies = [part for part in parts if part not in rates]
        if len(latencies) != 1:
            raise ConfigError(f"{where}: expected one latency and at most one bandwidth: "
                              f"{BETWEEN_FORM}", BETWEEN_TABLE)
        latency, bandwidth = latencies[0], rates[0] if rates else None
    cap = math.inf if not bandwidth else _bandwidth(bandwidth, where)
    return Between(_duration(latency, where), cap)


def _is_bandwidth(text: str) -> bool:
    try:
        parse_bandwidth(text)
    except (UnitError, ValueError):
        return False
    return True


def unrolled(sites: Sequence[Site]) -> list[Site]:
    """`sites` with each repeated site written out `repeat` times (each once)."""
    return [replace(site, repeat=1) for site in sites for _ in range(site.repeat)]


def site_of_nodes(sites: Sequence[Site]) -> list[int]:
    """The site of each node, sites in order (repeated sites written out)."""
    return [index for index, site in enumerate(unrolled(sites)) for _ in range(site.workers)]


def _latency_text(seconds: float) -> str:
    return "0s" if seconds == 0 else duration_exact_text(seconds)


def expand(sites: Sequence[Site], between: Between | None) -> dict[str, Any]:
    """The per-node settings the sites mean, as human values keyed by dotted key."""
    if not sites:
        raise ConfigError("no site given: --between needs --site (or [between] needs "
                          "[[site]] tables)", SITE_TABLE)
    sites = unrolled(sites)
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
    if any(site.devices_per_rank > 1 for site in sites):
        values["cluster.devices_per_rank"] = [sites[s].devices_per_rank for s in of_node]
        values["network.inside_bandwidth"] = [
            bandwidth_exact_text(sites[s].inside_bandwidth_bps)
            if math.isfinite(sites[s].inside_bandwidth_bps) else "inf" for s in of_node]
        values["network.inside_latency"] = [_latency_text(sites[s].inside_latency_s)
                                            for s in of_node]
    return values

