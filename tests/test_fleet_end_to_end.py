"""The fleet end to end: real agents (simulated GPUs) report through a real mosquitto with
TLS, client certificates and the shipped ACL to a real aggregator, whose API and page show
it. Outages of the broker and crashes of an agent lose nothing and double nothing."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from conftest import DaemonProcess, start_daemon
from fleet_support import H100, aggregator, chromium, live_page, until, xid_records
from mqtt_broker import Broker, wait_out_the_outage

pytestmark = pytest.mark.integration
Run = Callable[..., DaemonProcess]


async def _get(base: str, path: str) -> Any:
    async with aiohttp.ClientSession() as session, session.get(base + path) as response:
        assert response.status == 200, await response.text()
        return await response.json()


async def _node(base: str, name: str) -> dict[str, Any]:
    body: dict[str, Any] = await _get(base, f"/api/v1/nodes/{name}")
    return body


async def _kernel_event_ids(base: str, node: str) -> list[str]:
    body = await _get(base, f"/api/v1/events?node={node}&limit=10000")
    return [e["id"] for e in body["events"] if e["category"] == "kernel"]


_PAGE_ROWS = (
    "JSON.stringify([...document.querySelectorAll('#nodes tr.node')]"
    ".map(r => [r.dataset.node, r.children[2].textContent]))"
)


async def rows_are(
    rows: Callable[[], Awaitable[list[list[str]]]], expected: list[list[str]]
) -> bool:
    return await rows() == expected


async def test_two_agents_a_fault_in_seconds_and_the_last_will(
    tmp_path: Path, mqtt_broker: Broker, run_daemon: Run
) -> None:
    async with aggregator(tmp_path, mqtt_broker) as agg:
        base = f"http://{agg.config.listen}"
        nodes = {
            name: await asyncio.to_thread(
                run_daemon, H100, config_extra=mqtt_broker.agent_config(name), node_name=name
            )
            for name in ("gpu-a", "gpu-b")
        }
        for name in nodes:
            await until(lambda n=name: ("default", n) in agg.state.nodes, timeout=10)

        async with live_page(chromium(), base + "/", tmp_path) as page:

            async def rows() -> list[list[str]]:
                # (node, health) of each row of the page's node table, in order.
                shown = await page.evaluate(_PAGE_ROWS)
                return json.loads(shown) if shown else []

            await until(lambda: rows_are(rows, [["gpu-a", "OK"], ["gpu-b", "OK"]]), timeout=15)
            await asyncio.to_thread(nodes["gpu-b"].inject, "ecc_dbe", 5, count=1)

            async def critical_in_api() -> bool:
                return (await _node(base, "gpu-b"))["health"] == "CRITICAL"

            await until(critical_in_api, timeout=2.0)
            # The open page shows it too, unhealthy nodes first.
            await until(
                lambda: rows_are(rows, [["gpu-b", "CRITICAL"], ["gpu-a", "OK"]]), timeout=2.0
            )
        node = await _node(base, "gpu-b")
        (gpu,) = [g for g in node["gpus"] if g["health"] == "CRITICAL"]
        assert gpu["index"] == 5
        assert any(f["check"] == "ecc" for f in gpu["findings"])
        assert (await _node(base, "gpu-a"))["health"] == "OK"

        await asyncio.to_thread(nodes["gpu-a"].kill)
        await until(lambda: not agg.state.nodes[("default", "gpu-a")].online, timeout=10)
        assert (await _node(base, "gpu-a"))["online"] is False
        assert (await _node(base, "gpu-b"))["online"] is True


async def test_a_broker_outage_with_500_faults_delivers_each_exactly_once(
    tmp_path: Path, mqtt_broker: Broker, run_daemon: Run
) -> None:
    async with aggregator(tmp_path, mqtt_broker) as agg:
        base = f"http://{agg.config.listen}"
        daemon = await asyncio.to_thread(
            run_daemon, H100, config_extra=mqtt_broker.agent_config("gpu-c"), node_name="gpu-c"
        )
        await until(lambda: ("default", "gpu-c") in agg.state.nodes, timeout=10)
        bus = daemon.status()["gpus"][2]["pci_bus_id"]
        await asyncio.to_thread(mqtt_broker.save)  # the aggregator's session survives
        log_from = len(daemon.log())
        await asyncio.to_thread(mqtt_broker.kill)
        daemon.write_kernel_log(*xid_records(5000, 500, bus))
        await asyncio.to_thread(daemon.wait_for, lambda d: d["kmsg"]["records_read"] == 500, 20)
        # The outage lasts until the agent has spooled the 500 and been refused a reconnect.
        await asyncio.to_thread(wait_out_the_outage, daemon, 500, log_from)
        await asyncio.to_thread(mqtt_broker.start)

        async def arrived(count: int) -> bool:
            return len(await _kernel_event_ids(base, "gpu-c")) >= count

        await until(lambda: arrived(500), timeout=30)
        # One more fault, sent after the 500: once it is in, anything of theirs sent twice
        # went ahead of it and is in too.
        daemon.write_kernel_log(*xid_records(5500, 1, bus))
        await until(lambda: arrived(501), timeout=10)
        ids = await _kernel_event_ids(base, "gpu-c")
        assert len(ids) == 501
        assert len(set(ids)) == 501


async def test_an_agent_killed_with_its_spool_full_loses_nothing(
    tmp_path: Path, mqtt_broker: Broker, run_daemon: Run
) -> None:
    async with aggregator(tmp_path, mqtt_broker) as agg:
        base = f"http://{agg.config.listen}"
        config = mqtt_broker.agent_config("gpu-d")
        daemon = await asyncio.to_thread(run_daemon, H100, config_extra=config, node_name="gpu-d")
        await until(lambda: ("default", "gpu-d") in agg.state.nodes, timeout=10)
        bus = daemon.status()["gpus"][0]["pci_bus_id"]
        await asyncio.to_thread(mqtt_broker.save)
        await asyncio.to_thread(mqtt_broker.kill)
        daemon.write_kernel_log(*xid_records(9000, 200, bus))
        await asyncio.to_thread(daemon.wait_for, lambda d: d["kmsg"]["records_read"] == 200, 20)
        spool = "gpuagent_mqtt_spool_messages"  # written right after they are read
        await asyncio.to_thread(daemon.wait_for, lambda _d: daemon.metric(spool) >= 200, 10)
        daemon.kill()
        await asyncio.to_thread(mqtt_broker.start)
        restarted = await asyncio.to_thread(
            start_daemon, daemon.workdir, H100, config_extra=config, node_name="gpu-d"
        )
        try:

            async def all_arrived() -> bool:
                return len(await _kernel_event_ids(base, "gpu-d")) >= 200

            await until(all_arrived, timeout=30)
            ids = await _kernel_event_ids(base, "gpu-d")
            assert sorted(ids) == sorted(set(ids))
            assert len(ids) == 200
        finally:
            await asyncio.to_thread(restarted.stop)


async def test_drift_across_simulated_nodes_names_the_odd_one_out(
    tmp_path: Path, mqtt_broker: Broker, run_daemon: Run
) -> None:
    """Three simulated nodes, one of them on another driver: the aggregator's drift view
    groups them by fingerprint and flags that node, with the field that differs."""
    odd = H100 + 'driver_version = "550.90.07"\n'
    async with aggregator(tmp_path, mqtt_broker) as agg:
        base = f"http://{agg.config.listen}"
        for name, scenario in (("gpu-e", H100), ("gpu-f", H100), ("gpu-g", odd)):
            await asyncio.to_thread(
                run_daemon, scenario, config_extra=mqtt_broker.agent_config(name), node_name=name
            )
        await until(lambda: len(agg.state.nodes) == 3, timeout=15)
        (cluster,) = (await _get(base, "/api/v1/drift"))["clusters"]
        assert cluster["cluster"] == "default"
        assert [g["nodes"] for g in cluster["fingerprints"]] == [2, 1]
        (drifted,) = cluster["drifted_nodes"]
        assert drifted["node"] == "gpu-g"
        assert drifted["differs"]["driver"] == {"majority": "550.54.15", "node": "550.90.07"}
        assert cluster["unknown_nodes"] == []
