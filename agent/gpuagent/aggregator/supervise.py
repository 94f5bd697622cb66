"""Run the aggregator's long-lived tasks so that none dies silently.

A task that raises is logged with its traceback (once per failure), counted in
``counter[name]`` (`gpuagent_fleet_task_failures_total{task}`) and started again after a
backoff: `BACKOFF_MIN_SECONDS`, doubling to `BACKOFF_MAX_SECONDS`, back to the minimum once
it ran that long without failing. A task that fails more than ``max_failures`` times
within ``window`` seconds is given up on: `failed` is set (the aggregator then exits
non-zero, for systemd to restart the whole process). A task that returns is done.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, deque
from collections.abc import Callable, Coroutine
from typing import Any

log = logging.getLogger(__name__)

BACKOFF_MIN_SECONDS = 1.0
BACKOFF_MAX_SECONDS = 30.0
MAX_FAILURES = 5
FAILURE_WINDOW_SECONDS = 60.0

TaskFactory = Callable[[], Coroutine[Any, Any, None]]


class TaskFailedError(RuntimeError):
    """A supervised task failed too often."""


class Supervisor:
    def __init__(
        self,
        counter: Counter[str],
        *,
        max_failures: int | None = None,
        window: float | None = None,
        backoff_min: float | None = None,
        backoff_max: float | None = None,
    ) -> None:
        """Limits left out are the module's (read now, so tests can shorten them)."""
        self.counter = counter
        self.max_failures = MAX_FAILURES if max_failures is None else max_failures
        self.window = FAILURE_WINDOW_SECONDS if window is None else window
        self.backoff_min = BACKOFF_MIN_SECONDS if backoff_min is None else backoff_min
        self.backoff_max = BACKOFF_MAX_SECONDS if backoff_max is None else backoff_max
        # Set when a task failed more than max_failures times within window.
        self.failed = asyncio.Event()
        self.reason = ""
        self.tasks: list[asyncio.Task[None]] = []

    def start(self, name: str, factory: TaskFactory) -> asyncio.Task[None]:
        """Run ``factory()`` as task ``name``, again each time it raises."""
        task = asyncio.create_task(self._supervise(name, factory), name=name)
        self.tasks.append(task)
        return task

    async def _supervise(self, name: str, factory: TaskFactory) -> None:
        failures: deque[float] = deque()
        delay = self.backoff_min
        while True:
            started = time.monotonic()
            try:
                await factory()
            except asyncio.CancelledError:
                raise
            except Exception:
                now = time.monotonic()
                self.counter[name] += 1
                failures.append(now)
                while failures and failures[0] < now - self.window:
                    failures.popleft()
                if len(failures) > self.max_failures:
                    self.reason = (
                        f"task {name} failed {len(failures)} times within {self.window:g} s"
                    )
                    log.exception("aggregator: %s; giving up", self.reason)
                    self.failed.set()
                    return
                if now - started >= self.backoff_max:
                    delay = self.backoff_min  # it ran well for a while
                log.exception("aggregator: task %s failed; restarting it in %g s", name, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.backoff_max)
            else:
                return

    async def cancel(self, seconds: float) -> None:
        """Cancel every task and wait up to ``seconds`` for each."""
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            try:
                await asyncio.wait_for(task, seconds)
            except (asyncio.CancelledError, TimeoutError):
                pass
            except Exception:
                log.exception("aggregator: task %s failed while stopping", task.get_name())
