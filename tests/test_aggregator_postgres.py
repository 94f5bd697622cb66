"""The fleet schema and the store's statements, run as written on a real PostgreSQL.

The store runs one set of statements on SQLite and on a PostgreSQL shared by several
aggregators (docs/fleet.md). This holds each to PostgreSQL as written, beneath the
driver: a throwaway cluster on a Unix socket, the first migration applied twice, and each
statement prepared with `$n` placeholders where the store writes `?`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator

import pytest

import postgres_server
from conftest import require_that
from gpuagent.aggregator import fleetrules, maintenance, migrations, store
from postgres_server import PostgresServer

pytestmark = pytest.mark.integration

Value = str | int | float | bool | None

ROWS: dict[str, list[tuple[Value, ...]]] = {
    "events": [("e1", "c", "n1", 1.0, "kernel", "{}")],
    "actions": [("a1", "c", "n1", 1.0, "{}")],
    "cordons": [("r1", "c", "n1", "cordon", "approved", 1.0, "budget", None)],
    "replies": [("p1", "c", "n1", 1.0, "{}")],
    "commands": [("k1", "c", "n1", 1.0, "refresh", "{}")],
    "history": [("h1", "c", "n1", 1.0, "sample", '{"kind": "sample"}')],
    "incidents": [("fi-1", "c", "nvlink:u/1", "open", 1.0, 1.0, '{"id": "fi-1"}')],
    "gpu_history": [("g1", "c", "n1", "GPU-1", 1.0, "critical", '{"index": 0}')],
    "rule_findings": [("f1", "c", "n1", "GPU-1", "die_defect", "open", 1.0, '{"id": "f1"}')],
    "maintenance": [("mw-1", "", "rack=r1", 1.0, 2.0, 1.0, '{"id": "mw-1"}')],
}


def _literal(value: Value) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int | float):
        if math.isinf(value):
            return "'-Infinity'" if value < 0 else "'Infinity'"
        return repr(value)
    return "'" + value.replace("'", "''") + "'"


def _prepared(statement: str, values: tuple[Value, ...]) -> str:
    """``statement`` as the store runs it, bound to ``values`` the way a driver would."""
    numbers = iter(range(1, len(values) + 1))
    numbered = re.sub(r"\?", lambda _: f"${next(numbers)}", statement)
    assert next(numbers, None) is None, "one value per placeholder"
    args = f"({', '.join(_literal(v) for v in values)})" if values else ""
    return f"PREPARE s AS {numbered};\nEXECUTE s{args};\nDEALLOCATE s;\n"


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    require_that(
        postgres_server.available(),
        "PostgreSQL's initdb and pg_ctl (Debian package postgresql; the test command installs it)",
    )
    with postgres_server.throwaway_postgres() as server:
        first, *later = migrations.known()
        schema = first.sql["postgresql"]
        server.run(schema + schema)  # IF NOT EXISTS: the tables of an older file stay
        for migration in later:
            server.run(migration.sql["postgresql"])
        yield server


def test_every_insert_runs_and_a_duplicate_is_stored_once(postgres: PostgresServer) -> None:
    assert set(ROWS) == set(store._INSERT)
    for table, rows in ROWS.items():
        statements = [_prepared(store._INSERT[table], row) for row in rows]
        postgres.run("".join(statements * 2))
        assert postgres.count(table) == len(rows), table


def test_the_node_upsert_replaces_the_row(postgres: PostgresServer) -> None:
    row: tuple[Value, ...] = ("c", "n1", True, "OK", "", 1.0, "0.1.0", "fp", False, "{}", "{}")
    changed = (*row[:2], False, "CRITICAL", "connection lost", 2.0, *row[6:])
    postgres.run(_prepared(store._UPSERT_NODE, row) + _prepared(store._UPSERT_NODE, changed))
    assert postgres.run(_prepared(store._SELECT_NODES, ())) == [
        "c|n1|f|CRITICAL|connection lost|2|0.1.0|{}"
    ]
    postgres.run(_prepared(store._MARK_STALE, (True, "c", "n1", 1.0)))  # an older report
    assert postgres.run("SELECT stale FROM nodes;") == ["f"]
    postgres.run(_prepared(store._MARK_STALE, (True, "c", "n1", 2.0)))
    assert postgres.run("SELECT stale FROM nodes;") == ["t"]


def test_reads_and_prunes_run(postgres: PostgresServer) -> None:
    postgres.run("DELETE FROM events;")
    postgres.run(
        "".join(
            _prepared(store._INSERT["events"], (f"p{t}", "c", "n2", float(t), "kernel", "{}"))
            for t in range(1, 6)
        )
    )
    newest = store._SELECT_BODIES.format(table="events", where=" WHERE node = ? AND time >= ?")
    assert len(postgres.run(_prepared(newest, ("n2", 4.0, 10)))) == 2
    cordons = postgres.run(_prepared(store._SELECT_CORDONS, (float("-inf"), 10)))
    history = postgres.run(_prepared(store._SELECT_HISTORY, ("c", "n1", 0.5, 10)))
    assert history == ['{"kind": "sample"}']
    assert postgres.run(_prepared(store._SELECT_INCIDENTS, (0.5, 10))) == ['{"id": "fi-1"}']
    assert postgres.run(_prepared(store._SELECT_INCIDENT, ("fi-1",))) == ['{"id": "fi-1"}']
    # A grown incident rewrites its row.
    grown = ("fi-1", "c", "nvlink:u/1", "closed", 1.0, 1.2, '{"id": "fi-1", "n": 2}')
    postgres.run(_prepared(store._INSERT["incidents"], grown))
    assert postgres.run("SELECT state, time FROM incidents;") == ["closed|1.2"]
    assert [line.split("|")[0] for line in cordons] == ["r1"] * len(cordons)
    # The fleet rules' windowed reads.
    facts = fleetrules._FACTS_OF_GPU
    assert postgres.run(_prepared(facts, ("GPU-1", "critical", 0.5, 2.0, 10))) == [
        '1|n1|{"index": 0}'
    ]
    of_node = fleetrules._FACTS_OF_NODE
    assert len(postgres.run(_prepared(of_node, ("c", "n1", "critical", 0.5, 2.0, 10)))) == 1
    own = fleetrules._OWN_FACTS_OF_NODE  # the node's own: GPU-1's fact is not
    assert postgres.run(_prepared(own, ("c", "n1", "critical", 0.5, 2.0, 10))) == []
    assert postgres.run(_prepared(fleetrules.SELECT_OPEN, (10,))) == ['{"id": "f1"}']
    assert postgres.run(_prepared(fleetrules.SELECT_RECENT, (0.5, 10))) == ['{"id": "f1"}']
    assert postgres.run(_prepared(fleetrules.SELECT_FINDING, ("f1",))) == ['{"id": "f1"}']
    assert postgres.run(_prepared(maintenance.SELECT_WINDOWS, (1.5,))) == ['{"id": "mw-1"}']
    postgres.run(_prepared(store._PRUNE_WINDOWS, (1.5,)))
    assert postgres.count("maintenance") == 1  # ended at 2.0: kept
    postgres.run(_prepared(store._PRUNE_WINDOWS, (2.5,)))
    assert postgres.count("maintenance") == 0
    # An open finding outlives every retention; a cleared one does not.
    postgres.run(_prepared(store._PRUNE_FINDINGS, (1.5,)))
    assert postgres.count("rule_findings") == 1
    cleared = ("f1", "c", "n1", "GPU-1", "die_defect", "cleared", 1.2, '{"id": "f1"}')
    postgres.run(_prepared(store._INSERT["rule_findings"], cleared))
    postgres.run(_prepared(store._PRUNE_FINDINGS, (1.5,)))
    assert postgres.count("rule_findings") == 0
    for table in store._INSERT:
        postgres.run(_prepared(store._PRUNE_BY_AGE.format(table=table), (1.5,)))
    assert postgres.count("events") == 4
    assert [postgres.count(t) for t in store._INSERT if t != "events"] == [0] * 9
    postgres.run(_prepared(store._PRUNE_BY_COUNT, (1,)))  # keep the newest 2
    assert postgres.run("SELECT id FROM events ORDER BY time;") == ["p4", "p5"]
