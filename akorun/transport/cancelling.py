"""Ending asyncio tasks for certain: cancel, wait, and cancel again what still runs.

Python 3.11's `asyncio.wait_for` loses a cancellation that arrives in the same loop
turn as the awaited operation's own end (the operation's result or error is returned
instead of CancelledError). A task that loops on such an operation (a delivery retried
against a peer that is gone) then carries on as if never cancelled, and a plain
``cancel(); await gather(...)`` waits for it forever. `cancel_and_wait` repeats the
cancellation until every task has ended, and `raise_if_cancelling` lets a retry loop
honour a cancellation request that an inner await swallowed."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

log = logging.getLogger("akorun")

RECANCEL_EVERY_S = 0.5  # a lost cancellation is retried this often
STUCK_WARNING_AFTER_S = 10.0  # tasks still running then are named in the log once


async def cancel_and_wait(maybe_tasks: Iterable[asyncio.Future[Any] | None], *,
                          what: str = "tasks") -> None:
    """Cancel `maybe_tasks` (None entries skipped) and return once all have ended, cancelling
    again every RECANCEL_EVERY_S those that swallowed the request; their results and
    errors are discarded (the caller is shutting them down)."""
    tasks = [task for task in maybe_tasks if task is not None]
    pending = {task for task in tasks if not task.done()}
    waited_s = 0.0
    warned = False
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=RECANCEL_EVERY_S)
        waited_s += RECANCEL_EVERY_S
        if pending and not warned and waited_s >= STUCK_WARNING_AFTER_S:
            warned = True
            log.warning("%s still ending after %.0f s of cancellation: %s", what, waited_s,
                        ", ".join(sorted(_name(task) for task in pending)))
    for task in tasks:  # retrieved, as gather(return_exceptions=True) would: asyncio then
        if not task.cancelled():  # logs no "exception was never retrieved" for them
            task.exception()


def raise_if_cancelling() -> None:
    """Raise CancelledError if the current task was asked to stop (a request an inner
    `asyncio.wait_for` may have swallowed): for the top of a retry loop."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def _name(task: asyncio.Future[Any]) -> str:
    return task.get_name() if isinstance(task, asyncio.Task) else repr(task)
