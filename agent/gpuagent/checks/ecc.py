"""``ecc``: uncorrectable errors, the corrected-error rate, and ECC being switched off.

NVML's volatile counters count since the last driver load or GPU reset, so any volatile
double-bit error (DBE) is a new one that the running workload may have seen. The
single-bit (SBE) rate comes from the aggregate counter, which survives resets, and falls
back to the volatile counter on GPUs that only report that.
"""

from __future__ import annotations

from gpuagent.checks.common import GpuView, Outcome, Problem, fmt, plural
from gpuagent.checks.memory import GpuMemory, MemoryChanges, Rate
from gpuagent.checks.vocabulary import Action, Runbook
from gpuagent.config import EccCheck
from gpuagent.model import GpuIdentity, GpuReadings, Severity


def _sbe_counter(readings: GpuReadings) -> tuple[int | None, str]:
    if readings.ecc_sbe_aggregate is not None:
        return readings.ecc_sbe_aggregate, "aggregate"
    return readings.ecc_sbe_volatile, "volatile"


def remember_sbe(
    memory: GpuMemory, readings: GpuReadings | None, config: EccCheck, now: float
) -> MemoryChanges:
    """Add this poll's SBE sample; an unread GPU (``readings`` None) only ages old samples."""
    value, source = (None, memory.sbe.source) if readings is None else _sbe_counter(readings)
    sbe = memory.sbe.observe(now, value, source, config.rate_window_seconds)
    return MemoryChanges(sbe=sbe)


def _supported(readings: GpuReadings) -> bool:
    values = (
        readings.ecc_enabled,
        readings.ecc_sbe_volatile,
        readings.ecc_dbe_volatile,
        readings.ecc_sbe_aggregate,
        readings.ecc_dbe_aggregate,
    )
    return any(v is not None for v in values)


def _dbe_problem(dbe: int | None) -> Problem | None:
    if dbe is None or dbe <= 0:
        return None
    return Problem(
        Severity.CRITICAL,
        f"{plural(dbe, 'uncorrectable ECC error')} since the last reset",
        Action.DRAIN_AND_RESET,
        Runbook.GPU_ECC_DBE,
    )


def _sbe_rate_problem(rate: Rate | None, limit_per_hour: float) -> Problem | None:
    # Judged on the errors counted against the whole window (see Rate.per_second), so one
    # error just after a start is no alarm. The reason states what was seen: the count, the
    # span it came in and the rate that really is; judged above the limit, that rate is too.
    if rate is None or rate.per_second * 3600.0 <= limit_per_hour:
        return None
    seen_per_hour = rate.increase / rate.span_seconds * 3600.0
    return Problem(
        Severity.WARN,
        f"{plural(rate.increase, 'corrected ECC error')} in {fmt(rate.span_seconds)} s "
        f"(about {round(seen_per_hour):,} per hour), above {fmt(limit_per_hour)} per hour",
        Action.INVESTIGATE,
        Runbook.GPU_ECC_SBE_RATE,
    )


def _disabled_problem(enabled: bool | None, identity: GpuIdentity) -> Problem | None:
    # Off is a fault only on a board that ships with it on: consumer and workstation boards
    # ship with ECC off, and off is then their normal state, not a setting someone forgot.
    if enabled is not False or not identity.ecc_on_by_default:
        return None
    return Problem(
        Severity.WARN,
        "ECC is disabled (this board ships with it on)",
        Action.ENABLE_ECC,
        Runbook.GPU_ECC_DISABLED,
    )


def check_ecc(view: GpuView) -> Outcome:
    readings, config = view.readings, view.config.ecc
    rate = view.memory.sbe.rate(view.config.ecc.rate_window_seconds)
    evidence = (
        ("ecc_enabled", readings.ecc_enabled),
        ("ecc_default", view.identity.ecc_default),
        ("dbe_volatile", readings.ecc_dbe_volatile),
        ("sbe_volatile", readings.ecc_sbe_volatile),
        ("dbe_aggregate", readings.ecc_dbe_aggregate),
        ("sbe_aggregate", readings.ecc_sbe_aggregate),
        ("sbe_rate_per_hour", None if rate is None else rate.per_second * 3600.0),
        ("sbe_rate_limit_per_hour", config.sbe_rate_per_hour),
        ("sbe_rate_counter", view.memory.sbe.source or None),
        ("sbe_rate_span_seconds", None if rate is None else rate.span_seconds),
        ("sbe_rate_samples", None if rate is None else rate.samples),
    )
    if not _supported(readings):
        return Outcome("ECC not supported", evidence)
    found = (
        _dbe_problem(readings.ecc_dbe_volatile),
        _sbe_rate_problem(rate, config.sbe_rate_per_hour),
        _disabled_problem(readings.ecc_enabled, view.identity),
    )
    problems = tuple(p for p in found if p is not None)
    if readings.ecc_enabled is False:
        return Outcome("ECC off, as this board ships", evidence, problems)
    return Outcome("no uncorrectable ECC errors; corrected error rate normal", evidence, problems)
