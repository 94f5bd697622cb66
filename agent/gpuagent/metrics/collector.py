"""Prometheus families built from one NodeSnapshot.

A scrape reads the current snapshot once, so every sample in it comes from the same
moment, and never touches NVML or the disk. Snapshots are immutable and replaced whole,
so the families are built once per snapshot and served as-is until the next one.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
)
from prometheus_client.samples import Sample

from gpuagent.api import CONNECTION_REASON_PREFIX
from gpuagent.metrics import names
from gpuagent.metrics.diag import diag_families
from gpuagent.metrics.events import event_families
from gpuagent.metrics.exposition import BareCounterFamily
from gpuagent.metrics.infiniband import infiniband_families
from gpuagent.metrics.inventory import inventory_families
from gpuagent.metrics.kubernetes import kubernetes_families
from gpuagent.metrics.names import GpuMetric, Kind, MetricSpec
from gpuagent.metrics.process import process_families
from gpuagent.model import (
    Finding,
    GpuIdentity,
    GpuProfiling,
    GpuReadings,
    GpuState,
    NodeSnapshot,
    PcieLink,
    PciePath,
    Severity,
    SourceStatus,
    Workload,
    fabric_conditions,
    nvlink_domain,
)

SnapshotGetter = Callable[[], NodeSnapshot | None]
Labels = tuple[str, ...]

_SYSFS_BUS_ID = re.compile(
    r"(?P<domain>[0-9a-fA-F]{4,8}):(?P<bus>[0-9a-fA-F]{2}):(?P<dev>[0-9a-fA-F]{2})\.(?P<fn>[0-7])"
)


def nvml_bus_id(bus_id: str) -> str:
    """sysfs "0000:3b:00.0" -> NVML "00000000:3B:00.0", the form dcgm-exporter labels with.

    Anything else passes through unchanged: a label with an odd value beats a failed scrape.
    """
    match = _SYSFS_BUS_ID.fullmatch(bus_id)
    if match is None:
        return bus_id
    domain = int(match["domain"], 16)
    return f"{domain:08X}:{match['bus'].upper()}:{match['dev'].upper()}.{match['fn']}"


def _number(value: object) -> float | None:
    """A sample value, or None for "unsupported" (and anything that is not a number)."""
    if isinstance(value, bool | int | float):
        return float(value)
    return None


def _one(spec: MetricSpec, value: float) -> Metric:
    """A gauge with one unlabelled sample."""
    family = spec.gauge()
    family.add_metric([], value)
    return family


class _Gpu:
    """One GPU's label values, computed once per snapshot for all its families."""

    __slots__ = ("bus_id", "dcgm_label_dict", "dcgm_owner_dicts", "label_dict", "labels")

    def __init__(
        self,
        identity: GpuIdentity | None,
        bus_id: str,
        host: str,
        driver: str,
        *,
        workloads: tuple[Workload, ...] = (),
        attribution: Labels = (),
    ) -> None:
        self.bus_id = bus_id
        self.labels = _gpu_labels(identity, bus_id, host)
        # The per-GPU tables add hundreds of samples with these label sets: one dict each,
        # shared by every sample, instead of add_metric zipping a new one per sample.
        self.label_dict = dict(zip(names.GPU_LABELS, self.labels, strict=True))
        self.dcgm_label_dict = {**self.label_dict, names.DCGM_LABELS[-1]: driver}
        self.dcgm_owner_dicts = _owner_dicts(self.dcgm_label_dict, workloads, attribution)


def _owner_dicts(
    base: dict[str, str], workloads: tuple[Workload, ...], attribution: Labels
) -> tuple[dict[str, str], ...]:
    """The label sets of one GPU's DCGM_FI_DEV_* samples: its own without attribution; with
    it, one per owner, as dcgm-exporter serves a shared GPU once per pod (empty values where
    nobody is known, which PromQL reads as the label being absent)."""
    if not attribution:
        return (base,)
    owners = {tuple(getattr(w, name) for name in attribution) for w in workloads}
    values = sorted(owners) or [("",) * len(attribution)]
    return tuple({**base, **dict(zip(attribution, v, strict=True))} for v in values)


def _gpu_labels(identity: GpuIdentity | None, bus_id: str, hostname: str) -> Labels:
    if identity is None:
        # A finding for a PCI device NVML never listed: keep the finding, label what we know.
        return ("", "", nvml_bus_id(bus_id), "", "", hostname)
    return (
        str(identity.index),
        identity.uuid,
        nvml_bus_id(identity.pci_bus_id),
        identity.device,
        identity.name,
        hostname,
    )


class _Builder:
    """Builds every family for one snapshot; used once, then thrown away."""

    def __init__(self, snapshot: NodeSnapshot, version: str) -> None:
        self.snapshot = snapshot
        self.version = version
        driver = snapshot.nvml.driver_version or ""
        host = snapshot.hostname
        attribution = snapshot.attribution_labels
        known = {
            g.identity.pci_bus_id: _Gpu(
                g.identity,
                g.identity.pci_bus_id,
                host,
                driver,
                workloads=g.workloads,
                attribution=attribution,
            )
            for g in snapshot.gpus
        }
        self.gpus = [(known[g.identity.pci_bus_id], _answered(g)) for g in snapshot.gpus]
        # Only GPUs that answered serve values: nothing stale is ever exported.
        self.answering = [
            (gpu, state.identity, readings)
            for state, (gpu, readings) in zip(snapshot.gpus, self.gpus, strict=True)
            if readings is not None
        ]
        # Findings may name a GPU NVML does not list (e.g. a kernel-log XID for a device
        # that fell off the bus); those GPUs get health series but no values.
        for finding in snapshot.health.findings:
            if finding.gpu is not None and finding.gpu not in known:
                known[finding.gpu] = _Gpu(None, finding.gpu, host, driver)
        self.with_health = list(known.values())
        self._known = known

    def _labels_for(self, bus_id: str) -> tuple[str, ...]:
        gpu = self._known.get(bus_id)
        return gpu.labels if gpu is not None else _gpu_labels(None, bus_id, self.snapshot.hostname)

    def families(self) -> list[Metric]:
        families: list[Metric] = [
            *self._node(),
            *self._sources(),
            *inventory_families(self.snapshot.inventory, self._labels_for),
            self._gpu_up(),
            *self._gpu_health(),
            *(self._table_family(m, dcgm=True) for m in names.DCGM_GPU_METRICS),
            *(self._table_family(m, dcgm=False) for m in names.AGENT_GPU_METRICS),
            *self._profiling(),
            self._clock_event_reasons(),
            self._per_link(names.GPU_NVLINK_UP, "nvlink_up"),
            self._per_link(names.GPU_C2C_LINK_UP, "c2c_up"),
            self._c2c_errors(),
            self._per_link(names.GPU_NVLINK_EFFECTIVE_BER, "nvlink_effective_ber"),
            self._per_link(names.GPU_NVLINK_SYMBOL_BER, "nvlink_symbol_ber"),
            self._row_remap_banks(),
            self._fabric_health(),
            self._fabric_info(),
            *self._pcie(),
            *infiniband_families(self.snapshot.infiniband),
            *kubernetes_families(self.snapshot),
            *self._remediation(),
            *self._mqtt(),
            *diag_families(self.snapshot),
            *event_families(
                self.snapshot,
                self._labels_for,
                self.snapshot.nvml.driver_version or "",
                nvml_bus_id,
            ),
        ]
        # Empty families would only add HELP/TYPE noise for values no GPU has.
        return [f for f in families if f.samples]

    def _node(self) -> list[Metric]:
        snap = self.snapshot
        checks = names.NODE_CHECK_HEALTH.gauge()
        for check, severity in _worst_by_check(snap.health.node_findings()).items():
            checks.add_metric([check], severity.value)
        agent = names.AGENT_INFO.gauge()
        agent.add_metric([snap.node_name, snap.cluster], 1.0)
        rejected = names.API_REJECTED.counter()
        connections = names.API_CONNECTIONS_REJECTED.counter()
        for reason, count in snap.rejected_api_requests:
            # The API server counts refused connections beside refused requests, prefixed.
            if reason.startswith(CONNECTION_REASON_PREFIX):
                connections.add_metric([reason.removeprefix(CONNECTION_REASON_PREFIX)], count)
            else:
                rejected.add_metric([reason], count)
        return [
            build_info(snap, self.version),
            agent,
            _one(names.NODE_HEALTH, snap.health.severity.value),
            checks,
            _one(names.NVML_UP, float(snap.nvml.ok)),
            _one(names.SNAPSHOT_TIMESTAMP, snap.taken_at),
            _one(names.SIMULATED, float(snap.simulated)),
            rejected,
            connections,
        ]

    def _remediation(self) -> list[Metric]:
        status = self.snapshot.remediation
        if status is None:
            return []
        actions = names.ACTIONS_TOTAL.counter()
        for action, result, count in status.counts:
            actions.add_metric([action, result], count)
        budgets = names.REMEDIATION_BUDGET.gauge()
        for action, scope, remaining in status.budgets:
            budgets.add_metric([action, scope], remaining)
        return [
            actions,
            budgets,
            _one(names.REMEDIATION_ENFORCING, float(status.mode == "enforce")),
            _one(names.REMEDIATION_PAUSED, float(status.paused)),
            _one(names.REMEDIATION_CORDONED, float(status.cordoned_by_us)),
        ]

    def _mqtt(self) -> list[Metric]:
        status = self.snapshot.mqtt
        if status is None:
            return []
        families: list[Metric] = [
            _one(names.MQTT_CONNECTED, float(status.connected)),
            _one(names.MQTT_SPOOL_MESSAGES, float(status.spool_depth)),
            _one(names.MQTT_SPOOL_BYTES, float(status.spool_bytes)),
            _one(names.MQTT_AWAITING_ACK, float(status.awaiting_ack)),
            names.MQTT_CONNECTIONS.counter(float(status.connections)),
            names.MQTT_SPOOL_DROPPED.counter(float(status.spool_dropped)),
            names.MQTT_ACKNOWLEDGED.counter(float(status.acknowledged)),
        ]
        for spec, counts in (
            (names.MQTT_PUBLISHED, status.published),
            (names.MQTT_REFUSED, status.refused),
            (names.MQTT_COMMANDS, status.commands),
            (names.MQTT_COMMANDS_REJECTED, status.rejected_commands),
            (names.MQTT_DISCONNECTS, status.disconnects),
        ):
            counter = spec.counter()
            for label, count in counts:
                counter.add_metric([label], float(count))
            families.append(counter)
        return families

    def _sources(self) -> list[Metric]:
        columns: list[tuple[MetricSpec, Callable[[SourceStatus], float | None]]] = [
            (names.SOURCE_UP, lambda s: float(s.up)),
            (names.SOURCE_AVAILABLE, lambda s: float(s.available)),
            (names.SOURCE_LAST_SUCCESS, lambda s: s.last_success),
            (names.SOURCE_DURATION, lambda s: s.last_duration_seconds),
            (names.SOURCE_FAILURES, lambda s: float(s.consecutive_failures)),
        ]
        families: list[Metric] = []
        for spec, value_of in columns:
            family = spec.gauge()
            for source in self.snapshot.sources:
                value = value_of(source)
                if value is not None:
                    family.add_metric([source.name], value)
            families.append(family)
        return families

    def _gpu_up(self) -> Metric:
        family = names.GPU_UP.gauge()
        for gpu, readings in self.gpus:
            family.add_metric(gpu.labels, float(readings is not None))
        return family

    def _gpu_health(self) -> list[Metric]:
        per_check = names.GPU_HEALTH.gauge()
        status = names.GPU_HEALTH_STATUS.gauge()
        drill = names.GPU_DRILL.gauge()
        findings_by_gpu: dict[str, list[Finding]] = {}
        for finding in self.snapshot.health.findings:
            if finding.gpu is not None:
                findings_by_gpu.setdefault(finding.gpu, []).append(finding)
        for gpu in self.with_health:
            findings = findings_by_gpu.get(gpu.bus_id, ())
            by_check = _worst_by_check(findings)
            for check, severity in by_check.items():
                per_check.add_metric([*gpu.labels, check], severity.value)
            status.add_metric(gpu.labels, Severity.worst(list(by_check.values())).value)
            for check in sorted({f.check for f in findings if f.drill}):
                drill.add_metric([*gpu.labels, check], 1.0)
        # Only while a drill runs: the alert rules say DRILL from it (docs/alerts.md).
        return [per_check, status, drill] if drill.samples else [per_check, status]

    def _table_family(self, metric: GpuMetric, *, dcgm: bool) -> Metric:
        family = _typed_family(
            metric.name,
            metric.help,
            metric.kind,
            (*names.DCGM_LABELS, *self.snapshot.attribution_labels) if dcgm else names.GPU_LABELS,
        )
        samples = family.samples
        for gpu, identity, readings in self.answering:
            value = _number(metric.value(identity, readings))
            if value is None:
                continue
            if not dcgm:
                samples.append(Sample(metric.name, gpu.label_dict, value))
                continue
            samples.extend(Sample(metric.name, labels, value) for labels in gpu.dcgm_owner_dicts)
        return family

    def _profiling(self) -> list[Metric]:
        """DCGM_FI_PROF_* and the NVLink bandwidth: GPM's values from the NVML poll, or for
        a GPU without them the DCGM source's. A GPU with neither gets no series."""
        from_dcgm: dict[str, list[GpuProfiling]] = {}
        dcgm = self.snapshot.dcgm
        for bus_id, profiling in dcgm.profiling if dcgm is not None else ():
            from_dcgm.setdefault(_bus_key(bus_id), []).append(profiling)
        measured: list[tuple[dict[str, str], dict[int, float]]] = []
        for gpu, identity, readings in self.answering:
            entries = readings.profiling or from_dcgm.get(_bus_key(identity.pci_bus_id), ())
            for entry in entries:
                labels = gpu.dcgm_label_dict
                if entry.gpu_instance_id is not None:
                    labels = {
                        **labels,
                        names.MIG_LABELS[0]: entry.gpu_instance_profile or "",
                        names.MIG_LABELS[1]: str(entry.gpu_instance_id),
                    }
                measured.append((labels, dict(entry.values)))
        families: list[Metric] = []
        for metric in names.DCGM_PROFILING_METRICS:
            family = _typed_family(metric.name, metric.help, metric.kind, names.DCGM_LABELS)
            for labels, values in measured:
                value = values.get(metric.field_id)
                if value is not None:
                    family.samples.append(Sample(metric.name, labels, float(value)))
            families.append(family)
        return families

    def _clock_event_reasons(self) -> Metric:
        family = names.GPU_CLOCK_EVENT_REASONS.gauge()
        for gpu, _identity, readings in self.answering:
            mask = readings.clock_event_reasons
            if mask is None:
                continue
            for reason, bit in names.CLOCK_EVENT_REASONS:
                family.add_metric([*gpu.labels, reason], float(bool(mask & bit)))
        return family

    def _row_remap_banks(self) -> Metric:
        family = names.GPU_ROW_REMAP_BANKS.gauge()
        for gpu, _identity, readings in self.answering:
            if readings.remap_banks is not None:
                for availability, banks in zip(
                    names.REMAP_AVAILABILITY, readings.remap_banks, strict=True
                ):
                    family.add_metric([*gpu.labels, availability], banks)
        return family

    def _fabric_health(self) -> Metric:
        family = names.GPU_FABRIC_HEALTH.gauge()
        for gpu, _identity, readings in self.answering:
            if readings.fabric_health_mask is not None:
                conditions = fabric_conditions(readings.fabric_health_mask)
                for condition, present in conditions.items():
                    family.add_metric([*gpu.labels, condition], float(present))
        return family

    def _fabric_info(self) -> Metric:
        """Where each GPU of a fabric (or an NVL rack) sits: one info series per GPU."""
        family = names.GPU_FABRIC_INFO.gauge()
        for gpu, identity, readings in self.answering:
            place = identity.platform
            if readings.fabric_state is None and place is None:
                continue
            clique = readings.fabric_clique_id
            located = ("",) * 5 if place is None else (
                place.chassis_serial, str(place.slot_number), str(place.tray_index),
                str(place.host_id), str(place.module_id),
            )  # fmt: skip
            family.add_metric(
                [
                    *gpu.labels,
                    nvlink_domain(readings) or "",
                    readings.fabric_cluster_uuid or "",
                    "" if clique is None else str(clique),
                    readings.fabric_state or "",
                    *located,
                ],
                1.0,
            )
        return family

    def _per_link(self, spec: MetricSpec, field: str) -> Metric:
        """One sample per link of each GPU's ``field`` (a value per link, None unknown)."""
        family = spec.gauge()
        for gpu, _identity, readings in self.answering:
            for link, value in enumerate(getattr(readings, field)):
                if value is not None:
                    family.add_metric([*gpu.labels, str(link)], float(value))
        return family

    def _c2c_errors(self) -> Metric:
        errors = names.GPU_C2C_ERRORS.counter()
        for gpu, _identity, readings in self.answering:
            for counter, value in readings.c2c_errors:
                if value is not None:
                    errors.add_metric([*gpu.labels, counter], float(value))
        return errors

    def _pcie(self) -> list[Metric]:
        links = _pcie_links(self.snapshot.pcie, self.snapshot.hostname)
        families: list[Metric] = []
        for spec, field in names.PCIE_LINK_GAUGES:
            family = spec.gauge()
            for link, labels in links:
                value = _number(getattr(link, field))
                if value is not None:
                    family.add_metric(labels, value)
            families.append(family)
        aer = names.PCIE_AER_ERRORS.counter()
        for link, labels in links:
            for severity, field in names.PCIE_AER_SEVERITIES:
                count = _number(getattr(link, field))
                if count is not None:
                    aer.add_metric([*labels, severity], count)
        return [*families, aer]


def _pcie_links(paths: Sequence[PciePath], hostname: str) -> list[tuple[PcieLink, Labels]]:
    """Every link once, with its labels, in path order.

    Paths share bridges (a switch port above two GPUs, the root port above the switch);
    one series per address keeps them from clashing, labelled with the device of the
    first path that reaches the bridge.
    """
    seen: dict[str, tuple[PcieLink, Labels]] = {}
    for path in paths:
        device = nvml_bus_id(path.device.address)
        for link in (path.device, *path.bridges):
            if link.address not in seen:
                seen[link.address] = (link, (link.address, link.role, device, hostname))
    return list(seen.values())


def _typed_family(name: str, help_text: str, kind: Kind, labels: Sequence[str]) -> Metric:
    """A gauge, or a counter under its exact name (see docs/metrics.md)."""
    if kind is Kind.COUNTER:
        # Our own counters end in `_total`: a real counter family, whose samples carry the
        # name given. dcgm-exporter's names (`..._TOTAL` in capitals included) stay bare.
        if name.endswith("_total"):
            return CounterMetricFamily(name, help_text, labels=labels)
        return BareCounterFamily(name, help_text)
    return GaugeMetricFamily(name, help_text, labels=labels)


def _bus_key(bus_id: str) -> str:
    """One spelling for a PCI address, whether sysfs's or NVML's."""
    return nvml_bus_id(bus_id).upper()


def _answered(state: GpuState) -> GpuReadings | None:
    return state.readings if state.status == "ok" else None


def _worst_by_check(findings: Sequence[Finding]) -> dict[str, Severity]:
    """One severity per check: two findings for one check would be duplicate series."""
    worst: dict[str, Severity] = {}
    for finding in findings:
        seen = worst.get(finding.check)
        if seen is None or finding.severity.rank > seen.rank:
            worst[finding.check] = finding.severity
    return worst


def build_info(snapshot: NodeSnapshot | None, version: str) -> Metric:
    nvml = snapshot.nvml if snapshot is not None else None
    family = names.BUILD_INFO.gauge()
    labels = [
        version,
        (nvml and nvml.driver_version) or "",
        (nvml and nvml.nvml_version) or "",
        (nvml and nvml.cuda_driver_version) or "",
    ]
    family.add_metric(labels, 1.0)
    return family


def build_families(snapshot: NodeSnapshot | None, version: str) -> tuple[Metric, ...]:
    """Every family for ``snapshot``; only build info while there is no snapshot yet."""
    if snapshot is None:
        return (build_info(None, version),)
    return tuple(_Builder(snapshot, version).families())


class SnapshotCollector:
    """prometheus_client collector serving the latest snapshot, built once per snapshot
    (the agent's own process metrics sampled then too)."""

    def __init__(self, get_snapshot: SnapshotGetter, version: str) -> None:
        self._get_snapshot = get_snapshot
        self._version = version
        self._cache: tuple[NodeSnapshot | None, tuple[Metric, ...]] | None = None

    def collect(self) -> Iterable[Metric]:
        snapshot = self._get_snapshot()
        # Scrapes run on server threads; no lock is needed because the cache is one tuple
        # swapped atomically, and two threads racing on a new snapshot just build it twice.
        cached = self._cache
        if cached is None or cached[0] is not snapshot:
            cached = (snapshot, (*build_families(snapshot, self._version), *process_families()))
            self._cache = cached
        return cached[1]

    def describe(self) -> Iterable[Metric]:
        # Nothing to describe up front: registering must not call get_snapshot().
        return ()


def build_registry(get_snapshot: SnapshotGetter, version: str) -> CollectorRegistry:
    """A private registry holding only the snapshot collector (never the global one)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(get_snapshot, version))
    return registry
