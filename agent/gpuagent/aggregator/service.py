"""The aggregator process: store, in-memory state, MQTT consumer, HTTP, put together.

`run()` is the whole program (the CLI is a thin shell over it); `Aggregator` is the same
with its parts reachable, for tests and the benchmark.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from aiohttp import web

from gpuagent.aggregator.budget import CordonBudget
from gpuagent.aggregator.consumer import Consumer
from gpuagent.aggregator.http import Api, application
from gpuagent.aggregator.ingest import Ingest
from gpuagent.aggregator.metrics import FleetCollector, fleet_registry
from gpuagent.aggregator.state import FleetState
from gpuagent.aggregator.store import FleetStore
from gpuagent.config import AggregatorSection
from gpuagent.fleet.connection import read_password

log = logging.getLogger(__name__)

# Shutdown: each part gets this long, so SIGTERM ends the process well within systemd's
# TimeoutStopSec (10 s).
STOP_STEP_SECONDS = 3.0


class Aggregator:
    def __init__(
        self, config: AggregatorSection, *, clock: Callable[[], float] = time.time
    ) -> None:
        self.config = config
        self.clock = clock
        self.state = FleetState()
        self.store = FleetStore(
            config.database,
            retention_seconds=config.events_retention_seconds,
            max_events=config.max_events,
            budget_window_seconds=config.cordon_budget.window_seconds,
        )
        self.budget = CordonBudget(config.cordon_budget)
        prefix = config.broker.topic_prefix
        self.ingest = Ingest(
            self.state,
            self.store,
            self.budget,
            prefix,
            stale_after=config.stale_after_seconds,
            clock=clock,
        )
        self.consumer = Consumer(config, self.ingest.handle, self.state, self.store)
        collector = FleetCollector(
            self.state, self.budget, self.store, stale_after=config.stale_after_seconds, clock=clock
        )
        self.api = Api(
            state=self.state,
            store=self.store,
            registry=fleet_registry(collector),
            prefix=prefix,
            stale_after=config.stale_after_seconds,
            publish=self.consumer.publish,
            clock=clock,
            command_token=read_password(config.command_token_file),
        )
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        """Open the store, restore state, start serving and consuming."""
        await self.store.open()
        await self._restore()
        self._runner = web.AppRunner(application(self.api), access_log=None)
        await self._runner.setup()
        host, port = self.config.host_port
        await web.TCPSite(self._runner, host, port).start()
        log.info(
            "aggregator: HTTP on %s, %d nodes from %s",
            self.config.listen,
            len(self.state.nodes),
            self.config.database,
        )
        self._tasks = [
            asyncio.create_task(self.consumer.run(), name="mqtt-consumer"),
            asyncio.create_task(self.store.run_writer(self._stop), name="store-writer"),
            asyncio.create_task(self._sweep_stale(), name="stale-sweep"),
        ]

    async def _restore(self) -> None:
        for record in await self.store.load_nodes():
            self.state.put(record)
        # The budget must survive a restart, or a restart would reopen it.
        window = self.config.cordon_budget.window_seconds
        rows = await self.store.cordons(since=self.clock() - window, limit=1_000_000)
        for row in reversed(rows):  # oldest first
            if row.decision != "approved":
                continue
            if row.action == "cordon":
                self.budget.restore(row.cluster, row.node, row.time)
            elif row.action == "uncordon":
                self.budget.release(row.cluster, row.node)

    async def _sweep_stale(self) -> None:
        """Mark nodes stale (and back) in the database; memory computes it at read time."""
        stale: set[tuple[str, str]] = set()
        interval = min(5.0, self.config.stale_after_seconds / 4)
        while True:
            await asyncio.sleep(interval)
            now = self.clock()
            for key, record in self.state.nodes.items():
                is_stale = record.is_stale(now, self.config.stale_after_seconds)
                if is_stale != (key in stale):
                    (stale.add if is_stale else stale.discard)(key)
                    self.store.queue_node(record, stale=is_stale)

    def stop(self) -> None:
        self._stop.set()

    async def wait(self) -> None:
        await self._stop.wait()

    async def close(self) -> None:
        """Stop consuming and serving, then write what is queued; bounded at every step."""
        self._stop.set()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await asyncio.wait_for(task, STOP_STEP_SECONDS)
        if self._runner is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._runner.cleanup(), STOP_STEP_SECONDS)
        try:
            await asyncio.wait_for(self.store.close(), STOP_STEP_SECONDS)
        except TimeoutError:
            log.error(  # noqa: TRY400 - a timeout has no useful traceback
                "aggregator: the store did not close in %.0f s", STOP_STEP_SECONDS
            )


async def run(config: AggregatorSection, stop: asyncio.Event | None = None) -> None:
    """Run until ``stop`` is set (or the task is cancelled)."""
    aggregator = Aggregator(config)
    await aggregator.start()
    try:
        if stop is None:
            await aggregator.wait()
        else:
            await stop.wait()
    finally:
        await aggregator.close()
