"""Per-source supervision: status bookkeeping and restart with backoff.

Like node_exporter's collector stats: each source has an up flag, the time of its last
success, how long its last run took and how many runs failed in a row. State changes are
logged once, not on every failure.

A source whose facility is absent on this host (no udevd, no DCGM) raises
`SourceUnavailable`: that is no failure. It is logged once, exported as unavailable (not
as down), never counted as a success, and tried again only every
``UNAVAILABLE_RETRY_SECONDS``, or as soon as the facility appears.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from gpuagent.model import SourceStatus

log = logging.getLogger(__name__)

_MAX_BACKOFF_SECONDS = 60.0
# A source must stay up this long before a failure retries it fast again: one that comes
# up and fails at once (every second, all day) would flood the log and the CPU.
_STABLE_SECONDS = 30.0
UNAVAILABLE_RETRY_SECONDS = 300.0
# How often an absent facility is looked for (a cheap check, such as a socket's path).
_APPEARED_CHECK_SECONDS = 10.0


class SourceUnavailable(Exception):  # noqa: N818 - a state of the host, not an error
    """The facility the source needs is absent here; ``appeared`` tells cheaply whether
    it is there now (None: only the slow retry finds out)."""

    def __init__(self, reason: str, appeared: Callable[[], bool] | None = None) -> None:
        super().__init__(reason)
        self.appeared = appeared


class SourceTracker:
    def __init__(self, name: str) -> None:
        self.status = SourceStatus(name=name, up=False)

    def success(self, duration: float, *, up: bool = True, error: str | None = None) -> None:
        if up and not self.status.available:
            log.info("source %s is available now", self.status.name)
        elif up and not self.status.up and self.status.consecutive_failures:
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

    def unavailable(self, duration: float, reason: str) -> None:
        if self.status.available or self.status.last_error != reason:
            log.info("source %s is unavailable here: %s", self.status.name, reason)
        self.status = SourceStatus(
            name=self.status.name,
            up=False,
            available=False,
            last_success=self.status.last_success,
            last_error=reason,
            last_duration_seconds=duration,
        )


async def supervise(
    tracker: SourceTracker,
    run: Callable[[Callable[[], None]], Awaitable[None]],
    changed: Callable[[], None],
    *,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> None:
    """Run a long-lived source forever, restarting it with backoff when it fails.

    ``run`` gets a callback to call once it is up (once it has opened what it reads, and
    e.g. read the kernel log's existing buffer); ``changed`` is called whenever the
    source's status changes.
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
        except SourceUnavailable as exc:
            tracker.unavailable(time.monotonic() - started, str(exc))
            changed()
            await _until_it_may_be_there(exc.appeared, sleep)
            continue
        except Exception as exc:  # noqa: BLE001 - any failure of a source is reported, not fatal
            error = f"{type(exc).__name__}: {exc}"
        if tracker.status.up and time.monotonic() - started >= _STABLE_SECONDS:
            backoff = 1.0
        tracker.failure(time.monotonic() - started, error)
        changed()
        await sleep(backoff)
        backoff = min(backoff * 2, _MAX_BACKOFF_SECONDS)


async def _until_it_may_be_there(
    appeared: Callable[[], bool] | None, sleep: Callable[[float], Awaitable[None]]
) -> None:
    """UNAVAILABLE_RETRY_SECONDS, or less once ``appeared`` says the facility is there."""
    for _ in range(round(UNAVAILABLE_RETRY_SECONDS / _APPEARED_CHECK_SECONDS)):
        await sleep(_APPEARED_CHECK_SECONDS)
        if appeared is not None and appeared():
            return
