"""Who is alive: when each peer was last heard, suspending silent peers and resuming them.

Only NEW evidence proves a peer alive: a message of it accepted (a duplicate
is not: it may be an old message re-sent), a new message of ours it
acknowledged as applied, or a heartbeat it answered with the nonce we sent
(answers are signed). A peer silent for longer than the peer timeout is
suspended from the SSP gate and reported; it rejoins the gate as soon as it
is heard again, unless it is between its rejoin-hello and its restart. Peers
not heard for a third of the timeout are sent a heartbeat. A peer that said
it leaves before it joined (`left`: stopped while starting, runtime.join)
sends nothing ever: it is out of the gate at once, for good. A ``done`` counts
only once that peer's final message is held (`is_done`); only such a peer,
which owes nothing more, is exempt from the timeout. Nothing ever waits
forever on a dead peer.

`Liveness.check(now)` is the whole decision for one moment (clock injected);
`monitor` runs it periodically and sends the heartbeats. The heartbeat and
done control handlers live here too. What counts as evidence of life, and
what a returning peer must do before it re-enters the gate, belong here.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable, Sequence
from typing import Any

from akocore.schemes import SchemeNode
from akorun.metrics import Metrics
from akorun.runtime.phase import Phase, PhaseMachine
from akorun.transport.client import ControlClient
from akorun.transport.control import ControlError, ControlKind

log = logging.getLogger("akorun")


class Liveness:
    """Last-heard times of the peers and the suspensions they lead to."""

    def __init__(self, *, rank: int, peers: Sequence[int], timeout_s: float,
                 node: Callable[[], SchemeNode | None], clock: Callable[[], float],
                 metrics: Metrics, phase: PhaseMachine,
                 on_change: Callable[[], None] = lambda: None,
                 notify_sender: Callable[[int], None] = lambda peer: None,
                 on_lost: Callable[[int], None] = lambda peer: None) -> None:
        self.rank = rank
        self.peers = list(peers)
        self.timeout_s = timeout_s
        self.node = node
        self.clock = clock
        self.metrics = metrics
        self.phase = phase
        self.on_change = on_change  # wake the waits
        self.notify_sender = notify_sender  # a change of the peer's suspension
        self.on_lost = on_lost  # a peer suspended: repair what it left (runtime.relay)
        self.last_heard: dict[int, float] = {}
        self.last_new_s: dict[int, float] = {}  # peer -> last time it sent a NEW message
        self.done_peers: set[int] = set()  # said done (see is_done)
        # peer -> (its rounds, the digest of its agreed state) as its done said
        self.agreed: dict[int, tuple[int, str]] = {}
        self.left_peers: dict[int, str] = {}  # peer -> why it left before it joined
        self.rejoining_peers: dict[int, float] = {}  # peer -> time of its rejoin-hello
        self.started_s: float | None = None  # peers never heard count as heard then
        self._heartbeats: set[int] = set()

    # ---------------------------------------------------------------- evidence

    def heard(self, peer: int) -> None:
        """`peer` is alive: a message accepted, a send acknowledged or a heartbeat answered."""
        self.last_heard[peer] = self.clock()
        node = self.node()
        if node is not None and peer in node.suspended and not self.rejoining(peer) \
                and peer not in self.left_peers:
            node.resume_peer(peer)
            log.warning("peer %d speaks again: back in the SSP gate", peer)
            self.notify_sender(peer)  # its stale POSTs go again on a new connection
            self.on_change()

    def received(self, peer: int, accepted: bool) -> None:
        """A partial of `peer` arrived: evidence only if it was new (not a duplicate)."""
        if accepted:
            self.last_new_s[peer] = self.clock()
            self.heard(peer)

    def is_done(self, peer: int) -> bool:
        """`peer` said done and its final message is held: it owes nothing more."""
        node = self.node()
        if peer not in self.done_peers or node is None:
            return False
        peer_done = getattr(node, "peer_done", None)
        return bool(peer_done(peer)) if peer_done is not None else True

    def heard_all(self) -> None:
        """Every peer counts as just heard (the handshake has just talked to them)."""
        now = self.clock()
        for peer in self.peers:
            self.last_heard[peer] = now

    def rejoining(self, peer: int) -> bool:
        """`peer` is between its rejoin-hello and its restart (and not given up on)."""
        since = self.rejoining_peers.get(peer)
        if since is None:
            return False
        limit_s = max(60.0, 4 * self.timeout_s) + self.timeout_s
        return self.clock() - since < limit_s

    def may_drop(self, peer: int) -> bool:
        """A full queue to `peer` may drop its oldest message (suspended, not rejoining)."""
        node = self.node()
        return node is not None and peer in node.suspended and not self.rejoining(peer)

    def rejoin_started(self, peer: int) -> None:
        self.rejoining_peers[peer] = self.clock()

    def restarted(self, peer: int) -> None:
        self.rejoining_peers.pop(peer, None)
        self.done_peers.discard(peer)
        self.left_peers.pop(peer, None)
        self.heard(peer)
        self.on_change()

    # ---------------------------------------------------------------- silence

    def suspend(self, peer: int, silent_s: float) -> None:
        node = self.node()
        assert node is not None
        node.suspend_peer(peer)
        self.metrics.peer_timeouts += 1
        log.warning("peer %d silent for %.1f s (peer timeout %.1f s): suspended from the SSP "
                    "gate; messages to it stay owed", peer, silent_s, self.timeout_s)
        self.notify_sender(peer)
        self.on_lost(peer)
        self.on_change()

    def left(self, peer: int, reason: str) -> None:
        """`peer` leaves before it joined (it said so): out of the gate now, for good."""
        self.left_peers.setdefault(peer, reason)
        node = self.node()
        if node is not None and peer not in node.suspended:
            node.suspend_peer(peer)
            self.notify_sender(peer)
        self.on_change()

    def check(self, now: float) -> list[int]:
        """Suspend the peers silent past the timeout; the peers to send a heartbeat now."""
        node = self.node()
        if node is None:
            return []
        if self.started_s is None:
            self.started_s = now
        due = []
        for peer in self.peers:
            if self.is_done(peer) or peer in self.left_peers:
                continue
            silent_s = now - self.last_heard.get(peer, self.started_s)
            if peer not in node.suspended and silent_s > self.timeout_s:
                self.suspend(peer, silent_s)
            if silent_s > self.timeout_s / 3 and peer not in self._heartbeats:
                self._heartbeats.add(peer)
                due.append(peer)
        return due

    async def monitor(self, control: ControlClient) -> None:
        """Suspend silent peers; heartbeat peers we have not heard from lately."""
        self.started_s = self.clock()
        while True:
            await asyncio.sleep(min(0.5, self.timeout_s / 4))
            for peer in self.check(self.clock()):
                task = asyncio.create_task(self._heartbeat(control, peer))
                task.add_done_callback(self._heartbeat_done(peer))

    def _heartbeat_done(self, peer: int) -> Callable[[asyncio.Task[None]], None]:
        return lambda _task: self._heartbeats.discard(peer)

    async def _heartbeat(self, control: ControlClient, peer: int) -> None:
        """A challenge: only a signed answer echoing our fresh nonce counts as heard."""
        nonce = secrets.token_hex(8)
        answer = await control.call(peer, ControlKind.HEARTBEAT,
                                    {"rank": self.rank, "nonce": nonce},
                                    timeout_s=max(1.0, self.timeout_s / 3))
        if answer.ok and answer.payload is not None and answer.payload.get("nonce") == nonce:
            self.heard(peer)

    # ---------------------------------------------------------------- control handlers

    async def on_heartbeat(self, sender: int, payload: dict[str, Any]) -> dict[str, Any]:
        if self.node() is None or self.phase.is_(Phase.STARTING, Phase.REJOINING):
            raise ControlError(503, self.phase.name)
        nonce = payload.get("nonce")
        return {"rank": self.rank, "round": self.metrics.round, "state": self.phase.name,
                "nonce": nonce if isinstance(nonce, str) else None}

    async def on_done(self, sender: int, payload: dict[str, Any]) -> dict[str, Any]:
        """Recorded; it counts (`is_done`) once the sender's final message is held."""
        self.done_peers.add(sender)
        digest, rounds = payload.get("agreed_sha256"), payload.get("rounds")
        if isinstance(digest, str) and isinstance(rounds, int):
            self.agreed[sender] = (rounds, digest)
        self.on_change()
        return {"rank": self.rank, "final_held": self.is_done(sender)}
