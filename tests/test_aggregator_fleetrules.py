"""Fleet rules over each GPU's and node's history: a repeat offender, remediation that does
not work (stopped, paged, cleared by a person), a die defect; never fed their own output.

The rules read the store; these run on SQLite through `Ingest` with an injected clock, and
the drill at the end on the real aggregator and broker, with SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

import aggregator_support as msg
from fleet_support import aggregator, node_client, operator_cli, publish, until
from gpuagent.aggregator.budget import CordonBudget
from gpuagent.aggregator.facts import state_facts
from gpuagent.aggregator.fleetrules import FleetRules
from gpuagent.aggregator.ingest import Ingest, Outgoing
from gpuagent.aggregator.records import from_online_state
from gpuagent.aggregator.rulesrun import RulesRunner
from gpuagent.aggregator.state import FleetState
from gpuagent.aggregator.store import FleetStore
from gpuagent.config import CordonBudgetSection, RulesSection
from gpuagent.fleet import schema
from gpuagent.remediation.audit import AuditRecord
from mqtt_broker import Broker

DAY = 86400.0
_ids = itertools.count(1)
XID13 = (
    "NVRM: Xid (PCI:{pci}): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception "
    "on (GPC {gpc}, TPC {tpc}, SM 0): Illegal Instruction Parameter"
)


def gpus(health: dict[int, str] | None = None, uuids: tuple[str, ...] = ()) -> list[Any]:
    docs = []
    for index in range(2):
        state = (health or {}).get(index, "OK")
        findings = [msg.finding("xid", "CRITICAL", "Xid 79: fallen off the bus")]
        doc = msg.gpu_doc(index, state, findings if state == "CRITICAL" else [])
        if uuids:
            doc["uuid"] = uuids[index]
        docs.append(doc)
    return docs


def report(
    node: str, when: float, health: dict[int, str] | None = None, **kwargs: Any
) -> dict[str, Any]:
    message = msg.state(node, gpus=gpus(health, **kwargs), when=when)
    message["status"]["remediation"] = {"mode": "enforce", "cordoned_by_us": False}
    return message


def attempt(node: str, when: float, kind: str = "reset_gpu", mode: str = "enforce") -> Any:
    record = AuditRecord(
        next(_ids), when, kind, "0000:18:00.0", "succeeded", mode, "Xid 79", "xid",  # type: ignore[arg-type]
        "CRITICAL", {}, "",
    )  # fmt: skip
    return schema.action_message(node, "c1", record)


def xid13(node: str, when: float, gpc: int, tpc: int) -> dict[str, Any]:
    message = msg.event(node, when=when)
    bus = msg.gpu_doc(0)["pci_bus_id"]
    message["data"] = {
        "id": f"kmsg:{next(_ids)}",
        "kind": "xid",
        "code": 13,
        "gpu": bus,
        "time": when,
        "line": XID13.format(pci=bus[:-2], gpc=gpc, tpc=tpc),
        "gpc": gpc,
        "tpc": tpc,
        "sm": 0,
    }
    return message


class Rig:
    def __init__(self, path: Path, config: RulesSection | None = None) -> None:
        self.clock = msg.FakeClock(1_000_000_000.0)
        self.state = FleetState()
        self.store = FleetStore(path, retention_seconds=30 * DAY, max_events=100_000)
        self.rules = FleetRules(config or RulesSection(), self.store.read_rows, self.clock)
        self.ingest = Ingest(
            self.state,
            self.store,
            CordonBudget(CordonBudgetSection()),
            msg.PREFIX,
            stale_after=120,
            clock=self.clock,
            rules=self.rules,
        )
        self.sent: list[dict[str, Any]] = []
        self.runner = RulesRunner(
            self.rules, self.ingest, self.store, publish=self._publish, prefix=msg.PREFIX,
            clock=self.clock,
        )  # fmt: skip

    async def _publish(self, out: Outgoing) -> None:
        self.sent.append(json.loads(out.payload))

    async def send(self, channel: str, message: dict[str, Any]) -> None:
        """As the consumer hands a message over; then its rows committed, its facts judged."""
        self.clock.now = max(self.clock.now, float(message["time"]))
        self.ingest.handle(msg.topic(message["node"], channel), schema.encode(message))
        await self.store.flush()
        await self.runner.tick()
        await self.store.flush()

    async def findings(self, rule: str | None = None) -> list[dict[str, Any]]:
        found = await self.store.rule_findings(since=0.0)
        return [f for f in found if rule is None or f["rule"] == rule]


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    r = Rig(tmp_path / "fleet.sqlite")
    await r.store.open()
    yield r
    await r.store.close()


def test_facts_are_a_gpu_turning_critical_and_recovering_by_uuid() -> None:
    def record(health: dict[int, str]) -> Any:
        return from_online_state(report("n1", 10.0, health), "", 10.0)

    ok, bad = record({}), record({1: "CRITICAL"})
    assert state_facts(None, ok) == []
    (critical,) = state_facts(ok, bad)
    assert (critical.kind, critical.gpu, critical.detail["reason"]) == (
        "critical", "GPU-1", "Xid 79: fallen off the bus",
    )  # fmt: skip
    assert state_facts(bad, bad) == []  # still CRITICAL: nothing new
    (recovered,) = state_facts(bad, ok)
    assert (recovered.kind, recovered.gpu) == ("recovered", "GPU-1")


async def test_a_gpu_failing_again_within_a_week_of_recovering_is_one_repeat_offender(
    rig: Rig,
) -> None:
    t = rig.clock.now
    await rig.send("state", report("n1", t))
    await rig.send("state", report("n1", t + 60, {1: "CRITICAL"}))
    await rig.send("state", report("n1", t + 3600, {}))  # repaired
    assert await rig.findings() == []  # the first failure is no pattern
    await rig.send("state", report("n1", t + 3 * DAY, {1: "CRITICAL"}))
    (found,) = await rig.findings()
    assert (found["rule"], found["gpu"], found["state"]) == ("repeat_offender", "GPU-1", "open")
    assert "CRITICAL again 71.0 h after it recovered" in found["summary"]
    assert found["recommendation"].startswith("replace the GPU")
    assert found["evidence"]["previous"]["time"] == t + 60
    # Failing a third time is the same repeat offender, not another.
    await rig.send("state", report("n1", t + 3 * DAY + 60, {}))
    await rig.send("state", report("n1", t + 4 * DAY, {1: "CRITICAL"}))
    assert len(await rig.findings()) == 1


async def test_the_history_follows_the_gpu_to_another_node_and_ends_after_the_window(
    rig: Rig,
) -> None:
    t = rig.clock.now
    moved = ("GPU-a", "GPU-moved")
    await rig.send("state", report("n1", t, uuids=moved))
    await rig.send("state", report("n1", t + 60, {1: "CRITICAL"}, uuids=moved))
    await rig.send("state", report("n1", t + 120, uuids=moved))
    # The GPU goes into another node, and fails there: the same GPU again.
    await rig.send("state", report("n2", t + 2 * DAY, uuids=("GPU-b", "GPU-moved")))
    await rig.send("state", report("n2", t + 2 * DAY + 60, {1: "CRITICAL"},
                                   uuids=("GPU-b", "GPU-moved")))  # fmt: skip
    (found,) = await rig.findings("repeat_offender")
    assert (found["node"], found["evidence"]["recovered"]["node"]) == ("n2", "n1")
    # Another GPU recovering and failing 8 days apart: outside the window, nothing.
    await rig.send("state", report("n3", t, {0: "CRITICAL"}))
    await rig.send("state", report("n3", t + 60))
    await rig.send("state", report("n3", t + 8 * DAY, {0: "CRITICAL"}))
    assert [f["node"] for f in await rig.findings()] == ["n2"]


async def test_a_node_failing_again_by_its_own_findings_is_a_repeat_offender(rig: Rig) -> None:
    t = rig.clock.now

    def node_report(when: float, critical: bool) -> dict[str, Any]:
        message = report("n1", when)
        if critical:
            message["status"]["node"]["health"] = "CRITICAL"
            message["status"]["node"]["findings"] = [
                msg.finding("fabric", "CRITICAL", "NVSwitch 2 fatal error (SXid 24007)")
            ]
        return message

    await rig.send("state", node_report(t, critical=False))
    await rig.send("state", node_report(t + 60, critical=True))
    await rig.send("state", node_report(t + 3600, critical=False))
    # A GPU of the node failing is the GPU's history, not the node's.
    await rig.send("state", report("n1", t + 7200, {0: "CRITICAL"}))
    await rig.send("state", report("n1", t + 7300))
    assert await rig.findings() == []
    await rig.send("state", node_report(t + 2 * DAY, critical=True))
    (found,) = await rig.findings()
    assert (found["rule"], found["node"], found["gpu"]) == ("repeat_offender", "n1", "")
    assert "n1 is CRITICAL again" in found["summary"]
    assert "(the node, not one GPU): NVSwitch 2 fatal error" in found["summary"]
    assert found["recommendation"].startswith("repair the node")


async def test_three_attempts_in_a_week_stop_remediation_until_a_person_clears_it(
    rig: Rig,
) -> None:
    t = rig.clock.now
    await rig.send("state", report("n1", t))
    for n in range(2):
        await rig.send("actions", attempt("n1", t + n * DAY))
    await rig.send("actions", attempt("n1", t + 2.5 * DAY, mode="observe"))  # planned only
    await rig.send("actions", attempt("n1", t + 2.5 * DAY, kind="report"))
    assert await rig.findings() == []
    await rig.send("actions", attempt("n1", t + 3 * DAY, kind="cordon"))
    (found,) = await rig.findings()
    assert found["rule"] == "remediation_not_working"
    assert "3 automatic remediation attempts (cordon, reset_gpu)" in found["summary"]
    # The node is told to stop: observe mode, an allowlisted command, stored.
    (stop,) = rig.sent
    assert (stop["command"], stop["args"], stop["node"]) == (
        "set_remediation_mode", {"mode": "observe"}, "n1",
    )  # fmt: skip
    assert found["done"] == {"mode_before": "enforce", "mode_set": "observe",
                             "command": stop["id"]}  # fmt: skip
    assert await rig.store.count("commands") == 1
    # More attempts while stopped raise nothing more (one page).
    await rig.send("actions", attempt("n1", t + 3 * DAY + 60))
    assert len(await rig.findings()) == 1
    # A person clears it; the node reports observe mode (ours): back to enforce.
    status = report("n1", t + 4 * DAY)
    status["status"]["remediation"]["mode"] = "observe"
    await rig.send("state", status)
    cleared = await rig.runner.clear(found["id"], by="sre", reason="GPU replaced")
    await rig.store.flush()
    assert cleared["state"] == "cleared"
    assert cleared["cleared"]["reason"] == "GPU replaced"
    assert [s["args"] for s in rig.sent] == [{"mode": "observe"}, {"mode": "enforce"}]
    (stored,) = await rig.findings()
    assert stored["state"] == "cleared"
    with pytest.raises(KeyError):
        await rig.runner.clear(found["id"], by="sre", reason="again")
    # Attempts before the clear do not count again; three after it do.
    await rig.send("actions", attempt("n1", t + 4 * DAY + 60))
    await rig.send("actions", attempt("n1", t + 4 * DAY + 120))
    assert len(await rig.findings()) == 1
    await rig.send("actions", attempt("n1", t + 4 * DAY + 180))
    assert [f["state"] for f in await rig.findings()] == ["open", "cleared"]


async def test_a_node_a_person_set_to_observe_is_not_put_back_to_enforce(rig: Rig) -> None:
    t = rig.clock.now
    status = report("n1", t)
    status["status"]["remediation"]["mode"] = "observe"
    await rig.send("state", status)
    for n in range(3):
        await rig.send("actions", attempt("n1", t + n))
    (found,) = await rig.findings()
    assert found["done"] == {"mode_before": "observe"}  # nothing to stop, nothing sent
    await rig.runner.clear(found["id"], by="sre", reason="checked")
    assert rig.sent == []


async def test_two_xid13_on_one_gpc_and_tpc_in_a_day_suspect_the_die(rig: Rig) -> None:
    t = rig.clock.now
    await rig.send("state", report("n1", t))
    # An application's bad kernel: ten Xid 13 on ten GPCs. Never a die defect by count.
    for gpc in range(10):
        await rig.send("events", xid13("n1", t + gpc, gpc, 1))
    assert await rig.findings() == []
    await rig.send("events", xid13("n1", t + 3600, 4, 2))
    await rig.send("events", xid13("n1", t + 2 * DAY, 4, 2))  # a day later: too far apart
    assert await rig.findings() == []
    await rig.send("events", xid13("n1", t + 2 * DAY + 600, 4, 2))
    (found,) = await rig.findings()
    assert (found["rule"], found["gpu"]) == ("die_defect", "GPU-0")
    assert "2 Xid 13 on GPC 4, TPC 2" in found["summary"]
    assert [x["gpc"] for x in found["evidence"]["xid13"]] == [4, 4]


async def test_once_the_sources_stop_no_derived_finding_follows(rig: Rig) -> None:
    t = rig.clock.now
    await rig.send("state", report("n1", t))
    await rig.send("state", report("n1", t + 60, {1: "CRITICAL"}))
    await rig.send("state", report("n1", t + 120))
    await rig.send("state", report("n1", t + 180, {1: "CRITICAL"}))
    for n in range(3):
        await rig.send("actions", attempt("n1", t + 200 + n))
    before = await rig.findings()
    assert sorted(f["rule"] for f in before) == ["remediation_not_working", "repeat_offender"]
    for _ in range(20):
        rig.clock.now += DAY
        await rig.runner.tick()
        await rig.store.flush()
    assert await rig.findings() == before
    assert await rig.store.count("commands") == 1


async def test_open_findings_and_clears_survive_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "fleet.sqlite"
    first = Rig(path)
    await first.store.open()
    t = first.clock.now
    await first.send("state", report("n1", t))
    for n in range(3):
        await first.send("actions", attempt("n1", t + n))
    (found,) = await first.findings()
    await first.store.close()
    second = Rig(path)
    second.clock.now = t + 10
    await second.store.open()
    try:
        await second.runner.restore()
        assert list(second.rules.open) == [found["id"]]
        await second.runner.clear(found["id"], by="sre", reason="fixed")
        await second.store.flush()
    finally:
        await second.store.close()
    third = Rig(path)
    third.clock.now = t + 20
    await third.store.open()
    try:
        await third.runner.restore()
        assert third.rules.open == {}
        # The attempts before the clear still do not count after the restart.
        await third.send("actions", attempt("n1", t + 30))
        assert len(await third.findings()) == 1
    finally:
        await third.store.close()


# --- the drill: the real aggregator and broker, SQLite and PostgreSQL ----------------------


@pytest.mark.integration
async def test_the_rules_drill_on_the_real_aggregator(
    tmp_path: Path, mqtt_broker: Broker, fleet_database: str
) -> None:
    """A GPU that fails, recovers and fails again; three resets on another node; two Xid
    13s on one GPC and TPC: three findings in the API and the metrics, the node told to
    stop, a person's clear through the API; and nothing more once the sources stop."""
    clock = msg.FakeClock(time.time() - 9 * DAY)
    t = clock.now
    async with (
        aggregator(tmp_path, mqtt_broker, clock=clock, database=fleet_database) as agg,
        node_client(mqtt_broker, "n1") as n1,
        node_client(mqtt_broker, "n2") as n2,
    ):
        base = f"http://{agg.config.listen}"

        async def send(client: Any, channel: str, message: dict[str, Any]) -> None:
            clock.now = max(clock.now, float(message["time"]))
            await publish(client, channel, message)

        await send(n1, "state", report("n1", t))
        await send(n2, "state", report("n2", t))
        await send(n1, "state", report("n1", t + 60, {1: "CRITICAL"}))
        await send(n1, "state", report("n1", t + 120))
        await send(n1, "state", report("n1", t + 2 * DAY, {1: "CRITICAL"}))
        for n in range(3):
            await send(n2, "actions", attempt("n2", t + 2 * DAY + n * 3600))
        await send(n2, "events", xid13("n2", t + 3 * DAY, 3, 5))
        await send(n2, "events", xid13("n2", t + 3 * DAY + 60, 3, 5))

        async with aiohttp.ClientSession() as session:

            async def findings() -> list[dict[str, Any]]:
                async with session.get(f"{base}/api/v1/rules") as response:
                    body = await response.json()
                return list(body["findings"])

            async def three() -> bool:
                return len(await findings()) == 3

            await until(three, timeout=15.0)
            by_rule = {f["rule"]: f for f in await findings()}
            assert by_rule["repeat_offender"]["node"] == "n1"
            assert by_rule["remediation_not_working"]["node"] == "n2"
            assert by_rule["die_defect"]["gpu"] == "GPU-0"
            stop = by_rule["remediation_not_working"]
            assert stop["done"]["mode_set"] == "observe"
            async with session.get(f"{base}/metrics") as response:
                metrics = await response.text()
            assert (
                f'gpuagent_fleet_remediation_stopped{{cluster="c1",finding="{stop["id"]}",'
                'node="n2"} 1.0' in metrics
            )
            assert 'gpuagent_fleet_rule_findings{cluster="c1",rule="die_defect"} 1.0' in metrics
            # Clearing needs the token.
            url = f"{base}/api/v1/rules/{stop['id']}/clear"
            async with session.post(url, json={"reason": "replaced"}) as response:
                assert response.status == 401
            headers = {"Authorization": f"Bearer {msg.COMMAND_TOKEN}"}
            async with session.post(url, json={}, headers=headers) as response:
                assert response.status == 400  # a reason is required
            # The operator's commands, against this aggregator's configuration.
            listed = await asyncio.to_thread(operator_cli, agg, tmp_path, "rules", "list")
            assert listed[0] == 0
            assert stop["id"] in listed[1]
            assert "remediation is not fixing it" in listed[1]
            cleared = await asyncio.to_thread(
                operator_cli, agg, tmp_path, "rules", "clear", stop["id"], "--reason", "replaced"
            )
            assert cleared == (0, f"cleared {stop['id']}: {stop['summary']}\n")
            async with session.post(url, json={"reason": "again"}, headers=headers) as response:
                assert response.status == 404  # no longer open

            async def two_open() -> bool:
                return len(await findings()) == 2

            await until(two_open, timeout=10.0)
            # The sources stop: days pass, nothing more is raised.
            clock.now += 5 * DAY
            assert agg.rules_runner is not None
            await agg.rules_runner.tick()
            async with session.get(f"{base}/api/v1/rules?since=0") as response:
                every = (await response.json())["findings"]
            assert sorted(f["state"] for f in every) == ["cleared", "open", "open"]
