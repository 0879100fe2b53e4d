"""Deterministic fault injection for tests (a TEST HOOK, not a feature).

Like torchft's EventInjector, faults are keyed by logical time (rounds), not
by sleeps, so fault tests do not depend on machine speed. They are read from
the environment variable ``AKORUN_FAULT``: items separated by ``;``, each
optionally prefixed by ``RANK@`` to apply to one rank only:

- ``kill_after_round:R``: after round R's local step, wait until every peer
  acknowledged that round's sends, then SIGKILL this process (a crash that
  lands between two rounds, the case the rejoin protocol repairs exactly).
- ``kill_before_round:R``: SIGKILL this process just before round R
  (``kill_before_round:0``: a crash at the start, right after the join).
- ``kill_mid_send:R``: after round R's local step, SIGKILL as soon as ONE peer
  acknowledged round R's message, while the others may still be waiting for
  theirs (a crash in the middle of a round's sends).
- ``kill_mid_multicast:R``: send round R's partial to the lowest-ranked peer
  only, wait until it acknowledged every round through R, then SIGKILL: the
  other peers never get round R from this rank (a kill in the middle of a
  round's sends, made deterministic; akorun.runtime.recovery.relay repairs it).
- ``kill_mid_checkpoint:R``: SIGKILL during the first checkpoint written after
  round R, once its temp file is written and before it is moved into place.
- ``kill_at_end``: SIGKILL after the last round, before the final flush.
- ``kill_in_join``: SIGKILL during the join, when a peer says hello for the
  second time (it got our answer to its first: it knows we were up).
- ``pause_before_round:R:PATH``: before starting round R, wait (without
  blocking the event loop) until the file PATH exists.
- ``pause_in_join`` or ``pause_in_join:PATH``: hold this rank in its join,
  before its own hellos, until a stop is requested (SIGTERM, Ctrl-C) or the
  file PATH exists; its server answers the others' hellos meanwhile, so they
  join and train while it is still starting.
- ``sleep_per_round:S``: sleep S seconds after every round (a slow worker).
- ``relay_withhold:J``: answer rank J's relay pulls (runtime.recovery.relay) with no
  messages, whatever this rank holds (its record stays honest).
- ``relay_late:J:S``: answer rank J's relay pulls S seconds late.
- ``send_nonfinite:R``: from round R on, send a NaN gradient past the rank's own
  check (a member whose gradient went non-finite beyond its guard: what a peer
  refuses for good).
- ``record_gradients:DIR``: write every gradient this rank hands its scheme to
  ``DIR/rank-R/round-T.npy`` (what a test sums to check the exactly-once invariant).
- ``send_malformed:R:HOW``: from round R on, send coded data a correct member never
  sends, authenticated as usual: ``topk_index`` (a top-k index past the vector's
  end), ``int8_scale`` (an int8 scale that is NaN) or ``int8_negative`` (one that
  is negative); the run's codec must be the one named.

Example: ``AKORUN_FAULT="2@kill_after_round:5;0@pause_before_round:20:/tmp/go"``.
This module parses them; akorun.runtime.fault_hooks carries them out.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from akorun.errors import UsageError

ENV_VAR = "AKORUN_FAULT"
MALFORMED_KINDS = ("topk_index", "int8_scale", "int8_negative")  # send_malformed's HOW


@dataclass(frozen=True)
class Faults:
    """The faults that apply to one rank."""

    kill_after_round: int | None = None
    kill_before_round: int | None = None
    kill_mid_send: int | None = None
    kill_mid_checkpoint: int | None = None
    kill_mid_multicast: int | None = None
    kill_at_end: bool = False
    kill_in_join: bool = False
    pause_before_round: int | None = None
    pause_until_file: str | None = None
    pause_in_join: bool = False
    pause_in_join_file: str | None = None
    sleep_per_round_s: float = 0.0
    relay_withhold: int | None = None  # a rank whose relay pulls get nothing from this one
    relay_late: tuple[int, float] | None = None  # (rank, seconds) its relay pulls wait
    send_nonfinite: int | None = None  # from this round on, a NaN gradient goes out
    record_gradients: str | None = None  # the directory this rank's gradients go to
    send_malformed: tuple[int, str] | None = None  # (round, how): malformed coded bodies

    @property
    def any(self) -> bool:
        return (self.kill_after_round is not None or self.pause_before_round is not None
                or self.kill_before_round is not None or self.kill_mid_send is not None
                or self.kill_mid_checkpoint is not None or self.kill_at_end
                or self.kill_mid_multicast is not None or self.kill_in_join
                or self.pause_in_join or self.sleep_per_round_s > 0
                or self.relay_withhold is not None or self.relay_late is not None
                or self.send_nonfinite is not None or self.record_gradients is not None
                or self.send_malformed is not None)


def faults_for(rank: int, env: Mapping[str, str]) -> Faults:
    """Parse AKORUN_FAULT for `rank`; UsageError on a malformed item."""
    text = env.get(ENV_VAR, "").strip()
    values: dict[str, object] = {}
    for item in filter(None, (part.strip() for part in text.split(";"))):
        target, at, spec = item.partition("@")
        if not at:
            spec, target = item, ""
        try:
            if target and int(target) != rank:
                continue
            name, _, args = spec.partition(":")
            if name in ("kill_after_round", "kill_before_round", "kill_mid_send",
                        "kill_mid_checkpoint", "kill_mid_multicast", "send_nonfinite"):
                values[name] = int(args)
            elif name in ("kill_at_end", "kill_in_join"):
                if args:
                    raise ValueError("takes no argument")
                values[name] = True
            elif name == "pause_before_round":
                round_text, _, path = args.partition(":")
                if not path:
                    raise ValueError("no file")
                values["pause_before_round"] = int(round_text)
                values["pause_until_file"] = path
            elif name == "pause_in_join":
                values["pause_in_join"] = True
                values["pause_in_join_file"] = args or None
            elif name == "record_gradients":
                if not args:
                    raise ValueError("no directory")
                values["record_gradients"] = os.path.join(args, f"rank-{rank}")
            elif name == "sleep_per_round":
                values["sleep_per_round_s"] = float(args)
            elif name == "relay_withhold":
                values["relay_withhold"] = int(args)
            elif name == "send_malformed":
                round_text, _, how = args.partition(":")
                if how not in MALFORMED_KINDS:
                    raise ValueError(f"expected one of {', '.join(MALFORMED_KINDS)}")
                values["send_malformed"] = (int(round_text), how)
            elif name == "relay_late":
                rank_text, _, seconds = args.partition(":")
                values["relay_late"] = (int(rank_text), float(seconds))
            else:
                raise ValueError(f"unknown fault {name!r}")
        except ValueError as error:
            raise UsageError(f"{ENV_VAR}: cannot read {item!r} ({error}); expected items like "
                             f"kill_after_round:5, kill_mid_send:5, kill_at_end, "
                             f"pause_before_round:20:/tmp/go or "
                             f"sleep_per_round:0.1, each optionally prefixed by RANK@") from None
    return Faults(**values)  # type: ignore[arg-type]
