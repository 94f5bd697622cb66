"""The cordon arbiter follows causality: requests of a shared NVLink domain wait for its
records to settle, then the root's node is approved and consequence-only nodes denied,
both audited; nodes outside any shared domain are decided at once, as ever."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import aggregator_support as msg
from fleet_support import aggregator, node_client, publish, until
from gpuagent.aggregator.budget import CordonBudget
from gpuagent.aggregator.correlate import Correlator
from gpuagent.aggregator.ingest import Ingest
from gpuagent.aggregator.state import FleetState
from gpuagent.aggregator.store import FleetStore
from gpuagent.config import CordonBudgetSection
from gpuagent.fleet import schema
from mqtt_broker import Broker

DOMAIN_UUID = "9f3c1a52-1111-4222-8333-444455556666"
LINK_DOWN = (
    "NVRM: Xid (PCI:{pci}): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 14 "
    "(0x004505c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)"
)
DOWNSTREAM = (
    "NVRM: Xid (PCI:{pci}): 145, pid=8123, name=python3, RLW_TAGSTATE Fatal XC0 i0 Link 03 "
    "(0x00000004 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)"
)


class Rig:
    def __init__(self, tmp_path: Path, *, max_nodes: int = 4) -> None:
        self.clock = msg.FakeClock(1_000_000.0)
        self.state = FleetState()
        self.store = FleetStore(tmp_path / "fleet.sqlite", retention_seconds=3600, max_events=1000)
        self.budget = CordonBudget(CordonBudgetSection(max_nodes, 100.0, 600.0))
        self.correlator = Correlator(
            join_window_seconds=30.0, settle_seconds=10.0, domain_labels=["rack"]
        )
        self.ingest = Ingest(
            self.state,
            self.store,
            self.budget,
            msg.PREFIX,
            stale_after=120,
            clock=self.clock,
            correlator=self.correlator,
        )

    def send(self, channel: str, message: dict[str, Any]) -> list[Any]:
        return self.ingest.handle(msg.topic(message["node"], channel), schema.encode(message))

    def report(self, node: str, *, domain: str | None, rack: str = "") -> None:
        gpus = []
        for index in range(4):
            gpu = msg.gpu_doc(index)
            if domain is not None:
                uuid, clique = domain.split("/")
                gpu["fabric"] = {
                    "state": "completed",
                    "cluster_uuid": uuid,
                    "clique_id": int(clique),
                    "nvlink_domain": domain,
                }
            gpus.append(gpu)
        message = msg.state(node, gpus=gpus, when=self.clock.now)
        if rack:
            message["status"]["node"]["labels"] = {"rack": rack}
        self.send("state", message)

    def xid(self, node: str, index: int, code: int, line: str) -> None:
        bus = msg.gpu_doc(index)["pci_bus_id"]
        message = msg.event(node, when=self.clock.now)
        message["data"] = {
            "id": f"{node}:{bus}:{code}",
            "kind": "xid",
            "code": code,
            "gpu": bus,
            "time": self.clock.now,
            "line": line.format(pci=bus[:-2]),
        }
        self.send("events", message)


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    r = Rig(tmp_path)
    await r.store.open()
    yield r
    await r.store.close()


def decision(outgoing: list[Any]) -> dict[str, Any]:
    (out,) = outgoing
    return dict(json.loads(out.payload))


async def test_the_root_node_is_approved_and_consequence_nodes_denied_after_the_settle(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    domain = f"{DOMAIN_UUID}/32766"
    nodes = [f"gb-{n:02d}" for n in range(4)]
    for node in nodes:
        rig.report(node, domain=domain)
    # The root's node asks first, before any record has arrived: it waits all the same.
    assert rig.send("actions", msg.cordon_request(nodes[0])) == []
    rig.xid(nodes[0], 2, 149, LINK_DOWN)
    for node in nodes[1:]:
        rig.clock.now += 0.5
        for index in range(4):
            rig.xid(node, index, 145, DOWNSTREAM)
        assert rig.send("actions", msg.cordon_request(node)) == []
    assert rig.state.counters.cordons_held == 4
    assert rig.ingest.release_held(rig.clock.now) == []  # not settled yet
    rig.clock.now += 10.0
    with caplog.at_level(logging.INFO, logger="gpuagent.aggregator.audit"):
        answers = rig.ingest.release_held(rig.clock.now)
    by_node = {schema.decode(a.payload)["node"]: json.loads(a.payload) for a in answers}
    assert by_node[nodes[0]]["decision"] == "approved"
    assert "root of fleet incident fi-" in by_node[nodes[0]]["reason"]
    for node in nodes[1:]:
        assert by_node[node]["decision"] == "denied"
        assert by_node[node]["reason"].startswith("consequence of Xid 149, link 14 on gb-00 GPU 2")
    audited = [r.getMessage() for r in caplog.records if "cordon decision" in r.getMessage()]
    assert len(audited) == 4
    assert rig.ingest.held == []
    # The incident records both decisions, and is stored for the API.
    for incident in rig.correlator.tick(rig.clock.now):
        rig.store.queue_incident(incident.json())
    await rig.store.flush()
    (stored,) = await rig.store.incidents(since=0.0, limit=10)
    assert stored["root"]["node"] == nodes[0]
    assert stored["approved"] == [nodes[0]]
    assert sorted(stored["denied"]) == nodes[1:]
    assert await rig.store.incident(stored["id"]) == stored
    rows = await rig.store.cordons()
    assert sorted(r.decision for r in rows) == ["approved"] + ["denied"] * 3


async def test_a_node_outside_any_shared_domain_is_decided_at_once(rig: Rig) -> None:
    rig.report("h1", domain=None)
    rig.xid("h1", 0, 79, "NVRM: Xid (PCI:{pci}): 79, GPU has fallen off the bus.")
    assert decision(rig.send("actions", msg.cordon_request("h1")))["decision"] == "approved"
    assert rig.state.counters.cordons_held == 0


async def test_a_node_alone_in_its_domain_is_decided_at_once(rig: Rig) -> None:
    rig.report("gb-00", domain=f"{DOMAIN_UUID}/7")
    rig.report("gb-01", domain=f"{DOMAIN_UUID}/8")
    assert decision(rig.send("actions", msg.cordon_request("gb-00")))["decision"] == "approved"


async def test_an_uncordon_is_never_held(rig: Rig) -> None:
    for node in ("gb-00", "gb-01"):
        rig.report(node, domain=f"{DOMAIN_UUID}/1")
    assert decision(rig.send("actions", msg.cordon_request("gb-00", "uncordon")))["decision"] == (
        "approved"
    )


async def test_with_correlation_off_requests_are_decided_by_the_budget_alone(
    tmp_path: Path,
) -> None:
    rig = Rig(tmp_path)
    rig.ingest.correlator = None
    await rig.store.open()
    try:
        for node in ("gb-00", "gb-01"):
            rig.report(node, domain=f"{DOMAIN_UUID}/1")
        rig.xid("gb-00", 0, 149, LINK_DOWN)
        rig.xid("gb-01", 0, 145, DOWNSTREAM)
        for node in ("gb-00", "gb-01"):
            assert decision(rig.send("actions", msg.cordon_request(node)))["decision"] == "approved"
    finally:
        await rig.store.close()


async def test_a_domain_level_incident_is_capped_by_the_budget(tmp_path: Path) -> None:
    rig = Rig(tmp_path, max_nodes=2)
    await rig.store.open()
    try:
        nodes = [f"gb-{n:02d}" for n in range(6)]
        for node in nodes:
            rig.report(node, domain=f"{DOMAIN_UUID}/3")
        for node in nodes:
            for index in range(4):
                rig.xid(node, index, 149, LINK_DOWN)
            rig.send("actions", msg.cordon_request(node))
        rig.clock.now += 11.0
        answers = [json.loads(a.payload) for a in rig.ingest.release_held(rig.clock.now)]
        assert sorted(a["decision"] for a in answers) == ["approved"] * 2 + ["denied"] * 4
        assert all("root unknown (domain-level)" in a["reason"] for a in answers)
    finally:
        await rig.store.close()


async def test_the_spent_budget_lets_recoveries_through_and_drops_old_requests(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    r = Rig(tmp_path, max_nodes=1)
    await r.store.open()
    try:
        for node in ("n1", "n2", "n3"):
            r.report(node, domain=None)
        assert decision(r.send("actions", msg.cordon_request("n1")))["decision"] == "approved"
        assert decision(r.send("actions", msg.cordon_request("n2")))["decision"] == "denied"
        # Spent: a node that recovered is uncordoned all the same, and frees its slot.
        uncordon = decision(r.send("actions", msg.cordon_request("n1", action="uncordon")))
        assert uncordon["decision"] == "approved"
        # A request that waited in the broker for 11 minutes is dropped, not decided: it
        # takes no slot, so a current one after it still gets the freed slot.
        old = msg.cordon_request("n3")
        old["time"] = r.clock.now - 660.0
        with caplog.at_level(logging.INFO, logger="gpuagent.aggregator.audit"):
            dropped = decision(r.send("actions", old))
        assert dropped["decision"] == "denied"
        assert dropped["reason"].startswith("dropped: the request is 660 s old")
        assert "decision=denied reason=dropped" in caplog.text
        assert r.state.counters.cordons_too_old == 1
        assert decision(r.send("actions", msg.cordon_request("n2")))["decision"] == "approved"
    finally:
        await r.store.close()


FALLEN_OFF = "NVRM: Xid (PCI:{pci}): 79, pid=1, name=python3, GPU has fallen off the bus."


async def test_ten_of_eighteen_nodes_of_a_rack_failing_together_are_one_incident_one_cordon(
    tmp_path: Path,
) -> None:
    r = Rig(tmp_path, max_nodes=10)  # the budget would allow ten: the domain allows one
    await r.store.open()
    try:
        nodes = [f"h-{n:02d}" for n in range(18)]
        for node in nodes:
            r.report(node, domain=None, rack="r7")
        r.report("elsewhere", domain=None, rack="r8")
        answers = []
        for node in nodes[:10]:  # one every 30 s: ten within 5 minutes
            r.xid(node, 1, 79, FALLEN_OFF)
            answers += r.send("actions", msg.cordon_request(node))
            r.clock.now += 30.0
            answers += r.ingest.release_held(r.clock.now)
        r.clock.now += 15.0
        answers += r.ingest.release_held(r.clock.now)
        by_node = {schema.decode(a.payload)["node"]: json.loads(a.payload) for a in answers}
        assert sorted(by_node) == nodes[:10]
        approved = [n for n, d in by_node.items() if d["decision"] == "approved"]
        assert approved == ["h-00"]
        # Before half the rack had failed, a second node waited; after, the domain's.
        assert "h-00 of rack=r7 was cordoned" in by_node["h-01"]["reason"]
        assert "domain failing together: 10 of 18 nodes of rack=r7" in by_node["h-09"]["reason"]
        assert "only h-00 is cordoned for it" in by_node["h-09"]["reason"]
        docs = [i.json() for i in r.correlator.tick(r.clock.now)]
        (domain,) = [d for d in docs if d["common_cause"]]
        assert domain["common_cause"]["domain"] == "rack=r7"
        assert domain["common_cause"]["nodes_faulted"] == nodes[:10]
        assert domain["root"] is None
        assert sorted(domain["nodes"]) == nodes[:10]
        merged = [d for d in docs if d["merged_into"] == domain["id"]]
        assert {d["state"] for d in merged} == {"closed"}
        # Another rack's node is a fault of its own, decided by the budget as ever.
        r.xid("elsewhere", 0, 79, FALLEN_OFF)
        (answer,) = r.send("actions", msg.cordon_request("elsewhere"))
        assert json.loads(answer.payload)["decision"] == "approved"
    finally:
        await r.store.close()


# --- the same over the real broker and aggregator, SQLite and PostgreSQL --------------------


@pytest.mark.integration
async def test_a_rack_failing_together_over_the_broker_is_one_incident_one_cordon(
    tmp_path: Path, mqtt_broker: Broker, fleet_database: str
) -> None:
    """10 of 18 nodes of rack r7, each losing a GPU and asking to cordon, 30 s apart on the
    aggregator's clock: one fleet incident for the rack, one cordon approved, the budget
    (10) notwithstanding."""
    clock = msg.FakeClock()
    nodes = [f"h-{n:02d}" for n in range(18)]
    budget = CordonBudgetSection(max_nodes=10, max_percent=100.0, window_seconds=3600.0)
    async with contextlib.AsyncExitStack() as stack:
        agg = await stack.enter_async_context(
            aggregator(
                tmp_path,
                mqtt_broker,
                clock=clock,
                database=fleet_database,
                cordon_budget=budget,
            )
        )
        clients = {
            node: await stack.enter_async_context(node_client(mqtt_broker, node)) for node in nodes
        }
        for node in nodes:
            message = msg.state(node, gpus=[msg.gpu_doc(i) for i in range(4)], when=clock.now)
            message["status"]["node"]["labels"] = {"rack": "r7"}
            await publish(clients[node], "state", message)
        await until(lambda: len(agg.state.nodes) == 18, timeout=15.0)
        for node in nodes[:10]:
            bus = msg.gpu_doc(1)["pci_bus_id"]
            event = msg.event(node, when=clock.now)
            line = FALLEN_OFF.format(pci=bus[:-2])
            event["data"] = {"id": f"kmsg:{node}:79", "kind": "xid", "code": 79, "gpu": bus,
                             "time": clock.now, "line": line}  # fmt: skip
            await publish(clients[node], "events", event)
            await publish(clients[node], "actions", msg.cordon_request(node))
            await asyncio.sleep(0.3)  # each node's messages in before the next's
            clock.now += 30.0
        clock.now += 15.0  # past the settle of the last held request

        async def decided() -> bool:
            return len({r.node for r in await agg.store.cordons()}) == 10

        await until(decided, timeout=20.0)
        rows = await agg.store.cordons()
        approved = sorted(r.node for r in rows if r.decision == "approved")
        assert approved == ["h-00"]
        incidents = await agg.store.incidents(since=0.0, limit=100)
        domain = [i for i in incidents if i.get("common_cause")]
        assert len(domain) == 1
        assert domain[0]["common_cause"]["domain"] == "rack=r7"
        assert domain[0]["common_cause"]["cordon_node"] == "h-00"
