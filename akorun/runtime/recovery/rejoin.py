"""The rejoin handshake (``--resume``, a recoverable rank only), both sides.

The node it rejoins or donates with is the one the role's recovery hands out
(akorun.runtime.recovery.rank_recovery): a node that is
akocore.schemes.recovery.Recoverable (ako's).

Joiner: answer partials with 503 "rejoining"; ask every peer what it
acknowledged, dropped and received (``rejoin-hello``); get a snapshot from the
most advanced live peer once it holds everything the dead process had
acknowledged (``snapshot``), and every partial of the dead process that any
live peer holds (the donor pulls them first, akorun.runtime.recovery.relay); adopt it;
tell every peer the first new round (``restart``); go on. Exact for plain SGD
when the crash landed between two rounds, and after a kill in the middle of a
round's sends too: before it takes the restart, every live peer pulls the dead
process's partials (rounds before the first new one) that another holds and it
lacks. Without any live peer the worker continues from its own checkpoint
alone.

Donor (every live peer): the three control handlers. A rejoining peer's
messages are kept (not dropped) until it restarts or is given up on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from akocore.schemes import Recoverable, RecoveryState, RejoinSnapshot, SchemeError
from akorun.errors import RunError, UsageError
from akorun.runtime.lifecycle.greeting import Unverified, greet, until
from akorun.runtime.lifecycle.join import Identity
from akorun.runtime.lifecycle.phase import Phase
from akorun.runtime.liveness.peer_liveness import Liveness
from akorun.runtime.liveness.waiting import Waiter
from akorun.runtime.outbox import Outbox
from akorun.runtime.rank_context import RankContext
from akorun.runtime.records.checkpoint_file import (
    Checkpoint,
    checkpoint_path,
    log_from_json,
    log_to_json,
    restore_optimizer_state,
)
from akorun.runtime.recovery.relay import Relay
from akorun.transport import control
from akorun.transport.client import ControlClient
from akorun.transport.control import ControlError, ControlKind

log = logging.getLogger("akorun")

SNAPSHOT_POLL_S = 0.1
RELAY_PATIENCE_S = 3.0  # a donor or a restart waits this long at most for a pull's holders


class Rejoin:
    """Both sides of the rejoin handshake."""

    def __init__(self, context: RankContext, *, identity: Identity, waiter: Waiter,
                 liveness: Liveness, outbox: Outbox,
                 build_node: Callable[[float | None, Sequence[int] | None], None],
                 checkpoint: Checkpoint | None = None, relay: Relay | None = None) -> None:
        self.identity = identity
        self.rank = identity.rank
        self.peers = list(context.peers)
        self.role = context.role
        self.peer_timeout_s = context.peer_timeout_s
        self.phase = context.phase
        self.waiter = waiter
        self.liveness = liveness
        self.outbox = outbox
        self.metrics = context.metrics
        self.relay = relay  # before a snapshot or a restart: pull what the dead process left
        self.checkpoint = checkpoint
        self.checkpoint_dir = context.checkpoint_dir
        self.build_node = build_node
        self.reported_highest: dict[int, int] = {}  # joiner -> its highest round we held

    # ================================================================ joiner

    async def rejoin(self, client: ControlClient) -> int:
        """Rejoin the live run from a donor, or go on from the checkpoint alone; the first
        round this rank runs."""
        self.phase.to(Phase.REJOINING)
        loop = asyncio.get_running_loop()
        payload = self.identity.payload()
        window_s = max(3.0, self.peer_timeout_s)
        unverified = Unverified("rejoin", window_s)  # untagged refusals: tried again

        async def ask(peer: int) -> dict[str, Any] | None:
            async def once() -> dict[str, Any] | None:
                return await greet(client, peer, ControlKind.REJOIN_HELLO, payload, "rejoin",
                                   unverified)
            return await until(loop.time() + window_s, once)

        replies = dict(zip(self.peers, await asyncio.gather(*(ask(j) for j in self.peers)),
                           strict=True))
        answered = {j: r for j, r in replies.items() if r is not None}
        if not answered and any(unverified.keys_differ(j) for j in self.peers):
            raise UsageError(f"--resume: no peer answered our rejoin within {window_s:g} s, "
                             f"only 401s without a tag we can check: this rank's secret, run "
                             f"id or key file likely differs from the run's")
        live = {j: r for j, r in answered.items() if not r.get("finished")}
        if not live:
            if answered:
                raise RunError("every peer that answered has finished: the run is over, "
                               "nothing to rejoin")
            return self._resume_alone()
        p_values = {tuple(r["p_of"]) for r in live.values()}
        if len(p_values) != 1:
            raise RunError(f"live peers disagree on p: {sorted(p_values)}")
        p_of = next(iter(p_values))
        if self.checkpoint is not None and tuple(self.checkpoint.p_of) != p_of:
            raise UsageError(f"{self._checkpoint_file()}: checkpoint has p = "
                             f"{list(self.checkpoint.p_of)}, the run uses {list(p_of)}")
        self.build_node(None, p_of)
        node = self.role.rejoiner()
        self._restore_optimizer(node)
        donor = max(live, key=lambda j: (live[j]["round"], -j))
        need = {str(j): max(int(r["acked_by"]), int(r["dropped_until"]))
                for j, r in live.items() if j != donor}
        log.warning("rejoining: donor rank %d (round %d), waiting for it to hold %s", donor,
                    live[donor]["round"], need)
        snapshot = await self._snapshot(client, donor, need)
        highest = -1
        for reply in answered.values():
            received = reply["received"]
            highest = max(highest, int(received["contiguous"]),
                          *(int(r) for r in received["pending"]))
        first_round = highest + 1
        node.adopt(snapshot, first_round)
        self.metrics.round = first_round
        for peer in self.peers:
            if peer not in answered:
                node.suspend_peer(peer)
        await asyncio.gather(*(self._restart(client, peer, first_round, node)
                               for peer in answered))
        self.liveness.heard_all()
        self.phase.to(Phase.RUNNING)
        log.warning("rejoined from rank %d's snapshot: continuing at round %d", donor,
                    first_round)
        return first_round

    async def _snapshot(self, client: ControlClient, donor: int,
                        need: dict[str, int]) -> RejoinSnapshot:
        answer = await client.call(donor, ControlKind.SNAPSHOT, {"rank": self.rank,
                                                                  "need": need},
                                    timeout_s=max(60.0, 4 * self.peer_timeout_s), binary=True)
        if not answer.ok:
            raise RunError(f"donor rank {donor} gave no snapshot ({answer.status}): "
                           f"{answer.error}")
        try:
            meta, arrays = control.unpack_arrays(answer.body)
            return RejoinSnapshot(int(meta["donor"]), arrays["params"], arrays["correction"],
                                  log_from_json(meta["log"]))
        except (ValueError, KeyError) as error:
            raise RunError(f"donor rank {donor} sent an unreadable snapshot: {error}") from None

    async def _restart(self, client: ControlClient, peer: int, first_round: int,
                       node: Recoverable) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(5.0, self.peer_timeout_s)
        while True:
            answer = await client.call(peer, ControlKind.RESTART,
                                        {"rank": self.rank, "first_round": first_round})
            if answer.ok:
                return
            if loop.time() > deadline:
                log.error("rank %d did not take our restart: %s", peer, answer.error)
                node.suspend_peer(peer)
                return
            await asyncio.sleep(0.2)

    def _resume_alone(self) -> int:
        checkpoint = self.checkpoint
        if checkpoint is None:
            raise UsageError(f"--resume: no live peer answered and there is no checkpoint of "
                             f"rank {self.rank} in {self.checkpoint_dir}")
        self.build_node(None, checkpoint.p_of)
        node = self.role.rejoiner()
        try:
            node.load_state(RecoveryState(checkpoint.rank, checkpoint.next_round,
                                          checkpoint.params, checkpoint.unsent, checkpoint.inbox,
                                          checkpoint.log, checkpoint.final_round))
        except (SchemeError, KeyError, ValueError) as error:
            raise UsageError(f"{self._checkpoint_file()}: checkpoint does not fit this run: "
                             f"{error}") from None
        self._restore_optimizer(node)
        self.metrics.round = checkpoint.next_round
        for peer in self.peers:
            node.suspend_peer(peer)
        self.phase.to(Phase.RUNNING)
        log.warning("no live peer: continuing from our checkpoint alone at round %d",
                    checkpoint.next_round)
        return checkpoint.next_round

    def _checkpoint_file(self) -> Path | str:
        if self.checkpoint_dir is None:
            return "--resume"
        return checkpoint_path(self.checkpoint_dir, self.rank)

    def _restore_optimizer(self, node: Recoverable) -> None:
        if self.checkpoint is None or not self.checkpoint.optimizer_leaves:
            return
        try:
            node.replica.state = restore_optimizer_state(node.replica.state,
                                                         self.checkpoint.optimizer_leaves)
        except ValueError as error:
            log.warning("checkpoint optimizer state not used: %s", error)

    # ================================================================ donor

    async def on_rejoin_hello(self, sender: int, payload: dict[str, Any]) -> dict[str, Any]:
        self.identity.check(sender, payload)
        if self.role.node is None or self.phase.is_(Phase.STARTING, Phase.REJOINING):
            raise ControlError(503, self.phase.name)
        node = self.role.donor()
        # keep (not drop) its messages until it restarts, or gives up rejoining
        self.liveness.rejoin_started(sender)
        sender_queue = self.outbox.senders[sender]
        contiguous, pending = node.log.export()[sender]
        self.reported_highest[sender] = max([contiguous, *pending])
        log.warning("rank %d is rejoining (we acknowledged-by it up to round %d, dropped up "
                    "to %d, hold its rounds up to %d)", sender, sender_queue.acked_round,
                    sender_queue.dropped_until, contiguous)
        return {**self.identity.payload(), "state": self.phase.name,
                "finished": node.finished, "round": node.next_round,
                "acked_by": sender_queue.acked_round,
                "dropped_until": sender_queue.dropped_until,
                "received": {"contiguous": contiguous, "pending": sorted(pending)},
                "p_of": list(node.p_of)}

    async def on_snapshot(self, sender: int, payload: dict[str, Any]) -> bytes:
        node = self.role.node
        if node is None or not self.phase.is_(Phase.RUNNING) or node.finished:
            raise ControlError(409, f"rank {self.rank} cannot donate: state {self.phase.name}")
        try:
            ako = self.role.donor()
        except ControlError:
            raise ControlError(409, f"rank {self.rank} cannot donate: state "
                                    f"{self.phase.name}") from None
        need_raw = payload.get("need", {})
        if not isinstance(need_raw, dict):
            raise ControlError(400, "need: expected {peer: round}")
        need = {int(j): int(r) for j, r in need_raw.items()
                if ako.log.knows(int(j)) and int(j) != sender}

        def ready() -> bool:
            return all(int(ako.log.contiguous[j]) >= r or j in ako.suspended
                       for j, r in need.items())

        if not await self.waiter.until(ready, max(30.0, 3 * self.peer_timeout_s),
                                       poll_s=SNAPSHOT_POLL_S):
            raise ControlError(503, f"messages from {need} did not arrive in time")
        if self.relay is not None:  # hold all any survivor held of the dead process
            await self.relay.pull(sender, patience_s=RELAY_PATIENCE_S)
        if ako.finished:
            raise ControlError(409, f"rank {self.rank} finished while waiting")
        snapshot = ako.rejoin_snapshot(sender)
        log.warning("gave rank %d a rejoin snapshot at our round %d", sender, ako.next_round)
        return control.pack_arrays(
            {"donor": self.rank, "log": log_to_json(snapshot.log), "round": ako.next_round},
            {"params": snapshot.params, "correction": snapshot.correction})

    async def on_restart(self, sender: int, payload: dict[str, Any]) -> dict[str, Any]:
        first_round = payload.get("first_round")
        try:
            node = self.role.donor()
        except ControlError:
            node = None
        if node is None or not isinstance(first_round, int):
            raise ControlError(400, "restart: expected {rank, first_round} for an ako run")
        reported = self.reported_highest.get(sender)
        if reported is None or not self.liveness.rejoining(sender):
            raise ControlError(409, f"restart from rank {sender}, which is not rejoining "
                                    f"(no rejoin-hello of it is pending here)")
        if first_round <= reported:
            raise ControlError(409, f"restart of rank {sender} at round {first_round}: we hold "
                                    f"its rounds up to {reported}, so it must go on after them")
        if self.relay is not None:  # its old rounds another survivor holds and we lack
            await self.relay.pull(sender, before_round=first_round,
                                  patience_s=RELAY_PATIENCE_S)
        if self.reported_highest.pop(sender, None) is None:
            raise ControlError(409, f"restart from rank {sender} taken meanwhile")
        node.peer_restarted(sender, first_round)
        if self.relay is not None:
            self.relay.restarted(sender, first_round)
        self.outbox.senders[sender].forget_gap()
        self.liveness.restarted(sender)
        log.warning("rank %d restarted: it continues from round %d", sender, first_round)
        return {"rank": self.rank}
