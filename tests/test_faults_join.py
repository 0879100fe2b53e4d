"""A rank lost before every rank has joined: the others end with exit 1 and one line.

A rank that never answers a hello is waited for until the join timeout (it
may be slow to start); a rank that answered and then stops answering for
longer than the peer timeout died during the join, and the others end at
once instead of at the join timeout. Either way nothing is trained and no
result is written (docs/guide/failure.md). The handshake is tested
with a scripted control client; one loopback run checks what the user sees.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import pytest

from akorun.errors import RunError
from akorun.launching.cluster import new_settings
from akorun.metrics import Metrics
from akorun.runtime.lifecycle.join import Identity, Join
from akorun.runtime.lifecycle.phase import PhaseMachine
from akorun.runtime.liveness.peer_liveness import Liveness
from akorun.runtime.liveness.waiting import Waiter
from akorun.testing import LocalCluster, one_rank_context
from akorun.transport.client import ControlAnswer
from akorun.transport.control import ControlKind

pytestmark = pytest.mark.timeout(150)


class ScriptedControl:
    """Answers hellos as scripted: `answers[peer]` ok answers, then unreachable."""

    def __init__(self, identity: Identity, answers: dict[int, int]) -> None:
        self.identity = identity
        self.answers = dict(answers)
        self.calls: list[int] = []

    async def call(self, rank: int, kind: ControlKind, payload: dict[str, Any], *,
                   timeout_s: float = 10.0, binary: bool = False) -> ControlAnswer:
        assert kind is ControlKind.HELLO
        self.calls.append(rank)
        await asyncio.sleep(0)
        if self.answers.get(rank, 0) > 0:
            self.answers[rank] -= 1
            return ControlAnswer(200, {**self.identity.payload(), "rank": rank, "ready": True})
        return ControlAnswer(0, error="connection refused")


def join_of(control: ScriptedControl, *, timeout_s: float, peer_timeout_s: float) -> Join:
    identity = control.identity
    phase = PhaseMachine()
    liveness = Liveness(rank=0, peers=[1, 2], timeout_s=peer_timeout_s, node=lambda: None,
                        clock=lambda: 0.0, metrics=Metrics(0, "worker"), phase=phase)
    context = one_rank_context(0, [1, 2], phase=phase, hosts=("h:1", "h:2", "h:3"),
                               join_timeout_s=timeout_s, peer_timeout_s=peer_timeout_s)
    return Join(context, identity=identity, waiter=Waiter(report_every_s=5.0),
                liveness=liveness, build_node=lambda compute_s: None)


IDENTITY = Identity(0, "run", "config", "params")


def test_a_rank_that_never_answers_is_waited_for_until_the_join_timeout() -> None:
    control = ScriptedControl(IDENTITY, {1: 10**6})  # rank 2 never started
    join = join_of(control, timeout_s=0.5, peer_timeout_s=0.2)
    with pytest.raises(RunError, match=r"no hello answer within 0.5 s from rank\(s\) 2 at h:3"):
        asyncio.run(join.join(control))  # type: ignore[arg-type]


def test_a_rank_that_answered_then_vanished_ends_the_join_before_its_timeout() -> None:
    control = ScriptedControl(IDENTITY, {2: 1})  # rank 2 answers once; rank 1 never
    join = join_of(control, timeout_s=600.0, peer_timeout_s=0.3)
    with pytest.raises(RunError, match="rank 2 at h:3 answered our hello, then nothing"):
        asyncio.run(join.join(control))  # type: ignore[arg-type]
    assert control.calls.count(2) >= 2  # it was asked again, and no more answered


def test_the_others_of_a_rank_killed_during_the_join_exit_1_with_one_line(
        tmp_path: Path) -> None:
    """Ranks 0 and 2 start (1 never does); rank 2 dies once rank 0 holds its hello answer;
    rank 0 ends with exit 1, one line naming rank 2, no traceback and no result."""
    settings = new_settings(peer_timeout_s=2.0, join_timeout_s=90.0)
    tables = {"cluster": {"workers": 3}, "exchange": {"p": 2, "ssp": 1},
              "train": {"workload": "digits-mlp", "optimizer": "sgd", "lr": 0.1,
                        "rounds": 4, "eval_every": 1000}}
    with LocalCluster(tmp_path, tables, settings=settings) as cluster:
        cluster.start_all("--quiet", env={"AKORUN_FAULT": "2@kill_in_join"}, ranks=[0, 2])
        codes = cluster.wait_all(110)
        assert codes == {0: 1, 2: -signal.SIGKILL}, cluster.logs()
        log = cluster.log(0)
        assert "Traceback" not in log
        failed = [line for line in log.splitlines() if "failed:" in line]
        assert len(failed) == 1 and "rank 2" in failed[0] and "died during the join" \
            in failed[0], log
        assert not list(cluster.out.glob("worker-*.json"))  # nothing trained, nothing written


def test_a_rank_killed_while_others_still_greet_ends_the_join_for_every_rank(
        tmp_path: Path) -> None:
    """Five ranks: 0, 1 and 4 start; 4 answers their hellos, then dies (SIGKILL); 2 and 3
    start only then, so they never hear from 4 while 0 and 1 hold 4's answer. No rank
    trains: every live rank ends its join with exit 1 and one line, none at the join
    timeout (ranks ready to start wait until every rank is ready too). The peer timeout
    (10 s) leaves 2 and 3 the time to start before 0 and 1 give up on 4; a rank started
    after every other one ended is waited for until the join timeout (README)."""
    settings = new_settings(peer_timeout_s=10.0, join_timeout_s=100.0)
    tables = {"cluster": {"workers": 5}, "exchange": {"p": 2, "ssp": 1},
              "train": {"workload": "digits-mlp", "optimizer": "sgd", "lr": 0.1,
                        "rounds": 50, "eval_every": 1000}}
    with LocalCluster(tmp_path, tables, settings=settings) as cluster:
        cluster.start_all("--quiet", env={"AKORUN_FAULT": "4@kill_in_join"}, ranks=[0, 1, 4])
        assert cluster.wait(4, 90) == -signal.SIGKILL, cluster.logs()
        cluster.start_all("--quiet", ranks=[2, 3])
        codes = cluster.wait_all(110)
        assert codes == {0: 1, 1: 1, 2: 1, 3: 1, 4: -signal.SIGKILL}, cluster.logs()
        for rank in range(4):
            log = cluster.log(rank)
            assert "Traceback" not in log
            assert len([line for line in log.splitlines() if "failed:" in line]) == 1, log
            assert "no hello answer within" not in log, log  # ended, not timed out
        assert not list(cluster.out.glob("worker-*.json"))  # nothing trained
