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
from pathlib import Path
from typing import Any

from aiohttp import web

from gpuagent.aggregator.alertpush import IncidentPusher
from gpuagent.aggregator.alerts import AlertmanagerReader
from gpuagent.aggregator.budget import CordonBudget
from gpuagent.aggregator.consumer import Consumer
from gpuagent.aggregator.correlate import Correlator
from gpuagent.aggregator.database import describe
from gpuagent.aggregator.decisions import replay
from gpuagent.aggregator.fleetrules import FleetRules
from gpuagent.aggregator.http import Api, allowed_hosts, application
from gpuagent.aggregator.httpguard import ConnectionGuard, GuardedSite
from gpuagent.aggregator.ingest import Ingest
from gpuagent.aggregator.maintenance import REFRESH_SECONDS as MAINTENANCE_REFRESH_SECONDS
from gpuagent.aggregator.metrics import FleetCollector, fleet_registry
from gpuagent.aggregator.rulesrun import RulesRunner
from gpuagent.aggregator.sharedview import SharedView
from gpuagent.aggregator.state import FleetState
from gpuagent.aggregator.store import FleetStore
from gpuagent.aggregator.supervise import Supervisor, TaskFailedError
from gpuagent.config import AggregatorSection
from gpuagent.links import Links

log = logging.getLogger(__name__)

# Shutdown: each part gets this long, so SIGTERM ends the process well within systemd's
# TimeoutStopSec (10 s).
STOP_STEP_SECONDS = 3.0
# How often held cordon requests are looked at and changed fleet incidents written: the
# bound on how late a decision or an incident's publication comes.
CORRELATION_TICK_SECONDS = 0.5
# How often fleet incidents are pushed to Alertmanager: a new or changed one reaches it
# within this (plus the tick).
INCIDENT_PUSH_SECONDS = 2.0


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
            budget=config.cordon_budget,
            postgres=config.postgres,
            history_retention_seconds=config.history_retention_seconds,
            incidents_retention_seconds=config.correlation.retention_seconds,
            facts_retention_seconds=max(
                config.rules.history_retention_seconds,
                config.rules.repeat_window_seconds,
                config.rules.remediation_window_seconds,
                config.rules.die_defect_window_seconds,
            ),
        )
        self.budget = CordonBudget(config.cordon_budget)
        # A shared database: the others' writes, read into this one's view.
        self.view: SharedView | None = None
        if self.store.shared:
            self.view = SharedView(
                self.state,
                self.store,
                self.budget,
                interval=config.postgres.refresh_interval_seconds,
                clock=clock,
            )
        prefix = config.broker.topic_prefix
        correlation = config.correlation
        self.correlator: Correlator | None = None
        if correlation.enabled:
            self.correlator = Correlator(
                join_window_seconds=correlation.join_window_seconds,
                settle_seconds=correlation.settle_seconds,
                join_labels=correlation.join_labels,
                domain_labels=correlation.domain_labels,
                domain_window_seconds=correlation.domain_window_seconds,
                domain_fraction=correlation.domain_fraction_percent / 100,
            )
        self.incident_pusher: IncidentPusher | None = None
        # Incidents closed since the last push: each is sent once more, resolved.
        self._closed_incidents: list[dict[str, Any]] = []
        if config.alertmanager.url and self.correlator is not None:
            self.incident_pusher = IncidentPusher(
                config.alertmanager.url,
                timeout=config.alertmanager.timeout_seconds,
                clock=clock,
                runbook_base_url=config.runbook_base_url,
            )
        self.rules: FleetRules | None = None
        if config.rules.enabled:
            self.rules = FleetRules(config.rules, self.store.read_rows, clock)
        self.ingest = Ingest(
            self.state,
            self.store,
            self.budget,
            prefix,
            stale_after=config.stale_after_seconds,
            clock=clock,
            history_interval=config.history_interval_seconds,
            correlator=self.correlator,
            rules=self.rules,
        )
        self.consumer = Consumer(config, self.ingest.handle, self.state, self.store)
        self.rules_runner: RulesRunner | None = None
        if self.rules is not None:
            self.rules_runner = RulesRunner(
                self.rules,
                self.ingest,
                self.store,
                publish=self.consumer.publish,
                prefix=prefix,
                clock=clock,
            )
        token, self._no_token_reason = _command_token(config.command_token_file)
        collector = FleetCollector(
            self.state,
            self.budget,
            self.store,
            stale_after=config.stale_after_seconds,
            clock=clock,
            view=self.view,
            correlator=self.correlator,
            rules=self.rules,
        )
        self.api = Api(
            state=self.state,
            store=self.store,
            registry=fleet_registry(collector),
            prefix=prefix,
            stale_after=config.stale_after_seconds,
            publish=self.consumer.publish,
            clock=clock,
            command_token=token,
            hosts=allowed_hosts(config.host_port[0], config.http_hosts),
            body_timeout=config.http.body_timeout_seconds,
            links=Links(config.grafana_url_template, config.runbook_base_url),
            clear_rule=self.rules_runner.clear if self.rules_runner is not None else None,
            budget=self.budget,
        )
        self.guard = ConnectionGuard(
            header_timeout=config.http.header_timeout_seconds,
            max_connections=config.http.max_connections,
            counter=self.state.counters.connections_rejected,
        )
        self.alertmanager: AlertmanagerReader | None = None
        if config.alertmanager.url:
            self.state.alerts.configured = True
            self.alertmanager = AlertmanagerReader(config.alertmanager, self.state.alerts, clock)
        self._stop = asyncio.Event()
        self.supervisor = Supervisor(self.state.counters.task_failures)
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        """Open the store, restore state, start serving and consuming."""
        await self.store.open()
        await self._restore()
        self._runner = web.AppRunner(
            application(self.api, (self.guard.middleware,)),
            access_log=None,
            keepalive_timeout=self.config.http.keepalive_timeout_seconds,
            # The rest of a body no handler read (an early refusal) is read and dropped
            # for at most this long before the connection is closed.
            lingering_time=self.config.http.body_timeout_seconds,
        )
        await self._runner.setup()
        host, port = self.config.host_port
        await GuardedSite(self._runner, host, port, self.guard).start()
        log.info(
            "aggregator: HTTP on %s, %d nodes from %s (schema version %d)",
            self.config.listen,
            len(self.state.nodes),
            describe(self.config.database),
            self.store.schema_version,
        )
        if self.store.shared and not self.config.cordon_budget.arbiter:
            log.info(
                "aggregator: cordon_budget.arbiter = false is ignored with a shared "
                "database: every aggregator decides cordon requests in it"
            )
        if not self.api.command_token:
            log.warning(
                "aggregator: commands are disabled: no command token (%s); "
                "POST .../commands is refused with 403",
                self._no_token_reason,
            )
        # Each restarted if it fails (logged, counted); one that keeps failing stops the
        # aggregator (`wait` raises), for systemd to restart it.
        self.supervisor.start("mqtt-consumer", self.consumer.run)
        self.supervisor.start("store-writer", lambda: self.store.run_writer(self._stop))
        self.supervisor.start("stale-sweep", self._sweep_stale)
        if self.correlator is not None:
            self.supervisor.start("correlation", self._correlate)
        if self.rules_runner is not None:
            self.supervisor.start("fleet-rules", self.rules_runner.run)
        pusher = self.incident_pusher
        if pusher is not None:
            self.supervisor.start(
                "incident-push",
                lambda: pusher.run(self._incidents_to_push, interval=INCIDENT_PUSH_SECONDS),
            )
        if self.view is not None:
            self.supervisor.start("shared-view", self.view.run)
            self.supervisor.start("maintenance-refresh", self._refresh_maintenance)
        if self.alertmanager is not None:
            self.supervisor.start("alertmanager", self.alertmanager.run)

    async def _restore(self) -> None:
        await self._load_maintenance()
        if self.rules_runner is not None:
            await self.rules_runner.restore()
        if self.view is not None:
            await self.view.start()
            return
        for record in await self.store.load_nodes():
            self.state.put(record)
        # The budget must survive a restart, or a restart would reopen it.
        window = self.config.cordon_budget.window_seconds
        replay(self.budget, await self.store.approvals(self.clock() - window))

    async def _load_maintenance(self) -> None:
        windows = await self.store.maintenance_windows(ending_after=self.clock())
        self.state.maintenance.load(reversed(windows))

    async def _refresh_maintenance(self) -> None:
        """With a shared database: the windows other aggregators started or ended."""
        while True:
            await asyncio.sleep(MAINTENANCE_REFRESH_SECONDS)
            await self._load_maintenance()

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
                    self.store.queue_stale(record, stale=is_stale)

    async def _correlate(self) -> None:
        """Decide held cordon requests when their time comes; write the fleet incidents
        that changed (the API and console read them from the store)."""
        assert self.correlator is not None
        while True:
            await asyncio.sleep(CORRELATION_TICK_SECONDS)
            now = self.clock()
            self.consumer.send_when_written(self.ingest.release_held(now))
            for incident in self.correlator.tick(now):
                doc = incident.json()
                self.store.queue_incident(doc)
                if self.incident_pusher is not None and doc["state"] == "closed":
                    self._closed_incidents.append(doc)

    def _incidents_to_push(self) -> list[dict[str, Any]]:
        assert self.correlator is not None
        closed, self._closed_incidents = self._closed_incidents, []
        return [*(i.json() for i in self.correlator.open_incidents()), *closed]

    def stop(self) -> None:
        self._stop.set()

    async def wait(self, stop: asyncio.Event | None = None) -> None:
        """Until `stop()` (or ``stop`` is set); raises TaskFailedError if a background task
        failed too often."""
        waits = [asyncio.ensure_future(self._stop.wait())]
        if stop is not None:
            waits.append(asyncio.ensure_future(stop.wait()))
        failed = asyncio.ensure_future(self.supervisor.failed.wait())
        try:
            await asyncio.wait([*waits, failed], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in (*waits, failed):
                waiting.cancel()
        if self.supervisor.failed.is_set():
            raise TaskFailedError(self.supervisor.reason)

    async def close(self) -> None:
        """Stop consuming and serving, then write what is queued; bounded at every step."""
        self._stop.set()
        await self.supervisor.cancel(STOP_STEP_SECONDS)
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
        await aggregator.wait(stop)
    finally:
        await aggregator.close()


def read_command_token(path: str) -> str:
    """The command token: the file's first line, stripped; empty (commands disabled) if
    there is no file name, or the file is missing, unreadable or empty."""
    return _command_token(path)[0]


def _command_token(path: str) -> tuple[str, str]:
    """(token, why there is none)."""
    if not path:
        return "", "aggregator.command_token_file is empty"
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        return "", f"cannot read {path}: {exc}"
    token = lines[0].strip() if lines else ""
    return token, "" if token else f"{path} is empty"
