"""akosim's progress off a terminal: plain lines at most every few seconds per task, none
for a task done sooner, nothing when quiet (akosim.progress)."""

from __future__ import annotations

import io

from akosim.progress import ProgressLines, tracker_factory


class Clock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def test_plain_lines_come_at_most_every_interval_and_say_the_share_done() -> None:
    stream, clock = io.StringIO(), Clock()
    update = ProgressLines("ako p=3", 1000, "round", stream=stream, every_s=10, clock=clock)
    update(10)  # within the first interval: nothing
    clock.now_s = 10.5
    update(400)
    update(410)  # again within the interval
    clock.now_s = 21.0
    update(1000)
    clock.now_s = 40.0
    update(1000)  # done: said once
    assert stream.getvalue().splitlines() == [
        "akosim: ako p=3: 400/1000 round (40%)", "akosim: ako p=3: 1000/1000 round (100%)"]


def test_a_short_task_says_nothing_and_quiet_makes_no_tracker() -> None:
    stream = io.StringIO()
    update = ProgressLines("sweep", 3, "points", stream=stream, every_s=10, clock=Clock())
    for done in (1, 2, 3):
        update(done)
    assert stream.getvalue() == ""
    assert tracker_factory(quiet=True) is None
    assert isinstance(tracker_factory(quiet=False, terminal=False)("x", 5, "round"),
                      ProgressLines)
