"""Faults two checks see: one finding, the owner's, carrying both pieces of evidence.

The driver reports some faults twice: as an XID in the kernel log (or an NVML XID event)
and as a state NVML reads. Xid 48 and the volatile DBE counter are one uncorrectable ECC
error; Xid 79 and NVML's GPU_IS_LOST one GPU fallen off the bus; Xid 63 (a row recorded
for remapping) with a remap pending or failed, and Xid 64 (remapping failed) with a remap
failure, one row remap. When both are seen, the check that reads the state owns the fault
(``availability``, ``ecc``, ``row_remap``): its finding keeps its identity and takes the
XID as evidence, and the ``xid`` check leaves that XID out of its problems.

Each alone is found as before: the XID by ``xid``, the state by its check. Ownership
needs both because they do not last alike: the counter and the flags clear at a GPU
reset, while the XID stays in the event log for its retention. After a reset the XID is
``xid``'s again (as it would be alone), so the owner's finding never outlives the state
it reads and never asks for a second reset the state no longer calls for.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from gpuagent.checks.common import Evidence, Outcome, Problem
from gpuagent.checks.vocabulary import Runbook
from gpuagent.model import GpuEvent


@dataclass(frozen=True, slots=True)
class SameFault:
    """The owner's problem of ``runbook`` is the fault these XIDs report."""

    owner: str
    runbook: Runbook
    xids: frozenset[int]


SAME_FAULTS: tuple[SameFault, ...] = (
    SameFault("availability", Runbook.GPU_LOST, frozenset({79})),
    SameFault("ecc", Runbook.GPU_ECC_DBE, frozenset({48})),
    SameFault("row_remap", Runbook.GPU_ROW_REMAP_PENDING, frozenset({63})),
    SameFault("row_remap", Runbook.GPU_ROW_REMAP_FAILURE, frozenset({63, 64})),
)


def owned_xids(outcomes: Mapping[str, Outcome | None], xids: Sequence[GpuEvent]) -> dict[int, str]:
    """XID → the check whose finding reports it, for each of the GPU's ``xids`` whose
    fault an owner's outcome reports too (None: a check that could not judge the GPU)."""
    owned: dict[int, str] = {}
    present: frozenset[int | None] | None = None
    for same in SAME_FAULTS:
        outcome = outcomes.get(same.owner)
        if outcome is None or not any(p.runbook is same.runbook for p in outcome.problems):
            continue
        if present is None:
            present = frozenset(e.code for e in xids)
        for code in sorted(same.xids):
            if code in present:
                owned.setdefault(code, same.owner)
    return owned


def absorb(
    outcome: Outcome,
    owner: str,
    owned: Mapping[int, str],
    xids: Sequence[GpuEvent],
    weight: Callable[[GpuEvent], int],
) -> Outcome:
    """``owner``'s outcome with the XIDs it owns: the newest as evidence, and named in the
    reason of the problem that is their fault. Its cause, so its identity, is unchanged."""
    codes = frozenset(code for code, by in owned.items() if by == owner)
    mine = [e for e in xids if e.code in codes]
    if not mine:
        return outcome
    newest = mine[-1]
    evidence: Evidence = (
        ("xid", newest.code),
        ("xid_count", sum(weight(e) for e in mine)),
        ("xid_line", newest.line),
        ("xid_time", newest.time),
        ("xid_pid", newest.pid),
        ("xid_process", newest.process),
    )
    seen = frozenset(e.code for e in mine if e.code is not None)
    problems = tuple(_named(p, owner, seen) for p in outcome.problems)
    return replace(outcome, evidence=outcome.evidence + evidence, problems=problems)


def _named(problem: Problem, owner: str, seen: frozenset[int]) -> Problem:
    """``problem`` with the XIDs in ``seen`` that report its fault named in its reason."""
    codes = sorted(
        {
            code
            for same in SAME_FAULTS
            if same.owner == owner and same.runbook is problem.runbook
            for code in same.xids & seen
        }
    )
    if not codes:
        return problem
    named = ", ".join(f"Xid {code}" for code in codes)
    return replace(problem, reason=f"{problem.reason}, also reported as {named}")
