"""Facts: what nodes reported that the fleet rules read (`fleetrules`), one row each in
`gpu_history`. A GPU turning CRITICAL or recovering (its state reports), an automatic
remediation attempt or an RMA evidence bundle (its audit trail), an Xid 13 with its GPC
and TPC (its kernel log). A GPU is keyed by UUID, so its history follows it across
reboots and nodes; a fact of the node itself has no GPU ("")."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from gpuagent.aggregator.records import NodeRecord

FactKind = Literal["critical", "recovered", "action", "evidence", "xid13"]
# The automatic remediation a node attempts (its audit trail's kinds), counted once per
# outcome (an attempt is recorded "started", then one of these), in enforce mode only.
AUTOMATIC_ACTIONS: Final = frozenset({"reset_gpu", "cordon", "cap_power", "enable_persistence"})
ATTEMPT_RESULTS: Final = frozenset({"succeeded", "failed", "escalated"})
INSERT_FACT = (
    "INSERT INTO gpu_history (id, cluster, node, gpu, time, kind, body) "
    "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING"
)


@dataclass(frozen=True, slots=True)
class Fact:
    id: str
    cluster: str
    node: str
    gpu: str  # the GPU's UUID; "" for the node
    time: float
    kind: FactKind
    detail: dict[str, Any] = field(default_factory=dict)

    def row(self) -> tuple[Any, ...]:
        body = json.dumps(self.detail, separators=(",", ":"))
        return (self.id, self.cluster, self.node, self.gpu, self.time, self.kind, body)


def _fact(  # noqa: PLR0917 - a fact's fields, in the row's order
    cluster: str, node: str, gpu: str, when: float, kind: FactKind, detail: dict[str, Any]
) -> Fact:
    return Fact(f"{cluster}/{node}/{gpu}/{kind}/{when!r}", cluster, node, gpu, when, kind, detail)


def _critical(findings: tuple[dict[str, Any], ...]) -> dict[str, Any] | None:
    return next((f for f in findings if f.get("severity") == "CRITICAL"), None)


def state_facts(previous: NodeRecord | None, record: NodeRecord) -> list[Fact]:
    """A GPU turning CRITICAL, or back to OK from CRITICAL, since ``previous``; and the
    node by its own findings (not its GPUs'). GPUs are matched by UUID (one without a
    UUID has no history to follow)."""
    online = previous is not None and previous.online
    before = {g.uuid: g.health for g in previous.gpus if g.uuid} if previous and online else {}
    facts = []
    was = _critical(previous.findings) if previous and online else None
    now = _critical(record.findings)
    if now is not None and was is None:
        detail = {"check": now.get("check"), "reason": now.get("reason")}
        facts.append(_fact(record.cluster, record.node, "", record.last_seen, "critical", detail))
    elif was is not None and now is None:
        facts.append(_fact(record.cluster, record.node, "", record.last_seen, "recovered", {}))
    for gpu in record.gpus:
        if not gpu.uuid:
            continue
        health = before.get(gpu.uuid)
        detail = {"index": gpu.index, "pci_bus_id": gpu.pci_bus_id}
        if gpu.health == "CRITICAL" and health != "CRITICAL":
            finding = gpu.findings[0] if gpu.findings else {}
            detail |= {"check": finding.get("check"), "reason": finding.get("reason")}
            facts.append(_fact(record.cluster, record.node, gpu.uuid, record.last_seen,
                               "critical", detail))  # fmt: skip
        elif health == "CRITICAL" and gpu.health == "OK":
            facts.append(_fact(record.cluster, record.node, gpu.uuid, record.last_seen,
                               "recovered", detail))  # fmt: skip
    return facts


def _uuid_of(record: NodeRecord | None, bus_id: object) -> str:
    if record is None or not isinstance(bus_id, str):
        return ""
    for gpu in record.gpus:
        if gpu.pci_bus_id == bus_id:
            return gpu.uuid
    return ""


def action_fact(message: dict[str, Any], record: NodeRecord | None) -> Fact | None:
    """An automatic remediation attempt, or an RMA evidence bundle, from an action record."""
    audit = message["record"]
    kind, result, when = audit.get("action"), audit.get("result"), audit.get("time")
    if not isinstance(when, int | float) or isinstance(when, bool):
        return None
    detail = {
        "action": kind,
        "result": result,
        "target": audit.get("target"),
        "reason": audit.get("reason"),
        "detail": audit.get("detail"),
        "record": message["id"],
    }
    cluster, node = message["cluster"], message["node"]
    gpu = _uuid_of(record, audit.get("target"))
    if kind == "evidence" and result == "succeeded":
        return _fact(cluster, node, gpu, float(when), "evidence", detail)
    if kind in AUTOMATIC_ACTIONS and result in ATTEMPT_RESULTS and audit.get("mode") == "enforce":
        return Fact(f"{cluster}/{node}/action/{message['id']}", cluster, node, gpu,
                    float(when), "action", detail)  # fmt: skip
    return None


def kernel_fact(message: dict[str, Any], record: NodeRecord | None, now: float) -> Fact | None:
    """An Xid 13 that names where on the die it happened (GPC and TPC)."""
    data = message["data"]
    if data.get("kind") != "xid" or data.get("code") != 13:
        return None
    gpc, tpc, sm = data.get("gpc"), data.get("tpc"), data.get("sm")
    if not isinstance(gpc, int) or not isinstance(tpc, int):
        return None
    uuid = _uuid_of(record, data.get("gpu"))
    if not uuid:
        return None  # no GPU to follow
    sent = data.get("time")
    when = float(sent) if isinstance(sent, int | float) and not isinstance(sent, bool) else now
    detail = {"gpc": gpc, "tpc": tpc, "sm": sm if isinstance(sm, int) else None,
              "pci_bus_id": data.get("gpu"), "line": data.get("line")}  # fmt: skip
    cluster, node = message["cluster"], message["node"]
    return Fact(f"{cluster}/{node}/xid13/{message['id']}", cluster, node, uuid, when,
                "xid13", detail)  # fmt: skip
