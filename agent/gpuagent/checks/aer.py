"""``aer``: PCIe Advanced Error Reporting on the GPU and every bridge above it.

Two sources count: the kernel's AER reports (kernel-log events naming the GPU or one of
its bridges) and the AER totals sysfs keeps per PCI function. An uncorrectable error
(non-fatal or fatal) is CRITICAL: the link dropped or corrupted a transaction, and the
NVIDIA driver cannot recover a GPU from it. Corrected errors are only a problem when
they come fast, which points at signal integrity (riser, cable, slot).
"""

from __future__ import annotations

from gpuagent.checks.common import EventView, Evidence, Outcome, Problem, fmt, plural
from gpuagent.checks.eventindex import event_evidence, newest, recent
from gpuagent.checks.memory import GpuMemory, MemoryChanges
from gpuagent.checks.vocabulary import Action, Runbook
from gpuagent.config import AerCheck
from gpuagent.model import GpuEvent, PcieLink, PciePath, Severity

# One corrected error prints an announcement from the root port ("AER: Corrected error
# received: ...") and a report from the function that saw it ("PCIe Bus Error:
# severity=Corrected, ..."). Only the report is counted, so the rate counts errors.
_REPORT_MARK = "severity="


def _functions(path: PciePath | None) -> tuple[PcieLink, ...]:
    return () if path is None else (path.device, *path.bridges)


def _uncorrectable(link: PcieLink) -> int | None:
    if link.aer_nonfatal is None and link.aer_fatal is None:
        return None
    return (link.aer_nonfatal or 0) + (link.aer_fatal or 0)


def _corrected_sample(functions: tuple[PcieLink, ...]) -> tuple[int | None, str]:
    reporting = [f for f in functions if f.aer_correctable is not None]
    if not reporting:
        return None, ""
    total = sum(f.aer_correctable or 0 for f in reporting)
    return total, ",".join(f.address for f in reporting)


def _baseline(
    previous: tuple[tuple[str, int], ...], functions: tuple[PcieLink, ...]
) -> tuple[tuple[str, int], ...]:
    """Each function's first-seen uncorrectable total, restarted when the counter went down.

    Without sysfs data this time (no path) the old baselines stay: a missed read is not
    a reset. Functions no longer above the GPU are forgotten.
    """
    if not functions:
        return previous
    before = dict(previous)
    kept: list[tuple[str, int]] = []
    for link in functions:
        value, seen = _uncorrectable(link), before.get(link.address)
        if value is not None and (seen is None or value < seen):
            kept.append((link.address, value))
        elif seen is not None:
            kept.append((link.address, seen))
    return tuple(kept)


def remember_aer(
    memory: GpuMemory, path: PciePath | None, config: AerCheck, now: float
) -> MemoryChanges:
    """Add this evaluation's sysfs AER sample (none without sysfs data: samples only age)."""
    functions = _functions(path)
    value, source = _corrected_sample(functions)
    if value is None:
        source = memory.aer_corrected.source
    series = memory.aer_corrected.observe(now, value, source, config.rate_window_seconds)
    baseline = _baseline(memory.aer_uncorrectable_baseline, functions)
    return MemoryChanges(aer_corrected=series, aer_uncorrectable_baseline=baseline)


def _new_uncorrectable(view: EventView) -> dict[str, int]:
    """Uncorrectable errors sysfs counted since the agent started watching, by function."""
    baseline = dict(view.memory.aer_uncorrectable_baseline)
    grown: dict[str, int] = {}
    for link in view.functions():
        value, seen = _uncorrectable(link), baseline.get(link.address)
        if value is not None and seen is not None and value > seen:
            grown[link.address] = value - seen
    return grown


def _where(view: EventView, address: str | None) -> str:
    if address is None or address == view.bus_id:
        return "the GPU"
    return f"bridge {address}"


def _uncorrectable_problems(
    view: EventView, events: list[GpuEvent], grown: dict[str, int]
) -> list[Problem]:
    problems = []
    last = newest(events)
    if last is not None:
        reason = (
            f"{plural(len(events), 'uncorrectable PCIe error report')} in the kernel log "
            f"(last: {last.aer_severity} on {_where(view, last.gpu)})"
        )
        problems.append(_critical(reason))
    if grown:
        where = ", ".join(f"{n} on {_where(view, a)}" for a, n in grown.items())
        total = plural(sum(grown.values()), "new uncorrectable PCIe error")
        reason = f"{total} in sysfs AER ({where})"
        problems.append(_critical(reason))
    return problems


def _critical(reason: str) -> Problem:
    return Problem(
        Severity.CRITICAL, reason, Action.DRAIN_AND_REBOOT, Runbook.GPU_AER_UNCORRECTABLE
    )


def _per_hour(count: int, window: float) -> float | None:
    # Counted against the whole window, like every rate here.
    return count / window * 3600.0 if window > 0 else None


def _corrected_rate(view: EventView, reports: int) -> tuple[float | None, float | None]:
    """(rate from sysfs, rate from kernel reports), per hour; None where not measurable."""
    window = view.config.aer.rate_window_seconds
    series = view.memory.aer_corrected.rate(window)
    sysfs = None if series is None else series.per_second * 3600.0
    return sysfs, _per_hour(reports, window)


def check_aer(view: EventView) -> Outcome:
    config = view.config.aer
    events = view.events.for_devices(view.addresses(), "aer")
    uncorrectable = [e for e in events if e.aer_severity in ("nonfatal", "fatal")]
    corrected = [e for e in events if e.aer_severity == "corrected" and _REPORT_MARK in e.line]
    in_window = recent(corrected, view.now, config.rate_window_seconds)
    sysfs_rate, events_rate = _corrected_rate(view, len(in_window))
    # Both sources count the same errors (the kernel logs what sysfs counts, unless it
    # rate-limits its printing), so the larger rate is the truth, not their sum.
    rates = [r for r in (sysfs_rate, events_rate) if r is not None]
    rate = max(rates) if rates else None
    grown = _new_uncorrectable(view)
    last = newest(uncorrectable) or newest(events)
    evidence: Evidence = (
        ("functions", len(view.functions())),
        ("uncorrectable_events", len(uncorrectable)),
        ("uncorrectable_new_in_sysfs", sum(grown.values())),
        ("corrected_events_in_window", len(in_window)),
        ("corrected_rate_per_hour", rate),
        ("corrected_sysfs_rate_per_hour", sysfs_rate),
        ("corrected_events_rate_per_hour", events_rate),
        ("corrected_rate_limit_per_hour", config.corrected_rate_per_hour),
        ("rate_window_seconds", config.rate_window_seconds),
        ("device", None if last is None else last.gpu),
        *event_evidence(last),
    )
    problems = _uncorrectable_problems(view, uncorrectable, grown)
    if rate is not None and rate > config.corrected_rate_per_hour:
        reason = (
            f"{fmt(rate)} corrected PCIe errors per hour, "
            f"above {fmt(config.corrected_rate_per_hour)}"
        )
        action, runbook = Action.RESEAT_OR_REPLACE, Runbook.GPU_AER_CORRECTED_RATE
        problems.append(Problem(Severity.WARN, reason, action, runbook))
    ok = "no uncorrectable PCIe errors; corrected error rate normal"
    return Outcome(ok, evidence, tuple(problems))
