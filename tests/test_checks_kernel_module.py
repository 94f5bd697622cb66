"""The kernel_module check: the next boot's kernel must have an nvidia module."""

from __future__ import annotations

import pytest

from gpuagent.checks.inventory import InventoryView, check_kernel_module
from gpuagent.config import InventoryExpected
from gpuagent.inventory.model import HostFacts, KernelModuleState, NodeInventory
from gpuagent.model import Severity

RUNNING = "6.1.0-18-amd64"
UPDATE = "6.1.0-28-amd64"


def view(*kernels: tuple[str, bool | None], running: str = RUNNING) -> InventoryView:
    host = HostFacts(
        kernel_release=running,
        kernels=tuple(KernelModuleState(release, has) for release, has in kernels),
    )
    return InventoryView(NodeInventory(host, "1.0", nvml_ok=True), InventoryExpected())


@pytest.mark.parametrize(
    ("kernels", "severity", "reason"),
    [
        (((RUNNING, True),), Severity.OK, f"newest kernel {RUNNING} has an nvidia module"),
        (((RUNNING, True), (UPDATE, True)), Severity.OK, f"newest kernel {UPDATE} has an"),
        (
            ((RUNNING, True), (UPDATE, False)),
            Severity.WARN,
            f"newest kernel {UPDATE} has no nvidia module: the next boot into it loses every",
        ),
        (
            ((RUNNING, False),),
            Severity.WARN,
            f"newest kernel {RUNNING} (running) has no nvidia module",
        ),
        (
            ((RUNNING, False), (UPDATE, True)),
            Severity.WARN,
            f"running kernel {RUNNING} has no nvidia module on disk",
        ),
        (((RUNNING, True), (UPDATE, None)), Severity.OK, f"newest kernel {UPDATE}: its modules"),
        ((), Severity.OK, "installed kernels not read"),
    ],
)
def test_kernel_module(kernels, severity, reason):
    outcome = check_kernel_module(view(*kernels))
    worst = max((p.severity for p in outcome.problems), key=lambda s: s.rank, default=Severity.OK)
    assert worst is severity
    text = outcome.problems[0].reason if outcome.problems else outcome.ok_reason
    assert text.startswith(reason)


def test_both_problems_and_the_evidence():
    outcome = check_kernel_module(view((RUNNING, False), ("6.1.0-20-amd64", True), (UPDATE, False)))
    assert [p.reason.split(":")[0] for p in outcome.problems] == [
        f"newest kernel {UPDATE} has no nvidia module",
        f"running kernel {RUNNING} has no nvidia module on disk",
    ]
    assert dict(outcome.evidence) == {
        "running_kernel": RUNNING,
        "newest_kernel": UPDATE,
        "kernels_without_module": f"{RUNNING},{UPDATE}",
    }
