"""One thread for the agent's local databases (the MQTT spool, the remediation audit
trail).

Their commits wait for fsync, which on a slow, failing or full disk takes seconds; the
event loop (scrapes, the API, the watchdog ping) must never wait for that, or systemd
kills a daemon whose only fault is a slow disk. One thread keeps every database call in
order, so the connections need no locks. It is a daemon thread: a call stuck in the
kernel must not keep the process from exiting once the daemon's stop budget is spent.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")
log = logging.getLogger(__name__)

_Job = tuple[Callable[[], Any], asyncio.AbstractEventLoop | None, "asyncio.Future[Any] | None"]


class DiskThread:
    def __init__(self, name: str = "gpuagent-disk") -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the disk thread, after every call queued before it."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._jobs.put((functools.partial(fn, *args), loop, future))
        return await future

    def call_soon(self, fn: Callable[[], object]) -> None:
        """``fn()`` on the disk thread, nobody waiting for it."""
        self._jobs.put((fn, None, None))

    def close(self) -> None:
        """No more calls; the thread ends once those queued are done."""
        self._jobs.put(None)

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            call, loop, future = job
            try:
                outcome: tuple[Any, BaseException | None] = (call(), None)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                outcome = (None, exc)
            if loop is None or future is None:
                if outcome[1] is not None:
                    log.warning("disk thread: %r failed: %s", call, outcome[1])
                continue
            # A loop closed meanwhile (the daemon is gone) has nobody left to tell.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_settle, future, *outcome)


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():  # the caller stopped waiting (cancelled)
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
