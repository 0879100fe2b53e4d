"""The end of a rank's run, after its rounds:

    deliver node.finish(t)
    drain: wait for every peer's final message      (deadline below)
           and for the repair of a lost peer         (runtime.recovery.relay; its own deadline)
    flush: wait until every peer took what we owe   (deadline below)
    node.settle(); final checkpoint; final accuracy; results; "done" to peers;
    wait a grace period for the peers' "done"       (deadline: grace_s)

A peer that left before it joined (it said ``leave``, runtime.lifecycle.join) sends
nothing: no wait is for it, and it is not told ``done``.

Deadlines. Drain and flush wait for a peer as long as it makes progress (the
flush never for a peer that said ``done``: it has settled and takes nothing more); a
peer that sent nothing new for `grace_s` (a dead or unreachable one, which
the peer timeout has also suspended by then) is given up on, with one line
naming it. So a peer paused or cut off past the peer timeout that comes back
within `grace_s` of our end still gets every message owed to it (the
suspension folded them, akorun.transport.sender) and we still get its last rounds;
one that stays away longer finishes without ours (it says so in its log).
A hard stop (second signal) gives up every wait at once.

A scheme that cannot go on without a lost peer (ps, all-reduce: the role's
`can_continue_without`) does not drain once such a peer is lost (stopped at
the gate, or suspended and silent for `grace_s`; a ps server still drains:
the live workers' finals need its answer): it settles, writes its
results naming the peer, tells the others ``done`` and raises RunError
(exit 1).

A scheme with agreed state (diloco's anchor) compares the digests the ``done``s
carry: a peer that ran as many rounds with another digest fails the run
(replicas disagree), and so does a rank whose digest no majority of the run
confirmed (a group cut off from the rest past the end: `_unconfirmed`).

A peer that said ``done`` has flushed all it owes: no drain waits for it. A scheme
left holding a step it could not complete (`SchemeNode.unfinished`: a diloco sync a
peer ended without this rank) ends exit 1 with that line.

A failed final write (checkpoint or results: a full disk) still tells the
peers ``done`` and waits for theirs, then raises RunError: one line, exit 1;
so does a rank that its peers gave up for making no progress (runtime.liveness.peer_liveness;
not in ako, which takes it back), a rank whose loss or gradient went NaN/Inf
(runtime.lifecycle.training), with the line naming it, and a rank stopped by such a
peer, with that peer's line (`Waiter.cause`: a member that sent malformed data,
a diloco rank left behind).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from akocore.workloads.nonfinite import is_nonfinite_stop
from akorun.errors import RunError
from akorun.runtime.lifecycle.evaluation import Evaluator
from akorun.runtime.lifecycle.phase import Phase
from akorun.runtime.lifecycle.training import TrainingLoop
from akorun.runtime.liveness.peer_liveness import Liveness
from akorun.runtime.liveness.waiting import Waiter
from akorun.runtime.node_plan import params_digest
from akorun.runtime.outbox import Outbox
from akorun.runtime.rank_context import RankContext
from akorun.runtime.records.checkpoints import CheckpointFailed, CheckpointWriter
from akorun.runtime.records.rank_result import ResultBuilder
from akorun.transport.client import ControlClient
from akorun.transport.control import ControlKind

log = logging.getLogger("akorun")

DONE_TIMEOUT_S = 2.0


class Finisher:
    """Drains, settles and reports one rank, then says goodbye to its peers."""

    def __init__(self, context: RankContext, *, waiter: Waiter, outbox: Outbox,
                 liveness: Liveness, training: TrainingLoop, evaluator: Evaluator,
                 checkpoints: CheckpointWriter, results: ResultBuilder,
                 relay_idle: Callable[[], bool] = lambda: True) -> None:
        self.rank = context.rank
        self.peers = list(context.peers)
        self.role = context.role
        self.phase = context.phase
        self.waiter = waiter
        self.outbox = outbox
        self.liveness = liveness
        self.training = training
        self.evaluator = evaluator
        self.checkpoints = checkpoints
        self.results = results
        self.grace_s = context.grace_s
        self.relay_idle = relay_idle  # no repair of a lost peer under way (runtime.recovery.relay)

    def _disagreements(self, done: dict[str, object]) -> list[str]:
        """One line naming the peers that ran as many rounds as this rank but hold another
        agreed state (diloco: the anchor): the run must not end as if it were one model."""
        rounds, digest = done["rounds"], done["agreed_sha256"]
        apart = sorted(j for j, (their_rounds, theirs) in self.liveness.agreed.items()
                       if their_rounds == rounds and theirs != digest)
        if not apart:
            return []
        return [f"replicas disagree: rank {self.rank} and rank(s) {apart} ran {rounds} rounds "
                f"but hold different {self.waiter.scheme} anchors (sha256 {str(digest)[:12]} "
                f"here): a sync reached them differently after a loss or a cut; results "
                f"written, the models are not one"]

    def _unconfirmed(self, done: dict[str, object]) -> list[str]:
        """One line unless this rank's agreed state is the run's: confirmed (equal `done`
        digests, this rank included) by more than half of the ranks that joined, or by
        exactly half holding the lowest of them. Two groups cut apart past the end each
        train on alone and agree within themselves; at most one of them can pass this,
        so a run never ends exit 0 as two models (the rule of torchft's quorum, decided
        at the end: nothing here waits for a quorum mid-run)."""
        digest = done["agreed_sha256"]
        members = sorted({self.rank, *self.peers} - set(self.liveness.left_peers))
        agreeing = sorted({self.rank} | {j for j, (_, theirs) in self.liveness.agreed.items()
                                         if theirs == digest and j in members})
        if 2 * len(agreeing) > len(members) or (
                2 * len(agreeing) == len(members) and members[0] in agreeing):
            return []
        return [f"no majority holds this model: rank(s) {agreeing} confirmed this "
                f"{self.waiter.scheme} anchor (sha256 {str(digest)[:12]}) at the end, "
                f"{len(agreeing)} of the run's {len(members)} ranks (a majority, or half "
                f"with rank {members[0]}, is needed); the others were cut off or lost and "
                f"may have trained on apart; results written, this replica is not the run's"]

    def _gone(self, started_s: float) -> Callable[[int], bool]:
        """Peers to give up on: nothing new from them for `grace_s` (nor since we began
        finishing) and suspended (silent past the peer timeout)."""
        liveness = self.liveness
        node = self.role.node
        assert node is not None

        def gone(peer: int) -> bool:
            if peer in liveness.left_peers:  # left before it joined: it sends nothing
                return True
            if peer not in node.suspended:
                return False
            last_new_s = max(started_s, liveness.last_new_s.get(peer, started_s))
            return liveness.clock() - last_new_s > self.grace_s
        return gone

    async def finish(self, control: ControlClient) -> None:
        node = self.role.node
        assert node is not None
        self.phase.to(Phase.FINISHING)
        if self.role.trains:
            await self.training.faults.at_end()
            await self.outbox.dispatch(node.finish(self.training.rounds_done))
        gone = self._gone(self.liveness.clock())
        peer_done = getattr(node, "peer_done", None)

        def lost() -> list[int]:
            """Peers this scheme cannot go on without that are lost (ps, all-reduce); one
            that left before it joined is not (the gate lost it if the run needed it)."""
            return sorted(j for j in self.peers if not self.role.can_continue_without(j)
                          and (j in self.waiter.lost_peers
                               or (gone(j) and j not in self.liveness.left_peers)))

        def stranded() -> bool:
            """A peer this scheme needs left before it joined: no round can complete (we
            are stopping: had we trained on, the gate would have lost it, see `lost`)."""
            return any(not self.role.can_continue_without(j) for j in self.liveness.left_peers)

        def drained() -> bool:
            if not self.relay_idle():  # a lost peer's partials are being forwarded to us
                return False
            if self.role.trains and (lost() or stranded()):  # its rounds cannot complete (a
                return True  # ps server still drains: the live workers' finals need its answer)
            # a peer that said done flushed all it owes us first: it sends nothing more
            # (waiting on its part of a sync it ended without us would never end)
            said_done = self.liveness.done_peers
            if peer_done is None:
                return node.drained() or all(j in said_done or gone(j) for j in self.peers)
            return all(peer_done(j) or gone(j) or j in said_done for j in self.peers)

        drained_ok = await self.waiter.until(drained)
        # a peer that said done has settled and takes nothing more: no flush waits for it
        # (it is also exempt from the peer timeout, so it would never count as gone)
        await self.outbox.flush(lambda j: gone(j) or j in self.liveness.done_peers,
                                lambda: self.waiter.hard_stop)
        given_up = sorted(j for j in self.peers if gone(j) and j not in self.liveness.left_peers)
        if given_up:
            log.warning("finished without peer(s) %s: silent past the peer timeout and "
                        "nothing new from them for %.1f s (the finish deadline)", given_up,
                        self.grace_s)
        if lost():
            self.waiter.lose(lost())
        node.settle()
        self.phase.to(Phase.DONE)
        if not drained_ok:
            log.warning("stopped before every peer's last message arrived")
        failures = []
        unfinished = node.unfinished() if self.role.trains else None
        if unfinished is not None:
            failures.append(f"{unfinished}: the peers ended the run without this rank's "
                            f"part; results written, this replica is not theirs")
        try:
            await self.checkpoints.write(final=True)
        except CheckpointFailed as error:
            failures.append(str(error))
        if self.role.trains and node.params is not None:
            await self.evaluator.final(node.params)
        try:
            self.results.write()
        except OSError as error:
            failures.append(f"{self.results.out_dir}: results not written: "
                            f"{error.strerror or error}")
        agreed = node.agreed_state() if self.role.trains else None
        done: dict[str, object] = {"rank": self.rank}
        if agreed is not None:
            done.update(rounds=self.training.rounds_done, agreed_sha256=params_digest(agreed))
        await asyncio.gather(*(control.call(j, ControlKind.DONE, done,
                                            timeout_s=DONE_TIMEOUT_S)
                               for j in self.peers if not gone(j)))
        await self.waiter.until(lambda: all(self.liveness.is_done(j) or gone(j)
                                            or j in node.suspended for j in self.peers),
                                self.grace_s)
        if agreed is not None:
            failures += self._disagreements(done) or self._unconfirmed(done)
        if self.liveness.given_up_here is not None and self.waiter.hard_stop:
            failures.insert(0, self.liveness.given_up_here)
        if failures:
            raise RunError(f"{'; '.join(failures)} (training finished; peers were told done)")
        told = [self.liveness.left_peers.get(j) for j in sorted(self.waiter.lost_peers)]
        cause = self.training.nonfinite or next(
            (f"{line} (stopped by that rank)" for line in told if is_nonfinite_stop(line)),
            self.waiter.cause)
        if cause is not None:  # the user's NaN, here or on the peer that stopped the run
            raise RunError(cause)
        if self.waiter.lost_peers:
            raise RunError(f"lost peer(s) {sorted(self.waiter.lost_peers)}: scheme "
                           f"{self.waiter.scheme} cannot continue without them; stopped "
                           f"(results written, replicas not equal)")
