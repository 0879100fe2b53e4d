"""Who is alive: when each peer was last heard, suspending silent peers and resuming them.

Only NEW evidence proves a peer alive: a message of it accepted (a duplicate
is not: it may be an old message re-sent), a new message of ours it
acknowledged as applied, or a heartbeat it answered with the nonce we sent
(answers are signed). A peer silent for longer than the peer timeout is
suspended from the SSP gate and reported; it rejoins the gate as soon as it
is heard again, unless it is between its rejoin-hello and its restart. Peers
not heard, or with nothing new, for a third of the timeout are sent a
heartbeat. A peer that said
it leaves before it joined (`left`: stopped while starting, runtime.lifecycle.join)
sends nothing ever: it is out of the gate at once, for good. A ``done`` counts
only once that peer's final message is held (`is_done`); only such a peer,
which owes nothing more, is exempt from the timeout. Nothing ever waits
forever on a dead peer.

A stuck peer is given up too: one that answers heartbeats but makes no
progress. Its heartbeat answers say how long it has been in its own work for
its current round (`busy_s`, runtime.lifecycle.training); past `STUCK_TIMEOUTS` x the
peer timeout it is given up (`give_up`: one error line naming it, suspended,
what it sent to only some peers repaired, and the `peer_stuck` event lets the scheme
stop when it cannot go on without it). The gate gives up a blocker that
sends nothing new for as long (runtime.liveness.waiting). A given-up peer is NOT
re-admitted because it answers: only a new message of a round it had not
reached when it was given up puts it back in the gate.

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
from akorun.runtime.lifecycle.phase import Phase, PhaseMachine
from akorun.runtime.liveness.waiting import GATE_STALL_TIMEOUTS as STUCK_TIMEOUTS
from akorun.runtime.rank_context import RankEvents
from akorun.transport.client import ControlClient
from akorun.transport.control import ControlError, ControlKind

log = logging.getLogger("akorun")


class Liveness:
    """Last-heard times of the peers and the suspensions they lead to."""

    def __init__(self, *, rank: int, peers: Sequence[int], timeout_s: float,
                 node: Callable[[], SchemeNode | None], clock: Callable[[], float],
                 metrics: Metrics, phase: PhaseMachine,
                 events: RankEvents | None = None) -> None:
        self.rank = rank
        self.peers = list(peers)
        self.timeout_s = timeout_s
        self.node = node
        self.clock = clock
        self.metrics = metrics
        self.phase = phase
        # wake, peer_changed (its sender reconnects), peer_lost (repair what it left),
        # peer_stuck (the scheme may stop without it), given_up_here
        self.events = events if events is not None else RankEvents()
        self.last_heard: dict[int, float] = {}
        self.last_new_s: dict[int, float] = {}  # peer -> last time it sent a NEW message
        self.done_peers: set[int] = set()  # said done (see is_done)
        # peer -> (its rounds, the digest of its agreed state) as its done said
        self.agreed: dict[int, tuple[int, str]] = {}
        self.left_peers: dict[int, str] = {}  # peer -> why it left before it joined
        self.rejoining_peers: dict[int, float] = {}  # peer -> time of its rejoin-hello
        self.started_s: float | None = None  # peers never heard count as heard then
        self._heartbeats: set[int] = set()
        self.stuck_limit_s = STUCK_TIMEOUTS * timeout_s
        self.stuck_peers: dict[int, str] = {}  # peer -> why it was given up although it answers
        self.waiting_peers: set[int] = set()  # peers whose last answer said: waiting on others
        self.reported_rounds: dict[int, int] = {}  # peer -> the round its last answer said
        self.stuck_rounds: dict[int, int] = {}  # peer -> its round when it was given up
        self.rounds_seen: dict[int, int] = {}  # peer -> the highest round of its new messages
        self.busy_s: Callable[[], float | None] = lambda: None  # this rank's own (training)
        # this rank answered a heartbeat busy past the limit: its peers give it up (the line)
        self.given_up_here: str | None = None

    # ---------------------------------------------------------------- evidence

    def heard(self, peer: int) -> None:
        """`peer` is alive: a message accepted, a send acknowledged or a heartbeat answered."""
        self.last_heard[peer] = self.clock()
        node = self.node()
        if node is not None and peer in node.suspended and not self.rejoining(peer) \
                and peer not in self.left_peers and peer not in self.stuck_peers:
            node.resume_peer(peer)
            log.warning("peer %d speaks again: back in the SSP gate", peer)
            self.events.peer_changed.emit(peer)  # its stale POSTs go again on a new connection
            self.events.wake.emit()

    def answering(self, peer: int) -> bool:
        """`peer` was heard within the peer timeout (perhaps given up, yet alive)."""
        heard_s = self.last_heard.get(peer)
        return heard_s is not None and self.clock() - heard_s <= self.timeout_s \
            and peer not in self.left_peers

    def received(self, peer: int, accepted: bool, round_: int | None = None) -> None:
        """A partial of `peer` (of its round `round_`) arrived: evidence only if it was
        new (not a duplicate); a given-up peer is back only with a round it had not
        reached when it was given up (a diloco owner's mean of an older sync is not)."""
        if accepted:
            self.last_new_s[peer] = self.clock()
            if round_ is not None:
                self.rounds_seen[peer] = max(round_, self.rounds_seen.get(peer, round_))
            stuck_at = self.stuck_rounds.get(peer, 0)
            if peer in self.stuck_peers and (round_ is None or round_ >= stuck_at):
                del self.stuck_peers[peer]
                log.warning("peer %d sends new rounds again: no longer given up", peer)
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
        self.events.wake.emit()

    # ---------------------------------------------------------------- silence

    def suspend(self, peer: int, silent_s: float) -> None:
        node = self.node()
        assert node is not None
        node.suspend_peer(peer)
        self.metrics.peer_timeouts += 1
        log.warning("peer %d silent for %.1f s (peer timeout %.1f s): suspended from the SSP "
                    "gate; messages to it stay owed", peer, silent_s, self.timeout_s)
        self.events.peer_changed.emit(peer)
        self.events.peer_lost.emit(peer)
        self.events.wake.emit()

    def waits_itself(self, peer: int) -> bool:
        """Its last heartbeat answer said it waits on others (not stuck in its own work)."""
        return peer in self.waiting_peers

    def give_up(self, peer: int, why: str) -> None:
        """`peer` answers but makes no progress (`why` says how we know): out of the gate
        until it sends a new message, what it sent to only some repaired (`peer_lost`),
        and the scheme told (`peer_stuck`)."""
        if peer in self.stuck_peers or peer in self.left_peers or self.is_done(peer):
            return
        self.stuck_peers[peer] = why
        self.stuck_rounds[peer] = max(self.reported_rounds.get(peer, 0),
                                      self.rounds_seen.get(peer, -1) + 1)
        log.error("%s: given up on (out of the gate until it sends a new round)", why)
        node = self.node()
        if node is not None and peer not in node.suspended:
            node.suspend_peer(peer)
            self.events.peer_changed.emit(peer)
            self.events.peer_lost.emit(peer)
        self.events.peer_stuck.emit(peer, why)
        self.events.wake.emit()

    def left(self, peer: int, reason: str) -> None:
        """`peer` leaves before it joined (it said so): out of the gate now, for good."""
        self.left_peers.setdefault(peer, reason)
        node = self.node()
        if node is not None and peer not in node.suspended:
            node.suspend_peer(peer)
            self.events.peer_changed.emit(peer)
        self.events.wake.emit()

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
            # nothing new from it (acknowledgements are no news): ask how it is doing
            quiet_s = now - self.last_new_s.get(peer, self.started_s)
            if min(silent_s, quiet_s) >= 0 and max(silent_s, quiet_s) > self.timeout_s / 3 \
                    and peer not in self._heartbeats:
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
            self._busy_answer(peer, answer.payload)

    def _busy_answer(self, peer: int, payload: dict[str, Any]) -> None:
        """What a heartbeat answer says of the peer's progress: waiting on others, or busy
        in its own round for `busy_s` (given up past the limit)."""
        round_ = payload.get("round")
        if isinstance(round_, int) and not isinstance(round_, bool):
            self.reported_rounds[peer] = round_
        busy_s = payload.get("busy_s")
        if not isinstance(busy_s, (int, float)) or isinstance(busy_s, bool):
            self.waiting_peers.add(peer)
            return
        self.waiting_peers.discard(peer)
        if busy_s > self.stuck_limit_s:
            self.give_up(peer, f"peer {peer} answers but has made no progress for "
                               f"{busy_s:.1f} s (stuck in its round {payload.get('round')}; "
                               f"the limit is {STUCK_TIMEOUTS} x the peer timeout = "
                               f"{self.stuck_limit_s:.1f} s)")

    # ---------------------------------------------------------------- control handlers

    async def on_heartbeat(self, sender: int, payload: dict[str, Any]) -> dict[str, Any]:
        if self.node() is None or self.phase.is_(Phase.STARTING, Phase.REJOINING):
            raise ControlError(503, self.phase.name)
        nonce = payload.get("nonce")
        busy_s = self.busy_s()
        if busy_s is not None and busy_s > self.stuck_limit_s and self.given_up_here is None:
            self.given_up_here = (
                f"rank {self.rank} made no progress for {busy_s:.1f} s in its round "
                f"{self.metrics.round} (past {STUCK_TIMEOUTS} x the peer timeout = "
                f"{self.stuck_limit_s:.1f} s): its peers gave it up and went on without it")
            log.error("%s", self.given_up_here)
            self.events.given_up_here.emit(self.given_up_here)
        return {"rank": self.rank, "round": self.metrics.round, "state": self.phase.name,
                "nonce": nonce if isinstance(nonce, str) else None,
                "busy_s": None if busy_s is None else round(busy_s, 3)}

    async def on_done(self, sender: int, payload: dict[str, Any]) -> dict[str, Any]:
        """Recorded; it counts (`is_done`) once the sender's final message is held."""
        self.done_peers.add(sender)
        digest, rounds = payload.get("agreed_sha256"), payload.get("rounds")
        if isinstance(digest, str) and isinstance(rounds, int):
            self.agreed[sender] = (rounds, digest)
        self.events.wake.emit()
        return {"rank": self.rank, "final_held": self.is_done(sender)}
