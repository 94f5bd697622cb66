"""Each node's alerts from Alertmanager in the console: the answer parsed and matched to
nodes (a table of real answers' shapes), then a real Alertmanager (Debian's
prometheus-alertmanager) with firing, silenced and foreign alerts read by a running
aggregator, shown in the fleet table and on the node and GPU pages in headless Chromium,
and what the page and metrics say once Alertmanager is gone."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

import aggregator_support as msg
from conftest import deadline_in, free_port, parse_metrics, require
from fleet_support import chromium, until
from gpuagent.aggregator import alerts as alerts_module
from gpuagent.aggregator.alerts import (
    AlertmanagerReader,
    BadAnswerError,
    FleetAlerts,
    index_alerts,
    node_of,
)
from gpuagent.aggregator.service import Aggregator
from gpuagent.config import AlertmanagerSection
from gpuagent.fleet import schema
from page_support import browser

LABELS = ("node", "Hostname", "instance")


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


def alert(
    labels: dict[str, str],
    *,
    summary: str = "",
    silenced: bool = False,
    inhibited: bool = False,
    starts: float = 1_795_862_612.0,
) -> dict[str, Any]:
    """One entry of GET /api/v2/alerts, shaped as Alertmanager 0.25 answers it."""
    return {
        "annotations": {"summary": summary} if summary else {},
        "endsAt": _iso(starts + 3600),
        "fingerprint": "39380f6053003142",
        "receivers": [{"name": "none"}],
        "startsAt": _iso(starts),
        "status": {
            "inhibitedBy": ["0f3c"] if inhibited else [],
            "silencedBy": ["29c3037d-39ec-49a0-8e43-c710f0981c94"] if silenced else [],
            "state": "suppressed" if silenced or inhibited else "active",
        },
        "updatedAt": _iso(starts),
        "labels": {"alertname": "GpuagentGpuCritical", "severity": "critical", **labels},
    }


@pytest.mark.parametrize(
    ("labels", "node"),
    [
        ({"Hostname": "gpu-a1", "instance": "10.0.0.5:19400"}, "gpu-a1"),
        ({"instance": "gpu-a1:19400"}, "gpu-a1"),  # a node-level rule: no Hostname
        ({"instance": "gpu-a1.example.net:9100"}, "gpu-a1.example.net"),  # node_exporter
        ({"instance": "[fd00::5]:19400"}, "fd00::5"),
        ({"instance": "gpu-a1"}, "gpu-a1"),
        ({"node": "gpu-a1", "instance": "10.1.2.3:19400"}, "gpu-a1"),  # relabelled pod target
        ({"job": "gpuagent"}, ""),
        ({"Hostname": "", "node": "gpu-b2"}, "gpu-b2"),
        # The scrape's node label (the agent's node name) before the host's name.
        ({"node": "k8s-node-7", "Hostname": "gpu-a1.internal"}, "k8s-node-7"),
    ],
)
def test_the_node_an_alert_names(labels: dict[str, str], node: str) -> None:
    assert node_of(labels, LABELS) == node


def test_alertmanagers_answer_indexed_by_node() -> None:
    body = json.dumps(
        [
            alert({"Hostname": "gpu-a1", "gpu": "3"}, summary="GPU 3 on gpu-a1 is CRITICAL"),
            alert(
                {"alertname": "GpuagentXidRecent", "severity": "warning", "Hostname": "gpu-a1"},
                silenced=True,
            ),
            alert({"alertname": "NodeDown", "instance": "gpu-a1:9100"}, inhibited=True),
            alert({"alertname": "Watchdog", "severity": "none"}),
            {"labels": "not a map"},
            "nonsense",
        ]
    ).encode()
    by_node, nameless, malformed = index_alerts(body, LABELS)
    assert (nameless, malformed) == (1, 2)
    alerts = [a.json() for a in by_node["gpu-a1"]]
    # Firing first, then by name.
    assert [(a["name"], a["state"], a["gpu"]) for a in alerts] == [
        ("GpuagentGpuCritical", "firing", "3"),
        ("GpuagentXidRecent", "silenced", ""),
        ("NodeDown", "silenced", ""),
    ]
    assert alerts[0]["summary"] == "GPU 3 on gpu-a1 is CRITICAL"
    assert alerts[0]["since"] == 1_795_862_612.0


@pytest.mark.parametrize("body", [b"<html>proxy login</html>", b'{"alerts": []}', b""])
def test_an_answer_that_is_no_list_of_alerts_is_refused(body: bytes) -> None:
    with pytest.raises(BadAnswerError):
        index_alerts(body, LABELS)


# --- an answer in many pieces -----------------------------------------------------------


@asynccontextmanager
async def chunked_alertmanager(answer: list[bytes]) -> AsyncIterator[str]:
    """A stand-in for Alertmanager that serves ``answer[0]`` as a chunked answer, written in
    20 small pieces a little apart, the way a proxy or a busy Alertmanager streams a large
    one: the client's first read sees only the first piece."""

    async def alerts(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        body = answer[0]
        step = max(1, -(-len(body) // 20))
        with contextlib.suppress(ConnectionError):  # a client that stops reading
            for start in range(0, len(body), step):
                await response.write(body[start : start + step])
                await asyncio.sleep(0.01)
            await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/api/v2/alerts", alerts)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()


def _many_alerts(count: int) -> bytes:
    return json.dumps(
        [alert({"Hostname": f"gpu-{i // 8:03}", "gpu": str(i % 8)}) for i in range(count)]
    ).encode()


async def test_a_chunked_answer_is_read_whole() -> None:
    body = _many_alerts(1000)
    fleet = FleetAlerts(configured=True)
    async with chunked_alertmanager([body]) as url, aiohttp.ClientSession() as session:
        reader = AlertmanagerReader(AlertmanagerSection(url=url), fleet, time.time)
        await reader.read_once(session)
    assert fleet.error == ""
    assert fleet.failures == {}
    assert sum(len(alerts) for alerts in fleet.by_node.values()) == 1000
    assert len(fleet.by_node) == 125
    assert [a.gpu for a in fleet.by_node["gpu-124"]] == [str(g) for g in range(8)]


async def test_a_chunked_answer_over_the_limit_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(alerts_module, "MAX_ANSWER_BYTES", 64_000)
    answer = [_many_alerts(16)]
    async with chunked_alertmanager(answer) as url:
        fleet = FleetAlerts(configured=True)
        reader = AlertmanagerReader(AlertmanagerSection(url=url), fleet, time.time)
        async with aiohttp.ClientSession() as session:
            await reader.read_once(session)
            assert sum(len(a) for a in fleet.by_node.values()) == 16
            answer[0] = _many_alerts(1000)  # about 370 kB, in pieces of 19 kB
            assert len(answer[0]) > 5 * alerts_module.MAX_ANSWER_BYTES
            await reader.read_once(session)
    assert fleet.error == "answer larger than 64000 bytes"
    assert fleet.failures == {"bad_answer": 1}
    # The last answer's alerts are kept.
    assert sum(len(a) for a in fleet.by_node.values()) == 16


# --- a real Alertmanager ----------------------------------------------------------------


@dataclasses.dataclass
class Alertmanager:
    url: str
    process: subprocess.Popen[bytes]

    async def post(self, path: str, doc: object) -> Any:
        async with aiohttp.ClientSession() as session, session.post(self.url + path, json=doc) as r:
            assert r.status == 200, await r.text()
            return await r.json(content_type=None)

    async def get(self, path: str) -> Any:
        async with aiohttp.ClientSession() as session, session.get(self.url + path) as r:
            assert r.status == 200, await r.text()
            return await r.json(content_type=None)


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[Alertmanager]:
    config = "route:\n  receiver: none\nreceivers:\n  - name: none\n"
    with started_alertmanager(tmp_path, config) as running:
        yield running


@contextlib.contextmanager
def started_alertmanager(tmp_path: Path, config: str) -> Iterator[Alertmanager]:
    """A real Alertmanager with ``config`` (its YAML), stopped on leaving."""
    binary = require(
        "prometheus-alertmanager",
        "the console's alert column and fleet incidents (Debian package prometheus-alertmanager)",
        alternatives=("alertmanager",),
    )
    conf = tmp_path / "alertmanager.yml"
    conf.write_text(config)
    log = (tmp_path / "alertmanager.log").open("wb")
    # A free port can be taken by a parallel test before Alertmanager binds it: it then
    # exits at once, and another port is tried.
    for _attempt in range(3):
        port = free_port()
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={conf}",
                f"--storage.path={tmp_path / 'alertmanager-data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--cluster.listen-address=",  # no gossip port: one instance
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        if _listening(port, process):
            break
    try:
        yield Alertmanager(f"http://127.0.0.1:{port}", process)
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def _listening(port: int, process: subprocess.Popen[bytes]) -> bool:
    """Whether ``process`` came to listen on ``port`` (False once it has exited)."""
    deadline = deadline_in(10)
    while process.poll() is None and time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return True
        time.sleep(0.05)
    return False


@asynccontextmanager
async def running(agg: Aggregator) -> AsyncIterator[Aggregator]:
    await agg.start()
    try:
        yield agg
    finally:
        await agg.close()


async def _get(url: str) -> Any:
    async with aiohttp.ClientSession() as session, session.get(url) as answer:
        assert answer.status == 200, await answer.text()
        if answer.content_type == "application/json":
            return await answer.json()
        return await answer.text()


async def _fleet_once(base: str, holds: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """The fleet document once ``holds`` is true of it (within the deadline)."""
    doc: dict[str, Any] = {}

    async def check() -> bool:
        doc.update(await _get(base + "api/v1/fleet?sort=alerts"))
        return holds(doc)

    await until(check, 10)
    return doc


async def test_alerts_from_a_real_alertmanager_in_the_console(
    tmp_path: Path, alertmanager: Alertmanager
) -> None:
    now = time.time()
    posted = [
        {"labels": labels, "annotations": {"summary": summary}, "startsAt": _iso(now - 600)}
        for labels, summary in (
            (
                {
                    "alertname": "GpuagentGpuCritical",
                    "severity": "critical",
                    "gpu": "2",
                    "Hostname": "bad-node",
                    "instance": "10.0.0.5:19400",
                },
                "GPU 2 on bad-node is CRITICAL",
            ),
            (
                {
                    "alertname": "GpuagentXidRecent",
                    "severity": "warning",
                    "gpu": "2",
                    "Hostname": "bad-node",
                },
                "XID 79 on GPU 2 of bad-node",
            ),
            (
                {"alertname": "NodeFilesystemAlmostFull", "instance": "ok-node:9100"},
                "/var is 95 % full",
            ),
            # Another cluster's node of the same name: not this one's.
            ({"alertname": "GpuagentGpuLost", "Hostname": "ok-node", "cluster": "c9"}, ""),
            ({"alertname": "Watchdog"}, "always firing"),
        )
    ]
    await alertmanager.post("/api/v2/alerts", posted)
    # Somebody silenced the XID alert while the GPU waits for its RMA.
    await alertmanager.post(
        "/api/v2/silences",
        {
            "matchers": [
                {"name": "alertname", "value": "GpuagentXidRecent", "isRegex": False},
                {"name": "Hostname", "value": "bad-node", "isRegex": False},
            ],
            "startsAt": _iso(now - 60),
            "endsAt": _iso(now + 3600),
            "createdBy": "sre",
            "comment": "RMA 4711",
        },
    )

    port = free_port()
    config = msg.config(
        tmp_path,
        port=port,
        alertmanager=AlertmanagerSection(
            url=alertmanager.url, interval_seconds=0.3, timeout_seconds=2.0
        ),
    )
    base = f"http://127.0.0.1:{port}/"
    async with running(Aggregator(config)) as agg:
        gpu = msg.gpu_doc(2, "CRITICAL", [msg.finding("xid", "CRITICAL", "XID 79")])
        for message in (
            msg.state("bad-node", health="CRITICAL", gpus=[msg.gpu_doc(0), gpu]),
            msg.state("ok-node"),
        ):
            agg.ingest.handle(msg.topic(message["node"], "state"), schema.encode(message))

        doc = await _fleet_once(base, lambda d: bool(d["alertmanager"]["checked_at"]))
        assert doc["alertmanager"]["error"] == ""
        assert doc["alertmanager"]["without_node"] == 1  # Watchdog
        rows = {n["name"]: n["alerts"] for n in doc["nodes"]}
        assert [n["name"] for n in doc["nodes"]] == ["bad-node", "ok-node"]
        assert [(a["name"], a["state"], a["gpu"]) for a in rows["bad-node"]] == [
            ("GpuagentGpuCritical", "firing", "2"),
            ("GpuagentXidRecent", "silenced", "2"),
        ]
        assert abs(rows["bad-node"][0]["since"] - (now - 600)) < 2
        assert [(a["name"], a["state"]) for a in rows["ok-node"]] == [
            ("NodeFilesystemAlmostFull", "firing")
        ]
        families = {f.name: f for f in parse_metrics(await _get(base + "metrics"))}
        assert families["gpuagent_fleet_alertmanager_up"].samples[0].value == 1

        async with browser(chromium(), tmp_path) as tab:
            await tab.open(base)
            cell = "document.querySelector('#nodes tr[data-node=\"{}\"] td:nth-child(5)')"
            await tab.wait_for(
                f"{cell.format('bad-node')}.innerText === '1 firing, 1 silenced'"
                f" && {cell.format('ok-node')}.innerText === '1 firing'"
            )
            assert await tab.evaluate(f"{cell.format('bad-node')}.title") == (
                "GpuagentGpuCritical (GPU 2); GpuagentXidRecent (GPU 2): silenced"
            )
            assert await tab.evaluate("document.getElementById('alerts-head').hidden") is False
            await tab.screenshot("fleet-alerts")
            await tab.open(base + "#gpu/c1/bad-node/2")
            await tab.wait_for("!!document.getElementById('alerts')")
            page = await tab.evaluate("document.getElementById('alerts').innerText")
            assert "GpuagentGpuCritical" in page
            assert "GpuagentXidRecent" in page
            assert "silenced" in page
            await tab.open(base + "#gpu/c1/bad-node/0")
            await tab.wait_for("document.body.innerText.includes('None firing or silenced.')")

            # Alertmanager goes away: the last alerts stay, marked as old, and the
            # metrics say so.
            alertmanager.process.terminate()
            alertmanager.process.wait(10)

            doc = await _fleet_once(base, lambda d: bool(d["alertmanager"]["error"]))
            assert {n["name"]: len(n["alerts"]) for n in doc["nodes"]} == {
                "bad-node": 2,
                "ok-node": 1,
            }
            await tab.open(base)
            await tab.wait_for(
                "document.getElementById('alerts-note').innerText.includes("
                "'Alertmanager cannot be read')"
            )
            await tab.open(base + "#node/c1/bad-node")
            await tab.wait_for("document.querySelector('.banner') !== null")
            await tab.screenshot("node-alerts-old")
        families = {f.name: f for f in parse_metrics(await _get(base + "metrics"))}
        assert families["gpuagent_fleet_alertmanager_up"].samples[0].value == 0
        errors = {
            s.labels["reason"]: s.value
            for s in families["gpuagent_fleet_alertmanager_errors"].samples
            if s.name.endswith("_total")
        }
        assert errors.get("unreachable", 0) >= 1


async def test_without_alertmanager_there_is_no_alert_column(tmp_path: Path) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}/"
    async with running(Aggregator(msg.config(tmp_path, port=port))) as agg:
        message = msg.state("ok-node")
        agg.ingest.handle(msg.topic("ok-node", "state"), schema.encode(message))
        doc = await _get(base + "api/v1/fleet")
        assert doc["alertmanager"]["configured"] is False
        assert doc["nodes"][0]["alerts"] == []
        families = {f.name for f in parse_metrics(await _get(base + "metrics"))}
        assert "gpuagent_fleet_alertmanager_up" not in families
