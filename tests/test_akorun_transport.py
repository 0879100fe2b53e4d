"""akorun transport in one process: the real server and PeerSender on loopback.

A sink host (akorun.testing.SinkHost) stands in for the worker, so these tests pin down what the
server answers and what the sender does with each answer: delivery once,
retries while the receiver is not ready, drops on a refusal, backpressure
and drop-oldest for a suspended peer, and the pace of an emulated link.
Async code runs through asyncio.run (no pytest-asyncio).
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import numpy as np
import pytest

from akocore.messages import Kind, Partial
from akorun.launching.cluster import free_ports
from akorun.metrics import PeerCounters
from akorun.testing import SinkHost
from akorun.transport import control, wire
from akorun.transport.answers import Verdict, verdict
from akorun.transport.emulated_links import LinkShaper
from akorun.transport.keys import AUTH_HEADER, PARTIAL_PATH, PartialSealer, Signer, digest
from akorun.transport.sender import Outcome, Outgoing, PeerSender, RetryPolicy
from akorun.transport.server import Server

pytestmark = pytest.mark.timeout(60)

T = TypeVar("T")
SECRET = b"transport test secret, 32 bytes!"
RUN = uuid.uuid4().bytes
WIRE_HASH = bytes.fromhex("0011223344556677")
FAST = RetryPolicy(first_delay_s=0.001, max_delay_s=0.01)


def encoded(round_: int, length: int = 1000, *, run: bytes = RUN, sender: int = 0) -> Outgoing:
    values = np.full(length, round_ + 0.5, dtype=np.float32)
    partial = Partial(Kind.GRAD, sender, round_, 0, 1, 0, length, values)
    data = wire.encode_bytes(partial, run_id=run, config_hash=WIRE_HASH)
    return Outgoing(data, Kind.GRAD, round_, 0)


_SERVED: list[SinkHost] = []  # the host `serving` runs, so that senders seal for it


def signer_for(host: SinkHost, *, secret: bytes | None = None) -> Signer:
    """Rank 0's signer, knowing `host`'s nonce; with `secret`: one of another cluster file."""
    if secret is None:
        return host.peer_signer(0)
    signer = SinkHost(secret, RUN, WIRE_HASH).peer_signer(0)
    signer.learn(host.rank, host.verifier.sessions.nonce)
    return signer


async def serving(host: SinkHost, body: Callable[[str, Any], Awaitable[T]]) -> T:
    """Run `body(base_url, session)` against a live server for `host`."""
    import aiohttp

    from akorun.transport.client import make_session

    (port,) = free_ports(1)
    server = Server(host, max_concurrent_reads=4)
    await server.start("127.0.0.1", port)
    _SERVED[:] = [host]
    session: aiohttp.ClientSession = make_session(peers=1)
    try:
        return await body(f"http://127.0.0.1:{port}", session)
    finally:
        await session.close()
        await server.close()


def sender_to(url: str, session: Any, *, signer: Signer | None = None,
              **kwargs: Any) -> PeerSender:
    kwargs.setdefault("policy", FAST)
    kwargs.setdefault("sealer", PartialSealer(signer or signer_for(_SERVED[0]), PARTIAL_PATH))
    return PeerSender(1, url + "/v1/partial", session, counters=PeerCounters(), **kwargs)


def test_a_message_is_delivered_once_and_its_round_acknowledged() -> None:
    host = SinkHost(SECRET, RUN, WIRE_HASH)

    async def body(url: str, session: Any) -> PeerSender:
        sender = sender_to(url, session)
        sender.start()
        for round_ in range(3):
            await sender.put(encoded(round_))
        await asyncio.wait_for(sender.wait(lambda: sender.idle), 10)
        await sender.stop()
        return sender

    sender = asyncio.run(serving(host, body))
    assert [key for _, _, key in host.arrivals] == [(0, 0, 0), (0, 1, 0), (0, 2, 0)]
    assert sender.acked_round == 2
    assert sender.counters.messages_sent == 3 and sender.counters.retries == 0
    assert sender.counters.bytes_sent == 3 * (wire.HEADER_SIZE + 4000)


def test_a_receiver_that_is_not_ready_gets_the_message_again_until_it_takes_it() -> None:
    host = SinkHost(SECRET, RUN, WIRE_HASH, not_ready_answers=3)

    async def body(url: str, session: Any) -> PeerSender:
        sender = sender_to(url, session)
        sender.start()
        await sender.put(encoded(0))
        await asyncio.wait_for(sender.wait(lambda: sender.idle), 10)
        await sender.stop()
        return sender

    sender = asyncio.run(serving(host, body))
    assert len(host.arrivals) == 1
    assert sender.counters.retries == 3
    assert host.metrics.rejected["not_ready"] == 3


@pytest.mark.parametrize("kind, status", [("run", "wrong_run"), ("cap", "too_large")])
def test_a_tagged_refusal_is_final_and_recorded_as_refused_for_good(kind: str,
                                                                     status: str) -> None:
    """The receiver itself (its answer tagged for our request) refuses the message: it is
    not sent again, and the sender records it as refused for good."""
    host = SinkHost(SECRET, RUN, WIRE_HASH, max_body_bytes=100 if kind == "cap" else 1 << 24)
    message = {"run": encoded(0, run=uuid.uuid4().bytes), "cap": encoded(0)}[kind]

    async def body(url: str, session: Any) -> PeerSender:
        sender = sender_to(url, session)
        sender.start()
        await sender.put(message)
        await sender.wait(lambda: sender.idle)
        await sender.put(encoded(1, 10))  # the queue goes on after a refusal
        await asyncio.wait_for(sender.wait(lambda: sender.idle), 10)
        await sender.stop()
        return sender

    sender = asyncio.run(serving(host, body))
    assert sender.counters.retries == 0
    assert sender.counters.send_dropped[status] == 1
    assert sender.counters.refused_for_good == 1
    assert host.metrics.rejected[status] == 1
    assert [key for _, _, key in host.arrivals] == [(0, 1, 0)]


def test_a_refusal_before_the_seal_is_read_is_untagged_so_the_message_stays_owed() -> None:
    """Sealed with another cluster file's keys, the message is refused (401) before the
    receiver can tag its answer: the sender cannot tell that from a forgery on the path,
    so it sends the message again (never drops it); with the right keys it arrives."""
    host = SinkHost(SECRET, RUN, WIRE_HASH)

    async def body(url: str, session: Any) -> PeerSender:
        sender = sender_to(url, session)
        sender.sealer = PartialSealer(signer_for(host, secret=b"another secret entirely"),
                                      PARTIAL_PATH)
        sender.start()
        await sender.put(encoded(0))
        await asyncio.wait_for(sender.wait(lambda: sender.counters.retries >= 3), 10)
        assert sender.depth == 1  # still owed
        sender.sealer = PartialSealer(signer_for(host), PARTIAL_PATH)
        await asyncio.wait_for(sender.wait(lambda: sender.idle), 10)
        await sender.stop()
        return sender

    sender = asyncio.run(serving(host, body))
    assert sender.counters.refused_for_good == 0 and not sender.counters.send_dropped
    assert sender.counters.unauthentic_answers >= 3
    assert host.metrics.rejected["bad_signature"] >= 3
    assert [key for _, _, key in host.arrivals] == [(0, 0, 0)]


def test_a_full_queue_waits_for_room_unless_the_peer_is_suspended() -> None:
    async def main() -> tuple[bool, PeerSender]:
        import aiohttp

        suspended = False
        async with aiohttp.ClientSession() as session:
            sender = PeerSender(1, "http://127.0.0.1:9/v1/partial", session,
                                counters=PeerCounters(), maxsize=2,
                                is_suspended=lambda: suspended)
            await sender.put(encoded(0))
            await sender.put(encoded(1))
            blocked = asyncio.create_task(sender.put(encoded(2)))
            await asyncio.sleep(0.05)
            waited = not blocked.done()  # backpressure: no room, peer not suspended
            suspended = True
            sender.notify()
            await asyncio.wait_for(blocked, 5)
            await sender.put(encoded(3))
            return waited, sender

    waited, sender = asyncio.run(main())
    assert waited
    assert [m.round for m in sender.queue] == [2, 3]
    assert sender.dropped_until == 1
    assert sender.counters.send_dropped["overflow"] == 2


def paced_arrivals(rate_bps: float, messages: int, length: int
                   ) -> tuple[float, list[tuple[float, int, tuple[int, int, int]]]]:
    """`messages` partials of `length` float32 sent through LinkShaper(`rate_bps`) to a
    live receiver: the loop time before the first was queued, and the receiver's
    arrivals (loop time, bytes, key). Also the benchmark's (akorun.emulated_link_*)."""
    host = SinkHost(SECRET, RUN, WIRE_HASH)
    started: list[float] = []

    async def body(url: str, session: Any) -> None:
        sender = sender_to(url, session, shaper=LinkShaper(rate_bps))
        started.append(asyncio.get_running_loop().time())
        sender.start()
        for round_ in range(messages):
            await sender.put(encoded(round_, length))
        await asyncio.wait_for(sender.wait(lambda: sender.idle), 30)
        await sender.stop()

    asyncio.run(serving(host, body))
    return started[0], list(host.arrivals)


def test_an_emulated_40mbps_link_never_delivers_faster_than_40mbps() -> None:
    """8 x 512 KiB through LinkShaper(40 Mbit/s): all arrive, and none before its bytes
    and all before it could have crossed a 40 Mbit/s wire from the moment the first was
    queued (load can only delay an arrival, never advance it). How close the receiver's
    rate comes to 40 Mbit/s is the benchmark's figure (akorun.emulated_link_vs_configured)."""
    rate_bps = 40e6
    start_s, arrivals = paced_arrivals(rate_bps, 8, 512 * 1024 // 4)
    assert {key[1] for _, _, key in arrivals} == set(range(8))
    sent_bytes = 0
    for arrived_s, nbytes, key in sorted(arrivals):
        sent_bytes += nbytes
        earliest_s = start_s + 8 * sent_bytes / rate_bps
        assert arrived_s >= earliest_s - 1e-6, (key, arrived_s - start_s, earliest_s - start_s)


def test_the_receivers_downlink_hold_is_the_networks_not_the_message_overhead() -> None:
    """A receiver with an emulated 0.8 Mbit/s downlink holds a 100 kB message for at
    least 1 s before applying it, says so in its answer, and the sender counts that
    hold as network time: its per-message overhead (stack_s) excludes it, and so
    does the receiver's software time."""
    from akorun.transport.emulated_links import DownlinkShaper

    host = SinkHost(SECRET, RUN, WIRE_HASH)
    host.downlink = DownlinkShaper(0.8e6, lambda _sender: math.inf)  # type: ignore[attr-defined]
    length = 100_000 // 4 - 25

    async def body(url: str, session: Any) -> PeerSender:
        # an emulated link of unbounded rate: stack_s is counted on emulated links only
        sender = sender_to(url, session, shaper=LinkShaper(math.inf))
        sender.start()
        await sender.put(dataclasses.replace(encoded(0, length),
                                             queued_s=asyncio.get_running_loop().time()))
        await asyncio.wait_for(sender.wait(lambda: sender.idle), 30)
        await sender.stop()
        return sender

    sender = asyncio.run(serving(host, body))
    counters = sender.counters
    assert counters.messages_sent == 1 and counters.stack_messages == 1
    assert counters.delivery_s >= 1.0  # the hold is part of the delivery
    assert counters.stack_s <= counters.delivery_s - 1.0  # but not of the stack's cost
    received = host.metrics.peer(0)
    assert received.software_received == 1
    assert 0 < received.software_receive_s <= counters.delivery_s - 1.0


def test_software_cost_is_counted_on_both_sides_and_network_overhead_only_when_emulated(
) -> None:
    """Without emulation the sender counts no stack_s (it would hold the real network's
    time: message_overhead_s is None) but both sides count their software seconds."""
    from akorun.metrics import Metrics

    host = SinkHost(SECRET, RUN, WIRE_HASH)

    async def body(url: str, session: Any) -> PeerSender:
        sender = sender_to(url, session)
        sender.start()
        for round_ in range(4):
            await sender.put(encoded(round_, 50_000))
        await asyncio.wait_for(sender.wait(lambda: sender.idle), 10)
        await sender.stop()
        return sender

    sender = asyncio.run(serving(host, body))
    sent = sender.counters
    assert sent.messages_sent == 4 and sent.stack_messages == 0 and sent.software_send_s > 0
    metrics = Metrics(0, "worker", peers={1: sent})
    assert metrics.message_overhead_s() is None
    receiver_side = host.metrics.peer(0)
    assert receiver_side.software_received == 4 and receiver_side.software_receive_s > 0
    both = Metrics(0, "worker", encode_s=0.004, peers={1: sent, 2: receiver_side})
    expected = (0.004 + sent.software_send_s) / 4 + receiver_side.software_receive_s / 4
    assert both.message_software_s() == pytest.approx(expected)
    assert Metrics(0, "worker").message_software_s() is None


def test_a_peers_messages_share_one_connection_in_order_unless_the_benchmark_asks() -> None:
    """By default a peer's messages travel on one connection and are applied in order,
    one at a time: one POST at a time over HTTP, several requests written ahead
    (pipelined) on the data path; only AKORUN_SEND_WINDOW (analysis/tcp_connections.py)
    changes the window."""
    from akorun.transport.datapath_client import PIPELINE_DEPTH
    from akorun.transport.sender import DEFAULT_WINDOW, WINDOW_ENV, configured_window

    assert DEFAULT_WINDOW == 1 and configured_window({}) == 1
    assert configured_window({}, default=PIPELINE_DEPTH) == PIPELINE_DEPTH
    assert configured_window({WINDOW_ENV: "2"}) == 2
    for bad in ("0", "two", "-1"):
        with pytest.raises(ValueError, match=WINDOW_ENV):
            configured_window({WINDOW_ENV: bad})
    host = SinkHost(SECRET, RUN, WIRE_HASH)
    in_handler = [0]
    most = [0]
    original = host.on_partial

    async def on_partial(partial: Partial, nbytes: int) -> bool:
        in_handler[0] += 1
        most[0] = max(most[0], in_handler[0])
        await asyncio.sleep(0.01)  # a slow apply: a second POST would overlap it
        in_handler[0] -= 1
        return await original(partial, nbytes)

    host.on_partial = on_partial  # type: ignore[method-assign]

    async def body(url: str, session: Any) -> PeerSender:
        sender = sender_to(url, session)
        sender.start()
        for round_ in range(6):
            await sender.put(encoded(round_))
        await asyncio.wait_for(sender.wait(lambda: sender.idle), 10)
        await sender.stop()
        return sender

    sender = asyncio.run(serving(host, body))
    assert sender.window == PIPELINE_DEPTH and most[0] == 1
    assert sender.datalink is not None and sender.datalink.connects == 1
    assert [key[1] for _, _, key in host.arrivals] == list(range(6))
    assert sender_to("http://127.0.0.1:9", None, data_path=False).window == 1


def test_the_sender_tells_the_receivers_downlink_how_long_the_message_was_on_the_wire(
) -> None:
    """Paced at 8 Mbit/s, a 100 kB message spends >= 0.1 s on the sender's wire; the
    receiver's downlink is told so (and can credit what it carried meanwhile)."""
    from akorun.transport.emulated_links import DownlinkShaper

    seen: list[float | None] = []

    class RecordingDownlink(DownlinkShaper):
        async def admit(self, sender: int, nbytes: int, wire_s: float | None = None) -> None:
            seen.append(wire_s)
            await super().admit(sender, nbytes, wire_s)

    host = SinkHost(SECRET, RUN, WIRE_HASH)
    host.downlink = RecordingDownlink(8e6, lambda _sender: math.inf)  # type: ignore[attr-defined]

    async def body(url: str, session: Any) -> None:
        sender = sender_to(url, session, shaper=LinkShaper(8e6))
        sender.start()
        await sender.put(encoded(0, 100_000 // 4 - 25))
        await asyncio.wait_for(sender.wait(lambda: sender.idle), 30)
        await sender.stop()

    asyncio.run(serving(host, body))
    assert len(seen) == 1 and seen[0] is not None and seen[0] >= 0.1 - 1e-3


def _post(url: str, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes, Any]:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url + path, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read(), response.headers
    except urllib.error.HTTPError as error:
        return error.code, error.read(), error.headers


def test_control_requests_must_be_sealed_and_answers_are_bound_to_them() -> None:
    host = SinkHost(SECRET, RUN, WIRE_HASH)
    body = control.dumps({"rank": 0, "round": 3})
    signer = signer_for(host)
    hello = signer.seal(1, "/v1/hello", digest(body))
    stop = signer.seal(1, "/v1/stop", digest(body))
    forged = signer_for(host, secret=b"wrong").seal(1, "/v1/hello", digest(body))

    async def run_checks(url: str, session: Any) -> list[tuple[int, bytes, Any]]:
        cases = [("/v1/hello", {}), ("/v1/hello", {AUTH_HEADER: "bm90IGEgc2VhbA=="}),
                 ("/v1/hello", {AUTH_HEADER: forged.text()}),
                 ("/v1/hello", {AUTH_HEADER: hello.text()}),
                 ("/v1/stop", {AUTH_HEADER: signer.seal(1, "/v1/hello", digest(body)).text()}),
                 ("/v1/stop", {AUTH_HEADER: stop.text()})]
        return [await asyncio.to_thread(_post, url, path, body, headers)
                for path, headers in cases]

    answers = asyncio.run(serving(host, run_checks))
    assert [status for status, _, _ in answers] == [401, 401, 401, 200, 401, 409]
    status, answer, headers = answers[3]
    assert signer.answer_is_authentic(hello, 200, answer, headers[AUTH_HEADER])
    assert not signer.answer_is_authentic(stop, 200, answer, headers[AUTH_HEADER])
    assert [name for name, _ in host.controls] == ["hello", "stop"]


def test_metrics_and_status_are_served_read_only() -> None:
    import urllib.request

    host = SinkHost(SECRET, RUN, WIRE_HASH)
    host.metrics.peer(0).bytes_received = 1234
    host.metrics.rejected["bad_signature"] = 2

    async def fetch(url: str, session: Any) -> tuple[str, str]:
        def get(path: str) -> str:
            with urllib.request.urlopen(url + path, timeout=5) as response:
                return response.read().decode()
        return await asyncio.to_thread(get, "/metrics"), await asyncio.to_thread(get, "/status")

    text, status = asyncio.run(serving(host, fetch))
    assert 'akorun_bytes_received_total{rank="1",role="worker",peer="0"} 1234' in text
    assert 'akorun_rejected_total{rank="1",role="worker",reason="bad_signature"} 2' in text
    assert "# TYPE akorun_round gauge" in text
    assert '"rank": 1' in status


class RecordingSender(PeerSender):
    """Delivers instantly, recording the loop time of every POST attempt."""

    def __init__(self, shaper: LinkShaper, outcomes: list[Outcome] | None = None) -> None:
        super().__init__(1, "http://unused", None, counters=PeerCounters(),  # type: ignore
                         shaper=shaper, policy=RetryPolicy(first_delay_s=0.5, max_delay_s=0.5))
        self.posted: list[tuple[float, int]] = []
        self.outcomes = outcomes or []

    async def attempt(self, message: Outgoing) -> Outcome:
        self.posted.append((asyncio.get_running_loop().time(), message.round))
        return self.outcomes.pop(0) if self.outcomes else Outcome.DELIVERED


def test_an_emulated_latency_delays_each_message_without_holding_the_link() -> None:
    """On virtual time: 10 x 100 kB at 8 Mbit/s (0.1 s each) with
    50 ms latency arrive at transfer end + latency, 0.1 s apart (latency does not
    hold the link), as akosim models; a failed attempt is paced and delayed again
    after its backoff."""
    from tests.test_shaping import run_virtual

    async def main() -> list[tuple[float, int]]:
        shaper = LinkShaper(8e6, latency_s={1: 0.05})
        sender = RecordingSender(shaper, [Outcome.DELIVERED] * 9 + [Outcome.RETRY])
        start = asyncio.get_running_loop().time()
        sender.start()
        for round_ in range(10):
            await sender.put(encoded(round_, 100_000 // 4 - 25))
        await sender.wait(lambda: sender.idle)
        await sender.stop()
        return [(t - start, r) for t, r in sender.posted]

    posted = run_virtual(main)
    assert [r for _, r in posted] == [*range(10), 9]
    expected = [0.1 * (k + 1) + 0.05 for k in range(10)]
    assert [t for t, _ in posted[:10]] == pytest.approx(expected, abs=1e-6)
    # the retry: a jittered backoff in [0.25, 0.5] s, pacing and the latency again
    retry_s = posted[10][0] - posted[9][0]
    assert 0.25 + 0.1 + 0.05 - 1e-6 <= retry_s <= 0.5 + 0.1 + 0.05 + 1e-6


class RecordingHost(SinkHost):
    """A sink that also keeps the values of every partial it takes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.values: dict[int, np.ndarray] = {}

    async def on_partial(self, partial: Partial, nbytes: int) -> bool:
        assert partial.values is not None
        self.values[partial.round] = partial.values.copy()
        return await super().on_partial(partial, nbytes)


def test_large_bodies_arrive_intact_through_the_hashing_lanes() -> None:
    # below and above server.HASH_IN_THREAD_BYTES, two in flight at once
    from akorun.transport.server import HASH_IN_THREAD_BYTES

    host = RecordingHost(SECRET, RUN, WIRE_HASH)
    lengths = [1000, HASH_IN_THREAD_BYTES // 4, 3 * HASH_IN_THREAD_BYTES + 1, 1 << 20, 1 << 20]
    sent = {}
    for round_, length in enumerate(lengths):
        values = np.random.default_rng(round_).standard_normal(length).astype(np.float32)
        sent[round_] = values

    async def body(url: str, session: Any) -> PeerSender:
        sender = sender_to(url, session, window=2)  # two bodies in the lanes at once
        sender.start()
        for round_, values in sent.items():
            partial = Partial(Kind.GRAD, 0, round_, 0, 1, 0, values.size, values)
            data = wire.encode_bytes(partial, run_id=RUN, config_hash=WIRE_HASH)
            await sender.put(Outgoing(data, Kind.GRAD, round_, 0))
        await asyncio.wait_for(sender.wait(lambda: sender.idle), 30)
        await sender.stop()
        return sender

    sender = asyncio.run(serving(host, body))
    assert sender.counters.messages_sent == len(lengths)
    assert sorted(host.values) == sorted(sent)
    for round_, values in sent.items():
        np.testing.assert_array_equal(host.values[round_], values)


@pytest.mark.parametrize("where", ["header", "digest", "first", "middle", "last"])
def test_a_large_message_altered_after_sealing_is_refused_as_damaged_and_owed(where: str
                                                                               ) -> None:
    """Bytes altered on the way (after the seal was made): the receiver refuses them with a
    tagged 400 ``damaged``, which the sender takes as "send it again", not as final."""
    host = RecordingHost(SECRET, RUN, WIRE_HASH)
    length = 1 << 20
    values = np.arange(length, dtype=np.float32)
    partial = Partial(Kind.GRAD, 0, 0, 0, 1, 0, length, values)
    data = bytearray(wire.encode_bytes(partial, run_id=RUN, config_hash=WIRE_HASH))
    seal = signer_for(host).seal_partial(1, PARTIAL_PATH, bytes(data))
    at = {"header": 40, "digest": wire.FIELDS_SIZE + 3, "first": wire.HEADER_SIZE,
          "middle": len(data) // 2, "last": len(data) - 1}[where]
    data[at] ^= 0x01

    async def body(url: str, session: Any) -> tuple[int, PeerSender]:
        async with session.post(url + PARTIAL_PATH, data=bytes(data),
                                headers={AUTH_HEADER: seal.text()}) as response:
            status = response.status
            text = await response.read()
            tagged = PartialSealer(signer_for(host), PARTIAL_PATH).answered(
                seal, status, text, response.headers.get(AUTH_HEADER))
        assert tagged and verdict(status, text, tagged) is Verdict.RETRY
        sender = sender_to(url, session)
        sender.start()
        await sender.put(encoded(1, 10))  # the connection and the lanes go on
        await asyncio.wait_for(sender.wait(lambda: sender.idle), 30)
        await sender.stop()
        return status, sender

    status, sender = asyncio.run(serving(host, body))
    assert status == 400
    assert host.metrics.rejected["damaged"] == 1
    assert sorted(host.values) == [1]
