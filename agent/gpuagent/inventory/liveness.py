"""Whether a service is really down or restarting in a loop, from probes over time.

One probe is not enough either way. A Fabric Manager in a restart loop reads "active" at
most probes while the fabric is broken, and one that systemd is restarting reads stopped
for a moment. So a service is down only after ``down_probes`` probes in a row found it
stopped, and flapping when systemd restarted it ``restart_limit`` times or more within
``restart_window_seconds`` (its NRestarts counter; a `systemctl reset-failed` or a start
by hand zeroes that counter, which is a new start to count from, never restarts lost).
A probe that could not be answered ("unknown") changes nothing: the last known state
stands, so a failed probe never clears a fault. The same holds for a daemon's own word on
its readiness (the IMEX daemon's): not ready only after ``down_probes`` answers in a row
said so (it is not ready for a while after every start), and no answer keeps the last.
"""

from __future__ import annotations

import collections
from dataclasses import replace

from gpuagent.inventory.model import STOPPED_STATES, Service


class ServiceLiveness:
    def __init__(
        self, *, down_probes: int, restart_limit: int, restart_window_seconds: float
    ) -> None:
        self._down_probes = down_probes
        self._restart_limit = restart_limit
        self._window = restart_window_seconds
        self._last: dict[str, Service] = {}
        # name → (monotonic time, restarts seen at that probe), within the window.
        self._restarts: dict[str, collections.deque[tuple[float, int]]] = {}

    def observe(self, services: tuple[Service, ...], now: float) -> tuple[Service, ...]:
        """This probe's services, with their liveness filled in."""
        return tuple(self._observe(service, now) for service in services)

    def _observe(self, probed: Service, now: float) -> Service:
        last = self._last.get(probed.name)
        if probed.state == "unknown" and last is not None:
            return last
        streak = (last.down_probes if last else 0) + 1 if probed.state in STOPPED_STATES else 0
        recent = self._count_restarts(probed, last, now)
        readiness, unready = probed.readiness, 0
        if readiness is None and last is not None and probed.state == "active":
            readiness, unready = last.readiness, last.unready_probes  # no answer: as before
        elif probed.says_unready:
            unready = (last.unready_probes if last else 0) + 1
        observed = replace(
            probed,
            down_probes=streak,
            pending=0 < streak < self._down_probes,
            recent_restarts=recent,
            flapping=recent >= self._restart_limit,
            readiness=readiness,
            unready_probes=unready,
            readiness_pending=0 < unready < self._down_probes,
        )
        self._last[probed.name] = observed
        return observed

    def _count_restarts(self, probed: Service, last: Service | None, now: float) -> int:
        seen = self._restarts.setdefault(probed.name, collections.deque())
        before = last.restarts if last is not None else None
        if probed.restarts is not None and before is not None:
            # A counter lower than before was zeroed: everything it shows is new.
            added = probed.restarts - before if probed.restarts >= before else probed.restarts
            if added > 0:
                seen.append((now, added))
        while seen and seen[0][0] < now - self._window:
            seen.popleft()
        return sum(count for _, count in seen)
