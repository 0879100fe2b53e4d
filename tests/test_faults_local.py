"""Storage failures, refused values and CLI mistakes, on loopback (no root needed).

A final write that fails (here: a checkpoint directory under a regular file)
still tells the peers ``done`` and exits 1 with one line, while the peers end
0 and equal; an unreadable checkpoint at --resume exits 2 with one line
naming the file; temp files a killed writer left are removed at the next
start; a non-finite partial is answered 422 and counted; `akorun launch`
refuses an --out that is a file or already holds a run; a cluster file that
spells one endpoint two ways is refused when it is written and when it is read.
"""

from __future__ import annotations

import asyncio
import subprocess
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from akocore.messages import Kind, Partial
from akorun.launching.cluster import free_ports
from akorun.runtime.records.checkpoint_file import (
    Checkpoint,
    load_checkpoint,
    remove_stale_temp_files,
    save_checkpoint,
)
from akorun.testing import (
    REPO_ROOT,
    LocalCluster,
    SinkHost,
    akorun_command,
    child_test_env,
    one_rank_context,
)
from akorun.transport.keys import AUTH_HEADER, PARTIAL_PATH
from akorun.transport.server import Server
from akorun.transport.validation import NonFiniteValues, refuse_non_finite

pytestmark = pytest.mark.timeout(120)

RTOL = 1e-5


def tables(rounds: int = 12) -> dict[str, Any]:
    return {"cluster": {"workers": 3}, "exchange": {"p": 2, "ssp": 1},
            "train": {"workload": "digits-mlp", "optimizer": "sgd", "lr": 0.1,
                      "rounds": rounds, "eval_every": 1000}}


def akorun(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(akorun_command(*args), capture_output=True, text=True,
                          env=child_test_env(), cwd=REPO_ROOT, timeout=90)


def one_line_error(result: subprocess.CompletedProcess[str], status: int) -> str:
    assert result.returncode == status, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.strip().splitlines() if "akorun" in line
             and ("error" in line.lower() or "not written" in line)]
    assert lines, result.stderr
    return lines[-1]


# --------------------------------------------------------------------------- storage


def test_a_failed_final_write_says_done_and_exits_1_while_the_peers_end_equal(
        tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the checkpoint directory should be\n")
    with LocalCluster(tmp_path, tables()) as cluster:
        cluster.start(0, "--quiet")
        cluster.start(1, "--quiet")
        cluster.start(2, "--quiet", "--checkpoint-every", "4", "--checkpoint-dir",
                      str(blocker / "ckpt"))
        codes = cluster.wait_all(90)
        assert codes == {0: 0, 1: 0, 2: 1}, cluster.logs()
        log = cluster.log(2)
        assert "Traceback" not in log
        assert "checkpoint not written" in log and "training goes on" in log  # periodic
        assert "peers were told done" in log.strip().splitlines()[-1]
        np.testing.assert_allclose(cluster.params(1), cluster.params(0), rtol=RTOL,
                                   atol=RTOL * 0.1)
        np.testing.assert_allclose(cluster.params(2), cluster.params(0), rtol=RTOL,
                                   atol=RTOL * 0.1)


def test_an_unreadable_checkpoint_at_resume_exits_2_naming_the_file(tmp_path: Path) -> None:
    with LocalCluster(tmp_path, tables()) as cluster:
        folder = tmp_path / "ckpt"
        folder.mkdir()
        (folder / "worker-0.ckpt.npz").write_bytes(b"PK\x03\x04 truncated, not a zip")
        result = akorun("worker", "--rank", "0", "--config", str(cluster.path), "--resume",
                        "--checkpoint-dir", str(folder), "--quiet")
        line = one_line_error(result, 2)
        assert "worker-0.ckpt.npz" in line and "unreadable checkpoint" in line


def test_what_a_killed_writer_left_is_removed(tmp_path: Path) -> None:
    """A checkpoint the link does not point at, Orbax's unfinished directory and the
    temporary link or sidecar are removed; the current checkpoint and other ranks' stay."""
    save_checkpoint(tmp_path, Checkpoint(rank=1, next_round=3, params=np.ones(3, np.float32),
                                         run_id="r", config_hash="c", scheme="allreduce",
                                         p_of=()))
    data = tmp_path / "worker-1.ckpt.d"
    kept = next(data.iterdir())
    stale = [data / "9-4242-1", data / "9-4242-2.orbax-checkpoint-tmp-5",
             tmp_path / ".worker-1.ckpt.4242.tmp", tmp_path / ".worker-1.ckpt.json.17.tmp"]
    stale[0].mkdir()
    stale[1].mkdir()
    for path in stale[2:]:
        path.write_bytes(b"half")
    other = tmp_path / ".worker-2.ckpt.json.4242.tmp"
    other.write_bytes(b"half")
    assert sorted(remove_stale_temp_files(tmp_path, 1)) == sorted(stale)
    assert not any(p.exists() for p in stale) and other.exists() and kept.exists()
    assert load_checkpoint(tmp_path, 1).next_round == 3



# --------------------------------------------------------------------------- values


def test_a_non_finite_partial_is_recorded_as_zeros_and_refused() -> None:
    values = np.array([1.0, np.nan, np.inf, 2.0], np.float32)
    partial = Partial(Kind.GRAD, 1, 3, 0, 1, 0, 4, values)
    kept, refusal = refuse_non_finite(partial)
    assert isinstance(refusal, NonFiniteValues) and "2 non-finite" in str(refusal)
    assert kept.key == partial.key and np.array_equal(kept.values, np.zeros(4))
    fine = Partial(Kind.GRAD, 1, 4, 0, 1, 0, 4, np.ones(4, np.float32))
    assert refuse_non_finite(fine) == (fine, None)


SECRET = b"faults local test secret 32 byte"
RUN = uuid.uuid4().bytes
WIRE_HASH = bytes.fromhex("0123456789abcdef")


class RefusingHost(SinkHost):
    """A sink that records a partial, then refuses its non-finite values (as a worker)."""

    async def on_partial(self, partial: Partial, nbytes: int) -> bool:
        kept, refusal = refuse_non_finite(partial)
        accepted = await super().on_partial(kept, nbytes)
        if refusal is not None:
            raise refusal
        return accepted


def test_the_server_answers_422_to_a_non_finite_partial_and_counts_it() -> None:
    host = RefusingHost(SECRET, RUN, WIRE_HASH)
    bad = Partial(Kind.GRAD, 0, 0, 0, 1, 0, 3, np.array([1, np.nan, 2], np.float32))
    signer = host.peer_signer(0)  # rank 0 of the run: the refusal is about values, not keys
    data = signer.encode(bad)
    seal = signer.seal_partial(1, PARTIAL_PATH, data)

    async def main() -> tuple[int, str]:
        import aiohttp

        (port,) = free_ports(1)
        server = Server(host, max_concurrent_reads=4)
        await server.start("127.0.0.1", port)
        try:
            async with aiohttp.ClientSession() as session, session.post(
                    f"http://127.0.0.1:{port}/v1/partial", data=data,
                    headers={"Content-Type": "application/octet-stream",
                             AUTH_HEADER: seal.text()}) as response:
                return response.status, await response.text()
        finally:
            await server.close()

    status, text = asyncio.run(main())
    assert status == 422 and text.startswith("non_finite")
    assert host.metrics.rejected["non_finite"] == 1
    assert host.seen == {bad.key}  # its round counts (no hole), its values do not


# --------------------------------------------------------------------------- CLI


def test_launch_refuses_an_out_that_is_a_file(tmp_path: Path) -> None:
    target = tmp_path / "a-file"
    target.write_text("x")
    result = akorun("launch", "--workers", "2", "--rounds", "2", "--out", str(target))
    assert "is a file" in one_line_error(result, 2)


def test_launch_refuses_a_directory_that_holds_a_run_without_force(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "result.json").write_text("{}")
    result = akorun("launch", "--workers", "2", "--rounds", "2", "--out", str(out))
    line = one_line_error(result, 2)
    assert "already holds a run" in line and "--force" in line


def test_one_endpoint_spelled_two_ways_is_refused_by_init_and_by_a_worker(
        tmp_path: Path) -> None:
    (port,) = free_ports(1)
    result = akorun("init", "--workers", "2", "--hosts", f"127.0.0.1:{port},localhost:{port}",
                    "--out", str(tmp_path / "c.toml"))
    line = one_line_error(result, 2)
    assert "both listen on 127.0.0.1" in line
    written = tmp_path / "ok.toml"
    ok = akorun("init", "--workers", "2", "--hosts", f"127.0.0.1:{port},127.0.0.1:{port + 1}",
                "--out", str(written))
    assert ok.returncode == 0, ok.stderr
    text = written.read_text().replace(f"127.0.0.1:{port + 1}", f"localhost:{port}")
    written.write_text(text)
    result = akorun("worker", "--rank", "0", "--config", str(written), "--quiet")
    assert "both listen on" in one_line_error(result, 2)


# --------------------------------------------------------------------------- restart


class _Identity:
    rank = 0

    def payload(self) -> dict[str, Any]:
        return {"rank": 0}

    def check(self, sender: int, payload: dict[str, Any]) -> None:
        return None


def _donor() -> tuple[Any, Any, Any]:
    from types import SimpleNamespace

    from akocore.schemes import AkoWorker, Replica
    from akorun.metrics import Metrics
    from akorun.runtime.lifecycle.phase import Phase, PhaseMachine
    from akorun.runtime.liveness.peer_liveness import Liveness
    from akorun.runtime.liveness.waiting import Waiter
    from akorun.runtime.recovery.rejoin import Rejoin
    from akorun.transport.sender import OwedGap

    node = AkoWorker(0, 3, 6, (1, 1, 1), replica=Replica(None, None), staleness=0)
    for round_ in range(4):  # rank 2's rounds 0..3 held
        node.receive(Partial(Kind.GRAD, 2, round_, 0, 1, 0, 6, None))
    phase = PhaseMachine()
    phase.to(Phase.RUNNING)
    clock = [0.0]
    liveness = Liveness(rank=0, peers=[1, 2], timeout_s=2.0, node=lambda: node,
                        clock=lambda: clock[0], metrics=Metrics(0, "worker"), phase=phase)
    gap = OwedGap()
    gap.fold(Partial(Kind.GRAD, 0, 7, 0, 1, 0, 6, None))
    sender = SimpleNamespace(acked_round=2, dropped_until=7, gap=gap,
                             forget_gap=gap.clear)
    role = SimpleNamespace(node=node, donor=lambda: node)
    context = one_rank_context(0, [1, 2], role=role, phase=phase, peer_timeout_s=2.0)
    rejoin = Rejoin(context, identity=_Identity(),  # type: ignore[arg-type]
                    waiter=Waiter(report_every_s=5.0), liveness=liveness,
                    outbox=SimpleNamespace(senders={2: sender}),  # type: ignore[arg-type]
                    build_node=lambda compute_s, p_of: None)
    return rejoin, node, gap


def test_a_restart_is_taken_only_from_a_rejoining_rank_after_the_rounds_we_hold() -> None:
    from akorun.transport.control import ControlError

    rejoin, node, gap = _donor()
    with pytest.raises(ControlError) as not_rejoining:
        asyncio.run(rejoin.on_restart(2, {"rank": 2, "first_round": 9}))
    assert not_rejoining.value.status == 409
    answer = asyncio.run(rejoin.on_rejoin_hello(2, {"rank": 2}))
    assert answer["received"]["contiguous"] == 3
    with pytest.raises(ControlError) as too_early:  # rounds 2 and 3 would be lost as dups
        asyncio.run(rejoin.on_restart(2, {"rank": 2, "first_round": 2}))
    assert too_early.value.status == 409
    asyncio.run(rejoin.on_restart(2, {"rank": 2, "first_round": 4}))
    assert int(node.log.contiguous[2]) == 3 and len(gap) == 0  # snapshot covers the gap
    with pytest.raises(ControlError):  # a second, replayed restart is refused
        asyncio.run(rejoin.on_restart(2, {"rank": 2, "first_round": 4}))


def test_the_kill_after_round_hook_waits_for_a_peer_only_while_something_is_owed_to_it(
        ) -> None:
    """kill_after_round waits until every peer acknowledged the round's sends; a round
    that sent a peer nothing (most of DiLoCo's rounds) owes it nothing, so the wait ends
    at once instead of never (the highest acknowledged round stays behind)."""
    from types import SimpleNamespace

    from akorun.runtime.outbox import _acked

    owing = SimpleNamespace(acked_through=1499, idle=False)
    done = SimpleNamespace(acked_through=1499, idle=True)
    assert not _acked(owing, 2, 1500, lambda peer: False)()  # type: ignore[arg-type]
    assert _acked(done, 2, 1500, lambda peer: False)()  # type: ignore[arg-type]
    assert _acked(owing, 2, 1500, lambda peer: True)()  # type: ignore[arg-type]
