"""NVML event sets: which GPUs and event types a set listens to, and what is queued."""

from __future__ import annotations

from collections import deque

import pynvml

from gpuagent.sim import codes
from gpuagent.sim.gpu import SimGpu
from gpuagent.sim.profiles import GpuProfile

# A GPU operational event (drivers R615 and later, a preview), queued beside the classic
# event types; its data is the legacy Xid it carries. Not an NVML event-type bit.
OPERATIONAL_EVENT = 1 << 62
# Drivers that have the operational-event calls (R580 answers FunctionNotFound for them).
OPERATIONAL_EVENTS_DRIVER_MAJOR = 615

_EVERY_MODEL = (
    codes.EVENT_PSTATE
    | codes.EVENT_XID
    | codes.EVENT_CLOCK
    | codes.EVENT_POWER_SOURCE_CHANGE
    | codes.EVENT_GPU_RECOVERY_ACTION
)


def supported_event_types(profile: GpuProfile) -> int:
    """nvmlDeviceGetSupportedEventTypes: ECC events need ECC, MIG events need MIG."""
    types = _EVERY_MODEL
    if profile.ecc:
        types |= codes.EVENT_SINGLE_BIT_ECC | codes.EVENT_DOUBLE_BIT_ECC
    if profile.mig:
        types |= codes.EVENT_MIG_CONFIG_CHANGE
    return types


class EventSet:
    def __init__(self) -> None:
        # The nvmlEventSet_t handed out points here; its address identifies the set.
        self.target = pynvml.struct_c_nvmlEventSet_t()
        self.masks: dict[int, int] = {}  # GPU index -> registered event types
        self.operational: set[int] = set()  # GPU indices registered for operational events
        self.queue: deque[tuple[SimGpu, int, int]] = deque()
        self.freed = False
        # The legacy Xid of the operational event nvmlEventSetWait_v3 returned last (what
        # the context calls answer about), and how many it has returned.
        self.context_xid: int | None = None
        self.operational_count = 0

    def offer(self, gpu: SimGpu, event_type: int, data: int) -> bool:
        """Queue the event if this set listens for it on ``gpu``."""
        if event_type == OPERATIONAL_EVENT:
            listening = gpu.index in self.operational
        else:
            listening = bool(self.masks.get(gpu.index, 0) & event_type)
        if listening:
            self.queue.append((gpu, event_type, data))
            return True
        return False
