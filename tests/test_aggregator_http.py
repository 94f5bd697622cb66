"""The aggregator's HTTP side on a real port: API, errors, commands, drift, metrics."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

import aggregator_support as msg
from conftest import REPO, free_port
from gpuagent.aggregator.ingest import Outgoing
from gpuagent.aggregator.records import from_online_state
from gpuagent.aggregator.service import Aggregator
from gpuagent.config import CorrelationSection
from gpuagent.fleet import schema


class Published:
    def __init__(self) -> None:
        self.messages: list[tuple[str, bytes, int]] = []
        self.expiry: list[int] = []

    async def publish(self, topic: str, payload: bytes, qos: int, properties: Any) -> None:
        self.messages.append((topic, payload, qos))
        self.expiry.append(properties.MessageExpiryInterval)


class Rig:
    def __init__(self, agg: Aggregator, session: aiohttp.ClientSession, base: str) -> None:
        self.agg = agg
        self.session = session
        self.base = base

    def send(self, channel: str, message: dict[str, Any]) -> None:
        self.agg.ingest.handle(
            msg.topic(message["node"], channel, message["cluster"]), schema.encode(message)
        )

    async def get(self, path: str) -> tuple[int, Any]:
        async with self.session.get(self.base + path) as response:
            if response.content_type == "application/json":
                return response.status, await response.json()
            return response.status, await response.text()

    async def post(self, path: str, body: object) -> tuple[int, Any]:
        async with self.session.post(self.base + path, json=body, headers=msg.AUTH) as response:
            return response.status, await response.json()


@contextlib.asynccontextmanager
async def running(tmp_path: Path, **config: Any) -> AsyncIterator[Rig]:
    """An aggregator on a free port with ``config``, and a client session for its API."""
    port = free_port()
    agg = Aggregator(msg.config(tmp_path, port=port, **config))
    await agg.start()
    try:
        async with aiohttp.ClientSession() as session:
            yield Rig(agg, session, f"http://127.0.0.1:{port}")
    finally:
        await agg.close()


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    async with running(tmp_path, stale_after_seconds=60.0) as started:
        yield started


async def test_nodes_lists_unhealthy_first_with_gpus(rig: Rig) -> None:
    rig.send("state", msg.state("healthy"))
    bad_gpu = msg.gpu_doc(3, "CRITICAL", [msg.finding("ecc", "CRITICAL", "DBE")])
    rig.send("state", msg.state("sick", health="CRITICAL", gpus=[msg.gpu_doc(0), bad_gpu]))
    rig.send("state", msg.state("gone"))
    rig.send("state", msg.offline("gone"))
    status, body = await rig.get("/api/v1/nodes")
    assert status == 200
    assert [n["name"] for n in body["nodes"]] == ["sick", "gone", "healthy"]
    sick = body["nodes"][0]
    assert sick["cluster"] == "c1"
    assert (sick["online"], sick["stale"], sick["agent_version"]) == (True, False, "0.1.0")
    assert sick["gpus"][1] == {
        "index": 3,
        "pci_bus_id": "0000:1b:00.0",
        "uuid": "GPU-3",
        "serial": "",
        "model": "NVIDIA H100 80GB HBM3",
        "health": "CRITICAL",
        "findings": [msg.finding("ecc", "CRITICAL", "DBE")],
        "settings": {},  # the test's report has none
    }
    assert body["nodes"][1]["reason"] == "connection lost"
    assert body["counts"] == {
        "nodes": 3, "critical": 1, "warning": 0, "ok": 1, "unknown": 0, "offline": 1, "stale": 0
    }  # fmt: skip
    # A node that goes offline while CRITICAL counts as offline, as the table shows it.
    rig.send("state", msg.offline("sick"))
    _, after = await rig.get("/api/v1/nodes")
    assert (after["counts"]["critical"], after["counts"]["offline"]) == (0, 2)
    assert sum(v for k, v in after["counts"].items() if k != "nodes") == 3
    rig.send("state", msg.state("sick", health="CRITICAL", gpus=[msg.gpu_doc(0), bad_gpu]))
    _, body = await rig.get("/api/v1/nodes")
    # The page asks for the rows it shows only; the counts are still the fleet's.
    _, first = await rig.get("/api/v1/nodes?limit=2")
    assert [n["name"] for n in first["nodes"]] == ["sick", "gone"]
    assert first["counts"] == body["counts"]


async def test_a_silent_node_turns_stale(rig: Rig) -> None:
    rig.send("state", msg.state("n1", when=rig.agg.clock() - 61))
    _, body = await rig.get("/api/v1/nodes")
    assert body["nodes"][0]["stale"] is True


async def test_one_node_with_status_replies_and_404(rig: Rig) -> None:
    rig.send("state", msg.state("n1"))
    rig.send("replies", msg.reply("n1", "cmd-1"))
    status, body = await rig.get("/api/v1/nodes/n1")
    assert status == 200
    assert body["status"]["node"]["name"] == "n1"
    assert [r["command_id"] for r in body["replies"]] == ["cmd-1"]
    status, body = await rig.get("/api/v1/nodes/nope")
    assert (status, body) == (404, {"error": "unknown node 'nope'"})


async def test_a_name_in_two_clusters_needs_cluster(rig: Rig) -> None:
    rig.send("state", msg.state("n1", cluster="a", health="WARN"))
    rig.send("state", msg.state("n1", cluster="b"))
    status, body = await rig.get("/api/v1/nodes/n1")
    assert status == 400
    assert "?cluster=" in body["error"]
    status, body = await rig.get("/api/v1/nodes/n1?cluster=a")
    assert (status, body["health"]) == (200, "WARN")


async def test_events_actions_and_cordons(rig: Rig) -> None:
    now = rig.agg.clock()
    rig.send("events", msg.event("n1", when=now - 100))
    rig.send("events", msg.event("n1", when=now))
    rig.send("events", msg.event("n2", when=now))
    action = schema.envelope("action", "n1:audit:1", "n1", "c1")
    action["record"] = {"action": "cordon", "result": "started"}
    rig.send("actions", action)
    rig.send("actions", msg.cordon_request("n1"))
    await rig.agg.store.flush()
    _, body = await rig.get(f"/api/v1/events?node=n1&since={now - 10}&limit=5")
    assert [(e["node"], e["time"]) for e in body["events"]] == [("n1", now)]
    _, body = await rig.get("/api/v1/events?limit=2")
    assert len(body["events"]) == 2
    _, body = await rig.get("/api/v1/actions?node=n1")
    assert [a["record"]["action"] for a in body["actions"]] == ["cordon"]
    _, body = await rig.get("/api/v1/cordons")
    assert [(c["node"], c["decision"]) for c in body["cordons"]] == [("n1", "approved")]


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/events?limit=abc",
        "/api/v1/events?limit=0",
        "/api/v1/events?since=yesterday",
        "/api/v1/events?since=nan",
        "/api/v1/events?node=a/b",
        "/api/v1/actions?limit=99999999",
        "/api/v1/cordons?since=x",
        "/api/v1/nodes/n1?cluster=%23",
        "/api/v1/nodes?limit=0",
    ],
)
async def test_bad_query_parameters_are_400_and_counted(rig: Rig, path: str) -> None:
    status, body = await rig.get(path)
    assert status == 400
    assert body["error"]
    assert sum(rig.agg.state.counters.bad_requests.values()) == 1


async def test_commands_go_out_only_if_allowlisted(rig: Rig) -> None:
    rig.send("state", msg.state("n1"))
    status, body = await rig.post("/api/v1/nodes/n1/commands", {"command": "refresh"})
    assert status == 503  # no broker connection
    fake = Published()
    consumer = rig.agg.consumer

    async def publish(out: Outgoing) -> None:
        # No broker here, and the consumer's reconnect loop keeps clearing its client:
        # put the fake in place right before each publish (nothing runs in between).
        consumer._client = fake  # type: ignore[assignment]
        await type(consumer).publish(consumer, out)

    object.__setattr__(rig.agg.api, "publish", publish)
    status, body = await rig.post(
        "/api/v1/nodes/n1/commands", {"command": "run_checks", "args": {"checks": ["xid"]}}
    )
    assert status == 202
    ((topic, payload, qos),) = fake.messages
    sent = schema.decode(payload)
    assert (topic, qos, fake.expiry) == (msg.topic("n1", "cmd"), 1, [300])
    assert (sent["type"], sent["command"], sent["args"]) == (
        "command",
        "run_checks",
        {"checks": ["xid"]},
    )
    assert body["id"] == sent["id"]
    for bad in ({"command": "rm -rf /"}, {"command": "refresh", "args": [1]}, [1]):
        status, body = await rig.post("/api/v1/nodes/n1/commands", bad)
        assert status == 400, bad
    assert len(fake.messages) == 1
    assert rig.agg.state.counters.bad_requests["commands"] == 3
    status, _ = await rig.post("/api/v1/nodes/n9/commands", {"command": "refresh"})
    assert status == 404
    await rig.agg.store.flush()
    assert await rig.agg.store.count("commands") == 1


async def test_drift_flags_nodes_off_the_majority_fingerprint(rig: Rig) -> None:
    good = {"driver": "550.54", "kernel": "6.1", "vbios": "96.00"}
    odd = {**good, "driver": "535.104"}
    for i in range(3):
        rig.send("state", msg.state(f"n{i}", fingerprint=good))
    rig.send("state", msg.state("n3", fingerprint=odd))
    rig.send("state", msg.state("n4"))  # an agent that reports no fingerprint
    rig.send("state", msg.state("x1", cluster="other", fingerprint=odd))
    _, body = await rig.get("/api/v1/drift")
    c1, other = body["clusters"]
    assert c1["majority"] == "fp-550.54-6.1-96.00"
    assert [(f["fingerprint_id"], f["nodes"], f["majority"]) for f in c1["fingerprints"]] == [
        ("fp-550.54-6.1-96.00", 3, True),
        ("fp-535.104-6.1-96.00", 1, False),
    ]
    assert c1["fingerprints"][0]["fields"] == good
    assert c1["drifted_nodes"] == [
        {
            "node": "n3",
            "fingerprint_id": "fp-535.104-6.1-96.00",
            "differs": {"driver": {"majority": "550.54", "node": "535.104"}},
        }
    ]
    assert c1["unknown_nodes"] == ["n4"]
    assert (other["cluster"], other["drifted_nodes"]) == ("other", [])


async def test_metrics(rig: Rig) -> None:
    rig.send("state", msg.state("n1", fingerprint={"driver": "1"}))
    rig.send("state", msg.state("n2", health="CRITICAL"))
    rig.send("state", msg.state("n3"))
    rig.send("state", msg.offline("n3"))
    rig.send("events", msg.event("n1"))
    rig.agg.ingest.handle(msg.topic("n1", "events"), b"{")
    rig.send("actions", msg.cordon_request("n1"))
    rig.send("actions", msg.cordon_request("n2"))
    await rig.get("/api/v1/events?limit=x")
    _, text = await rig.get("/metrics")
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }

    def value(name: str, **labels: str) -> float:
        return samples[(name, tuple(sorted(labels.items())))]

    assert value("gpuagent_fleet_nodes", cluster="c1", health="OK") == 2
    assert value("gpuagent_fleet_nodes", cluster="c1", health="CRITICAL") == 1
    assert value("gpuagent_fleet_nodes_by_state", cluster="c1", state="online") == 2
    assert value("gpuagent_fleet_nodes_by_state", cluster="c1", state="offline") == 1
    assert value("gpuagent_fleet_events_received_total", category="kernel") == 1
    assert value("gpuagent_fleet_messages_received_total", type="state") == 4
    assert value("gpuagent_fleet_messages_rejected_total", reason="malformed") == 1
    assert value("gpuagent_fleet_cordon_decisions_total", cluster="c1", decision="approved") == 2
    assert value("gpuagent_fleet_cordon_budget_remaining", cluster="c1") == 0
    assert value("gpuagent_fleet_fingerprint_nodes", cluster="c1", fingerprint="fp-1") == 1
    assert value("gpuagent_fleet_fingerprint_nodes", cluster="c1", fingerprint="unknown") == 2
    assert value("gpuagent_fleet_api_bad_requests_total", endpoint="events") == 1
    assert value("gpuagent_fleet_mqtt_connected") == 0
    documented = (REPO / "docs" / "metrics.md").read_text()
    families = {f.name for f in text_string_to_metric_families(text)}
    assert {
        f for f in families if f"`{f}`" not in documented and f"`{f}_total`" not in documented
    } == set()


def in_domain(node: str, domain: str) -> dict[str, Any]:
    """A state report of ``node``: GPUs 0 and 1 in the NVLink domain ``domain``."""
    gpus = [msg.gpu_doc(i) for i in range(2)]
    for gpu in gpus:
        gpu["fabric"] = {"state": "completed", "nvlink_domain": domain}
    return msg.state(node, gpus=gpus)


def xid_event(node: str, index: int, code: int, text: str) -> dict[str, Any]:
    message = msg.event(node)
    bus = msg.gpu_doc(index)["pci_bus_id"]
    line = f"NVRM: Xid (PCI:{bus[:-2]}): {code}, pid=8123, name=python3, {text}"
    message["data"] = {"kind": "xid", "code": code, "gpu": bus, "line": line}
    return message


LINK_DOWN = "NETIR_LINK_EVT Fatal XC0 i0 Link 14"


async def test_fleet_incident_metrics(rig: Rig) -> None:
    """Open incidents by cluster and root, each node's GPUs in each by role, incidents
    opened and cordon requests held."""
    domain, other = "uuid-a/7", "uuid-b/7"
    for node in ("n0", "n1", "n2"):
        rig.send("state", in_domain(node, domain))
    rig.send("state", in_domain("x0", other))
    rig.send("state", msg.state("y0", cluster="c2"))
    # n2's GPU 1 reports a DBE before the link fails on n0: a fault of its own.
    rig.send("events", xid_event("n2", 1, 48, "An uncorrectable double bit error (DBE)"))
    rig.send("events", xid_event("n0", 0, 149, LINK_DOWN))
    for node, index in (("n1", 0), ("n1", 1), ("n2", 0)):
        rig.send("events", xid_event(node, index, 145, "RLW_TAGSTATE Fatal XC0 i0 Link 03"))
    # Two links of another domain at once: no GPU is the root.
    for index in (0, 1):
        rig.send("events", xid_event("x0", index, 149, LINK_DOWN))
    rig.send("actions", msg.cordon_request("n1"))  # held for the domain to settle
    assert rig.agg.correlator is not None
    (incident,) = [i for i in rig.agg.correlator.open_incidents() if i.key.endswith(domain)]
    _, text = await rig.get("/metrics")
    families = {f.name: f for f in text_string_to_metric_families(text)}
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in families.values()
        for s in family.samples
    }

    def value(name: str, **labels: str) -> float:
        return samples[(name, tuple(sorted(labels.items())))]

    assert value("gpuagent_fleet_incidents", cluster="c1", state="open", root_unknown="false") == 1
    assert value("gpuagent_fleet_incidents", cluster="c1", state="open", root_unknown="true") == 1
    # A cluster without one reads 0.
    assert value("gpuagent_fleet_incidents", cluster="c2", state="open", root_unknown="true") == 0
    members = {
        (s.labels["node"], s.labels["role"]): s.value
        for s in families["gpuagent_fleet_incident_members"].samples
        if s.labels["incident"] == incident.id
    }
    assert members == {
        ("n0", "root"): 1,
        ("n1", "consequence"): 2,
        ("n2", "consequence"): 1,
        ("n2", "unrelated"): 1,
    }
    labels = {
        s.labels["nvlink_domain"]
        for s in families["gpuagent_fleet_incident_members"].samples
        if s.labels["incident"] == incident.id
    }
    assert labels == {domain}
    assert value("gpuagent_fleet_incidents_opened_total") == 2
    assert value("gpuagent_fleet_cordons_held_total") == 1
    # Each help text is in docs/metrics.md as it is.
    documented = (REPO / "docs" / "metrics.md").read_text()
    for name in (
        "gpuagent_fleet_incidents",
        "gpuagent_fleet_incident_members",
        "gpuagent_fleet_incidents_opened",
        "gpuagent_fleet_cordons_held",
    ):
        assert families[name].documentation in documented, name


async def test_without_correlation_there_are_no_incident_metrics(tmp_path: Path) -> None:
    async with running(tmp_path, correlation=CorrelationSection(enabled=False)) as rig:
        rig.send("state", msg.state("n1"))
        _, text = await rig.get("/metrics")
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert "gpuagent_fleet_incidents" not in families
    assert "gpuagent_fleet_incident_members" not in families
    assert "gpuagent_fleet_incidents_opened" not in families
    assert families["gpuagent_fleet_cordons_held"].samples[0].value == 0


async def test_the_page_is_self_contained(rig: Rig) -> None:
    status, text = await rig.get("/")
    assert status == 200
    assert "<h2>Drift</h2>" in text
    # The SVG namespace is a name, never fetched; anything else with a scheme would be.
    text = text.replace('"http://www.w3.org/2000/svg"', "SVG_NAMESPACE")
    assert "http://" not in text
    assert "https://" not in text
    assert "<link" not in text
    assert "src=" not in text


async def test_close_is_bounded(tmp_path: Path) -> None:
    agg = Aggregator(msg.config(tmp_path, port=free_port()))
    await agg.start()
    agg.ingest.handle(msg.topic("n1", "state"), schema.encode(msg.state("n1")))
    started = asyncio.get_running_loop().time()
    await agg.close()
    assert asyncio.get_running_loop().time() - started < 3
    again = Aggregator(msg.config(tmp_path, port=free_port()))
    await again.start()
    assert list(again.state.nodes) == [("c1", "n1")]  # written on the way out
    await again.close()


async def test_a_restart_does_not_reopen_a_spent_budget(tmp_path: Path) -> None:
    config = msg.config(tmp_path, port=free_port(), max_nodes=1)
    agg = Aggregator(config)
    await agg.start()
    for node in ("n1", "n2"):
        agg.ingest.handle(msg.topic(node, "state"), schema.encode(msg.state(node)))
    agg.ingest.handle(msg.topic("n1", "actions"), schema.encode(msg.cordon_request("n1")))
    await agg.close()
    again = Aggregator(config)
    await again.start()
    try:
        assert again.budget.remaining("c1", 2, again.clock()) == 0
        (answer,) = again.ingest.handle(
            msg.topic("n2", "actions"), schema.encode(msg.cordon_request("n2"))
        )
        assert schema.decode(answer.payload)["decision"] == "denied"
        uncordon = msg.cordon_request("n1", action="uncordon")
        again.ingest.handle(msg.topic("n1", "actions"), schema.encode(uncordon))
    finally:
        await again.close()
    third = Aggregator(config)
    await third.start()
    try:
        assert third.budget.remaining("c1", 2, third.clock()) == 1  # the uncordon released it
    finally:
        await third.close()


async def test_commands_need_the_token_when_one_is_configured(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("s3cret\n")
    port = free_port()
    agg = Aggregator(msg.config(tmp_path, port=port, command_token_file=str(token_file)))
    await agg.start()
    sent: list[object] = []

    async def publish(out: object) -> None:
        sent.append(out)

    object.__setattr__(agg.api, "publish", publish)  # no broker here: capture instead
    url = f"http://127.0.0.1:{port}/api/v1/nodes/n1/commands"
    try:
        agg.ingest.handle(msg.topic("n1", "state"), schema.encode(msg.state("n1")))
        async with aiohttp.ClientSession() as session:
            for headers, expected in (
                ({}, 401),
                ({"Authorization": "Bearer wrong"}, 401),
                ({"Authorization": "Bearer s3cret"}, 202),
            ):
                async with session.post(url, json={"command": "refresh"}, headers=headers) as r:
                    assert r.status == expected, headers
    finally:
        await agg.close()
    assert len(sent) == 1
    assert agg.state.counters.bad_requests["commands"] == 2


@pytest.mark.parametrize(
    ("remote", "allowed"),
    [
        ("127.0.0.1", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),
        ("10.0.0.7", False),
        ("::ffff:10.0.0.7", False),
        (None, False),
    ],
)
def test_loopback_peers_are_recognised(remote: str | None, allowed: bool) -> None:
    """Loopback peers get their local uid looked up for the audit log (no longer a way
    around the token)."""
    from gpuagent.aggregator.http import _loopback  # noqa: PLC0415

    assert _loopback(remote) is allowed


async def test_nan_and_infinity_from_a_node_are_served_as_null(rig: Rig) -> None:
    """Python's JSON reads NaN and Infinity, JSON itself has neither: one node's NaN must
    not make the whole fleet's answer unreadable to a browser."""
    evidence = {"temperature_c": float("nan"), "limits": [float("inf"), 1.5]}
    bad = {**msg.finding("thermal", "WARN", "hot"), "evidence": evidence}
    message = msg.state("n1", health="WARN", gpus=[msg.gpu_doc(0, "WARN", [bad])])
    raw = json.dumps(message)  # as a node's JSON library may write it: NaN, Infinity
    assert "NaN" in raw
    # Straight into the state and the store, whatever the ingest would let through.
    rig.agg.state.put(from_online_state(message, raw, rig.agg.clock()))
    event = msg.event("n1")
    event["data"]["value"] = float("-inf")
    rig.agg.store.queue_event(event, json.dumps(event))
    await rig.agg.store.flush()

    async def strict(path: str) -> Any:
        async with rig.session.get(rig.base + path) as response:
            assert response.status == 200
            text = await response.text()
        return json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in {path}"))

    cleaned = {"temperature_c": None, "limits": [None, 1.5]}
    (node,) = (await strict("/api/v1/nodes"))["nodes"]
    assert node["gpus"][0]["findings"][0]["evidence"] == cleaned
    detail = await strict("/api/v1/nodes/n1")
    assert detail["gpus"][0]["findings"][0]["evidence"] == cleaned
    assert detail["status"]["gpus"][0]["findings"][0]["evidence"] == cleaned
    (stored,) = (await strict("/api/v1/events"))["events"]
    assert stored["data"]["value"] is None


@pytest.mark.parametrize(
    ("content_type", "status"),
    [
        ("text/plain", 415),
        ("application/x-www-form-urlencoded", 415),
        ("multipart/form-data; boundary=x", 415),
        (None, 415),
        ("application/json; charset=utf-8", 202),
    ],
)
async def test_commands_must_be_sent_as_json(
    tmp_path: Path, content_type: str | None, status: int
) -> None:
    """A page in a browser on the aggregator's host may POST text/plain cross-origin without
    a preflight; only JSON is taken."""
    port = free_port()
    agg = Aggregator(msg.config(tmp_path, port=port))
    await agg.start()
    sent: list[object] = []

    async def publish(out: object) -> None:
        sent.append(out)

    object.__setattr__(agg.api, "publish", publish)  # no broker here: capture instead
    headers = {**msg.AUTH, **({} if content_type is None else {"Content-Type": content_type})}
    try:
        agg.ingest.handle(msg.topic("n1", "state"), schema.encode(msg.state("n1")))
        async with (
            aiohttp.ClientSession(skip_auto_headers=["Content-Type"]) as session,
            session.post(
                f"http://127.0.0.1:{port}/api/v1/nodes/n1/commands",
                data=b'{"command": "refresh"}',
                headers=headers,
            ) as response,
        ):
            assert response.status == status
            body = await response.json()
    finally:
        await agg.close()
    if status == 415:
        assert sent == []
        assert "application/json" in body["error"]
        assert agg.state.counters.bad_requests["commands"] == 1
    else:
        assert len(sent) == 1


async def test_the_pages_answers_carry_an_etag_and_304_when_unchanged(rig: Rig) -> None:
    """The console refreshes every few seconds; an unchanged fleet costs a 304, no body."""
    rig.send("state", msg.state("n1"))
    for path in ("/api/v1/fleet", "/api/v1/fleet/n1", "/api/v1/events", "/api/v1/drift"):
        async with rig.session.get(rig.base + path) as first:
            assert first.status == 200, path
            etag = first.headers["ETag"]
            body = await first.read()
        headers = {"If-None-Match": etag}
        async with rig.session.get(rig.base + path, headers=headers) as again:
            assert again.status == 304, path
            assert await again.read() == b""
            assert again.headers["ETag"] == etag
        assert body
    # A change is a new answer.
    rig.send("state", msg.state("n1", health="WARN"))
    async with rig.session.get(rig.base + "/api/v1/fleet") as first:
        etag = first.headers["ETag"]
    rig.send("state", msg.state("n2"))
    async with rig.session.get(
        rig.base + "/api/v1/fleet", headers={"If-None-Match": etag}
    ) as changed:
        assert changed.status == 200
        assert changed.headers["ETag"] != etag
        assert "n2" in await changed.text()


async def test_the_cordon_budget_shows_who_holds_it_and_when_it_frees(rig: Rig) -> None:
    for node in ("n1", "n2", "n3"):
        rig.send("state", msg.state(node))
    before = rig.agg.clock()
    rig.send("actions", msg.cordon_request("n1"))
    rig.send("actions", msg.cordon_request("n2"))
    after = rig.agg.clock()
    status, body = await rig.get("/api/v1/budget")
    assert status == 200
    assert (body["source"], body["max_nodes"], body["window_seconds"]) == ("memory", 2, 3600.0)
    (c1,) = body["clusters"]
    holders = c1.pop("holders")
    first = holders[0]["approved_at"]
    assert before <= first <= holders[1]["approved_at"] <= after
    assert c1 == {
        "cluster": "c1",
        "nodes": 3,
        "limit": 2,
        "used": 2,
        "remaining": 0,
        "spent": True,
        "next_free_at": first + 3600.0,
    }
    assert [(h["node"], h["frees_at"] - h["approved_at"]) for h in holders] == [
        ("n1", 3600.0),
        ("n2", 3600.0),
    ]
    # Unchanged: a 304, as the console polls it.
    async with rig.session.get(rig.base + "/api/v1/budget") as first_answer:
        etag = first_answer.headers["ETag"]
    async with rig.session.get(
        rig.base + "/api/v1/budget", headers={"If-None-Match": etag}
    ) as again:
        assert again.status == 304
    # An uncordon frees its slot at once.
    rig.send("actions", msg.cordon_request("n1", action="uncordon"))
    _, body = await rig.get("/api/v1/budget")
    (c1,) = body["clusters"]
    assert (c1["used"], c1["remaining"], c1["spent"], c1["next_free_at"]) == (1, 1, False, None)
    assert [h["node"] for h in c1["holders"]] == ["n2"]


async def test_an_aggregator_that_is_not_the_arbiter_has_no_budget_to_show(
    tmp_path: Path,
) -> None:
    async with running(tmp_path, arbiter=False) as rig:
        rig.send("state", msg.state("n1"))
        status, body = await rig.get("/api/v1/budget")
    assert status == 200
    assert (body["source"], body["clusters"]) == ("none", [])
