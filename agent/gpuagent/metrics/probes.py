"""What /healthz and /readyz on the metrics listener say.

Alive means working, not merely answering: the event loop turns (a task on it beats every
second) and snapshots are renewed (each poll publishes one, wedged NVML or not). The
metrics server answers from its own thread, so a blocked event loop is seen from outside
it, as systemd's watchdog sees it. Ready means the first snapshot is there to serve.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

_BEAT_SECONDS = 1.0


class Probes:
    def __init__(
        self,
        stall_seconds: float,
        snapshot_age: Callable[[], float | None],
        snapshot_limit_seconds: float,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``snapshot_age``: seconds since the current snapshot was taken (None before the
        first); it is stale past ``snapshot_limit_seconds``."""
        self._stall = stall_seconds
        self._snapshot_age = snapshot_age
        self._snapshot_limit = snapshot_limit_seconds
        self._clock = clock
        self._beat = clock()

    def beat(self) -> None:
        self._beat = self._clock()

    async def run(self) -> None:
        """The heartbeat: on the event loop, so a loop that stops turning stops it."""
        while True:
            self.beat()
            await asyncio.sleep(_BEAT_SECONDS)

    def live(self) -> tuple[bool, str]:
        stalled = self._clock() - self._beat
        if stalled > self._stall:
            return False, f"event loop stalled for {stalled:.0f} s"
        age = self._snapshot_age()
        if age is not None and age > self._snapshot_limit:
            return False, f"no new snapshot for {age:.0f} s"
        return True, "ok"

    def ready(self) -> tuple[bool, str]:
        if self._snapshot_age() is None:
            return False, "no snapshot yet"
        return True, "ok"
