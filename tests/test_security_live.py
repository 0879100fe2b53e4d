"""The wire's security against real workers: replays from an earlier run, and slow or forged
connections held on every rank while a run trains.

Both start 3-rank loopback runs (akorun.testing.LocalCluster, subprocesses).
Nothing here depends on timing: the replays are answered by status, and the
attack test asserts that the run completes all its rounds with equal
replicas while the attack connections stay open (the benchmark measures how
much slower it goes: ``akorun.rounds_under_attack``).
"""

from __future__ import annotations

import base64
import os
import random
import socket
import struct
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from akocore.messages import Kind, Partial
from akocore.workloads.flat import build_workload
from akorun.runtime.node_plan import params_digest, wire_hash
from akorun.testing import LocalCluster, wait_for
from akorun.transport import wire
from akorun.transport.control import ControlKind
from akorun.transport.datapath import MAGIC as DATA_PATH_MAGIC
from akorun.transport.datapath import PREAMBLE, encode_request_meta
from akorun.transport.keys import AUTH_HEADER, SEAL_FORMAT, SEAL_VERSION, TAG_BYTES
from tests.peer import Peer, Sent, replay

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def tables(**train: Any) -> dict[str, Any]:
    return {"cluster": {"workers": 3},
            "exchange": {"p": 2, "ssp": 0},
            "train": {"workload": "digits-mlp", "optimizer": "sgd", "lr": 0.1, "rounds": 12,
                      "eval_every": 1000, **train}}


def assert_equal_replicas(cluster: LocalCluster) -> None:
    replicas = [cluster.params(rank) for rank in range(3)]
    for replica in replicas[1:]:
        np.testing.assert_allclose(replica, replicas[0], rtol=1e-5, atol=1e-6)


def paused_at(cluster: LocalCluster, round_: int) -> bool:
    statuses = [cluster.status(rank) for rank in range(3)]
    return all(s is not None and s["round"] == round_ for s in statuses)


def test_every_message_recorded_in_an_earlier_run_is_refused_by_the_next(
        tmp_path: Path) -> None:
    """Run 1 and run 2 start from the same cluster file (the workflow of
    docs/guide/several-hosts.md). Messages
    of every kind sealed by rank 1 in run 1 are sent again to rank 0 in run 2: each is
    refused (421: sealed for run 1's instance of rank 0), nothing acts on them, and run 2
    ends every round with equal replicas."""
    theta0 = np.array(build_workload("digits-mlp").init_params)
    with LocalCluster(tmp_path, tables()) as cluster:
        settings = cluster.settings
        urls = [cluster.url(rank) for rank in range(3)]
        hash8 = wire_hash(cluster.config, params_digest(theta0), (2, 2, 2))
        half = theta0.size // 2
        data = wire.encode_bytes(
            Partial(Kind.GRAD, 1, 0, 1, 2, half, theta0.size - half,
                    np.full(theta0.size - half, 1e3, dtype=np.float32)),
            run_id=settings.run_id_bytes, config_hash=hash8)
        payloads: dict[ControlKind, dict[str, object]] = {
            ControlKind.HELLO: {}, ControlKind.HEARTBEAT: {}, ControlKind.DONE: {},
            ControlKind.STOP: {"round": 2, "accuracy": 1.0}, ControlKind.SNAPSHOT: {"need": {}},
            ControlKind.REJOIN_HELLO: {}, ControlKind.RESTART: {"first_round": 100}}

        cluster.start_all("--quiet", env={"AKORUN_FAULT": f"pause_before_round:3:"
                                                          f"{tmp_path / 'never'}"})
        wait_for(lambda: paused_at(cluster, 3), 90, "run 1 paused before round 3")
        rank1 = Peer(settings.secret_bytes, settings.run_id_bytes, 1, urls,
                     nonce=Peer(settings.secret_bytes, settings.run_id_bytes, 2, urls).discover(1))
        rank1.count_from(1 << 40)  # the live rank 1 sends heartbeats from counter 1 meanwhile
        recorded: dict[str, Sent] = {"partial": rank1.partial(0, data)}
        for kind, payload in payloads.items():
            recorded[kind.value] = rank1.control(0, kind, payload)
        assert recorded["partial"].status == 200  # authentic in run 1 (a duplicate there)
        assert recorded["heartbeat"].status == 200
        cluster.kill_all()

        go = tmp_path / "go"
        cluster.start_all("--quiet", env={"AKORUN_FAULT": f"pause_before_round:3:{go}"})
        wait_for(lambda: paused_at(cluster, 3), 90, "run 2 paused before round 3")
        before = cluster.status(0, digest=True)
        replayed = {name: replay(sent) for name, sent in recorded.items()}
        after = cluster.status(0, digest=True)
        assert replayed == {name: 421 for name in recorded}
        assert before is not None and after is not None
        for key in ("params_sha256", "inbox_sha256", "round", "contiguous", "stop_reason"):
            assert after[key] == before[key], key
        assert after["metrics"]["rejected"]["stale_session"] == len(recorded)
        go.touch()
        codes = cluster.wait_all(120)
        assert codes == {0: 0, 1: 0, 2: 0}, cluster.logs()
        assert [cluster.result(rank)["rounds"] for rank in range(3)] == [12, 12, 12]
        assert_equal_replicas(cluster)


# ---------------------------------------------------------------------- slow and forged


def forged_seal() -> str:
    fields = struct.pack(SEAL_FORMAT, SEAL_VERSION, 0, 1, os.urandom(16), os.urandom(16), 1,
                         os.urandom(32))
    return base64.b64encode(fields + os.urandom(TAG_BYTES)).decode()


def attack_request(kind: int, host: str) -> bytes:
    """The first bytes of one slow or forged request (its body then comes a byte at a time)."""
    big = 4 * 1024 * 1024
    if kind == 0:  # a forged seal, a 4 MiB partial to come slowly
        return (f"POST /v1/partial HTTP/1.1\r\nHost: {host}\r\nContent-Length: {big}\r\n"
                f"{AUTH_HEADER}: {forged_seal()}\r\n\r\n").encode()
    if kind == 1:  # no seal at all
        return f"POST /v1/partial HTTP/1.1\r\nHost: {host}\r\nContent-Length: {big}\r\n\r\n" \
            .encode()
    if kind == 2:  # a forged control message, its body slowly
        return (f"POST /v1/stop HTTP/1.1\r\nHost: {host}\r\nContent-Length: 60000\r\n"
                f"{AUTH_HEADER}: {forged_seal()}\r\n\r\n").encode()
    if kind == 3:  # headers that never end
        return f"POST /v1/partial HTTP/1.1\r\nHost: {host}\r\n".encode()
    if kind == 5:  # the data path: a forged seal over a header promising a 4 MiB body
        header = bytearray(wire.HEADER_SIZE)
        header[:4], header[4], header[6] = wire.MAGIC, wire.VERSION, wire.DTYPE_FLOAT32
        header[60:68] = (big // 4).to_bytes(8, "little")
        return encode_request_meta(forged_seal(), None, None) + bytes(header)
    if kind == 6:  # the data path: a preamble whose texts never end
        return PREAMBLE.pack(DATA_PATH_MAGIC, 1, 4000, 0, 0)
    return b""  # connected, silent


ATTACK_KINDS = 7


class Attacker:
    """Keeps `per_rank` slow or forged connections open to every address, reopening any
    the server closes, and trickles one byte into each every `trickle_s`."""

    def __init__(self, addresses: list[tuple[str, int]], per_rank: int,
                 training: Callable[[], bool], trickle_s: float = 0.25) -> None:
        self.addresses = addresses
        self.per_rank = per_rank
        self.trickle_s = trickle_s
        self.open: dict[int, list[socket.socket]] = {i: [] for i in range(len(addresses))}
        self.opened = [0] * len(addresses)
        self.min_open_while_training: list[int | None] = [None] * len(addresses)
        self.training = training  # every rank still runs (then count what is held)
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._rng = random.Random(0)

    def _connect(self, index: int) -> None:
        host, port = self.addresses[index]
        try:
            sock = socket.create_connection((host, port), timeout=1.0)
            sock.setblocking(False)
            kind = self.opened[index] % ATTACK_KINDS
            if kind != 4:
                sock.send(attack_request(kind, f"{host}:{port}"))
        except OSError:
            return
        self.opened[index] += 1
        self.open[index].append(sock)

    def _run(self) -> None:
        while not self._stop.is_set():
            for index in range(len(self.addresses)):
                alive = []
                for sock in self.open[index]:
                    try:
                        sock.send(b"x")
                        alive.append(sock)
                    except (BlockingIOError, InterruptedError):
                        alive.append(sock)
                    except OSError:
                        sock.close()
                self.open[index] = alive
            if self.training():  # every rank in its rounds: count what is held
                self.samples += 1
                for index, socks in self.open.items():
                    low = self.min_open_while_training[index]
                    self.min_open_while_training[index] = \
                        len(socks) if low is None else min(low, len(socks))
            for index in range(len(self.addresses)):
                while len(self.open[index]) < self.per_rank and not self._stop.is_set():
                    before = len(self.open[index])
                    self._connect(index)
                    if len(self.open[index]) == before:
                        break
            self._stop.wait(self.trickle_s)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        for socks in self.open.values():
            for sock in socks:
                sock.close()


def test_training_completes_with_slow_and_forged_connections_held_on_every_rank(
        tmp_path: Path) -> None:
    per_rank, rounds = 100, 400
    go = tmp_path / "go"
    with LocalCluster(tmp_path, tables(rounds=rounds)) as cluster:
        addresses = []
        for entry in cluster.config.cluster.hosts:
            host, port = entry.rsplit(":", 1)
            addresses.append((host, int(port)))
        held = threading.Event()  # every attack connection was opened once

        rounds_seen: list[int] = []  # rank 0's round at each count of held connections

        def training() -> bool:
            if not held.is_set():
                return False
            statuses = [cluster.status(rank) for rank in range(3)]
            if not all(s is not None and not s["finished"] and 1 <= s["round"] < rounds - 1
                       for s in statuses):
                return False
            rounds_seen.append(statuses[0]["round"])  # type: ignore[index]
            return True

        attacker = Attacker(addresses, per_rank, training)
        cluster.start_all("--quiet", env={"AKORUN_FAULT": f"pause_before_round:1:{go}"})
        attacker.start()  # from before the ranks listen: the join happens under attack too
        try:
            wait_for(lambda: all(len(s) >= per_rank for s in attacker.open.values()), 90,
                     f"{per_rank} attack connections open to every rank")
            wait_for(lambda: paused_at(cluster, 1), 90, "every rank joined (under attack)")
            held.set()
            go.touch()
            codes = cluster.wait_all(180)
        finally:
            attacker.stop()
        assert codes == {0: 0, 1: 0, 2: 0}, cluster.logs()
        assert [cluster.result(rank)["rounds"] for rank in range(3)] == [rounds] * 3
        assert_equal_replicas(cluster)
        # held the whole time (the server may close some: the attacker reopens them at once)
        assert attacker.samples > 3, (attacker.samples, rounds_seen)
        assert max(rounds_seen) - min(rounds_seen) >= 10  # the rounds went on meanwhile
        assert all(low is not None and low >= per_rank // 2
                   for low in attacker.min_open_while_training), attacker.min_open_while_training
        assert all(count >= per_rank for count in attacker.opened)
