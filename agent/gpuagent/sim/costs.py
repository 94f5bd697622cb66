"""What NVML calls cost on a real GPU, charged by the simulator when a scenario asks.

Real NVML calls are not free: they spend CPU in the calling thread (the driver computes the
answer; nothing waits). The simulated library answers in microseconds, so a benchmark of the
simulated daemon would predict a real node's CPU use 20x too low. With ``[node] nvml_costs
= true`` every simulated call burns the thread CPU time the same call took on a real H200
(driver 580.159.04; the median of 20 calls, each timed alone: tests/data/live/
h200-580.159.04/nvml-call-costs.txt). A field-values batch costs the sum of its fields, but
the thermal, HW-thermal and power-brake durations share their work within a batch: the
measured batches (29 fields 4.94 ms, the same without the energy counter 1.62 ms) are what
the timings alone predict only if the second and third of them cost 0.32 ms, not 0.65.

The CPU is burnt in C with the GIL released (``ctypes.memset``), as a real driver call
releases it, so the daemon's event loop runs beside a charged call as it would on a node.
"""

from __future__ import annotations

import ctypes
import time
from typing import Any

# Thread CPU per call, ms. Calls not listed cost DEFAULT_CALL_MS: every other call the agent
# makes per poll measured 0.002-0.011 ms.
CALL_MS: dict[str, float] = {
    "nvmlDeviceGetUtilizationRates": 0.002,
    "nvmlDeviceGetEncoderUtilization": 0.003,
    "nvmlDeviceGetDecoderUtilization": 0.003,
    "nvmlDeviceGetMemoryInfo_v2": 0.009,
    "nvmlDeviceGetComputeRunningProcesses_v3": 0.010,
    "nvmlDeviceGetTemperature": 0.003,
    "nvmlDeviceGetClockInfo": 0.003,
    "nvmlDeviceGetCurrentClocksEventReasons": 0.002,
    "nvmlDeviceGetPerformanceState": 0.002,
    "nvmlDeviceGetPowerUsage": 0.002,
    "nvmlDeviceGetEccMode": 0.155,
    "nvmlDeviceGetMigMode": 0.151,
    "nvmlDeviceGetPersistenceMode": 0.007,
    "nvmlDeviceGetCurrPcieLinkGeneration": 0.002,
    "nvmlDeviceGetRowRemapperHistogram": 0.002,
    "nvmlDeviceGetNvLinkState": 0.011,
    "nvmlDeviceGetTotalEnergyConsumption": 3.254,
    "nvmlDeviceGetViolationStatus": 0.738,  # 0.661-0.824 by policy
    "nvmlDeviceGetPcieReplayCounter": 0.168,
    "nvmlGpmSampleGet": 0.052,
    "nvmlGpmMigSampleGet": 0.052,
    "nvmlGpmMetricsGet": 1.52,  # 1.47-1.65 in four timings, for 1 to 16 metrics
    # Not timed on the H200 (the agent reads them since): charged as the call that asks the
    # driver for the same kind of state.
    "nvmlDeviceGetDefaultEccMode": 0.155,  # the ECC state, as nvmlDeviceGetEccMode
    "nvmlDeviceGetComputeMode": 0.007,  # a mode the driver keeps, as persistence mode
    "nvmlDeviceGetPowerManagementLimit": 0.002,  # a power value, as nvmlDeviceGetPowerUsage
    # Where the board sits, fixed at boot: what the driver keeps, as persistence mode.
    "nvmlDeviceGetPlatformInfo": 0.007,
}
DEFAULT_CALL_MS = 0.003
FIELD_VALUES_CALL = "nvmlDeviceGetFieldValues"
# Per field of a nvmlDeviceGetFieldValues batch, by field id. Fields not listed cost
# DEFAULT_FIELD_MS (every other field measured 0.005-0.006 ms).
FIELD_MS: dict[int, float] = {
    83: 3.175,  # NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION
    94: 0.168,  # NVML_FI_DEV_PCIE_REPLAY_COUNTER
    75: 0.686,  # NVML_FI_DEV_PERF_POLICY_THERMAL
    270: 0.647,  # NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN
    271: 0.656,  # NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN
    91: 0.013,  # NVML_FI_DEV_NVLINK_LINK_COUNT (asked alone)
}
DEFAULT_FIELD_MS = 0.005
_SHARED_DURATIONS = frozenset({75, 270, 271})
_SHARED_FURTHER_MS = 0.32

_CHUNK = 64 * 1024  # bytes cleared per step: a few microseconds, so the charge is close
_buffer = ctypes.create_string_buffer(_CHUNK)


def call_ms(name: str) -> float:
    return CALL_MS.get(name, DEFAULT_CALL_MS)


def field_values_ms(field_ids: Any) -> float:
    """The cost of one batch asking for ``field_ids``."""
    total, shared = 0.0, 0
    for field_id in map(int, field_ids):
        if field_id in _SHARED_DURATIONS:
            shared += 1
            if shared > 1:
                total += _SHARED_FURTHER_MS
                continue
        total += FIELD_MS.get(field_id, DEFAULT_FIELD_MS)
    return total


def burn(ms: float) -> None:
    """Spend ``ms`` of this thread's CPU time in C, without the GIL."""
    deadline = time.thread_time() + ms / 1000
    while time.thread_time() < deadline:
        ctypes.memset(_buffer, 0, _CHUNK)
