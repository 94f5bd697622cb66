"""One fleet view from every aggregator sharing a database.

Each aggregator consumes only its share of the node messages, but answers the API, the
page and the fleet metrics for the whole fleet. So every `refresh_interval_seconds` it
reads from the database the node rows the others wrote since it last looked (the
database marks each row with the transaction that wrote it), and the approvals that make
up the cordon budget. Only rows newer than what it holds are read further, as their
summary (what the view needs of a report, a tenth of its document); its own writes and
the stale flags compare equal and cost one short row each.

The in-memory view is then at most one interval plus one write-behind batch behind the
database, on every aggregator; a record consumed here is never replaced by an older one
read back.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable

from gpuagent.aggregator import decisions
from gpuagent.aggregator.budget import CordonBudget
from gpuagent.aggregator.state import FleetState
from gpuagent.aggregator.store import FleetStore

log = logging.getLogger(__name__)


class SharedView:
    def __init__(
        self,
        state: FleetState,
        store: FleetStore,
        budget: CordonBudget,
        *,
        interval: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.state = state
        self.store = store
        self.budget = budget
        self.interval = interval
        self.clock = clock
        self._mark: str | None = None
        # When the last refresh finished (monotonic), for gpuagent_fleet_view_age_seconds.
        self.refreshed_at: float | None = None
        self.refresh_errors = 0
        self._failing = False

    async def start(self) -> None:
        """Load the whole node table (the mark first: what is written while loading comes
        again at the first refresh)."""
        self._mark = await self.store.snapshot()
        for record in await self.store.load_nodes():
            self.state.put(record)
        await self._budget()
        self.refreshed_at = time.monotonic()

    async def run(self) -> None:
        """Refresh every interval. A database away (restarting, failing over) is no reason
        to stop: the view keeps what it has, its age shows how old that is, and the
        refresh after it returns reads everything written meanwhile."""
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.refresh()
            except Exception:
                self.refresh_errors += 1
                if not self._failing:
                    log.exception(
                        "shared view: reading the fleet database failed; the view keeps what "
                        "it has (gpuagent_fleet_view_age_seconds) and is tried every %.1f s",
                        self.interval,
                    )
                self._failing = True
            else:
                if self._failing:
                    log.info("shared view: reading the fleet database again")
                self._failing = False

    def age(self) -> float | None:
        """Seconds since the view last caught up with the database (None: never)."""
        return None if self.refreshed_at is None else time.monotonic() - self.refreshed_at

    async def refresh(self) -> None:
        if self._mark is None:
            raise RuntimeError("the shared view refreshes only after start()")
        mark, changed = await self.store.changed_nodes(self._mark)
        wanted = []
        for cluster, node, online, last_seen, reason in changed:
            cached = self.state.nodes.get((cluster, node))
            if cached is None or last_seen > cached.last_seen or (online and not cached.online):
                wanted.append((cluster, node))
            elif cached.online and not online and last_seen == cached.last_seen:
                # Gone offline (its Last Will, read by another aggregator): same report.
                self.state.put(dataclasses.replace(cached, online=False, reason=reason))
        for record in await self.store.node_records(wanted):
            cached = self.state.nodes.get(record.key)
            # Not behind what this aggregator consumed itself meanwhile.
            if (
                cached is None
                or record.last_seen > cached.last_seen
                or (record.last_seen == cached.last_seen and record.online != cached.online)
            ):
                self.state.put(record)
        await self._budget()
        self._mark = mark
        self.refreshed_at = time.monotonic()

    async def _budget(self) -> None:
        """The cordon budget every aggregator spends, for the metrics (decisions read the
        database itself)."""
        window = self.budget.config.window_seconds
        approvals = await self.store.approvals(self.clock() - window)
        self.budget.clear()
        decisions.replay(self.budget, approvals)
