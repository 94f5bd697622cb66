"""Fleet incidents pushed to Alertmanager: a 16-node NVLink incident and a domain-level
one posted to a real Alertmanager (Debian's prometheus-alertmanager) whose route groups by
incident and whose inhibition rule holds consequences behind their root, read back from
its API, then resolved; and against a recording stand-in, what is sent when (new,
changed, re-sent, closed once, forgotten), in one request per push, and what an outage
costs."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from conftest import free_port
from fleet_support import until
from gpuagent.aggregator import alertpush
from gpuagent.aggregator.alertpush import DOMAIN_RUNBOOK_TEXT, IncidentPusher
from test_aggregator_alerts import Alertmanager, started_alertmanager

CLIQUE = "nvlink:7c1e1a52-9d43-4f0e-a3c4-5b8f6f1d2e90/3"
# Alertmanager's route: one group (one page) per incident; a root's alert inhibits the
# consequences' alerts of the same incident.
CONFIG = """\
route:
  receiver: "null"
  group_by: [incident]
  group_wait: 0s
receivers:
  - name: "null"
inhibit_rules:
  - source_matchers: ['role="root"']
    target_matchers: ['role="consequence"']
    equal: [incident]
"""


def incident(
    ident: str = "fi-3f2a9c1d",
    *,
    nodes: int = 16,
    domain: str = CLIQUE,
    root: bool = True,
    first_time: float = 1_795_862_612.0,
    last_time: float | None = None,
    closed_at: float | None = None,
) -> dict[str, Any]:
    """A fleet incident's JSON: n03's GPU 2 lost NVLink link 14 and GPUs 0-3 of every
    other node in the clique saw Xid 74 for it (or, without a root, the domain as a whole)."""
    names = [f"n{i + 3:02}" for i in range(nodes)]
    root_member = {
        "node": "n03",
        "gpu": "0000:1b:00.0",
        "uuid": "GPU-5d1c0e3a-0000-0000-0000-000000000003",
        "index": 2,
        "xid": 149,
        "link": 14,
    }
    members: list[dict[str, Any]] = []
    roles: dict[str, str] = {}
    for name in names:
        is_root = root and name == "n03"
        roles[name] = "root" if is_root else "consequence"
        members.extend(
            {
                "node": name,
                "gpu": f"0000:{0x1B + index:02x}:00.0",
                "uuid": f"GPU-{name}-{index}",
                "index": index,
                "role": "root" if is_root else "consequence",
                "xid": 149 if is_root else 74,
                "count": 3 if is_root else 1,
                "first_time": first_time,
                "last_time": last_time or first_time,
            }
            for index in ([2] if is_root else range(4))
        )
    return {
        "id": ident,
        "cluster": "c1",
        "domain": domain,
        "state": "closed" if closed_at is not None else "open",
        "first_time": first_time,
        "last_time": last_time or first_time,
        "closed_at": closed_at,
        "root": root_member if root else None,
        "summary": (
            f"Xid 149 (NVLink link down, link 14) on n03 GPU 2; {len(members) - 1} GPUs on "
            f"{nodes - 1} nodes saw consequences"
            if root
            else f"{len(members)} GPUs on {nodes} nodes in {domain} failed together"
        ),
        "members": members,
        "nodes": roles,
        "approved": ["n03"],
        "denied": names[1:],
    }


def _time(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


# --- a real Alertmanager ----------------------------------------------------------------


async def _groups(am: Alertmanager) -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = await am.get("/api/v2/alerts/groups")
    return groups


async def test_incidents_grouped_and_inhibited_in_a_real_alertmanager(tmp_path: Path) -> None:
    now = time.time()
    nvlink = incident(first_time=now - 120, last_time=now - 30)
    rack = incident("fi-0a0b0c0d", nodes=4, domain="label:rack=r1", root=False, first_time=now)
    with started_alertmanager(tmp_path, CONFIG) as am:
        pusher = IncidentPusher(am.url, timeout=5.0, clock=time.time)
        async with aiohttp.ClientSession() as session:
            started = time.monotonic()
            await pusher.push(session, [nvlink, rack])
            took = time.monotonic() - started
            assert (pusher.error, pusher.failures) == ("", {})
            assert took < 2.0

            by_incident: dict[str, dict[str, Any]] = {}

            async def grouped() -> bool:
                # Alertmanager groups and inhibits asynchronously: until it has.
                groups = await _groups(am)
                by_incident.clear()
                by_incident.update({g["labels"]["incident"]: g for g in groups})
                nv = by_incident.get(nvlink["id"], {}).get("alerts", [])
                return (
                    len(by_incident) == 2
                    and len(nv) == 16
                    and sum(bool(a["status"]["inhibitedBy"]) for a in nv) == 15
                )

            await until(grouped, 10)
            # Exactly one group per incident, labelled by it alone.
            assert sorted(by_incident) == sorted([nvlink["id"], rack["id"]])
            group = by_incident[nvlink["id"]]
            assert group["labels"] == {"incident": nvlink["id"]}
            assert group["receiver"]["name"] == "null"
            alerts = {a["labels"]["node"]: a for a in group["alerts"]}
            assert sorted(alerts) == sorted(nvlink["nodes"])
            root = alerts.pop("n03")
            assert root["labels"] == {
                "alertname": "GpuagentFleetIncident",
                "incident": "fi-3f2a9c1d",
                "nvlink_domain": "7c1e1a52-9d43-4f0e-a3c4-5b8f6f1d2e90/3",
                "domain": CLIQUE,
                "role": "root",
                "node": "n03",
                "cluster": "c1",
                "severity": "critical",
            }
            assert root["status"] == {"state": "active", "inhibitedBy": [], "silencedBy": []}
            assert root["annotations"]["summary"] == nvlink["summary"]
            assert root["annotations"]["runbook"] == "checks.md#nvlink"
            assert root["annotations"]["description"].startswith(
                "root: Xid 149 on n03 GPU 2, NVLink link 14 (incident fi-3f2a9c1d: "
                "61 GPUs on 16 nodes)"
            )
            assert abs(_time(root["startsAt"]) - (now - 120)) < 0.01
            assert abs(_time(root["endsAt"]) - (now + 180)) < 5
            root_fingerprint = root["fingerprint"]
            for node, consequence in alerts.items():
                labels = consequence["labels"]
                assert (labels["role"], labels["severity"], labels["node"]) == (
                    "consequence",
                    "warning",
                    node,
                )
                assert consequence["status"]["state"] == "suppressed"
                assert consequence["status"]["inhibitedBy"] == [root_fingerprint]
                assert consequence["annotations"]["description"] == (
                    "consequence of Xid 149 on n03 GPU 2 (incident fi-3f2a9c1d: 61 GPUs on "
                    "16 nodes). Here: GPU 0 Xid 74, GPU 1 Xid 74, GPU 2 Xid 74, GPU 3 Xid 74."
                )
            # Root unknown: the domain as a whole, every node's alert critical, none held.
            domain_alerts = by_incident[rack["id"]]["alerts"]
            assert len(domain_alerts) == 4
            for alert in domain_alerts:
                assert alert["labels"]["severity"] == "critical"
                assert "nvlink_domain" not in alert["labels"]
                assert alert["labels"]["domain"] == "label:rack=r1"
                assert alert["status"]["state"] == "active"
                assert alert["annotations"]["runbook"] == DOMAIN_RUNBOOK_TEXT
                assert alert["annotations"]["description"].startswith(
                    "root unknown: label:rack=r1 as a whole"
                )

            # The NVLink incident closes: pushed once more, ending in the past, and
            # Alertmanager resolves its alerts; then it is forgotten.
            closed = incident(first_time=now - 120, last_time=now - 30, closed_at=time.time())
            assert pusher.pending == 2
            await pusher.push(session, [closed, rack])
            assert (pusher.error, pusher.failures, pusher.pending) == ("", {}, 1)

            async def resolved() -> bool:
                groups = await _groups(am)
                return [g["labels"]["incident"] for g in groups] == [rack["id"]]

            await until(resolved, 10)
            active = await am.get('/api/v2/alerts?filter=incident="fi-3f2a9c1d"')
            assert active == []
            assert len(await am.get('/api/v2/alerts?filter=incident="fi-0a0b0c0d"')) == 4


# --- what is sent when -------------------------------------------------------------------


@dataclass
class Recorder:
    """A stand-in for Alertmanager's POST /api/v2/alerts: what each request carried."""

    url: str = ""
    posts: list[list[dict[str, Any]]] = field(default_factory=list)
    status: int = 200

    def take(self) -> list[list[dict[str, Any]]]:
        posts, self.posts = self.posts, []
        return posts


@asynccontextmanager
async def recorder() -> AsyncIterator[Recorder]:
    record = Recorder()

    async def alerts(request: web.Request) -> web.Response:
        record.posts.append(await request.json())
        if record.status != 200:
            return web.json_response("cannot parse alerts", status=record.status)
        return web.Response()

    app = web.Application(client_max_size=64 << 20)
    app.router.add_post("/api/v2/alerts", alerts)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    record.url = f"http://{host}:{port}"
    try:
        yield record
    finally:
        await runner.cleanup()


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _nodes(posts: list[list[dict[str, Any]]]) -> list[list[tuple[str, str]]]:
    return [[(a["labels"]["incident"], a["labels"]["node"]) for a in post] for post in posts]


async def test_what_is_sent_when() -> None:
    clock = Clock(1_795_862_700.0)
    first = incident(nodes=3, first_time=clock.now - 60)
    async with recorder() as am, aiohttp.ClientSession() as session:
        pusher = IncidentPusher(am.url, timeout=5.0, clock=clock, resend_seconds=60.0)
        push = pusher.push

        await push(session, [first])
        (posted,) = am.take()
        assert [a["labels"]["node"] for a in posted] == ["n03", "n04", "n05"]
        assert posted[0]["endsAt"] == "2026-11-28T10:48:00.000Z"  # now + 3 x 60 s
        assert posted[0]["startsAt"] == "2026-11-28T10:44:00.000Z"
        assert "generatorURL" not in posted[0]
        assert "runbook_url" not in posted[0]["annotations"]

        # Unchanged and within the resend interval: nothing.
        clock.now += 30
        await push(session, [first])
        assert am.take() == []

        # Changed (a later event): at once. A second incident goes in the same request.
        clock.now += 5
        later = incident(nodes=3, first_time=first["first_time"], last_time=clock.now)
        second = incident("fi-00000002", nodes=2)
        await push(session, [later, second])
        assert _nodes(am.take()) == [
            [
                ("fi-3f2a9c1d", "n03"),
                ("fi-3f2a9c1d", "n04"),
                ("fi-3f2a9c1d", "n05"),
                ("fi-00000002", "n03"),
                ("fi-00000002", "n04"),
            ]
        ]
        # A node's role changes: at once.
        clock.now += 1
        regrouped = {**later, "nodes": {**later["nodes"], "n05": "unrelated"}}
        await push(session, [regrouped, second])
        (posted,) = am.take()
        assert [(a["labels"]["node"], a["labels"]["severity"]) for a in posted] == [
            ("n03", "critical"),
            ("n04", "warning"),
            ("n05", "warning"),
        ]
        assert posted[2]["annotations"]["description"].startswith(
            "its own events, not a consequence of Xid 149 on n03 GPU 2"
        )

        # Re-sent every resend interval, the end pushed on.
        clock.now += 60
        await push(session, [regrouped, second])
        (posted,) = am.take()
        assert len(posted) == 5
        assert _time(posted[0]["endsAt"]) == clock.now + 180

        # Closed: once, ending when it closed; then forgotten, even while still shown.
        clock.now += 10
        closed_at = clock.now - 2
        closed = {**regrouped, "state": "closed", "closed_at": closed_at}
        await push(session, [closed, second])
        (posted,) = am.take()
        assert {_time(a["endsAt"]) for a in posted} == {closed_at}
        assert pusher.pending == 1
        for _ in range(3):
            clock.now += 100
            await push(session, [closed])
            assert _nodes(am.take()) == []  # second left the input: forgotten too
        assert pusher.pending == 0

        # A closed incident never pushed open (an earlier process pushed it, or it opened
        # and closed between two pushes) is not pushed: it is resolved already.
        await push(session, [{**second, "state": "closed", "closed_at": clock.now}])
        assert am.take() == []
        assert (pusher.failures, pusher.error) == ({}, "")


async def test_links_to_the_console_and_the_runbook() -> None:
    clock = Clock(1_795_862_700.0)
    async with recorder() as am, aiohttp.ClientSession() as session:
        pusher = IncidentPusher(
            am.url + "/",
            timeout=5.0,
            clock=clock,
            generator_url="https://fleet.example/",
            runbook_base_url="https://docs.example/gpuagent/",
        )
        job = incident("fi-j", nodes=2, domain="job:4711")
        await pusher.push(session, [job, incident("fi-r", nodes=1, root=False)])
        (posted,) = am.take()
    assert [a["generatorURL"] for a in posted] == [
        "https://fleet.example/#node/c1/n03",
        "https://fleet.example/#node/c1/n04",
        "https://fleet.example/#node/c1/n03",
    ]
    assert [(a["annotations"]["runbook"], a["annotations"]["runbook_url"]) for a in posted] == [
        ("checks.md#xid", "https://docs.example/gpuagent/checks.md#xid"),
        ("checks.md#xid", "https://docs.example/gpuagent/checks.md#xid"),
        (DOMAIN_RUNBOOK_TEXT, "https://docs.example/gpuagent/fleet.md#fleet-incidents"),
    ]
    assert "nvlink_domain" not in posted[0]["labels"]  # not an NVLink domain


async def test_an_outage_is_counted_logged_once_and_caught_up(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock(1_795_862_700.0)
    caplog.set_level(logging.INFO, logger="gpuagent.aggregator.alertpush")
    one, two = incident("fi-1", nodes=2), incident("fi-2", nodes=2)
    async with recorder() as am, aiohttp.ClientSession() as session:
        pusher = IncidentPusher(am.url, timeout=5.0, clock=clock)
        await pusher.push(session, [one])
        assert len(am.take()) == 1

        # Alertmanager refuses: counted, logged once, never raised.
        am.status = 400
        clock.now += 1
        await pusher.push(session, [one, two])
        clock.now += 1
        await pusher.push(session, [one, two])
        assert _nodes(am.take()) == [[("fi-2", "n03"), ("fi-2", "n04")]] * 2
        assert pusher.failures == {"bad_answer": 2}
        assert pusher.error == 'HTTP 400: "cannot parse alerts"'
        # Unreachable.
        pusher.url = f"http://127.0.0.1:{free_port()}/api/v2/alerts"
        clock.now += 60
        await pusher.push(session, [one, two])
        assert pusher.failures == {"bad_answer": 2, "unreachable": 1}
        assert "Connect" in pusher.error or "connect" in pusher.error
        # fi-1 closes meanwhile, and is given this once (the correlator reports a change
        # once): it is held.
        closed_at = clock.now
        clock.now += 1
        await pusher.push(session, [{**one, "state": "closed", "closed_at": closed_at}, two])
        assert pusher.failures == {"bad_answer": 2, "unreachable": 2}
        assert pusher.pending == 2
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1
        assert "cannot push fleet incidents" in warnings[0].getMessage()

        # Back: everything pending goes with the next push in one request, the closed
        # incident too, ending when it closed.
        am.status = 200
        pusher.url = am.url + "/api/v2/alerts"
        clock.now += 1
        await pusher.push(session, [two])
        (posted,) = am.take()
        assert _nodes([posted]) == [
            [("fi-2", "n03"), ("fi-2", "n04"), ("fi-1", "n03"), ("fi-1", "n04")]
        ]
        assert [_time(a["endsAt"]) for a in posted[2:]] == [closed_at] * 2
        assert _time(posted[0]["endsAt"]) == clock.now + 180
        assert pusher.error == ""
        assert pusher.pushed_at == clock.now
        assert pusher.pending == 1
        assert any("again" in r.getMessage() for r in caplog.records)
        clock.now += 1
        await pusher.push(session, [two])
        assert am.take() == []


async def test_closed_incidents_held_through_an_outage_are_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(alertpush, "MAX_CLOSING", 2)
    clock = Clock(1_795_862_700.0)
    incidents = [incident(f"fi-{i}", nodes=1) for i in range(3)]
    async with recorder() as am, aiohttp.ClientSession() as session:
        pusher = IncidentPusher(am.url, timeout=5.0, clock=clock)
        await pusher.push(session, incidents)
        am.take()
        am.status = 503
        clock.now += 1
        await pusher.push(
            session, [{**i, "state": "closed", "closed_at": clock.now} for i in incidents]
        )
        assert pusher.pending == 2
        am.status = 200
        am.take()
        await pusher.push(session, [])
        # The oldest was dropped: Alertmanager ends it at its endsAt.
        assert _nodes(am.take()) == [[("fi-1", "n03"), ("fi-2", "n03")]]
        assert pusher.pending == 0


async def test_a_large_push_is_one_request() -> None:
    """200 open incidents of 16 nodes: 3,200 alerts in one request, and how long it takes."""
    clock = Clock(time.time())
    incidents = [incident(f"fi-{i:08x}", nodes=16) for i in range(200)]
    async with recorder() as am, aiohttp.ClientSession() as session:
        pusher = IncidentPusher(am.url, timeout=10.0, clock=clock)
        started = time.monotonic()
        await pusher.push(session, incidents)
        took = time.monotonic() - started
        (posted,) = am.take()
        assert len(posted) == 3200
        started = time.monotonic()
        await pusher.push(session, incidents)  # nothing due
        idle = time.monotonic() - started
        assert am.take() == []
    assert took < 5.0
    assert idle < 0.5
