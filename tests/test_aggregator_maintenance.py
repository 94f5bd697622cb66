"""Planned maintenance: a window over a rack (or an NVLink domain, a job, a node) keeps
what its nodes report during a rolling reboot from becoming fleet incidents, rule facts
or cordons, and shows each node's state all the same."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

import aggregator_support as msg
from fleet_support import aggregator, node_client, operator_cli, publish, until
from gpuagent.aggregator.budget import CordonBudget
from gpuagent.aggregator.correlate import Correlator
from gpuagent.aggregator.fleetrules import FleetRules
from gpuagent.aggregator.ingest import Ingest
from gpuagent.aggregator.maintenance import (
    Maintenance,
    MaintenanceError,
    parse_domain,
    parse_duration,
)
from gpuagent.aggregator.records import from_online_state
from gpuagent.aggregator.rulesrun import RulesRunner
from gpuagent.aggregator.state import FleetState
from gpuagent.aggregator.store import FleetStore
from gpuagent.config import CordonBudgetSection, RulesSection
from gpuagent.fleet import schema
from mqtt_broker import Broker

RACKS, TRAYS, GPUS = 16, 18, 4
_ids = itertools.count(1)
LINK_DOWN = (
    "NVRM: Xid (PCI:{pci}): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 14 "
    "(0x004505c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)"
)
DOWNSTREAM = (
    "NVRM: Xid (PCI:{pci}): 145, pid=8123, name=python3, RLW_TAGSTATE Fatal XC0 i0 Link 03 "
    "(0x00000004 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)"
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("rack=r129", ("rack", "r129")),
        (" power=pdu-7a ", ("power", "pdu-7a")),
        ("nvlink=9f3c1a52-1111-4222-8333-444455556666/32766",
         ("nvlink", "9f3c1a52-1111-4222-8333-444455556666/32766")),
        ("job=slurm:4242", ("job", "slurm:4242")),
    ],
)  # fmt: skip
def test_domains_are_name_equals_value(text: str, expected: tuple[str, str]) -> None:
    assert parse_domain(text) == expected


@pytest.mark.parametrize("text", ["r129", "rack=", "=r1", "rack = r1", "rack=r1 r2"])
def test_a_domain_that_is_not_name_equals_value_is_refused(text: str) -> None:
    with pytest.raises(MaintenanceError, match="NAME=VALUE"):
        parse_domain(text)


@pytest.mark.parametrize(
    ("text", "seconds"), [("2h", 7200.0), ("90m", 5400.0), ("1d", 86400.0), ("600", 600.0)]
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["0", "8d", "2 weeks", "-1h", ""])
def test_a_duration_past_a_week_or_unreadable_is_refused(text: str) -> None:
    with pytest.raises(MaintenanceError):
        parse_duration(text)


def tray(rack: int, n: int, *, fabric: str = "completed", health: str = "OK") -> dict[str, Any]:
    node = f"r{rack:02d}-t{n:02d}"
    gpus = []
    for index in range(GPUS):
        gpu = msg.gpu_doc(index, health)
        gpu["uuid"] = f"GPU-{rack}-{n}-{index}"
        domain = f"uuid-{rack}/32766" if fabric == "completed" else None
        gpu["fabric"] = {"state": fabric, "cluster_uuid": f"uuid-{rack}", "clique_id": 32766,
                         "nvlink_domain": domain}  # fmt: skip
        if health == "CRITICAL":
            gpu["findings"] = [msg.finding("nvlink", "CRITICAL", "NVLink links down: 0-17")]
        gpus.append(gpu)
    message = msg.state(node, gpus=gpus, health=health)
    message["status"]["node"]["labels"] = {"rack": f"r{rack:02d}"}
    return message


def test_a_window_covers_by_label_nvlink_domain_job_node_and_cluster() -> None:
    record = from_online_state(tray(3, 5), "", 0.0)
    m = Maintenance()
    by = {"by": "sre", "reason": "test", "now": 100.0}
    covering = [
        m.start("rack=r03", 60, cluster="", **by),
        m.start("nvlink=uuid-3/32766", 60, cluster="c1", **by),
        m.start("node=r03-t05", 60, cluster="", **by),
    ]
    others = [
        m.start("rack=r04", 60, cluster="", **by),
        m.start("rack=r03", 60, cluster="other-cluster", **by),
        m.start("job=slurm:1", 60, cluster="", **by),
    ]
    assert [w.covers(record) for w in covering] == [True, True, True]
    assert [w.covers(record) for w in others] == [False, False, False]
    assert m.covering(record, 130.0) is covering[0]
    assert m.covering(record, 160.0) is None  # over
    assert m.windows == {}  # and forgotten; the table keeps them


class Rig:
    def __init__(self, path: Path) -> None:
        self.clock = msg.FakeClock()
        self.state = FleetState()
        self.store = FleetStore(path, retention_seconds=86400.0, max_events=1_000_000)
        self.correlator = Correlator(join_window_seconds=30.0, settle_seconds=10.0)
        self.rules = FleetRules(RulesSection(), self.store.read_rows, self.clock)
        self.ingest = Ingest(
            self.state,
            self.store,
            CordonBudget(CordonBudgetSection(max_nodes=2, max_percent=100.0)),
            msg.PREFIX,
            stale_after=120,
            clock=self.clock,
            correlator=self.correlator,
            rules=self.rules,
        )
        self.runner = RulesRunner(
            self.rules, self.ingest, self.store, publish=self._publish, prefix=msg.PREFIX,
            clock=self.clock,
        )  # fmt: skip
        self.decisions: list[dict[str, Any]] = []

    async def _publish(self, _out: Any) -> None:
        pass

    def send(self, channel: str, message: dict[str, Any]) -> None:
        message["time"] = self.clock.now
        for out in self.ingest.handle(msg.topic(message["node"], channel), schema.encode(message)):
            if out.payload and out.record is not None:
                self.decisions.append(json.loads(out.payload))

    def xid(self, node: str, index: int, line: str, code: int) -> None:
        bus = msg.gpu_doc(index)["pci_bus_id"]
        message = msg.event(node)
        message["data"] = {"id": f"kmsg:{next(_ids)}", "kind": "xid", "code": code,
                           "gpu": bus, "time": self.clock.now,
                           "line": line.format(pci=bus[:-2])}  # fmt: skip
        self.send("events", message)

    async def settle(self) -> None:
        """Held cordon requests decided, closed incidents out, facts judged, rows written."""
        self.clock.now += 60.0
        for out in self.ingest.release_held(self.clock.now):
            if out.payload:
                self.decisions.append(json.loads(out.payload))
        self.correlator.tick(self.clock.now)
        await self.store.flush()
        await self.runner.tick()
        await self.store.flush()

    async def reboot(self, rack: int) -> None:
        """The rack's trays reboot one after another: each goes away, comes back with its
        links training; its neighbours log the links it took down, and ask to cordon."""
        for n in range(TRAYS):
            node = f"r{rack:02d}-t{n:02d}"
            self.send("state", msg.offline(node, reason="shutdown"))
            self.clock.now += 5.0
            for peer in (f"r{rack:02d}-t{p:02d}" for p in range(TRAYS) if p != n):
                self.xid(peer, n % GPUS, LINK_DOWN if peer.endswith("t00") else DOWNSTREAM,
                         149 if peer.endswith("t00") else 145)  # fmt: skip
            self.send("state", tray(rack, n, fabric="in_progress", health="CRITICAL"))
            self.send("actions", msg.cordon_request(node))
            self.clock.now += 5.0
            self.send("state", tray(rack, n))
        await self.settle()


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    r = Rig(tmp_path / "fleet.sqlite")
    await r.store.open()
    for rack in range(RACKS):
        for n in range(TRAYS):
            r.send("state", tray(rack, n))
    yield r
    await r.store.close()


async def test_a_rolling_reboot_of_288_nodes_in_maintenance_gives_no_incident(rig: Rig) -> None:
    for rack in range(RACKS):
        window = rig.state.maintenance.start(
            f"rack=r{rack:02d}", 1800.0, cluster="", by="sre", reason="driver upgrade",
            now=rig.clock.now,
        )  # fmt: skip
        await rig.reboot(rack)
        rig.state.maintenance.end(window.id, by="sre", now=rig.clock.now)
    assert rig.correlator.opened == 0
    assert await rig.store.rule_findings(since=0.0) == []
    assert {d["decision"] for d in rig.decisions} == {"denied"}
    assert len(rig.decisions) == RACKS * TRAYS
    assert all(d["reason"].startswith("muted: planned maintenance mw-") for d in rig.decisions)
    assert rig.state.counters.muted_records == RACKS * TRAYS * (TRAYS - 1)
    # Each node's state was shown all along: the last report of every tray is stored.
    assert len(rig.state.nodes) == RACKS * TRAYS
    assert {r.health for r in rig.state.nodes.values()} == {"OK"}


async def test_the_same_reboot_without_a_window_is_incidents_and_cordons(rig: Rig) -> None:
    """The drill above can fail: unmuted, one rack's reboot is fleet incidents, cordon
    requests the budget decides."""
    await rig.reboot(0)
    assert rig.correlator.opened > 0
    assert "approved" in {d["decision"] for d in rig.decisions}
    assert not any(d["reason"].startswith("muted") for d in rig.decisions)


@pytest.mark.integration
async def test_maintenance_from_the_command_line_mutes_a_rack_on_the_real_aggregator(
    tmp_path: Path, mqtt_broker: Broker, fleet_database: str
) -> None:
    async with (
        aggregator(tmp_path, mqtt_broker, database=fleet_database) as agg,
        node_client(mqtt_broker, "r03-t05") as node,
    ):
        await publish(node, "state", tray(3, 5))
        await until(lambda: ("c1", "r03-t05") in agg.state.nodes, timeout=10.0)

        def cli(*argv: str) -> tuple[int, str]:
            return operator_cli(agg, tmp_path, "maintenance", *argv)

        code, out = await asyncio.to_thread(
            cli, "start", "--domain", "rack=r03", "--for", "2h", "--reason", "BIOS"
        )
        assert code == 0
        window_id = out.split()[0]
        assert window_id.startswith("mw-")
        assert "rack=r03" in out
        assert "BIOS" in out
        async with aiohttp.ClientSession() as session:
            base = f"http://{agg.config.listen}"
            async with session.get(f"{base}/api/v1/nodes/r03-t05") as response:
                assert (await response.json())["maintenance"]["id"] == window_id
            async with session.get(f"{base}/metrics") as response:
                assert 'gpuagent_fleet_nodes_in_maintenance{cluster="c1"} 1.0' in (
                    await response.text()
                )
            # The node asks to cordon (its links are down after the reboot): denied.
            await publish(node, "actions", msg.cordon_request("r03-t05"))

            async def denied() -> bool:
                async with session.get(f"{base}/api/v1/cordons") as response:
                    rows = (await response.json())["cordons"]
                return any(r["reason"].startswith("muted: planned maintenance") for r in rows)

            await until(denied, timeout=10.0)
            code, out = await asyncio.to_thread(cli, "list")
            assert window_id in out
            code, out = await asyncio.to_thread(cli, "end", window_id)
            assert code == 0
            assert "ended early by" in out
            async with session.get(f"{base}/api/v1/nodes/r03-t05") as response:
                assert (await response.json())["maintenance"] is None

            async def none_running() -> bool:
                _, out = await asyncio.to_thread(cli, "list")
                return out == "no maintenance window running\n"

            await until(none_running, timeout=10.0)  # once the early end is written
