"""Sessions and per-rank keys against a real server: replays across runs and restarts, forgery.

A sink host (akorun.testing.SinkHost, rank 1) behind the real akorun.transport.server
records every control message its table dispatches and every partial it takes.
`tests.peer.Peer` speaks to it as rank 0 or 2 would (own keys, own nonce) and
records each request byte for byte; the tests then send those exact bytes
again: to the same instance (a replay within the session), after the sender
restarted (an earlier instance of a rank), and to a new instance of the
receiver started from the same cluster file (an earlier run). Every kind of
message is tried: partial, hello, stop, heartbeat, done, rejoin-hello,
snapshot, restart; and answers are tried as answers to other requests.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Awaitable, Callable
from typing import TypeVar

import numpy as np
import pytest

from akocore.messages import Kind, Partial
from akorun.launching.cluster import free_ports
from akorun.testing import SinkHost
from akorun.transport import control, wire
from akorun.transport.control import ControlKind
from akorun.transport.keys import AUTH_HEADER, PARTIAL_PATH, Seal, digest, request_tag
from akorun.transport.server import Server
from tests.peer import Peer, Sent, post, replay

pytestmark = pytest.mark.timeout(60)

T = TypeVar("T")
SECRET = b"security test secret, 32 bytes!!"
RUN = uuid.uuid4().bytes
WIRE_HASH = bytes.fromhex("8899aabbccddeeff")
WORLD = 3
PAYLOADS: dict[ControlKind, dict[str, object]] = {
    ControlKind.HELLO: {"run_id": "r", "config_hash": "c", "params_sha256": "p"},
    ControlKind.STOP: {"round": 3},
    ControlKind.HEARTBEAT: {},
    ControlKind.DONE: {},
    ControlKind.REJOIN_HELLO: {"run_id": "r"},
    ControlKind.SNAPSHOT: {"need": {}},
    ControlKind.RESTART: {"first_round": 7},
}


def sink() -> SinkHost:
    return SinkHost(SECRET, RUN, WIRE_HASH, world=WORLD)


def partial_bytes(round_: int, sender: int = 0, length: int = 256) -> bytes:
    values = np.full(length, round_ + 0.25, dtype=np.float32)
    return wire.encode_bytes(Partial(Kind.GRAD, sender, round_, 0, 1, 0, length, values),
                             run_id=RUN, config_hash=WIRE_HASH)


async def serving(host: SinkHost, body: Callable[[str], Awaitable[T]]) -> T:
    (port,) = free_ports(1)
    server = Server(host)
    await server.start("127.0.0.1", port)
    try:
        return await body(f"http://127.0.0.1:{port}")
    finally:
        await server.close()


def peer(url: str, rank: int = 0, secret: bytes = SECRET) -> Peer:
    return Peer(secret, RUN, rank, [url] * WORLD)


def record_every_kind(sender: Peer) -> dict[str, Sent]:
    """One authentic request of every kind from `sender` to rank 1 (all taken)."""
    sent = {"partial": sender.partial(1, partial_bytes(0, sender.rank))}
    for kind, payload in PAYLOADS.items():
        sent[kind.value] = sender.control(1, kind, payload)
    return sent


def test_every_message_replayed_to_the_same_instance_is_refused_or_a_duplicate() -> None:
    host = sink()

    async def body(url: str) -> tuple[dict[str, Sent], dict[str, int]]:
        sent = await asyncio.to_thread(record_every_kind, peer(url))
        return sent, {name: await asyncio.to_thread(replay, s) for name, s in sent.items()}

    sent, again = asyncio.run(serving(host, body))
    assert {name: s.status for name, s in sent.items()} == {
        "partial": 200, **{kind.value: 409 if kind is ControlKind.STOP else 200
                           for kind in PAYLOADS}}
    # control: a counter seen before in this session; partial: exactly once by its key
    assert again == {"partial": 200, **{kind.value: 401 for kind in PAYLOADS}}
    assert [name for name, _ in host.controls] == [kind.value for kind in PAYLOADS]
    assert len(host.seen) == 1 and len(host.arrivals) == 2  # the replay: a duplicate
    assert host.metrics.rejected["bad_signature"] == len(PAYLOADS)


def test_every_message_of_an_earlier_instance_of_the_sender_is_refused() -> None:
    host = sink()

    async def body(url: str) -> tuple[dict[str, Sent], int, dict[str, int]]:
        old = await asyncio.to_thread(record_every_kind, peer(url))
        restarted = peer(url)  # rank 0 again, a new process: a new nonce
        hello = await asyncio.to_thread(restarted.control, 1, ControlKind.HELLO,
                                        PAYLOADS[ControlKind.HELLO])
        return old, hello.status, {name: await asyncio.to_thread(replay, s)
                                   for name, s in old.items()}

    old, hello, again = asyncio.run(serving(host, body))
    assert hello == 200
    assert again == {name: 401 for name in old}
    assert len(host.controls) == len(PAYLOADS) + 1 and len(host.arrivals) == 1


def test_every_message_of_an_earlier_run_is_refused_by_a_new_instance() -> None:
    """The same cluster file (secret, run id) started again: what was recorded in the
    first run is sealed for the first instance of the receiver (421, no effect)."""
    first = sink()
    recorded = asyncio.run(serving(first, lambda url: asyncio.to_thread(
        record_every_kind, peer(url))))
    second = sink()

    async def body(url: str) -> dict[str, int]:
        return {name: await asyncio.to_thread(replay, s, url) for name, s in recorded.items()}

    again = asyncio.run(serving(second, body))
    assert again == {name: 421 for name in recorded}
    assert second.controls == [] and second.arrivals == []
    assert second.metrics.rejected["stale_session"] == len(recorded)


def test_an_answer_is_bound_to_its_request() -> None:
    host = sink()

    async def body(url: str) -> tuple[Peer, Sent, Sent]:
        rank0 = peer(url)
        first = await asyncio.to_thread(rank0.control, 1, ControlKind.HEARTBEAT, {})
        second = await asyncio.to_thread(rank0.control, 1, ControlKind.HEARTBEAT, {})
        return rank0, first, second

    rank0, first, second = asyncio.run(serving(host, body))
    seal_1, seal_2 = (Seal.parse(s.headers[AUTH_HEADER]) for s in (first, second))
    tag_1 = first.answer_headers[AUTH_HEADER]
    assert first.answer == second.answer  # the same words ...
    assert rank0.signer.answer_is_authentic(seal_1, 200, first.answer, tag_1)
    # ... but the answer to one request is no answer to another, nor with another body
    assert not rank0.signer.answer_is_authentic(seal_2, 200, first.answer, tag_1)
    assert not rank0.signer.answer_is_authentic(seal_1, 200, b'{"rank":1}', tag_1)
    # nor to the same words asked by another instance of the sender
    restarted = peer("http://unused")
    restarted.signer.learn(1, seal_1.receiver_nonce)
    asked = restarted.signer.seal(1, ControlKind.HEARTBEAT.path, digest(first.body))
    assert not restarted.signer.answer_is_authentic(asked, 200, first.answer, tag_1)


def test_a_member_cannot_speak_as_another_rank() -> None:
    """Rank 2 holds its own keys only: a seal claiming rank 0, a partial whose header says
    rank 0, and a control payload naming rank 0 are all refused; it still speaks as 2."""
    host = sink()

    async def body(url: str) -> dict[str, int]:
        rank2 = peer(url, rank=2)
        await asyncio.to_thread(rank2.discover, 1)
        nonce = rank2.signer.sessions.nonce
        receiver_nonce = rank2.signer.sessions.peer_nonce[1]
        data = partial_bytes(5, sender=0)
        # a seal that says rank 0, tagged with the only key rank 2 has with rank 1
        claim = Seal(0, 1, nonce, receiver_nonce, 99, digest(data[:100]))
        key = rank2.signer.sessions.key(2, 1, nonce, receiver_nonce)
        forged = dataclasses.replace(claim, tag=request_tag(key, PARTIAL_PATH, claim))
        as_zero = control.dumps({"rank": 0, "round": 1})
        answers = {
            "seal says rank 0": (await asyncio.to_thread(
                post, url, PARTIAL_PATH, data, {AUTH_HEADER: forged.text()}))[0],
            "header says rank 0": (await asyncio.to_thread(rank2.partial, 1, data)).status,
            "payload says rank 0": (await asyncio.to_thread(
                rank2._send, 1, ControlKind.DONE.path, as_zero, as_zero)).status,
            "as itself": (await asyncio.to_thread(rank2.partial, 1,
                                                  partial_bytes(5, sender=2))).status,
        }
        return answers

    answers = asyncio.run(serving(host, body))
    assert answers == {"seal says rank 0": 401, "header says rank 0": 401,
                       "payload says rank 0": 401, "as itself": 200}
    assert [key for _, _, key in host.arrivals] == [(2, 5, 0)]
    assert host.controls == []


def test_a_member_of_another_cluster_file_is_refused_even_at_discovery() -> None:
    host = sink()

    async def body(url: str) -> list[int]:
        stranger = peer(url, secret=b"another cluster file's secret")
        with pytest.raises(AssertionError, match="discovery of rank 1 failed: 401"):
            await asyncio.to_thread(stranger.discover, 1)
        stranger.signer.learn(1, host.verifier.sessions.nonce)
        return [(await asyncio.to_thread(stranger.partial, 1, partial_bytes(0))).status,
                (await asyncio.to_thread(stranger.control, 1, ControlKind.STOP, {})).status]

    assert asyncio.run(serving(host, body)) == [401, 401]
    assert host.controls == [] and host.arrivals == []


def test_pairwise_keys_differ_per_pair_and_a_rank_holds_only_its_row() -> None:
    from akorun.transport.keys import RankKeys, pair_key

    rows = [RankKeys.from_secret(SECRET, RUN, rank, 4) for rank in range(4)]
    pairs = {(a, b): pair_key(SECRET, RUN, a, b) for a in range(4) for b in range(a + 1, 4)}
    assert len(set(pairs.values())) == len(pairs)
    for row in rows:
        assert set(row.pairs) == set(range(4)) - {row.rank}
        assert all(row.pair(peer) == pairs[tuple(sorted((row.rank, peer)))]  # type: ignore
                   for peer in row.pairs)
    assert pair_key(SECRET, uuid.uuid4().bytes, 0, 1) != pairs[(0, 1)]  # another run


def test_admission_slots_are_limited_per_sender_and_buffers_reused_only_when_free() -> None:
    import numpy as np

    from akorun.transport.admission import Admission, BufferPool

    admission = Admission(lambda: None, max_concurrent_reads=4, max_reads_per_sender=2)
    with admission.slot(0), admission.slot(0):
        refusal = admission.slot_refusal(0)
        assert refusal is not None and refusal.status == 503
        assert admission.slot_refusal(2) is None  # another sender still gets a slot
        with admission.slot(2), admission.slot(2):
            refusal = admission.slot_refusal(1)
            assert refusal is not None and "bodies being read" in refusal.detail
    assert admission.active_reads == 0 and admission.slot_refusal(0) is None
    assert admission.body_deadline_s(0) < admission.body_deadline_s(1 << 22)

    pool = BufferPool(keep=2)
    first = pool.take(1000)
    pool.give_back(first)
    assert pool.take(1000) is first  # nobody else held it: reused
    kept = np.frombuffer(first, dtype=np.float32)  # a node keeps a view of what it got
    pool.give_back(first)
    assert pool.take(1000) is not first and kept.base is not None
