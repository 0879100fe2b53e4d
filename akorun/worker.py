"""One akorun process: the asyncio loop that drives this rank's scheme node for real.

This module owns the life of a rank, following the driving loop in the
docstring of akocore.schemes exactly:

    join (hello with every rank, p auto, build the node) or rejoin (--resume)
    t = first round
    while the run goes on:                        # rounds, duration, accuracy, signal
        wait until node.may_start(t)              # SSP gate: an asyncio.Event set on
                                                  # every accepted message
        grad = JAX step on a COPY of the params   # in a thread: the loop keeps serving
        deliver node.local_step(t, grad)          # encoded once, queued to every peer
        t += 1
    deliver node.finish(t); flush the queues
    wait until node.drained()                     # the peer timeout covers dead peers
    node.settle(); final checkpoint; results; "done" to peers; grace period

Messages arriving on the server go straight to `node.receive` on the loop
(they fold into the inbox, applied at the next step); their Receipt effects
(ps servers answering, ring steps) are queued like any send. A peer silent
for longer than the peer timeout (no accepted message, no successful send,
no heartbeat answered) is suspended from the gate and reported; it rejoins the
gate as soon as it speaks again. Nothing ever waits forever on a dead peer.

Rejoin (``--resume``, ako only): answer partials with 503 "rejoining"; ask
every peer what it acknowledged, dropped and received (``/v1/rejoin-hello``);
get a snapshot from the most advanced live peer once it holds everything the
dead process had acknowledged (``/v1/snapshot``); adopt it; tell every peer
the first new round (``/v1/restart``); go on. Exact for plain SGD when the
crash landed between two rounds. Without any live peer the worker continues
from its own checkpoint alone.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import os
import resource
import signal
import ssl
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from akocore.config import RunConfig, config_hash, config_to_dict, replace_in
from akocore.messages import Partial, Send
from akocore.schemes import AkoState, AkoWorker, PSLayout, RejoinSnapshot, SchemeNode
from akocore.settings.registry import default_of
from akocore.workload import Workload, build_workload, enable_compilation_cache
from akorun import control
from akorun.checkpoint import (
    Checkpoint,
    load_checkpoint,
    log_from_json,
    log_to_json,
    optimizer_leaves,
    restore_optimizer_state,
    save_checkpoint,
)
from akorun.client import ControlClient, make_session
from akorun.cluster import AkorunSettings, split_host
from akorun.errors import Interrupted, RunError, UsageError
from akorun.faults import Faults
from akorun.metrics import Metrics, ProgressLine, render_prometheus
from akorun.results import worker_summary, write_json
from akorun.roles import (
    NodePlan,
    make_node,
    params_digest,
    plan_node,
    ps_server_count,
    role_of,
    training_workers,
    wire_hash,
)
from akorun.sender import DEFAULT_QUEUE_MESSAGES, Outgoing, PeerSender
from akorun.server import ControlError, Server
from akorun.shaping import DownlinkShaper, LinkShaper
from akorun.wire import encode_bytes

log = logging.getLogger("akorun")

ENCODE_IN_THREAD_BYTES = 1 << 20  # encode (HMAC) bigger messages off the loop


@dataclass(frozen=True)
class TLSOptions:
    cert: str | None = None
    key: str | None = None
    ca: str | None = None

    @property
    def enabled(self) -> bool:
        return self.cert is not None

    def server_context(self) -> ssl.SSLContext | None:
        if self.cert is None or self.key is None:
            return None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.cert, self.key)
        return context

    def client_context(self) -> ssl.SSLContext | None:
        """Verify peers against --tls-ca (else the system CAs) and the run's own
        certificate, so a self-signed cluster certificate works without a CA."""
        if not self.enabled:
            return None
        context = ssl.create_default_context(cafile=self.ca)
        if self.cert is not None:
            context.load_verify_locations(cafile=self.cert)
        return context


@dataclass(frozen=True)
class WorkerOptions:
    """Everything one process needs beyond the run config."""

    rank: int
    config: RunConfig
    settings: AkorunSettings
    out_dir: Path | None = None
    checkpoint_dir: Path | None = None
    checkpoint_every: int = default_of("akorun.checkpoint_every")
    resume: bool = False
    listen_host: str | None = None
    emulate: bool = True
    peer_timeout_s: float = default_of("akorun.peer_timeout")
    join_timeout_s: float = default_of("akorun.join_timeout")
    grace_s: float | None = None  # default: the peer timeout
    progress_every_s: float = 5.0
    quiet: bool = False
    tls: TLSOptions = field(default_factory=TLSOptions)
    faults: Faults = field(default_factory=Faults)
    queue_messages: int = DEFAULT_QUEUE_MESSAGES


@dataclass
class RoundTimes:
    """Per-round wall, compute, gate-wait and overhead seconds (since training start).

    overhead_s[i] is round i's time outside the gradient step and the gate wait:
    its wall time (end_s[i] - end_s[i-1]) minus compute_s[i] and wait_s[i]
    (dispatching the sends, folding the inbox and applying the optimizer in
    local_step, the evaluation start, checkpoints, the event loop).
    """

    end_s: list[float] = field(default_factory=list)
    compute_s: list[float] = field(default_factory=list)
    wait_s: list[float] = field(default_factory=list)
    overhead_s: list[float] = field(default_factory=list)

    def add(self, end_s: float, compute_s: float, wait_s: float) -> None:
        previous = self.end_s[-1] if self.end_s else 0.0
        self.end_s.append(end_s)
        self.compute_s.append(compute_s)
        self.wait_s.append(wait_s)
        # not clamped: compute and wait come from the same monotonic clock, and the
        # steady means then add up exactly (round = compute + wait + overhead)
        self.overhead_s.append(end_s - previous - compute_s - wait_s)


class Worker:
    """One rank: server, senders, scheme node and the training loop."""

    def __init__(self, options: WorkerOptions) -> None:
        cfg = options.config
        self.options = options
        self.cfg = cfg
        self.rank = options.rank
        self.world = cfg.cluster.workers
        self.role = role_of(cfg, self.rank)
        self.secret = options.settings.secret_bytes
        self.run_id = options.settings.run_id_bytes
        self.config_hash = config_hash(cfg)
        self.metrics = Metrics(self.rank, self.role)
        self.peers = [j for j in range(self.world) if j != self.rank]
        self.training_workers = training_workers(cfg)
        if len(cfg.cluster.hosts) != self.world:
            raise UsageError("cluster.hosts is empty: akorun needs one host:port per rank "
                             "(`akorun init` writes them)")
        self.endpoints = [split_host(entry) for entry in cfg.cluster.hosts]
        scheme = "https" if options.tls.enabled else "http"
        self.base_urls = [f"{scheme}://{_url_host(h)}:{port}" for h, port in self.endpoints]
        self.node: SchemeNode | None = None
        self.plan: NodePlan | None = None
        self.workload: Workload | None = None
        self.params_sha256 = ""
        self.compute_measured_s: float | None = None
        self.warmup_s: float | None = None  # compiling before the join (not in any round)
        self.optimizer: Any = None  # built (and compiled) by prepare, used by _build_node
        self.peer_compute_s: dict[int, float] = {}
        self.checkpoint: Checkpoint | None = None
        self._wire_hash: bytes | None = None
        self.state = "starting"
        self.wake = asyncio.Event()
        self.stop_reason: str | None = None
        self.hard_stop = False
        self.last_heard: dict[int, float] = {}
        self.done_peers: set[int] = set()
        self.rejoining_peers: dict[int, float] = {}  # peer -> loop time of its rejoin-hello
        self.senders: dict[int, PeerSender] = {}
        # emulated incoming NIC: the server admits each message through it
        self.downlink: DownlinkShaper | None = None
        self.times = RoundTimes()
        self.first_round = 0
        self.rounds_done = 0
        self.train_start_s: float | None = None
        self.bytes_queued_rounds = 0  # bytes handed to the senders during the rounds
        self.bytes_queued_flush = 0  # ... after them (node.finish, the final flush)
        self.wall_start_s = time.perf_counter()
        self.final_accuracy: float | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._heartbeats: set[int] = set()
        self._eval_running = False
        self._eval_pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="eval")
        self._progress = ProgressLine()
        self._signals = 0
        self.join_error: str | None = None
        self.session: aiohttp.ClientSession
        self.result_cache: dict[str, Any] = {}
        self.control: ControlClient
        self.server: Server

    # ================================================================ preparation

    def prepare(self) -> None:
        """Build the workload (same seed on every rank), load a checkpoint for --resume.

        Synchronous and before the event loop starts; user mistakes raise UsageError.
        """
        cache = os.environ.get("AKO_JAX_CACHE")
        if cache:
            enable_compilation_cache(cache)
        train = self.cfg.train
        try:
            self.workload = build_workload(train.workload, batch_size=train.batch_size,
                                           seed=train.seed, data_path=train.data_path)
        except ValueError as error:  # unknown workload or option, DataError
            raise UsageError(f"train.workload: {error}") from None
        self.params_sha256 = params_digest(self.workload.init_params)
        if self.cfg.exchange.scheme == "ako":
            if isinstance(self.cfg.exchange.p, tuple):
                try:
                    plan_node(self.cfg, gradient_bytes=self.workload.gradient_bytes,
                              length=self.workload.param_count, compute_s=None)
                except ValueError as error:
                    raise UsageError(str(error)) from None
            else:
                self.compute_measured_s = self.workload.measure_compute_s()
        elif self.cfg.exchange.scheme == "ps":
            ps_server_count(self.cfg)
        self.warm_up()
        if self.options.resume:
            if self.cfg.exchange.scheme != "ako":
                raise UsageError(f"--resume rejoins ako runs only; this run's scheme is "
                                 f"{self.cfg.exchange.scheme!r}")
            directory = self.options.checkpoint_dir
            if directory is not None and (directory / f"worker-{self.rank}.ckpt.npz").exists():
                self.checkpoint = load_checkpoint(directory, self.rank)
                if self.checkpoint.run_id != self.options.settings.run_id:
                    raise UsageError(f"{directory}: the checkpoint of rank {self.rank} is from "
                                     f"run {self.checkpoint.run_id}, not this run "
                                     f"{self.options.settings.run_id}")
                if self.checkpoint.config_hash != self.config_hash:
                    raise UsageError(f"{directory}: the checkpoint of rank {self.rank} was "
                                     f"written with another config")

    def warm_up(self) -> None:
        """Compile what the rounds run (gradient step, evaluation, optimizer) before the join.

        JAX compiles on first use; done here, before this rank answers any hello, the
        compilation is in no round, not in the duration clock and not in the first
        evaluation's time. A parameter server compiles only its optimizer (on its shard).
        """
        workload = self.workload
        assert workload is not None
        started_s = time.perf_counter()
        params = workload.init_params
        if self.role == "worker":
            batch = workload.batches(self.rank, self.training_workers).next()
            workload.grad_step(params, batch.x, batch.y, 0)
            workload.evaluate(params)
        else:
            layout = PSLayout(self.training_workers, ps_server_count(self.cfg),
                              workload.param_count)
            start, stop = layout.shard_slice(layout.shard_of(self.rank))
            params = params[start:stop]
        self.optimizer = workload.optimizer(self.cfg.train.optimizer, self.cfg.train.lr)
        # a pure apply (inputs untouched) on the shape the node will use
        self.optimizer.apply(params, self.optimizer.init(params), np.zeros_like(params))
        self.warmup_s = time.perf_counter() - started_s

    # ================================================================ server host

    def wire_hash(self) -> bytes | None:
        return self._wire_hash

    def not_accepting(self) -> str | None:
        if self.node is None or self._wire_hash is None:
            return "starting"
        if self.state == "rejoining":
            return "rejoining"
        return None

    def max_body_bytes(self) -> int:
        assert self.workload is not None
        return self.workload.gradient_bytes

    async def on_partial(self, partial: Partial, nbytes: int) -> bool:
        node = self.node
        assert node is not None
        receipt = node.receive(partial)  # SchemeError -> 400 in the server
        counters = self.metrics.peer(partial.sender)
        self.heard(partial.sender)
        if receipt.accepted:
            counters.bytes_received += nbytes
            counters.messages_received += 1
            self.wake.set()
        else:
            self.metrics.duplicates_dropped += 1
        if receipt.effects:
            await self.dispatch(receipt.effects)
        return receipt.accepted

    async def on_control(self, name: str, payload: dict[str, Any]) -> dict[str, Any] | bytes:
        sender = payload.get("rank")
        if not isinstance(sender, int) or isinstance(sender, bool) or sender == self.rank \
                or not 0 <= sender < self.world:
            raise ControlError(400, f"rank: got {sender!r}, expected a peer rank "
                                    f"0..{self.world - 1} other than {self.rank}")
        if name == "hello":
            return self._on_hello(sender, payload)
        if name == "heartbeat":
            if self.node is None or self.state in ("starting", "rejoining"):
                raise ControlError(503, self.state)
            self.heard(sender)
            return {"rank": self.rank, "round": self.metrics.round, "state": self.state}
        if name == "stop":
            self.heard(sender)
            self.request_stop(f"rank {sender} reached the target accuracy at round "
                              f"{payload.get('round')}")
            return {"rank": self.rank, "round": self.metrics.round}
        if name == "done":
            self.done_peers.add(sender)
            self.wake.set()
            return {"rank": self.rank}
        if name == "rejoin-hello":
            return self._on_rejoin_hello(sender, payload)
        if name == "snapshot":
            return await self._on_snapshot(sender, payload)
        if name == "restart":
            return self._on_restart(sender, payload)
        raise ControlError(404, f"unknown control message {name}")

    def status(self, digest: bool = False) -> dict[str, Any]:
        node = self.node
        next_round = node.next_round if node is not None else 0
        result: dict[str, Any] = {
            "rank": self.rank,
            "role": self.role,
            "state": self.state,
            "run_id": self.options.settings.run_id,
            "config_hash": self.config_hash,
            "scheme": self.cfg.exchange.scheme,
            "p": list(self.plan.p_of) if self.plan and self.plan.p_of else None,
            "round": self.metrics.round,
            "next_round": next_round,
            "finished": bool(node.finished) if node is not None else False,
            "waiting_on": node.waiting_on(next_round) if node is not None else [],
            "lag": node.lag(next_round) if node is not None else 0,
            "suspended": sorted(node.suspended) if node is not None else [],
            "done_peers": sorted(self.done_peers),
            "queue_depth": {str(j): s.depth for j, s in self.senders.items()},
            "acked_round": {str(j): s.acked_round for j, s in self.senders.items()},
            "stop_reason": self.stop_reason,
            "metrics": self.metrics.as_dict(),
        }
        if isinstance(node, AkoWorker):
            result["contiguous"] = {str(j): int(node.log.contiguous[j]) for j in node.peers}
        if digest and node is not None and node.params is not None:
            result["params_sha256"] = params_digest(node.params)
            if isinstance(node, AkoWorker) and node.inbox is not None:
                result["inbox_sha256"] = params_digest(node.inbox)
                result["unsent_sha256"] = params_digest(node.unsent) \
                    if node.unsent is not None else None
        return result

    def prometheus(self) -> str:
        node = self.node
        loop_now = asyncio.get_running_loop().time()
        gauges: dict[str, Any] = {
            "queue_depth": {j: s.depth for j, s in self.senders.items()},
            "last_heard_age_s": {j: loop_now - t for j, t in self.last_heard.items()},
        }
        if node is not None:
            gauges["lag_rounds"] = node.lag(node.next_round)
            gauges["suspended"] = set(node.suspended)
        return render_prometheus(self.metrics, gauges)

    # ================================================================ control handlers

    def _identity(self) -> dict[str, Any]:
        return {"rank": self.rank, "run_id": self.options.settings.run_id,
                "config_hash": self.config_hash, "params_sha256": self.params_sha256}

    def _check_identity(self, sender: int, payload: dict[str, Any]) -> None:
        for key, ours in (("run_id", self.options.settings.run_id),
                          ("config_hash", self.config_hash),
                          ("params_sha256", self.params_sha256)):
            theirs = payload.get(key)
            if theirs != ours:
                what = {"run_id": "run id", "config_hash": "config hash",
                        "params_sha256": "initial-parameter hash"}[key]
                message = (f"refusing rank {sender}: its {what} {str(theirs)[:16]} differs from "
                           f"ours {ours[:16]}; start every rank from the same cluster file "
                           f"and the same flags")
                log.error(message)
                raise ControlError(409, message)

    def _on_hello(self, sender: int, payload: dict[str, Any]) -> dict[str, Any]:
        try:
            self._check_identity(sender, payload)
        except ControlError as error:
            if self.node is None:  # a peer of another config: this run cannot start
                self.join_error = error.reason
            raise
        compute = payload.get("compute_s")
        if isinstance(compute, int | float) and compute > 0:
            self.peer_compute_s[sender] = float(compute)
        if self.node is not None and self.state != "rejoining":
            self.heard(sender)
        return {**self._identity(), "compute_s": self.compute_measured_s, "state": self.state}

    def _on_rejoin_hello(self, sender: int, payload: dict[str, Any]) -> dict[str, Any]:
        self._check_identity(sender, payload)
        node = self.node
        if node is None or self.state in ("starting", "rejoining"):
            raise ControlError(503, self.state)
        if not isinstance(node, AkoWorker):
            raise ControlError(409, "rejoin exists for scheme ako only")
        # keep (not drop) its messages until it restarts, or gives up rejoining
        self.rejoining_peers[sender] = asyncio.get_running_loop().time()
        sender_queue = self.senders[sender]
        contiguous, pending = node.log.export()[sender]
        log.warning("rank %d is rejoining (we acknowledged-by it up to round %d, dropped up "
                    "to %d, hold its rounds up to %d)", sender, sender_queue.acked_round,
                    sender_queue.dropped_until, contiguous)
        return {**self._identity(), "state": self.state, "finished": node.finished,
                "round": node.next_round, "acked_by": sender_queue.acked_round,
                "dropped_until": sender_queue.dropped_until,
                "received": {"contiguous": contiguous, "pending": sorted(pending)},
                "p_of": list(node.p_of)}

    async def _on_snapshot(self, sender: int, payload: dict[str, Any]) -> bytes:
        node = self.node
        if not isinstance(node, AkoWorker) or self.state != "running" or node.finished:
            raise ControlError(409, f"rank {self.rank} cannot donate: state {self.state}")
        need_raw = payload.get("need", {})
        if not isinstance(need_raw, dict):
            raise ControlError(400, "need: expected {peer: round}")
        need = {int(j): int(r) for j, r in need_raw.items()
                if node.log.knows(int(j)) and int(j) != sender}

        def ready() -> bool:
            return all(int(node.log.contiguous[j]) >= r or j in node.suspended
                       for j, r in need.items())

        deadline = asyncio.get_running_loop().time() + max(30.0, 3 * self.options.peer_timeout_s)
        while not ready():
            if asyncio.get_running_loop().time() > deadline:
                raise ControlError(503, f"messages from {need} did not arrive in time")
            self.wake.clear()
            try:
                await asyncio.wait_for(self.wake.wait(), 0.1)
            except TimeoutError:
                pass
        if node.finished:
            raise ControlError(409, f"rank {self.rank} finished while waiting")
        snapshot = node.rejoin_snapshot(sender)
        log.warning("gave rank %d a rejoin snapshot at our round %d", sender, node.next_round)
        return control.pack_arrays(
            {"donor": self.rank, "log": log_to_json(snapshot.log), "round": node.next_round},
            {"params": snapshot.params, "correction": snapshot.correction})

    def _on_restart(self, sender: int, payload: dict[str, Any]) -> dict[str, Any]:
        node = self.node
        first_round = payload.get("first_round")
        if not isinstance(node, AkoWorker) or not isinstance(first_round, int):
            raise ControlError(400, "restart: expected {rank, first_round} for an ako run")
        node.peer_restarted(sender, first_round)
        self.rejoining_peers.pop(sender, None)
        self.done_peers.discard(sender)
        self.heard(sender)
        self.wake.set()
        log.warning("rank %d restarted: it continues from round %d", sender, first_round)
        return {"rank": self.rank}

    # ================================================================ liveness

    def heard(self, peer: int) -> None:
        """`peer` is alive: a message accepted, a send acknowledged or a heartbeat answered."""
        self.last_heard[peer] = asyncio.get_running_loop().time()
        node = self.node
        if node is not None and peer in node.suspended and not self._rejoining(peer):
            node.resume_peer(peer)
            log.warning("peer %d speaks again: back in the SSP gate", peer)
            self.wake.set()

    def _rejoining(self, peer: int) -> bool:
        """`peer` is between its rejoin-hello and its restart (and not given up on)."""
        since = self.rejoining_peers.get(peer)
        if since is None:
            return False
        limit_s = max(60.0, 4 * self.options.peer_timeout_s) + self.options.peer_timeout_s
        return asyncio.get_running_loop().time() - since < limit_s

    def suspend(self, peer: int, silent_s: float) -> None:
        node = self.node
        assert node is not None
        node.suspend_peer(peer)
        self.metrics.peer_timeouts += 1
        log.warning("peer %d silent for %.1f s (peer timeout %.1f s): suspended from the SSP "
                    "gate; messages to it stay owed", peer, silent_s, self.options.peer_timeout_s)
        self.senders[peer].notify()
        self.wake.set()

    async def monitor(self) -> None:
        """Suspend silent peers; heartbeat peers we have not heard from lately."""
        loop = asyncio.get_running_loop()
        timeout_s = self.options.peer_timeout_s
        start_s = loop.time()
        while True:
            await asyncio.sleep(min(0.5, timeout_s / 4))
            node = self.node
            if node is None:
                continue
            now = loop.time()
            for peer in self.peers:
                if peer in self.done_peers:
                    continue
                silent_s = now - self.last_heard.get(peer, start_s)
                if peer not in node.suspended and silent_s > timeout_s:
                    self.suspend(peer, silent_s)
                if silent_s > timeout_s / 3 and peer not in self._heartbeats:
                    self._heartbeats.add(peer)
                    task = asyncio.create_task(self._heartbeat(peer))
                    task.add_done_callback(self._heartbeat_done(peer))

    def _heartbeat_done(self, peer: int) -> Callable[[asyncio.Task[None]], None]:
        return lambda _task: self._heartbeats.discard(peer)

    async def _heartbeat(self, peer: int) -> None:
        answer = await self.control.call(peer, "heartbeat", {"rank": self.rank},
                                         timeout_s=max(1.0, self.options.peer_timeout_s / 3))
        if answer.ok:
            self.heard(peer)

    # ================================================================ sending

    def _make_senders(self) -> None:
        cfg = self.cfg
        shaper = None
        if self.options.emulate:
            net = cfg.network
            n = self.world
            uplink = float(net.uplink_bps(n)[self.rank])
            links = net.link_bps_matrix(n)[self.rank]
            latency = net.latency_matrix(n)[self.rank]
            shaper = LinkShaper(uplink, {j: float(links[j]) for j in self.peers},
                                {j: float(latency[j]) for j in self.peers})
            uplinks, into_me = net.uplink_bps(n), net.link_bps_matrix(n)[:, self.rank]
            self.downlink = DownlinkShaper(
                float(net.downlink_bps(n)[self.rank]),
                lambda j: min(float(uplinks[j]), float(into_me[j])))
        client_ssl: Any = self.options.tls.client_context() or True
        for peer in self.peers:
            sender = PeerSender(
                peer, self.base_urls[peer] + "/v1/partial", self.session,
                counters=self.metrics.peer(peer), maxsize=self.options.queue_messages,
                shaper=shaper, is_suspended=self._drop_ok(peer), on_delivered=self.heard,
                ssl=client_ssl, seed=self.rank * 1000 + peer)
            sender.start()
            self.senders[peer] = sender

    def _drop_ok(self, peer: int) -> Callable[[], bool]:
        def suspended() -> bool:
            node = self.node
            return node is not None and peer in node.suspended and not self._rejoining(peer)
        return suspended

    async def dispatch(self, sends: Sequence[Send]) -> None:
        """Encode each Send once and queue the same bytes to each destination."""
        keys = {"run_id": self.run_id, "config_hash": self._wire_hash, "secret": self.secret}
        for send in sends:
            message = send.message
            if message.nbytes >= ENCODE_IN_THREAD_BYTES:
                data = await asyncio.to_thread(encode_bytes, message, **keys)  # type: ignore
            else:
                data = encode_bytes(message, **keys)  # type: ignore[arg-type]
            out = Outgoing(data, message.kind, message.round, message.part, message.final,
                           asyncio.get_running_loop().time())
            # as akosim counts: bytes handed to the network during the rounds; what
            # node.finish owes (the final flush) separately
            queued = len(data) * len(send.dests)
            if self.state == "running":
                self.bytes_queued_rounds += queued
            else:
                self.bytes_queued_flush += queued
            for dest in send.dests:
                await self.senders[dest].put(out)

    # ================================================================ joining

    async def _greet(self, peer: int, name: str, payload: dict[str, Any],
                     what: str) -> dict[str, Any] | None:
        """One control call of a handshake: the answer, None to try again, or RunError
        when the peer refuses us for good (400/401/409)."""
        answer = await self.control.call(peer, name, payload, timeout_s=5.0)
        if answer.ok:
            return answer.payload  # type: ignore[no-any-return]
        if answer.status in (400, 401, 409):
            raise RunError(f"rank {peer} refused our {what} ({answer.status}): {answer.error}")
        return None

    async def _until(self, deadline_s: float, attempt: Callable[[], Any]) -> Any:
        loop = asyncio.get_running_loop()
        while True:
            result = await attempt()
            if result is not None or loop.time() > deadline_s:
                return result
            await asyncio.sleep(0.2)

    async def join(self) -> None:
        """Hello every rank (refusing mismatches), agree on p, build the node."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.options.join_timeout_s
        payload = {**self._identity(), "compute_s": self.compute_measured_s}

        async def hello(peer: int) -> dict[str, Any] | None:
            async def once() -> dict[str, Any] | None:
                if self.join_error is not None:
                    raise RunError(self.join_error)
                if self.stop_reason is not None:
                    raise Interrupted(f"{self.stop_reason} (before every rank said hello)")
                return await self._greet(peer, "hello", payload, "hello")
            return await self._until(deadline, once)  # type: ignore[no-any-return]

        answers = await asyncio.gather(*(hello(j) for j in self.peers))
        missing = [j for j, a in zip(self.peers, answers, strict=True) if a is None]
        if missing:
            where = ", ".join(f"{j} at {self.cfg.cluster.hosts[j]}" for j in missing)
            raise RunError(f"no hello answer within {self.options.join_timeout_s:g} s from "
                           f"rank(s) {where}: are they started with the same cluster file?")
        for peer, answer in zip(self.peers, answers, strict=True):
            assert answer is not None
            try:
                self._check_identity(peer, answer)
            except ControlError as error:
                raise RunError(error.reason) from None
            if isinstance(answer.get("compute_s"), int | float):
                self.peer_compute_s[peer] = float(answer["compute_s"])
        compute_s = None
        if self.compute_measured_s is not None:
            values = [self.compute_measured_s, *self.peer_compute_s.values()]
            compute_s = max(values)
        self._build_node(compute_s)
        now = loop.time()
        for peer in self.peers:
            self.last_heard[peer] = now
        self.state = "running"

    def _build_node(self, compute_s: float | None, p_of: Sequence[int] | None = None) -> None:
        workload = self.workload
        assert workload is not None
        cfg = self.cfg
        if p_of is not None:  # the run's p, as peers or the checkpoint report it
            cfg = replace_in(cfg, "exchange.p", list(p_of))
        try:
            self.plan = plan_node(cfg, gradient_bytes=workload.gradient_bytes,
                                  length=workload.param_count, compute_s=compute_s)
        except ValueError as error:
            raise RunError(f"cannot plan the exchange: {error}") from None
        optimizer = self.optimizer if self.optimizer is not None else \
            workload.optimizer(self.cfg.train.optimizer, self.cfg.train.lr)
        self.node = make_node(self.plan.spec, self.rank, workload.param_count,
                              workload.init_params, optimizer)
        self._wire_hash = wire_hash(self.cfg, self.params_sha256, self.plan.p_of)
        if self.plan.p_of is not None:
            detail = f"p = {list(self.plan.p_of)}"
            if compute_s is not None:
                detail += f" (auto, planned with compute {compute_s * 1e3:.2f} ms, bound by " \
                          f"{self.plan.bound_by[self.rank]})"
            log.info("%s", detail)

    async def rejoin(self) -> None:
        """--resume: rejoin the live run from a donor, or go on from the checkpoint alone."""
        self.state = "rejoining"
        loop = asyncio.get_running_loop()
        payload = self._identity()

        async def ask(peer: int) -> dict[str, Any] | None:
            async def once() -> dict[str, Any] | None:
                return await self._greet(peer, "rejoin-hello", payload, "rejoin")
            deadline = loop.time() + max(3.0, self.options.peer_timeout_s)
            return await self._until(deadline, once)  # type: ignore[no-any-return]

        replies = dict(zip(self.peers, await asyncio.gather(*(ask(j) for j in self.peers)),
                           strict=True))
        answered = {j: r for j, r in replies.items() if r is not None}
        live = {j: r for j, r in answered.items() if not r.get("finished")}
        if not live:
            if answered:
                raise RunError("every peer that answered has finished: the run is over, "
                               "nothing to rejoin")
            self._resume_alone()
            return
        p_values = {tuple(r["p_of"]) for r in live.values()}
        if len(p_values) != 1:
            raise RunError(f"live peers disagree on p: {sorted(p_values)}")
        p_of = next(iter(p_values))
        if self.checkpoint is not None and tuple(self.checkpoint.p_of) != p_of:
            raise RunError(f"checkpoint has p = {list(self.checkpoint.p_of)}, the run uses "
                           f"{list(p_of)}")
        self._build_node(None, p_of)
        node = self.node
        assert isinstance(node, AkoWorker)
        self._restore_optimizer()
        donor = max(live, key=lambda j: (live[j]["round"], -j))
        need = {str(j): max(int(r["acked_by"]), int(r["dropped_until"]))
                for j, r in live.items() if j != donor}
        log.warning("rejoining: donor rank %d (round %d), waiting for it to hold %s", donor,
                    live[donor]["round"], need)
        answer = await self.control.call(donor, "snapshot", {"rank": self.rank, "need": need},
                                         timeout_s=max(60.0, 4 * self.options.peer_timeout_s),
                                         binary=True)
        if not answer.ok:
            raise RunError(f"donor rank {donor} gave no snapshot ({answer.status}): "
                           f"{answer.error}")
        try:
            meta, arrays = control.unpack_arrays(answer.body)
            snapshot = RejoinSnapshot(int(meta["donor"]), arrays["params"],
                                      arrays["correction"], log_from_json(meta["log"]))
        except (ValueError, KeyError) as error:
            raise RunError(f"donor rank {donor} sent an unreadable snapshot: {error}") from None
        highest = -1
        for reply in answered.values():
            received = reply["received"]
            highest = max(highest, int(received["contiguous"]),
                          *(int(r) for r in received["pending"]))
        first_round = highest + 1
        node.adopt(snapshot, first_round)
        self.first_round = first_round
        self.metrics.round = first_round
        for peer in self.peers:
            if peer not in answered:
                node.suspend_peer(peer)
        await asyncio.gather(*(self._restart(peer, first_round) for peer in answered))
        now = loop.time()
        for peer in self.peers:
            self.last_heard[peer] = now
        self.state = "running"
        log.warning("rejoined from rank %d's snapshot: continuing at round %d", donor,
                    first_round)

    async def _restart(self, peer: int, first_round: int) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(5.0, self.options.peer_timeout_s)
        while True:
            answer = await self.control.call(peer, "restart",
                                             {"rank": self.rank, "first_round": first_round})
            if answer.ok:
                return
            if loop.time() > deadline:
                log.error("rank %d did not take our restart: %s", peer, answer.error)
                if self.node is not None:
                    self.node.suspend_peer(peer)
                return
            await asyncio.sleep(0.2)

    def _resume_alone(self) -> None:
        checkpoint = self.checkpoint
        if checkpoint is None:
            raise UsageError(f"--resume: no live peer answered and there is no checkpoint of "
                             f"rank {self.rank} in {self.options.checkpoint_dir}")
        self._build_node(None, checkpoint.p_of)
        node = self.node
        assert isinstance(node, AkoWorker)
        node.load_state(AkoState(checkpoint.rank, checkpoint.next_round, checkpoint.params,
                                 checkpoint.unsent, checkpoint.inbox, checkpoint.log,
                                 checkpoint.final_round))
        self._restore_optimizer()
        self.first_round = checkpoint.next_round
        self.metrics.round = checkpoint.next_round
        for peer in self.peers:
            node.suspend_peer(peer)
        self.state = "running"
        log.warning("no live peer: continuing from our checkpoint alone at round %d",
                    checkpoint.next_round)

    def _restore_optimizer(self) -> None:
        node = self.node
        if self.checkpoint is None or node is None or not self.checkpoint.optimizer_leaves:
            return
        try:
            node.replica.state = restore_optimizer_state(node.replica.state,
                                                         self.checkpoint.optimizer_leaves)
        except ValueError as error:
            log.warning("checkpoint optimizer state not used: %s", error)

    # ================================================================ training

    def request_stop(self, reason: str) -> None:
        if self.stop_reason is None:
            self.stop_reason = reason
            log.warning("stopping: %s", reason)
        self.wake.set()

    def _on_signal(self, name: str) -> None:
        self._signals += 1
        if self._signals > 1 or self.role == "ps" or self.state in ("finishing", "done"):
            self.hard_stop = True
            log.warning("%s: stopping now", name)
        self.request_stop(f"{name}: finish this round, flush, checkpoint, exit")

    def _should_stop(self, t: int) -> bool:
        train = self.cfg.train
        if self.stop_reason is not None:
            return True
        if train.rounds is not None and t >= train.rounds:
            self.stop_reason = "rounds"
            return True
        if train.duration_s is not None and self.train_start_s is not None:
            if asyncio.get_running_loop().time() - self.train_start_s >= train.duration_s:
                self.stop_reason = "duration"
                return True
        return False

    async def _gate(self, t: int) -> float | None:
        """Wait until the SSP gate lets round t start; seconds waited, None if stopped."""
        node = self.node
        assert node is not None
        loop = asyncio.get_running_loop()
        start_s = loop.time()
        next_report_s = start_s + max(5.0, self.options.peer_timeout_s / 2)
        while not node.may_start(t):
            if self.stop_reason is not None:
                return None
            self.wake.clear()
            try:
                await asyncio.wait_for(self.wake.wait(), 0.5)
            except TimeoutError:
                pass
            now = loop.time()
            if now > next_report_s:
                log.warning("round %d waits %.0f s on peer(s) %s", t, now - start_s,
                            node.waiting_on(t))
                next_report_s = now + max(5.0, self.options.peer_timeout_s / 2)
        return loop.time() - start_s

    async def _pause_hook(self, t: int) -> None:
        faults = self.options.faults
        if faults.pause_before_round == t and faults.pause_until_file:
            log.warning("test hook: paused before round %d until %s exists", t,
                        faults.pause_until_file)
            while not os.path.exists(faults.pause_until_file) and not self.hard_stop:
                await asyncio.sleep(0.05)

    async def _kill_hook(self, round_: int) -> None:
        if self.options.faults.kill_after_round != round_:
            return
        node = self.node
        assert node is not None
        for peer, sender in self.senders.items():
            await sender.wait(self._acked(sender, peer, round_))
        log.warning("test hook: SIGKILL after round %d (all its sends acknowledged)", round_)
        for handler in logging.getLogger().handlers:
            handler.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    def _acked(self, sender: PeerSender, peer: int, round_: int) -> Callable[[], bool]:
        node = self.node
        assert node is not None
        return lambda: sender.acked_through >= round_ or peer in node.suspended

    def _flushed(self, sender: PeerSender, peer: int) -> Callable[[], bool]:
        node = self.node
        assert node is not None
        return lambda: sender.idle or peer in node.suspended or self.hard_stop

    async def train(self) -> None:
        node = self.node
        workload = self.workload
        assert node is not None and workload is not None
        loop = asyncio.get_running_loop()
        t = node.next_round
        batches = workload.batches(self.rank, self.training_workers)
        batches.skip(t)
        seed_base = self.cfg.train.seed * 1_000_003 + self.rank * 10_007
        self.train_start_s = loop.time()
        eval_every = self.cfg.train.eval_every
        checkpoint_every = self.options.checkpoint_every
        while not self._should_stop(t):
            await self._pause_hook(t)
            waited_s = await self._gate(t)
            if waited_s is None:
                break
            batch = batches.next()
            params = np.array(node.params, copy=True)
            compute_start_s = time.perf_counter()
            loss, grad = await asyncio.to_thread(workload.grad_step, params, batch.x, batch.y,
                                                 seed_base + t)
            compute_s = time.perf_counter() - compute_start_s
            send_start_s = loop.time()
            await self.dispatch(node.local_step(t, grad))
            self.metrics.send_block_s += loop.time() - send_start_s
            t += 1
            self.times.add(loop.time() - self.train_start_s, compute_s, waited_s)
            self.metrics.round = t
            self.metrics.loss = loss
            self.metrics.compute_s += compute_s
            self.metrics.wait_s += waited_s
            await self._kill_hook(t - 1)
            if self.options.faults.sleep_per_round_s > 0:
                await asyncio.sleep(self.options.faults.sleep_per_round_s)
            if t % eval_every == 0 and not self._eval_running:
                self._start_eval(t, self.times.end_s[-1])
            if checkpoint_every and t % checkpoint_every == 0:
                await self.write_checkpoint()
        self.rounds_done = t

    def _start_eval(self, round_: int, round_end_s: float) -> None:
        """Evaluate a copy of the replica in the eval thread, off the training path.

        The record carries `round_end_s`, the end of the evaluated round since the
        start of training (the accuracy is that round's), not when the evaluation
        finished.
        """
        node = self.node
        workload = self.workload
        assert node is not None and workload is not None and node.params is not None
        params = np.array(node.params, copy=True)
        self._eval_running = True
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._eval_pool, workload.evaluate, params)

        def done(fut: asyncio.Future[float]) -> None:
            self._eval_running = False
            if fut.cancelled() or fut.exception() is not None:
                return
            accuracy = float(fut.result())
            self.metrics.evaluations.append((round_end_s, round_, accuracy))
            self.metrics.accuracy = accuracy
            target = self.cfg.train.target_accuracy
            if target is not None and accuracy >= target and self.stop_reason is None:
                self.request_stop(f"target accuracy {target} reached ({accuracy:.4f} at round "
                                  f"{round_})")
                for peer in self.peers:
                    self._tasks.append(asyncio.create_task(
                        self.control.call(peer, "stop", {"rank": self.rank, "round": round_})))

        future.add_done_callback(done)

    # ================================================================ checkpoints

    def _checkpoint_now(self) -> Checkpoint | None:
        node = self.node
        if node is None or node.params is None or self.options.checkpoint_dir is None:
            return None
        common: dict[str, Any] = {
            "rank": self.rank, "run_id": self.options.settings.run_id,
            "config_hash": self.config_hash, "scheme": self.cfg.exchange.scheme,
            "p_of": tuple(self.plan.p_of) if self.plan and self.plan.p_of else (),
            "optimizer_leaves": optimizer_leaves(node.replica.state),
            "written_unix_s": time.time(),
        }
        if isinstance(node, AkoWorker):
            state = node.state()
            assert state.params is not None
            return Checkpoint(next_round=state.next_round, params=state.params,
                              unsent=state.unsent, inbox=state.inbox, log=state.log,
                              final_round=state.final_round, **common)
        return Checkpoint(next_round=node.next_round, params=node.params.copy(), **common)

    async def write_checkpoint(self) -> None:
        checkpoint = self._checkpoint_now()
        if checkpoint is None:
            return
        directory = self.options.checkpoint_dir
        assert directory is not None
        await asyncio.to_thread(save_checkpoint, directory, checkpoint)

    # ================================================================ finishing

    async def _wait(self, done: Callable[[], bool], timeout_s: float | None = None) -> bool:
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        while not done():
            if self.hard_stop or (deadline is not None and loop.time() > deadline):
                return False
            self.wake.clear()
            try:
                await asyncio.wait_for(self.wake.wait(), 0.25)
            except TimeoutError:
                pass
        return True

    async def finish(self) -> None:
        node = self.node
        assert node is not None
        self.state = "finishing"
        if node.is_worker:
            await self.dispatch(node.finish(self.rounds_done))
        drained = await self._wait(node.drained)
        for peer, sender in self.senders.items():
            await sender.wait(self._flushed(sender, peer))
        node.settle()
        self.state = "done"
        if not drained:
            log.warning("stopped before every peer's last message arrived")
        await self.write_checkpoint()
        if node.is_worker and node.params is not None and self.workload is not None:
            self.final_accuracy = await asyncio.get_running_loop().run_in_executor(
                self._eval_pool, self.workload.evaluate, np.array(node.params, copy=True))
            self.metrics.accuracy = self.final_accuracy
        self.write_results()
        await asyncio.gather(*(self.control.call(j, "done", {"rank": self.rank}, timeout_s=2.0)
                               for j in self.peers if j not in node.suspended))
        grace_s = self.options.grace_s if self.options.grace_s is not None \
            else self.options.peer_timeout_s
        await self._wait(lambda: all(j in self.done_peers or j in node.suspended
                                     for j in self.peers), grace_s)

    def result(self) -> dict[str, Any]:
        node = self.node
        metrics = self.metrics
        times = self.times
        p_of = self.plan.p_of if self.plan is not None else None
        loop_now = asyncio.get_running_loop().time()
        wall_s = (loop_now - self.train_start_s) if self.train_start_s is not None else 0.0
        rounds = len(times.end_s)
        summary = worker_summary(
            scheme=self.cfg.exchange.scheme, p_of=p_of, ssp=self.cfg.exchange.ssp,
            workers=self.world, training_workers=self.training_workers,
            batch_size=self.cfg.train.batch_size, round_end_s=times.end_s,
            compute_s=times.compute_s, wait_s=times.wait_s, overhead_s=times.overhead_s,
            bytes_sent=self.bytes_queued_rounds, bytes_flush=self.bytes_queued_flush)
        return {
            "rank": self.rank,
            "role": self.role,
            **summary,
            "training_workers": self.training_workers,
            "batch_size": self.cfg.train.batch_size,
            "rounds": rounds,
            "first_round": self.first_round,
            "next_round": node.next_round if node is not None else 0,
            "stop_reason": self.stop_reason,
            "wall_s": wall_s,
            "process_wall_s": time.perf_counter() - self.wall_start_s,
            "compute_s": metrics.compute_s,
            "wait_s": metrics.wait_s,
            "send_block_s": metrics.send_block_s,
            "compute_s_measured": self.compute_measured_s,
            "p_auto_compute_s": self.plan.compute_s if self.plan is not None else None,
            "warmup_s": self.warmup_s,
            "bytes_sent": metrics.bytes_sent,
            "bytes_received": metrics.bytes_received,
            "retries": metrics.retries,
            "duplicates_dropped": metrics.duplicates_dropped,
            "rejected": dict(metrics.rejected),
            "send_dropped": {str(j): dict(c.send_dropped) for j, c in metrics.peers.items()
                             if c.send_dropped},
            "undelivered": {str(j): s.depth for j, s in self.senders.items() if s.depth},
            "peer_timeouts": metrics.peer_timeouts,
            "suspended_at_end": sorted(node.suspended) if node is not None else [],
            "evaluations": [list(e) for e in metrics.evaluations],
            "final_accuracy": self.final_accuracy,
            "final_loss": metrics.loss,
            "params_sha256": params_digest(node.params)
            if node is not None and node.params is not None else None,
            "run_id": self.options.settings.run_id,
            "config_hash": self.config_hash,
            "round_end_s": times.end_s,
            "round_compute_s": times.compute_s,
            "round_wait_s": times.wait_s,
            "round_overhead_s": times.overhead_s,
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "model_bytes": self.workload.gradient_bytes if self.workload is not None else None,
            "peers": metrics.as_dict()["peers"],
            "message_overhead_s": metrics.message_overhead_s(),
            "config": config_to_dict(self.cfg),
        }

    def write_results(self) -> None:
        out = self.options.out_dir
        node = self.node
        self.result_cache = self.result()
        if out is None or node is None:
            return
        out.mkdir(parents=True, exist_ok=True)
        write_json(out / f"worker-{self.rank}.json", self.result_cache)
        if node.params is not None:
            offset = getattr(node, "start", 0) if self.role == "ps" else 0
            tmp = out / f".worker-{self.rank}.npz.tmp"
            with open(tmp, "wb") as handle:
                np.savez(handle, params=np.asarray(node.params, dtype=np.float32),
                         offset=np.array(offset))
            os.replace(tmp, out / f"worker-{self.rank}.npz")

    # ================================================================ progress

    async def progress(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.options.progress_every_s)
            node = self.node
            if node is None:
                continue
            self.metrics.state = self.state
            t = node.next_round
            log.info("%s", self._progress.line(loop.time(), self.metrics, node.lag(t),
                                               node.waiting_on(t), node.suspended))

    # ================================================================ main

    async def run(self) -> None:
        """The whole life of the process (after prepare)."""
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self._on_signal, signal.Signals(signum).name)
        self.session = make_session(peers=len(self.peers))
        self.control = ControlClient(self.session, self.secret, self.base_urls,
                                     ssl_context=self.options.tls.client_context())
        self.server = Server(self, max_concurrent_reads=max(4, 3 * len(self.peers)))
        host, port = self.endpoints[self.rank]
        listen = self.options.listen_host or host
        try:
            await self.server.start(listen, port, self.options.tls.server_context())
            self._make_senders()
            if self.options.resume:
                await self.rejoin()
            else:
                await self.join()
            self.metrics.state = self.state
            self._tasks.append(asyncio.create_task(self.monitor(), name="monitor"))
            if not self.options.quiet:
                self._tasks.append(asyncio.create_task(self.progress(), name="progress"))
            node = self.node
            assert node is not None
            if node.is_worker:
                await self.train()
            await self.finish()
            log.info("done: %d rounds, stop: %s", len(self.times.end_s), self.stop_reason)
        finally:
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            for sender in self.senders.values():
                await sender.stop()
            await self.session.close()
            await self.server.close()
            self._eval_pool.shutdown(wait=False, cancel_futures=True)


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def summary_line(result: dict[str, Any]) -> str:
    """One human line for the end of a run."""
    round_time = result.get("round_time_s")
    accuracy = result.get("final_accuracy")
    parts = [f"rank {result['rank']} ({result['role']})", f"{result['rounds']} rounds"]
    if isinstance(round_time, float) and math.isfinite(round_time):
        parts.append(f"{round_time * 1e3:.2f} ms/round")
    if accuracy is not None:
        parts.append(f"accuracy {accuracy:.4f}")
    parts.append(f"sent {result['bytes_sent'] / 1e6:.2f} MB")
    return ", ".join(parts)
