"""``pcie``: a link running below its maximum generation or width, and link replays.

GPUs drop the link generation at idle to save power, so a lower generation only counts
as degraded while the GPU is busy; a narrower link is never a power-saving state. Either
must persist for ``degraded_hold_seconds`` so a link still training after a reset is not
flagged. Replays (link-level retransmissions) point at signal integrity problems: a
riser, a cable or a badly seated card.
"""

from __future__ import annotations

from dataclasses import replace

from gpuagent.checks.common import Evidence, GpuView, Outcome, Problem, fmt
from gpuagent.checks.memory import GpuMemory
from gpuagent.checks.vocabulary import Action, Runbook
from gpuagent.config import PcieCheck
from gpuagent.model import GpuIdentity, GpuReadings, Severity

# The configuration gives the replay limit per minute but no window; five minutes smooths
# single bursts while still reacting within one typical scrape-to-alert cycle.
REPLAY_WINDOW_SECONDS = 300.0


def _busy(readings: GpuReadings, config: PcieCheck) -> bool:
    util = readings.utilization_gpu_pct
    return util is not None and util >= config.degraded_min_utilization_pct


def link_shortfall(identity: GpuIdentity, readings: GpuReadings, config: PcieCheck) -> str:
    """Which part of the link counts as degraded right now ("" when none), e.g. "x8 of x16"."""
    parts: list[str] = []
    gen, max_gen = readings.pcie_generation, identity.pcie_max_generation
    if gen is not None and max_gen is not None and gen < max_gen and _busy(readings, config):
        parts.append(f"Gen{gen} of Gen{max_gen}")
    width, max_width = readings.pcie_width, identity.pcie_max_width
    if width is not None and max_width is not None and width < max_width:
        parts.append(f"x{width} of x{max_width}")
    return ", ".join(parts)


def remember_link(
    memory: GpuMemory,
    identity: GpuIdentity,
    readings: GpuReadings | None,
    config: PcieCheck,
    now: float,
) -> GpuMemory:
    """Add this poll's replay sample and update when the link was first seen degraded.

    An unread GPU (``readings`` None) ages old samples and breaks the degraded run: a
    poll that saw nothing cannot vouch that the link stayed degraded.
    """
    count = None if readings is None else readings.pcie_replay_count
    replay = memory.pcie_replay.observe(now, count, "replay", REPLAY_WINDOW_SECONDS)
    since = memory.pcie_degraded_since
    if readings is None or not link_shortfall(identity, readings, config):
        since = None  # the hold time counts one unbroken run of degraded polls
    elif since is None or since > now:
        since = now
    return replace(memory, pcie_replay=replay, pcie_degraded_since=since)


def _link_text(readings: GpuReadings) -> str:
    parts = []
    if readings.pcie_generation is not None:
        parts.append(f"Gen{readings.pcie_generation}")
    if readings.pcie_width is not None:
        parts.append(f"x{readings.pcie_width}")
    return " ".join(parts)


def _degraded(view: GpuView, shortfall: str, held: float | None) -> tuple[Problem | None, str]:
    """The degraded-link problem (once held long enough) and the OK text otherwise."""
    if not shortfall or held is None:
        link = _link_text(view.readings)
        return None, f"PCIe link at {link}, not degraded" if link else "PCIe link not reported"
    hold = view.config.pcie.degraded_hold_seconds
    if held > hold:
        reason = f"PCIe link degraded ({shortfall}) for {fmt(held)} s"
        action, runbook = Action.RESEAT_OR_REPLACE, Runbook.GPU_PCIE_DEGRADED
        return Problem(Severity.WARN, reason, action, runbook), reason
    return None, f"PCIe link below max ({shortfall}) for {fmt(held)} s; flagged after {fmt(hold)} s"


def _replays(view: GpuView) -> tuple[Problem | None, float | None]:
    """The replay-rate problem, if any, and the rate per minute (None until measurable)."""
    rate = view.memory.pcie_replay.rate(REPLAY_WINDOW_SECONDS)
    if rate is None:
        return None, None
    per_minute = rate.per_second * 60.0
    limit = view.config.pcie.replay_rate_per_minute
    if per_minute <= limit:
        return None, per_minute
    reason = (
        f"{fmt(per_minute)} PCIe replays per minute "
        f"({rate.increase} in {fmt(rate.span_seconds)} s), above {fmt(limit)}"
    )
    problem = Problem(Severity.WARN, reason, Action.RESEAT_OR_REPLACE, Runbook.GPU_PCIE_REPLAY)
    return problem, per_minute


def check_pcie(view: GpuView) -> Outcome:
    identity, readings, config = view.identity, view.readings, view.config.pcie
    shortfall = link_shortfall(identity, readings, config)
    since = view.memory.pcie_degraded_since
    held = None if since is None else max(0.0, view.now - since)
    degraded, ok_reason = _degraded(view, shortfall, held)
    replays, per_minute = _replays(view)
    evidence: Evidence = (
        ("pcie_generation", readings.pcie_generation),
        ("pcie_max_generation", identity.pcie_max_generation),
        ("pcie_width", readings.pcie_width),
        ("pcie_max_width", identity.pcie_max_width),
        ("utilization_gpu_pct", readings.utilization_gpu_pct),
        ("degraded_seconds", held),
        ("degraded_hold_seconds", config.degraded_hold_seconds),
        ("replay_count", readings.pcie_replay_count),
        ("replay_rate_per_minute", per_minute),
        ("replay_rate_limit_per_minute", config.replay_rate_per_minute),
        ("replay_window_seconds", REPLAY_WINDOW_SECONDS),
    )
    problems = tuple(p for p in (degraded, replays) if p is not None)
    return Outcome(ok_reason, evidence, problems)
