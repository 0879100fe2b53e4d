"""The line `akorun launch` prints every few seconds: each rank's phase in full words, the
slowest training rank's rounds per second and the time left.

Before a rank's server answers /status it says what it is doing in its phase file
(akorun.runtime.lifecycle.startup_phase: loading the workload, measuring its step, compiling);
a rank that has said nothing yet is importing. Once /status answers, its
state is shown with its round ("starting" there means it is joining); a rank whose
/status stops answering is exiting (after done) or not answering, and an exited rank
shows its exit status. The rate is the slowest training rank's progress over the
last `RATE_WINDOW_S`; the time left is the rounds it still has at that rate.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from akorun.runtime.lifecycle.startup_phase import read_phase

RATE_WINDOW_S = 10.0  # the rate is taken over about this long
TRAINING_STATES = ("running", "finishing", "done")


def _clock_text(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class ProgressBoard:
    """The progress line, keeping the slowest rank's recent rounds for its rate."""

    def __init__(self, rounds: int | None, out_dir: Path | None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.rounds = rounds
        self.out_dir = out_dir
        self.clock = clock
        self.samples: deque[tuple[float, int]] = deque()  # (time, slowest training round)
        self.last_state: dict[int, str] = {}  # rank -> the state its /status last said

    def _rank_text(self, rank: int, status: dict[str, Any] | None,
                   exit_code: int | None) -> str:
        if exit_code is not None:
            return f"{rank}:exited {exit_code}"
        if status is None:
            last = self.last_state.get(rank)
            if last is not None:  # it answered before: its server has closed, or it hangs
                return f"{rank}:{'exiting' if last == 'done' else 'not answering'}"
            said = read_phase(self.out_dir, rank) if self.out_dir is not None else None
            return f"{rank}:{said or 'importing'}"
        state = self.last_state[rank] = str(status.get("state", "?"))
        if state == "starting":
            return f"{rank}:joining"
        text = f"{rank}:{state} r{status.get('round', 0)}"
        suspended = status.get("suspended") or []
        if suspended:
            text += f" (suspended {','.join(map(str, suspended))})"
        return text

    def _rate(self, statuses: Sequence[dict[str, Any] | None]) -> str:
        rounds = [r for s in statuses if s is not None and s.get("state") in TRAINING_STATES
                  and isinstance(r := s.get("round"), int)]
        if not rounds or not any(s is not None and s.get("state") == "running"
                                 for s in statuses):
            return ""
        now = self.clock()
        self.samples.append((now, min(rounds)))
        while len(self.samples) > 2 and now - self.samples[1][0] >= RATE_WINDOW_S:
            self.samples.popleft()
        (then_s, then_round), (_, round_now) = self.samples[0], self.samples[-1]
        if now - then_s <= 0 or round_now <= then_round:
            return ""
        per_s = (round_now - then_round) / (now - then_s)
        text = f"  {per_s:.1f} rounds/s"
        if self.rounds:
            text += f"  ETA {_clock_text(max(0, self.rounds - round_now) / per_s)}"
        return text

    def line(self, statuses: Sequence[dict[str, Any] | None],
             exit_codes: Sequence[int | None]) -> str:
        """The line for these /status answers (None: no answer) and exit statuses (None:
        still running), rank by rank."""
        parts = [self._rank_text(rank, status, code)
                 for rank, (status, code) in enumerate(zip(statuses, exit_codes, strict=True))]
        head = f"of {self.rounds} rounds" if self.rounds else "rounds"
        line = f"[launch] {head}: " + "  ".join(parts) + self._rate(statuses)
        losses = [s["metrics"].get("loss") for s in statuses if s and s.get("metrics")]
        losses = [v for v in losses if isinstance(v, float)]
        if losses:
            line += f"  loss {sum(losses) / len(losses):.4f}"
        return line
