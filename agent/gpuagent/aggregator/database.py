"""The database under the fleet store: SQLite for one aggregator (the embedded default), or
PostgreSQL shared by several (`aggregator.database = "postgresql://..."`).

The store writes its statements once, with `?` placeholders, in SQL both databases run;
a `Session` runs them on either. What differs lives here: how to connect, how to hold a
lock until a transaction ends, and which errors mean "the database as a whole failed, try
the batch again" rather than "this row is bad".
"""

from __future__ import annotations

import contextlib
import functools
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol
from urllib.parse import urlsplit

from gpuagent.config.schema.aggregator import PostgresSection

if TYPE_CHECKING:
    import psycopg
    import psycopg_pool

Dialect = Literal["sqlite", "postgresql"]

# SQLSTATE classes of PostgreSQL errors that are the server's trouble, not a row's:
# connection exceptions, invalid transaction state (a read-only standby after a
# failover), transaction rollback (serialization, deadlock), insufficient resources (disk
# full, too many connections), operator intervention (shutdown), system errors.
_SERVER_TROUBLE = ("08", "25", "40", "53", "57", "58", "XX")


class Cursor(Protocol):
    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...
    def fetchall(self) -> list[Any]: ...
    def __iter__(self) -> Iterator[Any]: ...


class Session(Protocol):
    """One connection, used by one thread at a time."""

    def execute(self, sql: str, args: Sequence[Any] = ()) -> Cursor: ...
    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None: ...
    def transaction(self) -> contextlib.AbstractContextManager[None]: ...
    def lock(self, name: str) -> None:
        """Inside a transaction: hold the lock called ``name`` until it ends, against every
        other session of every aggregator."""
        ...


def is_postgres(location: str | Path) -> bool:
    return urlsplit(str(location)).scheme in ("postgresql", "postgres")


def describe(location: str | Path) -> str:
    """The location for a log line: a URL without its query (certificate paths, options)."""
    if not is_postgres(location):
        return str(location)
    parts = urlsplit(str(location))
    return f"{parts.scheme}://{parts.netloc}{parts.path}"


class Database(Protocol):
    dialect: Dialect
    # Whether other aggregators may write the same database (their rows show up without
    # passing through this one).
    shared: bool

    def open(self) -> None: ...
    def close(self) -> None: ...
    def session(self) -> contextlib.AbstractContextManager[Session]: ...
    def server_trouble(self, error: Exception) -> bool:
        """Whether ``error`` is the database failing as a whole (locked, I/O error, disk
        full, connection lost): the batch is tried again, nothing is dropped."""
        ...


def database(location: str | Path, postgres: PostgresSection | None = None) -> Database:
    if is_postgres(location):
        return PostgresDatabase(str(location), postgres or PostgresSection())
    return SqliteDatabase(Path(location))


# --- SQLite ------------------------------------------------------------------------------


class _SqliteSession:
    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def execute(self, sql: str, args: Sequence[Any] = ()) -> Cursor:
        return self.db.execute(sql, args)

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        self.db.executemany(sql, rows)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        # IMMEDIATE: the write lock from the start, so the reads a decision makes inside
        # the transaction cannot be overtaken by another writer.
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            if self.db.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    def lock(self, name: str) -> None:
        # One writer at a time is SQLite's own rule: the transaction already holds it.
        del name


class SqliteDatabase:
    dialect: Dialect = "sqlite"
    shared = False

    def __init__(self, path: Path) -> None:
        self.path = path
        self._db: sqlite3.Connection | None = None

    def open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        # WAL with synchronous=NORMAL: a power cut can lose the last batches, never
        # corrupt the file; node reports are re-sent every state interval anyway.
        db.execute("PRAGMA synchronous=NORMAL")
        self._db = db

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    @contextlib.contextmanager
    def session(self) -> Iterator[Session]:
        # One connection, used only from the store's one thread.
        if self._db is None:
            raise RuntimeError("store is not open")
        yield _SqliteSession(self._db)

    def server_trouble(self, error: Exception) -> bool:
        return isinstance(error, sqlite3.OperationalError)


# --- PostgreSQL --------------------------------------------------------------------------


@functools.lru_cache(maxsize=256)
def _placeholders(sql: str) -> str:
    """``?`` placeholders as psycopg's ``%s`` (a literal ``%`` doubled)."""
    return sql.replace("%", "%%").replace("?", "%s")


class _PostgresSession:
    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def execute(self, sql: str, args: Sequence[Any] = ()) -> Cursor:
        if not args:
            # No parameters: sent as written, and it may hold several statements.
            return self.conn.execute(sql.encode())
        return self.conn.execute(_placeholders(sql), args)

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        with self.conn.cursor() as cursor:
            cursor.executemany(_placeholders(sql), rows)

    def transaction(self) -> contextlib.AbstractContextManager[None]:
        return self.conn.transaction()  # type: ignore[return-value]

    def lock(self, name: str) -> None:
        # A transaction-level advisory lock: released by COMMIT or ROLLBACK, and by the
        # server if this aggregator dies, so a lost aggregator never leaves it held.
        self.conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (name,))


def read_password(path: str) -> str | None:
    """The password: the file's first line (a systemd credential, a secret mount)."""
    if not path:
        return None
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        message = f"aggregator.postgres.password_file: cannot read {path}: {exc}"
        raise ConnectionError(message) from exc
    return lines[0] if lines else ""


class PostgresDatabase:
    dialect: Dialect = "postgresql"
    shared = True

    def __init__(self, url: str, options: PostgresSection) -> None:
        self.url = url
        self.options = options
        self._pool: psycopg_pool.ConnectionPool[Any] | None = None

    def open(self) -> None:
        # Imported here: an agent or a SQLite aggregator never loads the driver.
        import psycopg_pool  # noqa: PLC0415

        kwargs: dict[str, Any] = {
            "autocommit": True,
            "connect_timeout": max(1, round(self.options.connect_timeout_seconds)),
            "application_name": "gpuagent-aggregator",
        }
        password = read_password(self.options.password_file)
        if password is not None:
            kwargs["password"] = password
        pool = psycopg_pool.ConnectionPool(
            self.url,
            kwargs=kwargs,
            min_size=1,
            max_size=self.options.pool_max_size,
            timeout=self.options.connect_timeout_seconds,
            open=False,
            name="gpuagent-fleet",
        )
        try:
            pool.open(wait=True, timeout=self.options.connect_timeout_seconds)
        except Exception:
            pool.close()
            raise
        self._pool = pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    @contextlib.contextmanager
    def session(self) -> Iterator[Session]:
        if self._pool is None:
            raise RuntimeError("store is not open")
        with self._pool.connection() as conn:
            yield _PostgresSession(conn)

    def server_trouble(self, error: Exception) -> bool:
        import psycopg  # noqa: PLC0415

        if isinstance(error, psycopg.OperationalError | psycopg.InterfaceError):
            return True
        sqlstate = getattr(error, "sqlstate", None) or ""
        return sqlstate[:2] in _SERVER_TROUBLE
