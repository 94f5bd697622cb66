"""Planned maintenance: a domain (a declared label such as rack=r129, an NVLink domain, a
job or one node) muted for a while (docs/fleet.md#planned-maintenance).

While a window covers a node, the node's state is still shown, but what a rolling reboot
makes it report is not taken for a fault: its kernel records open no fleet incident, its
facts feed no fleet rule, and its cordon requests are denied ("planned maintenance");
uncordons go through. Windows are rows of `maintenance` (kept after they end, for the
record); the aggregator keeps the ones not yet over in memory, and reads the table again
every `REFRESH_SECONDS` when a shared database holds other aggregators' windows too.
"""

from __future__ import annotations

import functools
import json
import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any, Final

from gpuagent.aggregator.records import NodeRecord

REFRESH_SECONDS: Final = 10.0
MAX_SECONDS: Final = 7 * 86400.0
# Which part of a node a domain's kind matches; any other kind is a node label's name.
KINDS: Final = ("node", "nvlink", "job")
_DOMAIN = re.compile(r"^([A-Za-z0-9_.-]{1,64})=(\S{1,256})$")
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhd]?)$")
_UNITS: Final = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}

INSERT_WINDOW = (
    "INSERT INTO maintenance (id, cluster, domain, start_time, end_time, time, body) "
    "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET end_time = excluded.end_time, "
    "time = excluded.time, body = excluded.body"
)
# Windows that end after ``?``: the current ones, and those ended since (for the API).
SELECT_WINDOWS = "SELECT body FROM maintenance WHERE end_time >= ? ORDER BY start_time DESC"


class MaintenanceError(ValueError):
    """A window asked for with a bad domain or duration."""


@functools.lru_cache(maxsize=1024)  # asked per window, node and record: parse each once
def parse_domain(text: str) -> tuple[str, str]:
    """ "rack=r129" -> ("rack", "r129"); MaintenanceError if not NAME=VALUE."""
    found = _DOMAIN.match(text.strip())
    if found is None:
        raise MaintenanceError(
            f"domain {text!r} is not NAME=VALUE (a node label such as rack=r129, "
            "node=<name>, nvlink=<cluster UUID>/<clique id> or job=slurm:<id>)"
        )
    return found[1], found[2]


def parse_duration(text: str) -> float:
    """ "2h", "90m", "3600" -> seconds; MaintenanceError if not positive and at most 7 days."""
    found = _DURATION.match(text.strip())
    seconds = float(found[1]) * _UNITS[found[2]] if found else 0.0
    if not 0 < seconds <= MAX_SECONDS:
        raise MaintenanceError(f"duration {text!r} must be like 90m, 2h or 1d, at most 7 days")
    return seconds


@dataclass(frozen=True, slots=True)
class Window:
    id: str
    cluster: str  # "" for every cluster
    domain: str  # "rack=r129"
    start: float
    end: float
    by: str
    reason: str
    ended_by: str = ""  # who ended it early ("" while it runs, or when it ran out)

    def json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "cluster": self.cluster,
            "domain": self.domain,
            "start": self.start,
            "end": self.end,
            "by": self.by,
            "reason": self.reason,
            "ended_by": self.ended_by,
        }

    def row(self, now: float) -> tuple[Any, ...]:
        body = json.dumps(self.json(), separators=(",", ":"))
        return (self.id, self.cluster, self.domain, self.start, self.end, now, body)

    def active(self, now: float) -> bool:
        return self.start <= now < self.end

    def covers(self, record: NodeRecord) -> bool:
        if self.cluster and self.cluster != record.cluster:
            return False
        kind, value = parse_domain(self.domain)
        if kind == "node":
            return record.node == value
        if kind == "nvlink":
            return any(gpu.nvlink_domain == value for gpu in record.gpus)
        if kind == "job":
            return any(gpu.job == value for gpu in record.gpus)
        return (kind, value) in record.labels

    def describe(self) -> str:
        return f"planned maintenance {self.id} ({self.domain}, by {self.by}: {self.reason})"


def window_from_json(doc: dict[str, Any]) -> Window:
    return Window(
        id=str(doc["id"]),
        cluster=str(doc.get("cluster", "")),
        domain=str(doc["domain"]),
        start=float(doc["start"]),
        end=float(doc["end"]),
        by=str(doc.get("by", "")),
        reason=str(doc.get("reason", "")),
        ended_by=str(doc.get("ended_by", "")),
    )


class Maintenance:
    """The windows not yet over (a handful): asked per cordon request and per record."""

    def __init__(self) -> None:
        self.windows: dict[str, Window] = {}

    def load(self, docs: Iterable[dict[str, Any]]) -> None:
        """Windows as stored; a window only ever ends sooner, so the earlier end wins (an
        early end here may not be written yet)."""
        for doc in docs:
            window = window_from_json(doc)
            known = self.windows.get(window.id)
            if known is None or window.end < known.end:
                self.windows[window.id] = window

    def start(
        self, domain: str, seconds: float, *, cluster: str, by: str, reason: str, now: float
    ) -> Window:
        parse_domain(domain)
        if not 0 < seconds <= MAX_SECONDS:
            raise MaintenanceError("a window lasts more than 0 s and at most 7 days")
        window = Window(f"mw-{uuid.uuid4().hex[:12]}", cluster, domain.strip(), now,
                        now + seconds, by, reason)  # fmt: skip
        self.windows[window.id] = window
        return window

    def end(self, window_id: str, *, by: str, now: float) -> Window:
        """End a window early; KeyError if none with that id is still running."""
        window = self.windows.get(window_id)
        if window is None or not window.active(now):
            raise KeyError(window_id)
        ended = replace(window, end=now, ended_by=by)
        self.windows[window_id] = ended
        return ended

    def covering(self, record: NodeRecord | None, now: float) -> Window | None:
        """The running window that covers ``record``'s node, if any."""
        if record is None or not self.windows:
            return None
        for window in list(self.windows.values()):
            if window.end <= now:
                del self.windows[window.id]  # over: only the table keeps it
            elif window.active(now) and window.covers(record):
                return window
        return None

    def running(self, now: float) -> list[Window]:
        return sorted((w for w in self.windows.values() if w.active(now)), key=lambda w: w.start)
