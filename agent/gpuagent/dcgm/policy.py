"""DCGM policy notifications: DBE, PCIe, retired pages, thermal, power, NVLink and XID
violations pushed by the host engine, turned into GpuEvents.

DCGM calls the registered callback on a thread of its own. The callback copies what it
needs out of the response (DCGM frees it on return) and hands it to the event loop with
``call_soon_threadsafe``; the ctypes callback object is kept by `PolicyWatch` for the
source's whole life, since DCGM calls freed memory if it were garbage-collected while
registered. A DBE is XID 48 (what the driver logs for it) and an XID is itself, so both
de-duplicate against the same XID from the kernel log or NVML (events.py).
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from gpuagent.dcgm.bindings import DcgmBindings
from gpuagent.model import GpuEvent

log = logging.getLogger(__name__)

# DCGM_POLICY_COND_* bit → (parms index, union member, name) (bits and indices: DCGM's ABI).
CONDITIONS: Mapping[int, tuple[int, str, str]] = {
    0x1: (0, "dbe", "double-bit ECC error"),
    0x2: (1, "pci", "PCIe replay errors"),
    0x4: (2, "mpr", "retired pages limit"),
    0x8: (3, "thermal", "thermal violation"),
    0x10: (4, "power", "power violation"),
    0x20: (5, "nvlink", "NVLink errors"),
    0x40: (6, "xid", "XID"),
}
ALL_CONDITIONS = sum(CONDITIONS)
DBE_XID = 48  # the XID the driver logs for a double-bit ECC error
# Thresholds of the conditions that take a number (parms tag 1): DCGM's own page
# retirement limit; temperatures and draws no healthy board reaches.
MAX_RETIRED_PAGES = 60
THERMAL_LIMIT_C = 90
POWER_LIMIT_W = 1000
_BOOL, _NUMBER = 0, 1

# What the callback copies: (condition, DCGM GPU id, timestamp in µs, values).
Violation = tuple[int, int, int, dict[str, int]]


def _policy(dcgm: DcgmBindings) -> Any:
    structs = dcgm.structs
    policy = structs.c_dcgmPolicy_v1()
    policy.version = structs.dcgmPolicy_version1
    policy.condition = ALL_CONDITIONS
    policy.mode = structs.DCGM_POLICY_MODE_MANUAL
    policy.isolation = structs.DCGM_POLICY_ISOLATION_NONE
    policy.action = structs.DCGM_POLICY_ACTION_NONE
    policy.validation = structs.DCGM_POLICY_VALID_NONE
    policy.response = structs.DCGM_POLICY_FAILURE_NONE
    numbers = {2: MAX_RETIRED_PAGES, 3: THERMAL_LIMIT_C, 4: POWER_LIMIT_W}
    for index, _member, _name in CONDITIONS.values():
        parm = policy.parms[index]
        if index in numbers:
            parm.tag, parm.val.llval = _NUMBER, numbers[index]
        else:
            parm.tag, parm.val.boolean = _BOOL, True
    return policy


class PolicyWatch:
    """The policy callback of one source, and the events it makes."""

    def __init__(
        self,
        dcgm: DcgmBindings,
        loop: asyncio.AbstractEventLoop,
        on_event: Callable[[GpuEvent], None],
    ) -> None:
        self._dcgm = dcgm
        self._loop = loop
        self._on_event = on_event
        self.bus_ids: Mapping[int, str] = {}
        callback_type = ctypes.CFUNCTYPE(
            ctypes.c_int,
            ctypes.POINTER(dcgm.structs.c_dcgmPolicyCallbackResponse_v2),
            ctypes.c_uint64,
        )
        # Referenced here for as long as the source lives: DCGM keeps only its address.
        self.callback = callback_type(self._on_dcgm_thread)

    def register(self, handle: Any, group: Any) -> None:
        """Set the policy on ``group`` and register the callback (blocking)."""
        agent = self._dcgm.agent
        status = agent.dcgmStatusCreate()
        try:
            agent.dcgmPolicySet(handle, group, _policy(self._dcgm), status)
        finally:
            agent.dcgmStatusDestroy(status)
        agent.dcgmPolicyRegister_v2(handle, group, ALL_CONDITIONS, self.callback, None)

    def _on_dcgm_thread(self, response: Any, _user: int) -> int:
        try:
            info = response.contents
            condition = int(info.condition)
            member = CONDITIONS.get(condition, (0, "", ""))[1]
            values: dict[str, int] = {}
            timestamp = 0
            if member:
                value = getattr(info.val, member)
                for name, _type in value._fields_:
                    values[name] = int(getattr(value, name))
                timestamp = values.pop("timestamp", 0)
            violation: Violation = (condition, int(info.gpuId), timestamp, values)
            self._loop.call_soon_threadsafe(self._deliver, violation)
        except Exception:  # an exception must not cross back into DCGM's thread
            log.exception("DCGM policy callback failed")
        return 0

    def _deliver(self, violation: Violation) -> None:
        self._on_event(to_event(violation, self.bus_ids))


def to_event(violation: Violation, bus_ids: Mapping[int, str]) -> GpuEvent:
    condition, gpu_id, timestamp, values = violation
    bus_id = bus_ids.get(gpu_id)
    name = CONDITIONS.get(condition, (0, "", f"condition {condition:#x}"))[2]
    detail = ", ".join(f"{k} {v}" for k, v in values.items())
    wall = timestamp / 1e6 if timestamp > 0 else time.time()
    code: int | None
    if condition == 0x1:
        kind, code = "xid", DBE_XID
    elif condition == 0x40:
        kind, code = "xid", values.get("errnum")
    else:
        kind, code = "dcgm_policy", condition
    return GpuEvent(
        event_id=f"dcgm:{bus_id or gpu_id}:{condition}:{timestamp or time.monotonic_ns()}",
        source="dcgm",
        kind=kind,  # type: ignore[arg-type]
        gpu=bus_id,
        time=wall,
        monotonic=time.monotonic(),
        pci=bus_id,
        code=code,
        line=f"DCGM policy: {name} on GPU {gpu_id}" + (f" ({detail})" if detail else ""),
    )
