"""What happens once, as Kubernetes events (events.k8s.io/v1) on the Node: an XID or SXid
incident, a GPU fallen off the bus, removed or back, a remediation action.

Pure: the agent's records in, event bodies out. A kernel-log incident is one event: its
first record creates it, and as the incident grows its ``series`` counts the records (the
API's own aggregation), so a 100,000-line storm is one event, not 100,000.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from gpuagent.model import GpuEvent
    from gpuagent.remediation.audit import AuditRecord

REPORTING_CONTROLLER = "gpuagent.io/agent"
# The API server's limits: note 1 kB, reason, action and reportingInstance 128 characters.
MAX_NOTE = 1024
MAX_FIELD = 128

# Kernel-log and udev kinds worth an event, with the type; the rest (corrected AER
# reports, GSP chatter, crash dumps) are in the agent's own log and the fleet's.
_KERNEL_KINDS = {
    "xid": "Warning",
    "sxid": "Warning",
    "fallen_off_bus": "Warning",
    "gpu_removed": "Warning",
    "driver_unbound": "Warning",
    "gpu_added": "Normal",
    "driver_bound": "Normal",
    "gpu_reset": "Normal",
}
_KIND_REASONS = {
    "fallen_off_bus": "GpuFallenOffBus",
    "gpu_removed": "GpuRemoved",
    "driver_unbound": "GpuDriverUnbound",
    "gpu_added": "GpuAdded",
    "driver_bound": "GpuDriverBound",
    "gpu_reset": "GpuReset",
}
# Audit results worth an event: "started" comes right before its outcome, "skipped" is a
# budget or cooldown saying no again.
_RESULT_WORDS = {
    "planned": "Planned",
    "succeeded": "Succeeded",
    "verified": "Verified",
    "failed": "Failed",
    "refused": "Refused",
    "escalated": "Escalated",
}
_WARNING_RESULTS = frozenset({"failed", "refused", "escalated"})


class NodeEvent(NamedTuple):
    key: str  # the same key is the same event (an incident's first record's id)
    type: str  # "Normal" or "Warning"
    reason: str
    action: str
    note: str
    time: float  # wall clock


def kernel_event(event: GpuEvent) -> NodeEvent | None:
    """The event for a record that opens an incident (or stands alone), or None when its
    kind is not one events are made for."""
    kind_type = _KERNEL_KINDS.get(event.kind)
    if kind_type is None:
        return None
    if event.kind in ("xid", "sxid"):
        reason = f"{'Xid' if event.kind == 'xid' else 'SXid'}{event.code}"
    else:
        reason = _KIND_REASONS[event.kind]
    where = event.gpu or event.pci or "node"
    note = f"{where}: {event.line}"
    if event.source == "drill":
        # Other readers of the Node's events must not take an operator's drill for a fault.
        note = f"DRILL: {note}"
    if event.workloads:
        note += f" (on the GPU: {event.workloads})"
    return NodeEvent(event.event_id, kind_type, reason, "Detected", note, event.time)


def availability_event(
    bus_id: str, index: int | None, lost: bool, reason: str, at: float
) -> NodeEvent:
    """A GPU lost (its availability finding went CRITICAL) or back (OK again)."""
    where = f"GPU {index} ({bus_id})" if index is not None else f"GPU {bus_id}"
    return NodeEvent(
        f"availability:{bus_id}:{'lost' if lost else 'back'}:{at:.6f}",
        "Warning" if lost else "Normal",
        "GpuLost" if lost else "GpuRecovered",
        "Detected",
        f"{where}: {reason}",
        at,
    )


def action_event(record: AuditRecord) -> NodeEvent | None:
    """A remediation attempt's outcome, or None for the records that are not one."""
    word = _RESULT_WORDS.get(record.result)
    if word is None or record.kind in ("report", "evidence"):
        return None
    action = "".join(part.capitalize() for part in record.kind.split("_"))
    note = f"{record.target}: {record.reason}"
    if record.mode != "enforce":
        note = f"[{record.mode}] {note}"
    if record.detail:
        note += f" ({record.detail})"
    kind = "Warning" if record.result in _WARNING_RESULTS else "Normal"
    return NodeEvent(f"audit:{record.id}", kind, action + word, action, note, record.time)


def event_name(node: str, key: str) -> str:
    """A name that is the same for the same key, also after a restart (a second create
    answers 409, and the event is counted on instead of made twice)."""
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return f"{node}.{digest}"


def event_body(event: NodeEvent, *, node: str, node_uid: str, namespace: str) -> dict[str, Any]:
    regarding = {"apiVersion": "v1", "kind": "Node", "name": node}
    if node_uid:
        regarding["uid"] = node_uid  # kubectl describe node finds events by it
    return {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": event_name(node, event.key), "namespace": namespace},
        "eventTime": micro_time(event.time),
        "reportingController": REPORTING_CONTROLLER,
        "reportingInstance": f"gpuagent-{node}"[:MAX_FIELD],
        "action": event.action[:MAX_FIELD],
        "reason": event.reason[:MAX_FIELD],
        "type": event.type,
        "note": _cut(event.note, MAX_NOTE),
        "regarding": regarding,
    }


def series_patch(count: int, last_seen: float) -> dict[str, Any]:
    """A merge patch saying the event has happened ``count`` times (at least 2)."""
    return {"series": {"count": count, "lastObservedTime": micro_time(last_seen)}}


def micro_time(wall: float) -> str:
    """The API's MicroTime: RFC 3339 with microseconds, UTC."""
    return datetime.fromtimestamp(wall, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _cut(text: str, limit: int) -> str:
    data = text.encode()
    if len(data) <= limit:
        return text
    return data[: limit - 3].decode("utf-8", "ignore") + "..."
