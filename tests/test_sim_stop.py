"""akosim's training stops as akorun's do: a stop by time ends every worker after the same
round count, the most any worker had begun when the time ran out (akorun.runtime.lifecycle.stopping
agrees that count over the wire; akosim.sim.engine decides it in one place)."""

from __future__ import annotations

import akosim


def _rounds(run: object) -> list[int]:
    return [worker.rounds for worker in run.per_worker]  # type: ignore[attr-defined]


def test_a_duration_ends_every_ako_worker_after_the_same_rounds() -> None:
    # heterogeneous speeds and s = 4: the fast workers run ahead; a stop each worker took
    # alone left the slowest 4 rounds short (40 of 44) where akorun's agreement runs them
    run = akosim.train(workers=3, scheme="ako", p=2, ssp=4, speeds="1,0.5,0.3",
                       duration="0.2s", workload="digits-mlp", compute="5ms",
                       bandwidth="1gbps", quiet=True)
    rounds = _rounds(run)
    assert len(set(rounds)) == 1 and rounds[0] > 4, rounds


def test_a_duration_ends_a_lockstep_scheme_with_uneven_workers() -> None:
    # a ring all-reduce cannot end a worker a round before its peers: they would wait for
    # its part of that round forever
    for speeds in ("1,1.3,1.7", "1.7,1,1"):
        run = akosim.train(workers=3, scheme="allreduce", speeds=speeds, duration="0.2s",
                           workload="digits-mlp", compute="7ms", bandwidth="100mbps",
                           latency="2ms", quiet=True)
        rounds = _rounds(run)
        assert len(set(rounds)) == 1 and rounds[0] > 1, (speeds, rounds)
