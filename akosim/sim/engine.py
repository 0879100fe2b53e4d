"""SimPy processes that drive akocore scheme nodes over a simulated network.

One process per worker: wait at the scheme's SSP gate, compute for the
ComputeModel's time (and, for an island of devices, its inside
all-reduce), hand the gradient to the scheme, deliver its Send effects
through the network model it was given (akosim.network.layer.
NetworkModel; a node that declares `in_order_sends` sends through
akosim.network.pairstream). Messages arriving at a node go to the
node's `receive` at their simulated arrival time, and wake the node if it is
waiting (an ako worker whose gate is still closed after a look is woken only
when the last peer it waits for arrived: akosim.sim.multicast's gate watch).
Server nodes (ps) only receive. The schemes are the very ones akorun drives:
the simulator adds time, nothing else. A run stops after its rounds, its
duration, or (a StopRule with `settle`) once its round time has settled: every
round that all workers have ended goes to an akosim.sim.settling.SettleWatch,
which says when.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol

import numpy as np
import simpy

from akocore.codecs.exchange import codec_cpu_s
from akocore.messages import Partial, Send
from akocore.schemes import SchemeNode
from akosim.network.fluid import COALESCE_REL
from akosim.network.layer import NetworkModel
from akosim.network.netmodel import build_network_model
from akosim.network.netspec import NetworkSpec
from akosim.network.netstats import NetworkStats
from akosim.network.pairstream import PairStreams
from akosim.planning.compute import ComputeModel
from akosim.sim.multicast import MulticastDelivery
from akosim.sim.settling import SettleRule, SettleWatch, Settling


class GradientSource(Protocol):
    """Real gradients for training mode (akosim.sim.sim_training); timing-only has none."""

    def begin(self, rank: int, round_: int, params: np.ndarray) -> None: ...

    def result(self, rank: int) -> np.ndarray: ...


@dataclass
class WorkerTimeline:
    """What one worker did, in simulated seconds."""

    rank: int
    round_end_s: list[float] = field(default_factory=list)
    compute_s: float = 0.0
    inside_s: float = 0.0  # its island's inside all-reduce (akosim.network.island_reduce)
    wait_s: float = 0.0
    max_lag_rounds: int = 0
    lag_sum: int = 0
    finish_s: float = 0.0
    drained_s: float = 0.0
    bytes_sent: float = 0.0  # handed to the network during its rounds (flush excluded)

    @property
    def rounds(self) -> int:
        return len(self.round_end_s)


@dataclass(frozen=True)
class TraceEvent:
    """A span for the Chrome trace: what a worker did from start_s to end_s."""

    rank: int
    name: str  # compute | inside | overhead | codec | wait | send
    start_s: float
    end_s: float
    args: tuple[tuple[str, object], ...] = ()


class _InFlight:
    """A multicast on the network: its message and how many copies are still out."""

    __slots__ = ("message", "src", "start_s", "copies", "remaining", "validated")

    def __init__(self, message: Partial, src: int, start_s: float, copies: int) -> None:
        self.message = message
        self.src = src
        self.start_s = start_s
        self.copies = copies
        self.remaining = copies
        self.validated = False


@dataclass(frozen=True)
class StopRule:
    """When a simulation stops: after `rounds`, after `duration_s`, or (`settle`, neither
    of them given) once its round time has settled (akosim.sim.settling)."""

    rounds: int | None = None
    duration_s: float | None = None
    drain: bool = True  # flush what is owed and wait for it (training); timing may skip
    settle: SettleRule | None = None

    def __post_init__(self) -> None:
        if self.settle is not None and (self.rounds is not None
                                        or self.duration_s is not None):
            raise ValueError("a simulation settles or runs fixed rounds or a duration, "
                             "not both")
        if self.rounds is None and self.duration_s is None and self.settle is None:
            raise ValueError("a simulation needs rounds, a duration or a settle rule")
        if self.rounds is not None and self.rounds < 1:
            raise ValueError(f"rounds must be >= 1, got {self.rounds}")
        if self.duration_s is not None and self.duration_s <= 0:
            raise ValueError(f"duration must be > 0 s, got {self.duration_s}")


class Simulation:
    """Wire nodes, network and compute into one SimPy environment and run it."""

    def __init__(self, nodes: list[SchemeNode], network: NetworkSpec | NetworkModel,
                 compute: ComputeModel, stop: StopRule, *,
                 gradients: GradientSource | None = None, trace: bool = False,
                 on_round: Callable[[int, int, float], None] | None = None,
                 coalesce_rel: float = COALESCE_REL, settling: Settling | None = None) -> None:
        """`network`: a network model built on its own SimPy environment (this
        simulation runs on that clock; akosim.network.netmodel.build_network_model),
        or a NetworkSpec for the max-min model (`coalesce_rel` is then its precision).
        `compute` is charged with the model's message CPU if it has any. `settling`:
        this configuration's settle rule (SettleRule.for_scheme), needed when `stop`
        settles."""
        if stop.settle is not None and settling is None:
            raise ValueError("a stop rule that settles needs the configuration's Settling")
        if isinstance(network, NetworkSpec):
            network = build_network_model(simpy.Environment(), network,
                                          coalesce_rel=coalesce_rel)
        if network.spec.n != len(nodes):
            raise ValueError(f"the network has {network.spec.n} nodes, "
                             f"the scheme {len(nodes)}")
        self.env = network.env
        self.net = network
        # a ring's neighbour channel is one in-order stream (akosim.network.pairstream)
        ordered = any(node.in_order_sends for node in nodes)
        self._streams: NetworkModel = PairStreams(network) if ordered else network
        self.nodes = nodes
        self._multicast = MulticastDelivery(nodes)
        self.compute = network.with_cpu(compute)
        self.stop = stop
        self.gradients = gradients
        self.on_round = on_round
        self.workers = [n.rank for n in nodes if n.is_worker]
        self.timelines = {r: WorkerTimeline(r) for r in self.workers}
        self.trace: list[TraceEvent] | None = [] if trace else None
        self._wake: dict[int, simpy.Event | None] = {n.rank: None for n in nodes}
        self._waiting = np.zeros(len(nodes), dtype=bool)
        self.stop_requested = False
        self.deliveries = 0
        self.duplicates = 0
        self.messages_sent = 0
        self.steady_stats: NetworkStats | None = None
        self.settle_watch: SettleWatch | None = None
        if stop.settle is not None and settling is not None:
            self.settle_watch = SettleWatch(
                settling, [self.timelines[r].round_end_s for r in self.workers])
        self._ended: list[int] = []  # per round index: workers that have ended it
        # training (drain): a stop by time or request ends every worker after the same
        # round count, the most any worker had begun when it was decided (as akorun's
        # akorun.runtime.lifecycle.stopping agrees it), so no lockstep peer waits for a round its
        # stopped peer never runs
        self._begun = {rank: 0 for rank in self.workers}
        self._last_rounds: int | None = None
        self._completed = 0  # rounds every worker has ended

    # ------------------------------------------------------------------ running

    def run(self, until_s: float | None = None) -> None:
        for rank in self.workers:
            self.env.process(self._worker(rank))
        self.env.run(until=until_s)
        stuck = [r for r in self.workers if self.timelines[r].drained_s == 0.0
                 and not self.nodes[r].drained()]
        if stuck and until_s is None and self.stop.drain:
            raise RuntimeError(f"simulation ended with workers {stuck} waiting forever "
                               f"(a peer never sent what they wait for)")

    def request_stop(self) -> None:
        """Every worker stops after its current round (training's target accuracy)."""
        self.stop_requested = True

    def _more_rounds(self, round_: int) -> bool:
        if self.stop.rounds is not None and round_ >= self.stop.rounds:
            return False
        watch = self.settle_watch
        if watch is not None and round_ >= watch.settling.cap_rounds:
            return False
        stopping = self.stop_requested or (self.stop.duration_s is not None
                                           and self.env.now >= self.stop.duration_s)
        if not stopping:
            return True
        if not self.stop.drain:
            return False
        if self._last_rounds is None:
            self._last_rounds = max(self._begun.values())
            for rank in self.workers:  # a worker waiting at a gate past it looks again
                if self._waiting[rank]:
                    self._resume(rank)
        return round_ < self._last_rounds

    def _gate_or_stop(self, node: SchemeNode, round_: int) -> bool:
        """The gate of `round_` opened, or the stop leaves that round out."""
        return node.may_start(round_) or (self._last_rounds is not None
                                          and round_ >= self._last_rounds)

    def _wait_for(self, rank: int, ready: Callable[[], bool], round_: int | None = None):
        """Wait until `ready()`, looking again at every message that arrives; with
        `round_`, `ready` is the gate of that round, and once a look found it
        still closed the multicast gate watch says when to look again (a gate
        that the first messages open, as in lockstep rounds, costs no count)."""
        looked = False
        while not ready():
            event = self.env.event()
            self._wake[rank] = event
            self._waiting[rank] = True
            if round_ is not None and looked:
                self._multicast.watch(rank, round_)
            looked = True
            yield event

    def _worker(self, rank: int):
        node, line, env = self.nodes[rank], self.timelines[rank], self.env
        round_ = 0
        while self._more_rounds(round_):
            if not node.may_start(round_):
                waited_from = env.now
                yield from self._wait_for(rank, partial(self._gate_or_stop, node, round_), round_)
                line.wait_s += env.now - waited_from
                self._span(rank, "wait", waited_from, env.now, round=round_)
                if not self._more_rounds(round_):
                    break
            self._begun[rank] = round_ + 1
            lag = node.lag(round_)
            line.max_lag_rounds = max(line.max_lag_rounds, lag)
            line.lag_sum += lag
            started = env.now
            if self.gradients is not None:
                assert node.params is not None
                self.gradients.begin(rank, round_, node.params)
            yield env.timeout(self.compute.time_s(rank, round_))
            grad = self.gradients.result(rank) if self.gradients is not None else None
            line.compute_s += env.now - started
            self._span(rank, "compute", started, env.now, round=round_)
            inside_s = self.compute.inside_of(rank)
            if inside_s > 0:  # the island reduces its devices' gradients before it sends
                inside_from = env.now
                yield env.timeout(inside_s)
                line.inside_s += inside_s
                self._span(rank, "inside", inside_from, env.now, round=round_)
            overhead_s = self.compute.overhead_of(rank)
            if overhead_s > 0:  # dispatch, inbox, optimizer: before the sends leave
                overhead_from = env.now
                yield env.timeout(overhead_s)
                self._span(rank, "overhead", overhead_from, env.now, round=round_)
            effects = node.local_step(round_, grad)
            codec_s = codec_cpu_s(effects)
            if codec_s > 0:  # encode (and the receivers' decode) before the sends leave
                codec_from = env.now
                yield env.timeout(codec_s)
                self._span(rank, "codec", codec_from, env.now, round=round_)
            self._dispatch(rank, effects)
            line.round_end_s.append(env.now)
            if self.settle_watch is not None:
                self._round_ended(round_)
            round_ += 1
            if self.on_round is not None:
                self.on_round(rank, round_, env.now)
        line.finish_s = env.now
        if self.steady_stats is None:
            self.steady_stats = self.net.stats()  # traffic up to the first finish
        if not self.stop.drain:
            return
        self._dispatch(rank, node.finish(round_))
        yield from self._wait_for(rank, node.drained)
        node.settle()
        line.drained_s = env.now

    def _round_ended(self, round_: int) -> None:
        """A worker ended `round_`; once every worker has, the settle watch looks."""
        ended = self._ended
        if round_ == len(ended):
            ended.append(0)
        ended[round_] += 1
        watch = self.settle_watch
        assert watch is not None
        while (not self.stop_requested and self._completed < len(ended)
               and ended[self._completed] == len(self.workers)):
            self._completed += 1
            if watch.completed(self._completed):
                self.request_stop()

    # ------------------------------------------------------------------ network

    def _dispatch(self, src: int, effects: list[Send] | tuple[Send, ...]) -> None:
        line = self.timelines.get(src)
        for send in effects:
            msg = send.message
            self.messages_sent += len(send.dests)
            node = self.nodes[src]
            # the rounds' traffic: a sync or ring step of a round the node ran counts even
            # when it leaves after the node's last round (what finish owes does not)
            if line is not None and (not node.finished or msg.round < node.next_round):
                line.bytes_sent += msg.nbytes * len(send.dests)
            token = _InFlight(msg, src, self.env.now, len(send.dests))
            net = self._streams if self.nodes[src].in_order_sends else self.net
            net.send(src, send.dests, msg.nbytes, self._delivered, token)

    def _dispatch_after(self, src: int, send: Send, _event: object) -> None:
        self._dispatch(src, (send,))

    def _delivered(self, dests: np.ndarray, token: object) -> None:
        assert isinstance(token, _InFlight)
        msg = token.message
        multicast = self._multicast
        duplicates, effects, in_order = multicast.deliver_tracked(dests, msg,
                                                                 validated=token.validated)
        token.validated = True
        count = dests.shape[0]
        self.deliveries += count
        self.duplicates += duplicates
        for node, send in effects:
            codec_s = codec_cpu_s((send,))
            if codec_s > 0:  # a forwarded coded message (a ring's reduce step): encode first
                self.env.timeout(codec_s).callbacks.append(
                    partial(self._dispatch_after, node, send))
            else:
                self._dispatch(node, (send,))
        if count == 1:
            dest = int(dests[0])
            if not self._waiting[dest]:
                pass
            elif not (in_order and multicast.watched[dest]) or multicast.opened(dest, msg.round):
                self._resume(dest)
        else:
            waiting = dests[self._waiting[dests]]
            if waiting.shape[0]:
                watched = multicast.watched[waiting]
                if in_order and watched.any():
                    opened = multicast.opened_many(waiting[watched], msg.round)
                    waiting = np.concatenate([waiting[~watched], opened])
                for dest in waiting.tolist():
                    self._resume(dest)
        token.remaining -= len(dests)
        if token.remaining == 0 and self.trace is not None and token.src in self.timelines:
            self._span(token.src, "send", token.start_s, self.env.now, round=msg.round,
                       part=msg.part, bytes=msg.nbytes, peers=token.copies)

    def _resume(self, dest: int) -> None:
        """Wake waiting `dest` to look at its condition again."""
        event = self._wake[dest]
        self._wake[dest] = None
        self._waiting[dest] = False
        self._multicast.unwatch(dest)
        if event is not None and not event.triggered:
            event.succeed()

    def _span(self, rank: int, name: str, start_s: float, end_s: float, **args: object) -> None:
        if self.trace is not None:
            self.trace.append(TraceEvent(rank, name, start_s, end_s, tuple(args.items())))

    # ------------------------------------------------------------------ results

    @property
    def elapsed_s(self) -> float:
        return max((t.finish_s for t in self.timelines.values()), default=0.0)
