"""Incidents: the records of one fault folded into one, so a storm costs what a fault does.

The kernel log does not carry one line per fault. When a GPU fails, the driver tears down
every channel of every process that touched it and logs a line for each (`Xid 45 ...
caused by previous Xid 149`), on every GPU of the job; a fleet sees 100,000 of them for one
fault. Records of the same GPU, kind, XID (or SXid), root XID and process that keep
coming with less than ``gap_seconds`` between them are one incident: its first
``SAMPLES`` records are kept as events (for the checks, status and the fleet), the rest
only counted. The checks weigh each kept record by the records it stands for, so counts
stay true; logs and fleet reports speak of incidents, never of each record.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpuagent.kernel.xid import caused_by
from gpuagent.model import GpuEvent

# Records of an incident kept as events: enough to show how it began (and count the
# crashes of an application, one per process), never more whatever the storm's length.
SAMPLES = 5
# The kinds that come in storms. AER reports are rate-limited by the kernel itself, and
# the rest are rare.
FOLDED_KINDS = frozenset({"xid", "sxid", "gsp"})
# Open incidents kept at most (each a few hundred bytes); past it the least recently
# active close first, so memory is bounded whatever the storm's variety.
MAX_OPEN = 4096

IncidentKey = tuple[str | None, str, int | None, int | None, int | None]


@dataclass(slots=True, eq=False)
class Incident:
    """One fault's records: the first (its event and id), the newest, how many."""

    key: IncidentKey
    first: GpuEvent
    last: GpuEvent
    count: int = 1
    reported: int = 1  # the count the log and the fleet were last told

    @property
    def id(self) -> str:
        return self.first.event_id

    @property
    def root_xid(self) -> int | None:
        return self.key[3]


def incident_key(event: GpuEvent) -> IncidentKey:
    root = caused_by(event.line) if event.kind == "xid" else None
    return (event.gpu, event.kind, event.code, root, event.pid)


class IncidentBook:
    """The open incidents, and which of them grew since they were last reported."""

    def __init__(self, gap_seconds: float) -> None:
        self._gap = gap_seconds
        self._open: dict[IncidentKey, Incident] = {}
        # The kept record each incident's folded count rides on, for the checks' weights.
        self.weights: dict[str, int] = {}
        self.folded_records = 0

    def fold(self, event: GpuEvent) -> Incident | None:
        """The incident ``event`` belongs to (a new one when it opens one), or None for a
        kind that is not folded. Past its first SAMPLES records an incident only counts."""
        if event.kind not in FOLDED_KINDS:
            return None
        key = incident_key(event)
        found = self._open.pop(key, None)  # re-inserted: the dict stays in activity order
        if found is None or not event.monotonic - found.last.monotonic <= self._gap:
            found = Incident(key, event, event)
            if len(self._open) >= MAX_OPEN:
                del self._open[next(iter(self._open))]
        else:
            found.count += 1
            found.last = event
            if found.count > SAMPLES:
                self.folded_records += 1
                self.weights[found.first.event_id] = found.count - SAMPLES
        self._open[key] = found
        return found

    def grown(self) -> list[Incident]:
        """Incidents with records not yet reported (marked reported now)."""
        grown = [i for i in self._open.values() if i.count > i.reported]
        for incident in grown:
            incident.reported = incident.count
        return grown

    def close_before(self, now: float) -> None:
        """Forget incidents quiet for longer than the gap (their weights stay while their
        first record is kept)."""
        cutoff = now - self._gap
        for key in [k for k, i in self._open.items() if i.last.monotonic < cutoff]:
            del self._open[key]

    def forget(self, gpu: str, kinds: frozenset[str]) -> None:
        """A reset cleared the GPU's events of ``kinds``: their incidents end with them."""
        for key in [k for k in self._open if k[0] == gpu and k[1] in kinds]:
            del self._open[key]

    def drop_weights(self, ids: Iterable[str]) -> None:
        for event_id in ids:
            self.weights.pop(event_id, None)

    def open_incidents(self) -> list[Incident]:
        return list(self._open.values())
