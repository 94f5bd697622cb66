"""NVML event sets: which GPUs and event types a set listens to, and what is queued."""

from __future__ import annotations

from collections import deque

import pynvml

from gpuagent.sim import codes
from gpuagent.sim.gpu import SimGpu
from gpuagent.sim.profiles import GpuProfile

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
        self.queue: deque[tuple[SimGpu, int, int]] = deque()
        self.freed = False

    def offer(self, gpu: SimGpu, event_type: int, data: int) -> bool:
        """Queue the event if this set listens for it on ``gpu``."""
        if self.masks.get(gpu.index, 0) & event_type:
            self.queue.append((gpu, event_type, data))
            return True
        return False
