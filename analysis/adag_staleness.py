"""Why ADAG collapses in the experiments matrix: local steps under a growing backlog.

Drives the real scheme nodes (akocore.schemes, `--scheme adag` or `downpour`
settings) in lockstep rounds with every message delivered a fixed number of
rounds after it was sent: the backlog an overloaded link builds up (the
matrix's akosim runs report max_lag_rounds 828-4433, akorun on the WANs
fetches ~350 rounds late). No network, no clock: the same numbers on every
machine. Prints the centre's test accuracy along the run for each optimizer
and delay, so Adam and SGD can be compared side by side.

    python -m analysis.adag_staleness [--rounds 1200] [--delays 0,64,256]
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import numpy as np

from akocore.schemes import SchemeSpec, build_nodes
from akocore.workloads.flat import build_workload

OPTIMIZERS = {"adam": 0.001, "sgd": 0.1, "adagrad": 0.05}


def centre_curve(*, optimizer: str, lr: float, delay_rounds: int, rounds: int,
                 workers: int = 2, workload: str = "digits-mlp", push_average: bool = True,
                 push_every: int = 4, fetch_every: int = 4, staleness: float = float("inf"),
                 eval_every: int = 100, seed: int = 0) -> list[tuple[int, float]]:
    """(round, centre accuracy) of an async local-step ps run whose messages all
    arrive `delay_rounds` rounds after the next one (the gate, if finite, holds a worker back)."""
    work = build_workload(workload, batch_size=104, seed=seed)
    spec = SchemeSpec("ps", workers + 1, ps_servers=1, ps_mode="async", staleness=staleness,
                      push_every=push_every, fetch_every=fetch_every, local_steps=True,
                      push_average=push_average)
    nodes = build_nodes(spec, work.param_count, work.init_params,
                        work.optimizer(optimizer, lr))
    streams = [work.batches(w, workers) for w in range(workers)]
    in_flight: dict[int, list] = defaultdict(list)  # arrival round -> sends
    done = [0] * workers
    curve = []
    for now in range(rounds + 2 * delay_rounds + 3):
        for send in in_flight.pop(now, []):
            for dest in send.dests:
                for effect in nodes[dest].receive(send.message).effects:
                    in_flight[now + 1 + delay_rounds].append(effect)
        for w in range(workers):
            if done[w] < rounds and nodes[w].may_start(done[w]):
                batch = streams[w].next()
                params = nodes[w].params
                assert params is not None
                _, grad = work.grad_step(params, batch.x, batch.y, done[w])
                for send in nodes[w].local_step(done[w], np.array(grad, np.float32)):
                    in_flight[now + 1 + delay_rounds].append(send)
                done[w] += 1
        centre = nodes[workers].params
        if now % eval_every == 0 and now <= rounds and centre is not None:
            curve.append((now, work.evaluate(centre)))
    return curve


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1200)
    parser.add_argument("--delays", default="0,64,256")
    parser.add_argument("--optimizers", default="adam,sgd,adagrad")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--downpour", action="store_true", help="push the sum (no / lambda)")
    parser.add_argument("--ssp", type=float, default=float("inf"))
    args = parser.parse_args(argv)
    for name in args.optimizers.split(","):
        for delay in (int(d) for d in args.delays.split(",")):
            curve = centre_curve(optimizer=name, lr=OPTIMIZERS[name], delay_rounds=delay,
                                 rounds=args.rounds, workers=args.workers,
                                 push_average=not args.downpour, staleness=args.ssp)
            points = " ".join(f"{r}:{acc * 100:.1f}" for r, acc in curve)
            print(f"{name:8s} lr={OPTIMIZERS[name]:<6g} delay={delay:4d} n={args.workers} "
                  f"{'downpour' if args.downpour else 'adag'} ssp={args.ssp:g}  {points}",
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
