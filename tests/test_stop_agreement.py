"""Every stop rule ends every scheme together: a run stopped by time has its training ranks
agree on the last round (akorun.runtime.lifecycle.stopping), for ako, ps, all-reduce and wagma.

Each scheme runs on loopback with a duration limit and a per-rank pause that makes
the ranks reach the limit at different moments (rank 0's rounds are slower); every
rank must exit 0 with the same number of rounds and no rank may wait for a peer
that stopped a round earlier. The agreement itself is tested without processes.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from akorun.runtime.lifecycle.stopping import StopAgreement
from akorun.runtime.liveness.waiting import Waiter
from akorun.testing import REPO_ROOT, akorun_command, child_test_env
from akorun.transport.client import ControlAnswer
from akorun.transport.control import ControlKind

pytestmark = pytest.mark.timeout(200)


class Peers:
    """Control calls answered by scripted counts (`counts[peer]`, None: unreachable)."""

    def __init__(self, counts: dict[int, int | None]) -> None:
        self.counts = counts
        self.told: list[tuple[int, dict[str, Any]]] = []

    async def call(self, rank: int, kind: ControlKind, payload: dict[str, Any], *,
                   timeout_s: float = 10.0, binary: bool = False) -> ControlAnswer:
        assert kind is ControlKind.STOP
        self.told.append((rank, payload))
        await asyncio.sleep(0)
        count = self.counts.get(rank)
        if count is None:
            return ControlAnswer(0, error="unreachable")
        return ControlAnswer(200, {"rank": rank, "rounds": count})


def agree(counts: dict[int, int | None], started: int, gone: set[int]) -> tuple[int | None,
                                                                               Peers]:
    async def main() -> tuple[int | None, Peers]:
        peers = Peers(counts)
        tasks: list[asyncio.Task[Any]] = []
        waiter = Waiter(report_every_s=5.0)
        waiter.request_stop("duration")
        agreement = StopAgreement(rank=0, training_peers=sorted(counts), waiter=waiter,
                                  gone=lambda peer: peer in gone,
                                  spawn=lambda c: tasks.append(asyncio.create_task(c)))
        agreement.control = peers  # type: ignore[assignment]
        agreement.started = started
        agreement.freeze("duration")
        last = await asyncio.wait_for(agreement.last_round(), 10)
        for task in tasks:
            task.cancel()
        return last, peers
    return asyncio.run(main())


def test_the_last_round_is_the_largest_count_of_the_live_training_ranks() -> None:
    last, peers = agree({1: 12, 2: 13}, started=12, gone=set())
    assert last == 13
    assert {rank for rank, _ in peers.told} == {1, 2}
    assert all(payload["rounds"] == 12 for _, payload in peers.told)


def test_a_peer_out_of_the_gate_is_not_waited_for() -> None:
    last, _ = agree({1: 9, 2: None}, started=10, gone={2})
    assert last == 10


def test_a_rank_told_to_stop_freezes_and_answers_its_own_count() -> None:
    async def main() -> tuple[dict[str, Any], StopAgreement]:
        waiter = Waiter(report_every_s=5.0)
        agreement = StopAgreement(rank=1, training_peers=[0, 2], waiter=waiter,
                                  gone=lambda peer: False, spawn=lambda c: c.close())
        agreement.started = 8
        answer = await agreement.on_stop(0, {"rank": 0, "rounds": 7, "reason": "duration"})
        return answer, agreement
    answer, agreement = asyncio.run(main())
    assert answer["rounds"] == 8 and agreement.frozen and agreement.counts == {0: 7}
    assert agreement.waiter.stop_reason == "duration"


SCHEMES = {
    "ako": ("--scheme", "ako", "--p", "2", "--ssp", "1"),
    "ps": ("--scheme", "ps", "--set", "exchange.ps_servers=1"),
    "allreduce": ("--scheme", "allreduce"),
    "wagma": ("--scheme", "wagma", "--group-size", "2", "--global-every", "2"),
}


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_a_duration_stop_ends_every_rank_of_every_scheme_on_the_same_round(
        scheme: str, tmp_path: Path) -> None:
    out = tmp_path / "run"
    command = akorun_command("launch", "--workers", "4", "--duration", "3s", "--lr", "0.05",
                             "--workload", "digits-mlp", "--optimizer", "sgd",
                             *SCHEMES[scheme], "--out", str(out), "--quiet",
                             "--timeout", "150s")
    result = subprocess.run(command, capture_output=True, text=True,
                            env=child_test_env({"AKORUN_FAULT": "0@sleep_per_round:0.03"}),
                            cwd=REPO_ROOT, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    merged = json.loads((out / "result.json").read_text())
    rounds = [w["rounds"] for w in merged["per_worker"] if w["rounds"]]
    assert len(rounds) >= 3 and len(set(rounds)) == 1, merged["per_worker"]


def test_a_peer_that_never_answers_is_given_up_on_after_the_patience() -> None:
    async def main() -> int | None:
        peers = Peers({1: 5, 2: None})
        tasks: list[asyncio.Task[Any]] = []
        waiter = Waiter(report_every_s=5.0)
        agreement = StopAgreement(rank=0, training_peers=[1, 2], waiter=waiter,
                                  gone=lambda peer: False, patience_s=0.5,
                                  spawn=lambda c: tasks.append(asyncio.create_task(c)))
        agreement.control = peers  # type: ignore[assignment]
        agreement.started = 4
        agreement.freeze("duration")
        last = await asyncio.wait_for(agreement.last_round(), 10)
        assert agreement.given_up == {2}
        return last
    assert asyncio.run(main()) == 5
