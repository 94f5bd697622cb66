"""scripts/run-fleet --rack gb200: a GB200 NVL72 rack (18 trays of 4 GPUs in one NVLink
domain, a Slurm job on 16 of them) reporting to the real aggregator through the real
broker, and its drills, as an operator would run them:

- cascade: Xid 149 on one GPU, Xid 145, 45 storms and 154 on the job's 63 other GPUs. One
  fleet incident, its root that GPU, holding every GPU within 10 s of the last one's first
  line; the root's node's cordon approved, the 15 others denied as consequences (not by
  the budget, which has room for the root's node); on SQLite and on PostgreSQL.
- links-down: Xid 149 on all 72 GPUs at once. One incident with no GPU root; the budget
  alone decides, and approves no more than it allows.
"""

from __future__ import annotations

import json
import time
import urllib.request
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import postgres_server
from conftest import deadline_in, require, require_that
from test_run_fleet import RunningFleet, run_fleet

TRAYS = 18
ROOT_NODE, ROOT_INDEX = "gb200-tray-07", 2
JOB_NODES = [f"gb200-tray-{n:02d}" for n in range(1, 17)]
SPARES = ["gb200-tray-17", "gb200-tray-18"]
BUDGET = 2  # the rack's: max_nodes 2, max_percent 20 of 18 nodes
DOMAIN = "5c1e7a2b-9d3f-4e61-8a70-2b4c6d8e0f12/32766"


def _rack(tmp_path: Path, drill: str, *extra: str) -> AbstractContextManager[RunningFleet]:
    return run_fleet(tmp_path, "--rack", "gb200", "--drill", drill, *extra, nodes=TRAYS)


def _notification_groups(fleet: RunningFleet, incident: str) -> list[dict[str, Any]] | None:
    """Alertmanager's groups with an alert it would notify of (active: neither inhibited
    nor silenced), once the incident's root alert is in and the node alerts of the drill
    have reached it too (so that their inhibition is what is counted)."""
    address = json.loads((fleet.root / "addresses.json").read_text())["alertmanager"]
    with urllib.request.urlopen(address + "api/v2/alerts/groups", timeout=10) as answer:
        groups = json.loads(answer.read())
    alerts = [a for g in groups for a in g["alerts"]]
    root = [
        a
        for a in alerts
        if a["labels"].get("incident") == incident and a["labels"].get("role") == "root"
    ]
    node_alerts = [a for a in alerts if a["labels"]["alertname"] == "GpuagentXidCritical"]
    if not root or len({a["labels"].get("node") for a in node_alerts}) < len(JOB_NODES):
        return None
    return [g for g in groups if any(a["status"]["state"] == "active" for a in g["alerts"])]


def _incidents(fleet: RunningFleet) -> list[dict[str, Any]]:
    return list(fleet.get("api/v1/incidents")["incidents"])


def _drill_and_incident(
    fleet: RunningFleet, gpus: int, started: float
) -> tuple[dict[str, Any], list[dict[str, Any]], float]:
    """The drill's record (once its last line is written), the incidents once one holds
    every drill GPU, and when the API first showed it so."""
    deadline = deadline_in(300)  # 18 daemons starting on two cores, then the drill
    drill: dict[str, Any] | None = None
    complete: float | None = None
    incidents: list[dict[str, Any]] = []
    while drill is None or complete is None:
        if fleet.process.poll() is not None:
            errors = fleet.process.stderr.read() if fleet.process.stderr else ""
            raise AssertionError(f"run-fleet exited {fleet.process.returncode}: {errors}")
        assert time.monotonic() < deadline, f"drill {drill}, incidents {incidents}"
        record = fleet.root / "drill.json"
        if drill is None and record.exists():
            drill = json.loads(record.read_text())
            print(
                f"the drill began {drill['started'] - started:.1f} s after run-fleet, "
                f"its last line {drill['last_line'] - drill['started']:.1f} s later"
            )
        try:
            incidents = _incidents(fleet)
        except OSError:
            incidents = []
        if complete is None and any(i["counts"]["gpus"] == gpus for i in incidents):
            complete = time.time()
        time.sleep(0.25)
    return drill, incidents, complete


def _decisions(fleet: RunningFleet, nodes: int) -> dict[str, dict[str, Any]] | None:
    rows = fleet.get("api/v1/cordons")["cordons"]
    decided = {r["node"]: r for r in rows if r["action"] == "cordon"}
    return decided if len(decided) >= nodes else None


def _cascade(tmp_path: Path, *extra: str, alerts: bool = False) -> None:
    started = time.time()
    with _rack(tmp_path, "cascade", *extra, *(() if alerts else ("--no-alerts",))) as fleet:
        drill, incidents, complete = _drill_and_incident(fleet, 64, started)
        after = complete - drill["last_member"]
        print(
            f"the incident complete in the API {after:.1f} s after its last GPU's first line "
            f"({complete - drill['last_line']:.1f} s after the drill's last line)"
        )
        assert drill["root"] == {"node": ROOT_NODE, "index": 2, "pci_bus_id": "0000:9c:00.0"}
        assert after < 10, (after, drill)

        (incident,) = incidents
        assert incident["nvlink_domain"] == DOMAIN
        assert incident["root_unknown"] is False
        root = incident["root"]
        assert (root["node"], root["index"], root["xid"], root["link"], root["role"]) == (
            ROOT_NODE,
            ROOT_INDEX,
            149,
            14,
            "root",
        )
        assert incident["counts"]["gpus"] == 64
        assert incident["counts"]["nodes"] == 16
        members = [m for m in incident["members"] if m["role"] == "consequence"]
        assert len(members) == 63
        assert {m["node"] for m in members} == set(JOB_NODES)
        assert {m["xid"] for m in members} == {145}
        assert incident["nodes"] == dict.fromkeys(JOB_NODES, "consequence") | {ROOT_NODE: "root"}
        assert incident["summary"].startswith(f"Xid 149, link 14 on {ROOT_NODE} GPU 2"), incident

        # The arbiter held the rack's requests to settle, then decided all 16 at once.
        decided = fleet.until(lambda: _decisions(fleet, 16), 120, "16 cordon decisions")
        decided_at = max(r["time"] for r in decided.values())
        print(f"16 cordon decisions {decided_at - drill['started']:.1f} s after the drill began")
        approved = sorted(n for n, r in decided.items() if r["decision"] == "approved")
        denied = {n: r for n, r in decided.items() if r["decision"] == "denied"}
        assert approved == [ROOT_NODE], decided
        assert sorted(denied) == sorted(set(JOB_NODES) - {ROOT_NODE})
        reason = (
            f"consequence of Xid 149, link 14 on {ROOT_NODE} GPU 2 "
            f"(fleet incident {incident['id']})"
        )
        assert {r["reason"] for r in denied.values()} == {reason}  # the incident's, no budget
        assert decided[ROOT_NODE]["reason"].startswith("within budget (1 of 2)")
        assert not set(SPARES) & set(decided)

        # The incident records the decisions made for it.
        def noted() -> dict[str, Any] | None:
            found = fleet.get(f"api/v1/incidents/{incident['id']}")
            return found if len(found["denied"]) == 15 and found["approved"] else None

        found = fleet.until(noted, 30, "the decisions in the incident")
        assert found["approved"] == [ROOT_NODE]
        assert sorted(found["denied"]) == sorted(denied)
        late = found["last_time"] - drill["last_line"]
        print(f"the incident's last_time {late:.1f} s after the last line")

        if alerts:
            # One fault, one page: Prometheus fires the 16 nodes' XID alerts, the aggregator
            # pushes the incident, and the shipped routes leave one group to notify of.
            groups = fleet.until(
                lambda: _notification_groups(fleet, incident["id"]), 120, "the drill's alerts"
            )
            assert [g["labels"] for g in groups] == [{"incident": incident["id"]}], groups
            (group,) = groups
            active = [a for a in group["alerts"] if a["status"]["state"] == "active"]
            assert [a["labels"]["node"] for a in active] == [ROOT_NODE]
            assert len(group["alerts"]) == 16  # the 15 consequences inhibited by the root
        print(f"cascade drill run: {time.time() - started:.1f} s")


def test_the_cascade_drill_names_its_root_denies_the_consequences_and_pages_once(
    tmp_path: Path,
) -> None:
    require("prometheus", "run-fleet's alerts (Debian package prometheus)")
    require("prometheus-alertmanager", "run-fleet's alerts (prometheus-alertmanager)")
    _cascade(tmp_path, alerts=True)


def test_the_cascade_drill_with_a_postgresql_store(tmp_path: Path) -> None:
    require_that(
        postgres_server.available(),
        "PostgreSQL's initdb and pg_ctl (Debian package postgresql; the test command installs it)",
    )
    with postgres_server.throwaway_postgres() as server:
        url = server.create_database("fleet")
        _cascade(tmp_path, "--postgres", url)
        assert server.count("cordons", "fleet") == 16


def test_every_link_down_is_the_racks_fault_not_a_gpus(tmp_path: Path) -> None:
    started = time.time()
    with _rack(tmp_path, "links-down", "--no-alerts") as fleet:
        drill, incidents, complete = _drill_and_incident(fleet, 72, started)
        after = complete - drill["last_member"]
        print(f"the incident complete {after:.1f} s after its last GPU's first line")
        assert after < 10, (after, drill)
        (incident,) = incidents
        assert incident["root"] is None
        assert incident["root_unknown"] is True
        assert incident["counts"]["gpus"] == 72
        assert incident["counts"]["nodes"] == 18
        assert incident["summary"].startswith(
            f"root unknown (domain-level) in NVLink domain {DOMAIN}"
        )

        decided = fleet.until(lambda: _decisions(fleet, 18), 120, "18 cordon decisions")
        approved = [n for n, r in decided.items() if r["decision"] == "approved"]
        denied = [r for r in decided.values() if r["decision"] == "denied"]
        assert 1 <= len(approved) <= BUDGET, decided
        assert len(approved) + len(denied) == 18
        # No GPU root: the budget decides every request, and says why none was denied as a
        # consequence.
        for row in decided.values():
            assert "root unknown (domain-level)" in row["reason"], row
            assert "consequence of" not in row["reason"], row
        for row in denied:
            assert row["reason"].startswith("fleet cordon budget spent"), row
        print(f"links-down drill run: {time.time() - started:.1f} s")
