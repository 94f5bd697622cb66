"""The daemon: startup, main loop, shutdown.

sources ──► snapshot store ──► outputs. The NVML poll and the event sources (kernel log,
NVML XID events, udev) feed one place: after every poll, and right after any new event,
the pure checks run over the latest observations and recent events and one complete
snapshot is published. The metrics endpoint and the local API only read that snapshot.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuagent import __version__, heap
from gpuagent.acks import AckBook, AckError
from gpuagent.api import ApiServer
from gpuagent.config import Config
from gpuagent.daemon_api import AgentApi
from gpuagent.diskio import DiskThread
from gpuagent.events import EventLog, reset_event
from gpuagent.metrics import MetricsServer, build_registry
from gpuagent.metrics.probes import Probes
from gpuagent.model import DiagResult, GpuEvent, NodeHealth, NodeSnapshot
from gpuagent.node.inventory import InventoryKeeper
from gpuagent.node.poller import NvmlPoller
from gpuagent.node.publisher import SnapshotPublisher, host_booted_at
from gpuagent.node.remediation import RemediationScheduler, build_remediator
from gpuagent.node.sources import EventSources
from gpuagent.remediation.audit import AuditError, AuditRecord, AuditStore
from gpuagent.remediation.executor import Remediator
from gpuagent.remediation.types import PlannedAction
from gpuagent.sdnotify import Notifier
from gpuagent.sources.udev import PciChange
from gpuagent.store import SnapshotStore
from gpuagent.supervisor import SourceTracker

# Imported where used, so a node imports them only when it uses them (the MQTT libraries
# only where reporting is on, the Kubernetes watch and output and attribution only where
# configured, the simulator only under --simulate): each costs RSS (tests/test_heap.py).
if TYPE_CHECKING:
    from gpuagent.attribution.source import AttributionSource
    from gpuagent.dcgm.control import DcgmControl
    from gpuagent.dcgm.source import DcgmSource
    from gpuagent.fleet.reporter import Reporter
    from gpuagent.k8s.output import KubernetesOutput
    from gpuagent.node.kubernetes import KubernetesWatch
    from gpuagent.sim import Scenario, SimulatedNode

log = logging.getLogger(__name__)

# systemd SIGKILLs a daemon still stopping TimeoutStopSec= after SIGTERM (10 s in
# systemd/gpuagent.service): the whole stop sequence (MQTT goodbye, cancelling and awaiting
# every task, closing the API, NVML and /metrics) shares one deadline this long after the
# stop began, a margin under TimeoutStopSec. tests/test_systemd_units.py keeps it below.
STOP_BUDGET_SECONDS = 8.0
# The last part of the budget is kept for leaving: what asyncio.run and the interpreter
# wait for after shutdown() (see _leave_by_deadline).
_STOP_EXIT_RESERVE_SECONDS = 0.5
_GIL_SWITCH_SECONDS = 0.0002


class Agent:
    """The daemon's lifecycle (startup, main loop, shutdown within its stop budget), and
    the wiring of its components (gpuagent.node), done once here. It is also what the local
    API (daemon_api.ApiTarget) and remote commands (fleet.reporter.CommandTarget) act on."""

    def __init__(self, config: Config, *, simulate: Path | Scenario | None = None) -> None:
        self.config = config
        self.simulator: SimulatedNode | None = None
        if simulate is not None:
            from gpuagent.sim import SimulatedNode, load_scenario  # noqa: PLC0415

            scenario = load_scenario(simulate) if isinstance(simulate, Path) else simulate
            self.simulator = SimulatedNode(scenario)
        self.store = SnapshotStore()
        stall = config.metrics.health_stall_seconds
        # /healthz and /readyz (on the metrics listener); its heartbeat runs with the rest.
        self.probes = Probes(
            stall, self._snapshot_age, stall + config.sources.nvml.interval_seconds
        )
        self.events = EventLog(config.events)
        self.acks = AckBook(config.agent.state_dir)
        self.notifier = Notifier()
        self.node_name = config.agent.resolved_node_name
        self._stop = asyncio.Event()
        self._metrics: MetricsServer | None = None
        self._api = ApiServer(config.api.socket, config.api.group)
        self._reporter: Reporter | None = None
        # The state directory's databases (spool, audit trail) commit on this thread.
        self._disk = DiskThread()
        # The audit trail: remediation's, and what operators do by hand (ack, clear-drills).
        self.audit = AuditStore(config.agent.state_dir / "remediation.sqlite", disk=self._disk)
        # DCGM, when its bindings are installed: what remediation and `gpuagent diag` run
        # DCGM's diagnostic through.
        self.dcgm: DcgmControl | None = None
        self._dcgm_source: DcgmSource | None = None
        if config.sources.dcgm.enabled:
            from gpuagent.dcgm.source import DcgmSource  # noqa: PLC0415

            self._dcgm_source = DcgmSource(
                config.sources.dcgm,
                changed=self._schedule_publish,
                on_event=self.on_event,
                profiling_wanted=self._gpus_without_gpm,
            )
        # The components, wired once: each reaches the others only through what it gets here.
        trackers = {"nvml": SourceTracker("nvml")}  # in the order the snapshot lists them
        self.remediation = RemediationScheduler()
        self.inventory = InventoryKeeper(
            config, trackers, self.simulator, schedule_publish=self._schedule_publish
        )
        self.sources = EventSources(
            config,
            self.events,
            trackers,
            schedule_publish=self._schedule_publish,
            inventory_changed=self.inventory.request_refresh,
            gpu_appeared=self._gpu_appeared,
        )
        self.poller = NvmlPoller(
            config, trackers, self.simulator, publish=self._publish, on_event=self.on_event
        )
        self.publisher = SnapshotPublisher(
            config,
            store=self.store,
            events=self.events,
            notifier=self.notifier,
            trackers=trackers,
            observations=self.poller,
            kernel=self.sources,
            inventory=self.inventory,
            remediation=self.remediation,
            api=self._api,
            simulated=self.simulator is not None,
            booted_at=self.simulator.booted_at if self.simulator is not None else host_booted_at(),
        )
        self.publisher.dcgm = self._dcgm_source
        self.publisher.acks = self.sources.acks = self.acks
        # Only on a Kubernetes node (checks.kubernetes): elsewhere it never reads or fires.
        self.kubernetes: KubernetesWatch | None = None
        if config.watches_kubernetes:
            from gpuagent.node.kubernetes import KubernetesWatch  # noqa: PLC0415

            self.kubernetes = KubernetesWatch(
                config, trackers, self.simulator, schedule_publish=self._schedule_publish
            )
        self.publisher.kubernetes = self.kubernetes
        # Workload attribution: off by default, and then nothing is read or attached.
        self.attribution: AttributionSource | None = None
        if config.attribution.enabled:
            from gpuagent.attribution.source import AttributionSource  # noqa: PLC0415

            self.attribution = AttributionSource(config, trackers, self._schedule_publish)
            self.sources.owners = self.attribution.owners_of
        self.publisher.attribution = self.attribution
        # Conditions and events on the Node (outputs.kubernetes), observe mode included.
        self.kubernetes_output: KubernetesOutput | None = None
        if config.outputs.kubernetes.enabled:
            from gpuagent.k8s.output import KubernetesOutput  # noqa: PLC0415

            tracker = trackers.setdefault("kubernetes_output", SourceTracker("kubernetes_output"))
            self.kubernetes_output = KubernetesOutput(config, tracker)
            self.sources.sinks.append(self.kubernetes_output)
            self.publisher.kubernetes_output = self.kubernetes_output

    # --- what the components hold, as the API, the tests and the CLI know it ----------------

    @property
    def reporter(self) -> Reporter | None:
        return self._reporter

    @reporter.setter
    def reporter(self, reporter: Reporter | None) -> None:
        if self._reporter is not None:
            self.sources.sinks.remove(self._reporter)
        self._reporter = reporter
        if reporter is not None:
            self.sources.sinks.append(reporter)
        self.publisher.reporter = reporter

    @property
    def remediator(self) -> Remediator | None:
        return self.remediation.remediator

    @property
    def polls(self) -> int:
        return self.poller.polls

    @property
    def kmsg_path(self) -> Path:
        return self.config.sources.kmsg.path

    def _publish(self) -> None:
        self.publisher.publish()

    def _schedule_publish(self) -> None:
        self.publisher.schedule()

    def _gpu_appeared(self) -> None:
        self.poller.gpu_appeared()

    def _gpus_without_gpm(self) -> frozenset[str]:
        """Bus ids of the answering GPUs whose NVML poll has no GPM profiling values."""
        observation = self.poller.last_observation
        if observation is None:
            return frozenset()
        return frozenset(
            g.identity.pci_bus_id
            for g in observation.gpus
            if g.readings is not None and not g.readings.profiling
        )

    def on_event(self, event: GpuEvent) -> None:
        """Every source's events arrive here, on the event loop."""
        self.sources.on_event(event)

    def on_pci_change(self, change: PciChange) -> None:
        self.sources.on_pci_change(change)

    # --- phases -----------------------------------------------------------------------

    async def run(self) -> None:
        # The metrics thread must not queue behind a poll's burst of Python work (or a
        # kernel-log storm) for the interpreter's default 5 ms switch interval: ask for the
        # GIL to change hands sooner. A scrape takes it several times (accept, read, write).
        sys.setswitchinterval(_GIL_SWITCH_SECONDS)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal)
        started = time.monotonic()
        # What importing and building the components freed, before start-up allocates.
        gc.collect()
        heap.give_back()
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
        self.poller.open()
        if self.poller.simulated_host is not None:
            # A simulated node's RDMA devices are in the simulator's sysfs tree.
            self.sources.infiniband_root = self.poller.simulated_host / "sys"

    async def _close_sources(self) -> None:
        await self.poller.close()

    async def collect_once(self, kernel_log: bytes | None = None) -> NodeSnapshot:
        """One poll and one evaluation without serving anything (`gpuagent check`).

        ``kernel_log``: captured kernel-log text (dmesg, `journalctl -k`) judged as if its
        lines had just been read from /dev/kmsg.
        """
        self._open_sources()
        if kernel_log is not None:
            self.sources.feed_kernel_log(kernel_log + b"\n")
        try:
            if self.config.inventory.enabled:
                self.inventory.load_baseline()
                await self.inventory.refresh()
            if self.config.sources.sysfs.enabled:
                await self.sources.refresh_infiniband()
            if self.kubernetes is not None:
                await self.kubernetes.refresh()
            await self.poller.poll_once(watch_xid_events=False)
        finally:
            await self._close_sources()
        assert self.store.current is not None
        return self.store.current

    def _build_reporter(self, audit: AuditStore) -> Reporter | None:
        mqtt = self.config.outputs.mqtt
        if not mqtt.enabled:
            return None
        from gpuagent.fleet.reporter import Reporter  # noqa: PLC0415

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

    def _audit_written(self, record: AuditRecord) -> None:
        for sink in (self.reporter, self.kubernetes_output):
            if sink is not None:
                sink.audit_written(record)

    def _on_gpu_reset(self, bus_id: str, when: float) -> None:
        # Recorded as an event, which clears what the XIDs before it asked for
        # (gpuagent.events); poll at once to see the GPU.
        self.sources.on_event(reset_event(bus_id, "remediation", when, "reset by the agent"))
        self.poller.refresh_requested.set()

    async def startup(self) -> None:
        audit = self.audit
        # A read-only or full state directory must not stop monitoring: the trail is tried
        # again by remediation, which does nothing meanwhile (the state_dir finding says so).
        await audit.open()
        self.reporter = self._build_reporter(audit)
        remediator = build_remediator(
            self.config,
            audit,
            node=self.node_name,
            ask=self.reporter.ask_aggregator if self.reporter is not None else None,
            simulator=self.simulator,
            nvml=lambda: self.poller.nvml,
            on_reset=self._on_gpu_reset,
            dcgm=lambda: self.dcgm,
        )
        self.remediation.remediator = remediator
        remediator.on_record = self._audit_written
        self._open_sources()
        host, port = self.config.metrics.host_port
        self._metrics = MetricsServer(
            build_registry(lambda: self.store.current, __version__), host, port, self.probes
        )
        self._metrics.start()
        # Scrapes serve what the publisher rendered last; it decides when to render.
        self._metrics.exposition.rendered_by_caller = True
        self.publisher.metrics = self._metrics
        AgentApi(self).register(self._api)
        await self._api.start()
        if self.config.inventory.enabled:
            self.inventory.load_baseline()
            self.inventory.may_learn = self.config.inventory.learn
            self.inventory.track_liveness = True
            await self.inventory.refresh()
        if self._dcgm_source is not None and await self._dcgm_source.load():
            self.dcgm = self._dcgm_source
        if self.kubernetes is not None:
            await self.kubernetes.read_host()  # the Node is read by its loop: no wait here
        await self.poller.poll_once()
        # What start-up made lives as long as the daemon: out of the collector's way, so a
        # full collection walks what the polls make, not every module's objects.
        gc.collect()
        gc.freeze()
        heap.give_back()
        self.notifier.ready(self.summary())

    def _loops(self) -> dict[str, Callable[[], Coroutine[Any, Any, None]]]:
        """The long-running tasks of this configuration, by name."""
        sources = self.config.sources
        loops: dict[str, Callable[[], Coroutine[Any, Any, None]]] = {
            "poll-nvml": self.poller.loop,
            "watchdog": self._watchdog_loop,
            "heartbeat": self.probes.run,
            "prune-events": self.sources.prune_loop,
            "incidents": self.sources.incident_loop,
        }
        if sources.kmsg.enabled:
            loops["kmsg"] = self.sources.run_kmsg
        if sources.sysfs.enabled:
            loops["sysfs"] = self.sources.sysfs_loop
        if self.config.inventory.enabled:
            loops["inventory"] = self.inventory.loop
            loops["services"] = self.inventory.services_loop
        # A simulated node has no NVIDIA devices on the host bus; its udev events come
        # from `gpuagent inject pci_remove|pci_add` instead.
        if sources.udev.enabled and self.simulator is None:
            loops["udev"] = self.sources.run_udev
        if self.reporter is not None:
            loops["mqtt"] = self.reporter.run
        if self.dcgm is not None and self._dcgm_source is not None:
            loops["dcgm"] = self._dcgm_source.run
        if self.kubernetes is not None:
            loops["kubernetes"] = self.kubernetes.loop
        if self.kubernetes_output is not None:
            loops["kubernetes-output"] = self.kubernetes_output.run
        if self.attribution is not None and self.config.attribution.kubernetes:
            loops["attribution"] = self.attribution.loop
        return loops

    async def main_loop(self) -> None:
        async with asyncio.TaskGroup() as tasks:
            running = [tasks.create_task(run(), name=name) for name, run in self._loops().items()]
            await self._stop.wait()
            deadline = self._stop_deadline()
            # A storm's last counts go to the spool with everything else.
            self.sources.report_incidents()
            if self.reporter is not None:
                # Before the connection goes: a clean goodbye, not the Last Will.
                await self._until(deadline, self.reporter.shutdown(), "the MQTT goodbye")
            await self._cancel_and_wait(running, deadline)

    def _snapshot_age(self) -> float | None:
        snapshot = self.store.current
        return None if snapshot is None else time.time() - snapshot.taken_at

    async def _watchdog_loop(self) -> None:
        # WATCHDOG=1 comes from the event loop itself, so a blocked loop stops the pings
        # and systemd restarts us; a wedged NVML call (on its own thread) does not.
        interval = self.notifier.watchdog_interval
        if interval is None:
            return
        while True:
            self.notifier.watchdog()
            await asyncio.sleep(interval)

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
        if self.remediation.task is not None:
            await self._cancel_and_wait([self.remediation.task], deadline)
        if self.remediator is not None:
            await self._until(deadline, self.remediator.close(), "evidence bundles")
        await self._until(deadline, self._close_sources(), "closing NVML")
        if self._dcgm_source is not None:
            self._dcgm_source.close()
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

    # --- remote commands (the MQTT reporter's CommandTarget) ----------------------------------

    def refresh(self) -> None:
        self.poller.refresh_requested.set()

    async def run_checks(self) -> str:
        """Poll and evaluate now; the summary of the snapshot that follows."""
        await self.poller.poll_now()
        return self.summary()

    def set_remediation_mode(self, mode: str) -> str:
        detail = self.remediation.set_mode(mode)
        self._schedule_publish()
        return detail

    async def reset_gpu(self, bus_id: str) -> str:
        """A remote reset request: through every rail local remediation has (mode, kill
        switch, budgets, no process on the GPU, cordoned first), never around them."""
        return await self.remediation.reset_gpu(bus_id, self.store.current)

    async def acknowledge(self, bus_id: str, check: str | None, reason: str, by: str) -> str:
        """Acknowledge GPU ``bus_id``'s findings (only ``check``'s when given): audited
        first, then held at OK until their fault comes again (gpuagent.acks)."""
        snapshot = self.store.current
        health = snapshot.health if snapshot is not None else NodeHealth()
        try:
            return await self.acks.acknowledge(
                self.audit, health, bus_id, check, reason=reason, by=by
            )
        finally:
            self._schedule_publish()

    async def clear_drills(self, by: str) -> str:
        """End every fault drill: their events are forgotten, audited."""
        drills = sum(1 for e in self.events.recent() if e.source == "drill")
        action = PlannedAction("clear_drills", "node", f"fault drills ended by {by}")
        try:
            await self.audit.record(action, "succeeded", mode="operator", detail=f"{drills} events")
        except AuditError as exc:
            raise AckError(f"drills not cleared: {exc}") from None
        gone = self.events.forget_drills()
        self._schedule_publish()
        return f"{gone} drill events forgotten"

    async def run_diag(self, level: int, gpus: tuple[int, ...]) -> DiagResult:
        """DCGM's diagnostic on request (`gpuagent diag`), audited; the snapshot that follows
        shows it. Raises DiagUnavailableError when it cannot run here."""
        try:
            return await self.remediation.run_diag(level, gpus)
        finally:
            self._schedule_publish()

    def summary(self) -> str:
        return self.publisher.summary()
