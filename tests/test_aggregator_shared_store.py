"""The fleet store on a real PostgreSQL shared by several aggregators: migrations (fresh,
concurrent, rolling upgrade, an old SQLite file), write-behind (visibility, a refused row,
an outage), cordon decisions raced by two aggregators, the shared view, credentials and
TLS, and the configuration rule against passwords in the URL.

One throwaway cluster serves the module (a second, on TCP with TLS and a password role,
serves the credential tests); every test gets a database of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import os
import shutil
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import pytest

import aggregator_support as msg
from conftest import deadline_in, require_that
from gpuagent.aggregator import decisions, migrations
from gpuagent.aggregator.budget import CordonBudget
from gpuagent.aggregator.database import database
from gpuagent.aggregator.records import NodeRecord, from_online_state
from gpuagent.aggregator.sharedview import SharedView
from gpuagent.aggregator.state import FleetState
from gpuagent.aggregator.store import FleetStore, StoreOpenError, row_key
from gpuagent.config import ConfigError, CordonBudgetSection, load_config
from gpuagent.config.schema.aggregator import PostgresSection
from mqtt_broker import Pki
from postgres_server import PostgresServer, available, throwaway_postgres

pytestmark = pytest.mark.integration

_POSTGRES_FOR = (
    "PostgreSQL's initdb and pg_ctl are not installed: the shared fleet store tests "
    "(Debian package postgresql; scripts/test installs it)"
)
BUDGET = CordonBudgetSection(max_nodes=3, max_percent=100.0, window_seconds=3600.0)
# The password of the role `fleet` on the TCP server.
PASSWORD = "correct horse"
_names = itertools.count(1)
_ids = itertools.count(1)


def unique(prefix: str) -> str:
    return f"{prefix}_{os.getpid()}_{next(_names)}"


@dataclass(frozen=True)
class Db:
    server: PostgresServer
    name: str
    url: str

    def run(self, sql: str) -> list[str]:
        return self.server.run(sql, self.name)

    def count(self, table: str, where: str = "") -> int:
        return int(self.run(f"SELECT COUNT(*) FROM {table} {where};")[0])


@pytest.fixture(scope="module")
def pg() -> Iterator[PostgresServer]:
    require_that(available(), _POSTGRES_FOR)
    with throwaway_postgres() as server:
        yield server


@pytest.fixture
def db(pg: PostgresServer) -> Db:
    name = unique("fleet")
    return Db(pg, name, pg.create_database(name))


def make_store(
    url: str | Path,
    budget: CordonBudgetSection = BUDGET,
    postgres: PostgresSection | None = None,
) -> FleetStore:
    return FleetStore(
        url,
        retention_seconds=86400.0,
        max_events=100_000,
        budget=budget,
        postgres=postgres or PostgresSection(pool_max_size=4, connect_timeout_seconds=5.0),
    )


@contextlib.asynccontextmanager
async def opened(*stores: FleetStore) -> AsyncIterator[None]:
    """The stores opened at once (several aggregators starting), closed afterwards."""
    try:
        await asyncio.gather(*(s.open() for s in stores))
        yield
    finally:
        for s in stores:
            await s.close()


def node(
    name: str, cluster: str, last_seen: float, *, health: str = "OK", online: bool = True
) -> NodeRecord:
    message = msg.state(name, cluster=cluster, when=last_seen, health=health)
    record = from_online_state(message, json.dumps(message), last_seen)
    if online:
        return record
    return dataclasses.replace(record, online=False, reason="connection lost")


def request(
    cluster: str, name: str, action: str = "cordon", when: float | None = None
) -> decisions.CordonRequest:
    key = row_key(cluster, name, f"{name}:cordon:{next(_ids)}")
    return decisions.CordonRequest(key, cluster, name, action, when or time.time())


def terminate(db: Db) -> None:
    """Cut every connection the aggregators hold to ``db``; return once they are gone."""
    # The call in the select list: in WHERE it might run before the other conditions.
    rows = db.server.run(
        "SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity "
        f"WHERE application_name = 'gpuagent-aggregator' AND datname = '{db.name}';"
    )
    pids = [row.split("|")[0] for row in rows]
    deadline = deadline_in(10)
    while pids and time.monotonic() < deadline:
        left = db.server.run(
            f"SELECT COUNT(*) FROM pg_stat_activity WHERE pid IN ({', '.join(pids)});"
        )
        if left == ["0"]:
            return
        time.sleep(0.05)
    assert not pids or time.monotonic() < deadline, "the connections outlived pg_terminate_backend"


# --- migrations ------------------------------------------------------------------------------


def _migrations_table(db: Db) -> list[str]:
    return db.run(
        "SELECT version, name, oldest_compatible, applied_at FROM schema_migrations "
        "ORDER BY version;"
    )


async def test_a_fresh_database_migrates_to_the_newest_version_once(db: Db) -> None:
    known = migrations.known()
    first = make_store(db.url)
    async with opened(first):
        assert first.schema_version == len(known)
    rows = _migrations_table(db)
    assert [tuple(r.split("|")[:3]) for r in rows] == [
        (str(m.version), m.name, str(m.oldest_compatible)) for m in known
    ]
    # Migration 3 (PostgreSQL only) is there: the column and the trigger that sets it.
    assert db.run(
        "SELECT column_name FROM information_schema.columns "
        "WHERE table_name = 'nodes' AND column_name = 'changed';"
    ) == ["changed"]
    # A restart applies nothing: the rows, their times included, are as they were.
    again = make_store(db.url)
    async with opened(again):
        assert again.schema_version == len(known)
    assert _migrations_table(db) == rows


async def test_aggregators_starting_together_apply_each_migration_once(db: Db) -> None:
    stores = [make_store(db.url) for _ in range(4)]
    async with opened(*stores):
        assert [s.schema_version for s in stores] == [len(migrations.known())] * 4
    expected = [f"{m.version}|1" for m in migrations.known()]
    assert db.run("SELECT version, COUNT(*) FROM schema_migrations GROUP BY 1 ORDER BY 1;") == (
        expected
    )


def test_migrate_from_threads_released_at_once_applies_each_migration_once(db: Db) -> None:
    threads = 6
    barrier = threading.Barrier(threads)

    def start() -> int:
        each = database(db.url, PostgresSection(pool_max_size=1))
        each.open()
        try:
            with each.session() as session:
                barrier.wait(timeout=30)
                return migrations.migrate(session, each.dialect)
        finally:
            each.close()

    with ThreadPoolExecutor(threads) as pool:
        versions = list(pool.map(lambda _: start(), range(threads)))
    assert versions == [len(migrations.known())] * threads
    expected = [f"{m.version}|1" for m in migrations.known()]
    assert db.run("SELECT version, COUNT(*) FROM schema_migrations GROUP BY 1 ORDER BY 1;") == (
        expected
    )


_EXTRA_SQL = (
    "-- oldest_compatible: {compatible}\n"
    "ALTER TABLE nodes ADD COLUMN site VARCHAR(64) NOT NULL DEFAULT '';\n"
    "CREATE INDEX IF NOT EXISTS nodes_by_site ON nodes (site);\n"
)


def _as_newer_code(url: str, compatible: int) -> int:
    """Migrate ``url`` as an aggregator one migration ahead of this one would: an additive
    migration whose oldest compatible schema version is ``compatible``."""
    known = migrations.known()
    sql = _EXTRA_SQL.format(compatible=compatible)
    extra = migrations.Migration(
        len(known) + 1, "node_site", compatible, {"postgresql": sql, "sqlite": sql}
    )
    newer = database(url)
    newer.open()
    try:
        with newer.session() as session:
            return migrations.migrate(session, newer.dialect, [*known, extra])
    finally:
        newer.close()


async def test_an_older_aggregator_works_beside_an_additive_migration(db: Db) -> None:
    ours = len(migrations.known())
    assert _as_newer_code(db.url, compatible=1) == ours + 1
    old, reader = make_store(db.url), make_store(db.url)
    async with opened(old, reader):
        assert old.schema_version == ours + 1
        old.queue_node(node("n1", "c1", 100.0), stale=False)
        event = msg.event("n1")
        old.queue_event(event, json.dumps(event))
        cordon = request("c1", "n1")
        old.queue_request(cordon)
        await old.flush()
        assert not old.retrying
        assert not old.rows_dropped
        assert cordon.decided is not None
        assert cordon.decided.decision == "approved"
        assert [(r.cluster, r.node, r.last_seen) for r in await reader.load_nodes()] == [
            ("c1", "n1", 100.0)
        ]
        assert await reader.events(node="n1", since=None, limit=10) == [event]
    # The newer aggregator's column got its default in the row the older one wrote.
    assert db.run("SELECT node, site FROM nodes;") == ["n1|"]
    assert db.count("schema_migrations") == ours + 1


async def test_an_older_aggregator_refuses_a_schema_it_cannot_work_with(db: Db) -> None:
    ours = len(migrations.known())
    _as_newer_code(db.url, compatible=ours + 1)
    old = make_store(db.url)
    try:
        with pytest.raises(StoreOpenError) as info:
            await old.open()
    finally:
        await old.close()
    text = str(info.value)
    assert f"schema version {ours + 1} (node_site)" in text
    assert f"schema version {ours + 1} or newer" in text
    assert f"knows up to {ours}" in text
    assert db.name in text
    # Refusing changed nothing.
    assert db.count("schema_migrations") == ours + 1


async def test_a_sqlite_file_from_before_migrations_is_migrated(tmp_path: Path) -> None:
    path = tmp_path / "fleet.sqlite"
    fleet = resources.files("gpuagent.aggregator").joinpath("sql/0001_fleet.sql").read_text()
    with contextlib.closing(sqlite3.connect(path)) as old:
        old.executescript(fleet)
        old.execute(
            "INSERT INTO nodes VALUES ('c1', 'n1', 1, 'OK', '', 100.0, '0.1.0', 'fp', 0, '')"
        )
        old.commit()
    store = make_store(path)
    async with opened(store):
        assert store.schema_version == len(migrations.known())
        assert [(r.node, r.last_seen) for r in await store.load_nodes()] == [("n1", 100.0)]
        store.queue_node(node("n2", "c1", 200.0), stale=False)
        await store.flush()
        assert await store.count("nodes") == 2
    with contextlib.closing(sqlite3.connect(path)) as after:
        applied = after.execute("SELECT version, name FROM schema_migrations ORDER BY 1")
        # Every migration recorded, the PostgreSQL-only ones as applied, doing nothing.
        assert applied.fetchall() == [(m.version, m.name) for m in migrations.known()]
        indexes = after.execute("SELECT name FROM sqlite_master WHERE type = 'index'")
        assert "cordons_by_cluster" in {name for (name,) in indexes}
        columns = {row[1] for row in after.execute("PRAGMA table_info(nodes)")}
        assert "changed" not in columns
    # Opening again applies nothing.
    store = make_store(path)
    async with opened(store):
        assert store.schema_version == len(migrations.known())


# --- write-behind ----------------------------------------------------------------------------


async def test_rows_committed_by_one_aggregator_are_read_by_another(db: Db) -> None:
    a, b = make_store(db.url), make_store(db.url)
    async with opened(a, b):
        a.queue_node(node("n1", "c1", 100.0, health="CRITICAL"), stale=False)
        events = [msg.event("n1", when=100.0 + i) for i in range(3)]
        for event in events:
            a.queue_event(event, json.dumps(event))
        reply = msg.reply("n1", "cmd-1")
        a.queue_reply(reply, json.dumps(reply))
        assert await b.count("events") == 0  # nothing before the flush
        await a.flush()
        assert a.pending() == 0
        assert await b.count("events") == 3
        assert await b.count("replies") == 1
        assert await b.events(node="n1", since=None, limit=10) == events[::-1]
        [record] = await b.load_nodes()
        assert (record.cluster, record.node, record.health, record.last_seen) == (
            "c1",
            "n1",
            "CRITICAL",
            100.0,
        )
        assert record.online
        assert record.gpus  # the state document went along


async def test_a_row_postgres_refuses_is_dropped_alone(db: Db) -> None:
    a = make_store(db.url)
    async with opened(a):
        good = [msg.event("n1"), msg.event("n1")]
        bad_body, bad_category = msg.event("n1"), msg.event("n1")
        bad_category["category"] = "ker\x00nel"
        a.queue_node(node("n1", "c1", 100.0), stale=False)
        a.queue_event(good[0], json.dumps(good[0]))
        a.queue_event(bad_body, json.dumps(bad_body)[:-1] + ', "x": "\x00"}')
        a.queue_event(bad_category, json.dumps(bad_category))
        a.queue_event(good[1], json.dumps(good[1]))
        ran: list[int] = []
        a.after_write(lambda: ran.append(1))
        await a.flush()
        assert ran == [1]
        assert not a.retrying
        assert a.rows_dropped == Counter(events=2)
        assert a.write_errors == 1  # the batch's one transaction, then row by row
        for message in (bad_body, bad_category):
            assert a.refused(row_key("c1", "n1", message["id"]))
        for message in good:
            assert not a.refused(row_key("c1", "n1", message["id"]))
    assert sorted(db.run("SELECT id FROM events;")) == sorted(
        row_key("c1", "n1", m["id"]) for m in good
    )
    assert db.count("nodes") == 1


async def test_a_database_gone_away_keeps_the_batch_until_it_is_back(db: Db) -> None:
    a = make_store(db.url)
    async with opened(a):
        a.queue_node(node("n0", "c1", 50.0), stale=False)
        await a.flush()  # the pool holds a working connection
        db.server.run(f"ALTER DATABASE {db.name} SET default_transaction_read_only = on;")
        terminate(db)
        a.queue_node(node("n1", "c1", 100.0), stale=False)
        events = [msg.event("n1") for _ in range(3)]
        for event in events:
            a.queue_event(event, json.dumps(event))
        cordon = request("c1", "n1")
        a.queue_request(cordon)
        ran: list[str] = []
        a.after_write(lambda: ran.append("first"))
        for attempt in range(3):
            await a.flush()
            assert a.retrying, attempt
            assert ran == []
            assert cordon.decided is None
            assert a.pending() == 5 + attempt
            late = msg.event("n1")  # queued during the outage, written after the batch
            events.append(late)
            a.queue_event(late, json.dumps(late))
        a.after_write(lambda: ran.append("second"))
        assert a.batches_retried >= 3
        assert not a.rows_dropped
        assert db.count("events") == 0
        db.server.run(f"ALTER DATABASE {db.name} RESET default_transaction_read_only;")
        terminate(db)
        for _ in range(20):
            await a.flush()
            if not a.retrying:
                break
            await asyncio.sleep(0.1)
        assert not a.retrying
        assert ran == ["first", "second"]
        assert a.pending() == 0
        assert not a.rows_dropped
        assert cordon.decided is not None
        assert cordon.decided.decision == "approved"
    stored = db.run("SELECT id FROM events;")
    assert sorted(stored) == sorted(row_key("c1", "n1", m["id"]) for m in events)
    assert db.count("nodes") == 2
    assert db.count("cordons") == 1


# --- cordon decisions ------------------------------------------------------------------------


async def test_two_aggregators_deciding_at_once_never_overspend_the_budget(db: Db) -> None:
    a, b = make_store(db.url), make_store(db.url)
    rounds, per_round = 30, 10
    async with opened(a, b):
        for round_ in range(rounds):
            cluster = f"race{round_}"
            now = time.time()
            asked = []
            for i in range(per_round):
                store = (a, b)[(i + round_) % 2]
                store.queue_node(node(f"n{i}", cluster, now), stale=False)
                asked.append(request(cluster, f"n{i}"))
                store.queue_request(asked[-1])
            await asyncio.gather(a.flush(), b.flush())
            outcomes = [r.decided.decision if r.decided else None for r in asked]
            assert None not in outcomes, (round_, outcomes)
            assert outcomes.count("approved") == BUDGET.max_nodes, (round_, outcomes)
        assert not a.rows_dropped
        assert not b.rows_dropped
    per_cluster = db.run(
        "SELECT cluster, COUNT(*) FILTER (WHERE decision = 'approved'), COUNT(*) "
        "FROM cordons GROUP BY cluster ORDER BY cluster;"
    )
    assert sorted(per_cluster) == sorted(
        f"race{r}|{BUDGET.max_nodes}|{per_round}" for r in range(rounds)
    )


async def test_the_percent_limit_holds_across_aggregators(db: Db) -> None:
    budget = CordonBudgetSection(max_nodes=10, max_percent=10.0, window_seconds=3600.0)
    a, b = make_store(db.url, budget), make_store(db.url, budget)
    async with opened(a, b):
        for round_ in range(5):
            cluster = f"share{round_}"
            now = time.time()
            for i in range(20):
                a.queue_node(node(f"n{i}", cluster, now), stale=False)
            await a.flush()
            asked = [request(cluster, f"n{i}") for i in range(10)]
            for i, each in enumerate(asked):
                (a, b)[i % 2].queue_request(each)
            await asyncio.gather(a.flush(), b.flush())
            outcomes = [r.decided.decision if r.decided else None for r in asked]
            assert outcomes.count("approved") == 2, (round_, outcomes)  # 10 % of 20
            assert outcomes.count("denied") == 8, (round_, outcomes)
            assert (
                db.count("cordons", f"WHERE cluster = '{cluster}' AND decision = 'approved'") == 2
            )


async def test_a_request_decided_by_both_aggregators_gets_one_decision(db: Db) -> None:
    a, b = make_store(db.url), make_store(db.url)
    async with opened(a, b):
        for round_ in range(10):
            cluster = f"twice{round_}"
            now = time.time()
            pairs = []
            for i in range(6):
                a.queue_node(node(f"n{i}", cluster, now), stale=False)
                first = request(cluster, f"n{i}", when=now + i)
                # The node sent it again; another aggregator took the copy, a bit later.
                second = dataclasses.replace(first, time=now + i + 0.5)
                pairs.append((first, second))
            # The nodes known first: a count that grows mid-race changes the limit.
            await a.flush()
            for first, _ in pairs:
                a.queue_request(first)
            for _, second in reversed(pairs):
                b.queue_request(second)
            await asyncio.gather(a.flush(), b.flush())
            for first, second in pairs:
                assert first.decided is not None
                assert first.decided == second.decided, (round_, first.node)
            approved = [f.node for f, _ in pairs if f.decided and f.decided.decision == "approved"]
            assert len(approved) == BUDGET.max_nodes, (round_, approved)
            assert db.count("cordons", f"WHERE cluster = '{cluster}'") == len(pairs)


async def test_an_uncordon_through_one_aggregator_frees_a_slot_for_the_other(db: Db) -> None:
    budget = CordonBudgetSection(max_nodes=1, max_percent=100.0, window_seconds=3600.0)
    a, b = make_store(db.url, budget), make_store(db.url, budget)
    t0 = time.time()

    async def decide(store: FleetStore, name: str, action: str, when: float) -> decisions.Decided:
        asked = request("c1", name, action, when)
        store.queue_request(asked)
        await store.flush()
        assert asked.decided is not None
        return asked.decided

    async with opened(a, b):
        assert (await decide(a, "n1", "cordon", t0)).decision == "approved"
        denied = await decide(b, "n2", "cordon", t0 + 1)
        assert denied.decision == "denied"
        assert denied.retry_after_seconds == pytest.approx(3600.0 - 1, abs=0.01)
        assert (await decide(b, "n1", "uncordon", t0 + 2)).decision == "approved"
        assert (await decide(a, "n2", "cordon", t0 + 3)).decision == "approved"
        assert (await decide(b, "n3", "cordon", t0 + 4)).decision == "denied"
    assert db.run("SELECT node, action, decision FROM cordons ORDER BY time;") == [
        "n1|cordon|approved",
        "n2|cordon|denied",
        "n1|uncordon|approved",
        "n2|cordon|approved",
        "n3|cordon|denied",
    ]


# --- the shared view -------------------------------------------------------------------------


async def test_the_shared_view_follows_what_the_other_aggregator_wrote(db: Db) -> None:
    a, b = make_store(db.url), make_store(db.url)
    async with opened(a, b):
        state = FleetState()
        budget = CordonBudget(BUDGET)
        view = SharedView(state, b, budget, interval=1.0)
        await view.start()
        assert state.nodes == {}
        key = ("c1", "n1")

        newest = node("n1", "c1", 200.0, health="CRITICAL")
        a.queue_node(newest, stale=False)
        a.queue_node(node("n2", "c1", 150.0), stale=False)
        await a.flush()
        await view.refresh()
        assert set(state.nodes) == {key, ("c1", "n2")}
        assert state.nodes[key].last_seen == 200.0
        assert state.nodes[key].health == "CRITICAL"
        assert state.nodes[key].gpus  # read whole: the document came along

        # An older report written later, through the other aggregator, replaces nothing.
        b.queue_node(node("n1", "c1", 100.0), stale=False)
        await b.flush()
        assert db.run("SELECT last_seen, health FROM nodes WHERE node = 'n1';") == ["200|CRITICAL"]
        await view.refresh()
        assert state.nodes[key].last_seen == 200.0
        assert state.nodes[key].health == "CRITICAL"

        # Offline (its Last Will, taken by the other aggregator): the same report.
        a.queue_node(
            dataclasses.replace(newest, online=False, reason="connection lost"), stale=False
        )
        await a.flush()
        await view.refresh()
        assert not state.nodes[key].online
        assert state.nodes[key].reason == "connection lost"
        assert state.nodes[key].last_seen == 200.0
        # A late copy of the same online report does not bring it back.
        b.queue_node(newest, stale=False)
        await b.flush()
        assert db.run("SELECT online, reason FROM nodes WHERE node = 'n1';") == [
            "f|connection lost"
        ]
        await view.refresh()
        assert not state.nodes[key].online

        # A newer report brings it back online, everywhere.
        a.queue_node(node("n1", "c1", 300.0), stale=False)
        await a.flush()
        await view.refresh()
        assert state.nodes[key].online
        assert state.nodes[key].last_seen == 300.0

        # The budget: an approval made by the other aggregator is spent here too.
        now = time.time()
        assert budget.remaining("c1", 10, now) == BUDGET.max_nodes
        cordon = request("c1", "n2")
        a.queue_request(cordon)
        await a.flush()
        assert cordon.decided is not None
        assert cordon.decided.decision == "approved"
        await view.refresh()
        assert budget.remaining("c1", 10, now) == BUDGET.max_nodes - 1


async def test_the_view_reads_summaries_and_documents_only_on_demand(db: Db) -> None:
    """Another aggregator's node comes into the view from its summary (the GPUs, findings
    and fingerprint, not the document); its page reads the document from the database;
    and a node going offline through a record without a document keeps it stored."""
    a, b = make_store(db.url), make_store(db.url)
    async with opened(a, b):
        state = FleetState()
        view = SharedView(state, b, CordonBudget(BUDGET), interval=1.0)
        await view.start()
        written = node("n1", "c1", 200.0, health="WARN")
        a.queue_node(written, stale=False)
        await a.flush()
        await view.refresh()
        read = state.nodes[("c1", "n1")]
        assert read.document == ""
        assert (read.health, read.gpus, read.findings) == (
            written.health,
            written.gpus,
            written.findings,
        )
        assert (read.fingerprint_id, read.fingerprint) == (
            written.fingerprint_id,
            written.fingerprint,
        )
        assert await b.node_document("c1", "n1") == written.document

        # Its Last Will, taken here: the record written has no document; the stored one stays.
        b.queue_node(dataclasses.replace(read, online=False, reason="shutdown"), stale=False)
        await b.flush()
        assert db.run("SELECT online FROM nodes WHERE node = 'n1';") == ["f"]
        assert await a.node_document("c1", "n1") == written.document


async def test_a_row_written_without_a_summary_is_read_from_its_document(db: Db) -> None:
    """During a rolling upgrade an aggregator from before summaries writes reports without
    one: its summary no longer matches the row's report, and the view reads the document
    instead of showing an older report's GPUs."""
    a, b = make_store(db.url), make_store(db.url)
    async with opened(a, b):
        state = FleetState()
        view = SharedView(state, b, CordonBudget(BUDGET), interval=1.0)
        await view.start()
        a.queue_node(node("n1", "c1", 200.0, health="OK"), stale=False)
        await a.flush()
        await view.refresh()
        assert state.nodes[("c1", "n1")].health == "OK"
        # The older aggregator's upsert: every column it knows, the summary left as it was.
        message = msg.state(
            "n1", when=300.0, health="CRITICAL", gpus=[msg.gpu_doc(0), msg.gpu_doc(1)]
        )
        document = json.dumps(message).replace("'", "''")
        db.run(
            "UPDATE nodes SET last_seen = 300, health = 'CRITICAL', "
            f"document = '{document}' WHERE node = 'n1';"
        )
        await view.refresh()
        read = state.nodes[("c1", "n1")]
        assert (read.last_seen, read.health) == (300.0, "CRITICAL")
        assert len(read.gpus) == 2  # the newer report's, from its document


# --- credentials and TLS ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def tcp_pg(pki: Pki) -> Iterator[PostgresServer]:
    """A server on loopback TCP with TLS (the test CA's certificate for 127.0.0.1), where
    the role `fleet` must give its password (SCRAM); others are trusted as before."""
    require_that(available(), _POSTGRES_FOR)
    with throwaway_postgres(tcp=True) as server:
        data = server.root / "data"
        for source, target in (("broker.crt", "server.crt"), ("broker.key", "server.key")):
            shutil.copy(pki.root / source, data / target)
            (data / target).chmod(0o600)
            if os.geteuid() == 0:  # the server runs as postgres (postgres_server)
                shutil.chown(data / target, "postgres", "postgres")
        hba = data / "pg_hba.conf"
        hba.write_text("host all fleet 127.0.0.1/32 scram-sha-256\n" + hba.read_text())
        server.run(f"CREATE ROLE fleet LOGIN PASSWORD '{PASSWORD}';")
        server.run(
            f"ALTER SYSTEM SET ssl_cert_file = '{data / 'server.crt'}';\n"
            f"ALTER SYSTEM SET ssl_key_file = '{data / 'server.key'}';\n"
            "ALTER SYSTEM SET ssl = on;\n"
            "SELECT pg_reload_conf();\n"
        )
        deadline = deadline_in(10)
        while server.run("SHOW ssl;") != ["on"]:
            assert time.monotonic() < deadline, (server.root / "log").read_text()[-2000:]
            time.sleep(0.05)
        yield server


def _fleet_database(server: PostgresServer, owner: str = "gpuagent") -> str:
    name = unique("tcp")
    server.run(f"CREATE DATABASE {name} OWNER {owner};")
    return name


async def test_the_password_comes_from_its_file(tcp_pg: PostgresServer, tmp_path: Path) -> None:
    name = _fleet_database(tcp_pg, owner="fleet")
    url = f"postgresql://fleet@127.0.0.1:{tcp_pg.port}/{name}"
    password = tmp_path / "db-password"
    password.write_text(PASSWORD + "\nignored second line\n")
    store = make_store(url, postgres=PostgresSection(password_file=str(password)))
    async with opened(store):
        assert store.schema_version == len(migrations.known())
        store.queue_node(node("n1", "c1", 100.0), stale=False)
        await store.flush()
        assert not store.retrying
        assert await store.count("nodes") == 1
        with store.database.session() as session:
            assert session.execute("SELECT current_user").fetchone() == ("fleet",)


async def test_a_wrong_or_missing_password_refuses_to_open(
    tcp_pg: PostgresServer, tmp_path: Path
) -> None:
    name = _fleet_database(tcp_pg, owner="fleet")
    url = f"postgresql://fleet@127.0.0.1:{tcp_pg.port}/{name}"
    wrong = tmp_path / "wrong-password"
    wrong.write_text("battery staple\n")
    missing = tmp_path / "no-such-file"
    for path in (wrong, missing):
        options = PostgresSection(password_file=str(path), connect_timeout_seconds=1.0)
        store = make_store(url, postgres=options)
        try:
            with pytest.raises(StoreOpenError) as info:
                await store.open()
        finally:
            await store.close()
        text = str(info.value)
        assert f"postgresql://fleet@127.0.0.1:{tcp_pg.port}/{name}" in text
        assert "battery" not in text
        if path == missing:
            assert "aggregator.postgres.password_file" in text
    # Without a password file there is no password at all: refused as well.
    store = make_store(url, postgres=PostgresSection(connect_timeout_seconds=1.0))
    try:
        with pytest.raises(StoreOpenError):
            await store.open()
    finally:
        await store.close()
    assert tcp_pg.run("SELECT COUNT(*) FROM pg_tables WHERE tablename = 'nodes';", name) == ["0"]


async def test_tls_is_verified_against_the_ca(
    tcp_pg: PostgresServer, pki: Pki, tmp_path: Path
) -> None:
    name = _fleet_database(tcp_pg)
    base = f"postgresql://gpuagent@127.0.0.1:{tcp_pg.port}/{name}?sslmode=verify-full"
    store = make_store(f"{base}&sslrootcert={pki.ca_file}")
    async with opened(store):
        with store.database.session() as session:
            ssl = session.execute("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
            assert ssl.fetchone() == (True,)
        store.queue_node(node("n1", "c1", 100.0), stale=False)
        await store.flush()
        assert await store.count("nodes") == 1
    # A server whose certificate another CA signed is not the fleet database.
    other = Pki.create(tmp_path / "other-ca")
    options = PostgresSection(connect_timeout_seconds=1.0)
    stranger = make_store(f"{base}&sslrootcert={other.ca_file}", postgres=options)
    try:
        with pytest.raises(StoreOpenError) as info:
            await stranger.open()
    finally:
        await stranger.close()
    # The log line names the database, not the query (certificate paths).
    assert f"postgresql://gpuagent@127.0.0.1:{tcp_pg.port}/{name}:" in str(info.value)
    assert "sslrootcert" not in str(info.value)


# --- configuration ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u:secret@h/db",
        "postgres://u:secret@h:5432/db?sslmode=verify-full",
        "postgresql://u@h/db?sslmode=require&password=secret",
    ],
)
def test_a_password_in_the_database_url_is_refused(tmp_path: Path, url: str) -> None:
    path = tmp_path / "gpuagent.toml"
    path.write_text(f'[aggregator]\nlisten = "127.0.0.1:19500"\ndatabase = "{url}"\n')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.key == "aggregator.database"
    assert info.value.line == 3
    assert "aggregator.postgres.password_file" in str(info.value)
    assert "secret" not in str(info.value)


def test_a_database_url_without_a_password_is_taken(tmp_path: Path) -> None:
    path = tmp_path / "gpuagent.toml"
    url = "postgresql://fleet@db.example/fleet?sslmode=verify-full"
    path.write_text(f'[aggregator]\ndatabase = "{url}"\n')
    assert load_config(path).aggregator.database == url


async def test_a_row_committed_after_the_view_looked_is_read_at_the_next_refresh(db: Db) -> None:
    import psycopg  # noqa: PLC0415

    b = make_store(db.url)
    async with opened(b):
        state = FleetState()
        view = SharedView(state, b, CordonBudget(BUDGET), interval=1.0)
        await view.start()
        # Another aggregator's batch, still in flight while this one refreshes.
        with psycopg.connect(db.url) as slow:
            slow.execute(
                "INSERT INTO nodes (cluster, node, online, health, reason, last_seen, "
                "agent_version, fingerprint_id, stale, document) "
                "VALUES ('c1', 'slow', TRUE, 'OK', '', 100.0, '0.1.0', 'fp', FALSE, '')"
            )
            await view.refresh()
            assert ("c1", "slow") not in state.nodes
            # Meanwhile a later transaction commits first.
            fast = make_store(db.url)
            async with opened(fast):
                fast.queue_node(node("fast", "c1", 100.0), stale=False)
                await fast.flush()
            await view.refresh()
            assert ("c1", "fast") in state.nodes
            assert ("c1", "slow") not in state.nodes
            slow.commit()
        await view.refresh()
        assert state.nodes[("c1", "slow")].last_seen == 100.0
        assert state.nodes[("c1", "slow")].online
