"""NVIDIA's XID catalog beside what gpuagent's ``xid`` check makes of each XID, for
`gpuagent xid explain` and `gpuagent xid list`.

The verdicts are the check's own (gpuagent.checks.xid.policy), never a copy: what these
commands print is what a finding would say.
"""

from __future__ import annotations

from typing import Any

from gpuagent.checks.xid import APP_ERROR, APP_ERROR_NOTE, Policy, policy
from gpuagent.kernel.xid import XidInfo, action_hint, all_xids


def _verdict(found: Policy) -> str:
    severity = found.verdict.severity.name
    return f"{severity}*" if found.decided_by else severity


def document(info: XidInfo) -> dict[str, Any]:
    """One XID as JSON: the catalog's entry, its action hint, and gpuagent's verdict."""
    from dataclasses import asdict  # noqa: PLC0415

    found = policy(info.xid)
    verdict = found.verdict
    return {
        **asdict(info),
        "action_hint": action_hint(info.action),
        "gpuagent": {
            "severity": verdict.severity.name,
            "verdict": verdict.label,
            "action": verdict.action.value,
            "runbook": verdict.runbook.value,
            "decided_by": found.decided_by,
        },
    }


def explain_lines(info: XidInfo) -> list[str]:
    """`gpuagent xid explain N`: gpuagent's verdict first, then NVIDIA's catalog."""
    found = policy(info.xid)
    verdict = found.verdict
    app_error = (
        "yes: NVIDIA's k8s-device-plugin leaves the GPU healthy (the application's fault)"
        if info.app_error
        else "no: NVIDIA's k8s-device-plugin marks the GPU unhealthy"
    )
    rows = [("gpuagent", f"{verdict.severity.name}: {verdict.label}")]
    if verdict is APP_ERROR:
        rows.append(("", APP_ERROR_NOTE))
    if found.decided_by:
        rows.append(("decided by", found.decided_by))
    rows += [
        ("action", verdict.action.value),
        ("runbook", verdict.runbook.value or "(none)"),
        ("description", info.description),
        ("category", info.category),
        ("catalog severity", info.severity),
        (
            "NVIDIA's action",
            f"{info.action}: {action_hint(info.action)}"
            if info.action
            else "none in the catalog yet",
        ),
        ("investigatory action", info.investigatory_action or "(none)"),
        ("application error", app_error),
    ]
    return [f"XID {info.xid}: {info.mnemonic}"] + [f"  {n:<21} {v}".rstrip() for n, v in rows]


def list_lines() -> list[str]:
    """`gpuagent xid list`: one line per catalogued XID."""
    entries = [(info, policy(info.xid)) for info in all_xids()]
    action_width = max(len(found.verdict.action.value) for _, found in entries)
    lines = [f"{'XID':>4}  {'GPUAGENT':<9} {'ACTION':<{action_width}}  NVIDIA"]
    for info, found in entries:
        lines.append(
            f"{info.xid:>4}  {_verdict(found):<9} {found.verdict.action.value:<{action_width}}"
            f"  {info.mnemonic}: {info.description}"
        )
    lines.append("")
    lines.append(
        "* decided by the XID's line; shown is the verdict of a line with nothing to "
        "decode (gpuagent xid explain N says what decides)"
    )
    return lines
