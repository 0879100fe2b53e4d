"""The relay's memory: by default a window of each peer's last min(2 s + 2, 2 p) rounds,
wide enough for every round a gated survivor can lack (checked on simulated runs killed
at random); with akorun.relay_budget a budget, by the documented formula
(akorun.runtime.recovery.relay.keep_messages); after many rounds the store holds at most the
stated bytes (relay_bound_bytes); the setting read from every layer."""

from __future__ import annotations

import math
import random
from collections import deque

import numpy as np
import pytest

from akocore.messages import Kind, Partial
from akocore.partition import partition_slice
from akocore.schemes import AkoWorker, Replica
from akocore.settings.layers import Given, Layer, resolve
from akocore.settings.normalise import ConfigError
from akorun.runtime.recovery.relay import (
    RELAY_KEEP_GRADIENTS,
    HeldPartial,
    Relay,
    RelayStore,
    keep_messages,
    keep_rounds,
    relay_bound_bytes,
)
from akorun.transport.keys import RequestVerifier, RunKeys, Signer


def test_without_a_budget_the_window_is_2s_plus_2_rounds_capped_at_two_gradients() -> None:
    assert keep_messages(64, 0, peers=63, length=4_000_000, staleness=0) == 2
    assert keep_messages(64, 0, peers=63, length=4_000_000, staleness=3) == 8
    assert keep_messages(4, 0, peers=63, length=4_000_000, staleness=10) == \
        RELAY_KEEP_GRADIENTS * 4
    assert keep_messages(4, 0, peers=63, length=4_000_000) == RELAY_KEEP_GRADIENTS * 4  # inf
    assert keep_rounds(8, 2.5) == 6  # the gate compares whole rounds: s = 2.5 acts as 2


def test_the_default_window_is_o_of_d_at_p_from_n_minus_1_on() -> None:
    """(n - 1) x (2 s + 2) x 4 ceil(D / p) <= 4 D (2 s + 2) (+ rounding) once p >= n - 1,
    whatever n; two gradients per peer before was 8 D (n - 1)."""
    length, staleness = 27_350_016, 1
    for workers in (3, 9, 65):
        p = workers - 1
        bound = relay_bound_bytes(length, [p] * workers, 0, staleness=staleness)
        assert bound <= 4 * length * (2 * staleness + 2) + 4 * workers * (2 * staleness + 2)
        old = relay_bound_bytes(length, [p] * workers, 0, staleness=math.inf)
        assert old >= 8 * length * (workers - 1)


def _kill_at_random(seed: int, workers: int, p: int, staleness: int) -> tuple[int, int]:
    """A simulated ako run (schemes only, random delivery order over per-pair FIFO links)
    whose rank `workers - 1` dies at a random moment, possibly mid-multicast, its messages
    in flight delivered to some peers and not others. Returns (the widest gap: rounds of
    the dead rank one survivor holds and another lacks, counted back from the holder's
    newest round of it; the rounds it had done)."""
    rng = random.Random(seed)
    nodes = [AkoWorker(i, workers, 4 * p, [p] * workers, replica=Replica(None, None),
                       staleness=staleness) for i in range(workers)]
    links: dict[tuple[int, int], deque[Partial]] = {
        (i, j): deque() for i in range(workers) for j in range(workers) if i != j}
    dead = workers - 1
    kill_at = rng.randrange(1, 150)  # the step (a round or a delivery) it dies at
    speed = {pair: rng.choice((0.02, 1.0, 1.0)) for pair in links}  # some links are slow
    for _ in range(kill_at):
        ready = [node for node in nodes if node.may_start(node.next_round)]
        busy = [pair for pair, queue in links.items() if queue]
        if rng.random() < 0.5 and ready:
            node = rng.choice(ready)
            for send in node.local_step(node.next_round, None):
                for destination in send.dests:
                    links[(node.rank, destination)].append(send.message)
        elif busy:
            sender, destination = rng.choices(busy, [speed[pair] for pair in busy])[0]
            nodes[destination].receive(links[(sender, destination)].popleft())
        elif not ready:
            raise AssertionError("deadlock")
    for destination in range(workers - 1):  # what was in flight arrives, a prefix of it
        queue = links[(dead, destination)]
        for _ in range(rng.randint(0, len(queue))):
            nodes[destination].receive(queue.popleft())
    widest = 0
    for holder in nodes[:-1]:
        held = set(holder.log.held_rounds(dead, 0, 10**6))
        if not held:
            continue
        newest = max(held)
        for asker in nodes[:-1]:
            lacking = held - set(asker.log.held_rounds(dead, 0, 10**6))
            if lacking:
                widest = max(widest, newest - min(lacking) + 1)
    return widest, nodes[dead].next_round


@pytest.mark.parametrize(("workers", "p", "staleness"), [(3, 2, 0), (3, 4, 1), (4, 3, 2)])
def test_every_round_a_gated_survivor_lacks_is_within_the_holders_window(
        workers: int, p: int, staleness: int) -> None:
    """The window's claim: whatever the delivery order and the moment of the kill, what
    one survivor holds and another lacks of the dead rank lies within the holder's last
    2 s + 2 rounds of it; the widest gap seen reaches the bound (it is not loose)."""
    window = keep_rounds(p, staleness)
    gaps = [_kill_at_random(seed, workers, p, staleness)[0] for seed in range(300)]
    assert max(gaps) <= window == min(2 * staleness + 2, 2 * p), gaps
    assert max(gaps) == 2 * staleness + 2, sorted(set(gaps))


@pytest.mark.parametrize("peers", [2, 8, 63])
def test_a_budget_bounds_the_copies_whatever_the_number_of_peers(peers: int) -> None:
    length, p, budget = 27_000_000, 4, 256_000_000
    keep = keep_messages(p, budget, peers=peers, length=length)
    message_bytes = 4 * -(-length // p)
    held_bytes = peers * keep * message_bytes
    assert held_bytes <= max(budget, peers * message_bytes)
    assert keep == max(1, min(RELAY_KEEP_GRADIENTS * p, budget // (peers * message_bytes)))


def test_a_budget_never_keeps_more_than_two_gradients_nor_less_than_one_message() -> None:
    assert keep_messages(2, 10**12, peers=2, length=1000) == RELAY_KEEP_GRADIENTS * 2
    assert keep_messages(2, 1, peers=2, length=1000) == 1


def test_the_store_keeps_a_senders_newest_messages_within_the_budget() -> None:
    length, p = 1000, 4
    keep = keep_messages(p, 3 * 4 * 250 * 2, peers=2, length=length)  # 3 messages a peer
    store = RelayStore(lambda sender: keep)
    for round_ in range(5):
        for part in range(p):
            start, stop = partition_slice(length, p, part)
            partial = Partial(Kind.GRAD, 1, round_, part, p, start, stop - start,
                              np.ones(stop - start, np.float32))
            store.keep(HeldPartial(partial, b"", b""))
    held = store.held[1]
    assert keep == 3 and len(held) == 3
    assert [item.partial.key for item in held] == [(1, 4, 1), (1, 4, 2), (1, 4, 3)]
    assert sum(item.partial.nbytes for item in held) <= 3 * 4 * 250


def test_the_setting_takes_a_size_or_bytes_and_refuses_the_rest() -> None:
    def budget(value: object) -> int:
        return resolve([Given("akorun.relay_budget", value, Layer.FLAG, "by --relay-budget")]
                       ).akorun.relay_budget_bytes

    assert budget("256MB") == 256_000_000 and budget(1024) == 1024 and budget("0") == 0
    for bad in ("-1MB", "lots", -5):
        with pytest.raises(ConfigError, match="akorun.relay_budget"):
            budget(bad)


def _relay(rank: int, workers: int, length: int, p_of: list[int], staleness: float,
           budget_bytes: int = 0) -> Relay:
    secret = b"relay budget test, 32 bytes long"
    keys = RunKeys.from_secret(secret, bytes(16), rank, workers, bytes(8))
    node = AkoWorker(rank, workers, length, p_of, replica=Replica(None, None),
                     staleness=staleness)
    return Relay(rank=rank, peers=[j for j in range(workers) if j != rank],
                 node=lambda: node, signer=Signer(keys),
                 verifier=RequestVerifier(keys, world=workers), peer_timeout_s=1.0,
                 deliver=lambda partial: True, budget_bytes=budget_bytes)


@pytest.mark.parametrize(("staleness", "budget_bytes"),
                         [(0.0, 0), (2.0, 0), (math.inf, 0), (1.0, 20_000)])
def test_after_many_rounds_the_relay_holds_at_most_its_stated_bytes(
        staleness: float, budget_bytes: int) -> None:
    """500 rounds of every peer, some arriving out of order: the store holds each peer's
    newest rounds within its window and never more than relay_bound_bytes."""
    workers, length, p_of = 4, 6_000, [3, 4, 6, 5]
    relay = _relay(0, workers, length, p_of, staleness, budget_bytes)
    bound = relay_bound_bytes(length, p_of, 0, staleness=staleness, budget_bytes=budget_bytes)
    rng = random.Random(5)
    peak = 0
    for base in range(0, 500, 4):
        arrivals = [(sender, round_) for sender in (1, 2, 3)
                    for round_ in range(base, base + 4)]
        rng.shuffle(arrivals)
        for sender, round_ in arrivals:
            p = p_of[sender]
            part = (round_ + sender) % p
            start, stop = partition_slice(length, p, part)
            relay.store.keep(HeldPartial(Partial(
                Kind.GRAD, sender, round_, part, p, start, stop - start,
                np.ones(stop - start, np.float32)), b"", b""))
            peak = max(peak, relay.store.held_bytes)
            assert relay.store.held_bytes == sum(
                item.partial.values.nbytes for queue in relay.store.held.values()
                for item in queue if item.partial.values is not None)
    assert peak == relay.store.peak_bytes <= bound
    for sender in (1, 2, 3):
        keep = keep_messages(p_of[sender], budget_bytes, peers=3, length=length,
                             staleness=staleness)
        assert [item.partial.round for item in relay.store.held[sender]] == \
            list(range(500 - keep, 500))
