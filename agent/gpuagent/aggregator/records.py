"""What the aggregator remembers of one node, built from its state reports.

A record keeps the few fields the API, page, metrics and drift need, plus the state
report's raw JSON: parsing every node's full status document into Python objects would
cost ten times its size in memory, and only `GET /api/v1/nodes/<node>` needs it whole.
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

    def json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "pci_bus_id": self.pci_bus_id,
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
    # The last online state message, as received (JSON text).
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
        document=raw,
    )


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


def status_of(record: NodeRecord) -> dict[str, Any] | None:
    """The status document of the node's last online report, parsed on demand."""
    if not record.document:
        return None
    status = json.loads(record.document).get("status")
    return status if isinstance(status, dict) else None
