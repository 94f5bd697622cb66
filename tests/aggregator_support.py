"""Messages as nodes send them, and an aggregator configuration, for the aggregator tests."""

from __future__ import annotations

import dataclasses
import itertools
import time
from pathlib import Path
from typing import Any

from gpuagent.config import AggregatorSection, CordonBudgetSection, MqttConnection
from gpuagent.fleet import schema

PREFIX = "gpuagent/v1"
# The command token `config` sets up, and the header that sends it.
COMMAND_TOKEN = "test-command-token"
AUTH = {"Authorization": f"Bearer {COMMAND_TOKEN}"}
_ids = itertools.count(1)


def topic(node: str, channel: str, cluster: str = "c1") -> str:
    return f"{PREFIX}/{cluster}/{node}/{channel}"


def gpu_doc(
    index: int, health: str = "OK", findings: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    return {
        "index": index,
        "pci_bus_id": f"0000:{0x18 + index:02x}:00.0",
        "uuid": f"GPU-{index}",
        "model": "NVIDIA H100 80GB HBM3",
        "health": health,
        "findings": findings or [],
    }


def finding(check: str, severity: str, reason: str) -> dict[str, Any]:
    return {"check": check, "severity": severity, "reason": reason, "action": "", "runbook": ""}


def state(
    node: str,
    *,
    cluster: str = "c1",
    health: str = "OK",
    gpus: list[dict[str, Any]] | None = None,
    when: float | None = None,
    fingerprint: dict[str, str] | None = None,
    version: str = "0.1.0",
) -> dict[str, Any]:
    message = schema.envelope("state", f"{node}:state:{next(_ids)}", node, cluster, when)
    node_doc: dict[str, Any] = {"name": node, "cluster": cluster, "health": health, "findings": []}
    if fingerprint is not None:
        node_doc["inventory"] = {
            "fingerprint": fingerprint,
            "fingerprint_id": "fp-" + "-".join(fingerprint[k] for k in sorted(fingerprint)),
        }
    message.update(
        online=True,
        agent_version=version,
        status={"schema": 1, "node": node_doc, "gpus": gpus if gpus is not None else [gpu_doc(0)]},
    )
    return message


def offline(node: str, reason: str = "connection lost", cluster: str = "c1") -> dict[str, Any]:
    return schema.offline_message(node, cluster, reason)


def event(
    node: str, event_id: str | None = None, cluster: str = "c1", when: float | None = None
) -> dict[str, Any]:
    message = schema.envelope("event", event_id or f"{node}:ev:{next(_ids)}", node, cluster, when)
    message.update(category="kernel", data={"kind": "xid", "code": 79, "gpu": "0000:18:00.0"})
    return message


def cordon_request(node: str, action: str = "cordon", cluster: str = "c1") -> dict[str, Any]:
    message = schema.envelope("cordon_request", f"{node}:cordon:{next(_ids)}", node, cluster)
    message.update(action=action, reason="XID 79", gpus=["0000:18:00.0"], findings=[])
    return message


def reply(node: str, command_id: str, cluster: str = "c1") -> dict[str, Any]:
    return schema.reply_message(node, cluster, command_id, ok=True, detail="done")


def config(
    tmp_path: Path,
    *,
    port: int = 19500,
    broker: MqttConnection | None = None,
    max_nodes: int = 2,
    window: float = 3600.0,
    arbiter: bool = True,
    **overrides: Any,
) -> AggregatorSection:
    """An aggregator on 127.0.0.1:``port`` with its database in ``tmp_path``, and a command
    token (`COMMAND_TOKEN`) in ``tmp_path``/command-token unless ``command_token_file`` is
    given."""
    if "command_token_file" not in overrides:
        tmp_path.mkdir(parents=True, exist_ok=True)
        token_file = tmp_path / "command-token"
        token_file.write_text(COMMAND_TOKEN + "\n")
        overrides["command_token_file"] = str(token_file)
    base = AggregatorSection(
        listen=f"127.0.0.1:{port}",
        database=tmp_path / "fleet.sqlite",
        broker=broker or MqttConnection(host="127.0.0.1", port=1, tls=False),
        cordon_budget=CordonBudgetSection(
            max_nodes=max_nodes, max_percent=100.0, window_seconds=window, arbiter=arbiter
        ),
        share_group="",
    )
    return dataclasses.replace(base, **overrides)


class FakeClock:
    def __init__(self, now: float | None = None) -> None:
        self.now = time.time() if now is None else now

    def __call__(self) -> float:
        return self.now
