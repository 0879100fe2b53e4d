"""The ns-3 side of the cross-check: a `Pattern` in ns-3's packet-level TCP.

Drives ns-3 (the `ns3` registry package, Python bindings through cppyy) with a
small C++ driver compiled at run time (star_driver.cc): n hosts, each on a
point-to-point link of the pattern's rate to one router (delay: half the
host-to-host latency per link), ns-3's default queues (a FqCoDel queue disc
over a 100-packet device queue), TCP Cubic, one TCP connection per ordered
pair that carries messages, opened at t = 0 (so the first message on a pair
pays the handshake and slow start, as a fresh connection does), and the
pattern's message graph: a message is written to its pair's socket when its
dependencies have arrived plus its gap, and arrives when its last byte is read.

`ns3_available()` says whether the bindings import; loading them takes
~20 s once per process.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from analysis.ns3_crosscheck.ns3_scenario import Pattern

DRIVER_SOURCE = Path(__file__).with_name("star_driver.cc")


@dataclass(frozen=True)
class TcpSettings:
    """The ns-3 TCP configuration every run uses (recorded with the results)."""

    congestion_control: str = "ns3::TcpCubic"
    segment_bytes: int = 1448  # an Ethernet MTU of 1500 with TCP timestamps, as Linux
    buffer_bytes: int = 131072  # ns-3's default send and receive buffers
    stop_s: float = 3600.0  # simulated time limit


DEFAULT_TCP = TcpSettings()


def ns3_available() -> bool:
    """Whether the ns-3 Python bindings (`pip install ns3`) are installed."""
    return importlib.util.find_spec("ns") is not None and importlib.util.find_spec(
        "cppyy") is not None


def ns3_version() -> str:
    from importlib.metadata import version

    return version("ns3")


@contextlib.contextmanager
def _quiet_stderr() -> Any:
    """Hide cling's notes while compiling the driver (it warns about a static
    initialiser of ns-3's headers that the driver does not need); re-raise
    with the captured text if compiling fails."""
    with tempfile.TemporaryFile(mode="w+") as sink:
        saved = os.dup(2)
        os.dup2(sink.fileno(), 2)
        try:
            yield
        except Exception as error:
            os.dup2(saved, 2)
            sink.seek(0)
            raise RuntimeError(f"compiling the ns-3 driver failed: {sink.read()}") from error
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def load_ns3() -> None:
    """Load ns-3 and compile the driver now (else the first run does)."""
    _driver()


@cache
def _driver() -> Any:
    """Load ns-3 and compile the driver once per process; the StarRun class."""
    with _quiet_stderr():
        import cppyy
        from ns import ns  # noqa: F401  (loads the ns-3 libraries into cppyy)

        cppyy.cppdef(DRIVER_SOURCE.read_text())
        star_run = cppyy.gbl.akocrosscheck.StarRun
        star_run()  # the first instance runs the static initialisers cling warns about
    return star_run


def run_ns3(pattern: Pattern, tcp: TcpSettings = DEFAULT_TCP) -> tuple[float, ...]:
    """Arrival time (s) of every message of `pattern` in ns-3."""
    run = _driver()()
    for message in pattern.messages:
        run.AddMessage(message.src, message.dst, float(message.size_bytes), message.gap_s)
    for index, message in enumerate(pattern.messages):
        for before in message.after:
            run.AddDependency(index, before)
    star = pattern.star
    finished = run.Run(star.hosts, float(star.rate_bps), star.latency_s / 2,
                       tcp.congestion_control, tcp.segment_bytes, tcp.buffer_bytes, tcp.stop_s)
    if not finished:
        raise RuntimeError(f"{pattern.name}: ns-3 did not deliver every message within "
                           f"{tcp.stop_s} simulated seconds")
    return tuple(float(run.Arrived(index)) for index in range(len(pattern.messages)))
