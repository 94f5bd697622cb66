"""Evaluation and publishing: the pure checks over the latest observation and recent events,
one complete NodeSnapshot, and its outputs (store, /metrics, textfile, systemd status, the
fleet reporter, remediation)."""

from __future__ import annotations

import asyncio
import logging
import math
import socket
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from gpuagent.acks import AckBook
from gpuagent.checks import HealthMemory, InventoryView, evaluate
from gpuagent.checks.infiniband import PEERMEM, IbExpected, IbInput
from gpuagent.config import Config
from gpuagent.events import EventLog
from gpuagent.inventory import NodeInventory
from gpuagent.k8s.model import KubernetesFacts
from gpuagent.metrics import MetricsServer
from gpuagent.metrics.infiniband import without_node_exporter_families
from gpuagent.model import (
    DcgmStatus,
    DiagResult,
    GpuState,
    IbDevice,
    KmsgCounters,
    MqttStatus,
    NodeSnapshot,
    PciePath,
    RemediationStatus,
    Severity,
    SourceStatus,
)
from gpuagent.sdnotify import Notifier
from gpuagent.sources.nvml import NvmlObservation
from gpuagent.store import SnapshotStore
from gpuagent.supervisor import SourceTracker
from gpuagent.textfile import TextfileWriter

# The daemon's log lines keep the logger name they always had.
log = logging.getLogger("gpuagent.daemon")
# A kernel-log storm asks for a snapshot (judgement, /metrics rendering) after every read.
# Once a snapshot has answered _STORM_ASKS asks or more, the next ones are spaced so they
# take at most 1/_PUBLISH_SHARE of the loop's time (and come at most every
# _MIN_PUBLISH_SECONDS): a lone event is judged at once, a storm is read at full speed.
_STORM_ASKS = 64
_MIN_PUBLISH_SECONDS = 0.02
_PUBLISH_SHARE = 10.0


def host_booted_at() -> float | None:
    """When this host booted, on the checks' clock (CLOCK_MONOTONIC): CLOCK_BOOTTIME counts
    from the boot, suspends included. None where the kernel has no such clock."""
    try:
        return time.monotonic() - time.clock_gettime(time.CLOCK_BOOTTIME)
    except (AttributeError, OSError):
        return None


class ObservationSource(Protocol):
    """The latest NVML observation (the poller)."""

    @property
    def last_observation(self) -> NvmlObservation | None: ...


class KernelView(Protocol):
    """What the kernel-side sources know now (the event sources)."""

    @property
    def pcie(self) -> tuple[PciePath, ...]: ...

    @property
    def infiniband(self) -> tuple[IbDevice, ...] | None: ...

    def kmsg_counters(self) -> KmsgCounters: ...


class InventorySource(Protocol):
    """The node inventory for an observation, and learn mode (the inventory keeper)."""

    def inventory(self, observation: NvmlObservation) -> NodeInventory | None: ...

    def view(
        self, inventory: NodeInventory | None, power_capped: tuple[tuple[str, float], ...] = ()
    ) -> InventoryView | None: ...

    def learn(self, inventory: NodeInventory | None, severity: Severity) -> None: ...


class RemediationSink(Protocol):
    """Remediation as publishing sees it: its status, its trail, each new snapshot."""

    def status(self) -> RemediationStatus | None: ...

    def storage_error(self) -> str | None: ...

    def diag_results(self) -> tuple[DiagResult, ...]: ...

    def schedule(self, snapshot: NodeSnapshot) -> None: ...


class DcgmView(Protocol):
    """The DCGM source as publishing sees it."""

    def snapshot_status(self) -> DcgmStatus | None: ...

    def source_status(self) -> SourceStatus | None: ...


class KubernetesWatchView(Protocol):
    """The Kubernetes GPU stack watch as publishing sees it."""

    @property
    def facts(self) -> KubernetesFacts: ...


class AttributionView(Protocol):
    """Workload attribution as publishing sees it: owners attached to the GPU states."""

    def attach(self, gpus: tuple[GpuState, ...]) -> tuple[GpuState, ...]: ...


class Spool(Protocol):
    @property
    def error(self) -> str | None: ...


class SnapshotConsumer(Protocol):
    """What gets every snapshot once it is published (the Kubernetes output)."""

    def offer_snapshot(self, snapshot: NodeSnapshot) -> None: ...


class SnapshotSink(SnapshotConsumer, Protocol):
    """The fleet reporter as publishing sees it."""

    @property
    def outbox(self) -> Spool: ...

    def status(self) -> MqttStatus: ...


class RejectionCounter(Protocol):
    """The local API's refused requests, by reason."""

    @property
    def rejected(self) -> Mapping[str, int]: ...


class SnapshotPublisher:
    def __init__(
        self,
        config: Config,
        *,
        store: SnapshotStore,
        events: EventLog,
        notifier: Notifier,
        trackers: dict[str, SourceTracker],
        observations: ObservationSource,
        kernel: KernelView,
        inventory: InventorySource,
        remediation: RemediationSink,
        api: RejectionCounter,
        simulated: bool,
        booted_at: float | None = None,
    ) -> None:
        self._config = config
        # When the node booted, on the monotonic clock (None: not known): the checks' post-
        # boot grace for NVLinks and the fabric counts from it.
        self._booted_at = booted_at
        self._store = store
        self._events = events
        self._notifier = notifier
        self._trackers = trackers
        self._observations = observations
        self._kernel = kernel
        self._inventory = inventory
        self._remediation = remediation
        self._api = api
        self._simulated = simulated
        self._node_name = config.agent.resolved_node_name
        self._hostname = socket.gethostname()
        self._memory = HealthMemory()
        self._sequence = 0
        self._pending = False
        self._published_at = -math.inf
        self._publish_seconds = 0.0  # what the last snapshot took
        self._asks = 0  # since the last snapshot
        self._storm = False  # the last snapshot answered a storm's asks
        # What the last /metrics render judged, and when (`_render_due`).
        self._rendered: tuple[object, float] = (None, -math.inf)
        self.reporter: SnapshotSink | None = None  # set at startup, when MQTT is on
        self.metrics: MetricsServer | None = None  # set at startup
        self.dcgm: DcgmView | None = None  # set when sources.dcgm is enabled
        self.kubernetes: KubernetesWatchView | None = None  # set when checks.kubernetes applies
        self.attribution: AttributionView | None = None  # set when attribution is on
        self.acks: AckBook | None = None  # the operator's acknowledgements (gpuagent ack)
        self.kubernetes_output: SnapshotConsumer | None = None  # set when outputs.kubernetes is on
        attribution = config.attribution
        # dcgm-exporter's names: --kubernetes's pod/namespace/container, HPC jobs' hpc_job.
        self._attribution_labels = (
            *(("pod", "namespace", "container") if attribution.kubernetes else ()),
            *(("hpc_job",) if attribution.slurm else ()),
        )
        self._location_labels = tuple(sorted(config.agent.labels.items()))
        textfile = config.outputs.textfile
        self._textfile = (
            TextfileWriter(Path(textfile.dir), textfile.min_interval_seconds)
            if textfile.dir
            else None
        )

    def schedule(self) -> None:
        # A burst of kernel lines is read in one go: evaluate once after it, not per line;
        # and during a storm (a burst after every read) spaced by their own cost.
        self._asks += 1
        if not self._pending:
            self._pending = True
            loop = asyncio.get_running_loop()
            spacing = max(_MIN_PUBLISH_SECONDS, _PUBLISH_SHARE * self._publish_seconds)
            wait = self._published_at + spacing - time.monotonic() if self._storm else 0.0
            if wait > 0:
                loop.call_later(wait, self._publish_now)
            else:
                loop.call_soon(self._publish_now)

    def _publish_now(self) -> None:
        self._pending = False
        self._storm, self._asks = self._asks >= _STORM_ASKS, 0
        started = time.monotonic()
        self.publish()
        self._published_at = time.monotonic()
        self._publish_seconds = self._published_at - started

    def summary(self) -> str:
        snapshot = self._store.current
        if snapshot is None:
            return "starting"
        problems = len(snapshot.health.problems())
        return (
            f"{len(snapshot.gpus)} GPUs, health {snapshot.health.severity.name}, "
            f"{problems} problem{'s' if problems != 1 else ''}"
        )

    def _storage_errors(self) -> tuple[tuple[str, str], ...]:
        """The stores in the state directory that cannot be used now, and why."""
        errors = []
        if self.reporter is not None and self.reporter.outbox.error:
            errors.append(("spool", self.reporter.outbox.error))
        if audit := self._remediation.storage_error():
            errors.append(("audit", audit))
        return tuple(errors)

    def _sources(self) -> tuple[SourceStatus, ...]:
        rows = tuple(t.status for t in self._trackers.values())
        dcgm = self.dcgm.source_status() if self.dcgm is not None else None
        return rows if dcgm is None else (*rows, dcgm)

    def _infiniband_input(
        self, devices: tuple[IbDevice, ...] | None, inventory: NodeInventory | None
    ) -> IbInput | None:
        if not self._config.sources.sysfs.enabled:
            return None
        expected = self._config.inventory.expected
        return IbInput(
            devices,
            IbExpected(tuple(expected.hcas), expected.ib_rate_gbps, expected.gpudirect),
            inventory.host.module_loaded(PEERMEM) if inventory is not None else None,
        )

    def _render_due(self, snapshot: NodeSnapshot) -> bool:
        """Whether /metrics should show this snapshot now: what it judges (findings, events,
        NVML and the GPUs answering) changed, or the last render is render_interval old
        (less half a poll, so a poll of that interval renders every time)."""
        judged = (
            # An OK finding's reason and evidence carry live readings: only what is wrong
            # counts as a change.
            tuple(
                (f.gpu, f.check, f.severity, "" if f.severity is Severity.OK else f.reason)
                for f in snapshot.health.findings
            ),
            snapshot.event_counts,
            snapshot.nvml.ok,
            tuple(gpu.status for gpu in snapshot.gpus),
        )
        now = time.monotonic()
        slack = self._config.sources.nvml.interval_seconds / 2
        if judged == self._rendered[0] and now - self._rendered[1] < (
            self._config.metrics.render_interval_seconds - slack
        ):
            return False
        self._rendered = (judged, now)
        return True

    def publish(self) -> None:
        observation = self._observations.last_observation
        if observation is None:
            return
        previous = self._store.current
        events = self._events.recent()
        inventory = self._inventory.inventory(observation)
        pcie = self._kernel.pcie
        infiniband = self._kernel.infiniband
        dcgm = self.dcgm.snapshot_status() if self.dcgm is not None else None
        gpus = observation.gpus
        if self.attribution is not None:
            gpus = self.attribution.attach(gpus)
        remediation = self._remediation.status()
        health, self._memory = evaluate(
            gpus,
            observation.status,
            self._config.checks,
            self._memory,
            time.monotonic(),
            events=events,
            weights=self._events.weights(),
            pcie=pcie,
            inventory=self._inventory.view(
                inventory, () if remediation is None else remediation.power_capped
            ),
            expected_gpus=self._config.inventory.expected.gpu,
            storage_errors=self._storage_errors(),
            dcgm=dcgm,
            infiniband=self._infiniband_input(infiniband, inventory),
            kubernetes=self.kubernetes.facts if self.kubernetes is not None else None,
            booted_at=self._booted_at,
        )
        if self.attribution is not None:
            from gpuagent.attribution.source import with_owner_evidence  # noqa: PLC0415

            health = with_owner_evidence(health, gpus)
        if self.acks is not None:
            health = self.acks.apply(health)
        self._inventory.learn(inventory, health.severity)
        self._sequence += 1
        snapshot = NodeSnapshot(
            node_name=self._node_name,
            cluster=self._config.agent.cluster,
            hostname=self._hostname,
            sequence=self._sequence,
            taken_at=time.time(),
            nvml=observation.status,
            gpus=gpus,
            health=health,
            sources=self._sources(),
            simulated=self._simulated,
            rejected_api_requests=tuple(sorted(self._api.rejected.items())),
            events=events,
            pcie=pcie,
            infiniband=infiniband,
            kmsg=self._kernel.kmsg_counters(),
            event_counts=self._events.counts(),
            remediation=remediation,
            diag=self._remediation.diag_results(),
            mqtt=self.reporter.status() if self.reporter is not None else None,
            inventory=inventory,
            dcgm=dcgm,
            attribution_labels=self._attribution_labels,
            location_labels=self._location_labels,
        )
        _log_transitions(previous, snapshot)
        self._store.publish(snapshot)
        if self.metrics is not None:
            # Render /metrics here, so no scrape waits for rendering: at once when the
            # judgement changed, else at most every render_interval_seconds.
            exposition = self.metrics.exposition
            if self._render_due(snapshot):
                exposition.refresh()
            if self._textfile is not None:
                self._textfile.offer(
                    lambda: without_node_exporter_families(exposition.body(gzipped=False))
                )
        self._notifier.status(self.summary())
        for sink in (self.reporter, self.kubernetes_output):
            if sink is not None:
                sink.offer_snapshot(snapshot)
        self._remediation.schedule(snapshot)


def _log_transitions(previous: NodeSnapshot | None, current: NodeSnapshot) -> None:
    before = {(f.gpu, f.check): f.severity for f in previous.health.findings} if previous else {}
    for finding in current.health.findings:
        old = before.get((finding.gpu, finding.check), Severity.OK)
        if old is not finding.severity and not finding.masked:
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
