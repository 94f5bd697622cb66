"""Cordon requests decided in the database, in one transaction per request, so that any
aggregator sharing it may decide and none is special.

The transaction takes the cluster's lock (`Session.lock`: an advisory lock in PostgreSQL,
the write lock in SQLite), reads the cluster's approvals within the window and its node
count from the shared tables, decides with the same `CordonBudget` rules as ever, and
inserts the decision before it commits. Two aggregators deciding for the same cluster at
the same moment take turns at the lock, so the second sees the first's approval: together
they never approve past `max_nodes` or `max_percent`. A request already decided (a node
re-sending it, maybe to another aggregator) gets the stored decision again.
"""

from __future__ import annotations

import typing
from collections.abc import Iterable
from dataclasses import dataclass, field

from gpuagent.aggregator.budget import CordonBudget
from gpuagent.aggregator.database import Session
from gpuagent.config.schema.aggregator import CordonBudgetSection
from gpuagent.fleet.schema import Decision

_EXISTING = (
    "SELECT action, decision, time, reason, retry_after_seconds FROM cordons WHERE request_id = ?"
)
_APPROVALS = (
    "SELECT node, action, time FROM cordons "
    "WHERE cluster = ? AND time > ? AND decision = 'approved' ORDER BY time"
)
_CLUSTER_SIZE = "SELECT COUNT(*) FROM nodes WHERE cluster = ?"
_KNOWN_NODE = "SELECT COUNT(*) FROM nodes WHERE cluster = ? AND node = ?"
# Also the store's statement for decisions made in memory (SQLite).
INSERT_CORDON = (
    "INSERT INTO cordons (request_id, cluster, node, action, decision, time, reason, "
    "retry_after_seconds) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (request_id) DO NOTHING"
)


@dataclass(frozen=True, slots=True)
class Decided:
    action: str
    decision: Decision
    time: float
    reason: str
    retry_after_seconds: float | None


@dataclass(slots=True)
class CordonRequest:
    """A request waiting to be decided: ``key`` is its `store.row_key`. The store sets
    ``decided`` once the decision is committed (it stays None if the row was refused)."""

    key: str
    cluster: str
    node: str
    action: str
    time: float
    # What the decision's reason adds after the budget's (the fleet incident it is for).
    note: str = ""
    decided: Decided | None = field(default=None)


def with_note(reason: str, note: str) -> str:
    """A decision's reason followed by what it was decided for (a fleet incident)."""
    return f"{reason}; {note}" if note else reason


def lock_name(cluster: str) -> str:
    return f"gpuagent.fleet.cordon/{cluster}"


def replay(budget: CordonBudget, rows: Iterable[tuple[str, str, str, float]]) -> None:
    """Take approvals (cluster, node, action, time), oldest first, into ``budget``."""
    for cluster, node, action, when in rows:
        if action == "cordon":
            budget.restore(cluster, node, when)
        elif action == "uncordon":
            budget.release(cluster, node)


def decide(session: Session, request: CordonRequest, config: CordonBudgetSection) -> Decided:
    """Decide ``request`` in one transaction (see the module's docstring)."""
    with session.transaction():
        session.lock(lock_name(request.cluster))
        existing = session.execute(_EXISTING, (request.key,)).fetchone()
        if existing is not None:
            action, decision, when, reason, retry = existing
            return Decided(action, typing.cast("Decision", decision), float(when), reason, retry)
        budget = CordonBudget(config)
        horizon = request.time - config.window_seconds
        approvals = session.execute(_APPROVALS, (request.cluster, horizon)).fetchall()
        replay(budget, ((request.cluster, n, a, float(t)) for n, a, t in approvals))
        (size,) = session.execute(_CLUSTER_SIZE, (request.cluster,)).fetchone()
        (known,) = session.execute(_KNOWN_NODE, (request.cluster, request.node)).fetchone()
        # The node asking counts even before its first state report is stored.
        nodes = int(size) + (0 if known else 1)
        result = budget.decide(request.cluster, request.node, request.action, nodes, request.time)
        decided = Decided(
            request.action,
            result.decision,
            request.time,
            with_note(result.reason, request.note),
            result.retry_after_seconds,
        )
        session.execute(
            INSERT_CORDON,
            (
                request.key,
                request.cluster,
                request.node,
                request.action,
                decided.decision,
                decided.time,
                decided.reason,
                decided.retry_after_seconds,
            ),
        )
    return decided
