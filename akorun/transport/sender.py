"""Per-peer outgoing partials: one bounded queue and one sender task per peer.

This module owns getting encoded messages to one peer, in order, exactly as
often as needed:

- `PeerSender.put` appends to a bounded queue. It returns at once unless the
  queue is full; then it waits for room. That wait is the backpressure that
  keeps memory bounded (no unbounded buffers: a slow peer slows its sender's
  training loop down instead of growing a queue). For a peer that is
  suspended (silent past the peer timeout, probably dead) a full queue takes
  its OLDEST message out instead. An ako gradient (Kind.GRAD: gradients add
  up) is folded into the peer's `OwedGap` (akorun.transport.owed): its values are summed per
  partition (at most one flat vector per peer, however long the silence)
  and its round added to a range of rounds; any other kind is dropped, as
  counted in ``send_dropped``. (A queued message keeps its `Partial` for
  this, next to its encoded bytes.) When the peer is heard again the lane
  sends the gap first, as ONE folded message (akocore.messages.Partial
  `first_round`: the sum of rounds first..last, acknowledged as that range):
  every contribution reaches the peer exactly once, its delivery log has no
  permanent hole, and the catch-up costs one gradient's send time whatever
  the length of the absence. `dropped_until` (the highest round
  folded) is what a restarting peer's donor must cover (rejoin protocol);
  a restart clears the gap (the donor's snapshot holds it).
- `PeerSender.run` is the peer's lane: it takes messages in queue order,
  paces each through the emulated link if there is one, and starts its
  delivery, which POSTs it until the peer answers 200 (applied, or a
  duplicate). A peer's messages travel in queue order over ONE connection, so
  round t+1's bytes never compete with round t's for the same path: over HTTP
  one POST runs at a time (`DEFAULT_WINDOW`); on the data path up to
  `akorun.transport.datapath_client.PIPELINE_DEPTH` requests are written back
  to back on that connection (pipelined: the next body flows while the peer
  applies the one before; the peer still reads and applies them one by one). Two
  POSTs at once (the former default, ``AKORUN_SEND_WINDOW=2``) put them on
  two pooled connections; on real kernel TCP (3 ranks in network namespaces,
  tc tbf 20 Mbit/s egress, digits-cnn, p in {1, 3}, s in {0, 2};
  analysis/tcp_connections.py) the two connections split each link unevenly
  and late, and round times alternate slow/fast: one connection gave
  rounds 11-31 % shorter and a coefficient of variation 2-4.5x smaller in every
  configuration (figures in docs/guide/testbed.md). What one
  connection costs is one receiver turnaround (verify, apply, answer: about
  a millisecond, `akorun measure-messages`) per message between bodies, which
  the data path's pipelining hides.
  The receivers' delivery logs do not rely on order either way.
  Every answer is judged by akorun.transport.answers before the lane acts on it: its body
  is read only up to a small cap, and only an answer tagged by the peer for
  this very request counts. Connection errors, timeouts, untagged answers of
  any status (forged on the path, or refused before the seal was read), 5xx,
  503, 421 (stale session) and a tagged 400 ``damaged`` (bytes altered on the
  way) keep it owed and retry with capped exponential backoff and jitter. A
  tagged 400/401/409/413/422 is the peer refusing the message itself (a bug or
  a misconfiguration): logged loudly, counted in ``refused_for_good``, and the
  rank exits non-zero at its end (its replicas cannot be equal).
- Bodies are whole `bytes` with an explicit Content-Length (replayable: aiohttp
  silently retries once on a dead pooled connection, and the receiver's
  idempotency by (sender, round, part) makes that safe). On an emulated
  network each message first passes `LinkShaper.pace` in the lane (the link and
  the uplink as serial wires on a virtual clock: bandwidth serialises messages), then waits
  the link latency in its own delivery task (latency does not hold the link:
  later messages are paced meanwhile, as on a real link, and as akosim models
  delivery = transfer end + latency), then goes in one piece. (Streaming
  `LinkShaper.chunks` as the body would cost an await per 64 KiB and a body
  aiohttp cannot replay.)

Partials take akorun's data path (akorun.transport.datapath: the same port, no HTTP, the same
seals and tagged answers) unless ``AKORUN_PARTIALS_OVER=http`` or the peer is
reached over TLS; "POST" above means one request on either. A path that carries only
HTTP (a proxy in front of the peer) is found within seconds and this peer's partials
then go as HTTP POSTs (akorun.transport.path_check).

`acked_round` (highest round this peer acknowledged) and `dropped_until` are
what the rejoin handshake reports about this peer.

Past ~500 lines for now: one peer's lane drives two paths (HTTP POSTs and the
data path) through one answer judgment; each path's request code is the piece to
move into its own module next.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum

import aiohttp

from akocore.messages import Kind, Partial
from akocore.settings.key_registry import default_of
from akorun.metrics import PeerCounters, timed_call
from akorun.transport.answers import (
    PARTIAL_ANSWER_MAX_BYTES,
    AnswerTooLarge,
    Verdict,
    read_bounded,
    verdict,
)
from akorun.transport.cancelling import cancel_and_wait, raise_if_cancelling
from akorun.transport.datapath import FramingError
from akorun.transport.datapath_client import PIPELINE_DEPTH, DataAnswer, DataLink
from akorun.transport.emulated_links import LinkShaper
from akorun.transport.keys import AUTH_HEADER, RELAY_HEADER, STALE_SESSION, PartialSealer, Seal
from akorun.transport.owed import OwedGap
from akorun.transport.path_check import CHECK_AFTER_S, DataPathCheck

log = logging.getLogger("akorun")

DUPLICATE_HEADER = "X-Ako-Duplicate"
# seconds the receiver held the message at its emulated downlink (incast), informational
DOWNLINK_WAIT_HEADER = "X-Ako-Downlink-Wait-S"
# seconds the message spent on the sender's emulated wire (its bytes' arrival time at the
# receiver), so the receiver's emulated downlink knows how fast they came; informational
WIRE_TIME_HEADER = "X-Ako-Wire-S"
DEFAULT_QUEUE_MESSAGES: int = default_of("akorun.queue_messages")  # the registry's
DEFAULT_WINDOW = 1  # HTTP POSTs in flight to one peer: one, so one connection carries a
# peer's messages in order and round t+1 never competes with round t (see the module
# docstring); the data path pipelines PIPELINE_DEPTH requests on its one connection
DATA_PATH_ENV = "AKORUN_PARTIALS_OVER"  # "http": partials as HTTP POSTs (a comparison)
WINDOW_ENV = "AKORUN_SEND_WINDOW"  # a benchmark's override of DEFAULT_WINDOW (1 or 2)
# A connect attempt started while the path was cut waits for the kernel's SYN retransmits
# (1 s, 3 s, 7 s ...); giving it up after 1.5 s (then the backoff retries at once on a new
# one) reconnects within about 1.5 s of the path's return instead of the session's 5 s.
PARTIAL_CONNECT_TIMEOUT_S = 1.5
KICK_AFTER_S = 1.0  # a POST outstanding this long when its peer is heard again goes anew
PARTIAL_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=PARTIAL_CONNECT_TIMEOUT_S,
                                        sock_read=120.0)
_FATAL_STATUSES = {400: "malformed", 401: "bad_signature", 409: "wrong_run", 413: "too_large",
                   422: "non_finite"}


def configured_window(environ: Mapping[str, str] = os.environ,
                      default: int = DEFAULT_WINDOW) -> int:
    """Requests in flight per peer: `WINDOW_ENV` if set (a whole number >= 1), else
    `default`. Only the connection benchmark sets it (analysis/tcp_connections.py)."""
    text = environ.get(WINDOW_ENV)
    if text is None or not text.strip():
        return default
    try:
        window = int(text)
    except ValueError:
        window = 0
    if window < 1:
        raise ValueError(f"{WINDOW_ENV} must be a whole number >= 1, got {text!r}")
    return window


def configured_data_path(environ: Mapping[str, str] = os.environ) -> bool:
    """Partials over akorun's data path (the default) unless `DATA_PATH_ENV` is ``http``
    (a comparison: the HTTP POSTs of earlier versions). Over TLS they are HTTP anyway."""
    text = environ.get(DATA_PATH_ENV, "").strip().lower()
    if text in ("", "datapath"):
        return True
    if text == "http":
        return False
    raise ValueError(f"{DATA_PATH_ENV} must be 'datapath' or 'http', got {text!r}")


def seconds_header(text: str | None) -> float:
    """A non-negative number of seconds from a response header; 0 when absent or bad."""
    try:
        value = float(text) if text is not None else 0.0
    except ValueError:
        return 0.0
    return value if 0.0 <= value < float("inf") else 0.0


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One encoded message (header + body), shared by every destination of a multicast."""

    data: bytes
    kind: Kind
    round: int
    part: int
    final: bool = False
    queued_s: float = 0.0  # loop time it was queued (set by the worker)
    partial: Partial | None = None  # what `data` encodes, for folding into a gap


    @property
    def nbytes(self) -> int:
        return len(self.data)

    @property
    def first_round(self) -> int:
        """The first round it covers (a folded message covers a range)."""
        return self.partial.rounds_from if self.partial is not None else self.round


@dataclass(frozen=True)
class RetryPolicy:
    """Capped exponential backoff with jitter: delay_k = U(0.5, 1) * min(cap, first * 2**k)."""

    first_delay_s: float = 0.01
    max_delay_s: float = 1.0
    factor: float = 2.0

    def delay_s(self, attempt: int, rng: random.Random) -> float:
        base = min(self.max_delay_s, self.first_delay_s * self.factor ** min(attempt, 30))
        return base * rng.uniform(0.5, 1.0)


class Outcome(Enum):
    DELIVERED = "delivered"
    DUPLICATE = "duplicate"
    RETRY = "retry"
    REJECTED = "rejected"


class PeerSender:
    """The queue of messages owed to one peer and the task that delivers them."""

    def __init__(self, dest: int, url: str, session: aiohttp.ClientSession, *,
                 counters: PeerCounters, maxsize: int = DEFAULT_QUEUE_MESSAGES,
                 shaper: LinkShaper | None = None, policy: RetryPolicy | None = None,
                 is_suspended: Callable[[], bool] = lambda: False,
                 on_delivered: Callable[[int], None] = lambda dest: None,
                 ssl: object = True, seed: int = 0, window: int | None = None,
                 encode: Callable[[Partial], bytes] | None = None,
                 sealer: PartialSealer | None = None, data_path: bool | None = None) -> None:
        # partials over akorun's data path (akorun.transport.datapath) instead of HTTP POSTs (None:
        # as `configured_data_path` says); only to an http:// URL (over TLS they stay HTTP)
        if data_path is None:
            data_path = configured_data_path()
        self.datalink = DataLink.for_url(url) if data_path else None
        self.path_check = DataPathCheck(dest, url, session, ssl)  # a path that carries only HTTP
        if window is None:  # the data path pipelines its requests on one connection
            window = configured_window(
                default=DEFAULT_WINDOW if self.datalink is None else PIPELINE_DEPTH)
        if maxsize < 1 or window < 1:
            raise ValueError(f"maxsize and window must be >= 1, got {maxsize}, {window}")
        self.dest = dest
        self.url = url
        self.session = session
        self.counters = counters
        self.maxsize = maxsize
        self.shaper = shaper
        self.policy = policy or RetryPolicy()
        self.is_suspended = is_suspended
        self.on_delivered = on_delivered
        self.ssl = ssl
        self.sealer = sealer  # seals each attempt for dest's current session (akorun.keys)
        self.queue: deque[Outgoing] = deque()
        self.encode = encode  # re-encodes a folded round (no encoder: dropped, not folded)
        self.drops_told = False  # a message that cannot be folded was dropped (logged once)
        self.gap = OwedGap()
        self.in_flight: list[Outgoing] = []
        self._downlink_wait_s: dict[int, float] = {}  # id(message) -> receiver's downlink hold
        self._wire_s: dict[int, float] = {}  # id(message) -> seconds it was paced (first time)
        self.window = window
        self.acked_round = -1
        self.dropped_until = -1
        self._changed = asyncio.Event()
        self._rng = random.Random(seed)
        self._task: asyncio.Task[None] | None = None
        self._deliveries: set[asyncio.Task[None]] = set()
        self._posts = asyncio.Semaphore(window)  # POSTs to this peer at once
        self._attempts: dict[int, tuple[asyncio.Future[Outcome], float]] = {}  # see `kick`

    # ---------------------------------------------------------------- queue

    @property
    def depth(self) -> int:
        """Messages owed: folded, queued and in flight."""
        return len(self.gap) + len(self.queue) + len(self.in_flight)

    @property
    def idle(self) -> bool:
        return not self.queue and not self.in_flight and not len(self.gap)

    @property
    def acked_through(self) -> int:
        """Highest round r such that every message of rounds <= r was acknowledged
        (or given up); `acked_round` is the highest acknowledged at all."""
        owed = [m.first_round for m in (*self.in_flight, *self.queue)]
        oldest_folded = self.gap.oldest_round()
        if oldest_folded is not None:
            owed.append(oldest_folded)
        return min(owed) - 1 if owed else self.acked_round

    def forget_gap(self) -> None:
        """The peer restarted from a donor's snapshot, which holds what was folded."""
        if len(self.gap):
            log.warning("peer %d restarted: its folded rounds %s are covered by its "
                        "donor's snapshot", self.dest, self.gap.ranges)
        self.gap.clear()
        self._changed.set()

    def notify(self) -> None:
        """Wake waiters (a change of the peer's suspension counts). A peer heard again
        (not suspended) also has its stale POSTs abandoned for a new connection (`kick`)."""
        self._changed.set()
        if not self.is_suspended():
            self.kick()

    def kick(self, older_than_s: float = KICK_AFTER_S) -> None:
        """Abandon POSTs outstanding for longer than `older_than_s`: sent on a connection
        that a cut or a pause left waiting on the kernel's retransmission backoff (seconds
        to tens of seconds after the path is back), they go again at once on a new one
        (a copy that did arrive is acknowledged as a duplicate: exactly once holds)."""
        now = asyncio.get_running_loop().time()
        for task, started_s in list(self._attempts.values()):
            if now - started_s > older_than_s and not task.done():
                task.cancel()

    async def put(self, message: Outgoing) -> None:
        """Queue `message`; wait while the queue is full (fold the oldest if suspended)."""
        while len(self.queue) >= self.maxsize:
            if self.is_suspended():
                dropped = self.queue.popleft()
                self.dropped_until = max(self.dropped_until, dropped.round)
                self.counters.send_dropped["overflow"] += 1  # out of the queue, folded
                if dropped.partial is not None and dropped.kind is Kind.GRAD \
                        and self.encode is not None:  # ako gradients add up; others drop
                    self.gap.fold(dropped.partial)
                elif not self.drops_told:  # said once: the finish checks what it cost
                    self.drops_told = True
                    log.warning("peer %d is suspended and its queue is full: its oldest %s "
                                "message (round %d) is dropped, as later ones may be; a "
                                "scheme that needs them stops or fails its replica check "
                                "at the finish (diloco re-syncs the anchor first)",
                                self.dest, dropped.kind.name, dropped.round)
                break
            self._changed.clear()
            await self._changed.wait()
        self.queue.append(message)
        self._changed.set()

    async def wait(self, done: Callable[[], bool], poll_s: float = 0.25) -> None:
        """Return once `done()` is true; re-checked on every change and every `poll_s`."""
        while not done():
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), poll_s)
            except TimeoutError:
                pass
            raise_if_cancelling()  # a cancellation that wait_for returned over

    # ---------------------------------------------------------------- tasks

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self.run(), name=f"sender-{self.dest}")
            if self.datalink is not None:  # connected before the first message needs it
                warm = asyncio.create_task(self.datalink.warm(), name=f"warm-{self.dest}")
                self._deliveries.add(warm)
                warm.add_done_callback(self._deliveries.discard)

    async def stop(self) -> None:
        await cancel_and_wait([self._task, *self._deliveries],
                              what=f"deliveries to peer {self.dest}")
        self._task = None
        self._deliveries.clear()
        if self.datalink is not None:
            self.datalink.close()

    @property
    def _in_flight_limit(self) -> int:
        # emulated links hold up to the queue's worth of messages in their latency,
        # as a real link holds its bandwidth-delay product; otherwise `window`
        return max(self.window, self.maxsize) if self.shaper is not None else self.window

    async def run(self) -> None:
        """The peer's lane: take messages in order, pace them through the emulated
        link (if any), and start their delivery; latency does not hold the lane."""
        loop = asyncio.get_running_loop()
        while True:
            room_s = 0.0  # when the lane could take the next message, if it had to wait
            while not (self.queue or len(self.gap)) \
                    or len(self.in_flight) >= self._in_flight_limit:
                self._changed.clear()
                await self._changed.wait()
                room_s = loop.time()
            if len(self.gap):  # what a suspension folded goes first (it is older)
                assert self.encode is not None
                partial = self.gap.take()
                data, encode_s = timed_call(self.encode, partial)
                self.counters.software_send_s += encode_s
                message = Outgoing(data, partial.kind, partial.round,
                                   partial.part, partial.final, loop.time(), partial)
            else:
                message = self.queue.popleft()
            self.in_flight.append(message)
            self._changed.set()  # room in the queue
            if self.shaper is not None:
                # ready since it was queued or the lane got room: the link's virtual
                # clock then charges none of the lane's own wake-up lateness
                ready_s = max(message.queued_s, room_s) or None
                pace_start_s = loop.time()
                await self.shaper.pace(self.dest, message.nbytes, ready_s=ready_s)
                self._wire_s[id(message)] = loop.time() - pace_start_s
            task = asyncio.create_task(self.deliver(message, paced_at_s=loop.time()))
            self._deliveries.add(task)
            task.add_done_callback(self._deliveries.discard)

    async def deliver(self, message: Outgoing, *, paced: bool = True,
                      paced_at_s: float | None = None) -> None:
        """POST `message` (after the link latency) until the peer takes it or refuses it
        for good. A retry is paced through the emulated link again, like a resend.

        `paced_at_s` (loop time the lane finished pacing it): on an emulated link a
        first-attempt delivery adds its time from there to the acknowledgement, less
        the emulated latency, to the peer's `stack_s`: what a message costs beyond
        the emulated wire (task hops, HTTP, the receiver's verification and apply),
        which akosim can take as a per-message latency (``message_overhead_s``).
        Without emulation that time holds the real network's, so it is not counted:
        the software's own share is `software_send_s` (seals, answer checks) here and
        the receiver's ``software_receive_s`` (``message_software_s``)."""
        loop = asyncio.get_running_loop()
        attempt = 0
        try:
            while True:
                if self.shaper is not None:
                    if not paced:
                        await self.shaper.pace(self.dest, message.nbytes)
                    latency_s = self.shaper.latency_of(self.dest)
                    if latency_s > 0:
                        await asyncio.sleep(latency_s)
                async with self._posts:
                    attempt_start_s = loop.time()
                    outcome, kicked = await self._attempt_unless_kicked(message,
                                                                        attempt_start_s)
                if outcome in (Outcome.DELIVERED, Outcome.DUPLICATE):
                    now = loop.time()
                    self.acked_round = max(self.acked_round, message.round)
                    self.counters.bytes_sent += message.nbytes
                    self.counters.messages_sent += 1
                    self.counters.send_s += now - attempt_start_s
                    held_s = self._downlink_wait_s.pop(id(message), 0.0)
                    if paced_at_s is not None and attempt == 0 and self.shaper is not None:
                        # the emulated latency and the receiver's emulated downlink are
                        # the network's; the rest is the software stack's
                        latency = self.shaper.latency_of(self.dest) if self.shaper else 0.0
                        self.counters.stack_s += max(0.0, now - paced_at_s - latency - held_s)
                        self.counters.stack_messages += 1
                    if message.queued_s:
                        delivery_s = now - message.queued_s
                        self.counters.delivery_s += delivery_s
                        self.counters.max_delivery_s = max(self.counters.max_delivery_s,
                                                           delivery_s)
                    if outcome is Outcome.DELIVERED:  # a duplicate's ack is no new evidence
                        self.on_delivered(self.dest)
                    return
                if outcome is Outcome.REJECTED:
                    return
                self.counters.retries += 1
                raise_if_cancelling()  # a stop an inner wait_for swallowed ends it here
                if not kicked:
                    await asyncio.sleep(self.policy.delay_s(attempt, self._rng))
                attempt += 1
                paced = False
        finally:
            self._downlink_wait_s.pop(id(message), None)
            self._wire_s.pop(id(message), None)
            self.in_flight.remove(message)
            self._changed.set()

    async def _attempt_unless_kicked(self, message: Outgoing,
                                     started_s: float) -> tuple[Outcome, bool]:
        """`attempt`, as a task `kick` may cancel: (RETRY, True) when it did."""
        task = asyncio.ensure_future(self.attempt(message))
        self._attempts[id(message)] = (task, started_s)
        try:
            return await task, False
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if task.cancelled() and (current is None or not current.cancelling()):
                log.debug("send to %d (round %d) abandoned for a new connection", self.dest,
                          message.round)
                return Outcome.RETRY, True
            raise
        finally:
            self._attempts.pop(id(message), None)

    async def attempt(self, message: Outgoing) -> Outcome:
        """One attempt at `message` (a data-path request, or a POST); what to do next."""
        headers = {"Content-Type": "application/octet-stream"}
        wire_s = self._wire_s.get(id(message))
        if wire_s is not None:
            headers[WIRE_TIME_HEADER] = f"{wire_s:.6f}"
        seal_start_s = time.perf_counter()
        seal = self.sealer.seal(self.dest, message.data) if self.sealer is not None else None
        if seal is not None and self.sealer is not None:
            headers[AUTH_HEADER] = seal.text()
            headers[RELAY_HEADER] = self.sealer.endorsements(message.data)
        self.counters.software_send_s += time.perf_counter() - seal_start_s
        if self.datalink is not None:
            try:
                answer = await self._exchange(self.datalink, headers, message)
                if answer is None:  # the path carries only HTTP: again as a POST
                    return Outcome.RETRY
            except AnswerTooLarge as error:
                self._unauthentic(message, f"an answer: {error}")
                return Outcome.RETRY
            except FramingError as error:
                self._unauthentic(message, f"bytes that are no answer: {error}")
                return Outcome.RETRY
            except (TimeoutError, OSError, asyncio.IncompleteReadError) as error:
                log.debug("send to %d (round %d) failed: %s", self.dest, message.round, error)
                return Outcome.RETRY
            self._downlink_wait_s[id(message)] = answer.downlink_wait_s
            return self._judge(message, seal, answer.status, answer.duplicate, answer.tag,
                               answer.text)
        try:
            async with self.session.post(self.url, data=message.data, headers=headers,
                                         timeout=PARTIAL_TIMEOUT,
                                         ssl=self.ssl,  # type: ignore[arg-type]
                                         allow_redirects=False) as response:
                status = response.status
                duplicate = response.headers.get(DUPLICATE_HEADER) == "1"
                ack = response.headers.get(AUTH_HEADER)
                self._downlink_wait_s[id(message)] = seconds_header(
                    response.headers.get(DOWNLINK_WAIT_HEADER))
                text = b"" if status == 200 else \
                    await read_bounded(response, PARTIAL_ANSWER_MAX_BYTES)
        except AnswerTooLarge as error:
            self._unauthentic(message, f"a {status} answer: {error}")
            return Outcome.RETRY
        except (aiohttp.ClientError, TimeoutError, OSError) as error:
            log.debug("send to %d (round %d) failed: %s", self.dest, message.round, error)
            return Outcome.RETRY
        return self._judge(message, seal, status, duplicate, ack, text)

    async def _exchange(self, link: DataLink, headers: dict[str, str],
                        message: Outgoing) -> DataAnswer | None:
        """`message` as one data-path request; None when, while it waited, the path was
        found to carry only HTTP (akorun.transport.path_check): then this peer's
        partials go as HTTP POSTs and the requests waiting on `link` are abandoned."""
        request = link.exchange(headers.get(AUTH_HEADER, ""), headers.get(RELAY_HEADER),
                                headers.get(WIRE_TIME_HEADER), message.data,
                                PARTIAL_ANSWER_MAX_BYTES)
        if self.path_check.verified:  # the data path answered before: no watch
            return await request
        exchange = asyncio.ensure_future(request)
        exchange.add_done_callback(lambda task: task.cancelled() or task.exception())
        try:
            while not self.path_check.verified:
                done, _ = await asyncio.wait({exchange}, timeout=CHECK_AFTER_S)
                if done:
                    break
                if await self.path_check.falls_back(link):
                    if self.datalink is link:
                        self.datalink = None
                        link.close()  # the requests waiting on it fail and go again
                    return None
            answer = await exchange
            self.path_check.verified = True
            return answer
        finally:
            if not exchange.done():
                exchange.cancel()

    def _judge(self, message: Outgoing, seal: Seal | None, status: int, duplicate: bool,
               ack: str | None, text: bytes) -> Outcome:
        """What an answer (whichever path it came by) means for `message`."""
        check_start_s = time.perf_counter()
        if seal is None or self.sealer is None:
            authentic = True  # an unsealed test lane: the status alone decides
        elif status == 200:
            authentic = self.sealer.acknowledged(seal, duplicate, ack)
        else:
            authentic = self.sealer.answered(seal, status, text, ack)
        self.counters.software_send_s += time.perf_counter() - check_start_s
        if status == 200:
            if not authentic:
                self._unauthentic(message, "a 200 not bound to our request")
                return Outcome.RETRY
            return Outcome.DUPLICATE if duplicate else Outcome.DELIVERED
        if verdict(status, text, authentic) is Verdict.RETRY:
            if not authentic and status not in (503, STALE_SESSION):  # those come untagged
                # when the peer is not ready or restarted; any other is a forgery or a bug
                self._unauthentic(message, f"a {status} without a tag bound to our request")
            return Outcome.RETRY
        reason = _FATAL_STATUSES.get(status, f"http_{status}")
        self.counters.send_dropped[reason] += 1
        self.counters.refused_for_good += 1
        log.error("peer %d REFUSED our %s round %d part %d with %d %s: %s -- it cannot be "
                  "delivered: the replicas will differ and this rank will exit non-zero",
                  self.dest, message.kind.name, message.round, message.part, status, reason,
                  text[:300].decode("utf-8", "replace").strip())
        return Outcome.REJECTED

    def _unauthentic(self, message: Outgoing, what: str) -> None:
        """An answer not to be trusted: the message stays owed (logged at 1, 2, 4, ... times)."""
        self.counters.unauthentic_answers += 1
        count = self.counters.unauthentic_answers
        if count & (count - 1) == 0:
            log.warning("peer %d answered our round %d part %d with %s (%d such answer(s) so "
                        "far): not trusted, sending again", self.dest, message.round,
                        message.part, what, count)
