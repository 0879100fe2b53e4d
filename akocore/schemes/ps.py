"""Parameter server, sync and async: workers push gradient shards, servers answer with parameters.

`PSLayout` places the ranks (workers first, then one server per shard);
`PSWorker` and `PSServer` are the two node roles.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from akocore import ssp
from akocore.messages import Kind, Partial, Receipt, Send
from akocore.partition import check_p, partition_slice
from akocore.schemes.base import Replica, SchemeError, SchemeNode, reduce_scale

NODE_MODES = ("sync", "async")


@dataclass(frozen=True)
class PSLayout:
    """Ranks 0..workers-1 are workers, the next `servers` ranks hold shards."""

    workers: int
    servers: int
    length: int

    def __post_init__(self) -> None:
        if self.workers < 1 or self.servers < 1:
            raise ValueError("ps needs at least one worker and one server")
        check_p(self.length, self.servers)

    def server_rank(self, shard: int) -> int:
        return self.workers + shard

    def shard_of(self, rank: int) -> int:
        return rank - self.workers

    def shard_slice(self, shard: int) -> tuple[int, int]:
        return partition_slice(self.length, self.servers, shard)

    @property
    def server_ranks(self) -> tuple[int, ...]:
        return tuple(range(self.workers, self.workers + self.servers))


class PSWorker(SchemeNode):
    """A parameter-server worker: push gradient shards, receive parameter shards.

    sync: push every round, then wait for every server's parameters of that
    round before starting the next. async (DOWNPOUR-style): accumulate and push
    every `push_every` rounds, fetch every `fetch_every` rounds; the gate lets
    the worker run up to `staleness` rounds past its oldest unanswered fetch.
    """

    def __init__(self, rank: int, layout: PSLayout, *, replica: Replica, mode: str = "sync",
                 staleness: float = 0.0, push_every: int = 1, fetch_every: int = 1) -> None:
        super().__init__(rank, layout.length, replica)
        if mode not in NODE_MODES:
            raise ValueError(f"ps mode: got {mode!r}, expected one of {', '.join(NODE_MODES)}")
        if push_every < 1 or fetch_every < 1:
            raise ValueError("push_every and fetch_every must be >= 1")
        self.layout = layout
        self.mode = mode
        self.staleness = 0.0 if mode == "sync" else staleness
        self.push_every = 1 if mode == "sync" else push_every
        self.fetch_every = 1 if mode == "sync" else fetch_every
        self.unpushed = np.zeros(self.length, np.float32) if replica.has_data else None
        # fetch round -> servers still to answer it
        self.outstanding: dict[int, set[int]] = {}
        self.latest_params_round = {s: -1 for s in layout.server_ranks}

    def _fetches(self, round_: int) -> bool:
        return (round_ + 1) % self.fetch_every == 0

    def _pushes(self, round_: int) -> bool:
        return (round_ + 1) % self.push_every == 0

    def _sends(self, round_: int, push: bool, fetch: bool, final: bool) -> list[Send]:
        sends = []
        for shard, server in enumerate(self.layout.server_ranks):
            start, stop = self.layout.shard_slice(shard)
            if push:
                msg = self._partial(Kind.PUSH, round_, shard, self.layout.servers, start, stop,
                                    self.unpushed, final)
            else:
                msg = Partial(Kind.PULL, self.rank, round_, shard, self.layout.servers, start, 0,
                              None if self.unpushed is None else np.zeros(0, np.float32), final)
            sends.append(Send((server,), msg))
        if push and self.unpushed is not None:
            self.unpushed[:] = 0.0
        if fetch or final:
            self.outstanding[round_] = set(self.layout.server_ranks)
        return sends

    def local_step(self, round_: int, grad: np.ndarray | None) -> list[Send]:
        self._check_round(round_)
        self._check_grad(grad)
        if self.unpushed is not None and grad is not None:
            self.unpushed += grad
        push, fetch = self._pushes(round_), self._fetches(round_)
        self.next_round = round_ + 1
        if not push and not fetch:
            return []
        return self._sends(round_, push, fetch, final=False)

    def finish(self, rounds_done: int) -> list[Send]:
        if rounds_done != self.next_round:
            raise SchemeError(f"node {self.rank}: finish after {rounds_done} rounds")
        self.finished = True
        # async: the final is a full-size push (zeros if nothing is owed), so it
        # cannot overtake the earlier pushes and fetch the parameters before them
        if self.mode == "async":
            return self._sends(rounds_done, push=True, fetch=True, final=True)
        return self._sends(rounds_done, push=False, fetch=True, final=True)

    def _open_fetches(self) -> list[int]:
        return sorted(r for r, servers in self.outstanding.items()
                      if servers - self.suspended)

    def may_start(self, round_: int) -> bool:
        """Round t may start while every fetch issued at rounds <= t-1-s is answered."""
        if round_ == 0 or math.isinf(self.staleness):
            return True
        open_rounds = self._open_fetches()
        return not open_rounds or open_rounds[0] > (round_ - 1) - self.staleness

    def waiting_on(self, round_: int) -> list[int]:
        if self.may_start(round_):
            return []
        return sorted(set().union(*self.outstanding.values()) - self.suspended)

    def lag(self, round_: int) -> int:
        open_rounds = self._open_fetches()
        return max(0, round_ - 1 - open_rounds[0] + 1) if open_rounds and round_ > 0 else 0

    def _take_shard_answer(self, msg: Partial, kind: Kind, who: str) -> bool:
        """Check a server's answer for one shard; True when it is the first for its round."""
        if msg.kind != kind or msg.sender not in self.latest_params_round:
            raise SchemeError(f"{who} {self.rank}: unexpected {msg.kind.name} "
                              f"from node {msg.sender}")
        shard = self.layout.shard_of(msg.sender)
        if (msg.offset, msg.offset + msg.length) != self.layout.shard_slice(shard):
            raise SchemeError(f"shard {shard} does not span [{msg.offset}, "
                              f"{msg.offset + msg.length})")
        self._check_values(msg)
        waiting = self.outstanding.get(msg.round)
        if waiting is None or msg.sender not in waiting:
            return False
        waiting.discard(msg.sender)
        if not waiting:
            del self.outstanding[msg.round]
        return True

    def receive(self, msg: Partial) -> Receipt:
        if not self._take_shard_answer(msg, Kind.PARAMS, "ps worker"):
            return Receipt(False)
        if msg.round > self.latest_params_round[msg.sender]:
            self.latest_params_round[msg.sender] = msg.round
            if self.replica.params is not None and msg.values is not None:
                self.replica.params[msg.offset:msg.offset + msg.length] = msg.values
        return Receipt(True)

    def drained(self) -> bool:
        return not self._open_fetches()


class PSServer(SchemeNode):
    """A parameter-server shard: apply pushed gradients, answer with parameters.

    sync: sum every live worker's push of round t, apply once (scaled), then
    send the shard to every worker. async: apply each push on arrival and
    answer the pusher (when that round fetches) or a pull; a worker's final
    marker may overtake its last pushes on the wire, so it is answered only
    once every message that worker sent before it has arrived (the worker
    answered last then ends on the servers' parameters).
    """

    is_worker = False

    def __init__(self, rank: int, layout: PSLayout, *, replica: Replica, mode: str = "sync",
                 reduce: str = "mean", fetch_every: int = 1, push_every: int = 1) -> None:
        shard = layout.shard_of(rank)
        start, stop = layout.shard_slice(shard)
        if replica.params is not None and replica.params.shape != (stop - start,):
            raise ValueError(f"server {rank} holds shard of length {stop - start}")
        super().__init__(rank, layout.length, replica)
        if mode not in NODE_MODES:
            raise ValueError(f"ps mode: got {mode!r}, expected one of {', '.join(NODE_MODES)}")
        self.layout = layout
        self.shard = shard
        self.start, self.stop = start, stop
        self.mode = mode
        self.fetch_every = 1 if mode == "sync" else fetch_every
        self.worker_push_every = 1 if mode == "sync" else push_every
        self.messages_from = dict.fromkeys(range(layout.workers), 0)  # async, finals apart
        self.held_finals: dict[int, int] = {}  # async: worker -> final round, unanswered
        self.scale = np.float32(reduce_scale(reduce, layout.workers))
        workers = range(layout.workers)
        self.log = ssp.DeliveryLog(workers, lambda sender, round_: 1)
        self.final_round: dict[int, int] = {}
        self.sums: dict[int, np.ndarray | None] = {}
        self.applied_round = -1  # sync: last round applied
        self.unanswered_finals: set[int] = set()

    def params_offset(self) -> int:
        return self.start

    def _params_to(self, dests: tuple[int, ...], round_: int) -> Send:
        values = None if self.replica.params is None else self.replica.params.copy()
        msg = Partial(Kind.PARAMS, self.rank, round_, self.shard, self.layout.servers,
                      self.start, self.stop - self.start, values)
        return Send(dests, msg)

    def _live_in_round(self, round_: int) -> list[int]:
        return [w for w in range(self.layout.workers)
                if w not in self.suspended and self.final_round.get(w, math.inf) > round_]

    def receive(self, msg: Partial) -> Receipt:
        if msg.kind not in (Kind.PUSH, Kind.PULL) or not self.log.knows(msg.sender):
            raise SchemeError(f"ps server {self.rank}: unexpected {msg.kind.name} "
                              f"from node {msg.sender}")
        if msg.kind == Kind.PUSH and (msg.offset, msg.offset + msg.length) != (
                self.start, self.stop):
            raise SchemeError(f"push to shard {self.shard} must span [{self.start}, {self.stop})")
        self._check_values(msg)
        if not self.log.record(msg.sender, msg.round, 0):
            return Receipt(False)
        if msg.final:
            self.final_round[msg.sender] = msg.round
        if self.mode == "async":
            return Receipt(True, self._receive_async(msg))
        return Receipt(True, self._receive_sync(msg))

    def messages_before(self, round_: int) -> int:
        """How many messages an async worker sends in rounds 0..round_-1: one in
        each round that pushes or fetches (PSWorker.local_step)."""
        push, fetch = self.worker_push_every, self.fetch_every
        return round_ // push + round_ // fetch - round_ // math.lcm(push, fetch)

    def _receive_async(self, msg: Partial) -> tuple[Send, ...]:
        if msg.kind == Kind.PUSH and self.replica.params is not None:
            assert msg.values is not None
            self.replica.apply(msg.values * self.scale)
        effects = []
        if msg.final:
            self.held_finals[msg.sender] = msg.round
        else:
            self.messages_from[msg.sender] += 1
            if msg.kind == Kind.PULL or (msg.round + 1) % self.fetch_every == 0:
                effects.append(self._params_to((msg.sender,), msg.round))
        for worker, final in sorted(self.held_finals.items()):
            # every message the worker sent before its final arrived (or the log says so)
            if (self.messages_from[worker] >= self.messages_before(final)
                    or self.log.contiguous[worker] >= final - 1):
                del self.held_finals[worker]
                effects.append(self._params_to((worker,), final))
        return tuple(effects)

    def _receive_sync(self, msg: Partial) -> tuple[Send, ...]:
        if msg.kind == Kind.PUSH:
            if msg.round <= self.applied_round:
                raise SchemeError(f"push for round {msg.round} after it was applied")
            total = self.sums.get(msg.round)
            if msg.values is not None:
                self.sums[msg.round] = msg.values.copy() if total is None else total + msg.values
            else:
                self.sums.setdefault(msg.round, None)
        if msg.final:
            self.unanswered_finals.add(msg.sender)
        effects = self._complete_rounds()
        # answer a final marker once every round before it is applied, so the
        # worker's last parameters are the newest it could see
        ready = [w for w in self.unanswered_finals
                 if self.final_round[w] - 1 <= self.applied_round]
        for w in sorted(ready):
            self.unanswered_finals.discard(w)
            effects.append(self._params_to((w,), self.final_round[w]))
        return tuple(effects)

    def _complete_rounds(self) -> list[Send]:
        effects: list[Send] = []
        while True:
            round_ = self.applied_round + 1
            live = self._live_in_round(round_)
            if not live or any(self.log.contiguous[w] < round_ for w in live):
                return effects
            total = self.sums.pop(round_, None)
            if total is not None and self.replica.params is not None:
                self.replica.apply(total * self.scale)
            self.applied_round = round_
            effects.append(self._params_to(tuple(live), round_))

    def drained(self) -> bool:
        return all(w in self.final_round or w in self.suspended
                   for w in range(self.layout.workers))
