"""Each node's history, from its state reports: health transitions (the node's and each
GPU's) and a sample of every GPU's trend values, for the console's timelines
(`GET /api/v1/history/NODE`, docs/fleet.md "History").

What a node can write is bounded whatever it sends: one sample per `interval` and at most
TRANSITIONS_PER_HOUR transitions an hour (a flapping GPU's later changes that hour are
seen in the samples), so a week of a node is a few thousand rows.
"""

from __future__ import annotations

import json
from collections import deque
from typing import Any

from gpuagent.aggregator.records import NodeRecord

TRANSITIONS_PER_HOUR = 60
# What a sample keeps of each GPU (the state report's names).
TREND_FIELDS = ("temperature_c", "power_w", "utilization_gpu_pct", "ecc_dbe_volatile")

# A history row: (id, cluster, node, time, kind, body).
HistoryRow = tuple[str, str, str, float, str, str]


class HistoryRecorder:
    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._sampled: dict[tuple[str, str], float] = {}
        self._transitions: dict[tuple[str, str], deque[float]] = {}

    def rows(
        self, previous: NodeRecord | None, record: NodeRecord, status: dict[str, Any]
    ) -> list[HistoryRow]:
        """What an online report adds: transitions since ``previous``, and a sample when
        the interval has passed."""
        rows = self._changes(previous, record)
        key = record.key
        if record.last_seen - self._sampled.get(key, float("-inf")) >= self.interval:
            self._sampled[key] = record.last_seen
            rows.append(_row(record, "sample", {"health": record.health, "gpus": _trends(status)}))
        return rows

    def offline(self, previous: NodeRecord | None, record: NodeRecord) -> list[HistoryRow]:
        """A node going offline is a transition too (its health is unknown from then)."""
        if previous is None or not previous.online:
            return []
        body = {"gpu": None, "health": "OFFLINE", "previous": previous.health}
        return self._admitted(record, [body])

    def _changes(self, previous: NodeRecord | None, record: NodeRecord) -> list[HistoryRow]:
        before_node = previous.health if previous is not None and previous.online else None
        before_gpus = {g.index: g.health for g in previous.gpus} if previous is not None else {}
        changes: list[dict[str, Any]] = []
        if record.health != before_node:
            changes.append({"gpu": None, "health": record.health, "previous": before_node})
        for gpu in record.gpus:
            before = before_gpus.get(gpu.index)
            if gpu.health != before and (before is not None or gpu.health != "OK"):
                reason = str(gpu.findings[0].get("reason", "")) if gpu.findings else ""
                changes.append(
                    {"gpu": gpu.index, "health": gpu.health, "previous": before, "reason": reason}
                )
        return self._admitted(record, changes)

    def _admitted(self, record: NodeRecord, changes: list[dict[str, Any]]) -> list[HistoryRow]:
        recent = self._transitions.setdefault(record.key, deque())
        while recent and recent[0] <= record.last_seen - 3600.0:
            recent.popleft()
        rows = []
        for change in changes:
            if len(recent) >= TRANSITIONS_PER_HOUR:
                break
            recent.append(record.last_seen)
            rows.append(_row(record, "transition", change, suffix=f"{change['gpu']}"))
        return rows


def _trends(status: dict[str, Any]) -> dict[str, list[Any]]:
    """Every GPU's trend values, a column each (the GPUs in the report's order; null where
    a GPU has no value): a week of samples is a third the size of one object per GPU."""
    gpus = status.get("gpus") if isinstance(status, dict) else None
    rows = [g for g in gpus if isinstance(g, dict)] if isinstance(gpus, list) else []
    columns: dict[str, list[Any]] = {
        "index": [g.get("index") for g in rows],
        "health": [g.get("health") for g in rows],
    }
    for name in TREND_FIELDS:
        values = [g.get(name) for g in rows]
        columns[name] = [v if isinstance(v, int | float) and not isinstance(v, bool) else None
                         for v in values]  # fmt: skip
    columns["xid_events"] = [_xid_events(g) for g in rows]
    return columns


def _xid_events(gpu: dict[str, Any]) -> int:
    """The XID events the GPU's xid finding counts (0 without one). The report was
    checked for its envelope, not every field: anything of another shape counts 0."""
    findings = gpu.get("findings")
    for finding in findings if isinstance(findings, list) else []:
        if not isinstance(finding, dict) or finding.get("check") != "xid":
            continue
        evidence = finding.get("evidence")
        count = evidence.get("xid_events") if isinstance(evidence, dict) else None
        return count if isinstance(count, int) and not isinstance(count, bool) else 0
    return 0


def _row(record: NodeRecord, kind: str, change: dict[str, Any], suffix: str = "") -> HistoryRow:
    row_id = f"{record.cluster}/{record.node}/{kind}/{record.last_seen!r}/{suffix}"
    body = {"time": record.last_seen, "kind": kind, **change}
    body_json = json.dumps(body, separators=(",", ":"))
    return (row_id, record.cluster, record.node, record.last_seen, kind, body_json)
