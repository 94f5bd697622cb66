"""The event log: every fault event the sources report, de-duplicated and bounded.

One fault produces one event: the same event id (a kernel-log record re-read after a
restart, a retried report) is dropped, and so is the same XID on the same GPU from the
other source (kernel log vs NVML) within `dedup_window_seconds`. The event kept is the
first one's (its id went out already), with the kernel line's content whichever came
first: the line names the process, its pid and the driver's text, NVML only the number.
Recent events (for the checks and status) are bounded by age and count; per-device counts
since start (for metrics) are kept separately and never pruned.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import replace

from gpuagent.config import EventsSection
from gpuagent.model import EventCount, GpuEvent

_CountKey = tuple[str | None, str, int | None, str | None]
# Sources whose XID records carry the kernel's line (pid, process, text, drill marker).
_KERNEL_SOURCES = frozenset({"kmsg", "drill"})
# How far back from the newest event an NVML XID is looked for to take a kernel line's
# content: the two arrive within the de-duplication window, so near the end.
_ENRICH_SEARCH = 256


class EventLog:
    def __init__(self, config: EventsSection) -> None:
        self._config = config
        self._events: collections.deque[GpuEvent] = collections.deque()
        self._ids: set[str] = set()
        # (gpu, xid) → (source, monotonic) of the last XID seen, for cross-source de-dup.
        self._last_xid: dict[tuple[str | None, int], tuple[str, float]] = {}
        self._counts: dict[_CountKey, EventCount] = {}
        self._recent: tuple[GpuEvent, ...] | None = ()
        self._counts_view: tuple[EventCount, ...] | None = ()
        # gpu → (kinds, before) of its last reset: events of those kinds stamped before it
        # that arrive late (an NVML event, a kernel line read after the reset returned)
        # were cleared by that reset all the same.
        self._cleared: dict[str, tuple[frozenset[str], float]] = {}
        self.duplicates = 0

    def add(self, event: GpuEvent) -> bool:
        """Record ``event``; False when it repeats one already recorded."""
        if event.event_id in self._ids or self._same_xid_other_source(event):
            self.duplicates += 1
            return False
        # Counted (it happened) but not kept for the checks when a reset already cleared it.
        if not self._cleared_by_reset(event):
            self._events.append(event)
            self._ids.add(event.event_id)
        if event.kind == "xid" and event.code is not None:
            self._last_xid[(event.gpu, event.code)] = (event.source, event.monotonic)
        key = (event.gpu, event.kind, event.code, event.aer_severity)
        before = self._counts.get(key)
        self._counts[key] = EventCount(
            gpu=event.gpu,
            kind=event.kind,
            code=event.code,
            aer_severity=event.aer_severity,
            count=(before.count if before else 0) + 1,
            last_time=max(event.time, before.last_time if before else event.time),
        )
        self._recent = self._counts_view = None
        self._trim(event.monotonic)
        return True

    def _cleared_by_reset(self, event: GpuEvent) -> bool:
        cleared = self._cleared.get(event.gpu) if event.gpu is not None else None
        return cleared is not None and event.kind in cleared[0] and event.monotonic < cleared[1]

    def _same_xid_other_source(self, event: GpuEvent) -> bool:
        if event.kind != "xid" or event.code is None:
            return False
        seen = self._last_xid.get((event.gpu, event.code))
        if seen is None:
            return False
        source, when = seen
        same = source != event.source and abs(event.monotonic - when) <= (
            self._config.dedup_window_seconds
        )
        if same and event.source in _KERNEL_SOURCES and source == "nvml":
            self._enrich(event)
        return same

    def _enrich(self, kernel: GpuEvent) -> None:
        """The NVML record of this XID takes the kernel line's content, keeping its id."""
        events = self._events
        for index in range(len(events) - 1, max(-1, len(events) - 1 - _ENRICH_SEARCH), -1):
            kept = events[index]
            if (kept.source, kept.kind, kept.gpu, kept.code) == (
                "nvml",
                "xid",
                kernel.gpu,
                kernel.code,
            ):
                events[index] = replace(
                    kernel, event_id=kept.event_id, workloads=kernel.workloads or kept.workloads
                )
                self._recent = None
                return

    def prune(self, now: float) -> None:
        """Forget events older than the retention (call periodically)."""
        self._trim(now)

    def _trim(self, now: float) -> None:
        oldest_kept = now - self._config.retention_seconds
        events = self._events
        dropped = False
        while events and (
            len(events) > self._config.max_events or events[0].monotonic < oldest_kept
        ):
            self._ids.discard(events.popleft().event_id)
            dropped = True
        if dropped:
            self._recent = None

    def forget(self, gpu: str, before: float, kinds: frozenset[str]) -> int:
        """Drop ``gpu``'s events of ``kinds`` older than ``before`` (a GPU reset clears the
        XIDs that asked for it); counts since start are kept. Such events that arrive
        later are not kept either. Returns how many went."""
        self._cleared[gpu] = (kinds, before)
        kept = [
            e
            for e in self._events
            if not (e.gpu == gpu and e.kind in kinds and e.monotonic < before)
        ]
        gone = len(self._events) - len(kept)
        if gone:
            self._events = collections.deque(kept)
            self._recent = None
        return gone

    def recent(self) -> tuple[GpuEvent, ...]:
        """Events within retention, oldest first (the same tuple until something changes)."""
        if self._recent is None:
            self._recent = tuple(self._events)
        return self._recent

    def counts(self) -> tuple[EventCount, ...]:
        if self._counts_view is None:
            self._counts_view = tuple(self._counts.values())
        return self._counts_view

    def latest(
        self, limit: int, accept: Callable[[GpuEvent], bool] | None = None
    ) -> list[GpuEvent]:
        chosen = [e for e in reversed(self._events) if accept is None or accept(e)]
        return chosen[:limit]
