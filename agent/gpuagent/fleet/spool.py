"""The durable outbox: events and action records wait here until the aggregator has them.

A message is written (synchronously, WAL) before anyone tries to publish it and deleted
only once it is acknowledged: by the aggregator, which says which messages it has stored
(end to end), or, with end-to-end acknowledgement off, by the broker's PUBACK. So neither
a broker outage or crash, nor an aggregator away, nor an agent crash loses one. A message
sent but not acknowledged is sent again, after ``resend_after`` seconds, doubling with
each try up to ``_MAX_RESEND_DOUBLINGS``; the aggregator absorbs copies by message id (at
least once, end to end). Messages come out in the order they went in. Bounded by bytes
and age: the oldest go first, and every drop is counted.
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
# A message not acknowledged is sent again after resend_after, 2x, 4x ... up to 32x that:
# an aggregator away for an hour does not get each message a hundred times when it
# returns, and a lost one still goes again within about 16 minutes (30 s x 32).
_MAX_RESEND_DOUBLINGS = 5
# When a message sent `tries` times is due again, in SQL.
_DUE = f"sent + ? * (1 << MIN(tries - 1, {_MAX_RESEND_DOUBLINGS}))"
_COLUMNS = "SELECT seq, id, channel, payload, created FROM outbox"
# Built from the constants above only.
_HEAD = f"{_COLUMNS} ORDER BY seq LIMIT ?"
_DUE_NOW = f"{_COLUMNS} WHERE sent IS NULL OR {_DUE} <= ? ORDER BY seq LIMIT ?"
_NEXT_DUE = f"SELECT MIN({_DUE}) FROM outbox WHERE sent IS NOT NULL"  # noqa: S608

_SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    channel TEXT NOT NULL,
    payload BLOB NOT NULL,
    created REAL NOT NULL,
    sent REAL,
    tries INTEGER NOT NULL DEFAULT 0
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
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(outbox)")}
        if "sent" not in columns:  # a spool written by an agent before end-to-end acks
            self._db.execute("ALTER TABLE outbox ADD COLUMN sent REAL")
            self._db.execute("ALTER TABLE outbox ADD COLUMN tries INTEGER NOT NULL DEFAULT 0")
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
        """The oldest waiting messages, in order, sent or not."""
        return self._select(_HEAD, (limit,))

    def due(self, resend_after: float, limit: int = 100) -> list[Spooled]:
        """The oldest messages to send now, in order: those never sent, and those sent
        without an acknowledgement for long enough."""
        return self._select(_DUE_NOW, (resend_after, self._wall(), limit))

    def _select(self, query: str, args: tuple[object, ...]) -> list[Spooled]:
        rows = self._db.execute(query, args).fetchall()
        return [Spooled(int(s), str(i), str(c), bytes(p), float(t)) for s, i, c, p, t in rows]

    def next_due(self, resend_after: float) -> float | None:
        """Seconds until the next message sent without an acknowledgement is due again."""
        row = self._db.execute(_NEXT_DUE, (resend_after,)).fetchone()
        return None if row[0] is None else max(0.0, float(row[0]) - self._wall())

    @property
    def awaiting_ack(self) -> int:
        row = self._db.execute("SELECT COUNT(*) FROM outbox WHERE sent IS NOT NULL").fetchone()
        return int(row[0])

    def mark_sent(self, seqs: list[int]) -> None:
        """The broker has these; they wait for the aggregator's acknowledgement."""
        now = self._wall()
        try:
            with self._transaction():
                self._db.executemany(
                    "UPDATE outbox SET sent = ?, tries = tries + 1 WHERE seq = ?",
                    [(now, seq) for seq in seqs],
                )
        except sqlite3.Error as exc:
            raise SpoolError(str(exc)) from exc

    def resend_all(self) -> None:
        """A new connection: whatever a broker that restarted may have lost goes again."""
        try:
            self._db.execute("UPDATE outbox SET sent = NULL WHERE sent IS NOT NULL")
        except sqlite3.Error as exc:
            raise SpoolError(str(exc)) from exc

    def acknowledge(self, ids: list[str]) -> int:
        """The aggregator stored these: drop them. How many were still here."""
        removed: list[tuple[int]] = []
        try:
            with self._transaction():
                for message_id in ids:
                    removed += self._db.execute(
                        "DELETE FROM outbox WHERE id = ? RETURNING LENGTH(payload)", (message_id,)
                    ).fetchall()
        except sqlite3.Error as exc:
            raise SpoolError(str(exc)) from exc
        self.depth -= len(removed)
        self.bytes -= sum(int(r[0]) for r in removed)
        return len(removed)

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
