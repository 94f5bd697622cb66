"""Per-source supervision: status bookkeeping and restart with backoff.

Like node_exporter's collector stats: each source has an up flag, the time of its last
success, how long its last run took and how many runs failed in a row. State changes are
logged once, not on every failure.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from gpuagent.model import SourceStatus

log = logging.getLogger(__name__)

_MAX_BACKOFF_SECONDS = 60.0


class SourceTracker:
    def __init__(self, name: str) -> None:
        self.status = SourceStatus(name=name, up=False)

    def success(self, duration: float, *, up: bool = True, error: str | None = None) -> None:
        if up and not self.status.up and self.status.consecutive_failures:
            log.info("source %s recovered", self.status.name)
        if not up and (self.status.up or self.status.consecutive_failures == 0):
            log.warning("source %s is down: %s", self.status.name, error)
        self.status = SourceStatus(
            name=self.status.name,
            up=up,
            last_success=time.time() if up else self.status.last_success,
            last_error=error,
            last_duration_seconds=duration,
            consecutive_failures=0 if up else self.status.consecutive_failures + 1,
        )

    def failure(self, duration: float, error: str) -> None:
        self.success(duration, up=False, error=error)


async def supervise(
    tracker: SourceTracker,
    run: Callable[[Callable[[], None]], Awaitable[None]],
    changed: Callable[[], None],
) -> None:
    """Run a long-lived source forever, restarting it with backoff when it fails.

    ``run`` gets a callback to call once it is up (e.g. after reading the kernel log's
    existing buffer); ``changed`` is called whenever the source's status changes.
    """
    backoff = 1.0
    while True:
        started = time.monotonic()

        def ready(started: float = started) -> None:
            tracker.success(time.monotonic() - started)
            changed()

        try:
            await run(ready)
            error = "stopped"
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure of a source is reported, not fatal
            error = f"{type(exc).__name__}: {exc}"
        if tracker.status.up:
            backoff = 1.0
        tracker.failure(time.monotonic() - started, error)
        changed()
        await asyncio.sleep(backoff)
        backoff = min(backoff * 2, _MAX_BACKOFF_SECONDS)
