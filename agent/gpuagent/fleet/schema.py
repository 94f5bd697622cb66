"""The payloads nodes and the aggregator exchange (schema 1), built and checked here only.

Every message is one JSON object with a common envelope::

    {"schema": 1, "type": ..., "id": ..., "node": ..., "cluster": ..., "time": ...}

``id`` is stable for the life of the message (a retry re-sends the same id), so the
aggregator de-duplicates at-least-once delivery by it. A reader rejects anything oversized,
not JSON, of another schema, of an unknown type, or missing a field, with a `PayloadError`
whose ``reason`` (a `RejectReason`) labels the rejected-messages counters.
docs/fleet.md documents each type.
"""

from __future__ import annotations

import json
import math
import secrets
import time
from typing import Any, Final, Literal, get_args

from gpuagent.incidents import Incident
from gpuagent.model import GpuEvent, NodeSnapshot
from gpuagent.remediation.audit import AuditRecord
from gpuagent.remediation.types import CordonRequest
from gpuagent.statusview import event_json, status_document

SCHEMA: Final = 1
# Larger than any state report of a 16-GPU node, small enough that nobody can make a
# reader buffer much.
MAX_PAYLOAD_BYTES: Final = 256 * 1024
# Envelope times are Unix seconds; anything past the year 5000 is not a clock reading.
MAX_TIME: Final = 1e11

MessageType = Literal[
    "state", "event", "action", "cordon_request", "reply", "command", "cordon_decision", "ack"
]
MESSAGE_TYPES: Final[frozenset[str]] = frozenset(get_args(MessageType))
RejectReason = Literal["oversized", "malformed", "schema", "unknown_type", "invalid", "foreign"]
# Commands the aggregator may send a node. Anything else is refused by the node.
COMMANDS: Final[frozenset[str]] = frozenset(
    ("refresh", "run_checks", "set_remediation_mode", "cordon_decision", "reset_gpu", "ack")
)
Decision = Literal["approved", "denied", "deferred"]

# Fields each type needs beyond the envelope, and their JSON types.
_REQUIRED: Final[dict[str, dict[str, type | tuple[type, ...]]]] = {
    "state": {"online": bool},
    "event": {"category": str, "data": dict},
    "action": {"record": dict},
    "cordon_request": {"action": str, "reason": str, "gpus": list, "findings": list},
    "reply": {"ok": bool},
    "command": {"command": str, "args": dict},
    "cordon_decision": {"request_id": str, "decision": str, "reason": str},
    "ack": {"ids": list},
}
_ENVELOPE: Final[dict[str, type | tuple[type, ...]]] = {
    "id": str,
    "node": str,
    "cluster": str,
    "time": (int, float),
}


class PayloadError(ValueError):
    def __init__(self, reason: RejectReason, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason: RejectReason = reason
        self.detail = detail


# --- building ---------------------------------------------------------------------------


def envelope(
    kind: MessageType, message_id: str, node: str, cluster: str, when: float | None = None
) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "type": kind,
        "id": message_id,
        "node": node,
        "cluster": cluster,
        "time": time.time() if when is None else when,
    }


def state_message(snapshot: NodeSnapshot, agent_version: str) -> dict[str, Any]:
    """The retained node report: the whole status document (docs/api.md)."""
    message = envelope(
        "state",
        f"{snapshot.node_name}:state:{snapshot.sequence}",
        snapshot.node_name,
        snapshot.cluster,
        snapshot.taken_at,
    )
    message.update(online=True, agent_version=agent_version, status=status_document(snapshot))
    return message


def offline_message(
    node: str, cluster: str, reason: str, when: float | None = None
) -> dict[str, Any]:
    """Last Will (reason "connection lost") and the clean-shutdown report ("shutdown")."""
    message = envelope("state", f"{node}:offline", node, cluster, when)
    message.update(online=False, reason=reason)
    return message


def kernel_event_message(node: str, cluster: str, event: GpuEvent) -> dict[str, Any]:
    # Kernel-log and NVML event ids are already stable (boot id and sequence number).
    message = envelope("event", f"{node}:{event.event_id}", node, cluster, event.time)
    message.update(category="kernel", data=event_json(event))
    return message


def incident_message(node: str, cluster: str, incident: Incident) -> dict[str, Any]:
    """A kernel-log incident grew (a storm): its newest record and how many records it has
    had, one message per change instead of one per record. Its id names the count, so a
    re-sent one is the same message and a later one is another."""
    last = incident.last
    message = envelope("event", f"{node}:{incident.id}:n{incident.count}", node, cluster, last.time)
    data = event_json(last)
    data["incident"] = {
        "id": incident.id,
        "count": incident.count,
        "first_time": incident.first.time,
        "last_time": last.time,
        "root_xid": incident.root_xid,
    }
    message.update(category="kernel", data=data)
    return message


def finding_event_message(
    snapshot: NodeSnapshot, gpu: str | None, check: str, before: str, finding: dict[str, Any]
) -> dict[str, Any]:
    """One finding changing severity (``finding`` as statusview.finding_json gives it)."""
    where = gpu or "node"
    message = envelope(
        "event",
        f"{snapshot.node_name}:finding:{where}:{check}:{int(snapshot.taken_at * 1000)}",
        snapshot.node_name,
        snapshot.cluster,
        snapshot.taken_at,
    )
    message.update(
        category="finding",
        data={"gpu": gpu, "from": before, "to": finding["severity"], **finding},
    )
    return message


def action_message(node: str, cluster: str, record: AuditRecord) -> dict[str, Any]:
    # Audit rows are numbered by SQLite and never reused: node + row id is stable.
    message = envelope("action", f"{node}:audit:{record.id}", node, cluster, record.time)
    message.update(record=record.json())
    return message


def cordon_request_message(request: CordonRequest, action: str) -> dict[str, Any]:
    message = envelope("cordon_request", request.request_id, request.node, request.cluster)
    message.update(
        action=action,
        reason=request.reason,
        gpus=list(request.gpus),
        findings=[{"gpu": g or None, "check": c, "reason": r} for g, c, r in request.findings],
    )
    return message


def reply_message(
    node: str, cluster: str, command_id: str, *, ok: bool, detail: str
) -> dict[str, Any]:
    message = envelope("reply", f"{node}:reply:{command_id}", node, cluster)
    message.update(ok=ok, command_id=command_id, detail=detail)
    return message


def command_message(
    message_id: str, node: str, cluster: str, command: str, args: dict[str, Any] | None = None
) -> dict[str, Any]:
    message = envelope("command", message_id, node, cluster)
    message.update(command=command, args=args or {})
    return message


def cordon_decision_message(
    node: str,
    cluster: str,
    request_id: str,
    *,
    decision: Decision,
    reason: str,
    retry_after_seconds: float | None = None,
) -> dict[str, Any]:
    message = envelope("cordon_decision", f"{request_id}:decision", node, cluster)
    message.update(request_id=request_id, decision=decision, reason=reason)
    if retry_after_seconds is not None:
        message["retry_after_seconds"] = retry_after_seconds
    return message


def ack_message(node: str, cluster: str, ids: list[str]) -> dict[str, Any]:
    """The aggregator has stored these messages of the node: its spool may drop them."""
    message = envelope("ack", f"ack:{secrets.token_hex(16)}", node, cluster)
    message["ids"] = ids
    return message


def encode(message: dict[str, Any]) -> bytes:
    return dumps(message).encode()


def dumps(doc: object) -> str:
    """Compact, strict JSON; a non-finite number (NaN from a broken sensor) becomes null,
    since strict JSON readers (a browser's) reject the whole document over one."""
    try:
        return json.dumps(doc, separators=(",", ":"), default=str, allow_nan=False)
    except ValueError:
        return json.dumps(_finite(doc), separators=(",", ":"), default=str)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


# --- reading ----------------------------------------------------------------------------


def decode(
    payload: bytes | bytearray | str, *, max_bytes: int = MAX_PAYLOAD_BYTES
) -> dict[str, Any]:
    """Parse and check one message; PayloadError says why it is refused."""
    if len(payload) > max_bytes:
        raise PayloadError("oversized", f"{len(payload)} bytes (limit {max_bytes})")
    try:
        message = json.loads(payload, parse_constant=_refuse_constant)
    except (ValueError, UnicodeDecodeError) as exc:
        raise PayloadError("malformed", f"not JSON: {exc}") from None
    except RecursionError:
        raise PayloadError("malformed", "nested too deeply") from None
    if not isinstance(message, dict):
        raise PayloadError("malformed", "not a JSON object")
    if message.get("schema") != SCHEMA:
        raise PayloadError("schema", f"schema {message.get('schema')!r} (this reads {SCHEMA})")
    kind = message.get("type")
    if not isinstance(kind, str) or kind not in MESSAGE_TYPES:
        raise PayloadError("unknown_type", f"type {kind!r}")
    for name, expected in (_ENVELOPE | _REQUIRED[kind]).items():
        value = message.get(name)
        if not isinstance(value, expected) or isinstance(value, bool) is not (expected is bool):
            raise PayloadError("invalid", f"{kind}: field {name!r} missing or of the wrong type")
    # A time no clock can show (a huge integer overflows float) would poison every
    # comparison and column it reaches.
    if not 0 <= message["time"] <= MAX_TIME:
        raise PayloadError("invalid", f"{kind}: time {message['time']!r} out of range")
    return message


def _refuse_constant(name: str) -> float:
    # NaN and Infinity are not JSON; Python's reader accepts them unless told otherwise.
    raise ValueError(f"{name} is not a JSON number")
