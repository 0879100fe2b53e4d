"""One akorun process: the composition root that wires this rank's collaborators together.

Every collaborator takes the rank's frozen `RankContext` (runtime.rank_context: rank,
peers, role, phase, metrics, clock, spawn, settings) plus the few ports it talks to; what
happens to the rank (a wake, a peer lost or back, a peer stuck, this rank given up) goes
through the context's event hub, to which the collaborators are subscribed here.

The life of a rank follows the driving loop in the docstring of akocore.schemes:

    prepare (workload, warm-up compile, checkpoint)       runtime.lifecycle.prepare
    join (hello every rank, p auto, build the node)       runtime.lifecycle.join
      or rejoin (--resume, ako only)                      runtime.recovery.rejoin
    the rounds, with evaluations and checkpoints          runtime.lifecycle.training
    finish: flush, drain, settle, results, "done"         runtime.lifecycle.finishing

while the server (akorun.transport.server) takes partials straight to the node (their
Receipt effects are queued like any send, runtime.outbox) and control messages
through the one `ControlTable` built here, and runtime.liveness.peer_liveness suspends peers
silent past the peer timeout and resumes them when they speak again (runtime.recovery.relay
then has the survivors forward each other what a lost rank sent to only some of
them). The run's
phase is a state machine (runtime.lifecycle.phase); what differs between ako, ps and
all-reduce ranks is the role object chosen once (runtime.roles); the fault test
hooks are injected (runtime.fault_hooks, none by default). `Worker` itself
only builds these, serves as the server's host and runs them in order; the few
decisions that need several of them at once (a stuck peer, a member that sends
malformed data) stay here.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import threading
import time
from collections.abc import Coroutine, Sequence
from typing import Any

import aiohttp

from akocore.codecs import Codec, codec_named
from akocore.codecs.exchange import decoded
from akocore.messages import Partial
from akocore.records.results import RankResult
from akocore.schemes import SchemeError, SchemeNode
from akocore.schemes.registry import wire_codec
from akocore.settings.toml_io import config_hash
from akocore.workloads.flat import FlatWorkload
from akorun.errors import Interrupted, RunError, UsageError
from akorun.metrics import Metrics
from akorun.runtime.endpoints import allowed_networks, split_host, url_host
from akorun.runtime.fault_hooks import fault_hooks, relay_answer_hook
from akorun.runtime.lifecycle.evaluation import Evaluator
from akorun.runtime.lifecycle.finishing import Finisher
from akorun.runtime.lifecycle.join import Identity, Join, JoinFacts, compared_settings
from akorun.runtime.lifecycle.phase import Phase, PhaseMachine
from akorun.runtime.lifecycle.prepare import Prepared, prepare
from akorun.runtime.lifecycle.startup_phase import StartupPhase
from akorun.runtime.lifecycle.stopping import StopAgreement
from akorun.runtime.lifecycle.training import TrainingLoop
from akorun.runtime.liveness.peer_liveness import Liveness
from akorun.runtime.liveness.waiting import GATE_STALL_TIMEOUTS, Waiter
from akorun.runtime.node_plan import wire_hash
from akorun.runtime.outbox import Outbox, emulated_links
from akorun.runtime.rank_context import RankContext
from akorun.runtime.rank_options import WorkerOptions
from akorun.runtime.records.checkpoints import CheckpointWriter
from akorun.runtime.records.rank_result import ResultBuilder, summary_line
from akorun.runtime.records.reporting import Reporter
from akorun.runtime.recovery.anchor_sync import AnchorSync
from akorun.runtime.recovery.rejoin import Rejoin
from akorun.runtime.recovery.relay import Relay
from akorun.runtime.roles import role_for
from akorun.transport.cancelling import cancel_and_wait
from akorun.transport.client import ControlClient, binary_answer_cap, make_session
from akorun.transport.control import ControlKind
from akorun.transport.emulated_links import DownlinkShaper
from akorun.transport.keys import RequestVerifier, RunKeys, Signer, restrict_new_files
from akorun.transport.routing import ControlTable
from akorun.transport.server import Server
from akorun.transport.validation import NonFiniteValues, refuse_non_finite

log = logging.getLogger("akorun")


class Worker:
    """One rank: builds its collaborators, hosts its server and runs its life in order."""

    def __init__(self, options: WorkerOptions) -> None:
        cfg = options.config
        self.options = options
        self.cfg = cfg
        self.rank = options.rank
        self.world = cfg.cluster.workers
        self.peers = [j for j in range(self.world) if j != self.rank]
        if len(cfg.cluster.hosts) != self.world:
            raise UsageError("cluster.hosts is empty: akorun needs one host:port per rank "
                             "(`akorun init` writes them)")
        self.endpoints = [split_host(entry) for entry in cfg.cluster.hosts]
        scheme = "https" if options.tls.enabled else "http"
        self.base_urls = [f"{scheme}://{url_host(h)}:{port}" for h, port in self.endpoints]
        self.role = role_for(cfg, self.rank)
        self.run_id = options.settings.run_id
        self.config_hash = config_hash(cfg)
        # the server takes float32 bodies or this codec's
        self.codec: Codec | None = codec_named(wire_codec(cfg.exchange))
        self.metrics = Metrics(self.rank, self.role.name)
        self.phase = PhaseMachine()
        self._tasks: list[asyncio.Task[Any]] = []
        self.context = RankContext(
            rank=self.rank, peers=tuple(self.peers), role=self.role, phase=self.phase,
            metrics=self.metrics, spawn=self._spawn, hosts=cfg.cluster.hosts,
            run_id=self.run_id, config_hash=self.config_hash,
            peer_timeout_s=options.peer_timeout_s, join_timeout_s=options.join_timeout_s,
            grace_s=options.grace_s if options.grace_s is not None else options.peer_timeout_s,
            checkpoint_every=options.checkpoint_every, checkpoint_dir=options.checkpoint_dir,
            out_dir=options.out_dir, wall_start_s=time.perf_counter())
        self.events = events = self.context.events
        self.liveness = Liveness(
            rank=self.rank, peers=self.peers, timeout_s=options.peer_timeout_s,
            node=self._node, clock=self.context.clock, metrics=self.metrics,
            phase=self.phase, events=events)
        self.waiter = Waiter(report_every_s=max(5.0, options.peer_timeout_s / 2),
                             stall_limit_s=GATE_STALL_TIMEOUTS * options.peer_timeout_s,
                             scheme=cfg.exchange.scheme,
                             can_continue_without=self.role.can_continue_without,
                             peers=self.liveness, send_due=self._poll_due)
        self.keys = RunKeys(options.settings.rank_keys(self.rank, self.world))
        self.signer = Signer(self.keys)
        self.verifier = RequestVerifier(self.keys, world=self.world)
        self.outbox = Outbox(signer=self.signer, metrics=self.metrics,
                             running=self._running, rounds_done=self._rounds_done)
        self.relay = Relay(rank=self.rank, peers=self.peers, node=self.role.recovery.node,
                           codec=self.codec,
                           signer=self.signer, verifier=self.verifier,
                           peer_timeout_s=options.peer_timeout_s, deliver=self._on_relayed,
                           lost_here=self._lost_here,
                           budget_bytes=options.settings.relay_budget_bytes,
                           before_answer=relay_answer_hook(options.faults))
        events.wake.subscribe(self.waiter.wake_up)
        events.peer_changed.subscribe(self.outbox.notify)
        events.peer_lost.subscribe(self.relay.peer_lost)
        events.peer_stuck.subscribe(self._on_stuck)
        events.given_up_here.subscribe(self._on_given_up_here)
        self.downlink: DownlinkShaper | None = None  # emulated incoming NIC, set by run
        self._signals = 0
        self.control: ControlClient | None = None  # set once the run's client exists
        self.refused_member: str | None = None  # the line, once a member sent malformed data
        # wired by prepare, once the workload exists
        self.prepared: Prepared
        self.join: Join
        self.rejoin: Rejoin
        self.evaluator: Evaluator
        self.training: TrainingLoop
        self.results: ResultBuilder
        self.finisher: Finisher
        self.reporter: Reporter
        self.control_table: ControlTable
        self.stopping: StopAgreement
        self.anchor_sync: AnchorSync

    # ================================================================ wiring

    def prepare(self, workload: FlatWorkload | None = None) -> None:
        """Build the workload (same seed on every rank), load a checkpoint for --resume,
        and wire the collaborators that need them.

        Synchronous and before the event loop starts; user mistakes raise UsageError.
        `workload`: trained instead of the configured one (akorun.Exchange's bridge).
        """
        options, context = self.options, self.context
        restrict_new_files()
        phase = StartupPhase(options.out_dir, self.rank)
        self.prepared = prepared = prepare(
            self.cfg, self.role, run_id=self.run_id, config_hash=self.config_hash,
            resume=options.resume, checkpoint_dir=options.checkpoint_dir, workload=workload,
            phase=phase)
        identity = Identity(self.rank, self.run_id, self.config_hash, prepared.params_sha256,
                            workload=prepared.workload_identity,
                            settings=compared_settings(JoinFacts(
                                self.cfg, prepared.params_sha256,
                                prepared.workload_identity)))
        hooks = fault_hooks(options.faults, outbox=self.outbox, gone=self._suspended,
                            hard_stop=self._hard_stop, stop_requested=self._stop_requested)
        self.join = Join(context, identity=identity, build_node=self._build_node,
                         compute_measured_s=prepared.compute_measured_s, faults=hooks,
                         waiter=self.waiter, liveness=self.liveness)
        self.rejoin = Rejoin(context, identity=identity, outbox=self.outbox,
                             build_node=self._build_node, checkpoint=prepared.checkpoint,
                             relay=self.relay, waiter=self.waiter, liveness=self.liveness)
        training_peers = [j for j in self.peers if role_for(self.cfg, j).trains]
        self.evaluator = Evaluator(
            context, workload=prepared.workload, waiter=self.waiter, gone=self._out_of_gate,
            heard=self.liveness.heard,
            training_ranks=[self.rank] * self.role.trains + training_peers)
        checkpoints = CheckpointWriter(self.role, options.checkpoint_dir, prepared.workload,
                                       run_id=self.run_id, config_hash=self.config_hash)
        self.stopping = StopAgreement(
            rank=self.rank, training_peers=training_peers,
            waiter=self.waiter, gone=self._out_of_gate, spawn=self._spawn,
            heard=self.liveness.heard, patience_s=GATE_STALL_TIMEOUTS * options.peer_timeout_s)
        self.anchor_sync = AnchorSync(context, waiter=self.waiter, liveness=self.liveness)
        self.training = TrainingLoop(
            context, prepared=prepared, outbox=self.outbox, waiter=self.waiter, faults=hooks,
            evaluator=self.evaluator, checkpoints=checkpoints, agreement=self.stopping,
            after_gate=self.anchor_sync.after_gate)
        checkpoints.trained_s = self.training.trained_s
        self.liveness.busy_s = self.training.busy_s
        self.results = ResultBuilder(
            context, prepared=prepared, training=self.training, outbox=self.outbox,
            evaluator=self.evaluator, waiter=self.waiter, relay=self.relay)
        self.finisher = Finisher(
            context, outbox=self.outbox, training=self.training, evaluator=self.evaluator,
            checkpoints=checkpoints, results=self.results, relay_idle=self.relay.idle,
            waiter=self.waiter, liveness=self.liveness)
        self.reporter = Reporter(context, outbox=self.outbox, waiter=self.waiter,
                                 liveness=self.liveness)
        self.control_table = ControlTable({
            ControlKind.HELLO: self.join.on_hello,
            ControlKind.STOP: self.stopping.on_stop if self.role.trains
            else self.evaluator.on_stop,
            ControlKind.HEARTBEAT: self.liveness.on_heartbeat,
            ControlKind.DONE: self.liveness.on_done,
            ControlKind.REJOIN_HELLO: self.rejoin.on_rejoin_hello,
            ControlKind.SNAPSHOT: self.rejoin.on_snapshot,
            ControlKind.RESTART: self.rejoin.on_restart,
            ControlKind.RELAY: self.relay.on_relay,
            ControlKind.LEAVE: self.join.on_leave,
            ControlKind.ANCHOR: self.anchor_sync.on_anchor,
        }, rank=self.rank, world=self.world)

    # the few questions collaborators ask of the rank as a whole

    def _node(self) -> SchemeNode | None:
        return self.role.node

    def _running(self) -> bool:
        return self.phase.is_(Phase.RUNNING)

    def _rounds_done(self) -> int:
        return self.training.rounds_done

    def _hard_stop(self) -> bool:
        return self.waiter.hard_stop

    def _stop_requested(self) -> bool:
        return self.waiter.stop_reason is not None

    def _lost_here(self, peer: int) -> bool:
        """The relay forwards a lost peer's partials only when it is lost here too."""
        return self._suspended(peer) or self.liveness.rejoining(peer)

    def _build_node(self, compute_s: float | None, p_of: Sequence[int] | None = None) -> None:
        prepared = self.prepared
        plan = self.role.build_node(prepared.workload, prepared.optimizer, compute_s, p_of)
        self.keys.bind_wire_hash(wire_hash(self.cfg, prepared.params_sha256, plan.p_of))

    def _suspended(self, peer: int) -> bool:
        node = self.role.node
        return node is not None and peer in node.suspended

    def _out_of_gate(self, peer: int) -> bool:
        """Not waited for by the stop agreement: suspended, left, lost or done."""
        return self._suspended(peer) or peer in self.liveness.left_peers \
            or peer in self.waiter.lost_peers or peer in self.liveness.done_peers

    async def _poll_due(self) -> None:
        """What every wait does as it polls: diloco's notices of a view change, and the
        sends the scheme owes outside an event."""
        self.anchor_sync.note_views()
        await self.outbox.send_due(self.role.node)

    def _on_stuck(self, peer: int, why: str) -> None:
        """A peer given up for making no progress: the run stops if the scheme cannot go
        on without it (ps, all-reduce), and every peer is told to stop too; ako and
        diloco go on without it."""
        if not self.role.can_continue_without(peer) and peer not in self.waiter.lost_peers:
            line = (f"{why}: scheme {self.waiter.scheme} cannot continue without it: "
                    f"stopping this rank, exit 1")
            self.waiter.lose([peer], line)
            if self.control is not None:  # every rank stops (a ps server, a worker that
                self._spawn(self.join.leave(self.control, line, peers=self.peers))  # waits)

    def _on_given_up_here(self, line: str) -> None:
        """This rank was stuck past the limit and its peers gave it up: ako takes it back
        with its next round; any other scheme went on (or stopped) without it, so this
        rank stops at once and fails (the finish raises the line)."""
        if not self.role.recovery.takes_back_given_up():
            self.waiter.request_stop("given up by the peers")
            self.waiter.stop_now()

    def _spawn(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        self._tasks.append(asyncio.create_task(coroutine))

    @property
    def rank_result(self) -> RankResult:
        """This rank's result, as written at the end of `run`."""
        if self.results.last is None:
            raise RuntimeError("rank_result: the run has not finished")
        return self.results.last

    # ================================================================ server host

    def not_accepting(self) -> str | None:
        if self.role.node is None or not self.verifier.ready:
            return Phase.STARTING.value
        if self.phase.is_(Phase.REJOINING):
            return Phase.REJOINING.value
        return None

    def max_body_bytes(self) -> int:
        return self.prepared.workload.gradient_bytes

    def note_endorsements(self, key: tuple[int, int, int], text: str | None) -> None:
        self.relay.note_endorsements(key, text)

    async def on_partial(self, partial: Partial, nbytes: int) -> bool:
        """Take one authenticated partial; one a correct member never sends (malformed,
        non-finite) is refused (400, 422) and stops the run (`_refused_member`)."""
        try:
            return await self._take_partial(partial, nbytes)
        except (SchemeError, NonFiniteValues) as error:
            self._refused_member(partial.sender, str(error))
            raise

    def _refused_member(self, sender: int, reason: str) -> None:
        """An authenticated member sent what a correct one never sends: the run cannot
        be one model any more. Stop at once with one line naming it, and tell every
        peer (it too) to stop: every rank exits 1 (runtime.lifecycle.join's ``leave``)."""
        if self.refused_member is not None or self.waiter.hard_stop:
            return
        line = (f"rank {sender} sent data a correct member never sends ({reason}); "
                f"the run stops, exit 1")
        self.refused_member = line
        self.waiter.cause = line
        self.liveness.left(sender, line)  # no wait of the finish is for it
        self.waiter.lose([sender], why=line)
        if self.control is not None:
            self._spawn(self.join.leave(self.control, line, peers=self.peers))

    async def _take_partial(self, partial: Partial, nbytes: int) -> bool:
        node = self.role.node
        assert node is not None
        partial = _decoded(partial)
        partial, refusal = refuse_non_finite(partial)
        if partial.folded:  # rounds owed while we were away: less any taken forwarded
            partial = self.relay.fold_in(partial)
        receipt = node.receive(partial)  # SchemeError -> 400 in the server
        counters = self.metrics.peer(partial.sender)
        self.liveness.received(partial.sender, receipt.accepted, partial.round)
        if receipt.accepted and refusal is None:
            self.relay.accepted(partial)  # kept for survivors, should its sender be lost
        if receipt.accepted:
            counters.bytes_received += nbytes
            counters.messages_received += 1
            self.waiter.wake_up()
        else:
            self.metrics.duplicates_dropped += 1
            if refusal is None:
                self.relay.duplicate(partial)  # held already: perhaps forwarded
        if receipt.effects:
            await self.outbox.dispatch(receipt.effects)
        if refusal is not None:
            raise refusal  # 422 in the server: recorded with zero values, sender told
        return receipt.accepted

    def _on_relayed(self, partial: Partial) -> bool:
        """A partial of a lost peer another survivor forwarded (its endorsement checked,
        akorun.runtime.recovery.relay): taken like one of its own, but no evidence that it lives."""
        node = self.role.node
        assert node is not None
        partial = _decoded(partial)
        partial, refusal = refuse_non_finite(partial)
        if refusal is not None:
            log.warning("repair: %s", refusal)
        receipt = node.receive(partial)
        if receipt.accepted:
            self.waiter.wake_up()
        else:
            self.metrics.duplicates_dropped += 1
        return receipt.accepted

    def status(self, digest: bool = False) -> dict[str, Any]:
        return self.reporter.status(digest)

    def prometheus(self) -> str:
        return self.reporter.prometheus()

    # ================================================================ main

    def _on_signal(self, name: str) -> None:
        self._signals += 1
        if self._signals > 1 or self.role.hard_stop_on_first_signal \
                or self.phase.is_(Phase.FINISHING, Phase.DONE):
            self.waiter.stop_now()
            log.warning("%s: stopping now", name)
        self.waiter.request_stop(f"{name}: finish this round, flush, checkpoint, exit")

    async def run(self) -> None:
        """The whole life of the process (after prepare)."""
        options = self.options
        loop = asyncio.get_running_loop()
        if threading.current_thread() is threading.main_thread():  # not akorun.Exchange's
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, self._on_signal, signal.Signals(signum).name)
        session: aiohttp.ClientSession = make_session(peers=len(self.peers))
        client_ssl = options.tls.client_context()
        control = ControlClient(session, self.signer, self.base_urls, ssl_context=client_ssl)
        self.control = control
        control.binary_answer_max_bytes = binary_answer_cap(self.prepared.workload.gradient_bytes)
        self.evaluator.control = control
        self.relay.control = control
        self.stopping.control = control
        self.anchor_sync.control = control
        server = Server(self, max_concurrent_reads=max(4, 3 * len(self.peers)))
        host, port = self.endpoints[self.rank]
        try:
            await server.start(options.listen_host or host, port,
                               options.tls.server_context(), allow=allowed_networks(
                                   options.settings.allow, self.cfg.cluster.hosts))
            StartupPhase(options.out_dir, self.rank).clear()  # /status says it from now on
            shaper = None
            if options.emulate:
                shaper, self.downlink = emulated_links(self.cfg, self.rank, self.peers)
            self.outbox.start(rank=self.rank, session=session, shaper=shaper,
                              peer_urls={j: self.base_urls[j] + "/v1/partial"
                                         for j in self.peers},
                              queue_messages=options.queue_messages, ssl=client_ssl or True,
                              may_drop=self.liveness.may_drop,
                              on_delivered=self.liveness.heard)
            if options.resume:
                self.training.first_round = await self.rejoin.rejoin(control)
            else:
                try:
                    await self.join.join(control)
                except (Interrupted, RunError) as error:
                    await self.join.leave(control, str(error),  # so that no peer waits
                                          failed=isinstance(error, RunError))
                    if isinstance(error, RunError):
                        await self.join.linger_failed()  # for the ranks still starting
                    if isinstance(error, Interrupted):
                        self.results.write_unjoined()
                    raise
            self.metrics.state = self.phase.name
            self._spawn(self.liveness.monitor(control))
            if not options.quiet:
                self._spawn(self.reporter.progress(options.progress_every_s))
            node = self.role.node
            assert node is not None
            if self.role.trains:
                await self.training.train(node)
            if self.training.nonfinite is not None:  # the user's loss went NaN/Inf: all stop
                await self.join.leave(control, self.training.nonfinite, peers=self.peers)
            await self.finisher.finish(control)  # RunError(nonfinite line) in that case
            log.info("done: %d rounds, stop: %s", self.training.times.rounds,
                     self.waiter.stop_reason)
            if self.relay.disagreements:
                raise RunError("; ".join(self.relay.disagreements[origin]
                                         for origin in sorted(self.relay.disagreements)))
            refused = self.metrics.refused_for_good
            if refused:
                raise RunError(f"{sum(refused.values())} message(s) refused for good by peer(s) "
                               f"{sorted(refused)} (an authenticated refusal, in the log and "
                               f"the result's refused_for_good): replicas are not equal")
        finally:
            await cancel_and_wait(self._tasks, what="the rank's background tasks")
            await self.outbox.stop()
            await session.close()
            await server.close()
            self.evaluator.shutdown()


def run_rank(options: WorkerOptions, workload: FlatWorkload | None = None) -> Worker:
    """Run one rank to its end in this thread (`akorun worker`, `akorun.run_worker`; an island
    gives its `workload` ready); its record is `worker.rank_result`, written to any out dir
    (the launcher merges the run's records, akorun.launching.commands)."""
    worker = Worker(options)
    worker.prepare(workload)
    asyncio.run(worker.run())
    if options.out_dir is not None and not options.quiet:
        sys.stderr.write(summary_line(worker.rank_result) + "\n")
    return worker


def _decoded(partial: Partial) -> Partial:
    """A coded partial (akocore.codecs) with its values decoded from its payload; a
    payload no sender of this codec produces is refused like any malformed message."""
    try:
        return decoded(partial)
    except ValueError as error:
        raise SchemeError(f"message from {partial.sender}: {error}") from None
