"""Schema migrations of the fleet database, safe for a rolling upgrade of several
aggregators sharing one PostgreSQL.

Migrations are the files `sql/NNNN_name.sql` (every database) and
`sql/NNNN_name.<dialect>.sql` (only that one: a number with only a dialect file is
recorded as applied, doing nothing, on the other). Each says, in a `-- oldest_compatible:
N` line, the oldest schema version whose aggregators still work once it is applied.
Migrations only add (tables, columns with defaults, indexes, triggers), so that is 1 for
every one so far: during a rolling upgrade the first new aggregator migrates, and the old
ones carry on beside it. An aggregator that finds a migration it does not know whose
oldest compatible version is newer than its own refuses to start, naming both.

Applying runs in one transaction under a lock (`Session.lock`), so aggregators starting
together apply each migration exactly once; the applied ones are rows of
`schema_migrations`. A SQLite file made before migrations existed has the tables of
migration 1 already: its statements (all IF NOT EXISTS) find them.
"""

from __future__ import annotations

import re
import socket
import sqlite3
import time
from dataclasses import dataclass
from importlib import resources

from gpuagent.aggregator.database import Dialect, Session

_NAME_RE = re.compile(r"^(\d{4})_([a-z0-9_]+?)(?:\.(sqlite|postgresql))?\.sql$")
_COMPATIBLE_RE = re.compile(r"^-- oldest_compatible: (\d+)$", re.MULTILINE)
LOCK = "gpuagent.fleet.schema"

_CREATE_TABLE = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version INTEGER PRIMARY KEY,
    name VARCHAR(128) NOT NULL,
    oldest_compatible INTEGER NOT NULL,
    applied_at DOUBLE PRECISION NOT NULL,
    applied_by VARCHAR(256) NOT NULL
)
"""
_APPLIED = "SELECT version, name, oldest_compatible FROM schema_migrations ORDER BY version"
_RECORD = (
    "INSERT INTO schema_migrations (version, name, oldest_compatible, applied_at, applied_by) "
    "VALUES (?, ?, ?, ?, ?)"
)


class SchemaError(RuntimeError):
    """The database's schema is one this aggregator cannot work with."""


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    oldest_compatible: int
    # The SQL for each dialect; empty where the migration does nothing.
    sql: dict[str, str]


def known() -> list[Migration]:
    """The migrations shipped with this aggregator, in order."""
    found: dict[int, dict[str, str]] = {}
    names: dict[int, str] = {}
    for entry in resources.files("gpuagent.aggregator").joinpath("sql").iterdir():
        match = _NAME_RE.match(entry.name)
        if match is None:
            continue
        version, name, dialect = int(match.group(1)), match.group(2), match.group(3)
        if names.setdefault(version, name) != name:
            raise SchemaError(f"migration {version} has two names: {names[version]}, {name}")
        text = entry.read_text(encoding="utf-8")
        for each in (dialect,) if dialect else ("sqlite", "postgresql"):
            found.setdefault(version, {})[each] = text
    migrations = []
    for version in sorted(found):
        texts = found[version]
        compatible = {int(m) for t in texts.values() for m in _COMPATIBLE_RE.findall(t)}
        if len(compatible) != 1:
            raise SchemaError(f"migration {version}: one '-- oldest_compatible: N' line needed")
        migrations.append(Migration(version, names[version], compatible.pop(), texts))
    if [m.version for m in migrations] != list(range(1, len(migrations) + 1)):
        raise SchemaError("migrations must be numbered 1, 2, 3, ... without gaps")
    return migrations


def statements(sql: str, dialect: Dialect) -> list[str]:
    """One migration's statements. PostgreSQL takes the whole text at once (function bodies
    hold semicolons); SQLite one statement per call, inside the transaction (its
    executescript would commit first)."""
    if not sql.strip():
        return []
    if dialect == "postgresql":
        return [sql]
    out, current = [], ""
    for line in sql.splitlines(keepends=True):
        current += line
        if sqlite3.complete_statement(current):
            out.append(current.strip())
            current = ""
    if current.strip() and not all(
        line.strip().startswith("--") or not line.strip() for line in current.splitlines()
    ):
        raise SchemaError(f"an incomplete statement: {current.strip()[:80]!r}")
    return out


def migrate(session: Session, dialect: Dialect, migrations: list[Migration] | None = None) -> int:
    """Bring the database up to the newest migration this aggregator knows; return the
    database's version. Raises SchemaError if a newer aggregator applied a migration this
    one cannot work with."""
    migrations = known() if migrations is None else migrations
    ours = migrations[-1].version if migrations else 0
    with session.transaction():
        session.lock(LOCK)
        session.execute(_CREATE_TABLE)
        applied = {int(v): (str(n), int(c)) for v, n, c in session.execute(_APPLIED).fetchall()}
        for migration in migrations:
            if migration.version in applied:
                continue
            for statement in statements(migration.sql.get(dialect, ""), dialect):
                session.execute(statement)
            session.execute(
                _RECORD,
                (
                    migration.version,
                    migration.name,
                    migration.oldest_compatible,
                    time.time(),
                    socket.gethostname(),
                ),
            )
        newer = {v: nc for v, nc in applied.items() if v > ours}
        blocking = {v: nc for v, nc in newer.items() if nc[1] > ours}
    if blocking:
        version = max(blocking)
        name, compatible = blocking[version]
        raise SchemaError(
            f"the fleet database has schema version {version} ({name}), which needs an "
            f"aggregator of schema version {compatible} or newer; this one knows up to "
            f"{ours}: upgrade it"
        )
    return max([ours, *newer])
