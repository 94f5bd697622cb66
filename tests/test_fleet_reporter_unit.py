"""The reporter's logic without a broker: finding transitions, the spool when the disk is
full, command handling, and the aggregator cordon backend."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from gpuagent.config import MqttOutput
from gpuagent.fleet import schema
from gpuagent.fleet.reporter import CommandRefusedError, Reporter
from gpuagent.model import Finding, GpuEvent, NodeHealth, NodeSnapshot, NvmlStatus, Severity
from gpuagent.remediation.aggregator import AggregatorBackend
from gpuagent.remediation.types import CordonRequest

BUS = "0000:3b:00.0"


class Target:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def refresh(self) -> None:
        self.calls.append("refresh")

    async def run_checks(self) -> str:
        return "8 GPUs, health OK, 0 problems"

    def set_remediation_mode(self, mode: str) -> str:
        if mode not in ("observe", "enforce"):
            raise ValueError(f"bad mode {mode!r}")
        self.calls.append(f"mode {mode}")
        return f"mode {mode}"

    async def reset_gpu(self, bus_id: str) -> str:
        if bus_id != BUS:
            raise CommandRefusedError(f"no GPU {bus_id}")
        self.calls.append(f"reset {bus_id}")
        return "succeeded"


def _reporter(tmp_path: Path, **config: Any) -> Reporter:
    reporter = Reporter(
        MqttOutput(enabled=True, **config),
        node="n1",
        cluster="c1",
        agent_version="1.0",
        state_dir=tmp_path,
    )
    reporter.target = Target()
    return reporter


def _snapshot(sequence: int, *findings: Finding) -> NodeSnapshot:
    return NodeSnapshot(
        node_name="n1",
        cluster="c1",
        hostname="h",
        sequence=sequence,
        taken_at=1000.0 + sequence,
        nvml=NvmlStatus(ok=True),
        health=NodeHealth(findings),
    )


def _spooled(reporter: Reporter) -> list[dict[str, Any]]:
    return [json.loads(m.payload) for m in reporter.spool.head(1000)]


async def _settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


async def test_finding_changes_become_events_and_clears_too(tmp_path: Path) -> None:
    reporter = _reporter(tmp_path)
    ok = Finding("ecc", Severity.OK, "no errors", gpu=BUS)
    dbe = Finding("ecc", Severity.CRITICAL, "1 DBE", gpu=BUS, runbook="gpu-ecc-dbe")
    node = Finding("sxid", Severity.WARN, "SXid 12028", runbook="node-sxid")
    reporter.offer_snapshot(_snapshot(1, ok))
    reporter.offer_snapshot(_snapshot(2, ok))  # nothing changed: nothing sent
    reporter.offer_snapshot(_snapshot(3, dbe, node))
    reporter.offer_snapshot(_snapshot(4, dbe))  # the node finding is gone
    await _settle()
    changes = [
        (m["data"]["gpu"], m["data"]["check"], m["data"]["from"], m["data"]["to"])
        for m in _spooled(reporter)
    ]
    assert changes == [
        (BUS, "ecc", "OK", "CRITICAL"),
        (None, "sxid", "OK", "WARN"),
        (None, "sxid", "WARN", "OK"),
    ]
    first = _spooled(reporter)[0]
    assert first["data"]["runbook"] == "gpu-ecc-dbe"
    assert schema.decode(json.dumps(first)) == first


async def test_a_full_disk_holds_messages_in_memory_until_it_can_write(tmp_path: Path) -> None:
    reporter = _reporter(tmp_path)
    writable = reporter.spool._db
    reporter.spool._db = sqlite3.connect(
        f"file:{tmp_path / 'mqtt-spool.sqlite'}?mode=ro", uri=True, isolation_level=None
    )
    event = GpuEvent("kmsg:b:1", "kmsg", "xid", BUS, 1000.0, 5.0, code=79, line="Xid 79")
    reporter.offer_event(event)
    await _settle()
    assert reporter.status().spool_depth == 1  # in memory
    assert reporter.spool.head() == []
    reporter.spool._db = writable
    reporter.offer_event(GpuEvent("kmsg:b:2", "kmsg", "xid", BUS, 1001.0, 6.0, code=13))
    await _settle()
    assert [m["id"] for m in _spooled(reporter)] == ["n1:kmsg:b:1", "n1:kmsg:b:2"]
    assert reporter.status().spool_depth == 2


def _command(command: str, args: dict[str, Any] | None = None, **envelope: Any) -> bytes:
    message = schema.command_message(f"id-{command}", "n1", "c1", command, args)
    message.update(envelope)
    return schema.encode(message)


async def test_commands_allowlist_and_rejections(tmp_path: Path) -> None:
    reporter = _reporter(tmp_path, max_command_bytes=2048)
    target = reporter.target
    assert isinstance(target, Target)
    for payload in (
        b"[]",
        b"{" * 3000,
        _command("refresh", node="n2"),
        _command("shell", {"cmd": "rm -rf /"}),
        _command("refresh"),
        _command("refresh"),  # the same id again: carried out once
        _command("set_remediation_mode", {"mode": "chaos"}),
        _command("reset_gpu", {"gpu": BUS}),
    ):
        await reporter.handle_command(payload)
    await _settle()
    assert dict(reporter.rejected_commands) == {
        "malformed": 1,
        "oversized": 1,
        "foreign": 1,
        "not_allowed": 1,
    }
    assert target.calls == ["refresh"]
    replies = {m["command_id"]: (m["ok"], m["detail"]) for m in _spooled(reporter)}
    assert replies["id-refresh"] == (True, "refresh requested")
    assert replies["id-set_remediation_mode"] == (False, "bad mode 'chaos'")
    assert replies["id-reset_gpu"][0] is False
    assert "allow_remote_reset" in replies["id-reset_gpu"][1]


async def test_remote_reset_when_allowed_goes_to_the_node(tmp_path: Path) -> None:
    reporter = _reporter(tmp_path, allow_remote_reset=True)
    await reporter.handle_command(_command("reset_gpu", {"gpu": BUS}))
    await reporter.handle_command(
        schema.encode(schema.command_message("x2", "n1", "c1", "reset_gpu", {"gpu": "nope"}))
    )
    await _settle()
    replies = {m["command_id"]: (m["ok"], m["detail"]) for m in _spooled(reporter)}
    assert replies == {"id-reset_gpu": (True, "succeeded"), "x2": (False, "no GPU nope")}


def _request() -> CordonRequest:
    return CordonRequest(node="n1", cluster="c1", reason="GPU: DBE", request_id="n1:1")


async def test_aggregator_backend_follows_the_decision(tmp_path: Path) -> None:
    reporter = _reporter(tmp_path)
    backend = AggregatorBackend(reporter.ask_aggregator, timeout=2.0)
    for decision, ok in (("denied", False), ("approved", True)):
        task = asyncio.create_task(backend.cordon(_request()))
        await _settle()
        request = _spooled(reporter)[-1]
        assert request["type"] == "cordon_request"
        assert request["action"] == "cordon"
        reporter.spool.remove([m.seq for m in reporter.spool.head()])
        answer = schema.cordon_decision_message(
            "n1",
            "c1",
            request["id"],
            decision=decision,  # type: ignore[arg-type]
            reason="2 of 2 nodes cordoned in c1",
            retry_after_seconds=600.0,
        )
        answer["id"] += decision  # a new decision message each time
        await reporter.handle_command(schema.encode(answer))
        result = await task
        assert result.ok is ok
    assert result.changed
    assert (await backend.state()).owned
    assert "retry" not in result.detail


async def test_aggregator_backend_without_an_answer_fails(tmp_path: Path) -> None:
    reporter = _reporter(tmp_path)
    backend = AggregatorBackend(reporter.ask_aggregator, timeout=0.05)
    result = await backend.cordon(_request())
    assert not result.ok
    assert "no decision" in result.detail
    assert not (await backend.state()).cordoned


@pytest.mark.parametrize("name", ["a/b", "+", "#", "", "x" * 200])
def test_names_that_would_break_topics_are_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError, match="name"):
        Reporter(MqttOutput(), node=name, cluster="c", agent_version="1", state_dir=tmp_path)
