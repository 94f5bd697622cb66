"""``state_dir`` (node level): whether the agent can keep what must survive a restart.

The MQTT spool and the remediation audit trail live in `agent.state_dir`. When it is
read-only or full, monitoring and metrics go on, but reports wait in memory (lost if the
agent is killed before the disk is back) and remediation does nothing it cannot audit.
"""

from __future__ import annotations

from gpuagent.checks.common import Outcome, Problem
from gpuagent.checks.vocabulary import Action, Runbook
from gpuagent.model import Severity

# What each store's failure costs, in the reason.
_EFFECT = {
    "spool": "fleet reports held in memory",
    "audit": "remediation paused",
}


def check_state_dir(errors: tuple[tuple[str, str], ...]) -> Outcome:
    """``errors``: (store, why it cannot be used) for each store that cannot."""
    evidence = tuple((store, error) for store, error in errors)
    if not errors:
        return Outcome("state directory writable", evidence)
    effects = ", ".join(_EFFECT.get(store, store) for store, _ in errors)
    detail = "; ".join(error for _, error in errors)
    reason = f"state directory not usable ({effects}): {detail}"
    return Outcome(
        "",
        evidence,
        (Problem(Severity.WARN, reason, Action.FIX_STATE_DIR, Runbook.NODE_STATE_DIR),),
    )
