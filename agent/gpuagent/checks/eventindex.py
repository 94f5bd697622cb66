"""The recent events, indexed once per evaluation for the checks that read them.

The event log can hold ten thousand events while a node has eight GPUs; every check
filtering the whole tuple for every GPU would cost too much on each poll. One pass groups
the events by kind; a kind is split by device once, when a check first asks for it. Both
keep the log's order (oldest first).

Event ages are measured on ``GpuEvent.monotonic``, the checks' clock. An event stamped
after ``now`` (a kernel record read just before the poll's clock was taken) counts as
happening now.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping, Sequence

from gpuagent.model import EvidenceValue, GpuEvent

# What "recent" means for findings that fade on their own (WARN-level kernel messages).
RECENT_SECONDS = 3600.0

# udev's add/remove and bind/unbind reports are one story per device, told in order, so
# they are also offered as one group: the newest of them says where the device stands.
UDEV = "udev"
_UDEV_KINDS = ("gpu_added", "gpu_removed", "driver_bound", "driver_unbound")

_NONE: tuple[GpuEvent, ...] = ()


class EventIndex:
    """Events by kind (the udev kinds also together, as ``UDEV``), and by device and kind.

    The by-device split of a kind is made the first time a check asks for that kind, so
    kinds only node checks read (SXids) are never split, and each split is one pass.
    """

    __slots__ = ("_by_device", "_by_kind", "_weights")

    def __init__(
        self, events: Iterable[GpuEvent] = (), weights: Mapping[str, int] | None = None
    ) -> None:
        self._weights = weights or {}
        by_kind: dict[str, list[GpuEvent]] = {}
        for event in events:
            found = by_kind.get(event.kind)
            if found is None:
                by_kind[event.kind] = [event]
            else:
                found.append(event)
        udev = [e for kind in _UDEV_KINDS for e in by_kind.get(kind, ())]
        if udev:
            # One source reports them all, stamped on arrival: time order is their order.
            by_kind[UDEV] = sorted(udev, key=_when)
        self._by_kind = by_kind
        self._by_device: dict[str, dict[str, list[GpuEvent]]] = {}

    def of_kind(self, kind: str) -> Sequence[GpuEvent]:
        """Every event of ``kind`` (or of the ``UDEV`` group), oldest first."""
        return self._by_kind.get(kind, _NONE)

    def for_device(self, address: str, kind: str) -> Sequence[GpuEvent]:
        """The events of ``kind`` that name ``address``, oldest first."""
        devices = self._by_device.get(kind)
        if devices is None:
            devices = self._by_device[kind] = _split(self.of_kind(kind))
        return devices.get(address, _NONE)

    def weight(self, event: GpuEvent) -> int:
        """How many records ``event`` stands for: a storm's records past its incident's
        first few are folded onto a kept one (`gpuagent.incidents`)."""
        return 1 + self._weights.get(event.event_id, 0)

    def records(self, events: Iterable[GpuEvent]) -> int:
        """How many records ``events`` stand for."""
        weights = self._weights
        if not weights:
            return sum(1 for _ in events)
        return sum(1 + weights.get(event.event_id, 0) for event in events)

    def for_devices(self, addresses: Iterable[str], kind: str) -> list[GpuEvent]:
        """The events of ``kind`` naming any of ``addresses`` (grouped by address)."""
        return [event for address in addresses for event in self.for_device(address, kind)]


def _split(events: Sequence[GpuEvent]) -> dict[str, list[GpuEvent]]:
    devices: dict[str, list[GpuEvent]] = {}
    for event in events:
        if event.gpu is not None:
            found = devices.get(event.gpu)
            if found is None:
                devices[event.gpu] = [event]
            else:
                found.append(event)
    return devices


def _when(event: GpuEvent) -> float:
    # NaN would make sorting meaningless; such an event sorts as the oldest.
    return -math.inf if math.isnan(event.monotonic) else event.monotonic


def age(event: GpuEvent, now: float) -> float:
    """Seconds since the event happened; never negative."""
    return max(0.0, now - event.monotonic)


def within(event: GpuEvent, now: float, seconds: float) -> bool:
    return age(event, now) <= seconds


def recent(events: Iterable[GpuEvent], now: float, seconds: float) -> list[GpuEvent]:
    """The events at most ``seconds`` old (the same test as `within`, inlined for speed)."""
    if not seconds >= 0:
        return []
    cutoff = now - seconds
    return [event for event in events if event.monotonic >= cutoff]


def times(events: Sequence[GpuEvent]) -> list[float]:
    """The events' monotonic times, sorted, for `near`; NaN times (unsortable) left out."""
    return sorted([e.monotonic for e in events if not math.isnan(e.monotonic)])


def near(when: float, sorted_times: Sequence[float], seconds: float) -> bool:
    """Whether any of ``sorted_times`` lies within ``seconds`` of ``when``."""
    first = bisect.bisect_left(sorted_times, when - seconds)
    return first < len(sorted_times) and sorted_times[first] <= when + seconds


def latest(events: Sequence[GpuEvent]) -> GpuEvent | None:
    return events[-1] if events else None


def newest(events: Iterable[GpuEvent]) -> GpuEvent | None:
    """The event with the latest time, for events gathered from several devices."""
    return max(events, key=_when, default=None)


def event_evidence(event: GpuEvent | None) -> tuple[tuple[str, EvidenceValue], ...]:
    """The raw kernel line (or the source's description) and when it happened."""
    if event is None:
        return (("line", None), ("time", None))
    return (("line", event.line), ("time", event.time))
