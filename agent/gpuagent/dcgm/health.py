"""DCGM health watches: every watch system on a group of all GPUs, and each
`dcgmHealthCheck` incident as a DcgmIncident. Blocking: runs on the DCGM thread."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuagent.dcgm.bindings import DcgmBindings
from gpuagent.model import DcgmIncident, Severity
from gpuagent.nvml.device import canonical_bus_id

# DCGM_HEALTH_WATCH_* bit → the system name incidents carry (bits are DCGM's ABI).
SYSTEMS: Mapping[int, str] = {
    0x1: "pcie",
    0x2: "nvlink",
    0x4: "pmu",
    0x8: "mcu",
    0x10: "memory",
    0x20: "sm",
    0x40: "inforom",
    0x80: "thermal",
    0x100: "power",
    0x200: "driver",
    0x400: "nvswitch_nonfatal",
    0x800: "nvswitch_fatal",
}
ALL_SYSTEMS = sum(SYSTEMS)
_GPU_ENTITY_GROUP = 1  # DCGM_FE_GPU


@dataclass(frozen=True)
class HealthWatch:
    """A connection's health group and the PCI bus id of each DCGM GPU id."""

    group: Any
    bus_ids: Mapping[int, str]


def gpu_bus_ids(dcgm: DcgmBindings, handle: Any) -> dict[int, str]:
    """DCGM GPU id → canonical PCI bus id ("0000:3b:00.0")."""
    found = {}
    for gpu in dcgm.agent.dcgmGetAllSupportedDevices(handle):
        raw = dcgm.agent.dcgmGetDeviceAttributes(handle, gpu).identifiers.pciBusId
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        found[int(gpu)] = canonical_bus_id(text)
    return found


def watch(dcgm: DcgmBindings, handle: Any) -> HealthWatch:
    group = dcgm.agent.dcgmGroupCreate(handle, dcgm.structs.DCGM_GROUP_DEFAULT, "gpuagent-health")
    dcgm.agent.dcgmHealthSet(handle, group, ALL_SYSTEMS)
    return HealthWatch(group, gpu_bus_ids(dcgm, handle))


def code_name(dcgm: DcgmBindings, code: int) -> str:
    """DCGM's DCGM_FR_* name of an error code (the number when the bindings lack it)."""
    module = dcgm.errors
    if module is not None:
        # In definition order: the error codes come first; later DCGM_FR_EC_* categories
        # reuse the same small numbers.
        for name, value in vars(module).items():
            is_code = name.startswith("DCGM_FR_") and not name.startswith("DCGM_FR_EC_")
            if is_code and value == code:
                return str(name)
    return f"DCGM_FR_{code}"


def _severity(dcgm: DcgmBindings, health: int) -> Severity | None:
    if health == dcgm.structs.DCGM_HEALTH_RESULT_FAIL:
        return Severity.CRITICAL
    if health == dcgm.structs.DCGM_HEALTH_RESULT_WARN:
        return Severity.WARN
    return None


def check(dcgm: DcgmBindings, handle: Any, health: HealthWatch) -> tuple[DcgmIncident, ...]:
    response = dcgm.agent.dcgmHealthCheck(handle, health.group)
    incidents = []
    for info in response.incidents[: response.incidentCount]:
        severity = _severity(dcgm, int(info.health))
        if severity is None:
            continue
        entity = info.entityInfo
        gpu = (
            health.bus_ids.get(int(entity.entityId))
            if int(entity.entityGroupId) == _GPU_ENTITY_GROUP
            else None
        )
        message = info.error.msg
        incidents.append(
            DcgmIncident(
                system=SYSTEMS.get(int(info.system), f"system_{int(info.system):#x}"),
                severity=severity,
                code=code_name(dcgm, int(info.error.code)),
                message=(message.decode() if isinstance(message, bytes) else str(message)),
                gpu=gpu,
            )
        )
    return tuple(incidents)
