"""A dedicated thread per GPU for blocking NVML calls, with per-call timeouts.

NVML can block for tens of seconds on a wedged GPU. Each GPU gets its own worker so a hang
on one never delays the others, and the threads are daemons so a call that never returns
cannot hold up the agent's exit. The worker records which call it is in and since when,
so the event loop can time out the *call* (not the whole batch) without touching NVML.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

T = TypeVar("T")


class CallTimeoutError(Exception):
    def __init__(self, call: str, seconds: float) -> None:
        self.call = call
        self.seconds = seconds
        super().__init__(f"{call} blocked for {seconds:.1f} s")


class CallWorker:
    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], object], Future[object]] | None] = (
            queue.SimpleQueue()
        )
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()
        self._pending: Future[object] | None = None
        # Written by the worker thread, read by the event loop (attribute reads are atomic).
        self.current_call: str | None = None
        self.call_started: float | None = None

    def track(self, call: str, fn: Callable[..., T], *args: object) -> T:
        """Run one NVML call on the worker thread, recording it for the timeout watcher."""
        self.current_call = call
        self.call_started = time.monotonic()
        try:
            return fn(*args)
        finally:
            self.call_started = None

    @property
    def busy(self) -> bool:
        """True while an earlier job (typically one that timed out) is still running."""
        return self._pending is not None and not self._pending.done()

    def blocked_call(self) -> tuple[str, float] | None:
        started = self.call_started
        if started is None or not self.busy:
            return None
        return self.current_call or "nvml", time.monotonic() - started

    async def run(self, job: Callable[[], T], call_timeout: float) -> T:
        """Run ``job`` on the worker; raise CallTimeoutError if any one call it makes
        takes longer than ``call_timeout`` seconds. The job keeps running in its thread
        after a timeout; until it finishes the worker reports itself busy."""
        future: Future[object] = Future()
        future.add_done_callback(_consume_exception)
        self._pending = future
        self._jobs.put((job, future))
        waiter = asyncio.wrap_future(future)
        while True:
            started = self.call_started
            now = time.monotonic()
            remaining = call_timeout if started is None else started + call_timeout - now
            if remaining <= 0 and started is not None:
                raise CallTimeoutError(self.current_call or "nvml", now - started)
            done, _ = await asyncio.wait({waiter}, timeout=max(remaining, 0.001))
            if done:
                return waiter.result()  # type: ignore[return-value]

    def close(self) -> None:
        self._jobs.put(None)

    def _serve(self) -> None:
        while (item := self._jobs.get()) is not None:
            job, future = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(job())
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting side
                future.set_exception(exc)


def _consume_exception(future: Future[object]) -> None:
    # A job abandoned after a timeout may fail later; nobody awaits it any more.
    if not future.cancelled():
        future.exception()
