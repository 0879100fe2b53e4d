"""A rank killed in the middle of a round's multicast: the survivors repair what it left.

The kill is made deterministic by a fault hook (``kill_mid_multicast:R``: round
R's partial goes to the lowest-ranked peer only, is acknowledged, then the
process is SIGKILLed), so one survivor holds round R of the dead rank and the
other never gets it from the dead rank itself. akorun.runtime.relay has the
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
from akorun.cluster import new_settings
from akorun.control import ControlError
from akorun.keys import RELAY_TAG_BYTES, RequestVerifier, RunKeys, Signer
from akorun.runtime.relay import HeldPartial, Relay, RelayStore, pack_messages, unpack_messages
from akorun.testing import LocalCluster
from akorun.wire import HEADER_SIZE

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
    assert asyncio.run(holder.on_relay(1, {**ask, "contiguous": 5})) == pack_messages(2, [])
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
