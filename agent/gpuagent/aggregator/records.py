"""What the aggregator remembers of one node, built from its state reports.

A record keeps the few fields the API, page, metrics and drift need. The state report's
raw JSON travels with a new record to the database and is read back from there: only
`GET /api/v1/nodes/<node>` needs it whole, and 100,000 reports of 10-50 KB each would be
gigabytes in memory (parsed into Python objects, ten times that).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

UNKNOWN_FINGERPRINT = "unknown"


@dataclass(frozen=True, slots=True)
class GpuSummary:
    index: int | None
    pci_bus_id: str
    model: str
    health: str
    findings: tuple[dict[str, Any], ...]
    # What an RMA ticket or an alert names a GPU by ("" when the report has none).
    uuid: str = ""
    serial: str = ""

    def json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "pci_bus_id": self.pci_bus_id,
            "uuid": self.uuid,
            "serial": self.serial,
            "model": self.model,
            "health": self.health,
            "findings": list(self.findings),
        }


@dataclass(frozen=True, slots=True)
class NodeRecord:
    cluster: str
    node: str
    online: bool
    health: str
    # Why the node is offline ("connection lost", "shutdown"); empty while online.
    reason: str
    # The node's last report time, never later than when it arrived (a node whose clock
    # runs ahead must still go stale).
    last_seen: float
    agent_version: str
    gpus: tuple[GpuSummary, ...] = ()
    findings: tuple[dict[str, Any], ...] = ()
    fingerprint_id: str = UNKNOWN_FINGERPRINT
    fingerprint: tuple[tuple[str, str], ...] = ()
    # The node says it is cordoned by its agent (status.remediation.cordoned_by_us).
    cordoned: bool = False
    # The last online state message, as received (JSON text), on its way to the database;
    # the records the fleet state keeps leave it there (empty), and a node's page reads it
    # back (`FleetStore.node_document`).
    document: str = ""

    @property
    def key(self) -> tuple[str, str]:
        return (self.cluster, self.node)

    def is_stale(self, now: float, stale_after: float) -> bool:
        return now - self.last_seen > stale_after


def _text(value: object, default: str = "") -> str:
    return value if isinstance(value, str) else default


def _dicts(value: object) -> tuple[dict[str, Any], ...]:
    return tuple(v for v in value if isinstance(v, dict)) if isinstance(value, list) else ()


def _gpu(doc: dict[str, Any]) -> GpuSummary:
    index = doc.get("index")
    return GpuSummary(
        index=index if isinstance(index, int) and not isinstance(index, bool) else None,
        pci_bus_id=_text(doc.get("pci_bus_id")),
        model=_text(doc.get("model")),
        health=_text(doc.get("health"), "UNKNOWN"),
        findings=_dicts(doc.get("findings")),
        uuid=_text(doc.get("uuid")),
        serial=_text(doc.get("serial")),
    )


def _fingerprint(node: dict[str, Any]) -> tuple[str, tuple[tuple[str, str], ...]]:
    """(fingerprint id, fields) from status.node.inventory; optional, so "unknown" when
    absent or of the wrong shape."""
    inventory = node.get("inventory")
    if not isinstance(inventory, dict):
        return UNKNOWN_FINGERPRINT, ()
    fingerprint_id = inventory.get("fingerprint_id")
    fields = inventory.get("fingerprint")
    if not isinstance(fingerprint_id, str) or not fingerprint_id:
        return UNKNOWN_FINGERPRINT, ()
    if not isinstance(fields, dict):
        fields = {}
    return fingerprint_id, tuple(sorted((str(k), str(v)) for k, v in fields.items()))


def from_online_state(message: dict[str, Any], raw: str, received_at: float) -> NodeRecord:
    """A record from an ``online: true`` state message; a status document of the wrong
    shape gives UNKNOWN health rather than an error (the envelope was valid)."""
    status = message.get("status")
    status = status if isinstance(status, dict) else {}
    node = status.get("node")
    node = node if isinstance(node, dict) else {}
    fingerprint_id, fingerprint = _fingerprint(node)
    return NodeRecord(
        cluster=message["cluster"],
        node=message["node"],
        online=True,
        health=_text(node.get("health"), "UNKNOWN"),
        reason="",
        last_seen=min(float(message["time"]), received_at),
        agent_version=_text(message.get("agent_version")),
        gpus=tuple(_gpu(g) for g in _dicts(status.get("gpus"))),
        findings=_dicts(node.get("findings")),
        fingerprint_id=fingerprint_id,
        fingerprint=fingerprint,
        cordoned=_cordoned(status),
        document=raw,
    )


def _cordoned(status: dict[str, Any]) -> bool:
    remediation = status.get("remediation")
    return isinstance(remediation, dict) and remediation.get("cordoned_by_us") is True


def with_offline(
    message: dict[str, Any], previous: NodeRecord | None, received_at: float
) -> NodeRecord:
    """The node went away (Last Will or clean shutdown): keep what it last reported."""
    reason = _text(message.get("reason"), "offline")
    if previous is None:
        return NodeRecord(
            cluster=message["cluster"],
            node=message["node"],
            online=False,
            health="UNKNOWN",
            reason=reason,
            last_seen=min(float(message["time"]), received_at),
            agent_version="",
        )
    return dataclasses.replace(previous, online=False, reason=reason)


def status_of(document: str) -> dict[str, Any] | None:
    """The status document of a node's last online report (its message as stored)."""
    if not document:
        return None
    status = json.loads(document).get("status")
    return status if isinstance(status, dict) else None


def summary_json(record: NodeRecord) -> str:
    """What the fleet view needs of the record beyond the node table's columns, and the
    report's time (`from_summary` refuses a summary of another report)."""
    return json.dumps(
        {
            "last_seen": record.last_seen,
            "gpus": [gpu.json() for gpu in record.gpus],
            "findings": list(record.findings),
            "fingerprint_id": record.fingerprint_id,
            "fingerprint": dict(record.fingerprint),
            "cordoned": record.cordoned,
        },
        separators=(",", ":"),
    )


def from_summary(base: NodeRecord, summary: str) -> NodeRecord | None:
    """``base`` (the node table's columns) with what `summary_json` kept; None if the
    summary is missing, malformed, or of another report than ``base.last_seen``."""
    try:
        doc = json.loads(summary) if summary else None
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("last_seen") != base.last_seen:
        return None
    fingerprint = doc.get("fingerprint")
    fingerprint_id = doc.get("fingerprint_id")
    return dataclasses.replace(
        base,
        gpus=tuple(_gpu(g) for g in _dicts(doc.get("gpus"))),
        findings=_dicts(doc.get("findings")),
        fingerprint_id=fingerprint_id if isinstance(fingerprint_id, str) else UNKNOWN_FINGERPRINT,
        fingerprint=tuple(sorted((str(k), str(v)) for k, v in fingerprint.items()))
        if isinstance(fingerprint, dict)
        else (),
        cordoned=doc.get("cordoned") is True,
    )
