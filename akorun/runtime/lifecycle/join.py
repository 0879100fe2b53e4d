"""The join handshake: hello every rank, refuse a peer of another run, agree on p.

Each rank sends its `Identity` (run id, config hash, initial-parameter hash) and, for p
auto, its measured compute time in a hello to every peer until each answered or the join
timeout passed; a peer that differs is refused (409) on both sides. While it still waits for
some rank, it says hello again every third of the peer timeout to the ranks that answered:
one that stops answering for longer than the peer timeout died during the join, and the join
ends at once (RunError, exit 1, one line) instead of at the join timeout; a rank that never
answered is waited for until the join timeout (it may just be slow to start). A rank whose
join ends without a run (a signal: `Interrupted`; or a `RunError`) says ``leave`` to every
peer that is up (it answered our hello or said hello to us), so that none waits for it: a
peer still joining ends its join at once (`Interrupted` if it is stopping too, else
`RunError`), and a peer already training takes it out of its gate for good
(runtime.liveness.peer_liveness `left`) and finishes without waiting for it
(runtime.lifecycle.finishing). This is how a SIGTERM to `akorun launch` that lands while one
rank still starts ends every rank within launch's kill grace. A rank that holds every answer
is *ready*, but starts only once every peer says it is ready too (in its answer or its own
hello, which wakes a rank waiting for it at once, so the ranks start within a message of
each other): a rank that dies while the others still greet is then noticed by a ready rank
(silent past the peer timeout), which ends its join and says ``leave`` (``failed``), so
nobody trains a run one rank could not join; a rank whose join failed refuses hellos for a
moment longer (`linger_failed`) so that a rank still starting ends at once, and a peer that
started anyway (the hello it took as the last "ready" crossed the failure) stops with exit 1
on that ``leave``. Every rank then plans with the MAX of all measured compute times, so all
choose the same p, and builds its node. `greet` and `until`
(akorun.runtime.lifecycle.greeting) are the retrying calls the rejoin handshake uses too.

Bad configuration across ranks is found here, by name. Each rank's hello and its answer
carry its `compared_settings`: every setting of the run (the keys of the config hash, as
``section.key``) and the entries of `COMPARED` (the initial-parameter hash; one more entry
is all a new shared fact needs). The first setting that differs ends the join on BOTH
ranks with exit status 2 and one line naming the setting and both values
(`SettingMismatch`): the rank that receives the hello answers it normally (so the sender
sees the difference too) and remembers it, and a rank that found one keeps answering
hellos for up to `MISMATCH_LINGER_S` so that a peer started a moment later learns it too.

A refusal ends the join only if the peer itself gave it: its answer must carry the tag
bound to our request (akorun.transport.answers, as a partial's answer on the data path).
An untagged or badly tagged 400/401/409 (or a 200 without a tag) is what anyone on the
path can forge, so it is treated like a peer that does not answer yet: logged once per
peer and status ("not authenticated, retrying") and the hello goes again, backing off,
until the join timeout (akorun.runtime.lifecycle.greeting `Unverified`). A forger can thus delay a
join (as dropping packets can), never end it early. A peer whose keys differ from ours
(another cluster secret, run id or key file) cannot tag anything for us either: its 401 is
indistinguishable from a forged one, and nothing it could send would prove otherwise. So a
peer that gave only untagged 401s ends the join AT the join timeout, not before, with exit
2 and one line naming the likely cause (its secret, run id or key file differs); a tagged
refusal (the peer's join failed: 409; its hashes differ: 409) still ends the join at once.

The per-start nonces that key every later message are exchanged here, below the payload:
the first call to a peer is a discovery hello answered with the peer's nonce
(akorun.transport.client.ControlClient), and every hello after it is sealed for both
processes' nonces, which is how each peer learns this process's (akorun.keys). A hello
recorded in another run, or sent by an earlier instance of a rank, is refused before
`on_hello` sees it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from akocore.settings.schema import RunConfig
from akocore.settings.toml_io import config_to_dict
from akorun.errors import Interrupted, RunError, UsageError
from akorun.runtime.fault_hooks import FaultHooks, NoFaults
from akorun.runtime.lifecycle.greeting import GREET_TIMEOUT_S, RETRY_S, Unverified, greet, until
from akorun.runtime.lifecycle.phase import Phase
from akorun.runtime.liveness.peer_liveness import Liveness
from akorun.runtime.liveness.waiting import Waiter
from akorun.runtime.rank_context import RankContext
from akorun.transport.cancelling import cancel_and_wait
from akorun.transport.client import ControlClient
from akorun.transport.control import ControlError, ControlKind

log = logging.getLogger("akorun")
_T = TypeVar("_T")

LEAVE_TIMEOUT_S = 2.0
LEAVE_REASON_CHARS = 500  # the most of a leave's reason a peer logs
FAILED_LINGER_S = 30.0  # a rank whose join failed refuses hellos at most this long
MISMATCH_LINGER_S = 3.0  # a rank that found a mismatch answers hellos this long before exit
_WHAT = {"run_id": "run id", "config_hash": "config hash",
         "workload": "workload (name, parameter shapes, data; fingerprint)",
         "params_sha256": "initial-parameter hash"}
_SHOWN = {"workload": 96}  # characters of a value in a refusal (hashes: 16)


@dataclass(frozen=True)
class JoinFacts:
    """What a rank knows before the join that every rank of the run must share."""

    cfg: RunConfig
    params_sha256: str
    workload: str = ""  # "name fingerprint" (akocore.workload_fingerprint)


WORKLOAD_SETTING = "workload (name, parameter shapes, data; fingerprint)"
# Settings compared at the join besides the run's config keys: name -> how to read it.
# A new shared fact (e.g. a fingerprint of the user's workload) is one more entry here
# (and, if it is not in the config, one more field of JoinFacts).
COMPARED: dict[str, Callable[[JoinFacts], str]] = {
    "initial parameters (sha256)": lambda facts: facts.params_sha256,
    WORKLOAD_SETTING: lambda facts: facts.workload,
}
_NOT_COMPARED = {("cluster", "hosts"), ("network", "model")}  # as the config hash


def compared_settings(facts: JoinFacts) -> dict[str, str]:
    """Every setting the ranks of one run must agree on, by name, as text."""
    settings = {f"{section}.{key}": json.dumps(value, sort_keys=True)
                for section, keys in config_to_dict(facts.cfg).items()
                for key, value in keys.items() if (section, key) not in _NOT_COMPARED}
    settings.update({name: str(read(facts)) for name, read in COMPARED.items()})
    return settings


class SettingMismatch(ControlError):
    """A peer's setting differs from ours: the run cannot start (exit 2 on every rank)."""

    def __init__(self, line: str) -> None:
        super().__init__(409, line)


def first_mismatch(ours: dict[str, str], theirs: object, me: int, peer: int) -> str | None:
    """The line naming the first setting that differs (None when all agree)."""
    if not isinstance(theirs, dict):
        return None  # a peer that compares no settings: the hashes decide
    for name in sorted(set(ours) | set(theirs)):
        mine, its = ours.get(name, "(not set)"), str(theirs.get(name, "(not set)"))
        if mine != its:
            shown = _SHOWN["workload"] if name == WORKLOAD_SETTING else 80
            advice = ("give every rank the same workload file, arguments and data"
                      if name == WORKLOAD_SETTING else
                      "start every rank from the same cluster file with the same flags")
            return (f"setting {name} differs between ranks: rank {me} has {mine[:shown]}, "
                    f"rank {peer} has {its[:shown]}; {advice}")
    return None


@dataclass(frozen=True)
class Identity:
    """What every rank of one run shares, as it says it in a handshake."""

    rank: int
    run_id: str
    config_hash: str
    params_sha256: str
    workload: str = ""  # "name fingerprint" (akocore.workload_fingerprint)
    settings: dict[str, str] = field(default_factory=dict)  # compared_settings, by name

    def payload(self) -> dict[str, Any]:
        return {"rank": self.rank, "run_id": self.run_id, "config_hash": self.config_hash,
                "params_sha256": self.params_sha256, "workload": self.workload,
                "settings": self.settings}

    def check(self, sender: int, payload: dict[str, Any]) -> None:
        """ControlError 409 (and a log line) unless `payload` is of this same run;
        `SettingMismatch` when a named setting differs."""
        if self.settings:
            line = first_mismatch(self.settings, payload.get("settings"), self.rank, sender)
            if line is not None:
                log.error(line)
                raise SettingMismatch(line)
        for key, ours in (("run_id", self.run_id), ("config_hash", self.config_hash),
                          ("workload", self.workload), ("params_sha256", self.params_sha256)):
            theirs = payload.get(key)
            if theirs != ours:
                shown = _SHOWN.get(key, 16)
                advice = ("give every rank the same workload file, arguments and data"
                          if key == "workload" else
                          "start every rank from the same cluster file and the same flags")
                message = (f"refusing rank {sender}: its {_WHAT[key]} {str(theirs)[:shown]} "
                           f"differs from ours {ours[:shown]}; {advice}")
                log.error(message)
                raise ControlError(409, message)


class Join:
    """Both sides of the hello handshake."""

    def __init__(self, context: RankContext, *, identity: Identity, waiter: Waiter,
                 liveness: Liveness, build_node: Callable[[float | None], None],
                 compute_measured_s: float | None = None,
                 faults: FaultHooks | None = None) -> None:
        self.context = context
        self.identity = identity
        self.peers = list(context.peers)
        self.hosts = list(context.hosts)
        self.compute_measured_s = compute_measured_s
        self.timeout_s = context.join_timeout_s
        self.phase = context.phase
        self.waiter = waiter
        self.liveness = liveness
        self.build_node = build_node  # plan with this compute time and build the node
        self.peer_timeout_s = context.peer_timeout_s  # an answered peer silent this long: dead
        self.faults: FaultHooks = faults or NoFaults()  # the test hooks greeted, in_join
        self.greeted: dict[int, int] = {}  # peer -> hellos of it answered here
        self.answered: set[int] = set()  # peers that answered our hello
        self.peer_compute_s: dict[int, float] = {}
        self.error: str | None = None  # a peer of another run said hello: no start
        self.mismatch: str | None = None  # a peer's setting differs: exit 2 (SettingMismatch)
        self.ready = False  # every peer answered our hello
        self.failed: str | None = None  # our join failed: hellos are refused with this
        self.told_failed: set[int] = set()
        self.ready_peers: set[int] = set()  # peers that said they hold every answer too
        self._ready_events: dict[int, asyncio.Event] = {}  # set when the peer says ready
        self.unverified = Unverified("hello", self.timeout_s)  # untagged refusals (retried)

    def _node_built(self) -> bool:
        return self.context.role.node is not None

    async def join(self, control: ControlClient) -> None:
        """Hello every rank (refusing mismatches), agree on p, build the node.
        UsageError (exit 2) when a peer's settings differ, after answering hellos a
        moment longer so that every peer learns it too."""
        try:
            await self._join(control)
        except UsageError:
            if self.mismatch is not None:  # not for keys that differ: none could read us
                await self._linger()
            raise
        except RunError as error:
            self.failed = str(error)  # later hellos are refused with it (`linger_failed`)
            raise

    async def _linger(self) -> None:
        """Up to MISMATCH_LINGER_S, until every peer said hello to us (and so heard our
        settings in the answer)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(MISMATCH_LINGER_S, self.timeout_s)
        while loop.time() < deadline and not set(self.peers) <= set(self.greeted):
            await asyncio.sleep(RETRY_S)

    async def _join(self, control: ControlClient) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        payload = {**self.identity.payload(), "compute_s": self.compute_measured_s}

        answered_s: dict[int, float] = {}  # peer -> when it last answered a hello
        await self.faults.in_join()

        async def hello(peer: int) -> dict[str, Any] | None:
            async def once() -> dict[str, Any] | None:
                if self.mismatch is not None:
                    raise UsageError(self.mismatch)
                if self.error is not None:
                    raise RunError(self.error)
                if self.waiter.stop_reason is not None:
                    raise Interrupted(f"{self.waiter.stop_reason} (before every rank said "
                                      f"hello)")
                self._unless_one_left()
                return await greet(control, peer, ControlKind.HELLO, payload, "hello",
                                   self.unverified)
            answer = await until(deadline, once)
            if answer is not None:
                self._check_settings(peer, answer)
                answered_s[peer] = loop.time()
                self.answered.add(peer)
            return answer

        answers = await self._unless_one_dies(
            asyncio.gather(*(hello(j) for j in self.peers)),
            self._watch(control, payload, answered_s))
        missing = [j for j, a in zip(self.peers, answers, strict=True) if a is None]
        keys_differ = [j for j in missing if self.unverified.keys_differ(j)]
        if keys_differ:
            where = ", ".join(f"{j} at {self.hosts[j]}" for j in keys_differ)
            raise UsageError(f"rank(s) {where} cannot authenticate our hello: until the join "
                             f"timeout {self.timeout_s:g} s it answered only with 401s without "
                             f"a tag we can check, so its secret, run id or key file likely "
                             f"differs from ours; start every rank from the same cluster file "
                             f"(and key files of one `akorun init`)")
        if missing:
            where = ", ".join(f"{j} at {self.hosts[j]}" for j in missing)
            forged = sorted({status for j in missing
                             for status in self.unverified.statuses.get(j, set())})
            seen = (f" (only refusals {forged} without a tag bound to our request came back: "
                    f"not from the peer itself)" if forged else "")
            raise RunError(self.unverified.tls_failures(missing) or  # the certificate named
                           f"no hello answer within {self.timeout_s:g} s from rank(s) "
                           f"{where}{seen}: are they started with the same cluster file?")
        for peer, answer in zip(self.peers, answers, strict=True):
            assert answer is not None
            try:
                self.identity.check(peer, answer)
            except ControlError as error:
                raise RunError(error.reason) from None
            if isinstance(answer.get("compute_s"), int | float):
                self.peer_compute_s[peer] = float(answer["compute_s"])
        self._unless_one_left()
        # every answer is in: we are ready; start only once every peer is ready too, so a
        # rank that dies now ends the join for everyone (see `_until_all_ready`)
        self.ready = True
        payload["ready"] = True
        await self._unless_one_dies(self._until_all_ready(control, payload, deadline),
                                    self._watch(control, payload, answered_s))
        if self.waiter.stop_reason is not None:
            raise Interrupted(f"{self.waiter.stop_reason} (before every rank had joined)")
        self._unless_one_left()
        compute_s = None
        if self.compute_measured_s is not None:
            compute_s = max([self.compute_measured_s, *self.peer_compute_s.values()])
        self.build_node(compute_s)
        self.liveness.heard_all()
        self.phase.to(Phase.RUNNING)

    def _check_settings(self, peer: int, answer: dict[str, Any]) -> None:
        """UsageError when `peer`'s answer names a setting that differs from ours."""
        try:
            self.identity.check(peer, answer)
        except SettingMismatch as mismatch:
            self.mismatch = self.mismatch or mismatch.reason
            raise UsageError(self.mismatch) from None
        except ControlError:
            return  # a hash differs without a named setting: refused below, as before

    def _unless_one_left(self) -> None:
        """RunError if a rank said it leaves before we joined (the run cannot start)."""
        if self.liveness.left_peers:
            peer, reason = min(self.liveness.left_peers.items())
            raise RunError(f"rank {peer} at {self.hosts[peer]} left during the join ({reason}),"
                           f" before every rank had joined; nothing trained")

    async def leave(self, control: ControlClient, reason: str, *, failed: bool = False,
                    peers: Sequence[int] | None = None) -> None:
        """Tell every peer that is up (it answered our hello or said hello to us) that we
        leave before joining, so that none waits for us; unreachable ones are skipped.
        `failed`: our join failed (a rank died in it): a peer that started already
        stops too (exit 1), so that no rank trains a run another could not join.
        `peers` (after the join: the rank stops the run, e.g. its loss went NaN): tell
        those; each stops too and exits 1 naming `reason`."""
        training = peers is not None
        told_to = sorted(self.answered | set(self.greeted) if peers is None else peers)
        if not told_to:
            return
        payload = {**self.identity.payload(), "reason": reason[:LEAVE_REASON_CHARS],
                   "failed": failed or training, "training": training}
        answers = await asyncio.gather(*(control.call(j, ControlKind.LEAVE, payload,
                                                      timeout_s=LEAVE_TIMEOUT_S)
                                         for j in told_to))
        told = [j for j, answer in zip(told_to, answers, strict=True) if answer.ok]
        log.warning("%s: told rank(s) %s%s", "stopping the run" if training
                    else "leaving before the join ended", told,
                    f" (not reached: {sorted(set(told_to) - set(told))})"
                    if len(told) < len(told_to) else "")

    async def on_leave(self, sender: int, payload: dict[str, Any]) -> dict[str, Any]:
        """`sender` leaves before it joined: the run goes on without it, or (if we are
        still joining) our join ends (see the module docstring); or it stops the run
        after the join (``training``): we stop too, exit 1."""
        self.identity.check(sender, payload)
        reason = str(payload.get("reason") or "no reason given")[:LEAVE_REASON_CHARS]
        if self._node_built() and payload.get("failed") is True:
            self.liveness.left(sender, reason)
            if payload.get("training") is True and self.waiter.cause is None:
                self.waiter.cause = f"{reason} (stopped by that rank)"
            self.waiter.lose([sender], why=f"rank {sender} stopped the run ({reason}); "
                             f"stopping this rank, exit 1" if payload.get("training") is True
                             else f"rank {sender} could not complete the join ({reason}): "
                             f"this run is not the one every rank joined; stopping this "
                             f"rank, exit 1")
            return {"rank": self.identity.rank}
        if self._node_built():
            log.warning("rank %d left before it joined (%s): going on without it, and the "
                        "finish will not wait for it", sender, reason)
        else:
            log.warning("rank %d left during the join (%s)", sender, reason)
        self.liveness.left(sender, reason)
        self.waiter.wake_up()
        return {"rank": self.identity.rank}

    def _ready_event(self, peer: int) -> asyncio.Event:
        return self._ready_events.setdefault(peer, asyncio.Event())

    async def _until_all_ready(self, control: ControlClient, payload: dict[str, Any],
                               deadline_s: float) -> None:
        """Say hello (ready) until every peer said it holds every rank's answer too (in its
        answer, or in its own hello to us). A peer that never gets there ends our join at
        the join timeout; one that dies meanwhile ends it through `_watch` (and our
        ``leave`` then ends the joins of the others: nobody trains a run a rank left)."""
        loop = asyncio.get_running_loop()

        async def ready(peer: int) -> None:
            # Tell every peer once that we are ready, even one that told us first: it may
            # have asked while we were not ready yet, and without our word it would wait
            # for a retry of its own; if we started and died meanwhile it would take us
            # for a rank that died in the join and end a run the others already train.
            told = False
            while not told or peer not in self.ready_peers:
                if self.waiter.stop_reason is not None:
                    raise Interrupted(f"{self.waiter.stop_reason} (before every rank had "
                                      f"joined)")
                self._unless_one_left()
                if loop.time() > deadline_s:
                    raise RunError(f"rank {peer} at {self.hosts[peer]} did not hear from every "
                                   f"rank within the join timeout {self.timeout_s:g} s (we "
                                   f"did): a rank is missing or died during the join; "
                                   f"nothing trained")
                answer = await control.call(peer, ControlKind.HELLO, payload,
                                            timeout_s=GREET_TIMEOUT_S)
                told = told or answer.ok
                if answer.ok and answer.payload is not None and answer.payload.get("ready"):
                    self.ready_peers.add(peer)
                if told and peer in self.ready_peers:
                    return
                heard = self._ready_event(peer).wait() if told else asyncio.sleep(RETRY_S)
                with contextlib.suppress(TimeoutError):  # its ready hello wakes us at once:
                    await asyncio.wait_for(heard, RETRY_S)  # the ranks start together

        await asyncio.gather(*(ready(j) for j in self.peers))

    @staticmethod
    async def _unless_one_dies(work: Awaitable[_T], watch: Awaitable[None]) -> _T:
        """The result of `work`, unless `watch` raises first (a peer died during the join)."""
        hellos = asyncio.ensure_future(work)
        watching = asyncio.ensure_future(watch)
        try:
            either: list[asyncio.Future[Any]] = [hellos, watching]
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watching.cancel()
        if not hellos.done():
            await cancel_and_wait([hellos], what="the join's hellos")
            watching.result()  # its RunError
        return hellos.result()

    async def _watch(self, control: ControlClient, payload: dict[str, Any],
                     answered_s: dict[int, float]) -> None:
        """While the join waits for some rank, say hello again to the ranks that answered;
        one that then stops answering for longer than the peer timeout died during the
        join: RunError (the others cannot start a run it was part of, so they end now
        rather than at the join timeout)."""
        if not math.isfinite(self.peer_timeout_s):
            await asyncio.Event().wait()  # never ends: the hellos decide
            return
        loop = asyncio.get_running_loop()
        probe_s = max(RETRY_S, self.peer_timeout_s / 3)
        while True:
            await asyncio.sleep(probe_s)
            peers = sorted(answered_s)
            answers = await asyncio.gather(*(control.call(
                j, ControlKind.HELLO, payload, timeout_s=min(GREET_TIMEOUT_S, probe_s))
                for j in peers))
            now = loop.time()
            for peer, answer in zip(peers, answers, strict=True):
                if answer.ok:
                    answered_s[peer] = now
                elif now - answered_s[peer] > self.peer_timeout_s:
                    raise RunError(f"rank {peer} at {self.hosts[peer]} answered our hello, "
                                   f"then nothing for {now - answered_s[peer]:.1f} s (peer "
                                   f"timeout {self.peer_timeout_s:g} s): it died during the "
                                   f"join, before every rank had joined; nothing trained")

    async def linger_failed(self) -> None:
        """After a failed join (and our ``leave``): refuse hellos with the reason for up
        to 2 peer timeouts (at most FAILED_LINGER_S), so that a rank still starting
        ends its join at once instead of at the join timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(FAILED_LINGER_S, 2 * self.peer_timeout_s, self.timeout_s)
        while loop.time() < deadline and not set(self.peers) <= (
                self.told_failed | set(self.liveness.left_peers)):
            await asyncio.sleep(RETRY_S)

    async def on_hello(self, sender: int, payload: dict[str, Any]) -> dict[str, Any]:
        if self.failed is not None and not self._node_built():
            self.told_failed.add(sender)
            raise ControlError(409, f"rank {self.identity.rank} ended its join: "
                                    f"{self.failed[:200]}")
        self.greeted[sender] = self.greeted.get(sender, 0) + 1
        self.faults.greeted(sender, self.greeted[sender])
        try:
            self.identity.check(sender, payload)
        except SettingMismatch as mismatch:
            if self._node_built():
                raise
            # answered as usual, so that the peer finds the same difference in our answer
            self.mismatch = self.mismatch or mismatch.reason
            return {**self.identity.payload(), "compute_s": self.compute_measured_s,
                    "state": self.phase.name}
        except ControlError as error:
            if not self._node_built():  # a peer of another config: this run cannot start
                self.error = error.reason
            raise
        if payload.get("ready") is True:
            self.ready_peers.add(sender)
            self._ready_event(sender).set()
        compute = payload.get("compute_s")
        if isinstance(compute, int | float) and compute > 0:
            self.peer_compute_s[sender] = float(compute)
        if self._node_built() and not self.phase.is_(Phase.REJOINING):
            self.liveness.heard(sender)
        return {**self.identity.payload(), "compute_s": self.compute_measured_s,
                "state": self.phase.name, "ready": self.ready or self._node_built()}
