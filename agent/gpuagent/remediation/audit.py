"""The audit trail and the memory behind budgets: every plan, attempt and result, in SQLite
under `agent.state_dir`.

Records are written before an action starts ("started") and after it ends, with
synchronous commits, so a crash or restart can neither forget an attempt nor let a crash
loop exceed a budget: budgets and cooldowns are counted from these rows, in wall-clock
time (they must survive reboots too). If a record cannot be written (disk full, read-only
state dir), the executor does not act.

A plan that only repeats (the same action on the same target, for the same finding, with
the same outcome: `REPEATABLE` results, every cooldown while a fault lasts; the executor
asks for it with `fold`) is not a new row: the newest row of that action and target
counts it (`count`, `last_time`), so a finding that lasts a day is one row, not 288.
Attempts and their results are never folded: budgets count their rows.

Writes (and opening, which may create the file) run on the agent's disk thread
(`gpuagent.diskio`): a commit waiting for fsync on a slow disk never holds up the event
loop. Reads use a connection of their own on the event loop: in WAL mode a reader never
waits for the writer, and what it reads was committed, so it comes from the page cache.
A trail that cannot be opened (a read-only state directory at start) leaves `error` set
and is tried again, at most every `OPEN_RETRY_SECONDS`; meanwhile every call raises
AuditError, and the executor does nothing.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from gpuagent.diskio import DiskThread
from gpuagent.remediation.types import ActionKind, ActionResult, PlannedAction

OPEN_RETRY_SECONDS = 30.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS actions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    time REAL NOT NULL,
    kind TEXT NOT NULL,
    target TEXT NOT NULL,
    result TEXT NOT NULL,
    mode TEXT NOT NULL,
    reason TEXT NOT NULL,
    check_name TEXT,
    severity TEXT,
    evidence TEXT NOT NULL,
    detail TEXT NOT NULL,
    count INTEGER NOT NULL DEFAULT 1,
    last_time REAL
);
CREATE INDEX IF NOT EXISTS actions_by_key ON actions (kind, target, time);
"""
# Columns added after the first release: a trail written before them gets them on open
# (every old row seen once, last seen when written).
_ADDED_COLUMNS = (
    ("count", "ALTER TABLE actions ADD COLUMN count INTEGER NOT NULL DEFAULT 1"),
    ("last_time", "ALTER TABLE actions ADD COLUMN last_time REAL"),
)
_COLUMNS = (
    "id, time, kind, target, result, mode, reason, check_name, severity, evidence, detail,"
    " count, COALESCE(last_time, time)"
)
# Results that only say what was (or would have been) decided, not an attempt: a repeat of
# the newest row of the same action and target is counted on that row.
REPEATABLE: tuple[ActionResult, ...] = ("planned", "refused", "skipped")


class AuditError(Exception):
    """The audit trail cannot be written: nothing may be done without a record."""


@dataclass(frozen=True, slots=True)
class AuditRecord:
    id: int
    time: float
    kind: ActionKind
    target: str
    result: ActionResult
    mode: str
    reason: str
    check: str | None
    severity: str | None
    evidence: dict[str, object]
    detail: str
    # How often this was decided, from ``time`` (the first) to ``last_time`` (the newest):
    # more than 1 only for a REPEATABLE result that repeated.
    count: int = 1
    last_time: float = 0.0

    @property
    def last_seen(self) -> float:
        return max(self.time, self.last_time)

    def json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "time": self.time,
            "action": self.kind,
            "target": self.target,
            "result": self.result,
            "mode": self.mode,
            "reason": self.reason,
            "check": self.check,
            "severity": self.severity,
            "evidence": self.evidence,
            "detail": self.detail,
            "count": self.count,
            "last_seen": self.last_seen,
        }


class AuditStore:
    def __init__(
        self,
        path: Path,
        *,
        disk: DiskThread | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = path
        self._disk = disk or DiskThread("gpuagent-audit")
        self._wall = wall_clock
        self._writer: sqlite3.Connection | None = None
        self._reader: sqlite3.Connection | None = None
        self.error = ""  # why the trail cannot be opened or written, while it cannot
        self.retry_seconds = OPEN_RETRY_SECONDS
        self._next_open = 0.0
        # Answers of `last` and `targets` until the next record: every snapshot asks the
        # same few (what we cordoned, capped, escalated), and only a record changes them.
        self._last: dict[tuple[str, str | None, tuple[str, ...]], AuditRecord | None] = {}
        self._targets: dict[tuple[str, str], tuple[str, ...]] = {}

    @property
    def ready(self) -> bool:
        return self._reader is not None

    async def open(self) -> bool:
        """Open the trail if it is not open yet (at most every ``retry_seconds``); whether
        it is. Never raises."""
        if self.ready:
            return True
        if time.monotonic() < self._next_open:
            return False
        self._next_open = time.monotonic() + self.retry_seconds
        self._forget_answers()
        try:
            self._writer, self._reader = await self._disk.run(self._connect)
        except (sqlite3.Error, OSError) as exc:
            self.error = f"cannot open the audit trail {self.path}: {exc}"
            return False
        self.error = ""
        return True

    def _connect(self) -> tuple[sqlite3.Connection, sqlite3.Connection]:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        writer = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            # WAL with FULL sync: a record that returned is on disk, even across a power cut.
            writer.execute("PRAGMA journal_mode=WAL")
            writer.execute("PRAGMA synchronous=FULL")
            writer.executescript(_SCHEMA)
            _add_columns(writer)
            reader = sqlite3.connect(
                f"file:{self.path}?mode=ro", uri=True, isolation_level=None, check_same_thread=False
            )
        except BaseException:
            writer.close()
            raise
        return writer, reader

    def close(self) -> None:
        self._forget_answers()
        if self._reader is not None:
            self._reader.close()
        if self._writer is not None:
            self._disk.call_soon(self._writer.close)

    def _forget_answers(self) -> None:
        self._last.clear()
        self._targets.clear()

    def _read(self) -> sqlite3.Connection:
        if self._reader is None:
            raise AuditError(self.error or "the audit trail is not open")
        return self._reader

    async def record(
        self,
        action: PlannedAction,
        result: ActionResult,
        *,
        mode: str,
        detail: str = "",
        fold: bool = False,
    ) -> AuditRecord:
        """Write a record; with ``fold``, a REPEATABLE result that repeats the newest row
        of its action and target is counted on that row instead."""
        evidence: dict[str, object] = dict(action.evidence)
        if action.params:
            # Kept with the record: a restore needs the limit from before the cap.
            evidence["params"] = dict(action.params)
        now = self._wall()
        writer = self._writer
        if writer is None:
            raise AuditError(self.error or "the audit trail is not open")
        row = (
            now,
            action.kind,
            action.target,
            result,
            mode,
            action.reason,
            action.check,
            action.severity,
            json.dumps(evidence, default=str),
            detail,
        )
        try:
            row_id, first, count = await self._disk.run(
                _write, writer, now, row, fold and result in REPEATABLE
            )
        except sqlite3.Error as exc:
            self.error = f"cannot write the audit record: {exc}"
            raise AuditError(self.error) from exc
        finally:
            self._forget_answers()
        self.error = ""
        return AuditRecord(
            id=row_id,
            time=first,
            kind=action.kind,
            target=action.target,
            result=result,
            mode=mode,
            reason=action.reason,
            check=action.check,
            severity=action.severity,
            evidence=evidence,
            detail=detail,
            count=count,
            last_time=now,
        )

    def count(
        self,
        kind: ActionKind,
        results: Iterable[ActionResult],
        since: float,
        target: str | None = None,
    ) -> int:
        wanted = tuple(results)
        marks = ",".join("?" for _ in wanted)
        # A folded repeat counts from when it was last seen: a cooldown runs from there.
        query = f"SELECT COUNT(*) FROM actions WHERE kind = ? AND COALESCE(last_time, time) >= ? AND result IN ({marks})"  # noqa: S608, E501 - placeholders only
        args: list[object] = [kind, since, *wanted]
        if target is not None:
            query += " AND target = ?"
            args.append(target)
        return int(self._read().execute(query, args).fetchone()[0])

    def last(
        self, kind: ActionKind, target: str | None, results: Iterable[ActionResult]
    ) -> AuditRecord | None:
        wanted = tuple(results)
        key = (kind, target, wanted)
        if key in self._last:
            return self._last[key]
        marks = ",".join("?" for _ in wanted)
        query = f"SELECT {_COLUMNS} FROM actions WHERE kind = ? AND result IN ({marks})"  # noqa: S608
        args: list[object] = [kind, *wanted]
        if target is not None:
            query += " AND target = ?"
            args.append(target)
        row = self._read().execute(query + " ORDER BY id DESC LIMIT 1", args).fetchone()
        found = self._last[key] = None if row is None else _record(row)
        return found

    def targets(self, kind: ActionKind, result: ActionResult) -> tuple[str, ...]:
        key = (kind, result)
        if key not in self._targets:
            rows = self._read().execute(
                "SELECT DISTINCT target FROM actions WHERE kind = ? AND result = ?", (kind, result)
            )
            self._targets[key] = tuple(str(r[0]) for r in rows)
        return self._targets[key]

    def since(self, after_id: int, limit: int) -> list[AuditRecord]:
        """Records newer than ``after_id``, oldest first (the MQTT reporter's feed)."""
        rows = (
            self._read()
            .execute(
                f"SELECT {_COLUMNS} FROM actions WHERE id > ? ORDER BY id LIMIT ?",  # noqa: S608
                (after_id, limit),
            )
            .fetchall()
        )
        return [_record(row) for row in rows]

    def recent(self, limit: int) -> list[AuditRecord]:
        rows = self._read().execute(
            f"SELECT {_COLUMNS} FROM actions ORDER BY id DESC LIMIT ?",  # noqa: S608
            (limit,),
        )
        return [_record(row) for row in rows]


def _add_columns(db: sqlite3.Connection) -> None:
    present = {str(row[1]) for row in db.execute("PRAGMA table_info(actions)")}
    for name, statement in _ADDED_COLUMNS:
        if name not in present:
            db.execute(statement)


# What makes a repeat the same decision: besides kind and target (the row looked at),
# result, mode, reason, check, severity and detail (row positions 3-7 and 9).
_SAME = (3, 4, 5, 6, 7, 9)


def _write(
    db: sqlite3.Connection, now: float, row: tuple[object, ...], repeatable: bool
) -> tuple[int, float, int]:
    """Insert ``row`` (its first item is ``now``), or count it on the newest row of its
    kind and target when it repeats that row's decision; (row id, first time, count).
    One transaction: the look and the write cannot be split by a crash."""
    db.execute("BEGIN IMMEDIATE")
    try:
        newest = (
            db.execute(
                "SELECT id, time, count, result, mode, reason, check_name, severity, detail"
                " FROM actions WHERE kind = ? AND target = ? ORDER BY id DESC LIMIT 1",
                (row[1], row[2]),
            ).fetchone()
            if repeatable
            else None
        )
        if newest is not None and tuple(newest[3:]) == tuple(row[i] for i in _SAME):
            db.execute(
                "UPDATE actions SET count = count + 1, last_time = ? WHERE id = ?",
                (now, newest[0]),
            )
            found = (int(newest[0]), float(newest[1]), int(newest[2]) + 1)
        else:
            cursor = db.execute(
                "INSERT INTO actions (time, kind, target, result, mode, reason, check_name,"
                " severity, evidence, detail, last_time) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (*row, now),
            )
            found = (int(cursor.lastrowid or 0), now, 1)
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
    return found


def _record(row: tuple[object, ...]) -> AuditRecord:
    (id_, when, kind, target, result, mode, reason, check, severity, evidence, detail) = row[:11]
    count, last = row[11:]
    return AuditRecord(
        id=int(id_),  # type: ignore[call-overload]
        time=float(when),  # type: ignore[arg-type]
        kind=str(kind),  # type: ignore[arg-type]
        target=str(target),
        result=str(result),  # type: ignore[arg-type]
        mode=str(mode),
        reason=str(reason),
        check=None if check is None else str(check),
        severity=None if severity is None else str(severity),
        evidence=json.loads(str(evidence)),
        detail=str(detail),
        count=int(count),  # type: ignore[call-overload]
        last_time=float(last),  # type: ignore[arg-type]
    )
