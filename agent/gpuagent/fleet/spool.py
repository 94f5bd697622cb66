"""The durable outbox: events and action records wait here until the broker has them.

A message is written (synchronously, WAL) before anyone tries to publish it and deleted
only after the broker acknowledged it, so neither a broker outage nor an agent crash
loses one; a crash between the acknowledgement and the delete sends it again, which the
aggregator absorbs by message id (at least once, end to end). Messages come out in the
order they went in. Bounded by bytes and age: the oldest go first, and every drop is
counted.
"""

from __future__ import annotations

import contextlib
import logging
import math
import sqlite3
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

# Drops are logged when they start, then at most this often while they go on.
_DROP_LOG_SECONDS = 60.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    channel TEXT NOT NULL,
    payload BLOB NOT NULL,
    created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS cursors (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
"""


class SpoolError(Exception):
    """The spool cannot be written (disk full, read-only): the caller keeps the message."""


@dataclass(frozen=True, slots=True)
class Spooled:
    seq: int
    id: str
    channel: str
    payload: bytes
    created: float


class Spool:
    def __init__(
        self,
        path: Path,
        *,
        max_bytes: int,
        max_age_seconds: float,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._wall = wall_clock
        self._max_bytes = max_bytes
        self._max_age = max_age_seconds
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)
        self.depth = self.bytes = self.dropped = 0
        self._unlogged_drops = 0
        self._drops_logged_at = -math.inf
        self._recount()

    def close(self) -> None:
        self._db.close()

    def put(self, messages: list[tuple[str, str, bytes]]) -> int:
        """Keep (id, channel, payload) messages, in one transaction (one disk sync for a
        burst); ids already waiting are ignored. How many were new."""
        now = self._wall()
        added = 0
        try:
            with self._transaction():
                for message_id, channel, payload in messages:
                    cursor = self._db.execute(
                        "INSERT OR IGNORE INTO outbox (id, channel, payload, created)"
                        " VALUES (?, ?, ?, ?)",
                        (message_id, channel, payload, now),
                    )
                    if cursor.rowcount:
                        added += 1
                        self.depth += 1
                        self.bytes += len(payload)
        except sqlite3.Error as exc:
            self._recount()
            raise SpoolError(str(exc)) from exc
        if added:
            self.expire()
        return added

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def _recount(self) -> None:
        row = self._db.execute("SELECT COUNT(*), COALESCE(SUM(LENGTH(payload)), 0) FROM outbox")
        self.depth, self.bytes = (int(v) for v in row.fetchone())

    def head(self, limit: int = 100) -> list[Spooled]:
        """The oldest waiting messages, in order."""
        rows = self._db.execute(
            "SELECT seq, id, channel, payload, created FROM outbox ORDER BY seq LIMIT ?",
            (limit,),
        ).fetchall()
        return [Spooled(int(s), str(i), str(c), bytes(p), float(t)) for s, i, c, p, t in rows]

    def remove(self, seqs: list[int]) -> None:
        """The broker has these (or refused them for good): one transaction."""
        removed: list[tuple[int]] = []
        try:
            with self._transaction():
                for seq in seqs:
                    removed += self._db.execute(
                        "DELETE FROM outbox WHERE seq = ? RETURNING LENGTH(payload)", (seq,)
                    ).fetchall()
        except sqlite3.Error as exc:
            raise SpoolError(str(exc)) from exc
        self.depth -= len(removed)
        self.bytes -= sum(int(r[0]) for r in removed)

    def expire(self) -> None:
        """Drop what is past the age bound, then the oldest while over the size bound.
        Runs after each write and when a connection starts to drain (an outage ages
        messages without writing any)."""
        try:
            expired = self._db.execute(
                "DELETE FROM outbox WHERE created < ? RETURNING LENGTH(payload)",
                (self._wall() - self._max_age,),
            ).fetchall()
            self._dropped(expired, "older than max_age_seconds")
            while self.bytes > self._max_bytes and self.depth > 1:
                oldest = self._db.execute(
                    "DELETE FROM outbox WHERE seq = (SELECT MIN(seq) FROM outbox)"
                    " RETURNING LENGTH(payload)"
                ).fetchall()
                if not oldest:  # the counters were off: trust the table
                    self._recount()
                    break
                self._dropped(oldest, "spool over max_bytes")
        except sqlite3.Error as exc:
            # The messages are stored; the bounds are enforced at the next write.
            log.warning("MQTT spool bounds not enforced: %s", exc)

    def _dropped(self, rows: list[tuple[int]], why: str) -> None:
        if not rows:
            return
        self.dropped += len(rows)
        self.depth -= len(rows)
        self.bytes -= sum(int(r[0]) for r in rows)
        # Once per episode of drops, then at most once a minute with the count since.
        now = time.monotonic()
        self._unlogged_drops += len(rows)
        if now - self._drops_logged_at >= _DROP_LOG_SECONDS:
            log.warning("MQTT spool dropped its %d oldest messages: %s", self._unlogged_drops, why)
            self._drops_logged_at, self._unlogged_drops = now, 0

    def cursor(self, name: str) -> int:
        row = self._db.execute("SELECT value FROM cursors WHERE name = ?", (name,)).fetchone()
        return int(row[0]) if row else 0

    def set_cursor(self, name: str, value: int) -> None:
        try:
            self._db.execute(
                "INSERT INTO cursors (name, value) VALUES (?, ?)"
                " ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                (name, value),
            )
        except sqlite3.Error as exc:
            raise SpoolError(str(exc)) from exc
