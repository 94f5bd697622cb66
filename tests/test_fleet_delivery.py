"""Nothing lost between a node and the aggregator, whatever the broker does: the drills of
docs/fleet.md ("What each failure can lose") with the real daemon, a real mosquitto with
the shipped configuration, ACL, TLS and certificates, and the real aggregator.

The broker's acknowledgement is not the end of a message: the node keeps it until the
aggregator says it stored it, so a broker that restarts, crashes, or has no subscriber
to give a message to (a shared subscription whose aggregators are away) costs a resend,
never the message.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import ssl
import time
from pathlib import Path
from typing import Any

import aiohttp
import paho.mqtt.client as mqtt
import pytest

from fleet_support import (
    FAST_RESEND,
    H100,
    Run,
    aggregator,
    kernel_events_awaiting_ack,
    metric_total,
    reporting_agent,
    second_gpu_bus,
    spool_empty,
    until,
    xid_records,
)
from gpuagent.config import MqttOutput
from gpuagent.fleet.reporter import Reporter
from gpuagent.model import GpuEvent
from mqtt_broker import Broker

pytestmark = pytest.mark.integration


async def _kernel_event_ids(base: str, node: str) -> list[str]:
    url = f"{base}/api/v1/events?node={node}&limit=10000"
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        assert response.status == 200, await response.text()
        body: dict[str, Any] = await response.json()
    return [e["id"] for e in body["events"] if e["category"] == "kernel"]


async def _exactly(base: str, node: str, count: int, timeout: float) -> None:
    """The aggregator stores ``count`` kernel events of ``node``, each once."""

    async def arrived() -> bool:
        return len(await _kernel_event_ids(base, node)) >= count

    await until(arrived, timeout=timeout)
    ids = await _kernel_event_ids(base, node)
    assert len(ids) == len(set(ids)) == count


@pytest.mark.parametrize("share_group", ["", "gpuagent"])
async def test_a_broker_restart_while_the_aggregator_is_away_loses_nothing(
    tmp_path: Path, mqtt_broker: Broker, run_daemon: Run, share_group: str
) -> None:
    """Aggregator away, broker restarted cleanly, 100 faults, then the aggregator starts:
    with a plain subscription the broker queued them; with a shared one it dropped them
    (mosquitto queues nothing for a share group none of whose members is connected), and
    the node sends them again."""
    async with aggregator(tmp_path, mqtt_broker, share_group=share_group):
        pass  # its session and subscriptions exist at the broker now
    daemon = await asyncio.to_thread(reporting_agent, run_daemon, mqtt_broker, "gpu-r")
    await asyncio.to_thread(mqtt_broker.stop)
    await asyncio.to_thread(mqtt_broker.start)
    daemon.write_kernel_log(*xid_records(100, 100, second_gpu_bus(daemon)))
    # The broker has all 100 before the aggregator comes back.
    await until(lambda: kernel_events_awaiting_ack(daemon, 100), timeout=20)
    async with aggregator(tmp_path, mqtt_broker, share_group=share_group) as agg:
        await _exactly(f"http://{agg.config.listen}", "gpu-r", 100, timeout=60)
        await until(lambda: spool_empty(daemon), timeout=10)


@pytest.mark.parametrize("share_group", ["", "gpuagent"])
async def test_a_broker_killed_while_everything_runs_loses_nothing(
    tmp_path: Path, mqtt_broker: Broker, run_daemon: Run, share_group: str
) -> None:
    """SIGKILL, never saved: the broker forgets every session, subscription and queued
    message. The agent reconnects before the aggregator has subscribed again (it backs off
    longer here) and publishes what it spooled meanwhile, to no subscriber: those go
    again, since the aggregator never acknowledged them."""
    async with aggregator(
        tmp_path, mqtt_broker, reconnect_seconds=6.0, share_group=share_group
    ) as agg:
        base = f"http://{agg.config.listen}"
        daemon = await asyncio.to_thread(reporting_agent, run_daemon, mqtt_broker, "gpu-k")
        await until(lambda: ("default", "gpu-k") in agg.state.nodes, timeout=10)
        bus = second_gpu_bus(daemon)
        daemon.write_kernel_log(*xid_records(1000, 200, bus))
        await _exactly(base, "gpu-k", 200, timeout=20)
        await asyncio.to_thread(mqtt_broker.kill)
        daemon.write_kernel_log(*xid_records(1200, 200, bus))
        await asyncio.to_thread(daemon.wait_for, lambda d: d["kmsg"]["records_read"] == 400, 20)
        await asyncio.to_thread(mqtt_broker.start)
        # The 200 of the outage, and any of the first 200 whose acknowledgement it lost.
        await until(lambda: kernel_events_awaiting_ack(daemon, 200), timeout=20)
        assert not agg.state.connected  # published before the aggregator was back
        daemon.write_kernel_log(*xid_records(1400, 200, bus))
        await _exactly(base, "gpu-k", 600, timeout=90)
        await until(lambda: spool_empty(daemon), timeout=10)


async def test_the_agent_reconnects_before_the_aggregator(
    tmp_path: Path, mqtt_broker: Broker, run_daemon: Run
) -> None:
    """The broker crashes and comes back; the agent is back first and publishes while the
    aggregator has no session at the broker: the messages wait in the agent's spool."""
    daemon = await asyncio.to_thread(reporting_agent, run_daemon, mqtt_broker, "gpu-f")
    async with aggregator(tmp_path, mqtt_broker, "a"):
        pass
    # Connected once before the crash (on a busy machine the first connection can come
    # after the aggregator's visit), so the one after it is the second.
    await asyncio.to_thread(
        daemon.wait_for, lambda _: metric_total(daemon, "gpuagent_mqtt_connections_total") >= 1, 20
    )
    await asyncio.to_thread(mqtt_broker.kill)
    await asyncio.to_thread(mqtt_broker.start)
    await asyncio.to_thread(
        daemon.wait_for, lambda _: metric_total(daemon, "gpuagent_mqtt_connections_total") >= 2, 20
    )
    daemon.write_kernel_log(*xid_records(200, 100, second_gpu_bus(daemon)))
    await until(lambda: kernel_events_awaiting_ack(daemon, 100), timeout=20)
    async with aggregator(tmp_path, mqtt_broker, "a") as agg:
        await _exactly(f"http://{agg.config.listen}", "gpu-f", 100, timeout=60)


async def test_a_restarted_agent_does_not_send_the_kernel_log_again(
    tmp_path: Path, mqtt_broker: Broker
) -> None:
    """An agent reads the kernel's whole /dev/kmsg buffer when it starts, so a restarted
    one offers every record of this boot again; the reporter (the real one, on the real
    broker, to the real aggregator) spools only those it had not spooled before: the
    aggregator sees no duplicate. (The daemon reads a test's kernel log from a file or
    FIFO, whose records carry no /dev/kmsg sequence to trust, so this drives the reporter
    with /dev/kmsg records directly.)"""
    config = MqttOutput(
        enabled=True, broker=mqtt_broker.connection("gpu-b"), ack_timeout_seconds=1.0
    )

    def record(sequence: int) -> GpuEvent:
        line = f"NVRM: Xid (PCI:0000:2a:00): 13, pid=7, name=job, record {sequence}"
        return GpuEvent(
            f"kmsg:boot-1:{sequence}",
            "kmsg",
            "xid",
            "0000:2a:00.0",
            1000.0 + sequence,
            1.0,
            code=13,
            line=line,
        )

    async def run_agent(records: range) -> None:
        reporter = Reporter(
            config, node="gpu-b", cluster="default", agent_version="1", state_dir=tmp_path / "state"
        )
        task = asyncio.create_task(reporter.run())
        try:
            for sequence in records:  # the whole buffer, as read at start
                reporter.offer_event(record(sequence))
            await until(lambda: reporter.connected, timeout=10)
            await _exactly(base, "gpu-b", records.stop - 1, timeout=30)
            await until(lambda: reporter.status().spool_depth == 0, timeout=10)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            reporter.close()

    async with aggregator(tmp_path, mqtt_broker) as agg:
        base = f"http://{agg.config.listen}"
        await run_agent(range(1, 101))
        await run_agent(range(1, 111))  # restarted: the same 100, then 10 new
        assert agg.state.counters.duplicates["event"] == 0


def _hostile(broker: Broker, identity: str, client_id: str, *, tls: bool = True) -> mqtt.Client:
    """A client with ``identity``'s certificate asking for someone else's client id."""
    client = mqtt.Client(
        mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5
    )
    if tls:
        cert, key = broker.pki.client(identity)
        client.tls_set(str(broker.pki.ca_file), str(cert), str(key), ssl.CERT_REQUIRED)
        client.connect("127.0.0.1", broker.tls_port)
    else:
        client.connect("127.0.0.1", broker.port)
    client.loop_start()
    return client


def _takeovers(broker: Broker, identity: str, client_ids: list[str], *, tls: bool = True) -> None:
    for _ in range(5):
        for client_id in client_ids:
            client = _hostile(broker, identity, client_id, tls=tls)
            time.sleep(0.2)
            client.disconnect()
            client.loop_stop()


async def test_a_node_certificate_cannot_take_over_another_client_id(
    tmp_path: Path, mqtt_broker: Broker, run_daemon: Run
) -> None:
    """The shipped broker makes each client's id its certificate's CN: node-a connecting
    with gpu-t's or the aggregator's client id takes over nobody and wipes no session."""
    async with aggregator(tmp_path, mqtt_broker) as agg:
        base = f"http://{agg.config.listen}"
        daemon = await asyncio.to_thread(reporting_agent, run_daemon, mqtt_broker, "gpu-t")
        await until(lambda: ("default", "gpu-t") in agg.state.nodes, timeout=10)
        disconnects = agg.state.counters.disconnects.copy()
        daemon.write_kernel_log(*xid_records(300, 100, second_gpu_bus(daemon)))
        await asyncio.to_thread(
            _takeovers, mqtt_broker, "node-a", ["gpuagent-gpu-t", agg.consumer.client_id]
        )
        await _exactly(base, "gpu-t", 100, timeout=30)
        assert metric_total(daemon, "gpuagent_mqtt_connections_total") == 1
        assert metric_total(daemon, "gpuagent_mqtt_disconnects_total") == 0
        assert agg.state.counters.disconnects == disconnects


async def test_a_takeover_is_seen_as_a_disconnect_with_its_reason(
    tmp_path: Path, mqtt_broker: Broker, run_daemon: Run
) -> None:
    """Where client ids are not bound to identities (the tests' anonymous listener), a
    takeover happens, and the agent counts it: by the broker's reason where it sends one
    ("Session taken over"); mosquitto 2.0.11 just closes the connection, which paho reports
    as "Unspecified error"."""
    config = mqtt_broker.agent_config(None, extra=FAST_RESEND)
    daemon = await asyncio.to_thread(run_daemon, H100, config_extra=config, node_name="gpu-p")
    await asyncio.to_thread(
        daemon.wait_for, lambda _: metric_total(daemon, "gpuagent_mqtt_connected") == 1, 20
    )
    await asyncio.to_thread(_takeovers, mqtt_broker, "", ["gpuagent-gpu-p"], tls=False)
    await asyncio.to_thread(
        daemon.wait_for, lambda _: metric_total(daemon, "gpuagent_mqtt_disconnects_total") >= 1, 10
    )
    metrics = await asyncio.to_thread(daemon.metrics)
    assert re.search(r'gpuagent_mqtt_disconnects_total\{reason="[A-Za-z ]+"\} [1-9]', metrics)


async def test_sigterm_while_the_connection_is_lost_stops_the_agent(
    tmp_path: Path, mqtt_broker: Broker, run_daemon: Run
) -> None:
    """Stopping wins over reconnecting: SIGTERM right as the broker goes away ends the
    daemon well within systemd's TimeoutStopSec (10 s), cleanly."""
    daemon = await asyncio.to_thread(reporting_agent, run_daemon, mqtt_broker, "gpu-s")
    await asyncio.to_thread(
        daemon.wait_for, lambda _: metric_total(daemon, "gpuagent_mqtt_connected") == 1, 20
    )
    await asyncio.to_thread(mqtt_broker.kill)
    daemon.process.send_signal(signal.SIGTERM)
    started = time.monotonic()
    code = await asyncio.to_thread(daemon.process.wait, 10)
    assert code == 0
    assert time.monotonic() - started < 8.0
