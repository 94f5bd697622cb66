"""The aggregator against a real mosquitto: TLS with client certificates and the shipped
ACL, Last Will, duplicates, garbage, shared subscriptions, the fleet cordon budget."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import aiomqtt
import pytest

import aggregator_support as msg
from fleet_support import aggregator, node_client, publish, until
from gpuagent.aggregator.service import Aggregator
from gpuagent.fleet import schema
from gpuagent.fleet.connection import client_options
from mqtt_broker import Broker, shipped_settings

pytestmark = pytest.mark.integration


async def api_nodes(agg: Aggregator) -> list[dict[str, Any]]:
    async with aiohttp.ClientSession() as session:
        url = f"http://{agg.config.listen}/api/v1/nodes"
        async with session.get(url) as response:
            body = await response.json()
    nodes: list[dict[str, Any]] = body["nodes"]
    return nodes


async def test_a_state_report_is_in_the_api_within_two_seconds(
    tmp_path: Path, mqtt_broker: Broker
) -> None:
    async with aggregator(tmp_path, mqtt_broker) as agg, node_client(mqtt_broker, "n1") as n1:
        await publish(n1, "state", msg.state("n1", health="WARN"))

        async def visible() -> bool:
            return [(n["name"], n["health"]) for n in await api_nodes(agg)] == [("n1", "WARN")]

        await until(visible, timeout=2.0)


_WILL_SCRIPT = """
import asyncio, sys, aiomqtt
from gpuagent.fleet import schema
from gpuagent.fleet.connection import client_options
from gpuagent.config import MqttConnection
import json
conn = MqttConnection(**json.loads(sys.argv[1]))
will = aiomqtt.Will("gpuagent/v1/c1/n1/state",
                    schema.encode(schema.offline_message("n1", "c1", "connection lost")), 1, True)
async def main():
    async with aiomqtt.Client(**client_options(conn, client_id="n1", will=will)) as c:
        await c.publish("gpuagent/v1/c1/n1/state", schema.encode(schema.envelope("state",
            "n1:state:1", "n1", "c1") | {"online": True, "status": {"node": {"health": "OK"}}}),
            qos=1, retain=True)
        print("up", flush=True)
        await asyncio.sleep(60)
asyncio.run(main())
"""


async def test_the_last_will_marks_a_node_offline(tmp_path: Path, mqtt_broker: Broker) -> None:
    conn = mqtt_broker.connection("n1").__dict__
    async with aggregator(tmp_path, mqtt_broker) as agg:
        node = subprocess.Popen(
            [sys.executable, "-c", _WILL_SCRIPT, json.dumps(conn)],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert node.stdout is not None
            assert (await asyncio.to_thread(node.stdout.readline)).strip() == "up"
            await until(lambda: ("c1", "n1") in agg.state.nodes)
            assert agg.state.nodes[("c1", "n1")].online
            node.kill()  # no DISCONNECT: the mqtt_broker publishes the will
        finally:
            node.kill()
            node.wait()
            if node.stdout is not None:
                node.stdout.close()
        await until(lambda: not agg.state.nodes[("c1", "n1")].online)
        (shown,) = await api_nodes(agg)
        assert (shown["online"], shown["reason"]) == (False, "connection lost")


async def test_duplicates_and_garbage_over_mqtt(tmp_path: Path, mqtt_broker: Broker) -> None:
    async with aggregator(tmp_path, mqtt_broker) as agg, node_client(mqtt_broker, "n1") as n1:
        event = msg.event("n1", "n1:boot:7")
        await publish(n1, "events", event)
        await publish(n1, "events", event)
        garbage = [
            b"{nope",
            b"x" * (schema.MAX_PAYLOAD_BYTES + 10),
            json.dumps({"schema": 1, "type": "teleport"}).encode(),
            schema.encode(msg.event("n2")),  # n1 speaking for n2
        ]
        for payload in garbage:
            await n1.publish(msg.topic("n1", "events"), payload, qos=1)
        await publish(n1, "events", msg.event("n1", "n1:boot:8"))
        counters = agg.state.counters
        await until(lambda: counters.events["kernel"] == 2 and sum(counters.rejected.values()) == 4)
        assert counters.rejected == {
            "malformed": 1,
            "oversized": 1,
            "unknown_type": 1,
            "foreign": 1,
        }
        assert counters.duplicates == {"event": 1}
        await agg.store.flush()
        assert await agg.store.count("events") == 2


async def test_the_acl_keeps_a_node_to_its_own_topics(tmp_path: Path, mqtt_broker: Broker) -> None:
    async with aggregator(tmp_path, mqtt_broker) as agg, node_client(mqtt_broker, "n1") as n1:
        # The mqtt_broker drops what n1 publishes as n2; the aggregator never sees it.
        await publish(n1, "state", msg.state("n2"))
        await publish(n1, "state", msg.state("n1"))
        await until(lambda: ("c1", "n1") in agg.state.nodes)
        assert ("c1", "n2") not in agg.state.nodes


async def test_a_share_group_gives_each_message_to_exactly_one_aggregator(
    tmp_path: Path, mqtt_broker: Broker
) -> None:
    async with (
        aggregator(tmp_path, mqtt_broker, "a", share_group="fleet") as a,
        aggregator(tmp_path, mqtt_broker, "b", share_group="fleet") as b,
        node_client(mqtt_broker, "n1") as n1,
    ):
        ids = [f"n1:ev:{i}" for i in range(40)]
        for event_id in ids:
            await publish(n1, "events", msg.event("n1", event_id))
        total = lambda: a.state.counters.events["kernel"] + b.state.counters.events["kernel"]  # noqa: E731
        await until(lambda: total() == 40)
        # Markers after the 40, until each aggregator has had one: the broker sends a client
        # its messages in order, so whatever of the 40 it gave either one twice is in then.
        markers: list[str] = []
        marked: set[str] = set()
        while marked != {"a", "b"}:
            assert len(markers) < 20, "the share group gave every marker to one aggregator"
            before = (a.state.counters.events["kernel"], b.state.counters.events["kernel"])
            markers.append(f"n1:marker:{len(markers)}")
            await publish(n1, "events", msg.event("n1", markers[-1]))
            await until(lambda: total() >= 40 + len(markers))
            marked |= {"a"} if a.state.counters.events["kernel"] > before[0] else set()
            marked |= {"b"} if b.state.counters.events["kernel"] > before[1] else set()
        assert total() == 40 + len(markers)
        await a.store.flush()
        await b.store.flush()
        got_a = {e["id"] for e in await a.store.events(node="n1", since=None, limit=100)}
        got_b = {e["id"] for e in await b.store.events(node="n1", since=None, limit=100)}
        assert got_a | got_b == set(ids) | set(markers)
        assert got_a.isdisjoint(got_b)
        assert got_a - set(markers)
        assert got_b - set(markers)


async def ask_for_cordons(
    broker: Broker, nodes: list[str], *aggregators: Aggregator
) -> dict[str, dict[str, Any]]:
    """Every node reports, then, once the ``aggregators`` have all the reports, all ask for
    a cordon at once; their decisions by node."""
    decisions: dict[str, dict[str, Any]] = {}
    clients = []
    try:
        for node in nodes:
            client = aiomqtt.Client(**client_options(broker.connection(node), client_id=node))
            await client.__aenter__()
            clients.append(client)
            await client.subscribe(msg.topic(node, "cmd"), qos=1)
            await publish(client, "state", msg.state(node))
        reported = {("c1", node) for node in nodes}
        await until(lambda: reported <= {key for agg in aggregators for key in agg.state.nodes})
        await asyncio.gather(
            *(
                publish(c, "actions", msg.cordon_request(n))
                for c, n in zip(clients, nodes, strict=True)
            )
        )

        async def receive(client: aiomqtt.Client, node: str) -> None:
            async for message in client.messages:
                assert isinstance(message.payload, bytes)
                decisions[node] = schema.decode(message.payload)
                return

        await asyncio.wait_for(
            asyncio.gather(*(receive(c, n) for c, n in zip(clients, nodes, strict=True))), 5
        )
    finally:
        for client in clients:
            await client.__aexit__(None, None, None)
    assert all(d["type"] == "cordon_decision" for d in decisions.values())
    assert all(d["node"] == node for node, d in decisions.items())
    return decisions


async def test_the_fleet_cordon_budget_end_to_end(tmp_path: Path, mqtt_broker: Broker) -> None:
    nodes = [f"gpu{i}" for i in range(5)]
    async with aggregator(tmp_path, mqtt_broker, max_nodes=2) as agg:
        decisions = await ask_for_cordons(mqtt_broker, nodes, agg)
        assert len(agg.state.nodes) == 5
    results = sorted(d["decision"] for d in decisions.values())
    assert results == ["approved", "approved", "denied", "denied", "denied"]
    denied = [d for d in decisions.values() if d["decision"] == "denied"]
    assert all(d["retry_after_seconds"] > 3500 for d in denied)


async def test_one_arbiter_decides_for_a_share_group(tmp_path: Path, mqtt_broker: Broker) -> None:
    """Two aggregators split the fleet's messages; only the arbiter decides cordons, so the
    budget holds for the group as a whole."""
    nodes = [f"gpu{i}" for i in range(5)]
    # "b" ran as the arbiter before: its session still holds that subscription.
    async with aggregator(tmp_path, mqtt_broker, "b", share_group="fleet"):
        pass
    async with (
        aggregator(tmp_path, mqtt_broker, "a", share_group="fleet", max_nodes=2) as a,
        aggregator(tmp_path, mqtt_broker, "b", share_group="fleet", arbiter=False) as b,
    ):
        decisions = await ask_for_cordons(mqtt_broker, nodes, a, b)
        # The reports were split between the two.
        assert a.state.nodes
        assert b.state.nodes
        assert sum(b.state.counters.decisions.values()) == 0
        assert b.state.counters.received["cordon_request"] == 0
        assert (
            sorted(d["decision"] for d in decisions.values()) == ["approved"] * 2 + ["denied"] * 3
        )
        assert a.state.counters.decisions == {("c1", "approved"): 2, ("c1", "denied"): 3}


async def test_the_aggregator_reconnects_after_a_broker_outage(
    tmp_path: Path, mqtt_broker: Broker
) -> None:
    async with aggregator(tmp_path, mqtt_broker) as agg:
        await asyncio.to_thread(mqtt_broker.restart)
        await until(lambda: agg.state.connected, timeout=10)
        async with node_client(mqtt_broker, "n1") as n1:
            await publish(n1, "state", msg.state("n1"))
            await until(lambda: ("c1", "n1") in agg.state.nodes)


async def test_the_real_agent_reports_to_the_aggregator(
    tmp_path: Path, mqtt_broker: Broker, run_daemon: Callable[..., Any]
) -> None:
    """The agent's own reporter (simulated 8-GPU node, TLS, its own certificate) and the
    aggregator agree on the schema: the node, its GPUs and fingerprint, a fault, a
    command and its reply, and the Last Will."""
    reporter = mqtt_broker.agent_config("e2e-node")
    scenario = '[node]\ngpus = 8\nmodel = "NVIDIA H100 80GB HBM3"\n'
    async with aggregator(tmp_path, mqtt_broker) as agg:
        daemon = await asyncio.to_thread(
            run_daemon, scenario, config_extra=reporter, node_name="e2e-node"
        )
        key_ = ("default", "e2e-node")
        await until(lambda: key_ in agg.state.nodes, timeout=10)
        (node,) = await api_nodes(agg)
        assert (node["name"], node["online"], len(node["gpus"])) == ("e2e-node", True, 8)
        assert node["fingerprint_id"] != "unknown"
        await asyncio.to_thread(daemon.inject, "ecc_dbe", 3, count=1)
        await until(lambda: agg.state.nodes[key_].health == "CRITICAL", timeout=10)
        await until(lambda: agg.state.counters.events["finding"] >= 1, timeout=10)
        async with aiohttp.ClientSession() as session:
            url = f"http://{agg.config.listen}/api/v1/nodes/e2e-node/commands"
            async with session.post(url, json={"command": "refresh"}, headers=msg.AUTH) as response:
                assert response.status == 202
                command_id = (await response.json())["id"]
        await until(
            lambda: any(r["command_id"] == command_id for r in agg.state.replies.get(key_, ())),
            timeout=10,
        )
        daemon.kill()
        await until(lambda: not agg.state.nodes[key_].online, timeout=10)
        assert agg.state.nodes[key_].reason == "connection lost"
        assert agg.state.counters.rejected == {}


async def test_a_message_not_yet_stored_when_the_aggregator_dies_comes_again(
    tmp_path: Path, mqtt_broker: Broker
) -> None:
    """Messages are acknowledged only once stored: one the aggregator received but had not
    written when it died is delivered again to its next session, and stored then."""

    async def lost() -> None:  # the writer never gets to it: as if killed first
        return

    async with aggregator(tmp_path, mqtt_broker, "a") as agg:
        agg.store.flush = lost  # type: ignore[method-assign]
        async with node_client(mqtt_broker, "n1") as n1:
            await publish(n1, "events", msg.event("n1", "n1:boot:1"))
            await until(lambda: agg.state.counters.events["kernel"] == 1)
    async with aggregator(tmp_path, mqtt_broker, "a") as again:
        await until(lambda: again.state.counters.events["kernel"] == 1)
        await again.store.flush()
        assert [e["id"] for e in await again.store.events(node=None, since=None, limit=10)] == [
            "n1:boot:1"
        ]


async def test_a_command_expires_while_its_node_is_away(
    tmp_path: Path, mqtt_broker: Broker
) -> None:
    """Nodes keep their session for a day: without an expiry, a command sent while a node is
    away would be carried out whenever it comes back."""
    options = client_options(mqtt_broker.connection("n1"), client_id="n1")  # a persistent session
    async with aiomqtt.Client(**options) as n1:
        await n1.subscribe(msg.topic("n1", "cmd"), qos=1)
    async with (
        aggregator(tmp_path, mqtt_broker, command_expiry_seconds=2) as agg,
        aiohttp.ClientSession() as session,
    ):
        agg.ingest.handle(msg.topic("n1", "state"), schema.encode(msg.state("n1")))
        url = f"http://{agg.config.listen}/api/v1/nodes/n1/commands"

        async def send() -> str:
            async with session.post(url, json={"command": "refresh"}, headers=msg.AUTH) as response:
                assert response.status == 202
                command_id: str = (await response.json())["id"]
                return command_id

        await send()
        await asyncio.sleep(3.0)  # the node is away past the expiry: time has to pass
        fresh = await send()
        async with aiomqtt.Client(**options) as n1:
            messages = aiter(n1.messages)
            message = await asyncio.wait_for(anext(messages), 5)
            assert isinstance(message.payload, bytes)
            assert schema.decode(message.payload)["id"] == fresh  # not the expired one
            assert message.properties is not None
            assert 0 < message.properties.MessageExpiryInterval <= 2
            # A command sent now comes next: nothing else was queued for the node.
            marker = await send()
            message = await asyncio.wait_for(anext(messages), 5)
            assert isinstance(message.payload, bytes)
            assert schema.decode(message.payload)["id"] == marker


def _worst_8_gpu_scenario() -> str:
    """An 8-GPU node with about everything wrong at once: MIG on with seven instances per
    GPU, every fault kind that adds to its report, all NVLinks down, 16 long-named processes
    on every GPU. Its state report is the largest an 8-GPU node sends. (No retired pages:
    an H100 remaps rows instead and reports Retired Pages as N/A.)"""
    lines = [
        '[node]\ngpus = 8\nmodel = "NVIDIA H100 80GB HBM3"\nmig_mode = true',
        f"mig_profiles = {json.dumps(['1g.10gb'] * 7)}",
        'nvswitches = 4\nfabric_state = "completed"\npersistenced = "failed"',
        'fabricmanager = "failed"\nmodule_version = "550.90.07"',
    ]
    reasons = ["sw_power_cap", "hw_slowdown", "sw_thermal", "hw_thermal", "power_brake"]
    for gpu in range(8):
        faults = [
            'kind = "ecc_dbe"\ncount = 3',
            'kind = "ecc_sbe"\ncount = 500',
            'kind = "row_remap_pending"\nrows = 2',
            'kind = "temperature"\ncelsius = 95',
            f'kind = "throttle"\nreasons = {json.dumps(reasons)}',
            'kind = "pcie_degrade"\ngen = 3\nwidth = 8',
            'kind = "pcie_replay"\ncount = 1000',
            'kind = "persistence_off"',
            'kind = "power_limit"\nwatts = 300',
            'kind = "app_clocks"\nmhz = 1000',
            'kind = "fabric"\nstate = "completed"\nok = false',
            'kind = "ecc_mode"\nenabled = false',
            *(f'kind = "nvlink_down"\nlink = {link}' for link in range(18)),
            *(
                f'kind = "process"\npid = {1000 + 100 * gpu + p}\nused_mib = 4000\n'
                f'name = "/opt/conda/envs/train/bin/python3.11 -m torch.distributed.run '
                f'--nproc-per-node 8 /home/someone/experiments/train_{p}.py"'
                for p in range(16)
            ),
        ]
        lines += [f"[[fault]]\ngpu = {gpu}\n{fault}" for fault in faults]
    return "\n".join(lines) + "\n"


async def test_the_largest_8_gpu_state_report_fits_the_shipped_packet_limit(
    tmp_path: Path, mqtt_broker: Broker
) -> None:
    scenario = tmp_path / "worst.toml"
    scenario.write_text(_worst_8_gpu_scenario())
    checked = subprocess.run(
        [sys.executable, "-m", "gpuagent", "check", "--json", "--simulate", str(scenario)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    status = json.loads(checked.stdout)
    assert len(status["gpus"]) == 8
    assert all(len(g["processes"]) == 16 for g in status["gpus"])
    assert status["node"]["inventory"]["gpus"][0]["mig"]["instances"] == ["1g.10gb"] * 7
    message = msg.state("n1")
    message["status"] = status
    size = len(schema.encode(message))
    (limit,) = [int(s.split()[1]) for s in shipped_settings()[0] if s.startswith("max_packet_")]
    assert size * 5 < limit, f"{size} bytes: raise max_packet_size in gpuagent.conf"
    async with aggregator(tmp_path, mqtt_broker) as agg, node_client(mqtt_broker, "n1") as n1:
        await publish(n1, "state", message)
        await until(lambda: ("c1", "n1") in agg.state.nodes)
        assert agg.state.nodes[("c1", "n1")].health == "CRITICAL"
