"""The event sources (kernel log, udev), the sysfs PCIe paths and RDMA ports, with their
SourceTrackers.

Every source's events arrive at EventSources.on_event, on the event loop: into the event
log, out to the fleet reporter, and a publish is asked for. A storm's records are folded
into incidents by the event log: the log and the fleet hear of an incident when it opens
and, while it grows, once per ``_INCIDENT_REPORT_SECONDS``, never of each record.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Protocol

from gpuagent.acks import AckBook
from gpuagent.config import Config
from gpuagent.events import Added, EventLog
from gpuagent.incidents import Incident
from gpuagent.model import GpuEvent, IbDevice, KmsgCounters, PciePath
from gpuagent.sources.infiniband import read_infiniband
from gpuagent.sources.kmsg import KmsgSource
from gpuagent.sources.pcie import read_pcie_paths
from gpuagent.sources.udev import PciChange, UdevWatcher, open_netlink_monitor
from gpuagent.supervisor import SourceTracker, supervise

# The daemon's log lines keep the logger name they always had.
log = logging.getLogger("gpuagent.daemon")

_SYSFS_TIMEOUT_SECONDS = 10.0
_PRUNE_SECONDS = 60.0
_INCIDENT_REPORT_SECONDS = 10.0
_UDEV_KINDS = {
    "add": "gpu_added",
    "remove": "gpu_removed",
    "bind": "driver_bound",
    "unbind": "driver_unbound",
}


class EventSink(Protocol):
    """Where accepted events go beyond the node (the fleet reporter, the Kubernetes
    output)."""

    def offer_event(self, event: GpuEvent) -> None: ...

    def offer_incident(self, incident: Incident) -> None: ...


class EventSources:
    def __init__(
        self,
        config: Config,
        events: EventLog,
        trackers: dict[str, SourceTracker],
        *,
        schedule_publish: Callable[[], None],
        inventory_changed: Callable[[], None],
        gpu_appeared: Callable[[], None],
    ) -> None:
        self._config = config
        self._events = events
        self._trackers = trackers
        self._schedule_publish = schedule_publish
        self._inventory_changed = inventory_changed
        self._gpu_appeared = gpu_appeared
        # The fleet reporter (set at startup, when MQTT is on) and the Kubernetes output.
        self.sinks: list[EventSink] = []
        # Who is on a GPU now, by bus id (set when attribution is on): stamped on its events.
        self.owners: Callable[[str], str] | None = None
        # Acknowledgements: every added record (a storm's folded ones too) may lift one.
        self.acks: AckBook | None = None
        self.pcie: tuple[PciePath, ...] = ()
        # RDMA devices; None until read, or when /sys/class/infiniband cannot be listed.
        self.infiniband: tuple[IbDevice, ...] | None = None
        # The sysfs they are read from: `sources.sysfs.root`, or the simulator's tree.
        self.infiniband_root = config.sources.sysfs.root
        self._kmsg: KmsgSource | None = None

    def kmsg_counters(self) -> KmsgCounters:
        return self._kmsg.counters if self._kmsg is not None else KmsgCounters()

    def on_event(self, event: GpuEvent) -> None:
        """Every source's events arrive here, on the event loop."""
        owners = self.owners(event.gpu) if self.owners and event.gpu else ""
        if owners:
            event = event._replace(workloads=owners)
        added = self._events.add(event)
        if added is Added.NEW:
            for sink in self.sinks:
                sink.offer_event(event)
            _log_event(event)
        if added:
            if self.acks is not None:
                self.acks.offer_event(event)
            self._schedule_publish()

    def feed_kernel_log(self, text: bytes) -> None:
        """Captured kernel-log text, judged as if just read from /dev/kmsg."""
        KmsgSource(self._config.sources.kmsg, self.on_event).feed(text)

    async def run_kmsg(self) -> None:
        tracker = self._trackers.setdefault("kmsg", SourceTracker("kmsg"))

        async def run(ready: Callable[[], None]) -> None:
            self._kmsg = KmsgSource(self._config.sources.kmsg, self.on_event)
            await self._kmsg.run(ready)

        await supervise(tracker, run, self._schedule_publish)

    async def sysfs_loop(self) -> None:
        tracker = self._trackers.setdefault("sysfs", SourceTracker("sysfs"))
        config = self._config.sources.sysfs
        while True:
            started = time.monotonic()
            before = (self.pcie, self.infiniband, tracker.status.up)
            try:
                async with asyncio.timeout(_SYSFS_TIMEOUT_SECONDS):
                    self.pcie = await asyncio.to_thread(read_pcie_paths, config.root)
            except (OSError, TimeoutError) as exc:
                tracker.failure(time.monotonic() - started, str(exc) or type(exc).__name__)
            else:
                tracker.success(time.monotonic() - started)
            await self.refresh_infiniband()
            # What did not change waits for the next poll's snapshot rather than cost one.
            if (self.pcie, self.infiniband, tracker.status.up) != before:
                self._schedule_publish()
            await asyncio.sleep(config.interval_seconds)

    async def refresh_infiniband(self) -> None:
        """Read the RDMA devices (the sysfs loop, and `gpuagent check` once)."""
        # Apart from the PCIe paths: a tree without bus/pci (a container's) may still have
        # RDMA devices, and a node without RDMA is not a sysfs failure.
        root = self.infiniband_root
        try:
            async with asyncio.timeout(_SYSFS_TIMEOUT_SECONDS):
                self.infiniband = await asyncio.to_thread(read_infiniband, root)
        except TimeoutError:
            log.warning("reading %s/class/infiniband timed out", root)
            self.infiniband = None

    async def run_udev(self) -> None:
        tracker = self._trackers.setdefault("udev", SourceTracker("udev"))

        async def run(ready: Callable[[], None]) -> None:
            control = self._config.sources.udev.control
            watcher = UdevWatcher(monitor_factory=lambda: open_netlink_monitor(control))
            try:
                async for change in watcher.changes(ready):  # ready once it is open
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
        self._inventory_changed()
        if change.action in ("add", "bind"):
            # A GPU (re)appeared: enumerate again without restarting the daemon.
            self._gpu_appeared()

    async def prune_loop(self) -> None:
        while True:
            await asyncio.sleep(_PRUNE_SECONDS)
            # Only a change is worth a snapshot of its own: the next poll judges the rest.
            if self._events.prune(time.monotonic()):
                self._schedule_publish()

    async def incident_loop(self) -> None:
        """Report the incidents that grew: one log line for all, one fleet event each."""
        while True:
            await asyncio.sleep(_INCIDENT_REPORT_SECONDS)
            self.report_incidents()

    def report_incidents(self) -> None:
        grown = self._events.incidents.grown()
        if not grown:
            return
        for sink in self.sinks:
            for incident in grown:
                sink.offer_incident(incident)
        largest = max(grown, key=lambda incident: incident.count)
        event = largest.first
        log.info(
            "kernel-log storm: %d incidents grew, %d records folded so far; largest: "
            "%s%s on %s, %d records",
            len(grown),
            self._events.incidents.folded_records,
            event.kind,
            f" {event.code}" if event.code is not None else "",
            event.gpu or event.pci or "node",
            largest.count,
        )


def _log_event(event: GpuEvent) -> None:
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
