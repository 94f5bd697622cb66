"""The daemon: startup, main loop, shutdown.

sources ──► snapshot store ──► outputs. The NVML poll and the event sources (kernel log,
NVML XID events, udev) feed one place: after every poll, and right after any new event,
the pure checks run over the latest observations and recent events and one complete
snapshot is published. The metrics endpoint and the local API only read that snapshot.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from gpuagent import __version__
from gpuagent.api import ApiServer
from gpuagent.checks import HealthMemory, InventoryView, evaluate
from gpuagent.config import Config
from gpuagent.daemon_api import AgentApi
from gpuagent.diskio import DiskThread
from gpuagent.events import EventLog
from gpuagent.fleet.reporter import CommandRefusedError, Reporter
from gpuagent.inventory import HostFacts, NodeInventory
from gpuagent.inventory.baseline import (
    BASELINE_FILE,
    Baseline,
    learn,
    load_baseline,
    save_baseline,
)
from gpuagent.inventory.build import build_inventory
from gpuagent.inventory.collect import collect_host
from gpuagent.inventory.services import read_services
from gpuagent.metrics import MetricsServer, build_registry
from gpuagent.model import (
    GpuEvent,
    GpuState,
    KmsgCounters,
    NodeSnapshot,
    PciePath,
    RemediationStatus,
    Severity,
)
from gpuagent.remediation.audit import AuditError, AuditStore
from gpuagent.remediation.build import build_backends
from gpuagent.remediation.executor import Remediator
from gpuagent.remediation.gpu_ops import GpuOps
from gpuagent.remediation.types import PlannedAction
from gpuagent.sdnotify import Notifier
from gpuagent.sim import Scenario, SimulatedNode, load_scenario
from gpuagent.sources.kmsg import KmsgSource
from gpuagent.sources.nvml import NvmlObservation, NvmlSource, host_process_name
from gpuagent.sources.nvml_events import NvmlEventWatcher
from gpuagent.sources.pcie import read_pcie_paths
from gpuagent.sources.udev import PciChange, UdevWatcher
from gpuagent.store import SnapshotStore
from gpuagent.supervisor import SourceTracker, supervise
from gpuagent.textfile import TextfileWriter

log = logging.getLogger(__name__)

# systemd SIGKILLs a daemon still stopping TimeoutStopSec= after SIGTERM (10 s in
# systemd/gpuagent.service): the whole stop sequence (MQTT goodbye, cancelling and awaiting
# every task, closing the API, NVML and /metrics) shares one deadline this long after the
# stop began, a margin under TimeoutStopSec. tests/test_systemd_units.py keeps it below.
STOP_BUDGET_SECONDS = 8.0
# The last part of the budget is kept for leaving: what asyncio.run and the interpreter
# wait for after shutdown() (see _leave_by_deadline).
_STOP_EXIT_RESERVE_SECONDS = 0.5
_MAX_BACKOFF_SECONDS = 60.0
_GIL_SWITCH_SECONDS = 0.0005
_SYSFS_TIMEOUT_SECONDS = 10.0
_INVENTORY_TIMEOUT_SECONDS = 10.0
_PRUNE_SECONDS = 60.0
_RUN_CHECKS_TIMEOUT_SECONDS = 30.0
_UDEV_KINDS = {
    "add": "gpu_added",
    "remove": "gpu_removed",
    "bind": "driver_bound",
    "unbind": "driver_unbound",
}


class Agent:
    def __init__(self, config: Config, *, simulate: Path | Scenario | None = None) -> None:
        self.config = config
        self.simulator: SimulatedNode | None = None
        if simulate is not None:
            scenario = load_scenario(simulate) if isinstance(simulate, Path) else simulate
            self.simulator = SimulatedNode(scenario)
        self.store = SnapshotStore()
        self.events = EventLog(config.events)
        self.notifier = Notifier()
        self.node_name = config.agent.resolved_node_name
        self._hostname = socket.gethostname()
        self._stop = asyncio.Event()
        self.refresh_requested = asyncio.Event()
        self._polled = asyncio.Event()  # set after every NVML poll's snapshot
        self._memory = HealthMemory()
        self._sequence = 0
        self.polls = 0
        self._trackers = {"nvml": SourceTracker("nvml")}
        self.nvml: NvmlSource | None = None
        self._last_observation: NvmlObservation | None = None
        self._pcie: tuple[PciePath, ...] = ()
        self._kmsg: KmsgSource | None = None
        self._xid_watcher: NvmlEventWatcher | None = None
        self._xid_generation = 0
        self._publish_pending = False
        self._metrics: MetricsServer | None = None
        self._api = ApiServer(config.api.socket, config.api.group)
        self.remediator: Remediator | None = None
        self.reporter: Reporter | None = None
        # The state directory's databases (spool, audit trail) commit on this thread.
        self._disk = DiskThread()
        textfile = config.outputs.textfile
        self._textfile = (
            TextfileWriter(Path(textfile.dir), textfile.min_interval_seconds)
            if textfile.dir
            else None
        )
        self._remediation_pending: NodeSnapshot | None = None
        self._remediation_task: asyncio.Task[None] | None = None
        self._host: HostFacts | None = None
        self.inventory_refresh_requested = asyncio.Event()
        self._baseline_path = config.agent.state_dir / BASELINE_FILE
        self._baseline: Baseline | None = None
        # Only the daemon learns a baseline; a one-shot `gpuagent check` just compares.
        self._may_learn = False

    # --- phases -----------------------------------------------------------------------

    async def run(self) -> None:
        # The metrics thread must not queue behind a poll's burst of Python work for the
        # interpreter's default 5 ms switch interval: ask for the GIL to change hands sooner.
        sys.setswitchinterval(_GIL_SWITCH_SECONDS)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal)
        started = time.monotonic()
        try:
            await self.startup()
            log.info("ready in %.2f s: %s", time.monotonic() - started, self.summary())
            await self.main_loop()
        finally:
            await self.shutdown()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
            self._leave_by_deadline()

    def stop(self) -> None:
        """Begin stopping: the stop budget runs from now."""
        self._stop_deadline()
        self._stop.set()

    def _on_signal(self) -> None:
        self.stop()
        self._leave_by_deadline()  # whatever happens to the steps, exit within the budget

    def _open_sources(self) -> None:
        if self.simulator is not None:
            self.simulator.install()
            log.info("simulating %d GPUs beneath NVML", self.simulator.gpu_count)
        process_name = self.simulator.process_name if self.simulator else host_process_name
        self.nvml = NvmlSource(self.config.sources.nvml, process_name=process_name)

    async def _close_sources(self) -> None:
        if self._xid_watcher is not None:
            self._xid_watcher.stop()
        if self.nvml is not None:
            await self.nvml.close()
        if self.simulator is not None:
            self.simulator.uninstall()

    async def collect_once(self, kernel_log: bytes | None = None) -> NodeSnapshot:
        """One poll and one evaluation without serving anything (`gpuagent check`).

        ``kernel_log``: captured kernel-log text (dmesg, `journalctl -k`) judged as if its
        lines had just been read from /dev/kmsg.
        """
        self._open_sources()
        if kernel_log is not None:
            KmsgSource(self.config.sources.kmsg, self.on_event).feed(kernel_log + b"\n")
        try:
            if self.config.inventory.enabled:
                self._load_baseline()
                await self.refresh_inventory()
            await self.poll_once(watch_xid_events=False)
        finally:
            await self._close_sources()
        assert self.store.current is not None
        return self.store.current

    def _build_reporter(self, audit: AuditStore) -> Reporter | None:
        mqtt = self.config.outputs.mqtt
        if not mqtt.enabled:
            return None
        reporter = Reporter(
            mqtt,
            node=self.node_name,
            cluster=self.config.agent.cluster,
            agent_version=__version__,
            state_dir=self.config.agent.state_dir,
            audit=audit,
            disk=self._disk,
        )
        reporter.target = self
        return reporter

    def _build_remediator(self, audit: AuditStore) -> Remediator:
        config = self.config.remediation
        ask = self.reporter.ask_aggregator if self.reporter is not None else None
        return Remediator(
            config,
            audit=audit,
            backends=build_backends(config.cordon, self.node_name, self.config.agent.cluster, ask),
            ops=GpuOps(
                reset_command=config.reset.command,
                timeout=config.reset.timeout_seconds,
                simulator=self.simulator,
                nvml=lambda: self.nvml,
            ),
            node=self.node_name,
            cluster=self.config.agent.cluster,
            on_reset=self._on_gpu_reset,
            simulated=self.simulator is not None,
        )

    def _on_gpu_reset(self, bus_id: str, when: float) -> None:
        # A reset clears what the XIDs before it asked for; poll at once to see the GPU.
        self.events.forget(bus_id, when, frozenset({"xid", "gsp"}))
        self.refresh_requested.set()

    async def startup(self) -> None:
        audit = AuditStore(self.config.agent.state_dir / "remediation.sqlite", disk=self._disk)
        # A read-only or full state directory must not stop monitoring: the trail is tried
        # again by remediation, which does nothing meanwhile (the state_dir finding says so).
        await audit.open()
        self.reporter = self._build_reporter(audit)
        self.remediator = self._build_remediator(audit)
        if self.reporter is not None:
            self.remediator.on_record = self.reporter.audit_written
        self._open_sources()
        host, port = self.config.metrics.host_port
        self._metrics = MetricsServer(
            build_registry(lambda: self.store.current, __version__), host, port
        )
        self._metrics.start()
        AgentApi(self).register(self._api)
        await self._api.start()
        if self.config.inventory.enabled:
            self._load_baseline()
            self._may_learn = self.config.inventory.learn
            await self.refresh_inventory()
        await self.poll_once()
        self.notifier.ready(self.summary())

    async def main_loop(self) -> None:
        sources = self.config.sources
        async with asyncio.TaskGroup() as tasks:
            running = [
                tasks.create_task(self._poll_loop(), name="poll-nvml"),
                tasks.create_task(self._watchdog_loop(), name="watchdog"),
                tasks.create_task(self._prune_loop(), name="prune-events"),
            ]
            if sources.kmsg.enabled:
                running.append(tasks.create_task(self._run_kmsg(), name="kmsg"))
            if sources.sysfs.enabled:
                running.append(tasks.create_task(self._sysfs_loop(), name="sysfs"))
            if self.config.inventory.enabled:
                running.append(tasks.create_task(self._inventory_loop(), name="inventory"))
            # A simulated node has no NVIDIA devices on the host bus; its udev events come
            # from `gpuagent inject pci_remove|pci_add` instead.
            if sources.udev.enabled and self.simulator is None:
                running.append(tasks.create_task(self._run_udev(), name="udev"))
            if self.reporter is not None:
                running.append(tasks.create_task(self.reporter.run(), name="mqtt"))
            await self._stop.wait()
            deadline = self._stop_deadline()
            if self.reporter is not None:
                # Before the connection goes: a clean goodbye, not the Last Will.
                await self._until(deadline, self.reporter.shutdown(), "the MQTT goodbye")
            await self._cancel_and_wait(running, deadline)

    # --- stopping: every step below shares one deadline, STOP_BUDGET_SECONDS from the stop -

    _stop_by: float | None = None  # time.monotonic() the steps must end by, once stopping
    _exit_timer: threading.Timer | None = None

    def _stop_deadline(self) -> float:
        """The deadline of every stop step, fixed when the first of them asks."""
        if self._stop_by is None:
            self._stop_by = time.monotonic() + STOP_BUDGET_SECONDS - _STOP_EXIT_RESERVE_SECONDS
        return self._stop_by

    async def shutdown(self) -> None:
        deadline = self._stop_deadline()
        self.notifier.stopping()
        await self._until(deadline, self._api.stop(), "the local API")
        if self._remediation_task is not None:
            await self._cancel_and_wait([self._remediation_task], deadline)
        await self._until(deadline, self._close_sources(), "closing NVML")
        if self.reporter is not None:
            self.reporter.close()
        if self.remediator is not None:
            self.remediator.audit.close()
        self._disk.close()  # after what is queued (a daemon thread: never holds up exit)
        if self._metrics is not None:
            self._metrics.stop(timeout=deadline - time.monotonic())
        began = deadline + _STOP_EXIT_RESERVE_SECONDS - STOP_BUDGET_SECONDS
        log.info("stopped in %.1f s", time.monotonic() - began)

    def _leave_by_deadline(self) -> None:
        """After shutdown(), asyncio.run still waits for leftover tasks and the default
        executor's threads, and the interpreter joins those threads: one wedged in a sysfs
        read, or a task that ignores cancellation, would outlast TimeoutStopSec. Past the
        budget, exit anyway (a daemon thread: a process that exits in time never fires it).
        Armed by run() only, at the signal: the process is the daemon's."""
        if self._exit_timer is not None:
            return
        remaining = self._stop_deadline() + _STOP_EXIT_RESERVE_SECONDS - time.monotonic()
        code = 0 if self._stop.is_set() else 1  # asked to stop, or stopping after a crash
        self._exit_timer = threading.Timer(max(remaining, 0.0), self._exit_now, (code,))
        self._exit_timer.daemon = True
        self._exit_timer.start()

    @staticmethod
    async def _until(deadline: float, step: Awaitable[None], what: str) -> None:
        """Await one stop step, cancelled at ``deadline`` (time.monotonic()) if still running."""
        try:
            async with asyncio.timeout(max(deadline - time.monotonic(), 0.0)):
                await step
        except TimeoutError:
            log.warning("stopping: %s did not finish within the stop budget", what)

    @staticmethod
    async def _cancel_and_wait(tasks: list[asyncio.Task[None]], deadline: float) -> None:
        """Cancel ``tasks`` and wait for them to end, until ``deadline`` (time.monotonic())."""
        for task in tasks:
            task.cancel()
        if not tasks:
            return
        _done, pending = await asyncio.wait(tasks, timeout=max(deadline - time.monotonic(), 0.0))
        if pending:
            # Stuck in cleanup (an await in a finally): cancel that too. What still runs after
            # this is left to _leave_by_deadline.
            for task in pending:
                task.cancel()
            names = ", ".join(sorted(task.get_name() for task in pending))
            log.warning("stopping: %s still running at the end of the stop budget", names)

    @staticmethod
    def _exit_now(code: int) -> None:
        log.error(
            "stopping took longer than its %.0f s budget; exiting without waiting further",
            STOP_BUDGET_SECONDS,
        )
        logging.shutdown()
        os._exit(code)

    # --- the NVML poll ------------------------------------------------------------------

    async def _poll_loop(self) -> None:
        interval = self.config.sources.nvml.interval_seconds
        backoff = interval
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(backoff):
                    await self.refresh_requested.wait()
            self.refresh_requested.clear()
            ok = await self.poll_once()
            backoff = interval if ok else min(backoff * 2, max(_MAX_BACKOFF_SECONDS, interval))

    async def poll_once(self, *, watch_xid_events: bool = True) -> bool:
        """Poll NVML, evaluate checks, publish a snapshot. False when the source failed."""
        assert self.nvml is not None
        tracker = self._trackers["nvml"]
        started = time.monotonic()
        self.polls += 1
        try:
            observation = await self.nvml.poll()
        except Exception as exc:  # a source bug must not take the daemon down
            log.exception("NVML poll failed")
            tracker.failure(time.monotonic() - started, f"{type(exc).__name__}: {exc}")
            self._last_observation = self._without_values(tracker.status.last_error)
            self._publish()
            return False
        duration = time.monotonic() - started
        if observation.status.ok:
            tracker.success(duration)
        else:
            tracker.failure(duration, observation.status.message)
        self._last_observation = observation
        if watch_xid_events and self.config.sources.nvml_events.enabled:
            self._watch_xid_events()
            self._track_xid_watcher()
        self._publish()
        self._polled.set()
        return True

    def _without_values(self, error: str | None) -> NvmlObservation | None:
        """After a failed poll: the GPUs we know, with no values (nothing stale)."""
        last = self._last_observation
        if last is None:
            return None
        gpus = tuple(GpuState(g.identity, "error", error=error) for g in last.gpus)
        return NvmlObservation(last.status, gpus)

    def _watch_xid_events(self) -> None:
        """(Re)register NVML XID events whenever a new NVML session brings new handles."""
        assert self.nvml is not None
        if self.nvml.generation == self._xid_generation:
            return
        if self._xid_watcher is not None:
            self._xid_watcher.stop()
        self._xid_generation = self.nvml.generation
        self._xid_watcher = NvmlEventWatcher(
            self.nvml.devices(),
            self.on_event,
            asyncio.get_running_loop(),
            call_timeout=self.config.sources.nvml.call_timeout_seconds,
        )
        self._xid_watcher.start()

    def _track_xid_watcher(self) -> None:
        watcher = self._xid_watcher
        if watcher is None:
            return
        tracker = self._trackers.setdefault("nvml_events", SourceTracker("nvml_events"))
        if watcher.error:
            tracker.failure(0.0, watcher.error)
        elif not tracker.status.up:
            tracker.success(0.0)

    # --- event sources ------------------------------------------------------------------

    def on_event(self, event: GpuEvent) -> None:
        """Every source's events arrive here, on the event loop."""
        if not self.events.add(event):
            return
        if self.reporter is not None:
            self.reporter.offer_event(event)
        log.info(
            "%s event %s%s on %s: %s",
            event.source,
            event.kind,
            f" {event.code}" if event.code is not None else "",
            event.gpu or event.pci or "node",
            event.line,
            extra={
                "gpu_bus_id": event.gpu,
                "event_kind": event.kind,
                "xid": event.code if event.kind == "xid" else None,
                "sxid": event.code if event.kind == "sxid" else None,
            },
        )
        self._schedule_publish()

    def _schedule_publish(self) -> None:
        # A burst of kernel lines is read in one go: evaluate once after it, not per line.
        if not self._publish_pending:
            self._publish_pending = True
            asyncio.get_running_loop().call_soon(self._publish_now)

    def _publish_now(self) -> None:
        self._publish_pending = False
        self._publish()

    async def _run_kmsg(self) -> None:
        tracker = self._trackers.setdefault("kmsg", SourceTracker("kmsg"))

        async def run(ready: Callable[[], None]) -> None:
            self._kmsg = KmsgSource(self.config.sources.kmsg, self.on_event)
            await self._kmsg.run(ready)

        await supervise(tracker, run, self._schedule_publish)

    async def _sysfs_loop(self) -> None:
        tracker = self._trackers.setdefault("sysfs", SourceTracker("sysfs"))
        config = self.config.sources.sysfs
        while True:
            started = time.monotonic()
            try:
                async with asyncio.timeout(_SYSFS_TIMEOUT_SECONDS):
                    self._pcie = await asyncio.to_thread(read_pcie_paths, config.root)
            except (OSError, TimeoutError) as exc:
                tracker.failure(time.monotonic() - started, str(exc) or type(exc).__name__)
            else:
                tracker.success(time.monotonic() - started)
            self._schedule_publish()
            await asyncio.sleep(config.interval_seconds)

    # --- the node inventory ----------------------------------------------------------------

    def _load_baseline(self) -> None:
        if self.config.inventory.learn:
            self._baseline = load_baseline(self._baseline_path)

    async def refresh_inventory(self) -> None:
        """Read the host side of the inventory (sysfs, procfs, systemd) off the loop."""
        tracker = self._trackers.setdefault("inventory", SourceTracker("inventory"))
        config = self.config.inventory
        started = time.monotonic()
        if self.simulator is not None:
            # A simulated node's PCI functions, modules and services are the scenario's.
            self._host = self.simulator.host_facts()
            tracker.success(time.monotonic() - started)
            return
        try:
            async with asyncio.timeout(_INVENTORY_TIMEOUT_SECONDS):
                services = await read_services(config.systemctl)
                self._host = await asyncio.to_thread(
                    collect_host,
                    self.config.sources.sysfs.root,
                    config.proc_root,
                    config.os_release,
                    tuple(config.expected.modules),
                    services=services,
                    library_dirs=tuple(config.library_dirs),
                )
        except (OSError, TimeoutError) as exc:
            tracker.failure(time.monotonic() - started, str(exc) or type(exc).__name__)
        else:
            tracker.success(time.monotonic() - started)

    async def _inventory_loop(self) -> None:
        interval = self.config.inventory.refresh_seconds
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await self.inventory_refresh_requested.wait()
            self.inventory_refresh_requested.clear()
            await self.refresh_inventory()
            self._schedule_publish()

    def _inventory(self, observation: NvmlObservation) -> NodeInventory | None:
        if self._host is None:
            return None
        return build_inventory(
            self._host,
            observation.status,
            observation.gpus,
            __version__,
            self.config.inventory.expected.gpus,
        )

    def _learn(self, inventory: NodeInventory | None, severity: Severity) -> None:
        """Learn mode: the first healthy inventory becomes the baseline drift is judged by."""
        if not self._may_learn or self._baseline is not None or inventory is None:
            return
        if severity is not Severity.OK or not inventory.nvml_ok:
            return
        learned = learn(inventory)
        try:
            save_baseline(self._baseline_path, learned, time.time())
        except OSError as exc:
            log.warning("cannot write inventory baseline %s: %s", self._baseline_path, exc)
            return
        self._baseline = learned
        log.info("learned inventory baseline: %s", learned)

    async def _run_udev(self) -> None:
        tracker = self._trackers.setdefault("udev", SourceTracker("udev"))

        async def run(ready: Callable[[], None]) -> None:
            watcher = UdevWatcher()
            try:
                ready()
                async for change in watcher.changes():
                    self.on_pci_change(change)
            finally:
                watcher.close()

        await supervise(tracker, run, self._schedule_publish)

    def on_pci_change(self, change: PciChange) -> None:
        now, wall = time.monotonic(), time.time()
        kind = _UDEV_KINDS[change.action]
        self.on_event(
            GpuEvent(
                event_id=f"udev:{change.address}:{change.action}:{time.monotonic_ns()}",
                source="udev",
                kind=kind,  # type: ignore[arg-type]
                gpu=change.address,
                time=wall,
                monotonic=now,
                pci=change.address,
                line=f"PCI {change.action} {change.address}"
                + (f" (driver {change.driver})" if change.driver else ""),
            )
        )
        # The PCI functions changed: read the inventory again now, not at the next refresh.
        self.inventory_refresh_requested.set()
        if change.action in ("add", "bind") and self.nvml is not None:
            # A GPU (re)appeared: enumerate again without restarting the daemon.
            self.nvml.reopen()
            self.refresh_requested.set()

    async def _prune_loop(self) -> None:
        while True:
            await asyncio.sleep(_PRUNE_SECONDS)
            self.events.prune(time.monotonic())
            self._schedule_publish()

    async def _watchdog_loop(self) -> None:
        # WATCHDOG=1 comes from the event loop itself, so a blocked loop stops the pings
        # and systemd restarts us; a wedged NVML call (on its own thread) does not.
        interval = self.notifier.watchdog_interval
        if interval is None:
            return
        while True:
            self.notifier.watchdog()
            await asyncio.sleep(interval)

    # --- evaluation and publishing ---------------------------------------------------------

    def _storage_errors(self) -> tuple[tuple[str, str], ...]:
        """The stores in the state directory that cannot be used now, and why."""
        errors = []
        if self.reporter is not None and self.reporter.outbox.error:
            errors.append(("spool", self.reporter.outbox.error))
        if self.remediator is not None and self.remediator.audit.error:
            errors.append(("audit", self.remediator.audit.error))
        return tuple(errors)

    def _publish(self) -> None:
        observation = self._last_observation
        if observation is None:
            return
        previous = self.store.current
        events = self.events.recent()
        inventory = self._inventory(observation)
        expected = self.config.inventory.expected
        health, self._memory = evaluate(
            observation.gpus,
            observation.status,
            self.config.checks,
            self._memory,
            time.monotonic(),
            events=events,
            pcie=self._pcie,
            inventory=None
            if inventory is None
            else InventoryView(inventory, expected, self._baseline),
            expected_gpus=expected.gpu,
            storage_errors=self._storage_errors(),
        )
        self._learn(inventory, health.severity)
        self._sequence += 1
        snapshot = NodeSnapshot(
            node_name=self.node_name,
            cluster=self.config.agent.cluster,
            hostname=self._hostname,
            sequence=self._sequence,
            taken_at=time.time(),
            nvml=observation.status,
            gpus=observation.gpus,
            health=health,
            sources=tuple(t.status for t in self._trackers.values()),
            simulated=self.simulator is not None,
            rejected_api_requests=tuple(sorted(self._api.rejected.items())),
            events=events,
            pcie=self._pcie,
            kmsg=self._kmsg.counters if self._kmsg is not None else KmsgCounters(),
            event_counts=self.events.counts(),
            remediation=self._remediation_status(),
            mqtt=self.reporter.status() if self.reporter is not None else None,
            inventory=inventory,
        )
        self._log_transitions(previous, snapshot)
        self.store.publish(snapshot)
        if self._metrics is not None:
            # Render /metrics now, once per snapshot, so no scrape waits for rendering.
            exposition = self._metrics.exposition
            exposition.refresh()
            if self._textfile is not None:
                self._textfile.offer(lambda: exposition.body(gzipped=False))
        self.notifier.status(self.summary())
        if self.reporter is not None:
            self.reporter.offer_snapshot(snapshot)
        self._schedule_remediation(snapshot)

    def _remediation_status(self) -> RemediationStatus | None:
        remediator = self.remediator
        if remediator is None:
            return None
        try:
            cordoned, budgets = remediator.history().cordoned_by_us, remediator.budget_remaining()
        except AuditError:  # unknown without the trail (the state_dir finding says why)
            cordoned, budgets = False, []
        return RemediationStatus(
            mode=remediator.mode,
            paused=remediator.paused,
            cordoned_by_us=cordoned,
            counts=tuple((a, r, n) for (a, r), n in sorted(remediator.counts.items())),
            budgets=tuple(budgets),
        )

    def _schedule_remediation(self, snapshot: NodeSnapshot) -> None:
        """Remediation runs beside publishing, one cycle at a time, on the newest snapshot."""
        if self.remediator is None:
            return
        self._remediation_pending = snapshot
        if self._remediation_task is None or self._remediation_task.done():
            self._remediation_task = asyncio.get_running_loop().create_task(
                self._remediation_loop(), name="remediation"
            )

    async def _remediation_loop(self) -> None:
        assert self.remediator is not None
        while (snapshot := self._remediation_pending) is not None:
            self._remediation_pending = None
            try:
                await self.remediator.handle(snapshot)
            except Exception:  # a remediation bug must not take monitoring down
                log.exception("remediation cycle failed")

    def _log_transitions(self, previous: NodeSnapshot | None, current: NodeSnapshot) -> None:
        before = (
            {(f.gpu, f.check): f.severity for f in previous.health.findings} if previous else {}
        )
        for finding in current.health.findings:
            old = before.get((finding.gpu, finding.check), Severity.OK)
            if old is not finding.severity:
                gpu = current.gpu(finding.gpu) if finding.gpu else None
                log.warning(
                    "%s %s: %s -> %s: %s",
                    finding.gpu or "node",
                    finding.check,
                    old.name,
                    finding.severity.name,
                    finding.reason,
                    extra={
                        "gpu_bus_id": finding.gpu,
                        "gpu_uuid": gpu.identity.uuid if gpu else None,
                        "check": finding.check,
                        "severity": finding.severity.name,
                        "runbook": finding.runbook or None,
                    },
                )

    # --- remote commands (the MQTT reporter's CommandTarget) ----------------------------------

    def refresh(self) -> None:
        self.refresh_requested.set()

    async def run_checks(self) -> str:
        """Poll and evaluate now; the summary of the snapshot that follows."""
        before = self.polls
        self.refresh_requested.set()
        async with asyncio.timeout(_RUN_CHECKS_TIMEOUT_SECONDS):
            while self.polls <= before:
                self._polled.clear()
                await self._polled.wait()
        return self.summary()

    def set_remediation_mode(self, mode: str) -> str:
        assert self.remediator is not None
        detail = self.remediator.set_mode(mode)
        self._schedule_publish()
        return detail

    async def reset_gpu(self, bus_id: str) -> str:
        """A remote reset request: through every rail local remediation has (mode, kill
        switch, budgets, no process on the GPU, cordoned first), never around them."""
        snapshot = self.store.current
        assert self.remediator is not None
        if snapshot is None or snapshot.gpu(bus_id) is None:
            raise CommandRefusedError(f"no GPU {bus_id} on this node")
        action = PlannedAction("reset_gpu", bus_id, "requested by the aggregator")
        try:
            record = await self.remediator.run_requested(action, snapshot)
        except AuditError as exc:
            raise CommandRefusedError(str(exc)) from None
        if record is None:
            raise CommandRefusedError("not attempted: cooling down after a recent attempt")
        if record.result not in ("succeeded", "planned"):
            raise CommandRefusedError(f"{record.result}: {record.detail}")
        return f"{record.result}: {record.detail}"

    def summary(self) -> str:
        snapshot = self.store.current
        if snapshot is None:
            return "starting"
        problems = len(snapshot.health.problems())
        return (
            f"{len(snapshot.gpus)} GPUs, health {snapshot.health.severity.name}, "
            f"{problems} problem{'s' if problems != 1 else ''}"
        )
