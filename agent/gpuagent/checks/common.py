"""What every check shares: its input view, its outcome and how an outcome becomes a Finding.

A check reports the problems it sees plus the raw numbers it used; turning that into the
one Finding per check is done here, once, so every check combines problems the same way.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from gpuagent.checks.eventindex import EventIndex
from gpuagent.checks.memory import GpuMemory
from gpuagent.checks.vocabulary import Action, Runbook
from gpuagent.config import ChecksSection
from gpuagent.model import (
    EvidenceValue,
    Finding,
    GpuIdentity,
    GpuReadings,
    PcieLink,
    PciePath,
    Severity,
)

Evidence = tuple[tuple[str, EvidenceValue], ...]


@dataclass(frozen=True, slots=True)
class SinceBoot:
    """How long ago the node booted, against the post-boot grace
    (``checks.nvlink.boot_grace_seconds``): within it NVLinks may still be training and
    the fabric still registering the GPUs, neither a fault on its own."""

    seconds: float
    grace_seconds: float

    @property
    def in_grace(self) -> bool:
        return self.seconds < self.grace_seconds

    def words(self) -> str:
        """The reason's words: "after boot (42 s ago, grace 300 s)"."""
        return f"after boot ({fmt(self.seconds)} s ago, grace {fmt(self.grace_seconds)} s)"

    def evidence(self) -> Evidence:
        return (
            ("seconds_since_boot", round(self.seconds, 1)),
            ("boot_grace_seconds", self.grace_seconds),
        )


def in_boot_grace(boot: SinceBoot | None) -> bool:
    """Within the post-boot grace; False where the boot time is not known."""
    return boot is not None and boot.in_grace


def boot_evidence(boot: SinceBoot | None, grace_seconds: float) -> Evidence:
    """When the node booted, and the grace: the same keys whether or not it is known."""
    if boot is None:
        return (("seconds_since_boot", None), ("boot_grace_seconds", grace_seconds))
    return boot.evidence()


@dataclass(frozen=True, slots=True)
class GpuView:
    """Everything a per-GPU check may look at: one GPU's latest readings and its memory.

    ``memory`` already includes this poll's samples, so rate checks see the newest value.
    """

    identity: GpuIdentity
    readings: GpuReadings
    config: ChecksSection
    memory: GpuMemory
    now: float
    path: PciePath | None = None  # the GPU and the bridges above it, from sysfs
    # The persistence mode expected (True: on) and who expects it ("expected": declared,
    # "baseline": learned); None: no expectation, so the mode is a fact.
    persistence_wanted: tuple[bool, str] | None = None
    boot: SinceBoot | None = None  # None: when the node booted is not known


@dataclass(frozen=True, slots=True)
class EventView:
    """What a per-GPU event check may look at: the recent events, the PCIe path, memory.

    Kernel-log, udev and sysfs facts do not depend on NVML, so these checks run whether or
    not the GPU served readings this poll (``readings`` is None when it did not).
    """

    identity: GpuIdentity
    readings: GpuReadings | None
    config: ChecksSection
    memory: GpuMemory
    now: float
    events: EventIndex
    path: PciePath | None
    # XIDs whose fault another check's finding reports (XID → that check): the ``xid``
    # check leaves them out of its problems (see checks/same_fault.py).
    owned_xids: Mapping[int, str] = field(default_factory=dict)

    @property
    def bus_id(self) -> str:
        return self.identity.pci_bus_id

    def functions(self) -> tuple[PcieLink, ...]:
        """The GPU's PCI function and every bridge above it (empty without sysfs data)."""
        return () if self.path is None else (self.path.device, *self.path.bridges)

    def addresses(self) -> tuple[str, ...]:
        """Bus ids whose events count for this GPU: its own and its bridges'."""
        return tuple(f.address for f in self.functions()) or (self.bus_id,)


@dataclass(frozen=True, slots=True)
class NodeView:
    """What a node-level event check may look at. ``gpus`` are the bus ids NVML lists."""

    config: ChecksSection
    now: float
    events: EventIndex
    gpus: frozenset[str]


@dataclass(frozen=True, slots=True)
class Problem:
    severity: Severity
    reason: str  # for people: may carry live numbers
    action: Action
    runbook: Runbook
    # What the problem is about, stable while it lasts (an XID, a counter, a link): with
    # the check and the GPU, the finding's identity. "" means the runbook says it.
    cause: str = ""


@dataclass(frozen=True, slots=True)
class Outcome:
    """A check's verdict: no problems means OK with ``ok_reason``."""

    ok_reason: str
    evidence: Evidence = ()
    problems: tuple[Problem, ...] = ()


# Read once: an enum member's value is a descriptor lookup, and every OK finding needs both.
_NO_ACTION, _NO_RUNBOOK = Action.NONE.value, Runbook.NONE.value


def to_finding(check: str, gpu: str | None, outcome: Outcome) -> Finding:
    """One Finding from an outcome: the worst problem decides severity, action and runbook.

    Every problem's reason is kept (worst first) so a GPU that is both hot and throttled
    says both in its one finding.
    """
    if not outcome.problems:
        return Finding(
            check=check,
            severity=Severity.OK,
            reason=outcome.ok_reason,
            gpu=gpu,
            evidence=outcome.evidence,
            action=_NO_ACTION,
            runbook=_NO_RUNBOOK,
        )
    # sorted() is stable, so equally bad problems keep the order the check listed them in.
    ranked = sorted(outcome.problems, key=lambda p: -p.severity.rank)
    worst = ranked[0]
    return Finding(
        check=check,
        severity=worst.severity,
        reason="; ".join(p.reason for p in ranked),
        gpu=gpu,
        evidence=outcome.evidence,
        action=worst.action.value,
        runbook=worst.runbook.value,
        cause=worst.cause or worst.runbook.value,
    )


def fmt(value: float) -> str:
    """A number for a human sentence: whole numbers without a decimal point, else one digit."""
    if not math.isfinite(value):
        return str(value)
    rounded = round(value, 1)
    return str(int(rounded)) if rounded == int(rounded) else f"{rounded:.1f}"


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"
