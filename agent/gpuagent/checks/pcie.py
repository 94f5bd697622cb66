"""``pcie``: a link running below its maximum generation or width, and link replays.

GPUs drop the link generation at idle to save power, so a lower generation only counts
as degraded while the GPU is busy; a narrower link is never a power-saving state. Either
must persist for ``degraded_hold_seconds`` so a link still training after a reset is not
flagged. Replays (link-level retransmissions) point at signal integrity problems: a
riser, a cable or a badly seated card.

The bridges above the GPU (from sysfs) are held to the same rules: an upstream link that
trained low (say between a PCIe switch and the root port) halves the GPU's bandwidth
while NVML, which only sees the GPU's own link, reports nothing wrong.
"""

from __future__ import annotations

from collections.abc import Callable

from gpuagent.checks.common import Evidence, GpuView, Outcome, Problem, fmt
from gpuagent.checks.memory import GpuMemory, MemoryChanges
from gpuagent.checks.vocabulary import Action, Runbook
from gpuagent.config import PcieCheck
from gpuagent.model import GpuIdentity, GpuReadings, PcieLink, PciePath, Severity

# The configuration gives the replay limit per minute but no window; five minutes smooths
# single bursts while still reacting within one typical scrape-to-alert cycle.
REPLAY_WINDOW_SECONDS = 300.0


def _busy(readings: GpuReadings, config: PcieCheck) -> bool:
    util = readings.utilization_gpu_pct
    return util is not None and util >= config.degraded_min_utilization_pct


def link_shortfall(identity: GpuIdentity, readings: GpuReadings, config: PcieCheck) -> str:
    """Which part of the link counts as degraded right now ("" when none), e.g. "x8 of x16".
    The link is held against what the platform is configured to give (expected_width,
    expected_generation), else the GPU's maximum."""
    parts: list[str] = []
    gen = readings.pcie_generation
    max_gen = config.expected_generation or identity.pcie_max_generation
    if gen is not None and max_gen is not None and gen < max_gen and _busy(readings, config):
        parts.append(f"Gen{gen} of Gen{max_gen}")
    width, max_width = readings.pcie_width, config.expected_width or identity.pcie_max_width
    if width is not None and max_width is not None and width < max_width:
        parts.append(f"x{width} of x{max_width}")
    return ", ".join(parts)


def remember_link(
    memory: GpuMemory,
    identity: GpuIdentity,
    readings: GpuReadings | None,
    config: PcieCheck,
    now: float,
) -> MemoryChanges:
    """Add this poll's replay sample and update when the link was first seen degraded.

    An unread GPU (``readings`` None) ages old samples and breaks the degraded run: a
    poll that saw nothing cannot vouch that the link stayed degraded.
    """
    count = None if readings is None else readings.pcie_replay_count
    # The counter is read with the slow counters: the sample is theirs in time.
    at = now if readings is None else readings.counters_sampled_at(now)
    replay = memory.pcie_replay.observe(at, count, "replay", REPLAY_WINDOW_SECONDS)
    since = memory.pcie_degraded_since
    if readings is None or not link_shortfall(identity, readings, config):
        since = None  # the hold time counts one unbroken run of degraded polls
    elif since is None or since > now:
        since = now
    return MemoryChanges(pcie_replay=replay, pcie_degraded_since=since)


def _cap(
    own: float | None, partners: list[PcieLink], maximum: Callable[[PcieLink], float | None]
) -> float | None:
    """What a link can train to: its own maximum, capped by the partners' maximums."""
    if own is None:
        return None
    caps = [cap for cap in map(maximum, partners) if cap is not None]
    return min([own, *caps])


def _bridge_shortfall(bridge: PcieLink, partners: list[PcieLink], busy: bool) -> str:
    # sysfs does not say which neighbour is a bridge's link partner (a downstream port's
    # partner is below it, an upstream port's above), so both neighbours cap the
    # expectation: a Gen5 root port above a Gen4 switch is not degraded at Gen4.
    parts: list[str] = []
    speed = bridge.current_speed_gts
    speed_cap = _cap(bridge.max_speed_gts, partners, lambda p: p.max_speed_gts)
    if busy and speed is not None and speed_cap is not None and speed < speed_cap:
        parts.append(f"{fmt(speed)} of {fmt(speed_cap)} GT/s")
    width = bridge.current_width
    width_cap = _cap(bridge.max_width, partners, lambda p: p.max_width)
    if width is not None and width_cap is not None and width < width_cap:
        parts.append(f"x{width} of x{fmt(width_cap)}")
    return ", ".join(parts)


def bridge_shortfalls(
    path: PciePath | None, readings: GpuReadings, config: PcieCheck
) -> list[tuple[str, str]]:
    """(bus id, shortfall) of every bridge above the GPU whose link counts as degraded.

    As for the GPU, a lower speed only counts while the GPU is busy: the bridge port right
    above the GPU shares the GPU's link, which slows down at idle.
    """
    if path is None:
        return []
    nodes = (path.device, *path.bridges)
    busy = _busy(readings, config)
    found = []
    for i in range(1, len(nodes)):
        partners = [nodes[i - 1], *nodes[i + 1 : i + 2]]
        shortfall = _bridge_shortfall(nodes[i], partners, busy)
        if shortfall:
            found.append((nodes[i].address, shortfall))
    return found


def remember_bridges(
    memory: GpuMemory,
    path: PciePath | None,
    readings: GpuReadings | None,
    config: PcieCheck,
    now: float,
) -> MemoryChanges:
    """Start or continue the hold time of each degraded bridge; others (and all, when the
    GPU could not be read) stop theirs."""
    if readings is None:
        return MemoryChanges(bridge_degraded_since=())
    before = dict(memory.bridge_degraded_since)
    since = []
    for address, _ in bridge_shortfalls(path, readings, config):
        started = before.get(address)
        since.append((address, now if started is None or started > now else started))
    return MemoryChanges(bridge_degraded_since=tuple(since))


def _bridges(view: GpuView) -> tuple[list[Problem], Evidence]:
    """Problems for bridges degraded longer than the hold time, and their evidence."""
    shortfalls = bridge_shortfalls(view.path, view.readings, view.config.pcie)
    since = dict(view.memory.bridge_degraded_since)
    hold = view.config.pcie.degraded_hold_seconds
    problems, longest = [], None
    for address, shortfall in shortfalls:
        held = max(0.0, view.now - since.get(address, view.now))
        longest = held if longest is None else max(longest, held)
        if held > hold:
            reason = f"PCIe bridge {address} above the GPU degraded ({shortfall}) for {fmt(held)} s"
            problems.append(
                Problem(
                    Severity.WARN,
                    reason,
                    Action.RESEAT_OR_REPLACE,
                    Runbook.GPU_PCIE_BRIDGE_DEGRADED,
                )
            )
    evidence: Evidence = (
        ("bridges", None if view.path is None else len(view.path.bridges)),
        ("bridges_degraded", "; ".join(f"{a} ({s})" for a, s in shortfalls) or None),
        ("bridge_degraded_seconds", longest),
    )
    return problems, evidence


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
    bridge_problems, bridge_evidence = _bridges(view)
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
        *bridge_evidence,
    )
    problems = (*(p for p in (degraded, replays) if p is not None), *bridge_problems)
    return Outcome(ok_reason, evidence, problems)
