"""``thermal``: GPU and memory temperature against their thresholds, and thermal throttling.

Thresholds come from the GPU itself (NVML reports slowdown and shutdown temperatures)
and fall back to the configured values on GPUs that do not report them. Clock event
reasons catch throttling even when the temperature sensor looks fine, e.g. an external
power brake signal.
"""

from __future__ import annotations

from gpuagent.checks.common import Evidence, GpuView, Outcome, Problem, fmt
from gpuagent.checks.vocabulary import Action, Runbook
from gpuagent.model import Severity

# NVML clock event reason bits (nvmlClocksEventReason*) that mean the GPU is being slowed
# by hardware protection rather than by its own power management.
HW_SLOWDOWN = 0x8
SW_THERMAL_SLOWDOWN = 0x20
HW_THERMAL_SLOWDOWN = 0x40
HW_POWER_BRAKE_SLOWDOWN = 0x80
THROTTLE_REASONS = (
    (HW_SLOWDOWN, "hw_slowdown"),
    (SW_THERMAL_SLOWDOWN, "sw_thermal_slowdown"),
    (HW_THERMAL_SLOWDOWN, "hw_thermal_slowdown"),
    (HW_POWER_BRAKE_SLOWDOWN, "hw_power_brake"),
)
_THERMAL_BITS = HW_SLOWDOWN | SW_THERMAL_SLOWDOWN | HW_THERMAL_SLOWDOWN


def _threshold(reported: float | None, fallback: float) -> float:
    # NVML reports 0 on some boards that do not really know the value.
    return reported if reported is not None and reported > 0 else fallback


def active_throttle_reasons(mask: int | None) -> tuple[str, ...]:
    if mask is None:
        return ()
    return tuple(name for bit, name in THROTTLE_REASONS if mask & bit)


def _gpu_temperature(view: GpuView, slowdown: float, shutdown: float) -> Problem | None:
    temp, config = view.readings.temperature_c, view.config.thermal
    if temp is None:
        return None
    if temp >= shutdown - config.shutdown_margin_c:
        return Problem(
            Severity.CRITICAL,
            f"GPU at {fmt(temp)} °C, within {fmt(config.shutdown_margin_c)} °C "
            f"of its {fmt(shutdown)} °C shutdown temperature",
            Action.CHECK_COOLING,
            Runbook.GPU_THERMAL_SHUTDOWN,
        )
    if temp >= slowdown - config.slowdown_margin_c:
        return Problem(
            Severity.WARN,
            f"GPU at {fmt(temp)} °C, near its {fmt(slowdown)} °C slowdown temperature",
            Action.CHECK_COOLING,
            Runbook.GPU_THERMAL_SLOWDOWN,
        )
    return None


def _memory_temperature(view: GpuView) -> Problem | None:
    # The memory maximum is where HBM starts throttling, the memory's slowdown point, so
    # it gets the slowdown margin and WARN; it has no separate shutdown threshold.
    temp, limit = view.readings.memory_temperature_c, view.identity.temperature_memory_max_c
    if temp is None or limit is None or limit <= 0:
        return None
    if temp < limit - view.config.thermal.slowdown_margin_c:
        return None
    return Problem(
        Severity.WARN,
        f"memory at {fmt(temp)} °C, near its {fmt(limit)} °C maximum",
        Action.CHECK_COOLING,
        Runbook.GPU_MEMORY_THERMAL,
    )


def _throttling(mask: int | None) -> Problem | None:
    active = active_throttle_reasons(mask)
    if not active:
        return None
    # A power brake alone is an external signal (power supply or chassis), not heat.
    thermal = bool(mask is not None and mask & _THERMAL_BITS)
    return Problem(
        Severity.WARN,
        f"clocks throttled: {', '.join(active)}",
        Action.CHECK_COOLING if thermal else Action.CHECK_POWER,
        Runbook.GPU_CLOCKS_THROTTLED,
    )


def check_thermal(view: GpuView) -> Outcome:
    identity, readings, config = view.identity, view.readings, view.config.thermal
    slowdown = _threshold(identity.temperature_slowdown_c, config.fallback_slowdown_c)
    shutdown = _threshold(identity.temperature_shutdown_c, config.fallback_shutdown_c)
    evidence: Evidence = (
        ("temperature_c", readings.temperature_c),
        ("slowdown_c", slowdown),
        ("shutdown_c", shutdown),
        ("memory_temperature_c", readings.memory_temperature_c),
        ("memory_max_c", identity.temperature_memory_max_c),
        ("clock_event_reasons", readings.clock_event_reasons),
    )
    found = (
        _gpu_temperature(view, slowdown, shutdown),
        _memory_temperature(view),
        _throttling(readings.clock_event_reasons),
    )
    problems = tuple(p for p in found if p is not None)
    if readings.temperature_c is None:
        return Outcome("temperature not reported; no thermal throttling", evidence, problems)
    ok = f"GPU at {fmt(readings.temperature_c)} °C, below its {fmt(slowdown)} °C slowdown"
    return Outcome(ok, evidence, problems)
