"""In-process emulated links: serialised bandwidth, per-message latency, incast.

This module owns the shaping akorun applies when it emulates a network on one
machine (docs/design/link-emulation.md): portable, unprivileged and deterministic,
unlike tc/netem. It emulates what akosim models: a byte crosses its sender's
uplink, the link's cap (if any) and its receiver's downlink; a message is
delivered `latency_s` after its last byte.

- `SerialLink`: one wire on the event loop's clock (`loop.time()`), rate in
  bits/s. A transmission is a reservation on a virtual clock: it starts when
  both it is ready and the wire is free, and takes nbytes / rate. A wire
  keeps no credit for time it was idle (a token bucket that fills while the
  worker computes lets the next round leave faster than the link; an earlier
  10 ms / 64 KiB burst hid most of a LAN round's transfer time), and a
  transmission's ready time is virtual too, so the event loop's timer
  lateness is not lost bandwidth: back-to-back pieces and queued messages
  continue where the previous one ended on the virtual clock.
- `LinkShaper`: one worker's outgoing links. Every byte passes the worker's
  own `uplink` (its NIC, shared by all destinations) and, if that link has a
  cap, a per-destination wire; both carry a piece at once (the slower one
  paces it). Messages go in pieces of 64 KiB so that concurrent destinations
  interleave on the uplink (FIFO by piece) instead of queueing behind one
  long message. A message is then delayed by the link's latency **after
  serialisation**, so delivery = transfer end + latency, as in akosim. The
  latency does not hold the uplink: other messages flow meanwhile.
- `DownlinkShaper`: one worker's incoming NIC (incast). A message is admitted
  once it has arrived *and* the receiver's downlink could have carried it:
  a downlink bucket whose credit, when a message arrives, is capped at what
  the downlink carries during that message's time on the sender's wire (the
  sender reports it; without a report, nbytes / min(uplink_j, link_j->i)).
  Held messages share the downlink equally (processor sharing, like akosim's
  max-min fair flows). k equal messages sent together at rate u towards a
  downlink d then finish at k x nbytes / d, the fluid model's answer (akosim);
  messages that already shared their senders' uplinks arrive slowly enough not
  to be held; and one message on a downlink at least as fast as its sender is
  not delayed.

`LinkShaper.chunks` yields a body as paced chunks, for use as an aiohttp
streaming request body. aiohttp cannot replay a streamed body (a retry fails
with ClientPayloadError), so build a fresh generator for every attempt.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass

BITS_PER_BYTE = 8
DEFAULT_CHUNK_BYTES = 64 * 1024
PIECE_BYTES = 64 * 1024  # reservation granularity: destinations interleave by this much


class SerialLink:
    """One wire: transmissions are serialised at `rate_bps` on a virtual clock.

    `rate_bps` may be `math.inf` (transmissions take no time). A link belongs
    to one event loop (its times are that loop's `time()`).
    """

    def __init__(self, rate_bps: float) -> None:
        if math.isnan(rate_bps) or rate_bps <= 0:
            raise ValueError(f"rate_bps must be > 0 (or inf), got {rate_bps}")
        self.rate_bps = float(rate_bps)
        self.busy_until_s = -math.inf  # virtual end of the last reservation

    @property
    def unlimited(self) -> bool:
        return math.isinf(self.rate_bps)

    def duration_s(self, nbytes: int) -> float:
        return 0.0 if self.unlimited else nbytes * BITS_PER_BYTE / self.rate_bps

    def reserve(self, ready_s: float, nbytes: int) -> float:
        """Book `nbytes` ready at `ready_s`; return when its last byte is sent (virtual)."""
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes}")
        if self.unlimited:
            return ready_s
        end_s = max(ready_s, self.busy_until_s) + self.duration_s(nbytes)
        self.busy_until_s = end_s
        return end_s

    async def send(self, nbytes: int, ready_s: float | None = None) -> float:
        """Return once `nbytes` ready at `ready_s` (default: now) have been sent; the
        virtual end time is returned, to chain the next transmission from."""
        loop = asyncio.get_running_loop()
        end_s = self.reserve(loop.time() if ready_s is None else ready_s, nbytes)
        await _sleep_until(end_s)
        return end_s


async def _sleep_until(when_s: float) -> None:
    delay_s = when_s - asyncio.get_running_loop().time()
    if delay_s > 0:
        await asyncio.sleep(delay_s)


LinkRates = Mapping[int, float] | Callable[[int], float]


class LinkShaper:
    """One worker's emulated outgoing links: shared uplink, per-link caps and latencies.

    `link_bps` and `latency_s` map a destination rank to its link's rate cap
    (bits/s) and one-way latency (s), as a dict or a function; a destination
    missing from a dict has no cap (inf) and no latency (0).
    """

    def __init__(
        self,
        uplink_bps: float,
        link_bps: LinkRates | None = None,
        latency_s: LinkRates | None = None,
    ) -> None:
        self.uplink = SerialLink(uplink_bps)
        self._link_bps = link_bps
        self._latency_s = latency_s
        self._links: dict[int, SerialLink] = {}
        self._lane_end_s: dict[int, float] = {}  # virtual end of the last message per dest

    @staticmethod
    def _lookup(table: LinkRates | None, dest: int, default: float) -> float:
        if table is None:
            return default
        if callable(table):
            return float(table(dest))
        return float(table.get(dest, default))

    def link(self, dest: int) -> SerialLink:
        """The wire of the link to `dest` (created on first use; inf if uncapped)."""
        wire = self._links.get(dest)
        if wire is None:
            wire = SerialLink(self._lookup(self._link_bps, dest, math.inf))
            self._links[dest] = wire
        return wire

    def latency_of(self, dest: int) -> float:
        """One-way latency (s) of the link to `dest`."""
        latency = self._lookup(self._latency_s, dest, 0.0)
        if not latency >= 0 or math.isinf(latency):
            raise ValueError(f"latency to {dest} must be finite and >= 0 s, got {latency}")
        return latency

    async def pace(self, dest: int, nbytes: int, ready_s: float | None = None) -> None:
        """Return when `nbytes` to `dest` have passed the link and the uplink.

        Bandwidth only, no latency. `ready_s` is when the message was ready to
        go (loop time it was queued; default now): it starts then, or when the
        previous message to `dest` ended on the virtual clock if later, so a
        lane that woke late does not lose link time. Goes piece by piece; each
        piece occupies the link and the uplink at once.
        """
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes}")
        now_s = asyncio.get_running_loop().time()
        start_s = now_s if ready_s is None else min(ready_s, now_s)
        at_s = max(start_s, min(self._lane_end_s.get(dest, -math.inf), now_s))
        link = self.link(dest)
        remaining = nbytes
        while remaining > 0:
            piece = min(remaining, PIECE_BYTES)
            remaining -= piece
            at_s = max(link.reserve(at_s, piece), self.uplink.reserve(at_s, piece))
            await _sleep_until(at_s)
        if nbytes:
            self._lane_end_s[dest] = max(self._lane_end_s.get(dest, -math.inf), at_s)

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


@dataclass(eq=False)
class _Held:
    """A message held at a downlink: bytes still to cross, and its admission."""

    remaining_bytes: float
    admitted: asyncio.Future[None]


class DownlinkShaper:
    """One worker's emulated incoming NIC: admits arrived messages at the downlink's rate.

    `downlink_bps` is this node's NIC rate; `sender_bps(j)` the rate at which
    sender j's messages reach it (min of j's uplink and the j->i link cap), used
    when a sender does not report the message's time on its wire.

    Credit: while no message is held the downlink is idle and banks capacity; an
    arriving message may use at most what the downlink carried during its own
    time on the sender's wire. What the credit does not cover is held, and the
    held messages share the downlink equally (processor sharing, as akosim's
    max-min fair flows do), each admitted when its last byte is through.
    """

    def __init__(self, downlink_bps: float, sender_bps: Callable[[int], float]) -> None:
        if math.isnan(downlink_bps) or downlink_bps <= 0:
            raise ValueError(f"downlink_bps must be > 0 (or inf), got {downlink_bps}")
        self.downlink_bps = float(downlink_bps)
        self._sender_bps = sender_bps
        self._idle_bytes = math.inf  # capacity banked while nothing was held
        self._updated_s: float | None = None
        self._held: list[_Held] = []  # served equally
        self._timer: asyncio.TimerHandle | None = None

    @property
    def _rate_bytes_per_s(self) -> float:
        return self.downlink_bps / BITS_PER_BYTE

    def credit_cap_bytes(self, sender: int, nbytes: int, wire_s: float | None = None) -> float:
        """What the downlink carries while `sender`'s link sends `nbytes`: during
        `wire_s` when the sender reported its time on the wire, else at its link rate."""
        if wire_s is not None and wire_s > 0:
            return wire_s * self._rate_bytes_per_s
        sender_bps = float(self._sender_bps(sender))
        if math.isinf(sender_bps):
            return 0.0  # an unshaped sender: the downlink alone paces the message
        return nbytes * self.downlink_bps / sender_bps

    def _advance(self, now_s: float) -> None:
        """Serve the held messages (equal shares) up to `now_s`; bank idle capacity."""
        last_s = now_s if self._updated_s is None else self._updated_s
        self._updated_s = now_s
        elapsed_s = max(0.0, now_s - last_s)
        rate = self._rate_bytes_per_s
        while elapsed_s > 0 and self._held:
            share = rate / len(self._held)
            step_s = min(elapsed_s, min(h.remaining_bytes for h in self._held) / share)
            for held in self._held:
                held.remaining_bytes -= step_s * share
            elapsed_s -= step_s
            self._release(done_below_bytes=1e-6 * rate)
        self._release(done_below_bytes=1e-6 * rate)
        if not self._held:
            self._idle_bytes += elapsed_s * rate

    def _release(self, done_below_bytes: float) -> None:
        """Admit every held message with (almost) nothing left."""
        keep = []
        for held in self._held:
            if held.remaining_bytes <= done_below_bytes:
                if not held.admitted.done():
                    held.admitted.set_result(None)
            else:
                keep.append(held)
        self._held = keep

    def _reschedule(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._held:
            loop = asyncio.get_running_loop()
            share = self._rate_bytes_per_s / len(self._held)
            next_s = min(h.remaining_bytes for h in self._held) / share
            self._timer = loop.call_at(loop.time() + next_s, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._advance(asyncio.get_running_loop().time())
        self._reschedule()

    async def admit(self, sender: int, nbytes: int, wire_s: float | None = None) -> None:
        """Return when `nbytes` from `sender`, arrived now after `wire_s` on the sender's
        wire (if known), have crossed the downlink."""
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes}")
        if math.isinf(self.downlink_bps) or nbytes == 0:
            return
        loop = asyncio.get_running_loop()
        self._advance(loop.time())
        # idle time before this message's transfer began is lost, as on a wire
        credit = min(self._idle_bytes, self.credit_cap_bytes(sender, nbytes, wire_s))
        served = min(float(nbytes), credit)
        self._idle_bytes = credit - served
        if nbytes - served <= 1e-6 * self._rate_bytes_per_s:
            return
        held = _Held(nbytes - served, loop.create_future())
        self._held.append(held)
        self._reschedule()
        try:
            await held.admitted
        finally:
            if held in self._held:  # cancelled while held: give its share back
                self._advance(loop.time())
                if held in self._held:
                    self._held.remove(held)
                self._reschedule()
