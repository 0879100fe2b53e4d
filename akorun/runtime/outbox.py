"""Everything this rank sends as partials: one PeerSender per peer, the emulated links, the
encoding and the byte counters.

`Outbox.dispatch` encodes each Send once (with the rank's `Signer`; big
messages off the loop) and queues the same bytes to every destination. It
counts the bytes handed to the network as akosim does: during the rounds
(`bytes_queued_rounds`) and after them, for the final flush of ``node.finish``
(`bytes_queued_flush`). On an emulated network the senders pace through one
`LinkShaper` (this rank's uplink and links) and the server admits incoming
messages through `downlink` (this rank's NIC).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import aiohttp

from akocore.messages import Partial, Send
from akocore.schemes import SchemeNode
from akocore.settings.schema import RunConfig
from akorun.metrics import Metrics, timed_call
from akorun.transport.emulated_links import DownlinkShaper, LinkShaper
from akorun.transport.keys import PARTIAL_PATH, PartialSealer, Signer
from akorun.transport.sender import Outgoing, PeerSender

ENCODE_IN_THREAD_BYTES = 1 << 20  # encode (BLAKE3 digest) bigger messages off the loop


def emulated_links(cfg: RunConfig, rank: int,
                   peers: Sequence[int]) -> tuple[LinkShaper, DownlinkShaper]:
    """This rank's emulated uplink and links out, and its emulated NIC in."""
    net = cfg.network
    n = cfg.cluster.workers
    uplink = float(net.uplink_bps(n)[rank])
    links = net.link_bps_matrix(n)[rank]
    latency = net.latency_matrix(n)[rank]
    shaper = LinkShaper(uplink, {j: float(links[j]) for j in peers},
                        {j: float(latency[j]) for j in peers})
    uplinks, into_me = net.uplink_bps(n), net.link_bps_matrix(n)[:, rank]
    downlink = DownlinkShaper(float(net.downlink_bps(n)[rank]),
                              lambda j: min(float(uplinks[j]), float(into_me[j])))
    return shaper, downlink


class Outbox:
    """The senders of one rank and what was handed to them."""

    def __init__(self, *, signer: Signer, metrics: Metrics,
                 running: Callable[[], bool], rounds_done: Callable[[], int]) -> None:
        self.signer = signer
        self.metrics = metrics
        self.running = running  # are the rounds still going?
        self.rounds_done = rounds_done  # how many rounds ran, once they ended
        self.senders: dict[int, PeerSender] = {}
        self.bytes_queued_rounds = 0  # bytes handed to the senders during the rounds
        self.bytes_queued_flush = 0  # ... after them (node.finish, the final flush)
        self.only_to: dict[int, int] = {}  # round -> its one destination (a fault test hook)

    def start(self, *, rank: int, peer_urls: dict[int, str], session: aiohttp.ClientSession,
              shaper: LinkShaper | None, queue_messages: int, ssl: Any,
              may_drop: Callable[[int], bool], on_delivered: Callable[[int], None]) -> None:
        """One started sender per peer (`peer_urls`: peer -> its partial URL)."""
        for peer, url in peer_urls.items():
            sender = PeerSender(
                peer, url, session, counters=self.metrics.peer(peer), maxsize=queue_messages,
                shaper=shaper, is_suspended=_bound(may_drop, peer), on_delivered=on_delivered,
                ssl=ssl, seed=rank * 1000 + peer, encode=self.signer.encode,
                sealer=PartialSealer(self.signer, PARTIAL_PATH))
            sender.start()
            self.senders[peer] = sender

    def in_rounds(self, message: Partial) -> bool:
        """A message counts as the rounds' traffic while they run, and after them when it
        belongs to a round that ran (a sync's mean leaving after the last round), as
        akosim counts it; what finish owes (ako's flush, the final markers) does not."""
        return self.running() or (not message.final and message.round < self.rounds_done())

    async def send_due(self, node: SchemeNode | None) -> None:
        """Send what `node` owes since a peer was suspended (SchemeNode.take_effects)."""
        due = [] if node is None else node.take_effects()
        if due:
            await self.dispatch(due)

    async def dispatch(self, sends: Sequence[Send]) -> None:
        """Encode each Send once and queue the same bytes to each destination."""
        for send in sends:
            message = send.message
            if message.nbytes >= ENCODE_IN_THREAD_BYTES:
                data, encode_s = await asyncio.to_thread(timed_call, self.signer.encode,
                                                         message)
            else:
                data, encode_s = timed_call(self.signer.encode, message)
            self.metrics.encode_s += encode_s  # software cost, per message sent
            out = Outgoing(data, message.kind, message.round, message.part, message.final,
                           asyncio.get_running_loop().time(), message)
            # as akosim counts: bytes handed to the network during the rounds; what
            # node.finish owes (the final flush) separately
            queued = len(data) * len(send.dests)
            if self.in_rounds(message):  # else what finish owes: the final flush
                self.bytes_queued_rounds += queued
            else:
                self.bytes_queued_flush += queued
            for dest in send.dests:
                if self.only_to.get(message.round, dest) == dest:
                    await self.senders[dest].put(out)

    def notify(self, peer: int) -> None:
        sender = self.senders.get(peer)
        if sender is not None:
            sender.notify()

    async def wait_acked(self, round_: int, gone: Callable[[int], bool]) -> None:
        """Until every peer acknowledged every message through `round_` (or is `gone`);
        a peer owed nothing has (a round that sent it nothing, as most of DiLoCo's)."""
        for peer, sender in self.senders.items():
            await sender.wait(_acked(sender, peer, round_, gone))

    async def flush(self, gone: Callable[[int], bool], give_up: Callable[[], bool]) -> None:
        """Until every queue is empty (a `gone` peer's, or all on `give_up`, excepted)."""
        for peer, sender in self.senders.items():
            await sender.wait(_flushed(sender, peer, gone, give_up))

    def depths(self) -> dict[int, int]:
        return {j: s.depth for j, s in self.senders.items()}

    def acked_rounds(self) -> dict[int, int]:
        return {j: s.acked_round for j, s in self.senders.items()}

    async def stop(self) -> None:
        for sender in self.senders.values():
            await sender.stop()


def _bound(may_drop: Callable[[int], bool], peer: int) -> Callable[[], bool]:
    return lambda: may_drop(peer)


def _acked(sender: PeerSender, peer: int, round_: int,
           gone: Callable[[int], bool]) -> Callable[[], bool]:
    return lambda: sender.acked_through >= round_ or sender.idle or gone(peer)


def _flushed(sender: PeerSender, peer: int, gone: Callable[[int], bool],
             give_up: Callable[[], bool]) -> Callable[[], bool]:
    return lambda: sender.idle or gone(peer) or give_up()
