"""NVML events (critical XIDs, recovery-action changes): the event set's calls, each
through the event worker's `call`.

Blocking; the XID event watcher (`gpuagent.sources.nvml_events`) runs them in a job on its
own worker. NVML errors come out as `NvmlCallError` or `GpuLostError`, as elsewhere.
"""

from __future__ import annotations

import contextlib
import ctypes
from typing import Any, Literal

import pynvml

from gpuagent.nvml.errors import (
    GpuLostError,
    NvmlCallError,
    NvmlUnavailableError,
    optional,
    required,
)
from gpuagent.nvml.worker import CallWorker


def create_event_set(worker: CallWorker) -> Any:
    return worker.call(
        "nvmlEventSetCreate", required, "nvmlEventSetCreate", pynvml.nvmlEventSetCreate
    )


def register_events(worker: CallWorker, event_set: Any, handle: Any) -> int:
    """Register ``handle`` for critical XIDs, and for recovery-action changes where the
    driver offers them; the address events name the GPU by."""
    supported = worker.call(
        "nvmlDeviceGetSupportedEventTypes",
        optional,
        "nvmlDeviceGetSupportedEventTypes",
        pynvml.nvmlDeviceGetSupportedEventTypes,
        handle,
    )
    wanted = pynvml.nvmlEventTypeXidCriticalError
    if supported is not None:
        wanted |= int(supported) & pynvml.nvmlEventTypeGpuRecoveryAction
    worker.call(
        "nvmlDeviceRegisterEvents",
        required,
        "nvmlDeviceRegisterEvents",
        pynvml.nvmlDeviceRegisterEvents,
        handle,
        wanted,
        event_set,
    )
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
    recovery = int(data.eventType) & pynvml.nvmlEventTypeGpuRecoveryAction
    kind: EventKind = "recovery_action" if recovery else "xid"
    return handle_address(data.device), kind, int(data.eventData)


def free_event_set(worker: CallWorker, event_set: Any) -> None:
    with contextlib.suppress(NvmlCallError, GpuLostError, NvmlUnavailableError):
        worker.call(
            "nvmlEventSetFree", required, "nvmlEventSetFree", pynvml.nvmlEventSetFree, event_set
        )


def handle_address(handle: Any) -> int:
    """A device handle's identity: the address it points at (handles are pointers)."""
    return ctypes.addressof(handle.contents)
