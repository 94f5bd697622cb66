"""What the aggregator remembers of one node, built from its state reports.

A record keeps the few fields the API, page, metrics and drift need. The state report's
raw JSON travels with a new record to the database and is read back from there: only
`GET /api/v1/nodes/<node>` needs it whole, and 100,000 reports of 10-50 KB each would be
gigabytes in memory (parsed into Python objects, ten times that).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Any

UNKNOWN_FINGERPRINT = "unknown"
# The GPU settings the fleet compares across nodes (`drift.settings_drift`), named as in
# the status document; a GPU keeps their values in this order, None where not reported.
SETTINGS = (
    "persistence_mode",
    "ecc_enabled",
    "power_requested_limit_w",
    "applications_clock_mhz",
    "mig_mode",
)
_NUMERIC_SETTINGS = frozenset({"power_requested_limit_w", "applications_clock_mhz"})
SettingValue = bool | int | float | None


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
    # The values of SETTINGS, in that order (empty: none reported).
    settings: tuple[SettingValue, ...] = ()
    # What the GPU shares with others: its NVLink domain ("<cluster UUID>/<clique id>",
    # "" when unassigned) and the job it serves ("slurm:<id>", "pod:<namespace>/<pod>").
    nvlink_domain: str = ""
    job: str = ""

    def json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "pci_bus_id": self.pci_bus_id,
            "uuid": self.uuid,
            "serial": self.serial,
            "model": self.model,
            "health": self.health,
            "findings": list(self.findings),
            # `settings` is empty or one value per setting.
            "settings": {
                k: v for k, v in zip(SETTINGS, self.settings, strict=False) if v is not None
            },
            **({"nvlink_domain": self.nvlink_domain} if self.nvlink_domain else {}),
            **({"job": self.job} if self.job else {}),
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
    # Its declared location labels ([agent] labels: rack, leaf switch, power feed ...).
    labels: tuple[tuple[str, str], ...] = ()
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
        settings=_settings(doc),
        nvlink_domain=_nvlink_domain(doc),
        job=_text(doc.get("job")) or _job(doc.get("workloads")),
    )


def _nvlink_domain(doc: dict[str, Any]) -> str:
    """From a status document's GPU (fabric.nvlink_domain) or a summary's."""
    fabric = doc.get("fabric")
    domain = fabric.get("nvlink_domain") if isinstance(fabric, dict) else doc.get("nvlink_domain")
    return domain if isinstance(domain, str) else ""


def _job(workloads: object) -> str:
    """The job a GPU serves, from its workloads: the Slurm job, else the pod."""
    for workload in workloads if isinstance(workloads, list) else ():
        if not isinstance(workload, dict):
            continue
        if workload.get("hpc_job"):
            return f"slurm:{workload['hpc_job']}"
        if workload.get("pod"):
            return f"pod:{workload.get('namespace', '')}/{workload['pod']}"
    return ""


def _setting(name: str, value: object) -> SettingValue:
    """A setting's value if it has the setting's type; None otherwise (N/A, unsupported)."""
    if isinstance(value, bool):
        return None if name in _NUMERIC_SETTINGS else value
    if name in _NUMERIC_SETTINGS and isinstance(value, int | float) and math.isfinite(value):
        return value
    return None


def _settings(doc: dict[str, Any]) -> tuple[SettingValue, ...]:
    """From a status document's GPU (its top-level keys) or a summary's ("settings")."""
    kept = doc.get("settings")
    source = kept if isinstance(kept, dict) else doc
    values = tuple(_setting(name, source.get(name)) for name in SETTINGS)
    return values if any(v is not None for v in values) else ()


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
        labels=_labels(node.get("labels")),
        document=raw,
    )


def _labels(labels: object) -> tuple[tuple[str, str], ...]:
    if not isinstance(labels, dict):
        return ()
    return tuple(sorted((str(k), str(v)) for k, v in labels.items()))


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
            "labels": dict(record.labels),
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
        labels=_labels(doc.get("labels")),
    )
