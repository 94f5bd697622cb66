"""The fleet schema and the store's statements, run as written on a real PostgreSQL.

The aggregator keeps its state in SQLite; the schema and every statement are meant to
move to a PostgreSQL shared by several aggregators unchanged (docs/fleet.md). This holds
them to it: a throwaway cluster on a Unix socket, the schema applied twice, and each
statement prepared with `$n` placeholders where the store writes `?`.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import pytest

from conftest import require_that
from gpuagent.aggregator import store

pytestmark = pytest.mark.integration

Value = str | int | float | bool | None

ROWS: dict[str, list[tuple[Value, ...]]] = {
    "events": [("e1", "c", "n1", 1.0, "kernel", "{}")],
    "actions": [("a1", "c", "n1", 1.0, "{}")],
    "cordons": [("r1", "c", "n1", "cordon", "approved", 1.0, "budget", None)],
    "replies": [("p1", "c", "n1", 1.0, "{}")],
    "commands": [("k1", "c", "n1", 1.0, "refresh", "{}")],
}


def _binary(name: str) -> Path | None:
    found = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"), key=lambda p: p.parts[-3])
    return found[-1] if found else None


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


class Postgres:
    def __init__(self, socket_dir: Path, port: int) -> None:
        self.socket_dir = socket_dir
        self.port = port

    def run(self, sql: str) -> list[str]:
        psql = _binary("psql") or Path("psql")
        proc = subprocess.run(
            [
                *(str(psql), "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1"),
                *("-h", str(self.socket_dir), "-p", str(self.port)),
                *("-U", "gpuagent", "-d", "postgres", "-f", "-"),
            ],
            input=sql,
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.splitlines()

    def count(self, table: str) -> int:
        return int(self.run(f"SELECT COUNT(*) FROM {table};")[0])


def _free_port() -> int:
    import socket  # noqa: PLC0415

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def postgres() -> Iterator[Postgres]:
    initdb, pg_ctl = _binary("initdb"), _binary("pg_ctl")
    require_that(
        initdb is not None and pg_ctl is not None,
        "PostgreSQL's initdb and pg_ctl (Debian package postgresql; the test command installs it)",
    )
    assert initdb is not None
    assert pg_ctl is not None
    root = Path(tempfile.mkdtemp(prefix="gpuagent-pg-"))
    as_owner: list[str] = []
    if os.geteuid() == 0:
        # PostgreSQL will not run as root: the throwaway cluster belongs to its own user.
        shutil.chown(root, "postgres")
        as_owner = ["runuser", "-u", "postgres", "--"]
    data, port = root / "data", _free_port()
    options = f"-c listen_addresses='' -k {root} -p {port} -c fsync=off"

    def ctl(*args: str) -> None:
        subprocess.run([*as_owner, *args], check=True, capture_output=True, timeout=120)

    ctl(str(initdb), "-D", str(data), "-A", "trust", "-U", "gpuagent", "-E", "UTF8", "--no-sync")
    ctl(str(pg_ctl), "-D", str(data), "-l", str(root / "log"), "-o", options, "-w", "start")
    try:
        server = Postgres(root, port)
        schema = resources.files("gpuagent.aggregator").joinpath("sql/0001_fleet.sql").read_text()
        server.run(schema + schema)  # IF NOT EXISTS: a restart applies it again
        yield server
    finally:
        subprocess.run(
            [*as_owner, str(pg_ctl), "-D", str(data), "-m", "immediate", "-w", "stop"],
            capture_output=True,
            check=False,
        )
        shutil.rmtree(root, ignore_errors=True)


def test_every_insert_runs_and_a_duplicate_is_stored_once(postgres: Postgres) -> None:
    assert set(ROWS) == set(store._INSERT)
    for table, rows in ROWS.items():
        statements = [_prepared(store._INSERT[table], row) for row in rows]
        postgres.run("".join(statements * 2))
        assert postgres.count(table) == len(rows), table


def test_the_node_upsert_replaces_the_row(postgres: Postgres) -> None:
    row: tuple[Value, ...] = ("c", "n1", True, "OK", "", 1.0, "0.1.0", "fp", False, "{}")
    changed = (*row[:2], False, "CRITICAL", "connection lost", 2.0, *row[6:])
    postgres.run(_prepared(store._UPSERT_NODE, row) + _prepared(store._UPSERT_NODE, changed))
    assert postgres.run(_prepared(store._SELECT_NODES, ())) == [
        "c|n1|f|CRITICAL|connection lost|2|0.1.0|{}"
    ]


def test_reads_and_prunes_run(postgres: Postgres) -> None:
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
    assert [line.split("|")[0] for line in cordons] == ["r1"] * len(cordons)
    for table in store._INSERT:
        postgres.run(_prepared(store._PRUNE_BY_AGE.format(table=table), (1.5,)))
    assert postgres.count("events") == 4
    assert [postgres.count(t) for t in store._INSERT if t != "events"] == [0, 0, 0, 0]
    postgres.run(_prepared(store._PRUNE_BY_COUNT, (1,)))  # keep the newest 2
    assert postgres.run("SELECT id FROM events ORDER BY time;") == ["p4", "p5"]
