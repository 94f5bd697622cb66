"""The fleet database: write-behind, retention, restart, portable schema."""

from __future__ import annotations

import re
import sqlite3
from importlib import resources
from pathlib import Path

import aggregator_support as msg
from gpuagent.aggregator.records import from_online_state
from gpuagent.aggregator.store import CordonRow, FleetStore
from gpuagent.config import CordonBudgetSection
from gpuagent.fleet import schema


def store(tmp_path: Path, **kwargs: float) -> FleetStore:
    return FleetStore(
        tmp_path / "db" / "fleet.sqlite",
        retention_seconds=kwargs.get("retention", 3600.0),
        max_events=int(kwargs.get("max_events", 1000)),
        budget=CordonBudgetSection(window_seconds=kwargs.get("window", 3600.0)),
    )


async def test_rows_wait_in_memory_until_a_flush_commits_them(tmp_path: Path) -> None:
    s = store(tmp_path)
    await s.open()
    message = msg.state("n1")
    s.queue_node(from_online_state(message, schema.encode(message).decode(), 1e12), stale=False)
    s.queue_event(msg.event("n1"), "{}")
    assert s.pending() == 2
    assert await s.count("events") == 0
    await s.flush()
    assert s.pending() == 0
    assert await s.count("events") == 1
    await s.close()
    mode = sqlite3.connect(tmp_path / "db" / "fleet.sqlite").execute("PRAGMA journal_mode")
    assert mode.fetchone() == ("wal",)


async def test_the_node_table_is_coalesced_to_the_latest_record(tmp_path: Path) -> None:
    s = store(tmp_path)
    await s.open()
    for health in ("OK", "WARN", "CRITICAL"):
        message = msg.state("n1", health=health)
        s.queue_node(from_online_state(message, schema.encode(message).decode(), 1e12), stale=False)
    assert s.pending() == 1
    await s.close()
    s2 = store(tmp_path)
    await s2.open()
    (record,) = await s2.load_nodes()
    assert (record.node, record.health, len(record.gpus)) == ("n1", "CRITICAL", 1)
    await s2.close()


async def test_events_are_pruned_by_age_and_by_count(tmp_path: Path) -> None:
    s = store(tmp_path, retention=100.0, max_events=3)
    await s.open()
    for t in (0.0, 500.0, 600.0, 700.0, 800.0, 900.0):
        event = msg.event("n1", when=t)
        s.queue_event(event, schema.encode(event).decode())
    await s.flush()
    assert await s.prune(now=650.0) == 3  # 0 and 500 by age, then 600 for the count
    times = [e["time"] for e in await s.events(node=None, since=None, limit=10)]
    assert times == [900.0, 800.0, 700.0]
    assert [e["time"] for e in await s.events(node="n1", since=750.0, limit=10)] == [900.0, 800.0]
    assert await s.events(node="n2", since=None, limit=10) == []
    await s.close()


async def test_every_history_table_is_pruned_but_cordons_of_the_budget_window_stay(
    tmp_path: Path,
) -> None:
    s = store(tmp_path, retention=100.0, window=1000.0)
    await s.open()
    now = 2000.0
    for i, t in enumerate((500.0, 1500.0, 1950.0)):  # old, within the window, recent
        action = schema.envelope("action", f"n1:audit:{i}", "n1", "c1", t)
        action["record"] = {}
        s.queue_action(action, "{}")
        s.queue_reply(
            schema.reply_message("n1", "c1", f"cmd{i}", ok=True, detail="") | {"time": t}, "{}"
        )
        s.queue_command(schema.command_message(f"cmd{i}", "n1", "c1", "refresh") | {"time": t})
        s.queue_event(msg.event("n1", when=t), "{}")
        s.queue_cordon(CordonRow(f"r{i}", "c1", "n1", "cordon", "approved", t, "ok", None))
    await s.flush()
    assert await s.prune(now) == 4 * 2 + 1
    for table in ("events", "actions", "replies", "commands"):
        assert await s.count(table) == 1, table
    # The approval 500 s ago is older than the retention but within the budget's window:
    # a restart must still count it.
    assert [r.request_id for r in await s.cordons(since=now - 1000.0)] == ["r2", "r1"]
    assert await s.count("cordons") == 2
    await s.close()


async def test_cordon_rows_read_back_newest_first(tmp_path: Path) -> None:
    s = store(tmp_path)
    await s.open()
    for i, t in enumerate((10.0, 30.0, 20.0)):
        s.queue_cordon(CordonRow(f"r{i}", "c1", f"n{i}", "cordon", "approved", t, "ok", None))
    await s.flush()
    assert [r.request_id for r in await s.cordons()] == ["r1", "r2", "r0"]
    assert [r.request_id for r in await s.cordons(since=15.0)] == ["r1", "r2"]
    await s.close()


def test_the_schema_uses_only_portable_types() -> None:
    """SQLite accepts any type name; PostgreSQL does not. Hold the schema to the types both
    understand, so it can move to PostgreSQL unchanged."""
    text = resources.files("gpuagent.aggregator").joinpath("sql/0001_fleet.sql").read_text()
    body = "\n".join(line.split("--")[0] for line in text.splitlines())
    columns = re.findall(r"^\s+(\w+) ([A-Z ]+?)(?:\(\d+\))?(?: NOT NULL)?,?$", body, re.MULTILINE)
    assert len(columns) > 20
    assert {t for _, t in columns} <= {"VARCHAR", "TEXT", "BOOLEAN", "DOUBLE PRECISION", "BIGINT"}
    for banned in ("AUTOINCREMENT", "WITHOUT ROWID", "OR IGNORE", "OR REPLACE", "STRICT"):
        assert banned not in body.upper()
