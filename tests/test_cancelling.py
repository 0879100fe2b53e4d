"""Tasks end when cancelled even if an inner await swallows the cancellation.

Python 3.11's `asyncio.wait_for` returns the operation's own end (a refused connect)
instead of CancelledError when both come in one loop turn; a delivery retried against
a peer that has gone then never ended, and a rank that finished after its peers hung
in its shutdown (seen once in the suite: a rank paused past the others' end)."""
from __future__ import annotations

import asyncio
import gc
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from akocore.messages import Kind
from akorun.metrics import PeerCounters
from akorun.transport import cancelling
from akorun.transport.cancelling import cancel_and_wait
from akorun.transport.sender import Outcome, Outgoing, PeerSender

HANG_GUARD_S = 60.0  # only a hang reaches this; the work itself takes milliseconds


def run_guarded(main: Callable[[], Coroutine[Any, Any, object]]) -> object:
    """`asyncio.run(main())` in a daemon thread: a hang fails the test instead of holding
    the suite (a swallowed cancellation defeats an asyncio.wait_for guard too)."""
    outcome: list[object] = []
    thread = threading.Thread(target=lambda: outcome.append(asyncio.run(main())),
                              daemon=True)
    thread.start()
    thread.join(HANG_GUARD_S)
    assert not thread.is_alive(), f"still running after {HANG_GUARD_S} s: it hangs"
    assert outcome, "ended by an error (in the output above)"
    return outcome[0]


class SwallowingSender(PeerSender):
    """A sender whose every attempt hangs and, when cancelled, returns RETRY instead
    of raising: what a refused connect racing a cancellation looks like in 3.11."""

    attempts = 0

    async def attempt(self, message: Outgoing) -> Outcome:
        self.attempts += 1
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            return Outcome.RETRY  # the cancellation is lost here, as in wait_for
        return Outcome.DELIVERED


def test_stopping_a_sender_ends_a_delivery_whose_attempt_swallowed_the_cancellation() -> None:
    async def main() -> SwallowingSender:
        sender = SwallowingSender(1, "http://127.0.0.1:9/v1/partial", None,  # type: ignore[arg-type]
                                  counters=PeerCounters(), data_path=False)
        sender.start()
        await sender.put(Outgoing(b"x" * 64, Kind.GRAD, 0, 0))
        while sender.attempts == 0:
            await asyncio.sleep(0.01)
        await sender.stop()
        return sender

    sender = run_guarded(main)
    assert isinstance(sender, SwallowingSender)
    assert sender.attempts == 1  # it did not retry after the stop
    assert not sender._deliveries and sender._task is None


def test_cancel_and_wait_cancels_again_until_the_task_ends(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(cancelling, "RECANCEL_EVERY_S", 0.01)
    monkeypatch.setattr(cancelling, "STUCK_WARNING_AFTER_S", 0.02)
    swallowed = []

    async def stubborn() -> None:
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                swallowed.append(1)
                if len(swallowed) == 5:
                    raise

    async def main() -> asyncio.Task[None]:
        task = asyncio.create_task(stubborn(), name="stubborn-task")
        await asyncio.sleep(0)
        await cancel_and_wait([task, None], what="test tasks")
        return task

    with caplog.at_level(logging.WARNING, logger="akorun"):
        task = run_guarded(main)
    assert isinstance(task, asyncio.Task)
    assert task.cancelled() and len(swallowed) == 5
    warnings = [r.getMessage() for r in caplog.records if "still ending" in r.getMessage()]
    assert len(warnings) == 1 and "stubborn-task" in warnings[0]


def test_cancel_and_wait_returns_at_once_for_ended_tasks() -> None:
    async def main() -> None:
        done = asyncio.create_task(asyncio.sleep(0))
        await done
        await cancel_and_wait([done])
        assert done.done() and not done.cancelled()

    run_guarded(main)


def test_cancel_and_wait_retrieves_what_the_tasks_ended_with(
        caplog: pytest.LogCaptureFixture) -> None:
    """A task (or a gather) that ends with an error when cancelled: retrieved, so asyncio
    logs no "exception was never retrieved" (a traceback in a rank's log otherwise)."""
    async def fails_when_cancelled() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            raise ValueError("ended badly") from None

    async def main() -> None:
        tasks: list[asyncio.Future[Any] | None] = [
            asyncio.create_task(fails_when_cancelled()),
            asyncio.ensure_future(asyncio.gather(asyncio.sleep(3600)))]
        await asyncio.sleep(0)
        await cancel_and_wait(tasks)
        tasks.clear()
        gc.collect()

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        run_guarded(main)
        gc.collect()
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]
