"""The data remediation passes around: planned actions, history, cordon requests."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from gpuagent.model import EvidenceValue

ActionKind = Literal[
    "enable_persistence",
    "report",  # nothing to do but tell (e.g. nvidia-persistenced installed but persistence off)
    "cordon",
    "uncordon",
    "reset_gpu",
    "cap_power",
    "restore_power",
    "diag",  # a DCGM diagnostic (on request, after a reset, before an uncordon): audited only
    "evidence",  # an RMA evidence bundle collected for a GPU: audited only
    "acknowledge",  # an operator acknowledged a GPU's findings (gpuagent ack): audited only
    "clear_drills",  # an operator ended the fault drills (gpuagent inject clear-drills)
]
ActionResult = Literal[
    "planned",  # observe mode: what would have been done
    "started",
    "succeeded",
    "failed",
    "refused",  # a precondition did not hold
    "skipped",  # budget exhausted or cooling down
    "verified",  # after a reset: the GPU came back healthy
    "escalated",  # a failed reset: drain and reboot asked for, no more resets
]


@dataclass(frozen=True, slots=True)
class PlannedAction:
    """One action the planner wants. ``target`` is a GPU's bus id, or the node name for
    cordon/uncordon. ``key`` identifies it for idempotence, cooldowns and budgets."""

    kind: ActionKind
    target: str
    reason: str
    check: str | None = None  # the finding that asked for it (None for undo actions)
    severity: str | None = None
    evidence: tuple[tuple[str, EvidenceValue], ...] = ()
    # Action parameters, e.g. (("limit_w", 490.0),) for cap_power/restore_power.
    params: tuple[tuple[str, float | str], ...] = ()

    @property
    def key(self) -> str:
        return f"{self.kind}:{self.target}"

    def param(self, name: str) -> float | str | None:
        return dict(self.params).get(name)


@dataclass(frozen=True, slots=True)
class History:
    """What the planner needs to know about the past (kept by the executor, partly in
    SQLite so it survives restarts)."""

    # The node is cordoned, and we did it (only then may we uncordon).
    cordoned_by_us: bool = False
    # Power limits we lowered and have not restored: GPU bus id → the limit before (W).
    power_capped: tuple[tuple[str, float], ...] = ()
    # Since when (monotonic) each capped GPU has had no thermal problem.
    cool_since: tuple[tuple[str, float], ...] = ()
    # Since when (monotonic) the whole node has been healthy (None: it is not).
    healthy_since: float | None = None
    # GPUs whose reset failed: no more resets for them; the node needs drain and reboot.
    escalated: tuple[str, ...] = ()
    # nvidia-persistenced is installed on the node (then we report, not fight it).
    persistenced_installed: bool = False


@dataclass(frozen=True, slots=True)
class CordonRequest:
    """What a cordon backend is asked to do. Serialised as JSON for the command and
    aggregator backends (see docs/remediation.md)."""

    node: str
    cluster: str
    reason: str  # one line, e.g. "GPU 0000:3b:00.0: 1 uncorrectable ECC error (ecc)"
    request_id: str
    gpus: tuple[str, ...] = ()
    findings: tuple[tuple[str, str, str], ...] = ()  # (gpu or "", check, reason)


@dataclass(frozen=True, slots=True)
class CordonResult:
    ok: bool
    changed: bool  # False when the node already was in the asked-for state
    detail: str = ""


@dataclass(frozen=True, slots=True)
class CordonState:
    cordoned: bool
    owned: bool  # cordoned by gpuagent (our reason prefix / annotation)
    reason: str = ""
    extra: tuple[tuple[str, str], ...] = field(default_factory=tuple)
