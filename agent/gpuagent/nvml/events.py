"""NVML XID events: the event set's calls, each through the event worker's `call`.

Blocking; the XID event watcher (`gpuagent.sources.nvml_events`) runs them in a job on its
own worker. NVML errors come out as `NvmlCallError` or `GpuLostError`, as elsewhere.
"""

from __future__ import annotations

import contextlib
import ctypes
from typing import Any

import pynvml

from gpuagent.nvml.errors import GpuLostError, NvmlCallError, NvmlUnavailableError, required
from gpuagent.nvml.worker import CallWorker


def create_event_set(worker: CallWorker) -> Any:
    return worker.call(
        "nvmlEventSetCreate", required, "nvmlEventSetCreate", pynvml.nvmlEventSetCreate
    )


def register_xid_events(worker: CallWorker, event_set: Any, handle: Any) -> int:
    """Register ``handle`` for critical XIDs; the address events name the GPU by."""
    worker.call(
        "nvmlDeviceRegisterEvents",
        required,
        "nvmlDeviceRegisterEvents",
        pynvml.nvmlDeviceRegisterEvents,
        handle,
        pynvml.nvmlEventTypeXidCriticalError,
        event_set,
    )
    return handle_address(handle)


def wait_xid(worker: CallWorker, event_set: Any, wait_ms: int) -> tuple[int, int] | None:
    """Wait up to ``wait_ms`` for an event: (the GPU's handle address, the XID), or None
    when none came."""
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
    return handle_address(data.device), int(data.eventData)


def free_event_set(worker: CallWorker, event_set: Any) -> None:
    with contextlib.suppress(NvmlCallError, GpuLostError, NvmlUnavailableError):
        worker.call(
            "nvmlEventSetFree", required, "nvmlEventSetFree", pynvml.nvmlEventSetFree, event_set
        )


def handle_address(handle: Any) -> int:
    """A device handle's identity: the address it points at (handles are pointers)."""
    return ctypes.addressof(handle.contents)
