"""A rank killed in the middle of a round's multicast: the survivors repair what it left.

The kill is made deterministic by a fault hook (``kill_mid_multicast:R``: round
R's partial goes to the lowest-ranked peer only, is acknowledged, then the
process is SIGKILLed), so one survivor holds round R of the dead rank and the
other never gets it from the dead rank itself. akorun.runtime.recovery.relay has the
survivors forward it (authenticated by the dead rank's endorsement); both end
holding the dead rank's rounds through R, each applied once, and equal
replicas. The endorsement checks are tested without processes: a forwarder
can neither alter a message nor pass off one endorsed for another rank.
"""

from __future__ import annotations

import asyncio
import base64
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from akocore.messages import Kind, Partial
from akocore.optim import PlainSGD
from akocore.schemes import AkoWorker, Replica
from akorun.launching.cluster import new_settings
from akorun.runtime.recovery.relay import (
    HeldPartial,
    Relay,
    RelayStore,
    pack_messages,
    unpack_messages,
)
from akorun.testing import LocalCluster
from akorun.transport.control import ControlError
from akorun.transport.keys import RELAY_TAG_BYTES, RequestVerifier, RunKeys, Signer
from akorun.transport.wire import HEADER_SIZE

pytestmark = pytest.mark.timeout(120)

RTOL = 1e-5
KILL_ROUND = 5


def tables(rounds: int) -> dict[str, Any]:
    return {"cluster": {"workers": 3}, "exchange": {"p": 2, "ssp": 1},
            "train": {"workload": "digits-mlp", "optimizer": "sgd", "lr": 0.1,
                      "rounds": rounds, "eval_every": 1000}}


# --------------------------------------------------------------------------- endorsements

SECRET = b"relay test secret, 32 bytes long"
RUN = bytes(range(16))
WIRE_HASH = bytes.fromhex("0123456789abcdef")


def three_ranks() -> list[RunKeys]:
    """The keys of ranks 0, 1, 2 of one run, each knowing the others' current nonces."""
    ranks = [RunKeys.from_secret(SECRET, RUN, rank, 3, WIRE_HASH) for rank in range(3)]
    for me in ranks:
        for other in ranks:
            if other is not me:
                me.sessions.learn(other.rank, other.sessions.nonce)
    return ranks


def test_a_forwarded_partial_is_taken_only_as_its_sender_endorsed_it_for_this_rank() -> None:
    keys = three_ranks()
    origin = Signer(keys[2])
    data = origin.encode(Partial(Kind.GRAD, 2, 5, 1, 2, 3, 3, np.arange(3, dtype=np.float32)))
    header = data[:HEADER_SIZE]
    tags = origin.endorse(header)
    assert len(tags) == 2 * RELAY_TAG_BYTES
    nonce = keys[2].sessions.nonce
    at_1 = RequestVerifier(keys[1], world=3)
    at_0 = RequestVerifier(keys[0], world=3)
    assert at_1.endorsed(2, nonce, header, tags) and at_0.endorsed(2, nonce, header, tags)
    altered = bytearray(header)
    altered[40] ^= 1  # another round
    assert not at_1.endorsed(2, nonce, bytes(altered), tags)
    swapped = tags[RELAY_TAG_BYTES:] + tags[:RELAY_TAG_BYTES]  # rank 0's tag offered to 1
    assert not at_1.endorsed(2, nonce, header, swapped)
    forged = Signer(keys[0]).endorse(header)  # rank 0 endorsing as itself is not rank 2
    assert not at_1.endorsed(2, nonce, header, forged)
    assert not at_1.endorsed(2, bytes(16), header, tags)  # another instance of rank 2


def test_the_store_keeps_two_gradients_per_peer_and_answers_what_a_peer_lacks() -> None:
    store = RelayStore(lambda sender: 2 * 2)  # p = 2: four messages

    def held(round_: int) -> HeldPartial:
        return HeldPartial(Partial(Kind.GRAD, 2, round_, round_ % 2, 2, 0, 1,
                                   np.ones(1, np.float32) * round_), b"t" * 32, b"n" * 16)

    for round_ in range(7):
        store.keep(held(round_))
    assert store.oldest_round(2) == 3
    lacking = store.missing_for(2, contiguous=3, pending={(5, 1)})
    assert [item.partial.round for item in lacking] == [4, 6]
    body = pack_messages(2, [(item, bytes([item.partial.round]) * HEADER_SIZE)
                             for item in lacking])
    origin, messages = unpack_messages(body)
    assert origin == 2 and [data[0] for _, _, data in messages] == [4, 6]
    with pytest.raises(ValueError):
        unpack_messages(body + b"x")


# --------------------------------------------------------------------------- processes


def test_a_rank_killed_mid_multicast_leaves_the_survivors_equal_by_forwarding(
        tmp_path: Path) -> None:
    """Rank 2 sends round 5 to rank 0 only and dies: rank 1 gets it forwarded by rank 0,
    both hold rank 2's rounds through 5 exactly once, and end equal."""
    with LocalCluster(tmp_path, tables(rounds=12)) as cluster:
        cluster.start_all("--quiet", env={"AKORUN_FAULT": f"2@kill_mid_multicast:{KILL_ROUND}"})
        codes = cluster.wait_all(100)
        assert codes == {0: 0, 1: 0, 2: -signal.SIGKILL}, cluster.logs()
        assert "mid-multicast: sent to peer 0 only" in cluster.log(2)
        details = {rank: cluster.result(rank) for rank in (0, 1)}
        for rank in (0, 1):
            assert "Traceback" not in cluster.log(rank)
            # the last round of rank 2 any survivor held is round 5, held by both
            assert details[rank]["held_through"]["2"] == KILL_ROUND, details[rank]
            assert details[rank]["relay_refused"] == 0
        assert details[1]["relayed_in"] >= 1 and details[0]["relayed_out"] >= 1, cluster.logs()
        assert details[0]["relayed_in"] == 0  # rank 0 lacked nothing
        assert "forwarding" in cluster.log(0) and "repair: took" in cluster.log(1)
        np.testing.assert_allclose(cluster.params(1), cluster.params(0), rtol=RTOL,
                                   atol=RTOL * 0.1)


def test_a_rank_killed_mid_multicast_that_resumes_before_its_timeout_ends_equal(
        tmp_path: Path) -> None:
    """Rank 2 sends round 5 to rank 0 only, dies and comes back with --resume before the
    peer timeout: before the snapshot and the restart the survivors pull what the dead
    process left, so rank 1 takes round 5 forwarded, and all three end equal."""
    settings = new_settings(peer_timeout_s=30.0)  # no suspension: the rejoin path repairs
    with LocalCluster(tmp_path, tables(rounds=12), settings=settings) as cluster:
        cluster.start_all("--quiet", env={"AKORUN_FAULT": f"2@kill_mid_multicast:{KILL_ROUND}"})
        assert cluster.wait(2, 60) == -signal.SIGKILL, cluster.logs()
        cluster.start(2, "--quiet", "--resume")
        codes = cluster.wait_all(100)
        assert codes == {0: 0, 1: 0, 2: 0}, cluster.logs()
        assert "rejoined from rank" in cluster.log(2)
        for rank in (1, 2):
            np.testing.assert_allclose(cluster.params(rank), cluster.params(0), rtol=RTOL,
                                       atol=RTOL * 0.1)
        results = {rank: cluster.result(rank) for rank in range(3)}
        assert results[1]["relayed_in"] >= 1, cluster.logs()
        assert all(results[rank]["relay_refused"] == 0 for rank in range(3))
        assert "peer 2 silent" not in cluster.log(0) + cluster.log(1)  # not the lost path


def _relay_at(keys: RunKeys, *, lost: bool, delivered: list[Partial]) -> Relay:
    node = AkoWorker(keys.rank, 3, 6, (1, 1, 1), replica=Replica(None, None), staleness=0)

    def deliver(partial: Partial) -> bool:
        delivered.append(partial)
        return True

    return Relay(rank=keys.rank, peers=[j for j in range(3) if j != keys.rank],
                 node=lambda: node, signer=Signer(keys),
                 verifier=RequestVerifier(keys, world=3), peer_timeout_s=1.0,
                 deliver=deliver, lost_here=lambda peer: lost)


def test_a_holder_forwards_only_a_peer_it_lost_too_and_the_asker_checks_each_message() -> None:
    keys = three_ranks()
    origin = Signer(keys[2])
    message = Partial(Kind.GRAD, 2, 5, 0, 1, 0, 6, np.arange(6, dtype=np.float32))
    data = origin.encode(message)
    endorsements = base64.b64encode(origin.endorse(data[:HEADER_SIZE])).decode("ascii")
    holder = _relay_at(keys[0], lost=False, delivered=[])
    holder.note_endorsements(message.key, endorsements)
    holder.accepted(message)
    ask = {"rank": 1, "origin": 2, "contiguous": 4, "pending": []}
    with pytest.raises(ControlError) as alive_here:  # rank 2 only cut off from the asker
        asyncio.run(holder.on_relay(1, ask))
    assert alive_here.value.status == 503
    holder.lost_here = lambda peer: True
    body = asyncio.run(holder.on_relay(1, ask))
    assert holder.served == 1
    assert unpack_messages(asyncio.run(holder.on_relay(1, {**ask, "contiguous": 5}))) == (2, [])
    taken: list[Partial] = []
    asker = _relay_at(keys[1], lost=True, delivered=taken)
    assert asker._take(0, 2, body, None) == 1
    assert taken[0].key == message.key and np.array_equal(taken[0].values, message.values)
    altered = bytearray(body)
    altered[-1] ^= 0x40  # one bit of the last value: the header's digest no longer matches
    assert asker._take(0, 2, bytes(altered), None) == 0 and asker.refused == 1
    assert asker._take(0, 2, body, before_round=5) == 0  # rounds before a restart only


def test_a_folded_resend_that_meets_a_forwarded_round_adds_only_the_difference() -> None:
    """Rank 2 (p = 1) was only paused: rank 1 took its round 5 forwarded; rank 2 then sends
    round 5 itself, folded with round 6 (the sum, then a zero-valued round 6): rank 1 ends
    holding 5 + 6 once; a plain re-send of round 5 changes nothing."""
    keys = three_ranks()
    node = AkoWorker(1, 3, 6, (1, 1, 1), replica=Replica(np.zeros(6, np.float32), PlainSGD(1)),
                     staleness=0)
    asker = Relay(rank=1, peers=[0, 2], node=lambda: node, signer=Signer(keys[1]),
                  verifier=RequestVerifier(keys[1], world=3), peer_timeout_s=1.0,
                  deliver=lambda partial: node.receive(partial).accepted)
    origin = Signer(keys[2])
    round_5 = Partial(Kind.GRAD, 2, 5, 0, 1, 0, 6, np.full(6, 1.0, np.float32))
    round_6 = np.full(6, 10.0, np.float32)
    node.log.skip_to(2, 4)
    data = origin.encode(round_5)
    held = HeldPartial(round_5, origin.endorse(data[:HEADER_SIZE]), keys[2].sessions.nonce)
    assert asker._take(0, 2, pack_messages(2, [(held, data)]), None) == 1
    folded = Partial(Kind.GRAD, 2, 5, 0, 1, 0, 6, round_5.values + round_6)
    for resent in (folded, Partial(Kind.GRAD, 2, 6, 0, 1, 0, 6, np.zeros(6, np.float32))):
        if not node.receive(resent).accepted:
            asker.duplicate(resent)
    assert node.inbox is not None and np.array_equal(node.inbox, round_5.values + round_6)
    node.receive(round_5)
    asker.duplicate(round_5)  # a second arrival: nothing more
    assert np.array_equal(node.inbox, round_5.values + round_6) and asker.reconciled == 1


# --------------------------------------------------------------------------- agreement

LOST = 3  # the rank lost in the agreement tests below (of 4)


class _RoutedClient:
    """A ControlClient of rank `rank` whose calls go straight to the other ranks' relays
    (`answer`, a test's stand-in for rank 0's `on_relay`, if given)."""

    def __init__(self, rank: int, relays: dict[int, Relay],
                 answer: Any = None) -> None:
        self.rank = rank
        self.relays = relays
        self.answer = answer

    async def call(self, rank: int, kind: Any, payload: dict[str, Any], **_: Any) -> Any:
        from akorun.transport.client import ControlAnswer

        handler = self.relays[rank].on_relay
        if rank == 0 and self.answer is not None:
            handler = self.answer
        try:
            return ControlAnswer(200, body=await handler(self.rank, payload), authentic=True)
        except ControlError as error:
            return ControlAnswer(error.status, error=error.reason, authentic=True)


def _survivors(rounds: int = 31) -> tuple[dict[int, AkoWorker], dict[int, Relay],
                                          list[tuple[Partial, bytes, bytes]]]:
    """Ranks 0, 1, 2 of 4, each holding rank 3's rounds through 29 (the last one kept in
    their relay stores); rank 3's round 30 reaches rank 0 only. Rank 3 is suspended."""
    keys = [RunKeys.from_secret(SECRET, RUN, rank, 4, WIRE_HASH) for rank in range(4)]
    for me in keys:
        for other in keys:
            if other is not me:
                me.sessions.learn(other.rank, other.sessions.nonce)
    origin = Signer(keys[LOST])
    rng = np.random.default_rng(3)
    sent = []
    for round_ in range(rounds):
        partial = Partial(Kind.GRAD, LOST, round_, 0, 1, 0, 6,
                          rng.standard_normal(6).astype(np.float32))
        data = origin.encode(partial)
        sent.append((partial, data, origin.endorse(data[:HEADER_SIZE])))
    nodes: dict[int, AkoWorker] = {}
    relays: dict[int, Relay] = {}
    for rank in range(3):
        node = AkoWorker(rank, 4, 6, (1, 1, 1, 1),
                         replica=Replica(np.zeros(6, np.float32), PlainSGD(1)), staleness=0)
        node.log.skip_to(LOST, rounds - 3)
        node.suspend_peer(LOST)
        relay = Relay(rank=rank, peers=[j for j in range(4) if j != rank],
                      node=lambda node=node: node, signer=Signer(keys[rank]),
                      verifier=RequestVerifier(keys[rank], world=4), peer_timeout_s=0.2,
                      deliver=lambda partial, node=node: node.receive(partial).accepted)
        for partial, _, endorsements in sent[rounds - 2:] if rank == 0 else sent[rounds - 2:-1]:
            assert node.receive(partial).accepted
            relay.note_endorsements(partial.key, base64.b64encode(endorsements).decode())
            relay.accepted(partial)
        nodes[rank], relays[rank] = node, relay
    return nodes, relays, sent


async def _agree(relays: dict[int, Relay], answer: Any = None) -> None:
    for rank, relay in relays.items():
        relay.control = _RoutedClient(rank, relays, answer)  # type: ignore[assignment]
    for relay in relays.values():
        relay.peer_lost(LOST)
    while not all(relay.idle() for relay in relays.values()):
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("lying", [False, True])
def test_survivors_agree_when_a_holder_answers_one_with_nothing_and_another_late(
        lying: bool) -> None:
    """Rank 0 alone holds lost rank 3's round 30: it answers rank 2's pulls with nothing
    (its record saying so, or `lying` without round 30) and rank 1's late. Rank 1's set of
    rank 3's rounds then grows; it shows rank 2 (its next pull carries its record), rank 2
    pulls round 30 from rank 1, and the honest survivors end with the same rounds and
    equal inboxes. Rank 0's lie does not go unnoticed: rank 2 reports it (the run fails)."""
    nodes, relays, sent = _survivors()
    honest = relays[0].on_relay

    async def withholding(sender: int, payload: dict[str, Any]) -> bytes:
        if sender == 2:
            from akorun.runtime.recovery.relay import record_of
            contiguous, pending = record_of(nodes[0], LOST)
            return pack_messages(LOST, [], (contiguous - lying, pending))
        await asyncio.sleep(0.5)
        return await honest(sender, payload)

    asyncio.run(_agree(relays, withholding))
    from akorun.runtime.recovery.relay import record_of
    assert record_of(nodes[1], LOST) == record_of(nodes[2], LOST) == (30, ())
    assert nodes[1].inbox is not None and nodes[2].inbox is not None
    np.testing.assert_array_equal(nodes[1].inbox, nodes[2].inbox)
    np.testing.assert_allclose(nodes[2].inbox, sum(p.values for p, _, _ in sent[-2:]),
                               rtol=1e-6)
    assert not relays[1].disagreements
    if lying:
        assert "rank 0 through 29" in relays[2].disagreements[LOST]
    else:
        assert not relays[2].disagreements


def test_a_round_no_survivor_will_forward_fails_the_survivors_loudly() -> None:
    """Rank 0 holds lost rank 3's round 30 (its record says so) but forwards it to nobody:
    ranks 1 and 2 cannot close the gap and each records the disagreement (the worker
    then fails the run with that line) instead of ending silently unequal."""
    nodes, relays, _ = _survivors()

    async def withholding(sender: int, payload: dict[str, Any]) -> bytes:
        from akorun.runtime.recovery.relay import record_of
        return pack_messages(LOST, [], record_of(nodes[0], LOST))

    asyncio.run(_agree(relays, withholding))
    for rank in (1, 2):
        line = relays[rank].disagreements.get(LOST, "")
        assert "survivors disagree on lost rank 3's rounds" in line, relays[rank].disagreements
        assert "rank 0 through 30" in line


def test_four_ranks_with_key_files_agree_when_a_holder_withholds_from_one_and_is_late_to_another(
        tmp_path: Path) -> None:
    """4 ranks, each with only its own key file. Rank 3 sends round 12 to rank 0 only and
    dies; rank 0 answers rank 2's relay pulls with nothing and rank 1's 2 s late. Rank 1
    gets round 12 late, its next pull shows rank 2 it holds more, rank 2 pulls it from
    rank 1: the survivors exit 0 with equal replicas (they ended 4.0e-3 apart when a pull
    was asked once)."""
    import dataclasses

    from akorun.transport.keys import rank_key_file, write_rank_key_files

    kill_round = 12
    settings = new_settings(peer_timeout_s=3.0)
    key_dir = tmp_path / "keys"
    write_rank_key_files(key_dir, settings.secret_bytes, settings.run_id_bytes, 4)
    tables4 = {"cluster": {"workers": 4}, "exchange": {"p": 2, "ssp": 1},
               "train": {"workload": "digits-mlp", "optimizer": "sgd", "lr": 0.1,
                         "rounds": 24, "eval_every": 1000}}
    faults = f"3@kill_mid_multicast:{kill_round};0@relay_withhold:2;0@relay_late:1:2"
    with LocalCluster(tmp_path, tables4,
                      settings=dataclasses.replace(settings, secret=None)) as cluster:
        for rank in range(4):
            cluster.start(rank, "--quiet", "--keys", str(rank_key_file(key_dir, rank)),
                          env={"AKORUN_FAULT": faults})
        codes = cluster.wait_all(150)
        assert codes == {0: 0, 1: 0, 2: 0, 3: -signal.SIGKILL}, cluster.logs()
        assert "relay pull with nothing" in cluster.log(0), cluster.logs()
        results = {rank: cluster.result(rank) for rank in range(3)}
        for rank in range(3):
            assert results[rank]["held_through"]["3"] == kill_round, results[rank]
            assert not results[rank]["relay_disagreements"]
        for rank in (1, 2):
            np.testing.assert_allclose(cluster.params(rank), cluster.params(0), rtol=RTOL,
                                       atol=RTOL * 0.1)


def test_a_folded_range_that_meets_a_forwarded_round_takes_that_round_out_once() -> None:
    """Rank 2 (p = 1) was cut off from rank 1 only: rank 1 took its round 5 forwarded;
    rank 2 then sends rounds 5..7 folded into one message: rank 1 ends holding rounds
    5, 6, 7 once each (the forwarded values taken out of the sum), and a re-send of the
    folded message changes nothing."""
    keys = three_ranks()
    node = AkoWorker(1, 3, 6, (1, 1, 1), replica=Replica(np.zeros(6, np.float32), PlainSGD(1)),
                     staleness=0)
    asker = Relay(rank=1, peers=[0, 2], node=lambda: node, signer=Signer(keys[1]),
                  verifier=RequestVerifier(keys[1], world=3), peer_timeout_s=1.0,
                  deliver=lambda partial: node.receive(partial).accepted)
    origin = Signer(keys[2])
    round_5 = Partial(Kind.GRAD, 2, 5, 0, 1, 0, 6, np.full(6, 1.0, np.float32))
    later = np.full(6, 10.0, np.float32)  # rounds 6 and 7
    node.log.skip_to(2, 4)
    data = origin.encode(round_5)
    held = HeldPartial(round_5, origin.endorse(data[:HEADER_SIZE]), keys[2].sessions.nonce)
    assert asker._take(0, 2, pack_messages(2, [(held, data)]), None) == 1
    folded = Partial(Kind.GRAD, 2, 7, 0, 1, 0, 6, round_5.values + later, first_round=5)
    for _ in range(2):
        taken = asker.fold_in(folded)
        if not node.receive(taken).accepted:
            asker.duplicate(taken)
    assert node.inbox is not None and np.array_equal(node.inbox, round_5.values + later)
    assert int(node.log.contiguous[2]) == 7 and asker.reconciled == 1
