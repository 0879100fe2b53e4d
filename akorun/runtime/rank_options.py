"""What one rank process is given: its `WorkerOptions` (rank, run config, the ``[akorun]``
settings, directories, timeouts, TLS files, faults to inject) and the `RankSettings` it reads
of the ``[akorun]`` table.

The launcher (akorun.launching) builds these from flags and the cluster file; the runtime
only reads them, so `RankSettings` names what it needs as a protocol rather than importing
the launcher's settings class.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from akocore.settings.key_registry import default_of
from akocore.settings.schema import RunConfig
from akorun.faults import Faults
from akorun.transport.keys import RankKeys
from akorun.transport.sender import DEFAULT_QUEUE_MESSAGES

__all__ = ["RankSettings", "TLSOptions", "WorkerOptions"]


class RankSettings(Protocol):
    """The ``[akorun]`` settings a rank reads (akorun.launching.cluster.AkorunSettings)."""

    @property
    def run_id(self) -> str: ...

    @property
    def allow(self) -> tuple[str, ...]: ...

    @property
    def relay_budget_bytes(self) -> int: ...

    def rank_keys(self, rank: int, world: int) -> RankKeys: ...


@dataclass(frozen=True)
class TLSOptions:
    cert: str | None = None
    key: str | None = None
    ca: str | None = None

    @property
    def enabled(self) -> bool:
        return self.cert is not None

    def server_context(self) -> ssl.SSLContext | None:
        if self.cert is None or self.key is None:
            return None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.cert, self.key)
        return context

    def client_context(self) -> ssl.SSLContext | None:
        """Verify peers against --tls-ca (else the system CAs) and the run's own
        certificate, so a self-signed cluster certificate works without a CA."""
        if not self.enabled:
            return None
        context = ssl.create_default_context(cafile=self.ca)
        if self.cert is not None:
            context.load_verify_locations(cafile=self.cert)
        return context


@dataclass(frozen=True)
class WorkerOptions:
    """Everything one process needs beyond the run config."""

    rank: int
    config: RunConfig
    settings: RankSettings
    out_dir: Path | None = None
    checkpoint_dir: Path | None = None
    checkpoint_every: int = default_of("akorun.checkpoint_every")
    resume: bool = False
    listen_host: str | None = None
    emulate: bool = True
    peer_timeout_s: float = default_of("akorun.peer_timeout")
    join_timeout_s: float = default_of("akorun.join_timeout")
    grace_s: float | None = None  # default: the peer timeout
    progress_every_s: float = 5.0
    quiet: bool = False
    tls: TLSOptions = field(default_factory=TLSOptions)
    faults: Faults = field(default_factory=Faults)
    queue_messages: int = DEFAULT_QUEUE_MESSAGES
