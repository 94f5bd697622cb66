"""What a simulated GPU reports that follows its load: the idle and busy model.

A GPU with no process is idle, as real idle GPUs report: 0 % utilization, the GPU-idle
clock event reason, the idle SM (and, on GDDR boards, memory) clock, the idle P-state,
idle power and temperature, and on boards that do it a PCIe link trained down. A
compute process makes it busy: ~88-96 % utilization, the power and heat that go with
it, clocks at the applications clock (or the maximum), the busy P-state.

Readings are pure functions of the GPU's state and the elapsed time (slow deterministic
drift, one phase per GPU), so a scenario replays identically. Every such reading is a
method of `Readings`, so another reading model can stand in for this one on a GPU (a
replayed capture's, `gpuagent.sim.replay.CapturedReadings`); a reading that model does
not have is None, and NVML answers NOT_SUPPORTED for it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from gpuagent.sim import codes, hardware

if TYPE_CHECKING:
    from gpuagent.sim.gpu import SimGpu

_TWO_PI = 2.0 * math.pi
# Reasons that slow the clocks below what the load asks for.
SLOWDOWN_REASONS = (
    codes.REASON_HW_SLOWDOWN
    | codes.REASON_HW_THERMAL
    | codes.REASON_SW_THERMAL
    | codes.REASON_POWER_BRAKE
)
_BUSY_UTILIZATION_PCT = 88.0
_BUSY_SWING_PCT = 8.0
_MEMORY_SHARE = 0.45  # memory (copy engine) utilization relative to GPU utilization
_IDLE_POWER_SWING = 0.04  # idle draw wanders by this share of itself
# The driver's power average: over the last second, sampled here at its ends and between.
_AVERAGE_WINDOW_SECONDS = 1.0
_AVERAGE_SAMPLES = 5


@dataclass(frozen=True, slots=True)
class FbMemory:
    """The framebuffer in bytes, as nvmlDeviceGetMemoryInfo_v2 splits it: ``used`` without
    the driver's ``reserved`` memory (None: the driver reports none, and has no v2 call)."""

    total: int
    used: int
    free: int
    reserved: int | None


class Readings(Protocol):
    """What a GPU reports that moves. Callers hold the node lock."""

    def after_fault(self, kind: str) -> Readings:
        """The readings model once a fault of ``kind`` applied."""

    def busy(self) -> bool: ...
    def utilization(self, now: float) -> float | None: ...
    def memory_utilization(self, now: float) -> float | None: ...
    def power_mw(self, now: float) -> int | None:
        """The instantaneous draw (NVML field 186)."""

    def average_power_mw(self, now: float) -> int | None:
        """The draw averaged over the last second (NVML field 185)."""

    def power_usage_mw(self, now: float) -> int | None:
        """nvmlDeviceGetPowerUsage: the 1 s average on Ampere (but GA100) and later, the
        instantaneous draw on GA100 and older GPUs."""

    def temperature(self, now: float) -> float | None: ...
    def memory_temperature(self, now: float) -> float | None: ...
    def fan_speed_pct(self, now: float) -> int | None: ...
    def clock_event_reasons(self, now: float) -> int | None: ...
    def graphics_clock_mhz(self, now: float) -> int | None: ...
    def sm_clock_mhz(self, now: float) -> int | None: ...
    def memory_clock_mhz(self, now: float) -> int | None: ...
    def video_clock_mhz(self, now: float) -> int | None: ...
    def performance_state(self, now: float) -> int | None: ...
    def pcie_generation(self, now: float) -> int | None: ...
    def fb_memory(self, now: float) -> FbMemory | None: ...


class LiveReadings:
    """The load-following readings of one GPU. Callers hold the node lock."""

    def __init__(self, gpu: SimGpu) -> None:
        self._gpu = gpu
        self._profile = gpu.profile

    def after_fault(self, _kind: str) -> LiveReadings:
        """The readings model once a fault of ``kind`` applied: this one, always."""
        return self

    # --- load -------------------------------------------------------------------------

    def busy(self) -> bool:
        # A hung process holds its memory (and keeps the clocks up) but adds no load.
        return any(not p.hung for p in self._gpu.processes.values())

    def idle_clocks(self) -> bool:
        """Whether the GPU has clocked down to idle. A GPU with MIG on does not: its
        instances are ready for work, so the clocks stay up (as the A100 capture shows)."""
        return not self._gpu.processes and not self._gpu.mig_mode

    def _wave(self, now: float) -> float:
        return math.sin(_TWO_PI * now / hardware.LOAD_PERIOD_SECONDS + self._gpu.board.phase)

    def utilization(self, now: float) -> float:
        """GPU utilization in percent: 0 idle, ~88-96 busy."""
        return self._utilization(now, self.busy())

    def _utilization(self, at: float, busy: bool) -> float:
        if not busy:
            return 0.0
        return _BUSY_UTILIZATION_PCT + _BUSY_SWING_PCT * abs(self._wave(at))

    def memory_utilization(self, now: float) -> float:
        return self.utilization(now) * _MEMORY_SHARE

    # --- power and heat ---------------------------------------------------------------

    def power_demand_mw(self, now: float) -> float:
        """What the load asks for, before the power limit caps it."""
        return self._demand_mw(now, self.busy())

    def _demand_mw(self, at: float, busy: bool) -> float:
        profile = self._profile
        idle_w = profile.power_idle_w * (1.0 + _IDLE_POWER_SWING * self._wave(at))
        load = self._utilization(at, busy) / 100.0
        return (idle_w + load * (profile.power_full_w - profile.power_idle_w)) * 1000.0

    def power_mw(self, now: float) -> int:
        """The instantaneous draw (NVML field 186, `nvidia-smi power.draw.instant`)."""
        return int(min(self.power_demand_mw(now), self._gpu.power_limit_mw))

    def average_power_mw(self, now: float) -> int:
        """The draw averaged over the last second, as NVML's power usage and field 185
        (and so DCGM and `nvidia-smi power.draw`) report it: it lags a step in load."""
        changed_at, busy_before = self._gpu.load_step
        busy_now, limit = self.busy(), self._gpu.power_limit_mw
        total = 0.0
        for sample in range(_AVERAGE_SAMPLES):
            at = now - _AVERAGE_WINDOW_SECONDS * sample / (_AVERAGE_SAMPLES - 1)
            total += min(self._demand_mw(at, busy_before if at < changed_at else busy_now), limit)
        return int(total / _AVERAGE_SAMPLES)

    def power_usage_mw(self, now: float) -> int:
        return self.average_power_mw(now)

    def temperature(self, now: float) -> float:
        """Degrees Celsius: the held temperature of a `temperature` fault, else warming
        linearly with the power drawn, from idle to the default limit."""
        gpu, profile = self._gpu, self._profile
        if gpu.temperature_override is not None:
            return gpu.temperature_override
        span_w = profile.power_default_limit_w - profile.power_idle_w
        rise = (profile.temperature_at_limit_c - profile.temperature_idle_c) / span_w
        drawn_w = self.power_mw(now) / 1000.0
        heat = profile.temperature_idle_c + (drawn_w - profile.power_idle_w) * rise
        return heat + gpu.board.temperature_offset

    def memory_temperature(self, now: float) -> float | None:
        offset = self._profile.memory_temperature_offset_c
        return None if offset is None else self.temperature(now) + offset

    def fan_speed_pct(self, now: float) -> int | None:
        """Fan speed following the temperature, between the profile's idle and busy
        speeds; None on boards without a fan reading."""
        profile = self._profile
        if profile.fan_idle_pct is None:
            return None
        span_c = profile.temperature_at_limit_c - profile.temperature_idle_c
        share = (self.temperature(now) - profile.temperature_idle_c) / span_c
        speed = profile.fan_idle_pct + share * (profile.fan_busy_pct - profile.fan_idle_pct)
        return round(min(max(speed, profile.fan_idle_pct), 100.0))

    # --- clocks -------------------------------------------------------------------------

    def clock_event_reasons(self, now: float) -> int:
        """Injected reasons plus those the GPU raises itself at this load, heat and power.

        Idle is reported only while nothing slows the clocks: a real idle H100 with HW
        Slowdown and the power brake asserted shows Idle as not active.
        """
        gpu, profile = self._gpu, self._profile
        reasons = gpu.throttle_reasons
        default_clock = profile.applications_clock_mhz
        if default_clock is not None and gpu.applications_clock_mhz != default_clock:
            reasons |= codes.REASON_APPLICATIONS_CLOCKS
        temperature = self.temperature(now)
        if temperature >= profile.temperature_gpu_max_c:
            reasons |= codes.REASON_SW_THERMAL
        if temperature >= profile.temperature_slowdown_c:
            reasons |= codes.REASON_HW_SLOWDOWN | codes.REASON_HW_THERMAL
        if self.power_demand_mw(now) > gpu.power_limit_mw:
            reasons |= codes.REASON_SW_POWER_CAP
        if self.idle_clocks() and not reasons & SLOWDOWN_REASONS:
            reasons |= codes.REASON_GPU_IDLE
        return reasons

    def sm_clock_mhz(self, now: float) -> int:
        profile = self._profile
        reasons = self.clock_event_reasons(now)
        if reasons & codes.REASON_GPU_IDLE or self.idle_clocks():
            clock = profile.sm_clock_idle_mhz
        elif self._gpu.applications_clock_mhz is not None:
            clock = self._gpu.applications_clock_mhz
        else:
            clock = profile.sm_clock_max_mhz
        if reasons & codes.REASON_POWER_BRAKE:
            return min(clock, profile.sm_clock_brake_mhz)
        if reasons & SLOWDOWN_REASONS:
            return min(clock, profile.sm_clock_slowdown_mhz)
        if reasons & codes.REASON_SW_POWER_CAP:
            return min(clock, profile.sm_clock_power_capped_mhz)
        return clock

    def graphics_clock_mhz(self, now: float) -> int:
        return self.sm_clock_mhz(now)  # one clock domain on every model simulated

    def memory_clock_mhz(self, _now: float) -> int:
        profile = self._profile
        return profile.memory_clock_idle_mhz if self.idle_clocks() else profile.memory_clock_max_mhz

    def video_clock_mhz(self, now: float) -> int:
        profile = self._profile
        if self.idle_clocks():
            return profile.video_clock_idle_mhz
        # Busy, the video clock follows the SM clock down when the GPU slows.
        share = self.sm_clock_mhz(now) / profile.sm_clock_max_mhz
        return round(profile.video_clock_max_mhz * share)

    def performance_state(self, _now: float) -> int:
        profile = self._profile
        return profile.idle_pstate if self.idle_clocks() else profile.busy_pstate

    # --- PCIe -----------------------------------------------------------------------------

    def pcie_generation(self, _now: float) -> int:
        """The link's current generation: trained down at idle on boards that do it, and
        never above what a `pcie_degrade` fault left the link able to reach."""
        profile, gpu = self._profile, self._gpu
        trained = profile.pcie_max_generation
        if profile.pcie_idle_generation is not None and self.idle_clocks():
            trained = profile.pcie_idle_generation
        return min(trained, gpu.pcie_generation_limit)

    # --- memory -------------------------------------------------------------------------

    def fb_memory(self, _now: float) -> FbMemory:
        profile = self._profile
        total = profile.memory_total_mib * hardware.MIB
        reserved = profile.memory_reserved_mib * hardware.MIB
        used = self._gpu.memory_used_bytes()
        return FbMemory(total=total, used=used, free=total - reserved - used, reserved=reserved)
