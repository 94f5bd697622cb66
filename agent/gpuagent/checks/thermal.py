"""``thermal``: GPU and memory temperature against their thresholds, and throttling.

Thresholds come from the GPU itself (NVML reports slowdown and shutdown temperatures)
and fall back to the configured values on GPUs that do not report them.

Throttling is judged by what it costs, not by the reason bits: healthy idle H100s report
HW Slowdown and HW Power Brake as active for hours (real captures show it on every GPU of
a node), and an idle GPU loses nothing to it. So a throttle finding needs a busy GPU whose
clocks NVML's own duration counters (the thermal and power-brake perf-policy / clock event
counters, in ns) show held back for a good share of a window, and an SM clock below its
maximum. One sample, such as a replayed `nvidia-smi -q`, can never show that. The bits are
still exported and named in the OK reason.
"""

from __future__ import annotations

from gpuagent.checks.common import Evidence, GpuView, Outcome, Problem, fmt
from gpuagent.checks.memory import CounterSeries, GpuMemory, MemoryChanges
from gpuagent.checks.vocabulary import Action, Runbook
from gpuagent.config import ThermalCheck
from gpuagent.model import GpuReadings, Severity

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


def _threshold(reported: float | None, fallback: float) -> float:
    # NVML reports 0 on some boards that do not really know the value.
    return reported if reported is not None and reported > 0 else fallback


def active_throttle_reasons(mask: int | None) -> tuple[str, ...]:
    if mask is None:
        return ()
    return tuple(name for bit, name in THROTTLE_REASONS if mask & bit)


def _versus(temp: float, limit: float) -> str:
    """How a temperature stands to a limit, in the words a reason uses: "above its", "at
    its" or "near its". Compared as printed, so "at its 95 °C" never shows 95.04 °C."""
    shown, bound = round(temp, 1), round(limit, 1)
    if shown > bound:
        return "above its"
    return "at its" if shown == bound else "near its"


def _gpu_temperature(view: GpuView, slowdown: float, shutdown: float) -> Problem | None:
    temp, config = view.readings.temperature_c, view.config.thermal
    if temp is None:
        return None
    if temp >= shutdown - config.shutdown_margin_c:
        where = _versus(temp, shutdown)
        if where == "near its":
            where = f"within {fmt(config.shutdown_margin_c)} °C of its"
        return Problem(
            Severity.CRITICAL,
            f"GPU at {fmt(temp)} °C, {where} {fmt(shutdown)} °C shutdown temperature",
            Action.CHECK_COOLING,
            Runbook.GPU_THERMAL_SHUTDOWN,
        )
    if temp >= slowdown - config.slowdown_margin_c:
        return Problem(
            Severity.WARN,
            f"GPU at {fmt(temp)} °C, {_versus(temp, slowdown)} {fmt(slowdown)} °C slowdown "
            "temperature",
            Action.CHECK_COOLING,
            Runbook.GPU_THERMAL_SLOWDOWN,
        )
    return None


def _memory_temperature(view: GpuView) -> Problem | None:
    # The memory maximum is the highest temperature HBM is specified to run at: near it
    # (within the slowdown margin) or at it is a warning; above it the memory runs out of
    # its specification, a fault (CRITICAL), the same as the GPU near its shutdown.
    temp, limit = view.readings.memory_temperature_c, view.identity.temperature_memory_max_c
    if temp is None or limit is None or limit <= 0:
        return None
    if temp < limit - view.config.thermal.slowdown_margin_c:
        return None
    where = _versus(temp, limit)
    return Problem(
        Severity.CRITICAL if where == "above its" else Severity.WARN,
        f"memory at {fmt(temp)} °C, {where} {fmt(limit)} °C maximum",
        Action.CHECK_COOLING,
        Runbook.GPU_MEMORY_THERMAL,
    )


def _busy(readings: GpuReadings, config: ThermalCheck) -> bool:
    util = readings.utilization_gpu_pct
    if util is None:  # MIG mode: no whole-GPU utilization, but processes say it works
        return bool(readings.processes)
    return util >= config.throttle_min_utilization_pct


def throttle_counter(readings: GpuReadings) -> tuple[int | None, str]:
    """Nanoseconds the clocks were held back by heat or the power brake, and which
    counters make up the number (a different mix starts a new series)."""
    thermal, source = readings.violation_thermal_ns, "thermal_policy"
    if thermal is None:
        parts = (readings.throttle_sw_thermal_ns, readings.throttle_hw_thermal_ns)
        if any(p is not None for p in parts):
            thermal, source = sum(p or 0 for p in parts), "thermal_reasons"
    brake = readings.throttle_hw_power_brake_ns
    if thermal is None and brake is None:
        return None, ""
    return (thermal or 0) + (brake or 0), source if brake is None else f"{source}+brake"


def remember_throttle(
    memory: GpuMemory, readings: GpuReadings | None, config: ThermalCheck, now: float
) -> MemoryChanges:
    """Sample the throttle counters while the GPU is busy; an idle or unread poll ends the
    series, so the share is only ever measured over busy time."""
    if readings is None or not _busy(readings, config):
        return MemoryChanges(throttle=CounterSeries())
    value, source = throttle_counter(readings)
    # The counters are read less often than the poll runs: the sample is theirs in time.
    at = readings.counters_sampled_at(now)
    series = memory.throttle.observe(at, value, source, config.throttle_window_seconds)
    return MemoryChanges(throttle=series)


def throttled_share(view: GpuView) -> float | None:
    """Share of the window (0..1) the busy GPU was throttled, or None until measurable."""
    rate = view.memory.throttle.rate(view.config.thermal.throttle_window_seconds)
    if rate is None:
        return None
    return min(rate.per_second / 1e9, 1.0)


def _throttling(view: GpuView, share: float | None) -> Problem | None:
    readings, config = view.readings, view.config.thermal
    if share is None or share < config.throttle_min_fraction:
        return None
    clock, top = readings.sm_clock_mhz, view.identity.sm_clock_max_mhz
    if clock is not None and top is not None and clock >= top:
        return None  # counted, but the SM clock is not held below its maximum
    mask = readings.clock_event_reasons
    active = active_throttle_reasons(mask)
    clocks = f"; SM clock {clock} of {top} MHz" if clock is not None and top else ""
    # A power brake alone is an external signal (power supply or chassis), not heat; HW
    # Slowdown is asserted by either cause, so it names heat only without the brake.
    thermal = mask is None or bool(
        mask & (SW_THERMAL_SLOWDOWN | HW_THERMAL_SLOWDOWN)
        or (mask & HW_SLOWDOWN and not mask & HW_POWER_BRAKE_SLOWDOWN)
    )
    return Problem(
        Severity.WARN,
        f"clocks held back {fmt(share * 100)}% of the last "
        f"{fmt(config.throttle_window_seconds)} s while busy"
        f"{' (' + ', '.join(active) + ')' if active else ''}{clocks}",
        Action.CHECK_COOLING if thermal else Action.CHECK_POWER,
        Runbook.GPU_CLOCKS_THROTTLED,
    )


def _ok_reason(view: GpuView, slowdown: float, share: float | None) -> str:
    readings = view.readings
    if readings.temperature_c is None:
        text = "temperature not reported"
    else:
        text = f"GPU at {fmt(readings.temperature_c)} °C, below its {fmt(slowdown)} °C slowdown"
    active = active_throttle_reasons(readings.clock_event_reasons)
    if not active:
        return text
    if not _busy(readings, view.config.thermal):
        cost = "the GPU is idle"
    elif share is None:
        cost = "not yet measured over a window"
    else:
        cost = f"throttled {fmt(share * 100)}% of the window"
    return f"{text}; {', '.join(active)} asserted, not costing performance ({cost})"


def check_thermal(view: GpuView) -> Outcome:
    identity, readings, config = view.identity, view.readings, view.config.thermal
    slowdown = _threshold(identity.temperature_slowdown_c, config.fallback_slowdown_c)
    shutdown = _threshold(identity.temperature_shutdown_c, config.fallback_shutdown_c)
    share = throttled_share(view)
    evidence: Evidence = (
        ("temperature_c", readings.temperature_c),
        ("slowdown_c", slowdown),
        ("shutdown_c", shutdown),
        ("memory_temperature_c", readings.memory_temperature_c),
        ("memory_max_c", identity.temperature_memory_max_c),
        ("clock_event_reasons", readings.clock_event_reasons),
        ("utilization_gpu_pct", readings.utilization_gpu_pct),
        ("sm_clock_mhz", readings.sm_clock_mhz),
        ("sm_clock_max_mhz", identity.sm_clock_max_mhz),
        ("throttled_share", share),
        ("throttle_window_seconds", config.throttle_window_seconds),
    )
    found = (
        _gpu_temperature(view, slowdown, shutdown),
        _memory_temperature(view),
        _throttling(view, share),
    )
    problems = tuple(p for p in found if p is not None)
    return Outcome(_ok_reason(view, slowdown, share), evidence, problems)
