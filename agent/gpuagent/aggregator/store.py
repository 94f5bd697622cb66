"""Fleet state in a database (SQLite, or PostgreSQL shared by several aggregators; see
`database`), written behind the in-memory state in batches.

Handling a message only queues rows; a writer task commits everything queued in one
transaction every `FLUSH_INTERVAL_SECONDS`, so thousands of messages a second cost a few
transactions, not thousands. A batch the database refuses is written again row by row,
so a bad row loses only itself. The node table is coalesced (only a node's latest record
is written), and a row is never replaced by an older report (another aggregator may have
written a newer one). Writes run on one worker thread, off the event loop; with SQLite
reads run there too, with PostgreSQL on threads of their own. Message keys (`row_key`)
are primary keys, so a duplicate that slipped past the in-memory window, or went to
another aggregator, is still stored once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from gpuagent.aggregator import decisions, facts, fleetrules, maintenance, migrations
from gpuagent.aggregator.database import Session, database, describe
from gpuagent.aggregator.history import HistoryRow
from gpuagent.aggregator.records import NodeRecord, from_online_state, from_summary, summary_json
from gpuagent.config.schema.aggregator import CordonBudgetSection, PostgresSection

log = logging.getLogger(__name__)
T = TypeVar("T")

FLUSH_INTERVAL_SECONDS = 0.05
PRUNE_INTERVAL_SECONDS = 10.0
# After a batch the database could not take (locked, I/O error, full disk), the writer
# tries again this much later, the batch still queued.
RETRY_INTERVAL_SECONDS = 1.0
# A failure is logged when it starts, and again only after this long without one.
QUIET_SECONDS = 60.0
# Keys of refused rows remembered for `FleetStore.refused`.
REFUSED_KEPT = 10_000

_UPSERT_NODE = """
INSERT INTO nodes (cluster, node, online, health, reason, last_seen, agent_version,
                   fingerprint_id, stale, document, summary)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (cluster, node) DO UPDATE SET
    online = excluded.online, health = excluded.health, reason = excluded.reason,
    last_seen = excluded.last_seen, agent_version = excluded.agent_version,
    fingerprint_id = excluded.fingerprint_id, stale = excluded.stale,
    -- A record read from the summary has no document (a node going offline): keep it.
    document = CASE WHEN excluded.document = '' THEN nodes.document ELSE excluded.document END,
    summary = excluded.summary
-- Never back to an older report, nor an offline node online again with the same one (a
-- late copy); another aggregator may have written the newer one.
WHERE excluded.last_seen > nodes.last_seen
   OR (excluded.last_seen = nodes.last_seen AND (nodes.online OR NOT excluded.online))
"""
# The stale flag alone (the sweep): the document is not written again for it.
_MARK_STALE = "UPDATE nodes SET stale = ? WHERE cluster = ? AND node = ? AND last_seen = ?"
_INSERT = {
    "events": "INSERT INTO events (id, cluster, node, time, category, body) "
    "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING",
    "actions": "INSERT INTO actions (id, cluster, node, time, body) "
    "VALUES (?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING",
    "cordons": decisions.INSERT_CORDON,
    "replies": "INSERT INTO replies (id, cluster, node, time, body) "
    "VALUES (?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING",
    "commands": "INSERT INTO commands (id, cluster, node, time, command, body) "
    "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING",
    "history": "INSERT INTO history (id, cluster, node, time, kind, body) "
    "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING",
    # A fleet incident's row is rewritten as it grows.
    "incidents": "INSERT INTO incidents (id, cluster, domain, state, first_time, time, body) "
    "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET state = excluded.state, "
    "time = excluded.time, body = excluded.body",
    "gpu_history": facts.INSERT_FACT,
    "rule_findings": fleetrules.INSERT_FINDING,
    "maintenance": maintenance.INSERT_WINDOW,
}

# Reads and prunes. Like the schema, every statement here is one SQLite and PostgreSQL
# both run as written (`?` becomes the driver's placeholder); a test runs them on both.
_PRUNE_BY_AGE = "DELETE FROM {table} WHERE time < ?"
# An open rule finding stays until a person clears it, however old.
_PRUNE_FINDINGS = "DELETE FROM rule_findings WHERE time < ? AND state <> 'open'"
# A maintenance window is kept (for the record) the history's retention after it ended.
_PRUNE_WINDOWS = "DELETE FROM maintenance WHERE end_time < ?"
_PRUNE_BY_COUNT = (
    "DELETE FROM events WHERE time < (SELECT time FROM events ORDER BY time DESC LIMIT 1 OFFSET ?)"
)
_SELECT_CORDONS = (
    "SELECT request_id, cluster, node, action, decision, time, reason, retry_after_seconds "
    "FROM cordons WHERE time >= ? ORDER BY time DESC LIMIT ?"
)
_SELECT_NODES = (
    "SELECT cluster, node, online, health, reason, last_seen, agent_version, document FROM nodes"
)
_SELECT_BODIES = "SELECT body FROM {table}{where} ORDER BY time DESC LIMIT ?"
_SELECT_HISTORY = (
    "SELECT body FROM history WHERE cluster = ? AND node = ? AND time >= ? ORDER BY time LIMIT ?"
)
_SELECT_INCIDENTS = "SELECT body FROM incidents WHERE time >= ? ORDER BY time DESC LIMIT ?"
_SELECT_INCIDENT = "SELECT body FROM incidents WHERE id = ?"
_SELECT_APPROVALS = (
    "SELECT cluster, node, action, time FROM cordons "
    "WHERE time > ? AND decision = 'approved' ORDER BY time"
)

# PostgreSQL only (a shared database): what other aggregators wrote. `changed` is the id of
# the transaction that last wrote a node row (migration 3); a row this aggregator has not
# read yet was written by a transaction still running when it last looked, whose id is at
# least that snapshot's xmin. The snapshot and the rows come from one statement, so they
# agree.
_SNAPSHOT = "SELECT pg_snapshot_xmin(pg_current_snapshot())::text"
_CHANGED_NODES = (
    "SELECT s.xmin::text, n.cluster, n.node, n.online, n.last_seen, n.reason "
    "FROM (SELECT pg_snapshot_xmin(pg_current_snapshot()) AS xmin) AS s "
    "LEFT JOIN nodes AS n ON n.changed >= ?::xid8"
)
_SUMMARIES_BY_KEY = (
    "SELECT cluster, node, online, health, reason, last_seen, agent_version, summary FROM nodes "
    "WHERE (cluster, node) IN (SELECT * FROM unnest(?::text[], ?::text[]))"
)
_NODES_BY_KEY = (
    "SELECT cluster, node, online, health, reason, last_seen, agent_version, document FROM nodes "
    "WHERE (cluster, node) IN (SELECT * FROM unnest(?::text[], ?::text[]))"
)
_SELECT_SUMMARIES = (
    "SELECT cluster, node, online, health, reason, last_seen, agent_version, summary FROM nodes"
)
_SELECT_DOCUMENT = "SELECT document FROM nodes WHERE cluster = ? AND node = ?"
# Node rows read back per statement.
_KEYS_PER_READ = 1000


def row_key(cluster: str, node: str, message_id: str) -> str:
    """What identifies a message: its id within its node. Nodes choose their ids, and some
    are predictable ("<node>:audit:<row>"), so a bare id would let one node's message pass
    for another's duplicate, and two clusters may each have a node of the same name.
    Cluster and node names never contain "/", so the key is unambiguous."""
    return f"{cluster}/{node}/{message_id}"


@dataclass(frozen=True, slots=True)
class CordonRow:
    request_id: str
    cluster: str
    node: str
    action: str
    decision: str
    time: float
    reason: str
    retry_after_seconds: float | None

    def json(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "cluster": self.cluster,
            "node": self.node,
            "action": self.action,
            "decision": self.decision,
            "time": self.time,
            "reason": self.reason,
            "retry_after_seconds": self.retry_after_seconds,
        }


@dataclass
class _Pending:
    nodes: dict[tuple[str, str], tuple[NodeRecord, bool]] = field(default_factory=dict)
    # Stale flags to set or clear: (stale, cluster, node, last_seen) by node.
    stale: dict[tuple[str, str], tuple[bool, str, str, float]] = field(default_factory=dict)
    # Whether to write each node's summary (a shared database reads it).
    summaries: bool = False
    rows: dict[str, list[tuple[Any, ...]]] = field(
        default_factory=lambda: {table: [] for table in _INSERT}
    )
    # Cordon requests, decided after the rows are committed (`FleetStore.queue_request`).
    requests: list[decisions.CordonRequest] = field(default_factory=list)
    # Run once the rows above are committed or dropped (`FleetStore.after_write`).
    callbacks: list[Callable[[], None]] = field(default_factory=list)

    def __len__(self) -> int:
        rows = sum(len(r) for r in self.rows.values())
        return len(self.nodes) + len(self.stale) + rows + len(self.requests)

    def then(self, later: _Pending) -> _Pending:
        """This batch (not written) followed by ``later``: ``later``'s node records are
        newer, its rows and callbacks come after this batch's."""
        merged = _Pending(
            nodes={**self.nodes, **later.nodes},
            stale={**self.stale, **later.stale},
            summaries=self.summaries,
        )
        for table in merged.rows:
            merged.rows[table] = self.rows[table] + later.rows[table]
        merged.requests = self.requests + later.requests
        merged.callbacks = self.callbacks + later.callbacks
        return merged

    def statements(self) -> Iterator[tuple[str, str, list[tuple[Any, ...]]]]:
        """(table, statement, rows) for each table with rows queued."""
        if self.nodes:
            rows = [_node_row(r, stale, summary=self.summaries) for r, stale in self.nodes.values()]
            yield "nodes", _UPSERT_NODE, rows
        if self.stale:
            yield "nodes", _MARK_STALE, list(self.stale.values())
        for table, rows in self.rows.items():
            if rows:
                yield table, _INSERT[table], rows


def _node_row(r: NodeRecord, stale: bool, *, summary: bool) -> tuple[Any, ...]:
    return (
        r.cluster,
        r.node,
        r.online,
        r.health,
        r.reason,
        r.last_seen,
        r.agent_version,
        r.fingerprint_id,
        stale,
        r.document,
        summary_json(r) if summary else "",
    )


@dataclass(frozen=True, slots=True)
class _Dropped:
    """A row the database refused: its table, its key (`row_key`; None for a node row),
    and why."""

    table: str
    key: str | None
    error: Exception

    @property
    def reason(self) -> str:
        return f"{self.table}: {type(self.error).__name__}"


class _ServerTroubleError(Exception):
    """The database failed as a whole while writing a batch (carries its error)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


class StoreOpenError(RuntimeError):
    """The database could not be opened or brought to this aggregator's schema."""


class FleetStore:
    def __init__(
        self,
        location: str | Path,
        *,
        retention_seconds: float,
        max_events: int,
        budget: CordonBudgetSection | None = None,
        postgres: PostgresSection | None = None,
        history_retention_seconds: float = 7 * 86400.0,
        incidents_retention_seconds: float = 7 * 86400.0,
        facts_retention_seconds: float = 30 * 86400.0,
    ) -> None:
        self.location = location
        self.database = database(location, postgres)
        # Every history table (events, actions, replies, commands, cordons) keeps this long;
        # events also at most max_events; cordon decisions at least the budget's window.
        self.retention_seconds = retention_seconds
        self.max_events = max_events
        # Each node's history (health transitions, trend samples) keeps this long.
        self.history_retention_seconds = history_retention_seconds
        # Fleet incidents are listed this long after their last change.
        self.incidents_retention_seconds = incidents_retention_seconds
        # The facts the fleet rules read (gpu_history), and cleared rule findings.
        self.facts_retention_seconds = facts_retention_seconds
        # Decisions made in the database (a shared one) follow this budget.
        self.budget = budget or CordonBudgetSection()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fleet-store")
        # Reads (the API, the refresh of a shared view) do not wait behind a batch where
        # the database takes more than one connection.
        self._reads = self._executor
        if self.database.shared:
            readers = max(1, (postgres or PostgresSection()).pool_max_size - 1)
            self._reads = ThreadPoolExecutor(readers, thread_name_prefix="fleet-store-read")
        self._open_now = False
        self._pending = self._new_pending()
        # The batch being written (its node documents are not in the database yet).
        self._writing = self._new_pending()
        # Batches whose single transaction failed, and rows then refused, by table.
        self.write_errors = 0
        self.rows_dropped: Counter[str] = Counter()
        # Batches kept queued and tried again (the database as a whole failed), failed
        # prunes.
        self.batches_retried = 0
        self.prune_errors = 0
        # Whether the last write left its batch queued for another try.
        self.retrying = False
        # The schema version of the database, once open.
        self.schema_version = 0
        self._last_failure: dict[str, float] = {}
        self._logged_reasons: set[str] = set()
        # Keys of the rows most recently dropped, for `refused`.
        self._refused: OrderedDict[str, None] = OrderedDict()

    @property
    def shared(self) -> bool:
        """Whether other aggregators write this database too."""
        return self.database.shared

    # --- life cycle --------------------------------------------------------------------

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def _read(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._reads, fn, *args)

    def _session(self) -> contextlib.AbstractContextManager[Session]:
        if not self._open_now:
            raise RuntimeError("store is not open")
        return self.database.session()

    def _open(self) -> None:
        try:
            self.database.open()
            self._open_now = True
            with self._session() as session:
                self.schema_version = migrations.migrate(session, self.database.dialect)
        except Exception as exc:
            self._close()
            where = describe(self.location)
            raise StoreOpenError(f"cannot open the fleet database {where}: {exc}") from exc

    async def open(self) -> None:
        await self._call(self._open)

    async def close(self) -> None:
        await self.flush()
        await self._call(self._close)
        self._executor.shutdown(wait=True)
        self._reads.shutdown(wait=True)

    def _close(self) -> None:
        self._open_now = False
        self.database.close()

    # --- queueing (event loop, no I/O) ---------------------------------------------------

    def _new_pending(self) -> _Pending:
        return _Pending(summaries=self.database.shared)

    def pending(self) -> int:
        return len(self._pending)

    def queue_node(self, record: NodeRecord, *, stale: bool) -> None:
        self._pending.nodes[record.key] = (record, stale)
        self._pending.stale.pop(record.key, None)

    def queue_stale(self, record: NodeRecord, *, stale: bool) -> None:
        """Mark the node's row stale (or fresh again), if it still holds this report."""
        row = (stale, record.cluster, record.node, record.last_seen)
        self._pending.stale[record.key] = row

    def queue_event(self, message: dict[str, Any], raw: str) -> None:
        self._pending.rows["events"].append(
            (
                _key(message),
                message["cluster"],
                message["node"],
                float(message["time"]),
                message["category"],
                raw,
            )
        )

    def queue_action(self, message: dict[str, Any], raw: str) -> None:
        row = (_key(message), message["cluster"], message["node"], float(message["time"]), raw)
        self._pending.rows["actions"].append(row)

    def queue_history(self, rows: list[HistoryRow]) -> None:
        self._pending.rows["history"].extend(rows)

    def queue_reply(self, message: dict[str, Any], raw: str) -> None:
        row = (_key(message), message["cluster"], message["node"], float(message["time"]), raw)
        self._pending.rows["replies"].append(row)

    def queue_command(self, message: dict[str, Any]) -> None:
        row = (
            _key(message),
            message["cluster"],
            message["node"],
            float(message["time"]),
            message["command"],
            json.dumps(message),
        )
        self._pending.rows["commands"].append(row)

    def queue_incident(self, incident: dict[str, Any]) -> None:
        """A fleet incident's document (`FleetIncident.json`), new or grown."""
        self._pending.rows["incidents"].append(
            (
                incident["id"],
                incident["cluster"],
                incident["domain"],
                incident["state"],
                incident["first_time"],
                incident["closed_at"] or incident["last_time"],
                json.dumps(incident, separators=(",", ":")),
            )
        )

    def queue_facts(self, new: list[facts.Fact]) -> None:
        self._pending.rows["gpu_history"].extend(f.row() for f in new)

    def queue_finding(self, finding: fleetrules.RuleFinding) -> None:
        """A rule finding, new or cleared."""
        self._pending.rows["rule_findings"].append(finding.row())

    def queue_window(self, window: maintenance.Window, now: float) -> None:
        """A maintenance window, new or ended early."""
        self._pending.rows["maintenance"].append(window.row(now))

    def queue_cordon(self, row: CordonRow) -> None:
        self._pending.rows["cordons"].append(
            (
                row_key(row.cluster, row.node, row.request_id),
                row.cluster,
                row.node,
                row.action,
                row.decision,
                row.time,
                row.reason,
                row.retry_after_seconds,
            )
        )

    def queue_request(self, request: decisions.CordonRequest) -> None:
        """Decide ``request`` in the database with the next batch, after its rows (so the
        node count includes nodes that just reported): ``request.decided`` is set before
        the callbacks given after this one run."""
        self._pending.requests.append(request)

    # --- writing --------------------------------------------------------------------------

    def after_write(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (on the event loop) once every row queued so far is committed,
        or refused and dropped; callbacks run in the order they were given."""
        self._pending.callbacks.append(callback)

    def refused(self, key: str) -> bool:
        """Whether the database refused the row with this key (`row_key`), among the last
        `REFUSED_KEPT` rows it refused. Read in an `after_write` callback, it says
        whether that row was stored."""
        return key in self._refused

    async def flush(self) -> None:
        """Write what is queued, then run the callbacks given so far. If the database as a
        whole failed (locked, I/O error, full disk, connection lost; `retrying` is then
        true), the batch is queued again, ahead of anything queued since, and its callbacks
        wait for the next try."""
        if not self._pending and not self._pending.callbacks:
            return
        batch, self._pending = self._pending, self._new_pending()
        self._writing = batch
        # Through the store's thread even without rows: the callbacks of one batch must not
        # run before those of a batch still being written.
        try:
            failed, dropped, error = await self._call(self._write, batch)
        except BaseException:  # cancelled, or the store closed under it: nothing is lost
            self._pending = batch.then(self._pending)
            raise
        finally:
            self._writing = self._new_pending()
        self.write_errors += failed
        self.retrying = error is not None
        if error is not None:
            self._pending = batch.then(self._pending)
            self.batches_retried += 1
            if self._failure_starts("write"):
                log.error(
                    "fleet store: the database refused a batch (%s: %s); its %d rows stay "
                    "queued and unacknowledged and are tried again every %.0f s "
                    "(gpuagent_fleet_store_batches_retried_total)",
                    type(error).__name__,
                    error,
                    len(batch),
                    RETRY_INTERVAL_SECONDS,
                )
            return
        self._note_dropped(dropped)
        for callback in batch.callbacks:
            try:
                callback()
            except Exception:  # one failing callback must not cost the others theirs
                log.exception("fleet store: a callback after a write failed")

    def _failure_starts(self, what: str) -> bool:
        now = time.monotonic()
        last = self._last_failure.get(what)
        self._last_failure[what] = now
        return last is None or now - last > QUIET_SECONDS

    def _note_dropped(self, dropped: list[_Dropped]) -> None:
        for row in dropped:
            self.rows_dropped[row.table] += 1
            if row.key is not None:
                self._refused[row.key] = None
                if len(self._refused) > REFUSED_KEPT:
                    self._refused.popitem(last=False)
            # Once per reason: one broken node can repeat the same bad row every second.
            if row.reason not in self._logged_reasons:
                self._logged_reasons.add(row.reason)
                log.error(
                    "fleet store: a row of %s was refused and dropped (%s: %s); further %r "
                    "rows are only counted (gpuagent_fleet_store_rows_dropped_total)",
                    row.table,
                    type(row.error).__name__,
                    row.error,
                    row.reason,
                )

    def _write(self, batch: _Pending) -> tuple[bool, list[_Dropped], Exception | None]:
        """Commit the batch, then decide its cordon requests. (Whether the batch's single
        transaction failed, the rows dropped, the database's error if it failed as a
        whole: then the batch is to be tried again, and rows already written are written
        again: their keys absorb it.)"""
        if not batch:
            return False, [], None
        try:
            with self._session() as session:
                failed, dropped = self._write_rows(session, batch)
                dropped += self._decide(session, batch.requests)
        except _ServerTroubleError as trouble:
            return True, [], trouble.error
        except Exception as exc:
            # The connection itself (the pool has none to give, the server went away).
            if not self.database.server_trouble(exc):
                raise
            return True, [], exc
        return failed, dropped, None

    def _write_rows(self, session: Session, batch: _Pending) -> tuple[bool, list[_Dropped]]:
        """The rows in one transaction. If the database refuses it, write them one by one,
        each in a transaction of its own, so that a bad row costs only itself, not every
        other node's rows of the same batch. A row failing because the database as a whole
        failed (locked, I/O error, disk full, connection lost) is not the row's fault:
        then nothing is dropped and _ServerTroubleError is raised."""
        if _in_one_transaction(session, batch):
            return False, []
        dropped = []
        for table, sql, rows in batch.statements():
            for row in rows:
                try:
                    with session.transaction():
                        session.execute(sql, row)
                except Exception as exc:  # as above: only this row is lost
                    if self.database.server_trouble(exc):
                        raise _ServerTroubleError(exc) from exc
                    dropped.append(_Dropped(table, None if table == "nodes" else row[0], exc))
        return True, dropped

    def _decide(self, session: Session, requests: list[decisions.CordonRequest]) -> list[_Dropped]:
        dropped = []
        for request in requests:
            if request.decided is not None:
                continue  # decided before a later part of the batch failed
            try:
                request.decided = decisions.decide(session, request, self.budget)
            except Exception as exc:  # only this request is lost
                if self.database.server_trouble(exc):
                    raise _ServerTroubleError(exc) from exc
                dropped.append(_Dropped("cordons", request.key, exc))
        return dropped

    async def run_writer(self, stop: asyncio.Event) -> None:
        """Flush every FLUSH_INTERVAL_SECONDS, prune every PRUNE_INTERVAL_SECONDS. Neither
        a failed write nor a failed prune stops it: a batch the database did not take stays
        queued (tried again after RETRY_INTERVAL_SECONDS), a failed prune is tried again at
        the next interval; both are counted and logged."""
        loop = asyncio.get_running_loop()
        next_prune = loop.time() + PRUNE_INTERVAL_SECONDS
        while not stop.is_set():
            wait = FLUSH_INTERVAL_SECONDS
            try:
                await self.flush()
                if self.retrying:
                    wait = RETRY_INTERVAL_SECONDS
            except Exception:  # the batch is queued again (flush)
                self.write_errors += 1
                self.batches_retried += 1
                wait = RETRY_INTERVAL_SECONDS
                if self._failure_starts("flush"):
                    log.exception("fleet store: writing a batch failed; it stays queued")
            if loop.time() >= next_prune:
                next_prune = loop.time() + PRUNE_INTERVAL_SECONDS
                try:
                    await self.prune(time.time())
                except Exception:  # pruning is housekeeping: writes go on without it
                    self.prune_errors += 1
                    if self._failure_starts("prune"):
                        log.exception(
                            "fleet store: pruning the history failed; tried again in %.0f s "
                            "(gpuagent_fleet_store_prune_errors_total)",
                            PRUNE_INTERVAL_SECONDS,
                        )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), wait)

    async def prune(self, now: float) -> int:
        return await self._call(self._prune, now)

    def _prune(self, now: float) -> int:
        # One transaction: several aggregators pruning at once each delete what is old.
        with self._session() as session, session.transaction():
            removed = 0
            for table in _INSERT:
                keep = self.retention_seconds
                if table == "history":
                    keep = self.history_retention_seconds
                elif table == "incidents":
                    keep = self.incidents_retention_seconds
                elif table in {"gpu_history", "rule_findings"}:
                    keep = self.facts_retention_seconds
                elif table == "cordons":
                    # The budget is decided from the approvals within its window.
                    keep = max(keep, self.budget.window_seconds)
                sql = _PRUNE_BY_AGE.format(table=table)
                if table == "rule_findings":
                    sql = _PRUNE_FINDINGS
                elif table == "maintenance":
                    sql = _PRUNE_WINDOWS
                removed += session.execute(sql, (now - keep,)).rowcount
            removed += session.execute(_PRUNE_BY_COUNT, (self.max_events - 1,)).rowcount
        return int(removed)

    # --- reading ------------------------------------------------------------------------

    async def events(
        self, *, node: str | None, since: float | None, limit: int
    ) -> list[dict[str, Any]]:
        where, args = _filters(node=node, since=since)
        sql = _SELECT_BODIES.format(table="events", where=where)
        return await self._read(self._bodies, sql, (*args, limit))

    async def history(
        self, cluster: str, node: str, since: float, limit: int
    ) -> list[dict[str, Any]]:
        """The node's history rows since ``since``, oldest first."""
        return await self._read(self._bodies, _SELECT_HISTORY, (cluster, node, since, limit))

    async def actions(self, *, node: str | None, limit: int) -> list[dict[str, Any]]:
        where, args = _filters(node=node, since=None)
        sql = _SELECT_BODIES.format(table="actions", where=where)
        return await self._read(self._bodies, sql, (*args, limit))

    async def incidents(self, *, since: float, limit: int) -> list[dict[str, Any]]:
        """Fleet incidents changed since ``since``, the latest first."""
        return await self._read(self._bodies, _SELECT_INCIDENTS, (since, limit))

    async def read_rows(self, sql: str, args: tuple[Any, ...]) -> list[Any]:
        """Rows of one read (the fleet rules' windowed queries)."""
        return await self._read(self._rows, sql, args)

    async def rule_findings(
        self, *, since: float | None = None, limit: int = 1000
    ) -> list[dict[str, Any]]:
        """Rule findings changed since ``since``, the latest first; None: the open ones."""
        if since is None:
            return await self._read(self._bodies, fleetrules.SELECT_OPEN, (limit,))
        return await self._read(self._bodies, fleetrules.SELECT_RECENT, (since, limit))

    async def maintenance_windows(self, *, ending_after: float) -> list[dict[str, Any]]:
        """Maintenance windows that end after ``ending_after``, the latest started first."""
        return await self._read(self._bodies, maintenance.SELECT_WINDOWS, (ending_after,))

    async def rule_finding(self, finding_id: str) -> dict[str, Any] | None:
        found = await self._read(self._bodies, fleetrules.SELECT_FINDING, (finding_id,))
        return found[0] if found else None

    async def incident(self, incident_id: str) -> dict[str, Any] | None:
        found = await self._read(self._bodies, _SELECT_INCIDENT, (incident_id,))
        return found[0] if found else None

    def _rows(self, sql: str, args: tuple[Any, ...] = ()) -> list[Any]:
        with self._session() as session:
            return list(session.execute(sql, args).fetchall())

    def _bodies(self, sql: str, args: tuple[Any, ...]) -> list[dict[str, Any]]:
        return [json.loads(body) for (body,) in self._rows(sql, args)]

    async def cordons(self, *, since: float | None = None, limit: int = 1000) -> list[CordonRow]:
        start = since if since is not None else float("-inf")
        rows = await self._read(self._rows, _SELECT_CORDONS, (start, limit))
        return [
            CordonRow(key.removeprefix(row_key(cluster, node, "")), cluster, node, *rest)
            for key, cluster, node, *rest in rows
        ]

    async def count(self, table: str) -> int:
        if table not in _INSERT and table != "nodes":
            raise ValueError(table)
        rows = await self._read(self._rows, f"SELECT COUNT(*) FROM {table}")  # noqa: S608
        return int(rows[0][0])

    async def load_nodes(self) -> list[NodeRecord]:
        """The node table as last written, for a start. From a shared database the
        summaries (documents only where a summary does not match its row)."""
        if not self.database.shared:
            rows = await self._read(self._rows, _SELECT_NODES)
            # Parsed for what the view needs; the documents stay in the database.
            return [dataclasses.replace(node_record(row), document="") for row in rows]
        return await self._from_summaries(await self._read(self._rows, _SELECT_SUMMARIES))

    async def node_document(self, cluster: str, node: str) -> str:
        """The node's last state message ("" if none): queued, or as stored."""
        for batch in (self._pending, self._writing):
            queued = batch.nodes.get((cluster, node))
            if queued is not None and queued[0].document:
                return queued[0].document
        rows = await self._read(self._rows, _SELECT_DOCUMENT, (cluster, node))
        return str(rows[0][0]) if rows else ""

    async def approvals(self, since: float) -> list[tuple[str, str, str, float]]:
        """Approved cordon decisions (cluster, node, action, time) after ``since``, oldest
        first."""
        rows = await self._read(self._rows, _SELECT_APPROVALS, (since,))
        return [(c, n, a, float(t)) for c, n, a, t in rows]

    # --- what other aggregators wrote (a shared database) ------------------------------

    async def snapshot(self) -> str:
        """A mark to pass to `changed_nodes`: rows written after it are read then."""
        rows = await self._read(self._rows, _SNAPSHOT)
        return str(rows[0][0])

    async def changed_nodes(
        self, since: str
    ) -> tuple[str, list[tuple[str, str, bool, float, str]]]:
        """(the next mark, and (cluster, node, online, last_seen, reason) of every node row
        written after the mark ``since``; some written just before it may come again)."""
        rows = await self._read(self._rows, _CHANGED_NODES, (since,))
        mark = str(rows[0][0])
        changed = [(c, n, bool(o), float(t), r) for _, c, n, o, t, r in rows if c is not None]
        return mark, changed

    async def node_records(self, keys: list[tuple[str, str]]) -> list[NodeRecord]:
        """The stored records of these nodes (cluster, node), from their summaries."""
        rows = []
        for chunk in _chunks(keys):
            args = ([c for c, _ in chunk], [n for _, n in chunk])
            rows += await self._read(self._rows, _SUMMARIES_BY_KEY, args)
        return await self._from_summaries(rows)

    async def _from_summaries(self, rows: list[Any]) -> list[NodeRecord]:
        """Records from rows of (node columns..., summary); a row whose summary does not
        match (written by an aggregator from before summaries) from its document."""
        records, unsummarised = [], []
        for *columns, summary in rows:
            record = from_summary(node_record((*columns, "")), summary)
            if record is None:
                unsummarised.append((columns[0], columns[1]))
            else:
                records.append(record)
        for chunk in _chunks(unsummarised):
            args = ([c for c, _ in chunk], [n for _, n in chunk])
            rows = await self._read(self._rows, _NODES_BY_KEY, args)
            records += [dataclasses.replace(node_record(r), document="") for r in rows]
        return records


def _in_one_transaction(session: Session, batch: _Pending) -> bool:
    """Whether the batch's rows went in, in one transaction."""
    try:
        with session.transaction():
            for _, sql, rows in batch.statements():
                session.executemany(sql, rows)
    # Whatever the error (a constraint, a value the database cannot bind, a full disk),
    # the writer must carry on: the caller tries the rows again one by one.
    except Exception:  # noqa: BLE001
        return False
    return True


def node_record(row: tuple[Any, ...]) -> NodeRecord:
    """A record from a row of the node table (`_SELECT_NODES`)."""
    cluster, node, online, health, reason, last_seen, version, document = row
    base = NodeRecord(cluster, node, bool(online), health, reason, last_seen, version)
    if not document:
        return base
    try:
        parsed = from_online_state(json.loads(document), document, last_seen)
    except (ValueError, KeyError, TypeError):
        return base
    return dataclasses.replace(
        parsed, online=bool(online), health=health, reason=reason, last_seen=last_seen
    )


def _chunks(keys: list[tuple[str, str]]) -> Iterator[list[tuple[str, str]]]:
    for start in range(0, len(keys), _KEYS_PER_READ):
        yield keys[start : start + _KEYS_PER_READ]


def _key(message: dict[str, Any]) -> str:
    return row_key(message["cluster"], message["node"], message["id"])


def _filters(*, node: str | None, since: float | None) -> tuple[str, tuple[Any, ...]]:
    clauses: list[str] = []
    args: list[Any] = []
    if node is not None:
        clauses.append("node = ?")
        args.append(node)
    if since is not None:
        clauses.append("time >= ?")
        args.append(since)
    return (" WHERE " + " AND ".join(clauses) if clauses else ""), tuple(args)
