"""What the simulated network is: capacities and latencies of n nodes.

`NetworkSpec` is a frozen, validated description and nothing else (no clock,
no flows). Node i has a full-duplex NIC with an uplink of `uplink_bps[i]` and a
downlink of `downlink_bps[i]`; every ordered pair (i, j) may add its own cap
`link_bps[i, j]` (np.inf: no cap) and a one-way latency `latency_s[i, j]`.
akosim.sim.scenario builds one from a run's configuration; akosim.network.maxmin and
akosim.network.fluid read it.

Units: capacities in bits per second, latencies in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def _float_array(name: str, value: object, shape: tuple[int, ...]) -> np.ndarray:
    try:
        array = np.array(value, dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise ValueError(f"NetworkSpec.{name} must be numeric, got {value!r}") from error
    if array.shape != shape:
        raise ValueError(
            f"NetworkSpec.{name} must have shape {shape} (n = {shape[0]} nodes, "
            f"taken from uplink_bps), got shape {array.shape}"
        )
    if np.isnan(array).any():
        where = tuple(int(k) for k in np.argwhere(np.isnan(array))[0])
        raise ValueError(f"NetworkSpec.{name}{list(where)} is NaN")
    array.setflags(write=False)
    return array


def _first_bad(name: str, array: np.ndarray, bad: np.ndarray, expected: str) -> None:
    if bad.any():
        where = tuple(int(k) for k in np.argwhere(bad)[0])
        raise ValueError(
            f"NetworkSpec.{name}{list(where)} = {float(array[where])!r}: expected {expected}"
        )


@dataclass(frozen=True, eq=False)
class NetworkSpec:
    """Capacities (bits/s) and latencies (s) of an n-node network.

    `uplink_bps` and `downlink_bps` have shape (n,) and must be positive and
    finite. `link_bps` and `latency_s` have shape (n, n); `link_bps` must be
    positive (np.inf means no per-pair cap) and `latency_s` non-negative and
    finite. Diagonals are never used (a node does not send to itself). The
    arrays are stored as read-only float64 copies. Equality is identity.
    """

    uplink_bps: np.ndarray
    downlink_bps: np.ndarray
    link_bps: np.ndarray
    latency_s: np.ndarray

    def __post_init__(self) -> None:
        try:
            uplink: np.ndarray | None = np.array(self.uplink_bps, dtype=np.float64)
        except (TypeError, ValueError):
            uplink = None
        if uplink is None or uplink.ndim != 1 or uplink.shape[0] < 1:
            raise ValueError(
                "NetworkSpec.uplink_bps must be a 1-D array with one capacity (bits/s) "
                f"per node, got {self.uplink_bps!r}"
            )
        n = uplink.shape[0]
        uplink = _float_array("uplink_bps", uplink, (n,))
        downlink = _float_array("downlink_bps", self.downlink_bps, (n,))
        link = _float_array("link_bps", self.link_bps, (n, n))
        latency = _float_array("latency_s", self.latency_s, (n, n))
        for name, nic in (("uplink_bps", uplink), ("downlink_bps", downlink)):
            _first_bad(
                name, nic, ~((nic > 0) & np.isfinite(nic)), "a positive, finite capacity in bits/s"
            )
        _first_bad(
            "link_bps", link, ~(link > 0), "a positive capacity in bits/s (np.inf for no cap)"
        )
        _first_bad(
            "latency_s",
            latency,
            ~((latency >= 0) & np.isfinite(latency)),
            "a non-negative, finite latency in seconds",
        )
        object.__setattr__(self, "uplink_bps", uplink)
        object.__setattr__(self, "downlink_bps", downlink)
        object.__setattr__(self, "link_bps", link)
        object.__setattr__(self, "latency_s", latency)

    @property
    def n(self) -> int:
        """Number of nodes."""
        return int(self.uplink_bps.shape[0])

    @classmethod
    def uniform(cls, n: int, bandwidth_bps: float, latency_s: float = 0.0) -> NetworkSpec:
        """n identical nodes: every uplink and downlink at `bandwidth_bps`, no
        per-pair caps, the same one-way latency between every pair."""
        if int(n) != n or n < 1:
            raise ValueError(f"NetworkSpec.uniform: n must be a positive integer, got {n!r}")
        n = int(n)
        return cls(
            uplink_bps=np.full(n, bandwidth_bps, dtype=np.float64),
            downlink_bps=np.full(n, bandwidth_bps, dtype=np.float64),
            link_bps=np.full((n, n), np.inf),
            latency_s=np.full((n, n), latency_s, dtype=np.float64),
        )
