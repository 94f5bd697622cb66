"""JSON views of the fleet state for the API and the page."""

from __future__ import annotations

import heapq
from typing import Any

from gpuagent.aggregator.drift import node_settings_drift
from gpuagent.aggregator.records import NodeRecord, status_of
from gpuagent.aggregator.state import FleetState

# Worst first, for sorting the page: broken, then nodes we know nothing current of
# (offline, then stale: whatever they last said may be over, so they rank above a WARN we
# can see), then degraded, then online nodes that could not judge themselves, then healthy.
_RANK_CRITICAL, _RANK_OFFLINE, _RANK_STALE = 0, 1, 2
_HEALTH_RANK = {"CRITICAL": _RANK_CRITICAL, "WARN": 3, "UNKNOWN": 4, "OK": 5}


def node_json(record: NodeRecord, now: float, stale_after: float) -> dict[str, Any]:
    return {
        "name": record.node,
        "cluster": record.cluster,
        "health": record.health,
        "online": record.online,
        "stale": record.is_stale(now, stale_after),
        "reason": record.reason,
        "last_seen": record.last_seen,
        "agent_version": record.agent_version,
        "fingerprint_id": record.fingerprint_id,
        "cordoned": record.cordoned,
        "findings": list(record.findings),
        "gpus": [g.json() for g in record.gpus],
    }


def node_detail(
    state: FleetState, record: NodeRecord, now: float, stale_after: float, document: str
) -> dict[str, Any]:
    """The node's page: its record, replies, the status of its last report (``document``,
    the stored message), and where its GPUs' settings are off their fleet group's."""
    doc = node_json(record, now, stale_after)
    doc["fingerprint"] = dict(record.fingerprint)
    doc["setting_drift"] = [d.json() for d in node_settings_drift(state.nodes.values(), record)]
    window = state.maintenance.covering(record, now)
    doc["maintenance"] = window.json() if window is not None else None
    doc["replies"] = list(reversed(state.replies.get(record.key, ())))
    doc["status"] = status_of(document)
    return doc


def sort_key(record: NodeRecord, now: float, stale_after: float) -> tuple[int, str, str]:
    """CRITICAL online nodes first, then offline ones, stale ones, WARN, UNKNOWN and OK."""
    if not record.online:
        rank = _RANK_OFFLINE
    elif record.is_stale(now, stale_after):
        rank = _RANK_STALE
    else:
        rank = _HEALTH_RANK.get(record.health, _HEALTH_RANK["UNKNOWN"])
    return (rank, record.cluster, record.node)


def nodes_json(
    state: FleetState, now: float, stale_after: float, limit: int | None = None
) -> list[dict[str, Any]]:
    """Every node in `sort_key` order, or the first ``limit`` of them: the page shows only
    the first few hundred, and every node of a large fleet is megabytes of JSON."""

    def key(record: NodeRecord) -> tuple[int, str, str]:
        return sort_key(record, now, stale_after)

    records = state.nodes.values()
    ordered = sorted(records, key=key) if limit is None else heapq.nsmallest(limit, records, key)
    return [node_json(r, now, stale_after) for r in ordered]


_COUNTED = {"CRITICAL": "critical", "WARN": "warning", "OK": "ok"}


def node_counts(state: FleetState, now: float, stale_after: float) -> dict[str, int]:
    """How many nodes there are, and how many are in each state the table shows: offline,
    stale (online, not heard from lately), else by their health. Each node counts once, so
    a node that went offline while CRITICAL is offline, not critical."""
    counts = dict.fromkeys(("nodes", "critical", "warning", "ok", "unknown", "offline", "stale"), 0)
    for record in state.nodes.values():
        counts["nodes"] += 1
        if not record.online:
            counts["offline"] += 1
        elif record.is_stale(now, stale_after):
            counts["stale"] += 1
        else:
            counts[_COUNTED.get(record.health, "unknown")] += 1
    return counts
