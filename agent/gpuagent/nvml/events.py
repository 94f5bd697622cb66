"""NVML events (critical XIDs, recovery-action changes, and where asked and offered the
GPU operational events of R615 and later): the event set's calls, each through the event
worker's `call`.

Blocking; the XID event watcher (`gpuagent.sources.nvml_events`) runs them in a job on its
own worker. NVML errors come out as `NvmlCallError` or `GpuLostError`, as elsewhere.
"""

from __future__ import annotations

import contextlib
import ctypes
from dataclasses import dataclass
from typing import Any, Literal

import pynvml

from gpuagent.nvml.errors import (
    GpuLostError,
    NvmlCallError,
    NvmlUnavailableError,
    is_absent,
    optional,
    required,
    return_code,
    text,
)
from gpuagent.nvml.worker import CallWorker


def create_event_set(worker: CallWorker) -> Any:
    name = "nvmlEventSetCreate"
    return worker.call(name, required, name, pynvml.nvmlEventSetCreate)


def register_events(worker: CallWorker, event_set: Any, handle: Any) -> int:
    """Register ``handle`` for critical XIDs, and for recovery-action changes where the
    driver offers them; the address events name the GPU by."""
    name = "nvmlDeviceGetSupportedEventTypes"
    supported = worker.call(name, optional, name, pynvml.nvmlDeviceGetSupportedEventTypes, handle)
    wanted = pynvml.nvmlEventTypeXidCriticalError
    if supported is not None:
        wanted |= int(supported) & pynvml.nvmlEventTypeGpuRecoveryAction
    name = "nvmlDeviceRegisterEvents"
    worker.call(name, required, name, pynvml.nvmlDeviceRegisterEvents, handle, wanted, event_set)
    return handle_address(handle)


EventKind = Literal["xid", "recovery_action"]


def wait_event(
    worker: CallWorker, event_set: Any, wait_ms: int
) -> tuple[int, EventKind, int] | None:
    """Wait up to ``wait_ms`` for an event: (the GPU's handle address, what it is, its data:
    the XID, or the new recovery action), or None when none came."""
    try:
        data = worker.call(
            "nvmlEventSetWait_v2",
            pynvml.nvmlEventSetWait_v2,
            event_set,
            wait_ms,
            expected=wait_ms / 1000,
        )
    except pynvml.NVMLError_Timeout:
        return None
    except pynvml.NVMLError as exc:
        raise NvmlCallError("nvmlEventSetWait_v2", exc) from None
    return handle_address(data.device), _kind(data.eventType), int(data.eventData)


def _kind(event_type: int) -> EventKind:
    """What a classic event is: a recovery-action change, else a critical XID."""
    recovery = int(event_type) & pynvml.nvmlEventTypeGpuRecoveryAction
    return "recovery_action" if recovery else "xid"


def device_uuid(worker: CallWorker, handle: Any) -> str:
    """The GPU's UUID: what nvmlEventSetWait_v3 names it by."""
    name = "nvmlDeviceGetUUID"
    return text(worker.call(name, required, name, pynvml.nvmlDeviceGetUUID, handle)) or ""


def register_operational_events(worker: CallWorker, event_set: Any, uuid: str) -> bool:
    """Register the GPU ``uuid``'s operational events (structured fault reports, a preview
    from R615 on); False where the driver lacks them (FunctionNotFound on R580)."""
    name = "nvmlEventSetRegisterGpuOperationalEvents_v1"
    config = pynvml.c_nvmlGpuOperationalEventConfig_v1_t(uuid=uuid)
    register = pynvml.nvmlEventSetRegisterGpuOperationalEvents_v1
    code = worker.call(name, return_code, name, register, event_set, config)
    if is_absent(code):
        return False
    if code != pynvml.NVML_SUCCESS:
        raise NvmlCallError(name, pynvml.NVMLError(code))
    return True


@dataclass(frozen=True, slots=True)
class OperationalEvent:
    """One GPU operational event, as nvmlEventSetWait_v3 and its context describe it."""

    uuid: str
    module: str  # the driver module that reports it ("RM", ...)
    severity: int  # NVML_OPERATIONAL_EVENT_SEVERITY_*
    category: int
    code: int  # the module's own event code
    attributes: int  # NVML_OPERATIONAL_EVENT_ATTR_* bits
    instance: int  # tells two events apart
    timestamp_usec: int
    xid: int | None  # the legacy Xid it carries (its LEGACY_XID context), if any


def wait_event_v3(
    worker: CallWorker, event_set: Any, wait_ms: int
) -> tuple[str, EventKind, int] | OperationalEvent | None:
    """nvmlEventSetWait_v3: a classic event as (the GPU's UUID, kind, data), an operational
    event, or None when none came within ``wait_ms``."""
    params = pynvml.c_nvmlEventSetWait_v3_t()
    params.timeoutMs = wait_ms
    try:
        worker.call(
            "nvmlEventSetWait_v3",
            pynvml.nvmlEventSetWait_v3,
            event_set,
            params,
            expected=wait_ms / 1000,
        )
    except pynvml.NVMLError_Timeout:
        return None
    except pynvml.NVMLError as exc:
        raise NvmlCallError("nvmlEventSetWait_v3", exc) from None
    uuid = text(params.uuid) or ""
    if params.dataType != pynvml.NVML_EVENT_DATA_TYPE_GPU_OPERATIONAL_EVENT:
        return uuid, _kind(params.eventType), int(params.eventData)
    return OperationalEvent(
        uuid=uuid,
        module=text(params.sourceModule) or "",
        severity=int(params.severity),
        category=int(params.categoryId),
        code=int(params.moduleEventCode),
        attributes=int(params.attributes),
        instance=int(params.instanceId),
        timestamp_usec=int(params.timestampUsec),
        xid=_legacy_xid(worker, event_set),
    )


def _legacy_xid(worker: CallWorker, event_set: Any) -> int | None:
    """The legacy Xid among the contexts of the operational event returned last."""
    count = pynvml.c_nvmlEventSetGetContextCount_v1_t()
    name = "nvmlEventSetGetContextCount_v1"
    worker.call(name, required, name, pynvml.nvmlEventSetGetContextCount_v1, event_set, count)
    for index in range(int(count.count)):
        info = pynvml.c_nvmlEventSetGetContextInfo_v1_t()
        info.index = index
        name = "nvmlEventSetGetContextInfo_v1"
        worker.call(name, required, name, pynvml.nvmlEventSetGetContextInfo_v1, event_set, info)
        legacy = pynvml.NVML_GPU_OPERATIONAL_EVENT_CONTEXT_TYPE_LEGACY_XID
        if info.nvmlGpuOperationalEventContextType == legacy:
            xid = pynvml.c_nvmlEventSetGetGpuOperationalEventContextLegacyXid_v1_t()
            xid.index = index
            name = "nvmlEventSetGetGpuOperationalEventContextLegacyXid_v1"
            fn = pynvml.nvmlEventSetGetGpuOperationalEventContextLegacyXid_v1
            worker.call(name, required, name, fn, event_set, xid)
            return int(xid.xidCode)
    return None


_SEVERITIES = {
    pynvml.NVML_OPERATIONAL_EVENT_SEVERITY_INFORMATIONAL: "informational",
    pynvml.NVML_OPERATIONAL_EVENT_SEVERITY_CORRECTED: "corrected",
    pynvml.NVML_OPERATIONAL_EVENT_SEVERITY_RECOVERABLE: "recoverable",
    pynvml.NVML_OPERATIONAL_EVENT_SEVERITY_FATAL: "fatal",
}
_ATTRIBUTES = {
    pynvml.NVML_OPERATIONAL_EVENT_ATTR_UNCONTAINED: "uncontained",
    pynvml.NVML_OPERATIONAL_EVENT_ATTR_LATENT: "latent",
    pynvml.NVML_OPERATIONAL_EVENT_ATTR_PROPAGATED: "propagated",
    pynvml.NVML_OPERATIONAL_EVENT_ATTR_COMPONENT_RESET: "component reset",
    pynvml.NVML_OPERATIONAL_EVENT_ATTR_THRESHOLD_EXCEEDED: "threshold exceeded",
    pynvml.NVML_OPERATIONAL_EVENT_ATTR_PRIMARY: "primary",
    pynvml.NVML_OPERATIONAL_EVENT_ATTR_OVERFLOW: "overflow",
}


def describe_operational(event: OperationalEvent, bus_id: str | None) -> str:
    """The evidence line of an operational event: its Xid, source, severity, attributes."""
    severity = _SEVERITIES.get(event.severity, f"severity {event.severity}")
    attributes = [name for bit, name in _ATTRIBUTES.items() if event.attributes & bit]
    listed = f" ({', '.join(attributes)})" if attributes else ""
    return (
        f"GPU operational event on {bus_id}: Xid {event.xid}, {event.module} category "
        f"{event.category} code {event.code}, {severity}{listed}"
    )


def free_event_set(worker: CallWorker, event_set: Any) -> None:
    name = "nvmlEventSetFree"
    with contextlib.suppress(NvmlCallError, GpuLostError, NvmlUnavailableError):
        worker.call(name, required, name, pynvml.nvmlEventSetFree, event_set)


def handle_address(handle: Any) -> int:
    """A device handle's identity: the address it points at (handles are pointers)."""
    return ctypes.addressof(handle.contents)
