"""DiLoCo's re-sync: survivors of a loss, a cut or a pause end with one anchor.

A (Streaming) DiLoCo sync applies the owners' means of its chunks; while two
ranks disagree on who is live (one suspended a peer another still hears, a
cut between two of three ranks), they compute different owners and so apply
different means, and their anchors (and outer optimizer states) part for good.
So, after any suspension or return of a peer seen here (`DilocoWorker.
view_changes`), this rank tells its live peers (control ``anchor``, a notice
with its count of syncs applied, so that a returning rank learns at once
whether it was left behind)
and every one of them, for the next `RECHECK_SYNCS` syncs, compares its anchor
with the lowest live rank's once a sync is applied: same number of syncs
applied and the same sha256 of the anchor, or it takes that rank's anchor and
outer state (`DilocoWorker.adopt_agreed`; its own progress since the sync is
kept) and checks again at the next sync. The lowest live rank is the
reference and asks nobody: the lowest of this rank and the peers heard
within the peer timeout (a given-up peer that answers counts, so a rank that
went on alone still compares). A reference that has applied other syncs than
the asker says its count and the asker compares at its next sync; a rank
`BEHIND_SYNCS` or more syncs behind a live peer (it was paused or cut off
past the peer timeout and the others went on without it) cannot take their
state mid-run: it stops with exit 1 and a line saying so, and the others end
equal without it. What still differs at the end fails the run
(runtime.lifecycle.finishing compares the anchors' digests).

Fault-free runs never call: no view change, no check.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from akocore.schemes import Resyncable, SchemeError
from akorun.runtime.liveness.peer_liveness import Liveness
from akorun.runtime.liveness.waiting import Waiter
from akorun.runtime.node_plan import params_digest
from akorun.runtime.rank_context import RankContext
from akorun.transport import control
from akorun.transport.client import ControlClient
from akorun.transport.control import ControlError, ControlKind

log = logging.getLogger("akorun")

RECHECK_SYNCS = 3  # syncs compared after the last view change (or re-sync)
BEHIND_SYNCS = 3  # this many syncs behind a live peer: this rank was left behind
NOTICE_TIMEOUT_S = 2.0


class AnchorSync:
    """Both sides of DiLoCo's anchor re-sync (a no-op for every other scheme)."""

    def __init__(self, context: RankContext, *, waiter: Waiter, liveness: Liveness) -> None:
        self.rank = context.rank
        self.peers = list(context.peers)
        self.role = context.role
        self.waiter = waiter
        self.liveness = liveness
        self.peer_timeout_s = context.peer_timeout_s
        self.spawn = context.spawn
        self.control: ControlClient | None = None  # set once the run's client exists
        self.due_syncs = 0  # syncs still to compare with the reference
        self.seen_views = 0
        self.checked_at = -1  # the syncs count last compared
        self.adopted = 0  # re-syncs taken

    def _node(self) -> Resyncable | None:
        """The node as one that re-syncs (akocore.schemes.recovery), once it holds an
        anchor; None for every other scheme."""
        node = self.role.node
        resync = node.resync() if node is not None else None
        return resync if resync is not None and resync.anchor is not None else None

    @staticmethod
    def _anchor(node: Resyncable) -> np.ndarray:
        assert node.anchor is not None  # _node returns only nodes holding one
        return node.anchor

    def _live(self, node: Resyncable) -> list[int]:
        return [j for j in self.peers if j not in node.suspended
                and j not in self.liveness.left_peers and j not in self.liveness.stuck_peers]

    def _reference(self) -> int:
        return min([self.rank, *(j for j in self.peers if self.liveness.answering(j))])

    def _left_behind(self, peer: int, theirs: int, ours: int) -> None:
        """`peer` applied `theirs` syncs, this rank `ours`: far behind, it stops loudly."""
        if self.waiter.cause is not None or self.waiter.hard_stop:
            return
        line = (f"rank {self.rank} is {theirs - ours} syncs behind rank {peer} ({ours} "
                f"applied here, {theirs} there): it was away past the peer timeout and the "
                f"others went on without it; its model is not theirs: stopping, exit 1")
        log.error("%s", line)
        self.waiter.cause = line
        self.waiter.request_stop("left behind by the peers")
        self.waiter.stop_now()

    def _due(self) -> None:
        self.due_syncs = RECHECK_SYNCS
        self.checked_at = -1

    def note_views(self) -> None:
        """Tell the live peers of a view change seen here (called as every wait polls,
        so a gate blocked by a returning rank still tells it that it was left behind)."""
        node = self._node()
        if node is None or self.control is None or node.view_changes == self.seen_views:
            return
        self.seen_views = node.view_changes
        self._due()
        notice = {"rank": self.rank, "notice": True, "syncs": node.syncs_done}
        for peer in self._live(node):
            self.spawn(self.control.call(peer, ControlKind.ANCHOR, notice,
                                         timeout_s=NOTICE_TIMEOUT_S))

    async def after_gate(self) -> None:
        """Before a round (the gate just let it start): compare with the reference once
        per newly applied sync while a re-sync is due."""
        self.note_views()
        node = self._node()
        if node is None or self.control is None:
            return
        syncs = node.syncs_done
        if self.due_syncs <= 0 or syncs == 0 or syncs == self.checked_at:
            return
        self.checked_at = syncs
        reference = self._reference()
        if reference == self.rank:
            self.due_syncs -= 1
            return
        answer = await self.control.call(
            reference, ControlKind.ANCHOR,
            {"rank": self.rank, "syncs": syncs, "digest": params_digest(self._anchor(node))},
            timeout_s=max(2.0, 2 * self.peer_timeout_s), binary=True)
        if not answer.ok:
            return  # still due: the next sync compares again
        try:
            meta, arrays = control.unpack_arrays(answer.body)
        except ValueError as error:
            log.warning("rank %d sent an unreadable anchor: %s", reference, error)
            return
        theirs = meta.get("syncs")
        if isinstance(theirs, int) and theirs - syncs >= BEHIND_SYNCS:
            self._left_behind(reference, theirs, syncs)
            return
        if meta.get("same") is True:
            self.due_syncs -= 1
            return
        if node.syncs_done != syncs or theirs != syncs:
            return  # another count there, or a sync applied here meanwhile: the next one
        outer = [arrays.get(f"outer{k}") for k in range(node.fragments)]
        try:
            node.adopt_agreed(syncs, arrays["anchor"], outer)
        except (KeyError, SchemeError) as error:
            log.warning("rank %d's anchor not taken: %s", reference, error)
            return
        self.adopted += 1
        self._due()
        self.checked_at = syncs
        log.warning("re-synced the %s anchor from rank %d after %d syncs: it differed "
                    "here after a loss, a cut or a pause", self.waiter.scheme, reference, syncs)

    async def on_anchor(self, sender: int, payload: dict[str, Any]) -> dict[str, Any] | bytes:
        """A notice (a peer saw a view change: compare at the next syncs), or a
        comparison: our anchor's digest after the same syncs, or the anchor itself."""
        node = self._node()
        if node is None:
            raise ControlError(409, "no diloco anchor here")
        if payload.get("notice") is True:  # with the sender's syncs: a returning rank
            theirs = payload.get("syncs")  # learns at once that it was left behind
            if isinstance(theirs, int) and theirs - node.syncs_done >= BEHIND_SYNCS:
                self._left_behind(sender, theirs, node.syncs_done)
            self._due()
            return {"rank": self.rank}
        syncs, digest = payload.get("syncs"), payload.get("digest")
        if not isinstance(syncs, int) or isinstance(syncs, bool) or not isinstance(digest, str):
            raise ControlError(400, "anchor: expected {rank, syncs, digest} or {rank, notice}")
        await self.waiter.until(lambda: node.syncs_done >= syncs, self.peer_timeout_s)
        if syncs - node.syncs_done >= BEHIND_SYNCS:
            self._left_behind(sender, syncs, node.syncs_done)
        if node.syncs_done != syncs:  # our count: the asker compares later, or is behind
            return control.pack_arrays({"rank": self.rank, "syncs": node.syncs_done,
                                        "same": None}, {})
        if params_digest(self._anchor(node)) == digest:
            return control.pack_arrays({"rank": self.rank, "syncs": syncs, "same": True}, {})
        arrays: dict[str, np.ndarray] = {"anchor": self._anchor(node)}
        for k, state in enumerate(node.outer_state):
            if state is not None:
                if not isinstance(state, np.ndarray):
                    raise ControlError(409, "an outer optimizer state akorun cannot send")
                arrays[f"outer{k}"] = state
        return control.pack_arrays({"rank": self.rank, "syncs": syncs, "same": False}, arrays)
