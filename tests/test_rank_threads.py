"""XLA's thread pool per rank when ranks share a host's cores (akocore.rank_threads) and
what `akorun launch` gives its children."""

from __future__ import annotations

import pytest

from akocore.rank_threads import (
    SINGLE_THREAD_XLA_FLAGS,
    rank_thread_env,
    threads_per_rank,
)
from akorun.errors import UsageError


def test_ranks_sharing_the_cores_get_a_share_each() -> None:
    assert threads_per_rank(2, 3) == 1
    assert threads_per_rank(16, 3) == 5
    assert rank_thread_env(2, 3, {}) == {"NPROC": "1", "XLA_FLAGS": SINGLE_THREAD_XLA_FLAGS}
    assert rank_thread_env(16, 4, {}) == {"NPROC": "4"}  # more than one: Eigen stays on


def test_a_rank_with_the_cores_to_itself_keeps_xlas_default() -> None:
    assert rank_thread_env(2, 1, {}) == {}
    assert rank_thread_env(8, 1, {}) == {}


def test_the_users_variables_win() -> None:
    assert rank_thread_env(2, 3, {"NPROC": "2"}) == {"XLA_FLAGS": SINGLE_THREAD_XLA_FLAGS}
    assert rank_thread_env(2, 3, {"XLA_FLAGS": "--xla_cpu_enable_fast_math=false"}) == {
        "NPROC": "1"}
    assert rank_thread_env(2, 3, {"AKO_THREADS_PER_RANK": "2"}) == {"NPROC": "2"}
    assert rank_thread_env(8, 1, {"AKO_THREADS_PER_RANK": "1"}) == {
        "NPROC": "1", "XLA_FLAGS": SINGLE_THREAD_XLA_FLAGS}


@pytest.mark.parametrize("text", ["0", "-1", "two", "1.5"])
def test_a_bad_override_is_one_line(text: str) -> None:
    with pytest.raises(ValueError, match="AKO_THREADS_PER_RANK"):
        rank_thread_env(2, 3, {"AKO_THREADS_PER_RANK": text})


def test_launch_gives_its_children_their_share(monkeypatch: pytest.MonkeyPatch) -> None:
    from akorun.launching import local

    for name in ("NPROC", "XLA_FLAGS", "AKO_THREADS_PER_RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(local, "host_cores", lambda: 2)
    env = local.child_env(3, {})
    assert env["NPROC"] == "1" and env["XLA_FLAGS"] == SINGLE_THREAD_XLA_FLAGS
    assert "NPROC" not in local.child_env(1, {})
    assert local.child_env(3, {"AKO_THREADS_PER_RANK": "2"})["NPROC"] == "2"
    with pytest.raises(UsageError, match="AKO_THREADS_PER_RANK"):
        local.child_env(3, {"AKO_THREADS_PER_RANK": "none"})


def test_a_rank_started_by_hand_shares_its_host(monkeypatch: pytest.MonkeyPatch) -> None:
    from akorun.launching import local

    for name in ("NPROC", "XLA_FLAGS", "AKO_THREADS_PER_RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(local, "host_cores", lambda: 8)
    hosts = ["10.0.0.1:7070", "10.0.0.1:7071", "10.0.0.2:7070"]
    assert local.share_host_cores(hosts, 2) == {}  # alone on its host
    assert local.share_host_cores(hosts, 0) == {"NPROC": "4"}
    assert local.os.environ["NPROC"] == "4"
    assert local.share_host_cores(hosts, 1) == {}  # what is set stays (launch's, the user's)
