"""One worker thread that runs body work in the order it was handed over.

Both server paths hash (and the HTTP path also copies) a large body on a thread
while the event loop keeps reading the next bytes: blake3 and numpy's copy
release the GIL. `OrderedLane.feed` queues one call (a queue put: no future, no
executor round trip per chunk); `drained` resolves once everything fed so far
has run, with the first error one of those calls raised (the calls after it are
skipped until then). The lane holds no reference to a call or its arguments
between calls, so no body buffer is kept alive past its read (the buffer pool
checks this). Lanes are reused across bodies and stopped with `stop`.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class _Drained:
    """The mark `drained` queues: resolve `done` on `loop` once the calls before it ran."""

    loop: asyncio.AbstractEventLoop
    done: asyncio.Future[None]


_Item = tuple[Callable[..., Any], tuple[Any, ...]] | _Drained


class OrderedLane:
    """A thread running the calls given to `feed`, strictly in order."""

    def __init__(self, name: str = "body-lane") -> None:
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def feed(self, call: Callable[..., Any], *args: Any) -> None:
        self._queue.put((call, args))

    def drained(self) -> asyncio.Future[None]:
        """Resolves once every call fed so far has run (raises the first error of them)."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        self._queue.put(_Drained(loop, done))
        return done

    def stop(self) -> None:
        self._queue.put(None)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            if isinstance(item, _Drained):
                error, self._error = self._error, None
                try:
                    item.loop.call_soon_threadsafe(_resolve, item.done, error)
                except RuntimeError:  # the loop is closed: nobody waits any more
                    pass
            elif self._error is None:
                call, args = item
                try:
                    call(*args)
                except BaseException as error:  # reported to the loop by `drained`
                    self._error = error
                del call, args
            del item  # hold no view of a body between calls


def _resolve(done: asyncio.Future[None], error: BaseException | None) -> None:
    if done.done():
        return
    if error is None:
        done.set_result(None)
    else:
        done.set_exception(error)
