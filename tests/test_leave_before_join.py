"""A rank that leaves before it joined (runtime.lifecycle.join `leave`), piece by piece, in-process.

The peers that are up are told (and only they); a peer already training takes
the leaver out of its gate for good (runtime.liveness.peer_liveness `left`); a peer still
joining ends its join (RunError, or Interrupted when it is stopping too);
launch counts a rank that stopped as asked while it was stopping as
interrupted, not failed. The whole path, with real processes, is
tests/test_launch_sigterm_startup.py.
"""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path
from typing import Any

import pytest

from akocore.schemes import AkoWorker, Replica
from akocore.settings.toml_io import config_from_dict
from akorun.errors import Interrupted, RunError
from akorun.faults import Faults, faults_for
from akorun.launching.cluster import new_settings
from akorun.launching.local import Launcher, LaunchOptions
from akorun.metrics import Metrics
from akorun.runtime.lifecycle.join import Identity, Join
from akorun.runtime.lifecycle.phase import PhaseMachine
from akorun.runtime.liveness.peer_liveness import Liveness
from akorun.runtime.liveness.waiting import Waiter
from akorun.runtime.rank_context import RankEvents
from akorun.testing import BuiltWhen, one_rank_context
from akorun.transport.client import ControlAnswer
from akorun.transport.control import ControlError, ControlKind

pytestmark = pytest.mark.timeout(60)

IDENTITY = Identity(0, "run", "config", "params")
PEER_2 = {**Identity(2, "run", "config", "params").payload(), "reason": "SIGTERM"}


class Clock:
    now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def _recorded(events: list[str]) -> RankEvents:
    """A rank's event hub whose wakes and peer changes land in `events`."""
    hub = RankEvents()
    hub.wake.subscribe(lambda: events.append("wake"))
    hub.peer_changed.subscribe(lambda peer: events.append(f"notify {peer}"))
    return hub


def _liveness(node: AkoWorker | None, events: list[str]) -> Liveness:
    liveness = Liveness(rank=0, peers=[1, 2], timeout_s=3.0, node=lambda: node, clock=Clock(),
                        metrics=Metrics(0, "worker"), phase=PhaseMachine(),
                        events=_recorded(events))
    liveness.started_s = 0.0
    liveness.heard_all()
    return liveness


class Control:
    """Answers hellos from the peers in `up` (after `delay_s`); records every call."""

    def __init__(self, up: set[int], delay_s: float = 0.0) -> None:
        self.up = up
        self.delay_s = delay_s
        self.calls: list[tuple[int, ControlKind]] = []

    async def call(self, rank: int, kind: ControlKind, payload: dict[str, Any], *,
                   timeout_s: float = 10.0, binary: bool = False) -> ControlAnswer:
        self.calls.append((rank, kind))
        await asyncio.sleep(self.delay_s)
        if rank in self.up:
            return ControlAnswer(200, {**IDENTITY.payload(), "rank": rank})
        return ControlAnswer(0, error="connection refused")


def _join(liveness: Liveness, waiter: Waiter, *, built: bool = False) -> Join:
    context = one_rank_context(0, [1, 2], role=BuiltWhen(["node"] if built else []),
                               phase=liveness.phase, hosts=("h:0", "h:1", "h:2"),
                               join_timeout_s=30.0)
    return Join(context, identity=IDENTITY, waiter=waiter, liveness=liveness,
                build_node=lambda compute_s: None)


def test_a_peer_that_left_is_out_of_the_gate_at_once_and_for_good() -> None:
    node = AkoWorker(0, 3, 6, (1, 1, 1), replica=Replica(None, None), staleness=0)
    events: list[str] = []
    liveness = _liveness(node, events)
    node.local_step(0, None)
    liveness.left(2, "SIGTERM")
    assert node.suspended == {2} and events == ["notify 2", "wake"]
    liveness.heard(2)  # nothing it sends can come, but nothing brings it back either
    assert node.suspended == {2}
    liveness.clock.now_s = 10.0  # type: ignore[attr-defined]
    assert liveness.check(10.0) == [1]  # no heartbeat to it, and no timeout counted
    assert liveness.metrics.peer_timeouts == 1 and node.suspended == {1, 2}
    liveness.restarted(2)  # a rejoin (ako --resume) is accepted as ever
    assert 2 not in liveness.left_peers and node.suspended == {1}


def test_a_leave_to_a_training_rank_takes_the_peer_out_of_its_gate() -> None:
    node = AkoWorker(0, 3, 6, (1, 1, 1), replica=Replica(None, None), staleness=0)
    liveness = _liveness(node, [])
    join = _join(liveness, Waiter(report_every_s=5.0), built=True)
    assert asyncio.run(join.on_leave(2, PEER_2)) == {"rank": 0}
    assert liveness.left_peers == {2: "SIGTERM"} and node.suspended == {2}
    with pytest.raises(ControlError) as refused:  # a rank of another run: refused
        asyncio.run(join.on_leave(1, {**PEER_2, "rank": 1, "run_id": "other"}))
    assert refused.value.status == 409 and 1 not in liveness.left_peers


@pytest.mark.parametrize(("stopping", "error", "match"), [
    (False, RunError, "rank 2 at h:2 left during the join"), (True, Interrupted, "SIGTERM")])
def test_a_leave_during_our_join_ends_it_interrupted_if_we_stop_too(
        stopping: bool, error: type[Exception], match: str) -> None:
    liveness = _liveness(None, [])
    waiter = Waiter(report_every_s=5.0)
    join = _join(liveness, waiter)
    control = Control(up={2})  # rank 1 never answers: without the leave, the join goes on

    async def body() -> None:
        task = asyncio.ensure_future(join.join(control))  # type: ignore[arg-type]
        await asyncio.sleep(0.05)
        await join.on_leave(2, PEER_2)
        if stopping:
            waiter.request_stop("SIGTERM")
        await task

    with pytest.raises(error, match=match):
        asyncio.run(body())


def test_leave_is_said_only_to_the_peers_that_are_up() -> None:
    liveness = _liveness(None, [])
    join = _join(liveness, Waiter(report_every_s=5.0))
    control = Control(up={1, 2})
    asyncio.run(join.leave(control, "nobody up yet"))  # type: ignore[arg-type]
    assert control.calls == []
    join.greeted[2] = 1  # rank 2 said hello to us
    join.answered.add(1)  # rank 1 answered ours
    asyncio.run(join.leave(control, "SIGTERM"))  # type: ignore[arg-type]
    assert control.calls == [(1, ControlKind.LEAVE), (2, ControlKind.LEAVE)]


def test_pause_in_join_is_read_with_or_without_a_file() -> None:
    assert faults_for(2, {"AKORUN_FAULT": "2@pause_in_join"}) == Faults(pause_in_join=True)
    assert faults_for(1, {"AKORUN_FAULT": "pause_in_join:/tmp/go"}) == Faults(
        pause_in_join=True, pause_in_join_file="/tmp/go")
    assert faults_for(1, {"AKORUN_FAULT": "2@pause_in_join"}) == Faults()
    assert Faults(pause_in_join=True).any


def test_launch_counts_ranks_that_stopped_as_asked_as_interrupted_not_failed(
        tmp_path: Path) -> None:
    cfg = config_from_dict({"cluster": {"workers": 3}})
    launcher = Launcher(cfg, new_settings(), LaunchOptions(out_dir=tmp_path))
    for script in ("exit 130", "kill -TERM $$", "exit 1"):  # before it joined; before it
        launcher.procs.append(subprocess.Popen(["sh", "-c", script]))  # caught signals
    for proc in launcher.procs:
        proc.wait()
    assert [rank for rank, _, _ in launcher.failures()] == [0, 1, 2]  # nobody asked
    launcher.stopping = True
    assert [rank for rank, _, _ in launcher.failures()] == [2]
