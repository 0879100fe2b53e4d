"""akorun state that outlives a moment: checkpoints, snapshots on the wire, results, fault hooks."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import jax
import numpy as np
import pytest

from akocore.records.results import RankResult, RunResult
from akocore.records.run_figures import Figures
from akocore.schemes import AkoWorker, Replica
from akocore.workloads.flat import build_workload
from akorun.errors import UsageError
from akorun.faults import faults_for
from akorun.runtime.records.checkpoint_file import (
    Checkpoint,
    checkpoint_exists,
    load_checkpoint,
    optimizer_leaves,
    restore_optimizer_state,
    save_checkpoint,
)
from akorun.runtime.records.checkpoint_npz import npz_path, write_npz
from akorun.runtime.records.rank_result import summary_line
from akorun.runtime.records.result_files import (
    RankDiagnostics,
    RankSummary,
    max_relative_difference,
    merge_results,
    steady_round_time_s,
    worker_summary,
)
from akorun.transport import control


def test_a_checkpoint_round_trips_params_buffers_log_and_adam_state(tmp_path: Path) -> None:
    workload = build_workload("digits-mlp")
    optimizer = workload.optimizer("adam", 0.01)
    length = workload.param_count
    node = AkoWorker(1, 3, length, (2, 2, 2), replica=Replica(workload.init_params, optimizer),
                     staleness=1)
    batch = workload.batches(1, 3).next()
    for round_ in range(3):
        _, grad = workload.grad_step(node.params, batch.x, batch.y, round_)
        node.local_step(round_, grad)
    state = node.state()
    assert state.params is not None
    checkpoint = Checkpoint(rank=1, next_round=state.next_round, params=state.params,
                            run_id="r", config_hash="c", scheme="ako", p_of=(2, 2, 2),
                            unsent=state.unsent, inbox=state.inbox,
                            log={0: (1, {3: [0]}), 2: (-1, {})}, final_round={0: 9},
                            optimizer_leaves=optimizer_leaves(node.replica.state),
                            trained_s=12.5)
    path = save_checkpoint(tmp_path, checkpoint, structure=workload.unravel)
    assert not list(tmp_path.glob(".*tmp"))  # written through a temporary file, then moved
    back = load_checkpoint(tmp_path, 1, like=workload.unravel(workload.init_params))
    assert back.next_round == 3 and back.p_of == (2, 2, 2) and back.trained_s == 12.5
    np.testing.assert_array_equal(back.params, state.params)
    assert back.unsent is not None and state.unsent is not None
    np.testing.assert_array_equal(back.unsent, state.unsent)
    assert back.log == {0: (1, {3: [0]}), 2: (-1, {})} and back.final_round == {0: 9}
    restored = restore_optimizer_state(node.replica.state, back.optimizer_leaves)
    for a, b in zip(optimizer_leaves(restored), optimizer_leaves(node.replica.state),
                    strict=True):
        np.testing.assert_array_equal(a, b)
    sidecar = json.loads((tmp_path / "worker-1.ckpt.json").read_text())
    assert sidecar["next_round"] == 3 and sidecar["config_hash"] == "c"
    import orbax.checkpoint as ocp  # Orbax alone: the user's pytree, the state beside it

    alone = ocp.StandardCheckpointer().restore(path.resolve())
    assert set(alone) == {"params", "optimizer", "scheme", "round", "meta"}
    assert int(alone["round"]) == 3 and set(alone["scheme"]) == {"unsent", "inbox"}
    for got, want in zip(jax.tree_util.tree_leaves(alone["params"]),
                         jax.tree_util.tree_leaves(workload.unravel(state.params)), strict=True):
        np.testing.assert_array_equal(got, want)


def test_a_second_checkpoint_replaces_the_first_and_leaves_nothing_beside_it(
        tmp_path: Path) -> None:
    params = np.arange(5, dtype=np.float32)
    for next_round in (4, 8):
        save_checkpoint(tmp_path, Checkpoint(rank=0, next_round=next_round,
                                             params=params + next_round, run_id="r",
                                             config_hash="c", scheme="allreduce", p_of=()))
    assert [p.name for p in (tmp_path / "worker-0.ckpt.d").iterdir()][0].startswith("8-")
    assert len(list((tmp_path / "worker-0.ckpt.d").iterdir())) == 1
    back = load_checkpoint(tmp_path, 0)
    assert back.next_round == 8 and back.params.tolist() == (params + 8).tolist()


def test_an_npz_checkpoint_of_an_older_akorun_still_loads(tmp_path: Path) -> None:
    meta = Checkpoint(rank=2, next_round=7, params=np.zeros(1), run_id="r", config_hash="c",
                      scheme="ako", p_of=(1, 1, 1), log={1: (5, {})},
                      optimizer_leaves=(np.ones(2),)).meta()
    meta["format"] = 1
    write_npz(npz_path(tmp_path, 2), meta, {"params": np.full(4, 0.5, np.float32),
                                            "unsent": np.ones(4, np.float32),
                                            "opt_0": np.ones(2)})
    assert checkpoint_exists(tmp_path, 2)
    back = load_checkpoint(tmp_path, 2)
    assert back.next_round == 7 and back.log == {1: (5, {})} and back.inbox is None
    assert back.params.tolist() == [0.5] * 4 and back.unsent is not None
    assert len(back.optimizer_leaves) == 1


def test_the_duration_counts_the_training_seconds_of_the_processes_before() -> None:
    """--duration spans resumes: a rank resumed from a checkpoint that trained 8 s of a
    10 s run stops once it has trained 2 s more (its own clock alone would say 8 more)."""
    import asyncio
    from types import SimpleNamespace

    from akocore.settings.toml_io import config_from_dict
    from akorun.runtime.lifecycle.training import TrainingLoop

    cfg = config_from_dict({"train": {"duration": "10s"}})

    async def stops(trained_before_s: float, trained_here_s: float) -> tuple[bool, object]:
        loop = TrainingLoop.__new__(TrainingLoop)  # only what the stop rule reads
        loop.cfg, loop.waiter = cfg, SimpleNamespace(stop_reason=None)
        loop.trained_before_s = trained_before_s
        loop.train_start_s = asyncio.get_running_loop().time() - trained_here_s
        return loop.should_stop(5), loop.waiter.stop_reason

    assert asyncio.run(stops(8.0, 2.5)) == (True, "duration")
    assert asyncio.run(stops(0.0, 2.5)) == (False, None)
    assert asyncio.run(stops(8.0, 0.0)) == (False, None)


def test_a_missing_checkpoint_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no checkpoint of rank 4"):
        load_checkpoint(tmp_path, 4)


def test_snapshot_arrays_round_trip_and_a_truncated_body_is_refused() -> None:
    params = np.linspace(-1, 1, 7, dtype=np.float32)
    body = control.pack_arrays({"donor": 0, "log": {"1": [3, {}]}},
                               {"params": params, "correction": -params})
    meta, arrays = control.unpack_arrays(body)
    assert meta == {"donor": 0, "log": {"1": [3, {}]}}
    np.testing.assert_array_equal(arrays["params"], params)
    np.testing.assert_array_equal(arrays["correction"], -params)
    with pytest.raises(ValueError):
        control.unpack_arrays(body[:-4])


def test_steady_round_time_skips_the_first_tenth_of_the_rounds() -> None:
    ends = [5.0] + [5.0 + i for i in range(1, 20)]  # a 5 s first round, then 1 s each
    assert steady_round_time_s(ends) == pytest.approx(1.0)
    assert steady_round_time_s([2.0, 4.0]) == pytest.approx(2.0)
    assert math.isnan(steady_round_time_s([]))


def test_results_carry_the_akosim_keys_and_merge_over_training_workers() -> None:
    summary = worker_summary(scheme="ako", p_of=(2, 2), ssp=math.inf, workers=2,
                             training_workers=2, batch_size=32,
                             round_end_s=[0.1 * (i + 1) for i in range(20)],
                             compute_s=[0.05] * 20, wait_s=[0.01] * 20, bytes_sent=2000)
    workers = [RankResult(rank=r, role="worker", **summary.as_fields()) for r in range(2)]
    written = workers[0].to_json()
    assert written["ssp"] == "inf" and written["p_of"] == [2, 2] and written["p"] == 2
    assert summary.round_time_s == pytest.approx(0.1)
    assert summary.samples_per_s == pytest.approx(2 * 32 / 0.1)
    assert summary.bytes_sent_per_worker_per_round == 100
    merged = merge_results({"train": {}}, workers, [np.ones(3), np.ones(3) * (1 + 1e-7)],
                           batch_size=32)
    assert merged.per_worker[1].compute_s_per_round == pytest.approx(0.05)
    assert merged.workers == 2
    assert merged.round_time_s == pytest.approx(0.1)
    assert merged.max_relative_difference == pytest.approx(1e-7, rel=1e-3)
    assert max_relative_difference([np.ones(2), np.ones(3)]) == math.inf


def test_the_rank_records_feed_the_schema_fields_and_keep_diagnostics_apart() -> None:
    rank_fields = {f.name for f in dataclasses.fields(RankResult)}
    run_fields = {f.name for f in dataclasses.fields(RunResult)}
    assert {f.name for f in dataclasses.fields(RankSummary)} <= rank_fields
    assert {f.name for f in dataclasses.fields(Figures)} <= rank_fields & run_fields
    assert not {f.name for f in dataclasses.fields(RankDiagnostics)} & rank_fields


def test_the_summary_line_reads_the_rank_record() -> None:
    rank = RankResult(rank=1, role="worker", rounds=20, round_time_s=0.0125,
                      final_accuracy=0.5, bytes_sent=2e6)
    assert summary_line(rank) == ("rank 1 (worker), 20 rounds, 12.50 ms/round, "
                                  "accuracy 0.5000, sent 2.00 MB")
    server = RankResult(rank=2, role="ps", rounds=0, bytes_sent=1e6)
    assert summary_line(server) == "rank 2 (ps), 0 rounds, sent 1.00 MB"


def test_fault_hooks_apply_to_their_rank_only() -> None:
    env = {"AKORUN_FAULT": "2@kill_after_round:5; pause_before_round:7:/tmp/x;"
                           "1@sleep_per_round:0.5"}
    assert faults_for(2, env).kill_after_round == 5
    assert faults_for(0, env).kill_after_round is None
    assert faults_for(0, env).pause_before_round == 7
    assert faults_for(1, env).sleep_per_round_s == 0.5
    assert not faults_for(0, {}).any
    with pytest.raises(UsageError, match="AKORUN_FAULT"):
        faults_for(0, {"AKORUN_FAULT": "explode:now"})
