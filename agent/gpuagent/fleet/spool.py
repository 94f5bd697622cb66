"""The durable outbox: events and action records wait here until the aggregator has them.

A message is written (synchronously, WAL) before anyone tries to publish it and deleted
only once it is acknowledged: by the aggregator, which says which messages it has stored
(end to end), or, with end-to-end acknowledgement off, by the broker's PUBACK. So neither
a broker outage or crash, nor an aggregator away, nor an agent crash loses one. A message
sent but not acknowledged is sent again, after ``resend_after`` seconds, doubling with
each try up to ``_MAX_RESEND_DOUBLINGS``; the aggregator absorbs copies by message id (at
least once, end to end). Messages come out in the order they went in. Bounded by bytes
and age: the oldest go first, and every drop is counted.

`Spool` is the database itself, synchronous; the reporter uses it through `ThreadedSpool`,
which runs every call on the agent's disk thread (`gpuagent.diskio`), so a commit waiting
for a slow disk never holds up the event loop.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import sqlite3
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from gpuagent.diskio import DiskThread

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
        """Open (or create) the spool; SpoolError if it cannot be (a read-only or full
        state directory)."""
        self._wall = wall_clock
        self._max_bytes = max_bytes
        self._max_age = max_age_seconds
        self.depth = self.bytes = self.dropped = self.awaiting_ack = 0
        self._unlogged_drops = 0
        self._drops_logged_at = -math.inf
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(_SCHEMA)
            columns = {row[1] for row in self._db.execute("PRAGMA table_info(outbox)")}
            if "sent" not in columns:  # a spool written by an agent before end-to-end acks
                self._db.execute("ALTER TABLE outbox ADD COLUMN sent REAL")
                self._db.execute("ALTER TABLE outbox ADD COLUMN tries INTEGER NOT NULL DEFAULT 0")
            self._recount()
        except (sqlite3.Error, OSError) as exc:
            raise SpoolError(f"cannot open the spool {path}: {exc}") from exc

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
        row = self._db.execute(
            "SELECT COUNT(*), COALESCE(SUM(LENGTH(payload)), 0), COUNT(sent) FROM outbox"
        )
        self.depth, self.bytes, self.awaiting_ack = (int(v) for v in row.fetchone())

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

    def mark_sent(self, seqs: list[int]) -> None:
        """The broker has these; they wait for the aggregator's acknowledgement."""
        now = self._wall()
        try:
            with self._transaction():
                self._db.executemany(
                    "UPDATE outbox SET sent = ?, tries = tries + 1 WHERE seq = ?",
                    [(now, seq) for seq in seqs],
                )
            self._recount()
        except sqlite3.Error as exc:
            raise SpoolError(str(exc)) from exc

    def resend_all(self) -> None:
        """A new connection: whatever a broker that restarted may have lost goes again."""
        try:
            self._db.execute("UPDATE outbox SET sent = NULL WHERE sent IS NOT NULL")
            self._recount()
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
            self._recount()
        except sqlite3.Error as exc:
            raise SpoolError(str(exc)) from exc
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
            self._recount()
        except sqlite3.Error as exc:
            raise SpoolError(str(exc)) from exc

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
            self._recount()
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

    def cursors(self, prefix: str) -> dict[str, int]:
        """Every cursor whose name starts with ``prefix``, by the rest of its name."""
        rows = self._db.execute(
            "SELECT name, value FROM cursors WHERE substr(name, 1, ?) = ?", (len(prefix), prefix)
        ).fetchall()
        return {str(name)[len(prefix) :]: int(value) for name, value in rows}

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


class ThreadedSpool:
    """The spool, every call on the disk thread. Opened by `open()`, which may fail (a
    read-only or full state directory) and may be tried again; until it succeeds, `ready`
    is false and the reporter keeps messages in memory."""

    def __init__(
        self,
        path: Path,
        disk: DiskThread,
        *,
        max_bytes: int,
        max_age_seconds: float,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = path
        self._disk = disk
        self._opener = functools.partial(
            Spool, path, max_bytes=max_bytes, max_age_seconds=max_age_seconds, wall_clock=wall_clock
        )
        self._spool: Spool | None = None
        self.error = ""  # why the spool cannot be opened or written, while it cannot

    @property
    def ready(self) -> bool:
        return self._spool is not None

    async def open(self) -> bool:
        """Open the spool if it is not open yet; whether it is. Never raises."""
        if self._spool is None:
            try:
                self._spool = await self._disk.run(self._opener)
                self.error = ""
            except SpoolError as exc:
                self.error = str(exc)
        return self._spool is not None

    def _db(self) -> Spool:
        if self._spool is None:
            raise SpoolError(self.error or "the spool is not open")
        return self._spool

    # Counters, read from the event loop (the disk thread keeps them current).
    @property
    def depth(self) -> int:
        return self._spool.depth if self._spool else 0

    @property
    def size(self) -> int:
        """Bytes of payload waiting."""
        return self._spool.bytes if self._spool else 0

    @property
    def dropped(self) -> int:
        return self._spool.dropped if self._spool else 0

    @property
    def awaiting_ack(self) -> int:
        return self._spool.awaiting_ack if self._spool else 0

    async def put(self, messages: list[tuple[str, str, bytes]]) -> int:
        return await self._disk.run(self._db().put, messages)

    async def due(self, resend_after: float, limit: int = 100) -> list[Spooled]:
        return await self._disk.run(self._db().due, resend_after, limit)

    async def next_due(self, resend_after: float) -> float | None:
        return await self._disk.run(self._db().next_due, resend_after)

    async def mark_sent(self, seqs: list[int]) -> None:
        await self._disk.run(self._db().mark_sent, seqs)

    async def resend_all(self) -> None:
        await self._disk.run(self._db().resend_all)

    async def acknowledge(self, ids: list[str]) -> int:
        return await self._disk.run(self._db().acknowledge, ids)

    async def remove(self, seqs: list[int]) -> None:
        await self._disk.run(self._db().remove, seqs)

    async def expire(self) -> None:
        await self._disk.run(self._db().expire)

    async def head(self, limit: int = 100) -> list[Spooled]:
        return await self._disk.run(self._db().head, limit)

    async def cursors(self, prefix: str) -> dict[str, int]:
        return await self._disk.run(self._db().cursors, prefix)

    async def cursor(self, name: str) -> int:
        return await self._disk.run(self._db().cursor, name)

    async def set_cursor(self, name: str, value: int) -> None:
        await self._disk.run(self._db().set_cursor, name, value)

    def close_soon(self) -> None:
        """Close the database once the calls queued before are done."""
        if self._spool is not None:
            self._disk.call_soon(self._spool.close)
