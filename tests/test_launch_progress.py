"""`akorun launch`'s progress line: each rank's phase in full words from its first second
(the phase file before /status answers), the slowest training rank's rate and the time
left, exit statuses."""

from __future__ import annotations

from pathlib import Path

from akorun.launching.progress_line import ProgressBoard
from akorun.runtime.lifecycle import startup_phase
from akorun.runtime.lifecycle.startup_phase import StartupPhase, read_phase


class Clock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def test_a_rank_without_a_status_shows_the_phase_it_said_or_importing(tmp_path: Path) -> None:
    StartupPhase(tmp_path, 1).say(startup_phase.MEASURING)
    line = ProgressBoard(100, tmp_path).line([None, None, None], [None, None, 2])
    assert line == ("[launch] of 100 rounds: 0:importing  1:measuring its step  "
                    "2:exited 2")


def test_a_phase_is_rewritten_whole_and_none_without_a_directory(tmp_path: Path) -> None:
    phase = StartupPhase(tmp_path, 0)
    phase.say(startup_phase.LOADING)
    phase.say(startup_phase.COMPILING)
    assert read_phase(tmp_path, 0) == "compiling"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["worker-0.phase"]  # no temp left
    phase.clear()
    assert read_phase(tmp_path, 0) is None and not list(tmp_path.iterdir())
    StartupPhase(None, 0).say("anything")  # nowhere to say it: nothing happens
    assert read_phase(tmp_path, 5) is None


def test_the_rate_is_the_slowest_training_ranks_and_the_eta_its_rounds_left() -> None:
    clock = Clock()
    board = ProgressBoard(1000, None, clock=clock)
    statuses = [{"state": "running", "round": 100}, {"state": "running", "round": 120},
                {"state": "starting", "round": 0}]
    first = board.line(statuses, [None, None, None])
    assert first == "[launch] of 1000 rounds: 0:running r100  1:running r120  2:joining"
    clock.now_s = 10.0
    statuses[0]["round"], statuses[1]["round"] = 300, 310
    line = board.line(statuses, [None, None, None])
    assert "20.0 rounds/s" in line and "ETA 0:35" in line  # (1000 - 300) / 20


def test_suspended_peers_and_the_mean_loss_are_shown() -> None:
    statuses = [{"state": "running", "round": 5, "suspended": [2],
                 "metrics": {"loss": 1.0}},
                {"state": "finishing", "round": 7, "metrics": {"loss": 2.0}}]
    line = ProgressBoard(None, None).line(statuses, [None, None])
    assert line == ("[launch] rounds: 0:running r5 (suspended 2)  1:finishing r7  "
                    "loss 1.5000")


def test_a_rank_whose_status_stops_answering_is_exiting_after_done_else_not_answering(
        tmp_path: Path) -> None:
    StartupPhase(tmp_path, 0).say(startup_phase.COMPILING)  # said long ago: not shown again
    board = ProgressBoard(10, tmp_path)
    board.line([{"state": "done", "round": 10}, {"state": "running", "round": 4}],
               [None, None])
    assert board.line([None, None], [None, None]) == \
        "[launch] of 10 rounds: 0:exiting  1:not answering"
