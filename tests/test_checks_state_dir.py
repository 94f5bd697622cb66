"""state_dir (node level): the spool and the audit trail need a writable state directory."""

from __future__ import annotations

from gpuagent.checks.state_dir import check_state_dir
from gpuagent.model import Severity


def test_a_writable_state_directory_is_ok() -> None:
    outcome = check_state_dir(())
    assert outcome.problems == ()
    assert outcome.ok_reason == "state directory writable"


def test_each_unusable_store_is_named_with_what_it_costs() -> None:
    outcome = check_state_dir(
        (
            ("spool", "cannot open the spool /var/lib/gpuagent/mqtt-spool.sqlite: readonly"),
            ("audit", "database or disk is full"),
        )
    )
    (problem,) = outcome.problems
    assert problem.severity is Severity.WARN
    assert problem.reason.startswith(
        "state directory not usable (fleet reports held in memory, remediation paused): "
    )
    assert "database or disk is full" in problem.reason
    assert problem.action == "fix_state_dir"
    assert problem.runbook == "node-state-dir"
