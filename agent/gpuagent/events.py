"""The event log: every fault event the sources report, de-duplicated and bounded.

One fault produces one event: the same event id (a kernel-log record re-read after a
restart, a retried report) is dropped, and so is the same XID on the same GPU from the
other source (kernel log vs NVML) within `dedup_window_seconds`. The event kept is the
first one's (its id went out already), with the kernel line's content whichever came
first: the line names the process, its pid and the driver's text, NVML only the number.
Records of a storm are folded into incidents (`gpuagent.incidents`): past an incident's
first few records, a record is counted but not kept. Recent events (for the checks and
status) are bounded by age and count; per-device counts since start (for metrics) count
every record and are never pruned.

A GPU reset is an event too (kind ``gpu_reset``): the agent's own reset, or NVML's
recovery action back to none; the driver's Xid 154 back to none says the same. Adding one
is what clears the faults the reset repaired: that GPU's XIDs and GSP messages before it
are forgotten (and so are those stamped before it that arrive later). A GPU that fell off
the bus is not among them: only a reboot brings it back (gpuagent.checks.bus). Whether
the reset worked is then the readings' to say (ECC counters, pending remaps, recovery
action, the GPU answering).
"""

from __future__ import annotations

import collections
import enum
import re
import time
from collections.abc import Callable, Mapping

from gpuagent.config import EventsSection
from gpuagent.incidents import SAMPLES, Incident, IncidentBook
from gpuagent.model import AerSeverity, EventCount, EventKind, EventSource, GpuEvent

_CountKey = tuple[str | None, EventKind, int | None, AerSeverity | None]
# Sources whose XID records carry the kernel's line (pid, process, text, drill marker),
# and those that carry only the driver's number (an XID event, an operational event).
_KERNEL_SOURCES = frozenset({"kmsg", "drill"})
_NVML_SOURCES = frozenset({"nvml", "nvml_operational"})
# How far back from the newest event an NVML XID is looked for to take a kernel line's
# content: the two arrive within the de-duplication window, so near the end.
_ENRICH_SEARCH = 256
# What a GPU reset clears: the kernel's reports of the faults that asked for it.
RESET_CLEARS = frozenset({"xid", "gsp"})
# The driver's Xid 154 (NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from
# 0x0 (None) to 0x1 (PF FLR)) back to 0x0 from something else: the action was done.
_BACK_TO_NONE = re.compile(
    r"recovery action changed from 0x0*[1-9A-Fa-f][0-9A-Fa-f]*\b.*? to 0x0+\b"
)
RECOVERY_ACTION_CHANGED = 154


class Added(enum.IntEnum):
    """What `EventLog.add` did with a record (false only for a duplicate)."""

    DUPLICATE = 0
    NEW = 1  # kept: a record of its own, or the opening of an incident
    SAMPLE = 2  # kept as one of its incident's first records
    FOLDED = 3  # only counted on its incident


class EventLog:
    def __init__(self, config: EventsSection) -> None:
        self._config = config
        self.incidents = IncidentBook(config.incident_gap_seconds)
        self._events: collections.deque[GpuEvent] = collections.deque()
        self._ids: set[str] = set()
        # (gpu, xid) → (source, monotonic) of the last XID seen, for cross-source de-dup.
        self._last_xid: dict[tuple[str | None, int], tuple[str, float]] = {}
        # Per (gpu, kind, code, AER severity): [records, wall time of the newest].
        self._counts: dict[_CountKey, list[float]] = {}
        self._recent: tuple[GpuEvent, ...] | None = ()
        self._counts_view: tuple[EventCount, ...] | None = ()
        # gpu → (kinds, before) of its last reset: events of those kinds stamped before it
        # that arrive late (an NVML event, a kernel line read after the reset returned)
        # were cleared by that reset all the same.
        self._cleared: dict[str, tuple[frozenset[str], float]] = {}
        self.duplicates = 0

    def add(self, event: GpuEvent) -> Added:
        """Record ``event``: DUPLICATE (false) when it repeats one already recorded."""
        if event.event_id in self._ids or self._same_xid_other_source(event):
            self.duplicates += 1
            return Added.DUPLICATE
        incident = self.incidents.fold(event)
        added = _added(incident)
        # Counted (it happened) but not kept for the checks when a reset already cleared it,
        # or when its incident has its samples already.
        if added is not Added.FOLDED and not self._cleared_by_reset(event):
            self._events.append(event)
            self._ids.add(event.event_id)
            self._recent = None
            # Only a kept record can take the log past its size; age is trimmed here and
            # by `prune` alike, so the records a storm folds cost no trimming.
            self._trim(event.monotonic)
            if event.gpu is not None and is_reset(event):
                self.forget(event.gpu, event.monotonic, RESET_CLEARS)
        if event.kind == "xid" and event.code is not None:
            self._last_xid[(event.gpu, event.code)] = (event.source, event.monotonic)
        key = (event.gpu, event.kind, event.code, event.aer_severity)
        tally = self._counts.get(key)
        if tally is None:
            self._counts[key] = [1, event.time]
        else:
            tally[0] += 1
            tally[1] = max(tally[1], event.time)
        self._counts_view = None
        return added

    def weights(self) -> Mapping[str, int]:
        """Kept event id → records folded onto it beyond itself (the checks' weights)."""
        return self.incidents.weights

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
        if same and event.source in _KERNEL_SOURCES and source in _NVML_SOURCES:
            self._enrich(event)
        return same

    def _enrich(self, kernel: GpuEvent) -> None:
        """The NVML record of this XID takes the kernel line's content, keeping its id."""
        events = self._events
        for index in range(len(events) - 1, max(-1, len(events) - 1 - _ENRICH_SEARCH), -1):
            kept = events[index]
            if kept.source in _NVML_SOURCES and (kept.kind, kept.gpu, kept.code) == (
                "xid",
                kernel.gpu,
                kernel.code,
            ):
                events[index] = kernel._replace(
                    event_id=kept.event_id, workloads=kernel.workloads or kept.workloads
                )
                self._recent = None
                return

    def prune(self, now: float) -> bool:
        """Forget events older than the retention, and incidents gone quiet (call
        periodically); whether any event went."""
        dropped = self._trim(now)
        self.incidents.close_before(now)
        return dropped

    def _trim(self, now: float) -> bool:
        oldest_kept = now - self._config.retention_seconds
        events = self._events
        dropped = False
        while events and (
            len(events) > self._config.max_events or events[0].monotonic < oldest_kept
        ):
            gone = events.popleft().event_id
            self._ids.discard(gone)
            self.incidents.drop_weights((gone,))
            dropped = True
        if dropped:
            self._recent = None
        return dropped

    def forget(self, gpu: str, before: float, kinds: frozenset[str]) -> int:
        """Drop ``gpu``'s events of ``kinds`` older than ``before`` (a GPU reset clears the
        XIDs that asked for it); counts since start are kept. Such events that arrive
        later are not kept either. Returns how many went."""
        self._cleared[gpu] = (kinds, before)
        self.incidents.forget(gpu, kinds)
        kept = []
        for e in self._events:
            if e.gpu == gpu and e.kind in kinds and e.monotonic < before:
                self.incidents.drop_weights((e.event_id,))
            else:
                kept.append(e)
        gone = len(self._events) - len(kept)
        if gone:
            self._events = collections.deque(kept)
            self._recent = None
        return gone

    def forget_drills(self) -> int:
        """Drop every drill's events (`gpuagent inject clear-drills`); counts since start
        are kept. Returns how many went."""
        kept = collections.deque(e for e in self._events if e.source != "drill")
        gone = [e.event_id for e in self._events if e.source == "drill"]
        if gone:
            self.incidents.drop_weights(gone)
            self._events = kept
            self._recent = None
        return len(gone)

    def recent(self) -> tuple[GpuEvent, ...]:
        """Events within retention, oldest first (the same tuple until something changes)."""
        if self._recent is None:
            self._recent = tuple(self._events)
        return self._recent

    def counts(self) -> tuple[EventCount, ...]:
        if self._counts_view is None:
            self._counts_view = tuple(
                EventCount(
                    gpu=gpu,
                    kind=kind,
                    code=code,
                    aer_severity=aer,
                    count=int(count),
                    last_time=last,
                )
                for (gpu, kind, code, aer), (count, last) in self._counts.items()
            )
        return self._counts_view

    def latest(
        self, limit: int, accept: Callable[[GpuEvent], bool] | None = None
    ) -> list[GpuEvent]:
        chosen = [e for e in reversed(self._events) if accept is None or accept(e)]
        return chosen[:limit]


def is_reset(event: GpuEvent) -> bool:
    """Whether ``event`` says its GPU was reset (see the module's docstring)."""
    if event.kind == "gpu_reset":
        return True
    return (
        event.kind == "xid"
        and event.code == RECOVERY_ACTION_CHANGED
        and _BACK_TO_NONE.search(event.line) is not None
    )


def reset_event(gpu: str, source: EventSource, monotonic: float, line: str) -> GpuEvent:
    """The ``gpu_reset`` event of ``gpu`` reset at ``monotonic`` (the checks' clock)."""
    wall = time.time() - (time.monotonic() - monotonic)
    return GpuEvent(
        f"reset:{gpu}:{monotonic:.6f}", source, "gpu_reset", gpu, wall, monotonic, line=line
    )


def _added(incident: Incident | None) -> Added:
    if incident is None or incident.count == 1:
        return Added.NEW
    return Added.SAMPLE if incident.count <= SAMPLES else Added.FOLDED
