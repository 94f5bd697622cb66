"""The fleet console's view of the state: nodes filtered and sorted on the server (a
browser must not download 10,000 nodes a second to filter them), per finding kind counts,
and when each finding started.

A node that is offline or stale shows health UNKNOWN: what it last reported may no longer
be true, and a stale WARN read as current would mislead whoever is on call.
"""

from __future__ import annotations

import heapq
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from gpuagent.aggregator import views
from gpuagent.aggregator.onsets import Onsets, with_gpu
from gpuagent.aggregator.records import NodeRecord
from gpuagent.aggregator.state import FleetState
from gpuagent.kernel.parse import canonical_pci

HEALTHS = ("CRITICAL", "WARN", "UNKNOWN", "OK")
SORTS = ("health", "name", "cluster", "last_seen", "gpus", "finding_age", "alerts", "cordoned")
# Findings started within this long count as "today" in the per-kind counts.
DAY = 86400.0


def shown_health(record: NodeRecord, now: float, stale_after: float) -> str:
    """The health to show: UNKNOWN unless the node is online and reported recently."""
    if not record.online or record.is_stale(now, stale_after):
        return "UNKNOWN"
    return record.health


def finding_kind(finding: dict[str, Any]) -> str:
    """What a finding is about, for counting nodes per kind: its check, with the code the
    check reports when it has one ("xid 79" rather than every XID together)."""
    check = str(finding.get("check", "")) or "unknown"
    evidence = finding.get("evidence")
    code = evidence.get(check) if isinstance(evidence, dict) else None
    if isinstance(code, int) and not isinstance(code, bool):
        return f"{check} {code}"
    return check


@dataclass(frozen=True)
class Query:
    cluster: str = ""
    health: str = ""
    model: str = ""
    driver: str = ""
    text: str = ""
    # Nodes with a finding of this kind (`finding_kind`), as the per-kind counts name it.
    kind: str = ""
    sort: str = "health"
    descending: bool = False
    limit: int = 500

    def __post_init__(self) -> None:
        if self.health and self.health not in HEALTHS:
            raise ValueError(f"health must be one of {', '.join(HEALTHS)}")
        if self.sort not in SORTS:
            raise ValueError(f"sort must be one of {', '.join(SORTS)}")


def driver_of(record: NodeRecord) -> str:
    return dict(record.fingerprint).get("driver", "")


def _models(record: NodeRecord) -> set[str]:
    return {g.model for g in record.gpus if g.model}


def _reasons(record: NodeRecord) -> Iterable[str]:
    return (str(finding.get("reason", "")) for _, finding in with_gpu(record))


def _searched(record: NodeRecord) -> Iterable[str]:
    """What the text filter looks in: names, reasons, and what an RMA ticket or an alert
    names a GPU by (UUID, serial, bus id)."""
    yield record.node
    yield record.cluster
    yield from _reasons(record)
    for gpu in record.gpus:
        yield from (name for name in (gpu.uuid, gpu.serial, gpu.pci_bus_id) if name)


def _has_bus_id(record: NodeRecord, text: str) -> bool:
    """Whether ``text`` is a bus id, in any form (NVML's "00000000:3B:00.0", lspci's
    "3b:00.0", ...), of one of the node's GPUs."""
    bus_id = canonical_pci(text)
    return bus_id is not None and any(canonical_pci(g.pci_bus_id) == bus_id for g in record.gpus)


def matched_gpus(record: NodeRecord, text: str) -> list[dict[str, Any]]:
    """The node's GPUs a search names, each with what it matched by ("UUID", "serial",
    "bus id"): a search for what an RMA ticket quotes says which GPU it is."""
    text = text.lower()
    bus_id = canonical_pci(text)
    found = []
    for gpu in record.gpus:
        by = [
            name
            for name, value in (("UUID", gpu.uuid), ("serial", gpu.serial))
            if value and text in value.lower()
        ]
        if text in gpu.pci_bus_id.lower() or (
            bus_id is not None and canonical_pci(gpu.pci_bus_id) == bus_id
        ):
            by.append("bus id")
        if by:
            found.append(
                {"index": gpu.index, "uuid": gpu.uuid, "pci_bus_id": gpu.pci_bus_id, "by": by}
            )
    return found


class FleetView:
    """Answers the console's fleet table and node page from the fleet state."""

    def __init__(self, state: FleetState, stale_after: float) -> None:
        self.state = state
        self.stale_after = stale_after

    @property
    def onsets(self) -> Onsets:
        return self.state.onsets

    def _matches(self, record: NodeRecord, query: Query, now: float) -> bool:
        text = query.text.lower()
        return (
            (not query.cluster or record.cluster == query.cluster)
            and (not query.health or shown_health(record, now, self.stale_after) == query.health)
            and (not query.model or query.model in _models(record))
            and (not query.driver or driver_of(record) == query.driver)
            and (not query.kind or any(finding_kind(f) == query.kind for _, f in with_gpu(record)))
            and (
                not text
                or any(text in s.lower() for s in _searched(record))
                or _has_bus_id(record, text)
            )
        )

    def oldest_onset(self, record: NodeRecord) -> float | None:
        onsets = [self.onsets.since(record, gpu, finding) for gpu, finding in with_gpu(record)]
        known = [t for t in onsets if t is not None]
        return min(known) if known else None

    def _sort_key(self, query: Query, now: float) -> Callable[[NodeRecord], Any]:
        keys: dict[str, Callable[[NodeRecord], Any]] = {
            "health": lambda r: views.sort_key(r, now, self.stale_after),
            "name": lambda r: (r.node, r.cluster),
            "cluster": lambda r: (r.cluster, r.node),
            "last_seen": lambda r: (r.last_seen, r.node),
            "gpus": lambda r: (len(r.gpus), r.node),
            "alerts": lambda r: (*self.state.alerts.weight(r), r.node),
            # Cordoned nodes first, worst first among them.
            "cordoned": lambda r: (not r.cordoned, views.sort_key(r, now, self.stale_after)),
        }
        if query.sort in keys:
            return keys[query.sort]

        def age(record: NodeRecord) -> tuple[float, str]:
            # Oldest finding first; nodes without findings after every node with one.
            onset = self.oldest_onset(record)
            return (onset if onset is not None else float("inf"), record.node)

        return age

    def fleet(self, query: Query, now: float | None = None) -> dict[str, Any]:
        now = time.time() if now is None else now
        records = [r for r in self.state.nodes.values() if self._matches(r, query, now)]
        key = self._sort_key(query, now)
        pick = heapq.nlargest if query.descending else heapq.nsmallest
        rows = pick(query.limit, records, key)
        nodes = [self.row(r, now) for r in rows]
        if query.text:
            for doc, record in zip(nodes, rows, strict=True):
                doc["matched_gpus"] = matched_gpus(record, query.text)
        return {
            "nodes": nodes,
            "matched": len(records),
            "counts": views.node_counts(self.state, now, self.stale_after),
            "kinds": self.kinds(now),
            "choices": self.choices(),
            "alertmanager": self.state.alerts.status(),
        }

    def row(self, record: NodeRecord, now: float) -> dict[str, Any]:
        doc = views.node_json(record, now, self.stale_after)
        doc["shown_health"] = shown_health(record, now, self.stale_after)
        doc["driver"] = driver_of(record)
        doc["alerts"] = self.state.alerts.for_node(record)
        window = self.state.maintenance.covering(record, now)
        doc["maintenance"] = window.id if window is not None else None
        doc["findings"] = [self._dated(record, "", f) for f in record.findings]
        for gpu_doc, gpu in zip(doc["gpus"], record.gpus, strict=True):
            gpu_doc["findings"] = [self._dated(record, gpu.pci_bus_id, f) for f in gpu.findings]
        return doc

    def _dated(self, record: NodeRecord, gpu: str, finding: dict[str, Any]) -> dict[str, Any]:
        return {**finding, "since": self.onsets.since(record, gpu, finding)}

    def kinds(self, now: float) -> list[dict[str, Any]]:
        """Nodes per finding kind among nodes online now, most nodes first; "today" counts
        the nodes where it started within the last day."""
        nodes: Counter[str] = Counter()
        today: Counter[str] = Counter()
        for record in self.state.nodes.values():
            if shown_health(record, now, self.stale_after) == "UNKNOWN":
                continue  # what an offline node last reported may be over
            started: dict[str, float] = {}
            for gpu, finding in with_gpu(record):
                kind = finding_kind(finding)
                since = self.onsets.since(record, gpu, finding)
                started[kind] = min(started.get(kind, now), since if since is not None else now)
            for kind, since in started.items():
                nodes[kind] += 1
                today[kind] += now - since < DAY
        return [
            {"kind": kind, "nodes": count, "today": today[kind]}
            for kind, count in sorted(nodes.items(), key=lambda kv: (-kv[1], kv[0]))
        ]

    def choices(self) -> dict[str, list[str]]:
        """The values the filters offer: every cluster, GPU model and driver version."""
        clusters: set[str] = set()
        models: set[str] = set()
        drivers: set[str] = set()
        for record in self.state.nodes.values():
            clusters.add(record.cluster)
            models.update(_models(record))
            if driver := driver_of(record):
                drivers.add(driver)
        return {
            "clusters": sorted(clusters),
            "models": sorted(models),
            "drivers": sorted(drivers),
        }

    def node(
        self, record: NodeRecord, now: float | None = None, document: str | None = None
    ) -> dict[str, Any]:
        """The node page's document: the API's node detail, with shown health and the
        start of every finding, also those in the status document (``document``, the
        stored report; by default the record's own)."""
        now = time.time() if now is None else now
        document = record.document if document is None else document
        doc = views.node_detail(self.state, record, now, self.stale_after, document)
        window = doc["maintenance"]  # the window's JSON: a table row has only its id
        doc.update(self.row(record, now))
        doc["maintenance"] = window
        doc["alertmanager"] = self.state.alerts.status()
        status = doc.get("status")
        gpus = status.get("gpus") if isinstance(status, dict) else None
        for gpu in gpus if isinstance(gpus, list) else ():
            if isinstance(gpu, dict) and isinstance(gpu.get("findings"), list):
                bus = str(gpu.get("pci_bus_id", ""))
                gpu["findings"] = [
                    self._dated(record, bus, f) for f in gpu["findings"] if isinstance(f, dict)
                ]
        return doc
