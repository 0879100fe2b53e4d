"""Per-rank key files (`akorun init --per-rank-keys DIR`): a host holds only its own rank's row.

The cluster file then holds no secret, and rank R's key file holds only the
keys of the pairs (R, j). These tests show that rank i's file cannot make a
message that rank k accepts as from rank j (every key i holds, tried as the
(j, k) key: 401), that a file that does not fit the run is refused with
exit 2 and one line, and that a 3-rank run started from such files trains
to equal replicas.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import uuid
from pathlib import Path

import numpy as np
import pytest

from akocore.messages import Kind, Partial
from akorun.launching.cluster import read_cluster_file
from akorun.launching.commands import main
from akorun.testing import REPO_ROOT, SinkHost, akorun_command, child_test_env
from akorun.transport import wire
from akorun.transport.control import ControlKind
from akorun.transport.keys import RankKeys, read_rank_keys, write_rank_key_files
from tests.test_security_sessions import serving

SECRET = b"rank key file test secret, 32 B!"
RUN = uuid.uuid4().bytes
WIRE_HASH = bytes.fromhex("0011223344556677")
WORLD = 3


def partial_from(sender: int, length: int = 64) -> bytes:
    values = np.full(length, 1.5, dtype=np.float32)
    return wire.encode_bytes(Partial(Kind.GRAD, sender, 0, 0, 1, 0, length, values),
                             run_id=RUN, config_hash=WIRE_HASH)


def test_a_rank_key_file_holds_its_row_only_owner_readable(tmp_path: Path) -> None:
    paths = write_rank_key_files(tmp_path / "keys", SECRET, RUN, WORLD)
    assert [path.name for path in paths] == [f"rank-{rank}.keys" for rank in range(WORLD)]
    assert stat.S_IMODE(os.stat(tmp_path / "keys").st_mode) == 0o700
    for rank, path in enumerate(paths):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        text = path.read_text()
        assert SECRET.hex() not in text
        keys = read_rank_keys(path)
        assert keys == RankKeys.from_secret(SECRET, RUN, rank, WORLD)
        assert set(json.loads(text)["pairs"]) == {str(j) for j in range(WORLD) if j != rank}


def test_a_member_holding_its_key_file_cannot_speak_as_another_rank(tmp_path: Path) -> None:
    """Rank 2's file against rank 1 (a real server): claiming to be rank 0 with any key rank 2
    holds is refused at discovery, for partials and for control messages; rank 0's own file
    is accepted."""
    paths = write_rank_key_files(tmp_path, SECRET, RUN, WORLD)
    stolen = read_rank_keys(paths[2])
    host = SinkHost(SECRET, RUN, WIRE_HASH, world=WORLD)
    from tests.peer import Peer

    async def body(url: str) -> dict[str, list[int]]:
        urls = [url] * WORLD
        answers: dict[str, list[int]] = {}
        for held in sorted(stolen.pairs):  # each key rank 2 holds, used as the (0, 1) key
            guess = stolen.pair(held)
            forger = Peer.from_keys(RankKeys(0, WORLD, RUN, {1: guess, 2: guess}), urls)
            with pytest.raises(AssertionError, match="discovery of rank 1 failed: 401"):
                await asyncio.to_thread(forger.discover, 1)
            forger.signer.learn(1, host.verifier.sessions.nonce)
            answers[f"with pair(2,{held})"] = [
                (await asyncio.to_thread(forger.partial, 1, partial_from(0))).status,
                (await asyncio.to_thread(forger.control, 1, ControlKind.HEARTBEAT, {})
                 ).status]
        genuine = Peer.from_keys(read_rank_keys(paths[0]), urls)
        answers["rank 0's file"] = [
            (await asyncio.to_thread(genuine.partial, 1, partial_from(0))).status,
            (await asyncio.to_thread(genuine.control, 1, ControlKind.HEARTBEAT, {})).status]
        return answers

    answers = asyncio.run(serving(host, body))
    assert answers == {"with pair(2,0)": [401, 401], "with pair(2,1)": [401, 401],
                       "rank 0's file": [200, 200]}
    assert [key for _, _, key in host.arrivals] == [(0, 0, 0)]  # only the genuine one
    assert [kind for kind, _ in host.controls] == [ControlKind.HEARTBEAT]


def _init(tmp_path: Path, *extra: str) -> tuple[Path, Path]:
    cluster, keys = tmp_path / "cluster.toml", tmp_path / "keys"
    code = main(["init", "--workers", "3", "--out", str(cluster), "--per-rank-keys", str(keys),
                 "--workload", "digits-mlp", "--optimizer", "sgd", "--lr", "0.1",
                 "--rounds", "12", "--p", "2", "--ssp", "0", "--peer-timeout", "3s", *extra])
    assert code == 0
    return cluster, keys


def test_init_with_per_rank_keys_leaves_the_secret_out_and_workers_need_their_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster, keys = _init(tmp_path)
    assert read_cluster_file(cluster).settings.secret is None
    assert "secret = " not in cluster.read_text().replace("# secret = ", "")
    run_id = read_cluster_file(cluster).settings.run_id
    assert read_rank_keys(keys / "rank-1.keys").run_id.hex() == run_id
    capsys.readouterr()
    cases = {
        "no key file": [],
        "another rank's file": ["--keys", str(keys / "rank-1.keys")],
        "no such file": ["--keys", str(keys / "rank-9.keys")],
    }
    for flags in cases.values():
        assert main(["worker", "--rank", "0", "--config", str(cluster), *flags]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 3
    assert "holds no secret" in lines[0] and "--keys FILE" in lines[0]
    assert "key file of rank 1 of 3, this is rank 0 of 3" in lines[1]
    assert "cannot read the rank key file" in lines[2]
    other, _ = _init(tmp_path / "other")  # another run's file
    assert main(["worker", "--rank", "1", "--config", str(other), "--keys",
                 str(keys / "rank-1.keys")]) == 2
    assert "written for run" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_three_ranks_train_over_per_rank_key_files(tmp_path: Path) -> None:
    """With the allow-list derived from cluster.hosts, too (the ranks' own addresses)."""
    cluster, keys = _init(tmp_path, "--allow", "hosts")
    assert 'allow = ["hosts"]' in cluster.read_text()
    out = tmp_path / "out"
    procs = []
    for rank in range(3):
        command = akorun_command("worker", "--rank", str(rank), "--config", str(cluster),
                                 "--keys", str(keys / "rank-{rank}.keys"), "--out", str(out),
                                 "--quiet")
        log = open(tmp_path / f"rank-{rank}.log", "wb")  # noqa: SIM115 (closed below)
        procs.append((subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                       env=child_test_env(), cwd=REPO_ROOT), log))
    try:
        codes = [proc.wait(200) for proc, _ in procs]
    finally:
        for proc, log in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()
    logs = "\n".join((tmp_path / f"rank-{rank}.log").read_text() for rank in range(3))
    assert codes == [0, 0, 0], logs
    replicas = [np.load(out / f"worker-{rank}.npz")["params"] for rank in range(3)]
    assert all(json.loads((out / f"worker-{rank}.json").read_text())["rounds"] == 12
               for rank in range(3))
    for replica in replicas[1:]:
        np.testing.assert_allclose(replica, replicas[0], rtol=1e-5, atol=1e-6)
