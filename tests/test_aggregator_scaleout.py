"""Several aggregators sharing one PostgreSQL database, with a real mosquitto (the shipped
configuration, TLS and ACL) and a real PostgreSQL: one fleet view from every aggregator,
cordons decided by whichever aggregator receives the request yet within one budget, and
nothing lost when an aggregator or the broker dies.

Each aggregator consumes only its share of the node messages (one MQTT share group), so
these tests only pass if the database, not any aggregator's memory, is what they agree on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import aiomqtt
import pytest

import aggregator_support as msg
import postgres_server
from conftest import free_port, require_that
from fleet_support import (
    Run,
    aggregator,
    events_published,
    kernel_events_awaiting_ack,
    publish,
    reporting_agent,
    second_gpu_bus,
    spool_empty,
    until,
    xid_records,
)
from gpuagent.aggregator import consumer
from gpuagent.aggregator.service import Aggregator
from gpuagent.config import MqttConnection
from gpuagent.config.schema.aggregator import PostgresSection
from gpuagent.fleet import schema
from gpuagent.fleet.connection import client_options
from mqtt_broker import Broker
from postgres_server import PostgresServer

pytestmark = pytest.mark.integration

SHARE_GROUP = "gpuagent"
REFRESH = 0.2


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    require_that(
        postgres_server.available(),
        "PostgreSQL's initdb and pg_ctl for the scale-out tests (Debian package postgresql)",
    )
    with postgres_server.throwaway_postgres() as server:
        yield server


@pytest.fixture
def database(postgres: PostgresServer) -> str:
    """A fresh database for one test: its URL."""
    return postgres.create_database(f"scaleout_{uuid.uuid4().hex[:12]}")


def _db_name(url: str) -> str:
    return url.split("/")[3].split("?", maxsplit=1)[0]


def _shared(database: str, **overrides: Any) -> dict[str, Any]:
    """The aggregator settings of a scale-out deployment, for `fleet_support.aggregator`."""
    return {
        "database": database,
        "share_group": SHARE_GROUP,
        "postgres": PostgresSection(refresh_interval_seconds=REFRESH),
        **overrides,
    }


@asynccontextmanager
async def two_aggregators(
    tmp_path: Path,
    broker: Broker,
    database: str,
    reconnect_seconds: float = 0.2,
    **overrides: Any,
) -> AsyncIterator[tuple[Aggregator, Aggregator]]:
    """Aggregators "a" and "b" in-process, on one database, in one share group."""
    settings = _shared(database, **overrides)
    async with (
        aggregator(tmp_path, broker, "a", reconnect_seconds, **settings) as a,
        aggregator(tmp_path, broker, "b", reconnect_seconds, **settings) as b,
    ):
        yield a, b


async def _get(base: str, path: str) -> Any:
    async with aiohttp.ClientSession() as session, session.get(base + path) as response:
        assert response.status == 200, await response.text()
        return await response.json()


def _base(agg: Aggregator) -> str:
    return f"http://{agg.config.listen}"


async def _nodes(agg: Aggregator) -> dict[str, tuple[str, bool]]:
    body = await _get(_base(agg), "/api/v1/nodes")
    return {n["name"]: (n["health"], n["online"]) for n in body["nodes"]}


async def _event_ids(base: str, node: str | None = None) -> list[str]:
    where = f"&node={node}" if node else ""
    body = await _get(base, f"/api/v1/events?limit=10000{where}")
    return [e["id"] for e in body["events"] if e["category"] == "kernel"]


@asynccontextmanager
async def node_clients(
    broker: Broker, nodes: list[str], *, persistent: bool = False
) -> AsyncIterator[list[aiomqtt.Client]]:
    """One connected client per node, with the node's certificate."""
    async with AsyncExitStack() as stack:
        clients = []
        for node in nodes:
            options = client_options(broker.connection(node), client_id=node)
            if not persistent:
                options.update(clean_start=True)
            clients.append(await stack.enter_async_context(aiomqtt.Client(**options)))
        yield clients


# --- 1. one fleet view -------------------------------------------------------------------


async def test_every_aggregator_answers_for_the_whole_fleet(
    tmp_path: Path, mqtt_broker: Broker, database: str
) -> None:
    """20 nodes report, each report consumed by one of two aggregators: both APIs list all
    20 with the same health within 2 s of the last report; a change of health, a node gone
    offline and every node event show on both."""
    nodes = [f"n{i:02d}" for i in range(20)]
    async with (
        two_aggregators(tmp_path, mqtt_broker, database) as (a, b),
        node_clients(mqtt_broker, nodes) as clients,
    ):
        expected = dict.fromkeys(nodes, ("WARN", True))

        async def agreed() -> bool:
            return await _nodes(a) == expected and await _nodes(b) == expected

        for client, node in zip(clients, nodes, strict=True):
            await publish(client, "state", msg.state(node, health="WARN"))
        await until(agreed, timeout=2.0)
        # Each consumed a share: the other's nodes came from the database.
        consumed_a = a.state.counters.received["state"]
        consumed_b = b.state.counters.received["state"]
        assert consumed_a + consumed_b == 20
        assert consumed_a > 0
        assert consumed_b > 0

        await publish(clients[3], "state", msg.state("n03", health="CRITICAL"))
        expected["n03"] = ("CRITICAL", True)
        await until(agreed, timeout=2.0)

        await publish(clients[7], "state", msg.offline("n07"))
        expected["n07"] = ("WARN", False)
        await until(agreed, timeout=2.0)
        for agg in (a, b):
            shown = await _get(_base(agg), "/api/v1/nodes/n07")
            assert (shown["online"], shown["reason"]) == (False, "connection lost")
            # Its last report, whichever aggregator consumed it (the other reads it from
            # the database).
            assert shown["status"]["node"]["health"] == "WARN"

        ids = set()
        for client, node in zip(clients, nodes, strict=True):
            for sequence in range(3):
                ids.add(f"{node}:ev:{sequence}")
                await publish(client, "events", msg.event(node, f"{node}:ev:{sequence}"))

        async def all_events() -> bool:
            got = [await _event_ids(_base(agg)) for agg in (a, b)]
            return all(len(g) == len(ids) for g in got)

        await until(all_events, timeout=5.0)
        for agg in (a, b):
            got = await _event_ids(_base(agg))
            assert sorted(got) == sorted(ids)
        assert a.state.counters.events["kernel"] + b.state.counters.events["kernel"] == 60


# --- 2. cordons decided by either aggregator ---------------------------------------------


async def _ask_for_cordons(
    broker: Broker, cluster: str, nodes: list[str], *aggregators: Aggregator
) -> dict[str, dict[str, Any]]:
    """Every node of ``cluster`` reports, then, once the database has every report, all ask
    for a cordon at once; the decisions they receive on their cmd topics, by node."""
    decisions: dict[str, dict[str, Any]] = {}
    async with node_clients(broker, nodes, persistent=True) as clients:
        for client, node in zip(clients, nodes, strict=True):
            await client.subscribe(msg.topic(node, "cmd", cluster), qos=1)
            await publish(client, "state", msg.state(node, cluster=cluster))
        reported = {(cluster, node) for node in nodes}
        await until(lambda: all(reported <= set(agg.state.nodes) for agg in aggregators))
        await asyncio.gather(
            *(
                publish(c, "actions", msg.cordon_request(n, cluster=cluster))
                for c, n in zip(clients, nodes, strict=True)
            )
        )

        async def receive(client: aiomqtt.Client, node: str) -> None:
            async for message in client.messages:
                assert isinstance(message.payload, bytes)
                decoded = schema.decode(message.payload)
                if decoded["type"] == "cordon_decision":
                    decisions[node] = decoded
                    return

        await asyncio.wait_for(
            asyncio.gather(*(receive(c, n) for c, n in zip(clients, nodes, strict=True))), 10
        )
    assert all(d["node"] == node and d["cluster"] == cluster for node, d in decisions.items())
    return decisions


async def test_cordons_decided_by_either_aggregator_keep_one_budget(
    tmp_path: Path, mqtt_broker: Broker, database: str, postgres: PostgresServer
) -> None:
    """Two aggregators decide the cordon requests each receives, at the same moment, in the
    shared database: per cluster, exactly `max_nodes` approvals in all, the same in the
    cordons table and in both APIs. Several rounds (a fresh cluster each), until both
    aggregators have decided requests of one round: a race between two deciders."""
    both_decided = 0
    async with two_aggregators(
        tmp_path, mqtt_broker, database, max_nodes=2, window=86400.0
    ) as aggs:
        a, b = aggs
        for round_ in range(4):
            cluster = f"race{round_}"
            nodes = [f"r{round_}n{i}" for i in range(8)]
            before = {agg: sum(agg.state.counters.decisions.values()) for agg in aggs}
            decisions = await _ask_for_cordons(mqtt_broker, cluster, nodes, a, b)
            assert sorted(decisions) == sorted(nodes)
            results = sorted(d["decision"] for d in decisions.values())
            assert results == ["approved"] * 2 + ["denied"] * 6, results
            decided = {
                agg: sum(agg.state.counters.decisions.values()) - before[agg] for agg in aggs
            }
            assert decided[a] + decided[b] == 8
            both_decided += decided[a] > 0 and decided[b] > 0

            rows = postgres.run(
                f"SELECT node, decision FROM cordons WHERE cluster = '{cluster}' ORDER BY node;",
                _db_name(database),
            )
            stored = dict(row.split("|") for row in rows)
            assert stored == {node: d["decision"] for node, d in decisions.items()}
            request_ids = {d["request_id"] for d in decisions.values()}
            for agg in aggs:
                body = await _get(_base(agg), "/api/v1/cordons?limit=10000")
                shown = {
                    c["request_id"]: c["decision"]
                    for c in body["cordons"]
                    if c["cluster"] == cluster
                }
                assert set(shown) == request_ids
                assert sorted(shown.values()) == results
            if round_ >= 1 and both_decided:
                break
    assert both_decided, "every round's requests all went to one aggregator"


# --- 3. an aggregator killed ---------------------------------------------------------------


def _toml(value: Any) -> str:
    return json.dumps(value) if isinstance(value, str) else str(value).lower()


def _aggregator_toml(tmp_path: Path, connection: MqttConnection, database: str, port: int) -> str:
    token = tmp_path / "command-token"
    token.write_text(msg.COMMAND_TOKEN + "\n")
    broker = {
        key: getattr(connection, key)
        for key in (
            "host",
            "port",
            "tls",
            "ca_file",
            "cert_file",
            "key_file",
            "client_id",
            "reconnect_min_seconds",
            "reconnect_max_seconds",
        )
    }
    lines = [
        "[aggregator]",
        f'listen = "127.0.0.1:{port}"',
        f"database = {_toml(database)}",
        f'share_group = "{SHARE_GROUP}"',
        f'command_token_file = "{token}"',
        "[aggregator.postgres]",
        f"refresh_interval_seconds = {REFRESH}",
        "[aggregator.broker]",
        *(f"{key} = {_toml(value)}" for key, value in broker.items()),
    ]
    return "\n".join(lines) + "\n"


class AggregatorProcess:
    """`gpuagent-aggregator run` as systemd runs it: a process to SIGKILL."""

    def __init__(self, tmp_path: Path, broker: Broker, name: str, database: str) -> None:
        self.root = tmp_path / f"agg-{name}"
        self.root.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        connection = broker.connection(
            f"aggregator-{name}", client_id=f"gpuagent-aggregator-{name}"
        )
        config = self.root / "aggregator.toml"
        config.write_text(_aggregator_toml(self.root, connection, database, self.port))
        self.log = self.root / "aggregator.log"
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "gpuagent.aggregator.cli", "run", "--config", str(config)],
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def metrics(self) -> dict[str, float]:
        async with aiohttp.ClientSession() as session, session.get(self.base + "/metrics") as r:
            text = await r.text()
        values: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                values[name] = float(value)
        return values

    async def received_events(self) -> float:
        """Event messages received (copies included)."""
        metrics = await self.metrics()
        return metrics.get('gpuagent_fleet_messages_received_total{type="event"}', 0.0)

    async def wait_connected(self, timeout: float = 20.0) -> None:
        async def connected() -> bool:
            assert self.process.poll() is None, self.log.read_text()
            try:
                return (await self.metrics()).get("gpuagent_fleet_mqtt_connected") == 1.0
            except aiohttp.ClientError:
                return False

        await until(connected, timeout=timeout)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


@contextlib.contextmanager
def aggregator_processes(
    tmp_path: Path, broker: Broker, database: str, *names: str
) -> Iterator[list[AggregatorProcess]]:
    started: list[AggregatorProcess] = []
    try:
        for name in names:
            started.append(AggregatorProcess(tmp_path, broker, name, database))  # noqa: PERF401 - stopped if the next fails
        yield started
    finally:
        for process in started:
            process.stop()


def _stored_exactly(
    postgres: PostgresServer, database: str, count: int
) -> Callable[[], Awaitable[bool]]:
    """Whether the events table holds ``count`` kernel events (psql on a thread: the
    aggregators may share this event loop)."""

    async def check() -> bool:
        table = "events WHERE category = 'kernel'"
        stored = await asyncio.to_thread(postgres.count, table, _db_name(database))
        return stored >= count

    return check


async def test_an_aggregator_killed_midway_loses_nothing(
    tmp_path: Path,
    mqtt_broker: Broker,
    database: str,
    postgres: PostgresServer,
    run_daemon: Run,
) -> None:
    """Two aggregator processes share the work; B is SIGKILLed while 300 events from two
    real agents are on their way, and restarted as systemd would (Restart=on-failure).

    Nothing B had received but not committed was acknowledged, to the broker or to the
    node. Two paths bring such a message back: the node's spool sends it again (its
    acknowledgement timeout, doubling), and the broker delivers it again to B's session
    when B is back. Only the second is bounded in time: mosquitto (2.0) keeps giving a
    dead member of a share group its turn while its persistent session lives (a day), so
    about half of every resend is parked in B's session too, and without B's restart the
    last of them can take minutes to reach A (measured: 3 of 300 still missing after 40 s
    at a 1 s acknowledgement timeout). So B comes back here, and the test holds that
    every event is then stored exactly once: the copies stored by A meanwhile and those B
    gets again meet the events table's primary key."""
    with aggregator_processes(tmp_path, mqtt_broker, database, "a", "b") as started:
        a, b = started
        await asyncio.gather(a.wait_connected(), b.wait_connected())
        # One at a time: run_daemon numbers its working directories as it is called.
        daemons = [
            await asyncio.to_thread(reporting_agent, run_daemon, mqtt_broker, f"gpu-{i}")
            for i in range(2)
        ]
        buses = [second_gpu_bus(d) for d in daemons]
        for daemon, bus in zip(daemons, buses, strict=True):
            daemon.write_kernel_log(*xid_records(1000, 60, bus))
        await until(_stored_exactly(postgres, database, 120), timeout=20)
        assert await b.received_events() > 0, "B consumed none of the first events"
        # The rest in flight as B dies.
        for daemon, bus in zip(daemons, buses, strict=True):
            daemon.write_kernel_log(*xid_records(1060, 90, bus))
        await asyncio.sleep(0.05)
        await asyncio.to_thread(b.kill)
        await asyncio.sleep(2.0)  # systemd's RestartSec, shortened
        again = AggregatorProcess(tmp_path, mqtt_broker, "b", database)
        started.append(again)
        await again.wait_connected()
        await until(_stored_exactly(postgres, database, 300), timeout=30)
        # What mosquitto parked in B's session came to the restarted B.
        assert await again.received_events() > 0
        await asyncio.sleep(0.5)  # a late duplicate would show now
        rows = await asyncio.to_thread(
            postgres.run,
            "SELECT node, COUNT(*), COUNT(DISTINCT id) FROM events "
            "WHERE category = 'kernel' GROUP BY node ORDER BY node;",
            _db_name(database),
        )
        assert rows == ["gpu-0|150|150", "gpu-1|150|150"]
        for node in ("gpu-0", "gpu-1"):
            for process in (a, again):
                ids = await _event_ids(process.base, node)
                assert len(ids) == len(set(ids)) == 150
        await until(lambda: all(spool_empty(d) for d in daemons), 15)


# --- 4. the broker restarted ---------------------------------------------------------------


async def test_a_broker_killed_under_two_aggregators_loses_nothing(
    tmp_path: Path,
    mqtt_broker: Broker,
    database: str,
    postgres: PostgresServer,
    run_daemon: Run,
) -> None:
    """SIGKILL the broker (never saved: it forgets every session, subscription and queued
    message) under two aggregators in one share group on PostgreSQL while a real agent
    reports. The agent is back first (the aggregators back off longer here) and publishes
    what it spooled meanwhile to a share group with no member: mosquitto drops those, and
    the agent's spool sends them again once an aggregator is back. What was sent before,
    during and after the outage is all stored, once, and both aggregators show it."""
    async with two_aggregators(tmp_path, mqtt_broker, database, reconnect_seconds=6.0) as (a, b):
        daemon = await asyncio.to_thread(reporting_agent, run_daemon, mqtt_broker, "gpu-k")
        await until(
            lambda: all(("default", "gpu-k") in agg.state.nodes for agg in (a, b)), timeout=10
        )
        bus = second_gpu_bus(daemon)
        daemon.write_kernel_log(*xid_records(1000, 100, bus))
        await until(_stored_exactly(postgres, database, 100), timeout=20)
        await asyncio.to_thread(mqtt_broker.kill)
        daemon.write_kernel_log(*xid_records(1100, 100, bus))
        await asyncio.to_thread(daemon.wait_for, lambda d: d["kmsg"]["records_read"] == 200, 20)
        await asyncio.to_thread(mqtt_broker.start)
        # The outage's 100, and any of the first 100 whose acknowledgement it lost.
        await until(lambda: kernel_events_awaiting_ack(daemon, 100), timeout=20)
        # Published before either aggregator was back: to nobody.
        assert not a.state.connected
        assert not b.state.connected
        await until(lambda: a.state.connected and b.state.connected, timeout=20)
        daemon.write_kernel_log(*xid_records(1200, 100, bus))
        await until(_stored_exactly(postgres, database, 300), timeout=45)
        await asyncio.sleep(0.5)
        rows = postgres.run(
            "SELECT COUNT(*), COUNT(DISTINCT id) FROM events WHERE category = 'kernel';",
            _db_name(database),
        )
        assert rows == ["300|300"]
        for agg in (a, b):
            ids = await _event_ids(_base(agg), "gpu-k")
            assert len(ids) == len(set(ids)) == 300
        await until(lambda: spool_empty(daemon), 15)
        # The outage's 100 went twice at least: dropped by the broker, then sent again.
        assert events_published(daemon) >= 400
        consumed = a.state.counters.events["kernel"] + b.state.counters.events["kernel"]
        assert consumed >= 300
        assert a.state.counters.events["kernel"] > 0
        assert b.state.counters.events["kernel"] > 0


# --- 5. an aggregator that stays away ------------------------------------------------------


async def test_an_aggregator_that_stays_away_stops_drawing_the_groups_messages(
    tmp_path: Path, mqtt_broker: Broker, database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """mosquitto goes on giving a shared subscription's turn to a member whose session
    outlives its connection, queued until it returns. Aggregators sharing a database keep
    a short session (60 s; 2 s here), so once it has expired, the aggregator that is left
    gets every message: none waits for the one that went away."""
    monkeypatch.setattr(consumer, "SHARED_SESSION_EXPIRY_SECONDS", 2)
    settings = _shared(database)
    async with aggregator(tmp_path, mqtt_broker, "a", 0.2, **settings) as a:
        async with aggregator(tmp_path, mqtt_broker, "b", 0.2, **settings):
            pass  # both subscribed, then "b" went away; its session stays 2 s
        await asyncio.sleep(3.0)
        ids = [f"n1:away:{i}" for i in range(40)]
        async with node_clients(mqtt_broker, ["n1"]) as [client]:
            for event_id in ids:
                await publish(client, "events", msg.event("n1", event_id))

        async def all_stored() -> bool:
            return len(await _event_ids(_base(a), "n1")) == len(ids)

        await until(all_stored, timeout=5.0)
        assert sorted(await _event_ids(_base(a), "n1")) == sorted(ids)
        assert a.state.counters.events["kernel"] == len(ids)
