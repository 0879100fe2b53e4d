"""In-process emulated links: token-bucket bandwidth and per-message latency.

This module owns the sender-side shaping akorun applies when it emulates a
network on one machine (realmode.md section 4 D): portable, unprivileged and
deterministic, unlike tc/netem. It shapes the sender only; the receiver's
downlink (incast) is not emulated.

- `TokenBucket`: an asyncio token bucket on the event loop's clock
  (`loop.time()`), rate in bits/s, burst in bytes. Consumers reserve tokens in
  arrival order and may run the bucket into debt; each waits until its debt is
  repaid, so concurrent consumers are served FIFO and pacing is exact.
  Requests larger than the burst are split into burst-sized pieces, so
  concurrent senders interleave instead of queueing behind one long sleep.
- `LinkShaper`: one worker's outgoing links. Every byte passes the worker's
  own `uplink` bucket (its NIC, shared by all destinations) and, if that link
  has a cap, a per-destination bucket. A message is then delayed by the link's
  latency **after serialisation**: it is delivered `latency_s` after its last
  byte has passed the buckets, so delivery = transfer end + latency, as in
  akosim. The latency does not hold the uplink: other messages flow meanwhile.

`LinkShaper.chunks` yields a body as paced chunks, for use as an aiohttp
streaming request body. aiohttp cannot replay a streamed body (a retry fails
with ClientPayloadError), so build a fresh generator for every attempt.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Callable, Mapping

BITS_PER_BYTE = 8
DEFAULT_CHUNK_BYTES = 64 * 1024
MIN_BURST_BYTES = 64 * 1024
BURST_WINDOW_S = 0.010  # default burst: this much time at full rate, at least MIN_BURST_BYTES


def default_burst_bytes(rate_bps: float) -> float:
    """max(64 KiB, 10 ms at `rate_bps`); 64 KiB for an infinite rate."""
    if math.isinf(rate_bps):
        return float(MIN_BURST_BYTES)
    return max(float(MIN_BURST_BYTES), rate_bps / BITS_PER_BYTE * BURST_WINDOW_S)


class TokenBucket:
    """Token bucket on the running loop's clock; tokens are bytes.

    The bucket starts full. `rate_bps` may be `math.inf` (never waits). A
    bucket belongs to one event loop (its clock is that loop's `time()`).
    """

    def __init__(self, rate_bps: float, burst_bytes: float | None = None) -> None:
        if math.isnan(rate_bps) or rate_bps <= 0:
            raise ValueError(f"rate_bps must be > 0 (or inf), got {rate_bps}")
        burst = default_burst_bytes(rate_bps) if burst_bytes is None else float(burst_bytes)
        if not burst >= 1 or math.isinf(burst):
            raise ValueError(f"burst_bytes must be finite and >= 1, got {burst_bytes}")
        self.rate_bps = float(rate_bps)
        self.burst_bytes = burst
        self._tokens = burst  # bytes; negative = debt owed by waiting consumers
        self._updated_s: float | None = None  # loop time of the last refill

    @property
    def rate_bytes_per_s(self) -> float:
        return self.rate_bps / BITS_PER_BYTE

    @property
    def unlimited(self) -> bool:
        return math.isinf(self.rate_bps)

    @property
    def piece_bytes(self) -> int:
        """Largest single reservation; bigger consumptions are split into these."""
        return max(1, int(self.burst_bytes))

    def _refill(self, now_s: float) -> None:
        if self._updated_s is not None:
            elapsed_s = max(0.0, now_s - self._updated_s)
            self._tokens = min(self.burst_bytes, self._tokens + elapsed_s * self.rate_bytes_per_s)
        self._updated_s = now_s

    def tokens(self) -> float:
        """Tokens (bytes) available now; negative while consumers wait. Needs a running loop."""
        if not self.unlimited:
            self._refill(asyncio.get_running_loop().time())
        return self._tokens

    async def consume(self, nbytes: int) -> None:
        """Return when `nbytes` may be sent, waiting for tokens as needed."""
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes}")
        if self.unlimited:
            return
        loop = asyncio.get_running_loop()
        remaining = nbytes
        while remaining > 0:
            piece = min(remaining, self.piece_bytes)
            remaining -= piece
            self._refill(loop.time())
            self._tokens -= piece
            if self._tokens < 0:
                try:
                    await asyncio.sleep(-self._tokens / self.rate_bytes_per_s)
                except asyncio.CancelledError:
                    self._tokens += piece  # those bytes were never sent
                    raise


LinkRates = Mapping[int, float] | Callable[[int], float]


class LinkShaper:
    """One worker's emulated outgoing links: shared uplink, per-link caps and latencies.

    `link_bps` and `latency_s` map a destination rank to its link's rate cap
    (bits/s) and one-way latency (s), as a dict or a function; a destination
    missing from a dict has no cap (inf) and no latency (0). `burst_bytes`
    applies to every bucket (default: `default_burst_bytes` of its rate).
    """

    def __init__(
        self,
        uplink_bps: float,
        link_bps: LinkRates | None = None,
        latency_s: LinkRates | None = None,
        *,
        burst_bytes: float | None = None,
    ) -> None:
        self.uplink = TokenBucket(uplink_bps, burst_bytes)
        self._link_bps = link_bps
        self._latency_s = latency_s
        self._burst_bytes = burst_bytes
        self._links: dict[int, TokenBucket] = {}

    @staticmethod
    def _lookup(table: LinkRates | None, dest: int, default: float) -> float:
        if table is None:
            return default
        if callable(table):
            return float(table(dest))
        return float(table.get(dest, default))

    def link(self, dest: int) -> TokenBucket:
        """The bucket of the link to `dest` (created on first use; inf if uncapped)."""
        bucket = self._links.get(dest)
        if bucket is None:
            rate_bps = self._lookup(self._link_bps, dest, math.inf)
            bucket = TokenBucket(rate_bps, self._burst_bytes)
            self._links[dest] = bucket
        return bucket

    def latency_of(self, dest: int) -> float:
        """One-way latency (s) of the link to `dest`."""
        latency = self._lookup(self._latency_s, dest, 0.0)
        if not latency >= 0 or math.isinf(latency):
            raise ValueError(f"latency to {dest} must be finite and >= 0 s, got {latency}")
        return latency

    async def pace(self, dest: int, nbytes: int) -> None:
        """Return when `nbytes` to `dest` have passed the link and uplink buckets.

        Bandwidth only, no latency. Goes piece by piece through the link bucket
        and then the uplink, so a slow link does not hold uplink tokens.
        """
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes}")
        link = self.link(dest)
        piece_bytes = min(link.piece_bytes, self.uplink.piece_bytes)
        remaining = nbytes
        while remaining > 0:
            piece = min(remaining, piece_bytes)
            remaining -= piece
            await link.consume(piece)
            await self.uplink.consume(piece)

    async def transfer(self, dest: int, nbytes: int) -> None:
        """Return when a whole message of `nbytes` would be delivered: pace, then latency.

        For a body sent in one piece (replayable); `chunks` is the streaming form.
        """
        await self.pace(dest, nbytes)
        latency = self.latency_of(dest)
        if latency > 0:
            await asyncio.sleep(latency)

    async def chunks(
        self,
        dest: int,
        body: bytes | bytearray | memoryview,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        *,
        head: bytes | bytearray | memoryview = b"",
    ) -> AsyncIterator[memoryview]:
        """Yield `head` (if any) then `body` in chunks, each once its bytes may go.

        Chunks are zero-copy slices of `body`. The last one is held back by the
        link's latency, so the message completes at transfer end + latency.
        Pass the wire header as `head` to pace it too. Single use: make a new
        generator for every send attempt.
        """
        if chunk_bytes <= 0:
            raise ValueError(f"chunk_bytes must be > 0, got {chunk_bytes}")
        view = memoryview(body).cast("B")
        pieces: list[memoryview] = []
        if len(head):
            pieces.append(memoryview(head).cast("B"))
        pieces.extend(
            view[start : start + chunk_bytes] for start in range(0, len(view), chunk_bytes)
        )
        latency = self.latency_of(dest)
        for index, piece in enumerate(pieces):
            await self.pace(dest, len(piece))
            if index == len(pieces) - 1 and latency > 0:
                await asyncio.sleep(latency)
            yield piece
        if not pieces and latency > 0:
            await asyncio.sleep(latency)
