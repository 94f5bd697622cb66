"""The planner: which remediation actions a snapshot calls for, given what was done before.

Pure: it reads the snapshot, the history the executor keeps and the configuration, and
returns actions. It never calls NVML, reads a file or the clock (``now`` is monotonic
seconds, the base of ``History.cool_since`` and ``History.healthy_since``), so the same
inputs always give the same plan, in the same order. Whether a planned action is carried
out (mode, kill switch, cooldown, budget, preconditions) is the executor's business; the
planner says what the findings ask for, every cycle, and leaves out only what the history
shows is done already or what could never help.

The order is fixed: the cordon first (a reset may require it), then per GPU in index
order enable_persistence (or report), cap_power, reset_gpu; then the undo actions,
restore_power per GPU and uncordon last. See docs/remediation-policy.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpuagent.checks.vocabulary import Action
from gpuagent.config import RemediationRule, RemediationSection
from gpuagent.model import EvidenceValue, Finding, GpuState, NodeSnapshot, Severity
from gpuagent.remediation.types import ActionKind, History, PlannedAction

THERMAL = "thermal"
# Cordon reasons end up in a Slurm reason, a Kubernetes condition and the audit trail:
# one line, short enough to read in `sinfo -R` and `kubectl describe node`.
MAX_CORDON_REASON = 300
PERSISTENCED_REPORT = (
    "nvidia-persistenced is installed but persistence mode is off: "
    "start nvidia-persistenced rather than setting it by hand"
)
# What a check recommends when a GPU reset cannot fix its finding: the GPU is unreachable
# (reboot), out of spare memory rows or past the retirement limit (replace), or in a state
# with no safe automatic fix (support). A reset there only kills the work on the GPU, and
# a finding that outlives every reset would ask for one again each budget window.
_RESET_CANNOT_HELP = frozenset(
    {Action.DRAIN_AND_REBOOT, Action.REBOOT, Action.RESEAT_OR_REPLACE, Action.CONTACT_SUPPORT}
)
# UNKNOWN is what we cannot see; acting on it would be acting on a guess.
_ACTIONABLE = frozenset({Severity.WARN, Severity.CRITICAL})


@dataclass(frozen=True, slots=True)
class _Ask:
    """One finding asking, through one rule, for one action."""

    kind: ActionKind  # one of RemediationRule.actions
    finding: Finding
    position: int  # the finding's place in the snapshot; ties go to the earlier one
    cordon_text: str  # what this finding adds to a cordon reason


# --- matching -----------------------------------------------------------------------------


def rule_matches(rule: RemediationRule, finding: Finding) -> bool:
    """Whether ``rule`` applies to ``finding``: same check, at least the rule's severity
    (never UNKNOWN), for rules naming finding actions one of them, and for rules naming
    XID buckets or XIDs, one of them."""
    if rule.check != finding.check or finding.severity not in _ACTIONABLE:
        return False
    if finding.severity.rank < Severity[rule.severity].rank:
        return False
    if rule.finding_actions and finding.action not in rule.finding_actions:
        return False
    return _xid_filter_matches(rule, finding)


def _xid_filter_matches(rule: RemediationRule, finding: Finding) -> bool:
    if not rule.xid_buckets and not rule.xids:
        return True
    evidence = finding.evidence_dict()
    bucket = evidence.get("catalog_action")
    xid = evidence.get("xid")
    by_bucket = isinstance(bucket, str) and bucket in rule.xid_buckets
    # bool is an int to Python; an evidence value True is no XID number.
    by_xid = isinstance(xid, int) and not isinstance(xid, bool) and xid in rule.xids
    return by_bucket or by_xid


def reset_can_help(finding: Finding) -> bool:
    """False when the finding's own check recommends something no reset achieves."""
    return finding.action not in _RESET_CANNOT_HELP


def _asks(findings: Sequence[Finding], rules: Sequence[RemediationRule]) -> list[_Ask]:
    asks: list[_Ask] = []
    for position, finding in enumerate(findings):
        if finding.severity not in _ACTIONABLE:
            continue  # most findings are OK: no rule matches them (rule_matches says why)
        for rule in rules:
            if rule_matches(rule, finding):
                asks += _rule_asks(rule, finding, position)
    return asks


def _rule_asks(rule: RemediationRule, finding: Finding, position: int) -> list[_Ask]:
    vetoed = "reset_gpu" in rule.actions and not reset_can_help(finding)
    # A rule's cordon reason speaks for the whole rule ("reset required"); when its reset
    # is left out, the finding's own reason says why the node is cordoned instead.
    text = rule.cordon_reason if rule.cordon_reason and not vetoed else finding.reason
    kinds = [kind for kind in dict.fromkeys(rule.actions) if not (kind == "reset_gpu" and vetoed)]
    return [_Ask(kind, finding, position, text) for kind in kinds]


def _leading(asks: Iterable[_Ask]) -> _Ask | None:
    """The worst finding among ``asks``, the earliest in the snapshot among equals."""
    return min(asks, key=_worst_first, default=None)


def _worst_first(ask: _Ask) -> tuple[int, int]:
    return -ask.finding.severity.rank, ask.position


def _of_kind(asks: Iterable[_Ask], kind: ActionKind) -> list[_Ask]:
    return [a for a in asks if a.kind == kind]


# --- the plan -----------------------------------------------------------------------------


def plan(
    snapshot: NodeSnapshot, history: History, now: float, config: RemediationSection
) -> tuple[PlannedAction, ...]:
    """The actions ``snapshot`` calls for, in execution order (see the module docstring)."""
    asks = _asks(snapshot.health.findings, config.rules)
    gpus = _in_index_order(snapshot.gpus)
    actions = [*_cordon(snapshot, asks, history)]
    for gpu in gpus:
        actions += _gpu_actions(gpu, asks, history, config)
    for gpu in gpus:
        actions += _restore_power(snapshot, gpu, history, now, config)
    actions += _uncordon(snapshot, history, now, config)
    return tuple(actions)


def _in_index_order(gpus: Iterable[GpuState]) -> list[GpuState]:
    """GPUs by index, each bus id once (a duplicate listing must not plan twice)."""
    ordered: dict[str, GpuState] = {}
    for gpu in sorted(gpus, key=lambda g: (g.identity.index, g.identity.pci_bus_id)):
        ordered.setdefault(gpu.identity.pci_bus_id, gpu)
    return list(ordered.values())


def _gpu_actions(
    gpu: GpuState, asks: Sequence[_Ask], history: History, config: RemediationSection
) -> list[PlannedAction]:
    # A GPU that does not answer can be neither set nor reset: the cordon (from its
    # availability or bus finding) is all that helps; it needs a drain and a reboot.
    if gpu.status != "ok" or gpu.readings is None:
        return []
    mine = [a for a in asks if a.finding.gpu == gpu.identity.pci_bus_id]
    return [
        *_persistence(gpu, mine, history),
        *_cap_power(gpu, mine, history, config),
        *_reset(gpu, mine, history),
    ]


def _from_finding(
    kind: ActionKind, target: str, finding: Finding, *, reason: str = "", **params: float
) -> PlannedAction:
    return PlannedAction(
        kind,
        target,
        reason or finding.reason,
        check=finding.check,
        severity=finding.severity.name,
        evidence=finding.evidence,
        params=tuple(params.items()),
    )


# --- cordon -------------------------------------------------------------------------------


def _cordon(snapshot: NodeSnapshot, asks: Sequence[_Ask], history: History) -> list[PlannedAction]:
    # Cordoned by us already: the same finding next poll must not cordon again. With no
    # backend there is nobody to ask, but the cordon is planned all the same: the
    # executor refuses it ("no backend configured") and audits the cordon it would have
    # asked for, so a lost GPU is never silently left in service.
    if history.cordoned_by_us:
        return []
    # Worst first, so a reason cut to length keeps what matters most.
    cordons = sorted(_of_kind(asks, "cordon"), key=_worst_first)
    if not cordons:
        return []
    lead = cordons[0]
    parts = _unique(
        f"{_where(a.finding)}: {_one_line(a.cordon_text)} ({a.finding.check})" for a in cordons
    )
    evidence: tuple[tuple[str, EvidenceValue], ...] = (
        ("checks", ", ".join(_unique(a.finding.check for a in cordons))),
        ("gpus", ", ".join(_unique(a.finding.gpu for a in cordons if a.finding.gpu))),
        ("findings", len({a.position for a in cordons})),
    )
    return [
        PlannedAction(
            "cordon",
            snapshot.node_name,
            bounded_summary(parts, MAX_CORDON_REASON),
            check=lead.finding.check,
            severity=lead.finding.severity.name,
            evidence=evidence,
        )
    ]


def _where(finding: Finding) -> str:
    return f"GPU {finding.gpu}" if finding.gpu else "node"


def _one_line(text: str) -> str:
    """``text`` with control characters and runs of white space as single spaces."""
    printable = "".join(c if c.isprintable() else " " for c in text)
    return " ".join(printable.split())


def _unique(items: Iterable[str | None]) -> list[str]:
    return [item for item in dict.fromkeys(items) if item]


def bounded_summary(parts: Sequence[str], limit: int) -> str:
    """``parts`` joined by "; ", at most ``limit`` characters: whole parts while they fit,
    then how many were left out; a first part longer than the limit is cut with "…"."""
    text = "; ".join(parts)
    if len(text) <= limit:
        return text
    for count in range(len(parts) - 1, 0, -1):
        head = "; ".join(parts[:count]) + f"; (+{len(parts) - count} more)"
        if len(head) <= limit:
            return head
    more = f" (+{len(parts) - 1} more)" if len(parts) > 1 else ""
    return parts[0][: max(limit - len(more) - 1, 0)] + "…" + more


# --- per GPU ------------------------------------------------------------------------------


def _persistence(gpu: GpuState, asks: Sequence[_Ask], history: History) -> list[PlannedAction]:
    lead = _leading(_of_kind(asks, "enable_persistence"))
    # Only an explicit "off": None means the GPU does not report the mode.
    if lead is None or gpu.readings is None or gpu.readings.persistence_mode is not False:
        return []
    bus = gpu.identity.pci_bus_id
    if history.persistenced_installed:
        # The daemon owns the mode; setting it by hand would fight it (and be undone when
        # it starts), so tell the operator what is really wrong.
        return [_from_finding("report", bus, lead.finding, reason=PERSISTENCED_REPORT)]
    return [_from_finding("enable_persistence", bus, lead.finding)]


def _cap_power(
    gpu: GpuState, asks: Sequence[_Ask], history: History, config: RemediationSection
) -> list[PlannedAction]:
    # Only thermal findings cap: the cap is undone once the thermal check is OK again, so
    # a cap asked for by any other check would be undone straight away.
    lead = _leading(a for a in _of_kind(asks, "cap_power") if a.finding.check == THERMAL)
    bus = gpu.identity.pci_bus_id
    if lead is None or gpu.readings is None or bus in dict(history.power_capped):
        return []
    default = gpu.identity.power_default_limit_w
    previous = gpu.readings.power_limit_w
    if default is None or previous is None:
        return []  # without both limits the cap could not be set or undone exactly
    limit = round(default * config.power.cap_fraction, 3)
    # A limit already at or below the cap stays: "capping" it would raise it.
    if not (_positive(limit) and _positive(previous)) or limit >= previous:
        return []
    return [_from_finding("cap_power", bus, lead.finding, limit_w=limit, previous_w=previous)]


def _positive(value: float) -> bool:
    return math.isfinite(value) and value > 0


def _reset(gpu: GpuState, asks: Sequence[_Ask], history: History) -> list[PlannedAction]:
    bus = gpu.identity.pci_bus_id
    # An escalated GPU's reset already failed: it waits for a drain and reboot. A GPU
    # whose row remapping failed has no spare rows left: whatever asks for a reset (XID 64
    # comes with the failure), none can repair its memory, so it waits for replacement.
    lead = _leading(_of_kind(asks, "reset_gpu"))
    remap_failed = gpu.readings is not None and gpu.readings.row_remap_failure is True
    if lead is None or bus in history.escalated or remap_failed:
        return []
    return [_from_finding("reset_gpu", bus, lead.finding)]


# --- undo ---------------------------------------------------------------------------------


def _restore_power(
    snapshot: NodeSnapshot, gpu: GpuState, history: History, now: float, config: RemediationSection
) -> list[PlannedAction]:
    bus = gpu.identity.pci_bus_id
    previous = dict(history.power_capped).get(bus)
    cool_since = dict(history.cool_since).get(bus)
    if previous is None or cool_since is None or not _positive(previous):
        return []
    if not thermal_ok(snapshot, bus):
        return []
    cool_for = now - cool_since
    hold = config.power.restore_after_seconds
    if not cool_for >= hold:  # also refuses NaN
        return []
    reason = f"no thermal problem for {cool_for:.0f} s (hold {hold:g} s): restore {previous:g} W"
    return [
        PlannedAction(
            "restore_power",
            bus,
            reason,
            evidence=(("cool_seconds", round(cool_for, 3)), ("restore_after_seconds", hold)),
            params=(("limit_w", previous),),
        )
    ]


def _uncordon(
    snapshot: NodeSnapshot, history: History, now: float, config: RemediationSection
) -> list[PlannedAction]:
    cordon = config.cordon
    since = history.healthy_since
    if not (cordon.uncordon_after_recovery and history.cordoned_by_us) or since is None:
        return []
    healthy_for = now - since
    # The snapshot itself must agree: a hold timer the executor has not yet reset for
    # this snapshot's new finding must not uncordon a node that is failing again.
    if not healthy_for >= cordon.healthy_hold_seconds or not node_is_healthy(snapshot):
        return []
    hold = cordon.healthy_hold_seconds
    reason = f"every finding OK for {healthy_for:.0f} s (hold {hold:g} s)"
    return [
        PlannedAction(
            "uncordon",
            snapshot.node_name,
            reason,
            evidence=(("healthy_seconds", round(healthy_for, 3)), ("healthy_hold_seconds", hold)),
        )
    ]


# --- helpers for the executor's hold timers -----------------------------------------------


def node_is_healthy(snapshot: NodeSnapshot) -> bool:
    """Every finding OK and every GPU answering. A snapshot without findings is not
    healthy: nothing was checked yet, and an unchecked node must not start a hold timer."""
    findings = snapshot.health.findings
    return (
        snapshot.nvml.ok
        and bool(findings)
        and all(f.severity is Severity.OK for f in findings)
        and all(g.status == "ok" for g in snapshot.gpus)
    )


def thermal_ok(snapshot: NodeSnapshot, bus_id: str) -> bool:
    """The GPU answers and has no thermal problem (no thermal finding, as with the check
    switched off, counts as none). A GPU we cannot read is never cool: its UNKNOWN
    thermal finding says so, and its limit could not be restored anyway."""
    gpu = snapshot.gpu(bus_id)
    if gpu is None or gpu.status != "ok":
        return False
    return all(
        f.severity is Severity.OK for f in snapshot.health.for_gpu(bus_id) if f.check == THERMAL
    )
