"""akorun.relay_budget: the relay's copies of peers' partials bounded by a budget, by the
documented formula (akorun.runtime.relay.keep_messages), instead of two gradients per
peer; the setting read from every layer."""

from __future__ import annotations

import numpy as np
import pytest

from akocore.config import ConfigError, Given, Layer, resolve
from akocore.messages import Kind, Partial
from akocore.partition import partition_slice
from akorun.runtime.relay import RELAY_KEEP_GRADIENTS, HeldPartial, RelayStore, keep_messages


def test_without_a_budget_two_gradients_per_peer_are_kept() -> None:
    assert keep_messages(4, 0, peers=63, length=4_000_000) == RELAY_KEEP_GRADIENTS * 4


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
