"""Repair after a lost sender: survivors forward each other the lost rank's partials.

The problem. A rank multicasts each round's partial to every peer, one
message per peer. Killed in the middle of that, it leaves one survivor
holding its round r and another never getting it: every survivor exits 0,
but their replicas differ by that partial, for good.

The choice: forward, not drop. Two repairs are possible: (a) the survivors
that hold more of the lost rank's rounds forward the missing partials to the
others, or (b) the survivors agree on the lowest round all of them hold and
undo the rest. (b) needs an undo of an update already applied (exact only for
plain SGD, and never for the optimizer state) and throws away work; (a) only
adds what a survivor lacks, through the same exactly-once receive path as any
partial (`SchemeNode.receive` refuses a (sender, round, part) held already).
So akorun does (a):

- Keep: every partial accepted from a peer is also kept here (`RelayStore`),
  with the sender's endorsements (akorun.transport.keys.Signer.endorse: one tag per
  other rank, keyed with that rank's session key, over the header that
  commits to the body). Per peer, the messages of its last K rounds are kept
  (a window of rounds, `keep_rounds`): K = min(2 s + 2, RELAY_KEEP_GRADIENTS x p)
  for an SSP bound s (2 p for s = inf), one message per round, so a rank keeps
  at most (n - 1) x K x 4 ceil(D / p) bytes of float32 values (with a codec,
  the decoded values: the same). With ``akorun.relay_budget`` B the window is
  what B buys instead (`keep_messages`: B / (n - 1) per peer in whole messages,
  at least one, at most 2 p): at most max(B, (n - 1) x 4 ceil(D / p)) bytes.
  Why 2 s + 2 rounds is enough. A survivor A that still gates on the lost rank
  j holds j's rounds through r_A >= N_A - 2 - s (it started its round N_A - 1
  only while (N_A - 2) - r_A <= s); j started its last training round R only
  while (R - 1) - (A's rounds j held) <= s, and A had sent no round past
  N_A - 1, so R <= N_A + s. What A lacks of j's training rounds is therefore
  within (R - 2 s - 2, R]: the last 2 s + 2 rounds of j any holder got. The
  same holds after a pause or a cut of j seen by every rank (each survivor
  gated on j until it suspended it) and before a restart (``--resume``: the
  survivors still gate on j). So the default is exact for a kill
  mid-multicast of any training round, and O((2 s + 2) x 4 D (n - 1) / p):
  4 D (2 s + 2) bytes at most with p >= n - 1, whatever n (at p < n - 1,
  (n - 1) / p times that, never more than the old 8 D (n - 1)). Not covered by
  default: j's final flush (its p - 1 owed partitions sent back to back after
  its last round, no gate between them) can put a survivor up to 2 s + p + 1
  rounds behind another; a kill inside that flush is repaired exactly only
  when K >= 2 s + p + 1: by default only at p = 1 (no flush), with a budget of
  8 D (n - 1) bytes (K = 2 p, the old default of two gradients per peer) when
  p >= 2 s + 1. Otherwise -- as for any gap wider
  than the window, e.g. a peer one survivor suspended long before the others
  -- the survivors cannot agree, the run fails and says so (see Agree): it
  never ends with unequal replicas. The window is never larger than the old
  default of 2 p messages, so every case that default repaired within 2 s + 2
  rounds is still repaired, with less memory when s < p - 1.
- Pull: when this rank suspends a peer (silent past the peer timeout: dead,
  paused or cut off), it asks every other live peer (control ``relay``, sealed
  like every control message) for the messages of the lost peer that it does
  not hold, sending its own delivery record of that peer; the answer is those
  messages, re-encoded byte for byte as sent (same header, same body), each
  with the lost peer's endorsements and the nonce of the instance that sent it.
  A holder answers only once it has lost that peer too (503 until then; the
  asker retries for 2 T + 1 s, and stops as soon as the peer speaks to it
  again): a peer that only the asker cannot hear (a cut between two ranks) is
  not dead, and after the heal it sends the asker the rounds it folded for it
  (akorun.transport.sender.OwedGap: one message summing them), which must not
  meet forwarded copies of the same rounds (the copy would be kept, the sum
  dropped as a duplicate).
  A donor also pulls before it hands a rejoining rank a snapshot, and every
  peer pulls (rounds before the restart only) before it takes a restart, so a
  kill mid-send followed by ``--resume`` ends equal too.
- Check: a forwarded message is taken only if its endorsement for THIS rank
  verifies with the session key of the lost rank's instance that sent it
  (current, or an earlier one for rounds before its restart): the forwarder
  cannot make or alter one, so the replay and forgery defences of
  akorun.transport.keys still hold (partials are idempotent by (sender, round, part);
  the control request that carries them has its own seal and counter).
  Forwarded messages are not evidence that the lost rank lives.
- Meet: a peer that was only paused or cut off comes back and sends again
  what it owed, possibly folded (akorun.transport.sender.OwedGap: one message summing
  a range of rounds); where this rank already took some of those rounds
  forwarded, their forwarded values are taken out of the folded sum before
  the node records the rounds it lacks (`fold_in`), and a plain message that
  meets a forwarded copy adds its difference once (`duplicate`), so the
  total stays exact either way. Folded messages are never kept for
  forwarding: each is a sum made for one receiver.
- Agree: every relay answer also carries the holder's own record of the lost
  rank (its delivery record: contiguous round and pending parts). After a loss
  a survivor pulls from each holder again until the holder's record equals its
  own: a holder that holds more but forwarded nothing (it got the round late,
  or withholds it) is asked again; one that holds less is pulling from here
  (a pull whose asker shows more than the holder makes the holder pull too).
  When this rank's record changes during a pass, it makes another pass, so
  every survivor sees the final set. A gap still open when nothing changed
  for 2 T + 1 s is a disagreement: one line in the log, in the result
  (``relay_disagreements``) and the run exits non-zero -- never an exit 0
  with survivors holding different rounds.
- Finish: a rank does not settle while a pull is under way (the Finisher asks
  `idle`); each pull gives up on a holder after the peer timeout.

Every survivor pulls from every other until their records agree, so after the
pulls each survivor holds the union of what any survivor held of the lost rank:
up to the last round any survivor held, each of its partials applied exactly
once everywhere (or the run fails loudly, see Agree). What the
lost rank never sent to anyone is lost for everyone alike. ako only: the ps
and all-reduce schemes stop on a lost peer (docs/guide/failure.md).

Past ~500 lines on purpose: keeping, pulling, checking endorsements and agreeing
on records share one store, one answer format and one record of the lost rank;
split apart, each piece would re-parse what another makes.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import bisect
import logging
import math
import struct
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import blake3
import numpy as np

from akocore.codecs import Codec
from akocore.codecs.exchange import decoded
from akocore.messages import Partial
from akocore.partition import partition_slice
from akocore.schemes import DeliveryRecorded, Recoverable, SchemeError
from akorun.transport import control
from akorun.transport.client import ControlClient
from akorun.transport.control import ControlError, ControlKind
from akorun.transport.keys import NONCE_BYTES, RequestVerifier, Signer
from akorun.transport.wire import HEADER_SIZE, WireError, decode

log = logging.getLogger("akorun")

RELAY_KEEP_GRADIENTS = 2  # the window's cap: a peer's last 2 * p rounds (two full gradients)
PULL_RETRY_S = 0.2
AGREEMENT_PASSES = 8  # passes of pulls a lost origin's agreement makes at most


@dataclass(frozen=True)
class HeldPartial:
    """One accepted partial kept for forwarding: its values (a copy), the sender's
    endorsements and the nonce of the sender's instance that sent it."""

    partial: Partial
    endorsements: bytes
    origin_nonce: bytes


def keep_rounds(p: int, staleness: float) -> int:
    """The default window: a sender's last min(2 s + 2, RELAY_KEEP_GRADIENTS x p) rounds
    (one message each), 2 p for s = inf. 2 s + 2 rounds hold every training round a
    survivor that gates on the sender can lack (module docstring, Keep)."""
    cap = RELAY_KEEP_GRADIENTS * p
    if math.isinf(staleness) or staleness < 0:
        return cap
    return max(1, min(cap, 2 * int(staleness) + 2))


def keep_messages(p: int, budget_bytes: int, *, peers: int, length: int,
                  staleness: float = math.inf) -> int:
    """How many of one sender's last rounds (one message each) are kept: by default
    `keep_rounds(p, staleness)`: at most (n - 1) x min(2 s + 2, 2 p) x 4 ceil(D / p) bytes
    per rank; with a budget B (akorun.relay_budget) its share, B / (n - 1) bytes, in whole
    messages of 4 x ceil(D / p) bytes, at least one and at most 2 p: at most
    max(B, (n - 1) x 4 ceil(D / p)) bytes per rank, whatever n. Rounds older than what
    is kept cannot be repaired after a loss; the survivors then disagree and the run
    fails, saying so, rather than end unequal."""
    if budget_bytes <= 0 or length <= 0:
        return keep_rounds(p, staleness)
    message_bytes = 4 * -(-length // p)
    return max(1, min(RELAY_KEEP_GRADIENTS * p,
                      budget_bytes // (max(1, peers) * message_bytes)))


def relay_bound_bytes(length: int, p_of: Sequence[int], rank: int, *, staleness: float,
                      budget_bytes: int = 0) -> int:
    """The most float32 bytes rank `rank`'s relay holds: the sum over its peers j of
    keep_messages(p_j, ...) x 4 ceil(D / p_j) (the stated bound, docs/reference/memory.md)."""
    peers = [j for j in range(len(p_of)) if j != rank]
    return sum(keep_messages(p_of[j], budget_bytes, peers=len(peers), length=length,
                             staleness=staleness) * 4 * -(-length // p_of[j]) for j in peers)


class RelayStore:
    """Per sender, the messages of its last rounds accepted here: those of rounds within
    `keep_of(sender)` of the newest round held of it (one message per round), oldest
    first."""

    def __init__(self, keep_of: Callable[[int], int]) -> None:
        self.keep_of = keep_of
        self.held: dict[int, list[HeldPartial]] = {}
        self.held_bytes = 0  # bytes of values held now (what the memory bound counts)
        self.peak_bytes = 0  # ... at most, so far

    def keep(self, item: HeldPartial) -> None:
        queue = self.held.setdefault(item.partial.sender, [])
        bisect.insort(queue, item, key=lambda held: held.partial.key)
        self.held_bytes += _values_bytes(item)
        keep = max(1, self.keep_of(item.partial.sender))
        newest = queue[-1].partial.round
        drop = 0
        while drop < len(queue) and (queue[drop].partial.round <= newest - keep
                                     or len(queue) - drop > keep):
            self.held_bytes -= _values_bytes(queue[drop])
            drop += 1
        del queue[:drop]
        self.peak_bytes = max(self.peak_bytes, self.held_bytes)

    def missing_for(self, origin: int, contiguous: int,
                    pending: set[tuple[int, int]]) -> list[HeldPartial]:
        """Messages of `origin` held here that a peer with this record lacks, oldest first."""
        return [item for item in self.held.get(origin, ())
                if item.partial.round > contiguous
                and (item.partial.round, item.partial.part) not in pending]

    def oldest_round(self, origin: int) -> int | None:
        queue = self.held.get(origin)
        return queue[0].partial.round if queue else None


Record = tuple[int, tuple[tuple[int, int], ...]]  # (contiguous round, sorted pending parts)


def record_of(node: DeliveryRecorded, origin: int) -> Record:
    """This rank's set of `origin`'s rounds, as comparable data: its delivery record."""
    contiguous, pending = node.log.export()[origin]
    return contiguous, tuple(sorted((int(r), int(p)) for r, parts in pending.items()
                                    for p in parts))


def record_digest(record: Record) -> str:
    """A short digest of a set of rounds (what survivors compare, and what a log names)."""
    return blake3.blake3(control.dumps({"record": [record[0], list(record[1])]})
                         ).hexdigest()[:16]


def record_covers(big: Record, small: Record) -> bool:
    """Every round (and part) held in `small` is held in `big`."""
    big_pending = set(big[1])
    return small[0] <= big[0] and all(r <= big[0] or (r, part) in big_pending
                                      for r, part in small[1])


def pack_messages(origin: int, items: Sequence[tuple[HeldPartial, bytes]],
                  record: Record | None = None) -> bytes:
    """[u32 json length][json][wire messages...]: the answer of a ``relay`` request, with
    the holder's own `record` of `origin` (what it holds, forwarded or not)."""
    meta: dict[str, Any] = {"origin": origin, "messages": [
        [item.origin_nonce.hex(), base64.b64encode(item.endorsements).decode("ascii"),
         len(data)] for item, data in items]}
    if record is not None:
        meta["record"] = [record[0], [list(pair) for pair in record[1]]]
    head = control.dumps(meta)
    return b"".join([struct.pack("<I", len(head)), head, *(data for _, data in items)])


def unpack_messages(body: bytes) -> tuple[int, list[tuple[bytes, bytes, bytes]]]:
    """Inverse of pack_messages: (origin, [(origin nonce, endorsements, wire bytes)]);
    ValueError on a malformed body."""
    if len(body) < 4:
        raise ValueError("short relay answer")
    (head_len,) = struct.unpack_from("<I", body)
    meta = control.loads(body[4:4 + head_len])
    offset = 4 + head_len
    out = []
    try:
        for nonce_hex, tags_b64, nbytes in meta["messages"]:
            end = offset + int(nbytes)
            if end > len(body) or int(nbytes) < HEADER_SIZE:
                raise ValueError("a relayed message runs past the answer")
            out.append((bytes.fromhex(nonce_hex), base64.b64decode(tags_b64, validate=True),
                        body[offset:end]))
            offset = end
        origin = int(meta["origin"])
    except (KeyError, TypeError, binascii.Error) as error:
        raise ValueError(f"malformed relay answer: {error}") from None
    if offset != len(body):
        raise ValueError("relay answer has trailing bytes")
    return origin, out


def unpack_record(body: bytes) -> Record | None:
    """The holder's record carried by a relay answer (None if it carries none or is
    malformed)."""
    try:
        (head_len,) = struct.unpack_from("<I", body)
        raw = control.loads(body[4:4 + head_len]).get("record")
        if raw is None:
            return None
        contiguous, pending = raw
        return int(contiguous), tuple(sorted((int(r), int(part)) for r, part in pending))
    except (struct.error, ValueError, TypeError, UnicodeDecodeError):
        return None


class Relay:
    """Keeps peers' partials, pulls a lost peer's missing ones from the survivors, serves
    the pulls of others (control ``relay``)."""

    def __init__(self, *, rank: int, peers: Sequence[int],
                 node: Callable[[], Recoverable | None],
                 signer: Signer, verifier: RequestVerifier, peer_timeout_s: float,
                 deliver: Callable[[Partial], bool],
                 lost_here: Callable[[int], bool] = lambda peer: True,
                 codec: Codec | None = None, budget_bytes: int = 0,
                 before_answer: Callable[[int], Awaitable[bool]] | None = None) -> None:
        self.rank = rank
        self.codec = codec  # the run's codec: forwarded messages may be coded with it
        self.budget_bytes = budget_bytes  # akorun.relay_budget; 0: keep_rounds
        self.peers = list(peers)
        # the rank's recoverable node (runtime.recovery.rank_recovery); None: no relay
        self.node = node
        self.signer = signer
        self.verifier = verifier
        self.peer_timeout_s = peer_timeout_s
        self.deliver = deliver  # give a verified forwarded partial to the node; accepted?
        self.lost_here = lost_here  # this rank has suspended the peer, or it is rejoining
        self.control: ControlClient | None = None  # set once the run's client exists
        self.store = RelayStore(self._keep_of)
        self.restarted_at: dict[int, tuple[bytes, int]] = {}  # peer -> (nonce, first round)
        self.received = 0  # forwarded partials taken here
        self.refused = 0  # forwarded partials whose endorsement did not verify
        self.served = 0  # partials forwarded to peers
        self.reconciled = 0  # duplicates of forwarded partials whose difference was taken
        self._forwarded: dict[tuple[int, int, int], np.ndarray] = {}  # taken via a survivor
        self._incoming: dict[tuple[int, int, int], bytes] = {}
        # a fault hook awaited before answering a pull from a rank: False = answer with no
        # messages (akorun.runtime.fault_hooks.relay_answer_hook; None outside fault tests)
        self.before_answer = before_answer
        self._pulls: set[asyncio.Task[int]] = set()
        self._lost_pulls: set[int] = set()  # origins with an agreement task under way
        self._pulling: set[tuple[int, int]] = set()  # (origin, holder) pulls under way
        self._again: set[int] = set()  # ... asked for again while it ran
        # lost origin -> the one line saying survivors ended holding different rounds of it
        self.disagreements: dict[int, str] = {}
        self.agreed: dict[tuple[int, int], str] = {}  # (origin, holder) -> digest agreed on
        # (origin, holder) -> (this rank's record, the holder's) when a pull gave up unequal
        self._unequal: dict[tuple[int, int], tuple[Record, Record]] = {}

    def _keep_of(self, sender: int) -> int:
        node = self.node()
        p = node.p_of[sender] if node is not None else 1
        return keep_messages(p, self.budget_bytes, peers=len(self.peers),
                             length=node.length if node is not None else 0,
                             staleness=node.staleness if node is not None else math.inf)

    # ---------------------------------------------------------------- keep

    def note_endorsements(self, key: tuple[int, int, int], text: str | None) -> None:
        """The endorsements of the partial the server is about to hand over."""
        self._incoming.clear()
        if text:
            try:
                self._incoming[key] = base64.b64decode(text, validate=True)
            except (binascii.Error, ValueError):
                return

    def accepted(self, partial: Partial) -> None:
        """Keep a partial just accepted from its sender (a recoverable node only; values
        copied)."""
        endorsements = self._incoming.pop(partial.key, None)
        nonce = self.verifier.sessions.peer_nonce.get(partial.sender)
        if partial.folded:  # a sum made for this rank alone: nothing another rank could use
            return
        if endorsements is None or nonce is None or self.node() is None:
            return
        values = None if partial.values is None else np.array(partial.values, copy=True)
        self.store.keep(HeldPartial(_with_values(partial, values), endorsements, nonce))

    # ---------------------------------------------------------------- pull

    def peer_lost(self, origin: int) -> None:
        """`origin` was suspended (or this rank's set of its rounds changed since, or a
        survivor showed it holds more): pull what the other survivors hold of it and agree
        with them on it (one task per origin; asked again while it runs, it makes one more
        pass when done)."""
        if self.node() is None or self.control is None:
            return
        if origin in self._lost_pulls:
            self._again.add(origin)
            return
        task = asyncio.get_running_loop().create_task(self._agree(origin))
        self._lost_pulls.add(origin)
        self._pulls.add(task)

        def done(finished: asyncio.Task[int]) -> None:
            self._pulls.discard(finished)
            self._lost_pulls.discard(origin)
        task.add_done_callback(done)

    async def _agree(self, origin: int) -> int:
        """Passes of `pull(origin, while_lost=True)` until one ends with this rank's set of
        `origin`'s rounds unchanged during it (every holder saw the final set)."""
        taken = 0
        try:
            for _ in range(AGREEMENT_PASSES):
                node = self.node()
                if node is None:
                    break
                before = record_of(node, origin)
                self._again.discard(origin)
                taken += await self.pull(origin, while_lost=True)
                if record_of(node, origin) == before and origin not in self._again:
                    break
        finally:
            self._lost_pulls.discard(origin)
        self._finalize(origin)
        return taken

    def _pull_more(self, origin: int, holder: int) -> None:
        """`holder` showed it holds rounds of lost `origin` this rank lacks: pull from it now
        (beside a running agreement), or start an agreement."""
        client = self.control
        if client is None or (origin, holder) in self._pulling:
            return  # a pull from it is under way: it sees the new record
        if origin not in self._lost_pulls:
            self.peer_lost(origin)
            return

        async def pull_more() -> int:
            taken = await self._pull_from(client, holder, origin, None,
                                          2 * self.peer_timeout_s + 1.0, True)
            if origin not in self._lost_pulls:
                self._finalize(origin)
            return taken
        task = asyncio.get_running_loop().create_task(pull_more())
        self._pulls.add(task)
        task.add_done_callback(self._pulls.discard)

    def _finalize(self, origin: int) -> None:
        """Report the holders still unequal on lost `origin` once no pull from them runs."""
        node = self.node()
        for (lost, holder), (mine, theirs) in sorted(self._unequal.items()):
            if lost == origin and (origin, holder) not in self._pulling and node is not None \
                    and origin in node.suspended and holder not in node.suspended:
                self._disagree(origin, holder, mine, theirs)

    def idle(self) -> bool:
        """No pull under way (the finish settles only then)."""
        return not self._pulls

    async def pull(self, origin: int, *, before_round: int | None = None,
                   patience_s: float | None = None, while_lost: bool = False) -> int:
        """Ask every other peer for `origin`'s messages this rank lacks (those before
        `before_round` only, if given); the number taken. Gives up on a holder that does
        not answer within `patience_s` (default 2 T + 1 s) and, `while_lost`, as soon as
        `origin` is no longer suspended here (it speaks again); `while_lost`, it also waits
        until each holder's record of `origin` equals this rank's (`_pull_from`)."""
        node = self.node()
        client = self.control
        if node is None or client is None:
            return 0
        holders = [j for j in self.peers if j != origin]
        patience = 2 * self.peer_timeout_s + 1.0 if patience_s is None else patience_s
        taken = sum(await asyncio.gather(*(self._pull_from(client, holder, origin, before_round,
                                                           patience, while_lost)
                                           for holder in holders)))
        if taken:
            log.warning("repair: took %d partial(s) of lost rank %d forwarded by the "
                        "survivors (now holding its rounds up to %d)", taken, origin,
                        int(node.log.contiguous[origin]))
        return taken

    async def _pull_from(self, client: ControlClient, holder: int, origin: int,
                         before_round: int | None, patience_s: float,
                         while_lost: bool) -> int:
        """Pull from `holder` until it answers; after a loss (`while_lost`), go on until
        its record of `origin` (carried by its answer) equals this rank's: it withheld
        rounds it holds (pull again), or lacks some this rank holds (it pulls them from
        here; ask again to see it has). `patience_s` without any change in either record
        ends the wait: unequal records then are a disagreement (`disagreements`)."""
        self._pulling.add((origin, holder))
        try:
            return await self._pull_loop(client, holder, origin, before_round, patience_s,
                                         while_lost)
        finally:
            self._pulling.discard((origin, holder))

    async def _pull_loop(self, client: ControlClient, holder: int, origin: int,
                         before_round: int | None, patience_s: float,
                         while_lost: bool) -> int:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + patience_s
        taken = 0
        seen: tuple[Record, Record] | None = None
        while True:
            node = self.node()
            if node is None or holder in node.suspended:
                return taken
            if while_lost and origin not in node.suspended:
                return taken  # it speaks again: it delivers its rounds itself
            contiguous, pending = node.log.export()[origin]
            payload = {"rank": self.rank, "origin": origin, "contiguous": contiguous,
                       "pending": [[r, p] for r, parts in pending.items() for p in parts],
                       "before_round": before_round}
            answer = await client.call(holder, ControlKind.RELAY, payload, binary=True,
                                        timeout_s=max(1.0, patience_s))
            theirs: Record | None = None
            if answer.ok:
                taken += self._take(holder, origin, answer.body, before_round)
                theirs = unpack_record(answer.body)
                if not while_lost or theirs is None:
                    return taken
                mine = record_of(node, origin)
                if mine == theirs:
                    self.agreed[(origin, holder)] = record_digest(mine)
                    self._unequal.pop((origin, holder), None)
                    return taken
                if (mine, theirs) != seen:  # progress on either side: wait on
                    seen = (mine, theirs)
                    deadline = loop.time() + patience_s
            elif answer.authentic and answer.status in (400, 401, 404, 409):
                log.warning("repair: rank %d forwarded nothing of lost rank %d (%s %s)",
                            holder, origin, answer.status, answer.error)
                return taken
            if loop.time() > deadline:
                if theirs is None and seen is None:
                    log.warning("repair: rank %d forwarded nothing of lost rank %d (%s %s)",
                                holder, origin, answer.status, answer.error)
                    return taken
                assert seen is not None
                self._unequal[(origin, holder)] = seen  # final if the last pass ends so
                return taken
            await asyncio.sleep(PULL_RETRY_S)

    def _disagree(self, origin: int, holder: int, mine: Record, theirs: Record) -> None:
        """This rank and `holder` hold different sets of lost `origin`'s rounds, for good."""
        lacking = "this rank lacks rounds it holds" if not record_covers(mine, theirs) \
            else "it lacks rounds this rank holds"
        line = (f"survivors disagree on lost rank {origin}'s rounds: rank {self.rank} holds "
                f"through {mine[0]} (+{len(mine[1])} more, digest {record_digest(mine)}), "
                f"rank {holder} through {theirs[0]} (+{len(theirs[1])} more, digest "
                f"{record_digest(theirs)}); {lacking} and the repair could not close the gap: "
                f"replicas are not equal")
        self.disagreements.setdefault(origin, line)
        log.error("repair: %s", line)

    def _take(self, holder: int, origin: int, body: bytes, before_round: int | None) -> int:
        try:
            said_origin, messages = unpack_messages(body)
        except ValueError as error:
            log.warning("repair: rank %d sent an unreadable relay answer: %s", holder, error)
            return 0
        if said_origin != origin:
            return 0
        keys = self.verifier.keys
        assert keys.wire_hash is not None
        taken = 0
        for origin_nonce, endorsements, data in messages:
            try:
                partial = decoded(decode(data, run_id=keys.run_id, config_hash=keys.wire_hash,
                                         codec=self.codec))
            except (WireError, ValueError) as error:
                self.refused += 1
                log.warning("repair: refused a message rank %d forwarded: %s", holder, error)
                continue
            if partial.sender != origin or partial.folded \
                    or not self._instance_ok(origin, origin_nonce, partial.round, before_round) \
                    or not self.verifier.endorsed(origin, origin_nonce,
                                                  bytes(data[:HEADER_SIZE]), endorsements):
                self.refused += 1
                log.warning("repair: refused round %d of rank %d forwarded by rank %d: not "
                            "endorsed by rank %d for this rank", partial.round, partial.sender,
                            holder, origin)
                continue
            values = None if partial.values is None else np.array(partial.values, copy=True)
            kept = _with_values(partial, values)
            try:
                if self.deliver(kept):
                    taken += 1  # and kept, for a survivor that asks this rank later
                    self.store.keep(HeldPartial(kept, endorsements, origin_nonce))
                    if values is not None:
                        self._forwarded[kept.key] = values
            except SchemeError as error:
                self.refused += 1
                log.warning("repair: refused a message rank %d forwarded: %s", holder, error)
        self.received += taken
        return taken

    def _instance_ok(self, origin: int, nonce: bytes, round_: int,
                     before_round: int | None) -> bool:
        """A forwarded message of `origin`'s instance `nonce` may be taken: the current
        instance's, or an earlier one's for a round before the current one restarted."""
        if len(nonce) != NONCE_BYTES:
            return False
        if before_round is not None and round_ >= before_round:
            return False
        sessions = self.verifier.sessions
        current = sessions.peer_nonce.get(origin)
        if current == nonce:
            return True
        if not sessions.is_retired(origin, nonce):
            return False
        restart = self.restarted_at.get(origin)
        if restart is None or restart[0] != current:
            return True  # the current instance has sent no round yet (it is rejoining)
        return round_ < restart[1]

    def _lost_here(self, origin: int, before_round: int | None) -> bool:
        """Forward `origin`'s partials only when this rank has lost it too (suspended or
        rejoining), or for rounds before a restart of it taken here. A peer that only
        the asker cannot hear (a cut between two ranks) still sends its own rounds, and
        after a heal the rounds folded for the asker (akorun.transport.sender) must not meet
        forwarded copies of the same rounds."""
        if self.lost_here(origin):
            return True
        restart = self.restarted_at.get(origin)
        return before_round is not None and restart is not None and before_round <= restart[1]

    def fold_in(self, partial: Partial) -> Partial:
        """A folded message of rounds some of which this rank took forwarded meanwhile:
        the same message less those rounds' forwarded values (each taken out once), so
        that the node, which records only the rounds it lacks, counts each round once."""
        node = self.node()
        keys = [key for key in self._forwarded if key[0] == partial.sender
                and partial.rounds_from <= key[1] <= partial.round]
        if node is None or not keys or partial.values is None or not partial.length:
            return partial
        values = np.array(partial.values, np.float32, copy=True)
        for key in keys:
            held = self._forwarded.pop(key)
            round_, part = key[1], key[2]
            start, _stop = partition_slice(node.length, node.p_of[partial.sender], part)
            values[start - partial.offset:start - partial.offset + held.size] -= held
            self.reconciled += 1
            log.warning("repair: round %d of rank %d came back folded with others after a "
                        "survivor had forwarded it: taken once", round_, partial.sender)
        return replace(partial, values=values)

    def duplicate(self, partial: Partial) -> None:
        """`partial` came from its sender itself and was refused as a duplicate: if the
        copy held is one a survivor forwarded, add the difference (once) to the inbox.

        A sender that had suspended this rank folds the rounds its full queue dropped and
        sends them again as one summed message per partition followed by zero-valued
        ones (akorun.transport.sender.OwedGap); if some of those rounds reached this rank forwarded
        meanwhile, the duplicates carry the sum differently split. Taking, for each
        forwarded round, (what its sender now sent - the forwarded values) keeps the
        total exact: the incoming messages sum to what was folded. A plain re-send of
        the same message differs by zero."""
        if partial.folded:  # its forwarded rounds were taken out before (`fold_in`); a
            return  # folded message held whole is a plain re-send
        held = self._forwarded.pop(partial.key, None)
        node = self.node()
        if held is None or node is None or node.inbox is None or partial.values is None \
                or held.shape != partial.values.shape:
            return
        difference = np.asarray(partial.values, np.float32) - held
        if np.any(difference):
            node.inbox[partial.offset:partial.offset + partial.length] += difference
            self.reconciled += 1
            log.warning("repair: round %d of rank %d arrived from it after a survivor had "
                        "forwarded it, folded with later rounds: the difference was taken",
                        partial.round, partial.sender)

    def restarted(self, origin: int, first_round: int) -> None:
        """`origin`'s current instance numbers its rounds from `first_round` on."""
        for key in [key for key in self._forwarded if key[0] == origin]:
            del self._forwarded[key]  # the earlier instance will send none of them again
        current = self.verifier.sessions.peer_nonce.get(origin)
        if current is not None:
            self.restarted_at[origin] = (current, first_round)

    # ---------------------------------------------------------------- serve

    async def on_relay(self, sender: int, payload: dict[str, Any]) -> bytes:
        """Answer a survivor's pull: the messages of the lost peer it lacks, as sent."""
        if self.node() is None:
            raise ControlError(409, "relay: this rank keeps no partials (not an ako worker)")
        try:
            origin = int(payload["origin"])
            contiguous = int(payload["contiguous"])
            pending = {(int(r), int(p)) for r, p in payload.get("pending", [])}
            before = payload.get("before_round")
            before_round = None if before is None else int(before)
        except (KeyError, TypeError, ValueError):
            raise ControlError(400, "relay: expected {rank, origin, contiguous, pending, "
                                    "before_round}") from None
        if origin in (sender, self.rank) or origin not in self.peers:
            raise ControlError(400, f"relay: origin {origin} is not a third rank")
        if not self._lost_here(origin, before_round):
            raise ControlError(503, f"rank {origin} is not lost here")
        node = self.node()
        if before_round is None and node is not None and origin in node.suspended:
            asker: Record = (contiguous, tuple(sorted(pending)))
            if not record_covers(record_of(node, origin), asker):
                self._pull_more(origin, sender)  # the asker holds rounds this rank lacks
        withhold = self.before_answer is not None and not await self.before_answer(sender)
        items = [] if withhold else [
            item for item in self.store.missing_for(origin, contiguous, pending)
            if before_round is None or item.partial.round < before_round]
        oldest = self.store.oldest_round(origin)
        if oldest is not None and contiguous + 1 < oldest:
            log.warning("repair: rank %d lacks rank %d's rounds from %d, this rank keeps "
                        "them from %d only (the relay window): those cannot be repaired",
                        sender, origin, contiguous + 1, oldest)
        encoded = [(item, self.signer.encode(item.partial)) for item in items]
        self.served += len(encoded)
        if encoded:
            log.warning("repair: forwarding %d partial(s) of rank %d to rank %d (rounds %s)",
                        len(encoded), origin, sender,
                        [item.partial.round for item, _ in encoded])
        record = record_of(node, origin) if node is not None else None
        return pack_messages(origin, encoded, record)


def _values_bytes(item: HeldPartial) -> int:
    values = item.partial.values
    return 0 if values is None else int(values.nbytes)


def _with_values(partial: Partial, values: np.ndarray | None) -> Partial:
    return replace(partial, values=values)
