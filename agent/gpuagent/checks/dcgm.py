"""``dcgm``: DCGM's health watches, for what the agent's own checks do not already say.

Rule (docs/dcgm.md): a DCGM incident on a system the agent checks itself (memory: ecc,
retired_pages, row_remap; pcie: pcie, aer; thermal: thermal; nvlink: nvlink) is
corroboration when that GPU's own finding for it is already not OK: it becomes evidence on
that finding and raises no second alarm. Every other incident (another system, or one
the agent's checks see nothing of) is a problem of this check, with DCGM's severity.
Incidents of entities that are not GPUs (NVSwitches) make the node-level finding, and so
does a host engine the source cannot reach: while it is down DCGM reports nothing, which
must not read as "nothing new".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from gpuagent.checks.common import Evidence, Outcome, Problem
from gpuagent.checks.vocabulary import Action, Runbook
from gpuagent.model import DcgmIncident, DcgmStatus, Finding, Severity

# DCGM health system → the agent's checks that watch the same thing.
OWN_CHECKS: Mapping[str, tuple[str, ...]] = {
    "memory": ("ecc", "retired_pages", "row_remap"),
    "pcie": ("pcie", "aer"),
    "thermal": ("thermal",),
    "nvlink": ("nvlink",),
}


def _evidence(incidents: Sequence[DcgmIncident]) -> Evidence:
    return tuple((f"dcgm_{i.system}", f"{i.code}: {i.message}") for i in incidents)


def _problem(incident: DcgmIncident, runbook: Runbook) -> Problem:
    return Problem(
        incident.severity,
        f"DCGM {incident.system} {incident.severity.name}: {incident.code}: {incident.message}",
        Action.INVESTIGATE,
        runbook,
    )


def corroborate(
    findings: list[Finding], incidents: Iterable[DcgmIncident]
) -> tuple[list[Finding], tuple[DcgmIncident, ...]]:
    """One GPU's findings with the incidents that corroborate them added as evidence, and
    the incidents left for the ``dcgm`` check."""
    by_check = {f.check: n for n, f in enumerate(findings)}
    left = []
    for incident in incidents:
        own = [
            by_check[name]
            for name in OWN_CHECKS.get(incident.system, ())
            if name in by_check
            and findings[by_check[name]].severity in (Severity.WARN, Severity.CRITICAL)
        ]
        if not own:
            left.append(incident)
            continue
        for n in own:
            finding = findings[n]
            findings[n] = replace(finding, evidence=finding.evidence + _evidence([incident]))
    return findings, tuple(left)


def check_dcgm(
    incidents: Sequence[DcgmIncident], corroborated: int = 0, *, down: bool = False
) -> Outcome:
    """A GPU's incidents not already covered by its own findings (``down``: the host
    engine is unreachable, so there are none to know of; the node finding says so)."""
    evidence: Evidence = (
        ("dcgm_incidents", len(incidents)),
        ("dcgm_corroborating", corroborated),
        *_evidence(incidents),
    )
    problems = tuple(_problem(i, Runbook.GPU_DCGM_HEALTH) for i in incidents)
    ok = "DCGM unreachable: its health watches are not known" if down else _NOTHING_NEW
    return Outcome(ok, evidence, problems)


_NOTHING_NEW = "DCGM health watches report nothing new"


def check_dcgm_node(incidents: Sequence[DcgmIncident], status: DcgmStatus) -> Outcome:
    """Incidents of entities that are not GPUs (NVSwitches), and a host engine the source
    cannot reach."""
    evidence: Evidence = (
        ("dcgm_state", status.state),
        ("dcgm_incidents", len(incidents)),
        *_evidence(incidents),
    )
    problems = [_problem(i, Runbook.NODE_DCGM_HEALTH) for i in incidents]
    if status.state == "down":
        why = f": {status.detail}" if status.detail else ""
        problems.append(
            Problem(
                Severity.WARN,
                f"DCGM host engine unreachable{why}; its health watches, policy "
                "notifications and diagnostics are unavailable until it is back",
                Action.START_SERVICE,
                Runbook.NODE_DCGM_DOWN,
            )
        )
    return Outcome("DCGM health watches report nothing for the node", evidence, tuple(problems))
