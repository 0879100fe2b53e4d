"""A randomised in-memory network that drives akocore scheme nodes.

Messages in flight are delivered in random order (any delay, any reordering)
and may be delivered twice (a retried send). Workers start rounds whenever
their SSP gate allows. Used by the property tests to check the invariants
both shells rely on.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np

from akocore.messages import Partial, Send
from akocore.schemes import SchemeNode


class Deadlock(AssertionError):
    pass


@dataclass
class RunLog:
    gradients: dict[int, list[np.ndarray]] = field(default_factory=dict)
    # (worker, round started, {peer: peer's next_round at that moment})
    starts: list[tuple[int, int, dict[int, int]]] = field(default_factory=list)
    deliveries: int = 0
    duplicates_sent: int = 0
    duplicates_dropped: int = 0


def drive(nodes: list[SchemeNode], rounds: dict[int, int], *, seed: int, length: int,
          duplicate_prob: float = 0.1, grad_scale: float = 1.0,
          max_steps: int = 1_000_000) -> RunLog:
    """Run every worker for rounds[rank] rounds, then drain and settle."""
    rng = random.Random(seed)
    grad_rng = np.random.default_rng(seed)
    log = RunLog({r: [] for r in rounds})
    in_flight: list[tuple[int, Partial]] = []

    def post(effects: list[Send] | tuple[Send, ...]) -> None:
        for send in effects:
            for dest in send.dests:
                in_flight.append((dest, send.message))

    done_rounds = {r: 0 for r in rounds}
    for _ in range(max_steps):
        actions: list[tuple[str, int]] = []
        for rank, total in rounds.items():
            node = nodes[rank]
            if node.finished:
                continue
            t = done_rounds[rank]
            if t == total:
                actions.append(("finish", rank))
            elif node.may_start(t):
                actions.append(("step", rank))
        actions.extend(("deliver", i) for i in range(len(in_flight)))
        if not actions:
            break
        kind, arg = rng.choice(actions)
        if kind == "step":
            node, t = nodes[arg], done_rounds[arg]
            log.starts.append((arg, t, {j: done_rounds[j] for j in rounds
                                        if j != arg and not nodes[j].finished}))
            grad = None
            if node.params is not None:
                grad = (grad_rng.integers(-8, 9, length) * grad_scale / 8).astype(np.float32)
                log.gradients[arg].append(grad)
            post(node.local_step(t, grad))
            done_rounds[arg] = t + 1
        elif kind == "finish":
            post(nodes[arg].finish(done_rounds[arg]))
        else:
            index = arg
            dest, msg = in_flight[index]
            if rng.random() < duplicate_prob:
                log.duplicates_sent += 1
            else:
                in_flight[index] = in_flight[-1]
                in_flight.pop()
            receipt = nodes[dest].receive(msg)
            log.deliveries += 1
            if not receipt.accepted:
                log.duplicates_dropped += 1
            post(receipt.effects)
    else:
        raise AssertionError("harness did not converge")
    stuck = [n.rank for n in nodes if not n.drained()]
    if stuck or any(not nodes[r].finished for r in rounds):
        raise Deadlock(f"nodes {stuck} not drained; rounds done {done_rounds}")
    for node in nodes:
        node.settle()
    return log
