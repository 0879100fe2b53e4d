"""The runtime worker's collaborators on their own: the phase state machine, the one control
table (and the server routes made from it), peer liveness, and the role chosen once."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest

from akocore.messages import Kind, Partial, Receipt
from akocore.schemes import AkoWorker, Replica, SchemeNode
from akocore.settings.toml_io import config_from_dict
from akorun.errors import UsageError
from akorun.launching.cluster import new_settings, with_hosts
from akorun.metrics import Metrics
from akorun.runtime.lifecycle.phase import IllegalTransition, Phase, PhaseMachine
from akorun.runtime.liveness.peer_liveness import Liveness
from akorun.runtime.liveness.waiting import Waiter
from akorun.runtime.rank_context import RankEvents
from akorun.runtime.rank_options import WorkerOptions
from akorun.runtime.recovery.rank_recovery import NoRecovery, RejoinRecovery, recovery_for
from akorun.runtime.roles import PartitionedRole, PSServerRole, PSWorkerRole, Role, role_for
from akorun.runtime.worker import Worker
from akorun.testing import SinkHost
from akorun.transport.control import ControlError, ControlKind
from akorun.transport.routing import ControlTable
from akorun.transport.server import Server

LEGAL = {(Phase.STARTING, Phase.RUNNING), (Phase.STARTING, Phase.REJOINING),
         (Phase.REJOINING, Phase.RUNNING), (Phase.RUNNING, Phase.FINISHING),
         (Phase.FINISHING, Phase.DONE)}


# ------------------------------------------------------------------ phase


def test_a_run_moves_through_its_phases_in_order() -> None:
    phase = PhaseMachine()
    assert phase.current is Phase.STARTING and phase.name == "starting"
    for step in (Phase.RUNNING, Phase.FINISHING, Phase.DONE):
        phase.to(step)
    assert phase.is_(Phase.DONE)
    rejoined = PhaseMachine()
    rejoined.to(Phase.REJOINING)
    rejoined.to(Phase.RUNNING)
    assert rejoined.is_(Phase.RUNNING, Phase.FINISHING)


@pytest.mark.parametrize("source, target", [
    pair for pair in itertools.product(Phase, Phase) if pair not in LEGAL])
def test_every_other_phase_move_raises_and_changes_nothing(source: Phase,
                                                           target: Phase) -> None:
    phase = PhaseMachine()
    path = {Phase.STARTING: [], Phase.REJOINING: [Phase.REJOINING],
            Phase.RUNNING: [Phase.RUNNING], Phase.FINISHING: [Phase.RUNNING, Phase.FINISHING],
            Phase.DONE: [Phase.RUNNING, Phase.FINISHING, Phase.DONE]}[source]
    for step in path:
        phase.to(step)
    with pytest.raises(IllegalTransition, match=f"{source.value} -> {target.value}"):
        phase.to(target)
    assert phase.current is source


# ------------------------------------------------------------------ control table


async def _answer(sender: int, payload: dict[str, Any]) -> dict[str, Any]:
    return {"sender": sender, **payload}


def test_a_control_table_without_a_handler_for_some_kind_cannot_be_built() -> None:
    handlers = {kind: _answer for kind in ControlKind if kind is not ControlKind.RESTART}
    with pytest.raises(ValueError, match="restart"):
        ControlTable(handlers, rank=0, world=3)


def test_the_table_routes_each_kind_to_its_handler_with_the_checked_sender() -> None:
    calls: list[tuple[ControlKind, int]] = []

    def recording(kind: ControlKind) -> Any:
        async def handler(sender: int, payload: dict[str, Any]) -> dict[str, Any]:
            calls.append((kind, sender))
            return {"kind": kind.value}
        return handler

    table = ControlTable({kind: recording(kind) for kind in ControlKind}, rank=1, world=3)
    assert [route.path for route in table.routes] == [f"/v1/{kind.value}" for kind in ControlKind]

    async def each() -> list[Any]:
        return [await table.dispatch(kind, {"rank": 2}) for kind in ControlKind]

    assert asyncio.run(each()) == [{"kind": kind.value} for kind in ControlKind]
    assert calls == [(kind, 2) for kind in ControlKind]
    for bad in (1, 3, -1, True, "0", None):  # itself, out of range, not an int
        with pytest.raises(ControlError) as refused:
            asyncio.run(table.dispatch(ControlKind.HELLO, {"rank": bad}))
        assert refused.value.status == 400
    assert len(calls) == len(ControlKind)


def test_the_server_serves_exactly_the_tables_routes() -> None:
    host = SinkHost(b"s" * 32, b"r" * 16, b"h" * 8)
    server = Server(host)
    posts = {route.resource.canonical for route in server.app.router.routes()
             if route.method == "POST" and route.resource is not None}
    assert posts == {"/v1/partial"} | {route.path for route in host.control_table.routes}


def test_the_workers_table_has_a_handler_for_every_control_message() -> None:
    cfg = config_from_dict({"cluster": {"workers": 2}, "exchange": {"scheme": "allreduce"},
                            "train": {"workload": "digits-mlp", "rounds": 1}})
    cfg = with_hosts(cfg, ("127.0.0.1:1", "127.0.0.1:2"))
    worker = Worker(WorkerOptions(rank=0, config=cfg, settings=new_settings()))
    worker.prepare()
    assert {route.kind for route in worker.control_table.routes} == set(ControlKind)
    assert worker.not_accepting() == "starting"  # no node before the join


# ------------------------------------------------------------------ liveness


class Clock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def _recorded(events: list[str]) -> RankEvents:
    """A rank's event hub whose wakes and peer changes land in `events`."""
    hub = RankEvents()
    hub.wake.subscribe(lambda: events.append("wake"))
    hub.peer_changed.subscribe(lambda peer: events.append(f"notify {peer}"))
    return hub


def _liveness(timeout_s: float = 3.0) -> tuple[Liveness, AkoWorker, Clock, list[str]]:
    node = AkoWorker(0, 3, 6, (1, 1, 1), replica=Replica(None, None), staleness=0)
    clock = Clock()
    events: list[str] = []
    liveness = Liveness(rank=0, peers=[1, 2], timeout_s=timeout_s, node=lambda: node,
                        clock=clock, metrics=Metrics(0, "worker"), phase=PhaseMachine(),
                        events=_recorded(events))
    liveness.started_s = 0.0
    liveness.heard_all()
    return liveness, node, clock, events


def test_a_peer_silent_past_the_timeout_is_suspended_and_resumes_when_heard() -> None:
    liveness, node, clock, events = _liveness(timeout_s=3.0)
    node.local_step(0, None)
    assert not node.may_start(1)  # round 1 waits on both peers' round 0
    clock.now_s = 2.9
    liveness.heard(2)
    clock.now_s = 3.5  # peer 1 silent 3.5 s, peer 2 for 0.6 s
    liveness.check(clock.now_s)
    assert node.suspended == {1}
    assert liveness.metrics.peer_timeouts == 1
    assert "notify 1" in events and "wake" in events
    assert liveness.may_drop(1) and not liveness.may_drop(2)
    clock.now_s = 10.0
    liveness.check(clock.now_s)  # a suspended peer is not suspended twice
    assert node.suspended == {1, 2} and liveness.metrics.peer_timeouts == 2
    assert node.may_start(1)  # the gate no longer waits on suspended peers
    liveness.heard(1)
    assert node.suspended == {2} and not liveness.may_drop(1)


def test_a_peer_busy_in_one_round_past_three_timeouts_is_given_up_until_it_sends_anew(
) -> None:
    liveness, node, clock, events = _liveness(timeout_s=2.0)
    stuck: list[tuple[int, str]] = []
    liveness.events.peer_stuck.subscribe(lambda peer, why: stuck.append((peer, why)))
    liveness._busy_answer(1, {"round": 7, "busy_s": 5.9})  # under 3 x 2 s: nothing
    liveness._busy_answer(2, {"round": 7, "busy_s": None})  # waiting on others
    assert node.suspended == set() and stuck == [] and liveness.waiting_peers == {2}
    liveness._busy_answer(1, {"round": 7, "busy_s": 6.1})
    assert node.suspended == {1} and [peer for peer, _ in stuck] == [1]
    assert "no progress for 6.1 s" in stuck[0][1] and "round 7" in stuck[0][1]
    liveness.heard(1)  # it answers heartbeats and acknowledges: not back in the gate
    assert node.suspended == {1}
    liveness._busy_answer(1, {"round": 7, "busy_s": 9.0})  # given up once
    assert len(stuck) == 1
    clock.now_s = 1.0
    liveness.received(1, accepted=False)  # a duplicate is no progress
    assert node.suspended == {1}
    liveness.received(1, accepted=True)  # a new round: back in the gate
    assert node.suspended == set() and 1 not in liveness.stuck_peers


def test_a_stalled_gate_gives_its_blocker_up_for_good_not_the_peers_that_wait_themselves(
) -> None:
    liveness, node, clock, _ = _liveness(timeout_s=1.0)
    waiter = Waiter(report_every_s=100.0, stall_limit_s=0.7,  # one stall before 1.2 s
                    peers=liveness)
    liveness._busy_answer(2, {"round": 0, "busy_s": None})  # 2 says: waiting on others
    node.local_step(0, None)  # round 1 waits on both peers' round 0

    async def gate() -> float | None:
        return await waiter.gate(node, 1, asyncio.get_running_loop().time() + 1.2)

    assert asyncio.run(gate()) is None  # 2 still blocks: the duration deadline ends it
    assert node.suspended == {1} and set(liveness.stuck_peers) == {1}
    liveness.heard(1)
    assert 1 in node.suspended  # answering does not put it back


def test_heartbeats_are_due_after_a_third_of_the_timeout_once_per_peer() -> None:
    liveness, node, clock, _ = _liveness(timeout_s=3.0)
    clock.now_s = 0.9
    assert liveness.check(clock.now_s) == []
    clock.now_s = 1.1
    assert liveness.check(clock.now_s) == [1, 2]
    assert liveness.check(clock.now_s) == []  # still under way
    assert node.suspended == set()


def test_a_done_peer_is_not_timed_out_once_its_final_message_is_held() -> None:
    liveness, node, clock, _ = _liveness(timeout_s=3.0)
    answer = asyncio.run(liveness.on_done(2, {"rank": 2}))
    assert answer["final_held"] is False and not liveness.is_done(2)
    clock.now_s = 5.0
    liveness.check(clock.now_s)  # a done without its final message disables nothing
    assert node.suspended == {1, 2}
    node.resume_peer(2)
    node.receive(Partial(Kind.GRAD, 2, 0, 0, 1, 0, 0, None, final=True))
    assert liveness.is_done(2)
    clock.now_s = 50.0
    liveness.check(clock.now_s)
    assert 2 not in node.suspended  # it owes nothing more


def test_a_rejoining_peer_stays_suspended_until_it_restarts() -> None:
    liveness, node, clock, _ = _liveness(timeout_s=3.0)
    clock.now_s = 5.0
    liveness.check(clock.now_s)
    assert node.suspended == {1, 2}
    liveness.rejoin_started(1)
    liveness.heard(1)
    assert node.suspended == {1, 2} and not liveness.may_drop(1)  # keeps its messages
    liveness.restarted(1)
    assert node.suspended == {2}


def test_heartbeats_are_refused_until_the_run_is_running() -> None:
    liveness, _, _, _ = _liveness()
    with pytest.raises(ControlError) as refused:
        asyncio.run(liveness.on_heartbeat(1, {"rank": 1}))
    assert refused.value.status == 503 and refused.value.reason == "starting"
    liveness.phase.to(Phase.RUNNING)
    answer = asyncio.run(liveness.on_heartbeat(1, {"rank": 1, "nonce": "abc"}))
    assert answer == {"rank": 0, "round": 0, "state": "running", "nonce": "abc", "busy_s": None}


def test_only_new_messages_prove_a_peer_alive_not_duplicates() -> None:
    liveness, node, clock, _ = _liveness(timeout_s=3.0)
    clock.now_s = 5.0
    liveness.check(clock.now_s)
    assert node.suspended == {1, 2}
    liveness.received(1, accepted=False)  # an old message re-sent
    assert 1 in node.suspended and 1 not in liveness.last_new_s
    liveness.received(1, accepted=True)
    assert 1 not in node.suspended and liveness.last_new_s[1] == 5.0


# ------------------------------------------------------------------ roles


def test_the_role_is_chosen_once_from_the_scheme_and_the_rank() -> None:
    def role(scheme: str, rank: int) -> Role:
        exchange: dict[str, Any] = {"scheme": scheme}
        if scheme == "ps":
            exchange["ps_servers"] = 1
        return role_for(config_from_dict({"cluster": {"workers": 3}, "exchange": exchange}),
                        rank)

    assert type(role("ako", 2)) is PartitionedRole
    assert type(role("ako", 2).recovery) is RejoinRecovery
    assert type(role("ps", 0)) is PSWorkerRole
    server = role("ps", 2)
    assert type(server) is PSServerRole and server.name == "ps"
    assert not server.trains and server.hard_stop_on_first_signal
    assert type(role("allreduce", 1)) is Role and role("allreduce", 1).trains
    for rank, scheme in ((2, "ps"), (0, "allreduce"), (1, "diloco")):
        assert type(role(scheme, rank).recovery) is NoRecovery
        with pytest.raises(ControlError, match="ako only"):
            role(scheme, rank).donor()
        with pytest.raises(UsageError, match="ako runs only"):
            role(scheme, rank).check_resume()
    role("ako", 0).check_resume()
    assert server.params_offset() == 0  # no node yet


def test_the_recovery_asks_the_node_for_its_capability_never_its_class() -> None:
    """A node of a class the runtime has never seen rejoins, donates, catches up and
    reports its delivery record through what its `recovery()` returns."""
    held = AkoWorker(0, 3, 6, (1, 1, 1), replica=Replica(None, None), staleness=0)
    for round_ in range(4):  # rank 2's rounds 0..3 held
        held.receive(Partial(Kind.GRAD, 2, round_, 0, 1, 0, 6, None))

    class NewSchemeNode(SchemeNode):
        def receive(self, msg: Partial) -> Receipt:
            return held.receive(msg)

        def recovery(self) -> AkoWorker:
            return held

    node = NewSchemeNode(0, 6, Replica(None, None))
    recovery = recovery_for(0, "new", True, lambda: node)
    recovery.check_resume()
    assert recovery.donor() is held and recovery.rejoiner() is held
    assert recovery.takes_back_given_up()
    assert recovery.held_through() == {"1": -1, "2": 3}
    assert recovery.status_extras(digest=True) == {"contiguous": {"1": -1, "2": 3}}
    assert recovery.catch_up_round(9) == 9  # rank 1 sent nothing: not ahead
    without = recovery_for(0, "new", False, lambda: node)
    with pytest.raises(ControlError):
        without.donor()
    assert without.held_through() == {} and not without.takes_back_given_up()
    assert without.catch_up_round(9) == 9 and without.skip_rounds(12) == []
