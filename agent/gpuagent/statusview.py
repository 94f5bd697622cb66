"""The status document (`gpuagent status --json`, the API, `gpuagent check --json`).

Built from a snapshot; its schema is documented in docs/api.md and versioned by
"schema". Only non-OK findings are listed: a healthy GPU has an empty list.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from gpuagent.metrics.names import clock_event_reason_names
from gpuagent.model import (
    DiagResult,
    Finding,
    GpuEvent,
    GpuProcess,
    GpuReadings,
    GpuState,
    NodeSnapshot,
    Workload,
    nvlink_domain,
)

SCHEMA_VERSION = 1


def finding_json(finding: Finding) -> dict[str, Any]:
    return {
        "check": finding.check,
        "severity": finding.severity.name,
        "reason": finding.reason,
        "cause": finding.cause,
        "action": finding.action,
        "runbook": finding.runbook,
        "evidence": finding.evidence_dict(),
        "drill": finding.drill,
    }


def _gpu_json(snapshot: NodeSnapshot, gpu: GpuState) -> dict[str, Any]:
    ident = gpu.identity
    readings = gpu.readings
    doc: dict[str, Any] = {
        "index": ident.index,
        "pci_bus_id": ident.pci_bus_id,
        "uuid": ident.uuid,
        "model": ident.name,
        "serial": ident.serial,
        "status": gpu.status,
        "error": gpu.error,
        "health": snapshot.health.gpu_severity(ident.pci_bus_id).name,
        "sampled_at": gpu.sampled_at,
        "findings": [finding_json(f) for f in snapshot.health.problems(ident.pci_bus_id)],
        # The checks that cannot judge the GPU while it gives no readings (the availability
        # finding says why): listed here once instead of each as a problem.
        "unknown_checks": [f.check for f in snapshot.health.for_gpu(ident.pci_bus_id) if f.masked],
        # Who the GPU belongs to (workload attribution; empty when off or nobody is known).
        "workloads": [workload_json(w) for w in gpu.workloads],
    }
    doc["platform"] = None if ident.platform is None else dataclasses.asdict(ident.platform)
    if readings is not None:
        doc.update(
            temperature_c=readings.temperature_c,
            power_w=readings.power_w,
            power_limit_w=readings.power_limit_w,
            utilization_gpu_pct=readings.utilization_gpu_pct,
            fb_used_mib=readings.fb_used_mib,
            ecc_sbe_volatile=readings.ecc_sbe_volatile,
            ecc_dbe_volatile=readings.ecc_dbe_volatile,
            # What is checked before a reset (the fleet console's GPU page shows them):
            # the lifetime ECC counts, retired pages, remapped rows, the link against its
            # maximum and its replays, the clocks.
            ecc_sbe_aggregate=readings.ecc_sbe_aggregate,
            ecc_dbe_aggregate=readings.ecc_dbe_aggregate,
            retired_pages_sbe=readings.retired_pages_sbe,
            retired_pages_dbe=readings.retired_pages_dbe,
            retired_pages_pending=readings.retired_pages_pending,
            remapped_rows_correctable=readings.remapped_rows_correctable,
            remapped_rows_uncorrectable=readings.remapped_rows_uncorrectable,
            row_remap_pending=readings.row_remap_pending,
            row_remap_failure=readings.row_remap_failure,
            pcie_generation=readings.pcie_generation,
            pcie_width=readings.pcie_width,
            pcie_max_generation=ident.pcie_max_generation,
            pcie_max_width=ident.pcie_max_width,
            pcie_replay_count=readings.pcie_replay_count,
            sm_clock_mhz=readings.sm_clock_mhz,
            sm_clock_max_mhz=ident.sm_clock_max_mhz,
            memory_clock_mhz=readings.memory_clock_mhz,
            # Settings: facts, judged only against an expectation (the settings checks).
            persistence_mode=readings.persistence_mode,
            ecc_enabled=readings.ecc_enabled,
            ecc_default=ident.ecc_default,
            power_requested_limit_w=readings.power_requested_limit_w,
            power_default_limit_w=ident.power_default_limit_w,
            applications_clock_mhz=readings.applications_clock_mhz,
            compute_mode=readings.compute_mode,
            mig_mode=readings.mig_mode_current,
            performance_state=readings.performance_state,
            # Shown whether or not they cost anything: the thermal check decides that.
            clock_event_reasons=clock_event_reason_names(readings.clock_event_reasons),
            processes=[_process_json(p) for p in readings.processes],
        )
        doc["fabric"] = _fabric_json(readings)
        doc["nvlink"] = _nvlink_json(readings)
        if readings.mig_devices:  # MIG mode only: the IDs Kubernetes owners are matched by
            doc["mig_devices"] = [dataclasses.asdict(m) for m in readings.mig_devices]
    return doc


def _fabric_json(readings: GpuReadings) -> dict[str, Any] | None:
    """The GPU's NVLink fabric registration and the domain it puts the GPU in (None
    while unassigned); None without a fabric."""
    if readings.fabric_state is None:
        return None
    return {
        "state": readings.fabric_state,
        "ok": readings.fabric_ok,
        "cluster_uuid": readings.fabric_cluster_uuid,
        "clique_id": readings.fabric_clique_id,
        "nvlink_domain": nvlink_domain(readings),
    }


def _nvlink_json(readings: GpuReadings) -> dict[str, Any] | None:
    """Each NVLink's state and bit-error rates (one entry per link, so at most the GPU's
    link count, 18 on Hopper and Blackwell), and the error counters NVML sums over the
    links; None for a GPU without NVLink."""
    counters = (
        readings.nvlink_crc_flit_errors,
        readings.nvlink_crc_data_errors,
        readings.nvlink_replay_errors,
        readings.nvlink_recovery_errors,
    )
    if not readings.nvlink_up and all(c is None for c in counters):
        return None
    return {
        "up": list(readings.nvlink_up),
        "effective_ber": list(readings.nvlink_effective_ber),
        "symbol_ber": list(readings.nvlink_symbol_ber),
        "crc_flit_errors": counters[0],
        "crc_data_errors": counters[1],
        "replay_errors": counters[2],
        "recovery_errors": counters[3],
    }


def _process_json(process: GpuProcess) -> dict[str, Any]:
    doc: dict[str, Any] = {"pid": process.pid, "name": process.name, "used_mib": process.used_mib}
    # Only where procfs was consulted (not for a replayed capture).
    if process.alive is not None:
        doc.update(user=process.user, alive=process.alive)
    if process.job is not None:
        doc["job"] = process.job
    return doc


def workload_json(workload: Workload) -> dict[str, str]:
    """One owner, with only the fields its scheme knows ("device" only for a MIG device)."""
    return {
        name: value
        for name, value in (
            ("pod", workload.pod),
            ("namespace", workload.namespace),
            ("container", workload.container),
            ("hpc_job", workload.hpc_job),
            ("device", workload.device),
        )
        if value
    }


def event_json(event: GpuEvent) -> dict[str, Any]:
    return {
        "id": event.event_id,
        "source": event.source,
        "kind": event.kind,
        "code": event.code,
        "gpu": event.gpu,
        "pci": event.pci,
        "time": event.time,
        "pid": event.pid,
        "process": event.process,
        "aer_severity": event.aer_severity,
        "line": event.line,
        # Only with attribution on and an owner known: otherwise the document is unchanged.
        **({"workloads": event.workloads} if event.workloads else {}),
        # Only for an Xid 13 whose line names where on the die it happened (sm None when
        # the line names no SM): fleet rules follow a GPC and TPC over time.
        **({"gpc": event.gpc, "tpc": event.tpc, "sm": event.sm} if event.gpc is not None else {}),
    }


def status_document(snapshot: NodeSnapshot) -> dict[str, Any]:
    nvml = snapshot.nvml
    return {
        "schema": SCHEMA_VERSION,
        "taken_at": snapshot.taken_at,
        "sequence": snapshot.sequence,
        "node": {
            "name": snapshot.node_name,
            "cluster": snapshot.cluster,
            "hostname": snapshot.hostname,
            "health": snapshot.health.severity.name,
            "simulated": snapshot.simulated,
            "driver_version": nvml.driver_version,
            "cuda_driver_version": nvml.cuda_driver_version,
            "nvml_version": nvml.nvml_version,
            "nvml": {"ok": nvml.ok, "problem": nvml.problem, "message": nvml.message},
            "findings": [finding_json(f) for f in snapshot.health.problems() if f.gpu is None],
            "inventory": None if snapshot.inventory is None else snapshot.inventory.to_json(),
            "infiniband": _infiniband_json(snapshot),
            # Where the node sits ([agent] labels): the fleet joins nodes by these too.
            "labels": dict(snapshot.location_labels),
        },
        "gpus": [_gpu_json(snapshot, gpu) for gpu in snapshot.gpus],
        "sources": [dataclasses.asdict(s) for s in snapshot.sources],
        "kmsg": dataclasses.asdict(snapshot.kmsg),
        "recent_events": len(snapshot.events),
        "remediation": _remediation_json(snapshot),
        "dcgm": _dcgm_json(snapshot),
        "diag": [_diag_json(result) for result in snapshot.diag],
    }


def _infiniband_json(snapshot: NodeSnapshot) -> list[dict[str, Any]] | None:
    """Every RDMA port; None when they were not read (sysfs source off or unreadable)."""
    if snapshot.infiniband is None:
        return None
    return [
        {
            "device": port.device,
            "port": port.port,
            "state": port.state or None,
            "phys_state": port.phys_state or None,
            "active": port.active,
            "rate_gbps": port.rate_gbps,
            "link_layer": port.link_layer or None,
        }
        for device in snapshot.infiniband
        for port in device.ports
    ]


def _diag_json(result: DiagResult) -> dict[str, Any]:
    """The latest diagnostic of one level: its verdict and the tests that failed."""
    return {
        "level": result.level,
        "passed": result.passed,
        "via": result.via,
        "finished": result.finished,
        "gpus": list(result.gpus),
        "failed": [{"test": t.name, "gpu": t.gpu, "info": t.info} for t in result.failures()],
        "error": result.error,
    }


def _dcgm_json(snapshot: NodeSnapshot) -> dict[str, Any] | None:
    """The DCGM source: None when it is not configured (``sources.dcgm.enabled = false``)."""
    dcgm = snapshot.dcgm
    if dcgm is None:
        return None
    return {
        "state": dcgm.state,
        "detail": dcgm.detail,
        "version": dcgm.version,
        "hostengine": dcgm.hostengine,
        "incidents": [
            {
                "system": i.system,
                "severity": i.severity.name,
                "code": i.code,
                "message": i.message,
                "gpu": i.gpu,
            }
            for i in dcgm.incidents
        ],
    }


def _remediation_json(snapshot: NodeSnapshot) -> dict[str, Any] | None:
    status = snapshot.remediation
    if status is None:
        return None
    return {
        "mode": status.mode,
        "paused": status.paused,
        "cordoned_by_us": status.cordoned_by_us,
        "counts": [{"action": a, "result": r, "count": n} for a, r, n in status.counts],
        "budgets": [{"action": a, "scope": s, "remaining": n} for a, s, n in status.budgets],
        "plan": [
            {"action": a, "target": t, "result": r, "reason": why, "detail": d, "count": n}
            for a, t, r, why, d, n in status.plan
        ],
    }
