"""A refusal forged on the path does not end a join; the peer's own refusal still does.

The join (akorun.runtime.lifecycle.join) ends on a 400/401/409 only when the answer carries the
tag bound to our hello (akorun.transport.answers). An untagged one is logged once and the
hello goes again until the join timeout, like a peer not up yet. A peer whose keys differ
cannot tag its 401 either: the join ends at the join timeout, not before, with exit 2 and
one line naming the likely cause. The handshake is driven with a scripted control
client (milliseconds); one loopback run of two ranks puts a man in the middle between
them that answers rank 1's first hellos with an untagged 409 itself, then relays.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from akorun.errors import RunError, UsageError
from akorun.launching.cluster import free_ports, new_settings, with_hosts, write_cluster_file
from akorun.metrics import Metrics
from akorun.runtime.lifecycle import greeting
from akorun.runtime.lifecycle.join import Identity, Join
from akorun.runtime.lifecycle.phase import PhaseMachine
from akorun.runtime.liveness.peer_liveness import Liveness
from akorun.runtime.liveness.waiting import Waiter
from akorun.runtime.recovery.rejoin import Rejoin
from akorun.testing import BuiltWhen, LocalCluster, one_rank_context
from akorun.transport.client import ControlAnswer
from akorun.transport.control import ControlKind
from tests.test_answers import Proxy, forged_answer

pytestmark = pytest.mark.timeout(150)

IDENTITY = Identity(0, "run", "config", "params")


@pytest.fixture
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hellos again after 10 ms (not 200): the scripted handshakes take milliseconds."""
    monkeypatch.setattr(greeting, "RETRY_S", 0.01)
NOT_AUTHENTICATED = "not authenticated, retrying"


class ScriptedControl:
    """Answers rank 1's hellos with `refusals` (status, tagged) in turn, then with an
    ordinary ready answer (or, with `forever`, with the last refusal again and again)."""

    def __init__(self, refusals: list[tuple[int, bool]], *, forever: bool = False) -> None:
        self.refusals = list(refusals)
        self.forever = forever
        self.calls = 0

    async def call(self, rank: int, kind: ControlKind, payload: dict[str, Any], *,
                   timeout_s: float = 10.0, binary: bool = False) -> ControlAnswer:
        assert kind is ControlKind.HELLO and rank == 1
        self.calls += 1
        await asyncio.sleep(0)
        if self.refusals:
            status, tagged = self.refusals[0]
            if not self.forever or len(self.refusals) > 1:
                self.refusals.pop(0)
            return ControlAnswer(status, error=f"refused: {status} as scripted",
                                 authentic=tagged)
        return ControlAnswer(200, {**IDENTITY.payload(), "rank": 1, "ready": True},
                             authentic=True)


def join_of(*, timeout_s: float) -> tuple[Join, list[str]]:
    phase = PhaseMachine()
    liveness = Liveness(rank=0, peers=[1], timeout_s=60.0, node=lambda: None,
                        clock=lambda: 0.0, metrics=Metrics(0, "worker"), phase=phase)
    built: list[str] = []
    context = one_rank_context(0, [1], role=BuiltWhen(built), phase=phase,
                               hosts=("h:0", "h:1"), join_timeout_s=timeout_s)
    join = Join(context, identity=IDENTITY, waiter=Waiter(report_every_s=5.0),
                liveness=liveness, build_node=lambda compute_s: built.append("node"))
    return join, built


@pytest.mark.parametrize("status", [400, 401, 409])
@pytest.mark.usefixtures("quick_retries")
def test_untagged_refusals_are_retried_logged_once_and_the_join_completes(
        status: int, caplog: pytest.LogCaptureFixture) -> None:
    control = ScriptedControl([(status, False)] * 4)
    join, built = join_of(timeout_s=30.0)
    with caplog.at_level(logging.WARNING, logger="akorun"):
        asyncio.run(join.join(control))  # type: ignore[arg-type]
    assert built == ["node"] and join.ready
    assert control.calls >= 5  # four refusals, then the answer
    lines = [r.getMessage() for r in caplog.records if NOT_AUTHENTICATED in r.getMessage()]
    assert len(lines) == 1 and f"rank 1 refused our hello with {status}" in lines[0], lines


@pytest.mark.usefixtures("quick_retries")
def test_a_tagged_refusal_ends_the_join_at_once() -> None:
    control = ScriptedControl([(409, False), (409, True)])
    join, built = join_of(timeout_s=600.0)
    with pytest.raises(RunError, match=r"rank 1 refused our hello \(409\)"):
        asyncio.run(join.join(control))  # type: ignore[arg-type]
    assert control.calls == 2 and not built  # the untagged one was retried, the tagged not


@pytest.mark.usefixtures("quick_retries")
def test_only_untagged_401s_end_the_join_at_its_timeout_naming_the_keys() -> None:
    """What a peer of another cluster secret looks like (and what a forger could send)."""
    control = ScriptedControl([(401, False)], forever=True)
    join, built = join_of(timeout_s=0.6)
    loop_times: list[float] = []

    async def run() -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            await join.join(control)  # type: ignore[arg-type]
        finally:
            loop_times.append(loop.time() - started)

    with pytest.raises(UsageError, match=r"rank\(s\) 1 at h:1 cannot authenticate our hello"
                                         r".*join timeout 0.6 s.*secret, run id or key file"):
        asyncio.run(run())
    assert loop_times[0] >= 0.6 and control.calls >= 2 and not built  # not before it
    assert control.calls <= 15  # backing off (60 hellos at a fixed 10 ms), see Unverified


@pytest.mark.usefixtures("quick_retries")
def test_only_untagged_409s_end_the_join_at_its_timeout_as_no_answer() -> None:
    control = ScriptedControl([(409, False)], forever=True)
    join, _ = join_of(timeout_s=0.6)
    with pytest.raises(RunError, match=r"no hello answer within 0.6 s from rank\(s\) 1 at h:1 "
                                       r"\(only refusals \[409\] without a tag"):
        asyncio.run(join.join(control))  # type: ignore[arg-type]
    assert control.calls >= 2


# ------------------------------------------------------------------ a man in the middle

TABLES = {"cluster": {"workers": 2}, "exchange": {"p": 1, "ssp": 1},
          "train": {"workload": "digits-mlp", "optimizer": "sgd", "lr": 0.1,
                    "rounds": 4, "eval_every": 1000}}
FORGED_HELLOS = 5


class ProxyThread:
    """`proxy` served by an event loop of its own in a thread, for subprocess ranks."""

    def __init__(self, proxy: Proxy) -> None:
        self.proxy = proxy
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> Proxy:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.proxy.start(), self.loop).result(10)
        return self.proxy

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.proxy.close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def test_a_409_forged_by_a_man_in_the_middle_does_not_end_the_join(tmp_path: Path) -> None:
    """Rank 1 reaches rank 0 only through a proxy that answers its first hellos itself
    with an untagged 409, then relays: rank 1 logs it once, keeps greeting, and both
    ranks join, train and end with exit 0 and equal replicas."""
    settings = new_settings(peer_timeout_s=3.0, join_timeout_s=60.0)
    with LocalCluster(tmp_path, TABLES, settings=settings) as cluster:
        (proxy_port,) = free_ports(1)
        upstream_port = int(cluster.config.cluster.hosts[0].rsplit(":", 1)[1])
        hellos = iter(range(10**6))

        def forge(number: int, head: bytes) -> bytes | None:
            if head.startswith(b"POST /v1/hello") and next(hellos) < FORGED_HELLOS:
                return forged_answer(409, b"refused: forged by the path\n")
            return None

        via_proxy = write_cluster_file(
            tmp_path / "via-proxy.toml",
            with_hosts(cluster.config, (f"127.0.0.1:{proxy_port}",
                                        cluster.config.cluster.hosts[1])), settings)
        with ProxyThread(Proxy(upstream_port, forge, port=proxy_port)) as proxy:
            cluster.start(0, "--quiet")
            cluster.path, kept = via_proxy, cluster.path
            cluster.start(1, "--quiet")
            cluster.path = kept
            codes = cluster.wait_all(120)
        assert codes == {0: 0, 1: 0}, cluster.logs()
        assert proxy.forged == FORGED_HELLOS
        log = cluster.log(1)
        assert "Traceback" not in log
        lines = [line for line in log.splitlines() if NOT_AUTHENTICATED in line]
        assert len(lines) == 1 and "rank 0 refused our hello with 409" in lines[0], log
        np.testing.assert_allclose(cluster.params(1), cluster.params(0), rtol=1e-5, atol=1e-6)


@pytest.mark.usefixtures("quick_retries")
def test_a_rejoin_refused_only_untagged_is_retried_then_names_the_keys() -> None:
    """The rejoin handshake judges refusals the same way: an untagged 401 is retried for
    the rejoin window (max(3 s, the peer timeout)), then, as nobody answered, ends with
    the likely cause instead of resuming alone."""
    class Refusing:
        calls = 0

        async def call(self, rank: int, kind: ControlKind, payload: dict[str, Any], *,
                       timeout_s: float = 10.0, binary: bool = False) -> ControlAnswer:
            assert kind is ControlKind.REJOIN_HELLO
            self.calls += 1
            await asyncio.sleep(0)
            return ControlAnswer(401, error="bad_signature: not ours", authentic=False)

    phase = PhaseMachine()
    liveness = Liveness(rank=0, peers=[1], timeout_s=0.1, node=lambda: None,
                        clock=lambda: 0.0, metrics=Metrics(0, "worker"), phase=phase)
    rejoin = Rejoin(one_rank_context(0, [1], phase=phase, peer_timeout_s=0.1),
                    identity=IDENTITY, waiter=Waiter(report_every_s=5.0), liveness=liveness,
                    outbox=None,  # type: ignore[arg-type]
                    build_node=lambda compute_s, p_of: None)
    client = Refusing()
    with pytest.raises(UsageError, match="only 401s without a tag we can check"):
        asyncio.run(rejoin.rejoin(client))  # type: ignore[arg-type]
    assert client.calls >= 2
