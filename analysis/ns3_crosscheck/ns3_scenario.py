"""The traffic patterns of the cross-check, as plain data both simulators read.

A `Pattern` is a star network (`Star`: n hosts, each on its own link of
`rate_bps` to one router) and a dependency graph of messages (`Message`): a
message is sent `gap_s` after the last of the messages it waits for (`after`)
has arrived at its sender, or at `gap_s` when it waits for none. That one rule
expresses the three patterns:

- `all_to_all`: every host sends `message_bytes` to every other host at t = 0
  (one round; docs/design/fidelity-references.md's peer-simulator check).
- `ako_rounds`: each of n workers sends one partition (gradient_bytes / p) to
  each of its n - 1 peers per round; with staleness 0 a worker sends its round
  t + 1 partitions `compute_s` after it has received all of round t's.
- `parameter_server`: n workers push a full gradient to one server (host n);
  the server replies with the full model to each worker once every push of the
  round has arrived; a worker pushes again `compute_s` after its reply.

Latency: `latency_s` is the one-way host-to-host latency (akosim's
`NetworkSpec.latency_s[i, j]`); in ns-3 each of the two links on a path has
half of it.
"""

from __future__ import annotations

from dataclasses import dataclass

FAMILIES = ("all-to-all", "ako", "ps")


@dataclass(frozen=True)
class Star:
    """n hosts, each on a full-duplex link of `rate_bps` to one router."""

    hosts: int
    rate_bps: float
    latency_s: float


@dataclass(frozen=True)
class Message:
    """`size_bytes` from `src` to `dst`, sent `gap_s` after the messages in
    `after` (indices into the pattern's messages) have all arrived."""

    src: int
    dst: int
    size_bytes: float
    round_index: int
    after: tuple[int, ...] = ()
    gap_s: float = 0.0


@dataclass(frozen=True)
class Pattern:
    """One scenario: a network, its messages, and what one round costs in compute."""

    family: str
    name: str
    star: Star
    messages: tuple[Message, ...]
    rounds: int
    compute_s: float
    size_bytes: float  # per message (all-to-all) or per full gradient (ako, ps)
    partitions: int = 1  # Ako's p

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"Pattern.family must be one of {FAMILIES}, got {self.family!r}")
        for index, message in enumerate(self.messages):
            if not (0 <= message.src < self.star.hosts and 0 <= message.dst < self.star.hosts):
                raise ValueError(f"message {index} names a host outside 0..{self.star.hosts - 1}")
            if message.src == message.dst:
                raise ValueError(f"message {index} is sent from host {message.src} to itself")
            if any(not 0 <= before < index for before in message.after):
                raise ValueError(f"message {index} waits for a message that does not precede it")

    def network_s(self, makespan_s: float) -> float:
        """Mean network time per round: the makespan less the compute on the
        critical path (every pattern here computes `compute_s` once per round)."""
        return (makespan_s - self.rounds * self.compute_s) / self.rounds


def _mb(size_bytes: float) -> str:
    return f"{size_bytes / 1e6:g}MB"


def _mbps(rate_bps: float) -> str:
    return f"{rate_bps / 1e6:g}Mbps"


def _ms(latency_s: float) -> str:
    return f"{latency_s * 1e3:g}ms"


def all_to_all(hosts: int, rate_bps: float, message_bytes: float, latency_s: float) -> Pattern:
    """One all-to-all round: every host sends `message_bytes` to every other at t = 0."""
    messages = tuple(Message(src, dst, message_bytes, 0)
                     for src in range(hosts) for dst in range(hosts) if src != dst)
    name = f"a2a-n{hosts}-{_mbps(rate_bps)}-{_mb(message_bytes)}-{_ms(latency_s)}"
    return Pattern("all-to-all", name, Star(hosts, rate_bps, latency_s), messages, 1, 0.0,
                   message_bytes)


def ako_rounds(workers: int, rate_bps: float, gradient_bytes: float, partitions: int,
               rounds: int, compute_s: float, latency_s: float) -> Pattern:
    """Ako at staleness 0: per round each worker sends gradient_bytes / partitions
    to each peer, `compute_s` after it received every partition of the last round."""
    if partitions < 1 or rounds < 1:
        raise ValueError("ako_rounds needs partitions >= 1 and rounds >= 1")
    size = gradient_bytes / partitions
    messages: list[Message] = []
    incoming: dict[int, tuple[int, ...]] = {w: () for w in range(workers)}
    for round_index in range(rounds):
        this_round: dict[int, list[int]] = {w: [] for w in range(workers)}
        for src in range(workers):
            for dst in range(workers):
                if src == dst:
                    continue
                this_round[dst].append(len(messages))
                messages.append(Message(src, dst, size, round_index, incoming[src], compute_s))
        incoming = {w: tuple(ids) for w, ids in this_round.items()}
    name = (f"ako-n{workers}-{_mbps(rate_bps)}-{_mb(gradient_bytes)}-p{partitions}"
            f"-{_ms(latency_s)}")
    return Pattern("ako", name, Star(workers, rate_bps, latency_s), tuple(messages), rounds,
                   compute_s, gradient_bytes, partitions)


def parameter_server(workers: int, rate_bps: float, gradient_bytes: float, rounds: int,
                     compute_s: float, latency_s: float) -> Pattern:
    """Synchronous parameter server: host `workers` is the server; workers push
    a full gradient, the server replies with the full model once all pushes arrived."""
    if rounds < 1:
        raise ValueError("parameter_server needs rounds >= 1")
    server = workers
    messages: list[Message] = []
    replies: dict[int, tuple[int, ...]] = {w: () for w in range(workers)}
    for round_index in range(rounds):
        pushes = []
        for worker in range(workers):
            pushes.append(len(messages))
            messages.append(Message(worker, server, gradient_bytes, round_index,
                                    replies[worker], compute_s))
        for worker in range(workers):
            replies[worker] = (len(messages),)
            messages.append(Message(server, worker, gradient_bytes, round_index, tuple(pushes)))
    name = f"ps-n{workers}-{_mbps(rate_bps)}-{_mb(gradient_bytes)}-{_ms(latency_s)}"
    return Pattern("ps", name, Star(workers + 1, rate_bps, latency_s), tuple(messages), rounds,
                   compute_s, gradient_bytes)
