"""The executor's rails, one at a time: cooldown, mode, kill switch, budgets that survive a
new executor, preconditions, verification and escalation, power cap and restore, and
someone else's cordon. The cordon backend and GPU operations are in-memory doubles at
their boundary; the planner and the audit trail are the real ones."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from gpuagent.config import RemediationBudgets, RemediationRule, RemediationSection
from gpuagent.model import GpuProcess, NodeSnapshot
from gpuagent.node.remediation import RemediationScheduler
from gpuagent.remediation.audit import AuditStore
from gpuagent.remediation.executor import Remediator
from gpuagent.remediation.gpu_ops import GpuOperationError
from gpuagent.remediation.types import CordonRequest, CordonResult, CordonState
from gpuagent.render import render_status
from gpuagent.statusview import status_document
from test_remediation_planner import (
    BUS0,
    BUS1,
    CRITICAL,
    OK,
    WARN,
    config,
    finding,
    gpu,
    snapshot,
    xid,
)

DBE = finding("ecc", CRITICAL, "1 uncorrectable ECC error", action="drain_and_reset")
HOT = finding("thermal", CRITICAL, "GPU at 91 °C", action="check_cooling")


class Backend:
    name = "fake"

    def __init__(self, *, someone_else: bool = False) -> None:
        self.requests: list[tuple[str, CordonRequest]] = []
        self.cordoned = someone_else
        self.ours = False

    async def cordon(self, request: CordonRequest) -> CordonResult:
        self.requests.append(("cordon", request))
        if self.cordoned:
            return CordonResult(ok=True, changed=False, detail="already cordoned")
        self.cordoned = self.ours = True
        return CordonResult(ok=True, changed=True, detail="cordoned")

    async def uncordon(self, request: CordonRequest) -> CordonResult:
        self.requests.append(("uncordon", request))
        if not self.ours:
            return CordonResult(ok=False, changed=False, detail="not ours")
        self.cordoned = self.ours = False
        return CordonResult(ok=True, changed=True)

    async def state(self) -> CordonState:
        return CordonState(cordoned=self.cordoned, owned=self.ours)


class Ops:
    def __init__(self, *, fail_reset: bool = False) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.fail_reset = fail_reset

    async def enable_persistence(self, bus_id: str) -> str:
        self.calls.append(("persistence", bus_id))
        return "enabled"

    async def set_power_limit(self, bus_id: str, watts: float) -> str:
        self.calls.append(("power", watts))
        return f"{watts} W"

    async def reset(self, bus_id: str, index: int) -> str:
        self.calls.append(("reset", bus_id))
        if self.fail_reset:
            raise GpuOperationError("Unable to reset this GPU")
        return "reset"

    async def device_holders(self, _minor: int | None) -> list[tuple[int, str]]:
        return []


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


class Harness:
    def __init__(self, tmp_path: Path, section: RemediationSection, **kwargs: Any) -> None:
        self.path = tmp_path / "audit.sqlite"
        self.clock = Clock()
        self.backend = kwargs.pop("backend", Backend())
        self.ops = kwargs.pop("ops", Ops())
        self.diag = kwargs.pop("diag", None)
        self.section = section
        self.executor = self.make()

    def make(self) -> Remediator:
        """A new executor on the same audit trail: what a restart looks like."""
        return Remediator(
            self.section,
            audit=AuditStore(self.path, wall_clock=self.clock),
            backends=[] if self.backend is None else [self.backend],
            ops=self.ops,  # type: ignore[arg-type]
            diag=self.diag,
            node="gpu-node-07",
            cluster="default",
            simulated=True,
            clock=self.clock,
            wall_clock=self.clock,
        )

    async def cycle(self, snap: NodeSnapshot, advance: float = 1.0) -> None:
        self.clock.now += advance
        await self.executor.handle(snap)

    def results(self, kind: str) -> list[str]:
        return [r.result for r in reversed(self.executor.audit.recent(1000)) if r.kind == kind]


def enforce(**changes: Any) -> RemediationSection:
    return dataclasses.replace(
        config(), mode="enforce", kill_switch=Path("/nonexistent"), **changes
    )


IDLE = snapshot(DBE, gpus=(gpu(),))
BUSY = snapshot(DBE, gpus=(gpu(processes=(GpuProcess(4242, "train.py", 100.0),)),))
HEALTHY = snapshot(finding("ecc", OK, "ok"), gpus=(gpu(),))


async def test_cordon_then_reset_then_verify(tmp_path: Path) -> None:
    h = Harness(tmp_path, enforce())
    await h.cycle(IDLE)
    # Cordon first; the reset in the same cycle sees the fresh cordon and goes ahead.
    assert h.results("cordon") == ["started", "succeeded"]
    assert h.results("reset_gpu") == ["started", "succeeded"]
    for _ in range(3):
        await h.cycle(HEALTHY)
    assert h.results("reset_gpu")[-1] == "verified"
    assert [kind for kind, _ in h.backend.requests] == ["cordon"]


async def test_busy_gpu_is_refused_until_idle_and_cooldown_spaces_retries(tmp_path: Path) -> None:
    h = Harness(tmp_path, enforce())
    await h.cycle(BUSY)
    await h.cycle(BUSY, advance=10)  # within the 300 s cooldown: not even audited
    assert h.results("reset_gpu") == ["refused"]
    await h.cycle(IDLE, advance=301)
    assert h.results("reset_gpu") == ["refused", "started", "succeeded"]
    assert ("reset", BUS0) in h.ops.calls


async def test_budget_survives_a_restart(tmp_path: Path) -> None:
    h = Harness(tmp_path, enforce())
    await h.cycle(IDLE)
    h.executor = h.make()  # a crash and restart
    await h.cycle(IDLE, advance=400)
    assert h.results("reset_gpu")[-1] == "skipped"
    assert "budget exhausted" in h.executor.audit.recent(1)[0].detail
    assert [c for c in h.ops.calls if c[0] == "reset"] == [("reset", BUS0)]
    assert [kind for kind, _ in h.backend.requests] == ["cordon"]  # not re-cordoned


async def test_observe_mode_plans_and_does_nothing(tmp_path: Path) -> None:
    h = Harness(tmp_path, dataclasses.replace(config(), kill_switch=Path("/nonexistent")))
    await h.cycle(IDLE)
    assert h.results("cordon") == ["planned"]
    assert h.results("reset_gpu") == ["planned"]
    assert h.backend.requests == []
    assert h.ops.calls == []


async def test_kill_switch_skips_everything(tmp_path: Path) -> None:
    switch = tmp_path / "paused"
    switch.touch()
    h = Harness(tmp_path, dataclasses.replace(enforce(), kill_switch=switch))
    await h.cycle(IDLE)
    assert h.results("cordon") == ["skipped"]
    assert h.backend.requests == []


@pytest.mark.parametrize(
    ("snap", "section", "backend", "reason"),
    [
        (snapshot(DBE, gpus=(gpu(mig_mode_current=True),)), enforce(), Backend(), "MIG is enabled"),
        (
            IDLE,
            dataclasses.replace(enforce(), cordon=config(backends=()).cordon),
            None,
            "no cordon backend",
        ),
    ],
    ids=["mig", "no-cordon-backend"],
)
async def test_reset_preconditions(
    tmp_path: Path,
    snap: NodeSnapshot,
    section: RemediationSection,
    backend: Backend | None,
    reason: str,
) -> None:
    h = Harness(tmp_path, section, backend=backend)
    await h.cycle(snap)
    assert h.results("reset_gpu") == ["refused"]
    assert reason in h.executor.audit.recent(1)[0].detail
    assert not [c for c in h.ops.calls if c[0] == "reset"]


async def test_failed_reset_escalates_and_never_loops(tmp_path: Path) -> None:
    h = Harness(
        tmp_path, enforce(budgets=RemediationBudgets(reset_per_gpu=5)), ops=Ops(fail_reset=True)
    )
    await h.cycle(IDLE)
    assert h.results("reset_gpu") == ["started", "failed", "escalated"]
    await h.cycle(IDLE, advance=400)
    assert h.results("reset_gpu") == ["started", "failed", "escalated"]  # no second try
    reasons = [r.reason for (r,) in [(x,) for _, x in h.backend.requests]]
    assert any("drain and reboot" in reason for reason in reasons)


async def test_gpu_unhealthy_after_reset_escalates(tmp_path: Path) -> None:
    h = Harness(tmp_path, enforce())
    await h.cycle(IDLE)
    for _ in range(3):
        await h.cycle(snapshot(DBE, gpus=(gpu(status="lost"),)))
    assert h.results("reset_gpu")[-1] == "escalated"


async def test_failed_dcgm_diagnostic_escalates(tmp_path: Path) -> None:
    from test_diag_gate import FakeDcgm, runner  # noqa: PLC0415 - the gate's own doubles

    h = Harness(tmp_path, enforce(), diag=runner(FakeDcgm(fail={("memory", 0)})))
    await h.cycle(IDLE)
    for _ in range(3):
        await h.cycle(HEALTHY)
    assert h.results("reset_gpu")[-1] == "escalated"
    assert "memory (GPU 0)" in h.executor.audit.last("reset_gpu", BUS0, ("escalated",)).detail


async def test_power_cap_and_restore_the_limit_from_before(tmp_path: Path) -> None:
    h = Harness(tmp_path, enforce())
    hot = snapshot(HOT, gpus=(gpu(power_limit_w=650.0),))
    cool = snapshot(finding("thermal", OK, "GPU at 50 °C"), gpus=(gpu(power_limit_w=490.0),))
    await h.cycle(hot)
    assert ("power", 490.0) in h.ops.calls
    await h.cycle(cool)
    await h.cycle(cool, advance=601)
    assert h.ops.calls[-1] == ("power", 650.0)
    assert h.results("restore_power") == ["started", "succeeded"]


async def test_someone_elses_cordon_is_not_taken_over(tmp_path: Path) -> None:
    h = Harness(
        tmp_path,
        enforce(cordon=dataclasses.replace(config().cordon, uncordon_after_recovery=True)),
        backend=Backend(someone_else=True),
    )
    await h.cycle(IDLE)
    assert h.results("cordon") == ["started", "skipped"]
    assert not h.executor.history().cordoned_by_us
    # ...so it is never uncordoned by us either.
    for _ in range(3):
        await h.cycle(HEALTHY, advance=2000)
    assert "uncordon" not in [kind for kind, _ in h.backend.requests]


async def test_enable_persistence(tmp_path: Path) -> None:
    h = Harness(tmp_path, enforce())
    off = snapshot(
        finding("persistence", WARN, "persistence mode off", action="enable_persistence"),
        gpus=(gpu(persistence_mode=False),),
    )
    await h.cycle(off)
    assert h.ops.calls == [("persistence", BUS0)]
    assert h.results("enable_persistence") == ["started", "succeeded"]


# --- observe mode tells what enforce would do ----------------------------------------------

NO_BACKEND = config(backends=()).cordon
RESET_ONLY = [RemediationRule("ecc", ["reset_gpu"])]
LOST = snapshot(
    finding(
        "availability", CRITICAL, "GPU is lost (fallen off the bus)", action="drain_and_reboot"
    ),
    gpus=(gpu(status="lost"),),
)
XID79 = snapshot(xid(79))


def observe(**changes: Any) -> RemediationSection:
    return dataclasses.replace(config(), kill_switch=Path("/nonexistent"), **changes)


@pytest.mark.parametrize(
    "section", [observe(cordon=NO_BACKEND), enforce(cordon=NO_BACKEND)], ids=["observe", "enforce"]
)
@pytest.mark.parametrize(
    ("snap", "why"), [(LOST, "GPU is lost"), (XID79, "Xid 79")], ids=["lost-gpu", "xid-79"]
)
async def test_a_cordon_with_no_backend_is_refused_naming_the_cordon(
    tmp_path: Path, section: RemediationSection, snap: NodeSnapshot, why: str
) -> None:
    h = Harness(tmp_path, section, backend=None)
    await h.cycle(snap)
    (record,) = h.executor.audit.recent(10)  # nothing else: no reset for these
    assert (record.kind, record.result, record.mode) == ("cordon", "refused", section.mode)
    assert record.detail == "cordon: no backend configured"
    # The cordon it would have asked for: the node, the reason, the GPU.
    assert record.target == "gpu-node-07"
    assert record.reason.startswith(f"GPU {BUS0}: ")
    assert why in record.reason
    assert record.evidence["params"] == {"gpus": BUS0}
    assert h.executor.last_plan == (record,)
    assert h.ops.calls == []


async def test_a_reset_enforce_would_refuse_reads_refused_in_observe_mode(tmp_path: Path) -> None:
    # No rule asks for a cordon, so enforce would find the node not cordoned.
    watched = Harness(tmp_path / "observe", observe(rules=RESET_ONLY))
    await watched.cycle(IDLE)
    enforced = Harness(tmp_path / "enforce", enforce(rules=RESET_ONLY))
    await enforced.cycle(IDLE)
    (would,) = watched.executor.audit.recent(10)
    (did,) = enforced.executor.audit.recent(10)
    assert (would.kind, would.result) == (did.kind, did.result) == ("reset_gpu", "refused")
    assert would.detail.startswith("reset: would be refused, the node is not cordoned")
    assert did.detail.startswith("reset: the node is not cordoned")
    assert watched.ops.calls == enforced.ops.calls == []
    # A busy GPU, too: the same precondition, said as what enforce would do.
    busy = Harness(tmp_path / "busy", observe())
    await busy.cycle(BUSY)
    assert busy.results("cordon") == ["planned"]
    refused = busy.executor.audit.last("reset_gpu", BUS0, ("refused",))
    assert refused is not None
    assert refused.detail.startswith("reset: would be refused, the GPU is busy")
    assert "train.py (4242)" in refused.detail


async def test_observe_judges_a_reset_on_the_node_enforce_would_have_cordoned(
    tmp_path: Path,
) -> None:
    h = Harness(tmp_path, observe())
    await h.cycle(XID79)  # asks for the cordon only
    assert h.results("cordon") == ["planned"]
    assert "would ask fake" in h.executor.audit.recent(1)[0].detail
    # Later, within the cordon's cooldown, a DBE asks for a reset. Enforce would have
    # cordoned the node already, so the reset would go ahead: planned, not refused.
    await h.cycle(IDLE, advance=10)
    assert h.results("cordon") == ["planned"]
    assert h.results("reset_gpu") == ["planned"]
    assert h.backend.requests == []


async def test_a_repeated_plan_is_one_row_with_a_count(tmp_path: Path) -> None:
    h = Harness(tmp_path, observe(cordon=NO_BACKEND), backend=None)
    await h.cycle(LOST)
    first = h.clock.now
    for _ in range(4):
        await h.cycle(LOST, advance=10)  # within the cooldown: not even looked at
        await h.cycle(LOST, advance=301)  # a cooldown later: the same decision again
    (row,) = h.executor.audit.recent(10)
    assert (row.result, row.count, row.time, row.last_seen) == ("refused", 5, first, h.clock.now)
    assert row.json()["count"] == 5
    assert h.executor.counts[("cordon", "refused")] == 5
    # The count survives a restart and goes on on the same row.
    h.executor = h.make()
    await h.cycle(LOST, advance=301)
    (row,) = h.executor.audit.recent(10)
    assert (row.count, row.last_seen) == (6, h.clock.now)
    # A new fault (a second GPU lost) is a new row, counted from 1.
    lost_too = snapshot(
        *LOST.health.findings,
        finding("availability", CRITICAL, "GPU is lost", bus=BUS1, action="drain_and_reboot"),
        gpus=(gpu(status="lost"), gpu(BUS1, 1, status="lost")),
    )
    await h.cycle(lost_too, advance=301)
    newest, older = h.executor.audit.recent(10)
    assert (newest.count, older.count, older.id) == (1, 6, row.id)
    assert BUS1 in newest.reason


async def test_a_different_outcome_is_a_new_row(tmp_path: Path) -> None:
    h = Harness(tmp_path, observe())
    for snap in (IDLE, IDLE, BUSY, BUSY, IDLE):
        await h.cycle(snap, advance=301)
    resets = [r for r in reversed(h.executor.audit.recent(100)) if r.kind == "reset_gpu"]
    assert [(r.result, r.count) for r in resets] == [("planned", 2), ("refused", 2), ("planned", 1)]
    (cordon,) = [r for r in h.executor.audit.recent(100) if r.kind == "cordon"]
    assert (cordon.result, cordon.count) == ("planned", 5)
    # Attempts are never folded: budgets count their rows.
    enforced = Harness(tmp_path / "enforce", enforce(budgets=RemediationBudgets(reset_per_gpu=5)))
    await enforced.cycle(IDLE)
    await enforced.cycle(IDLE, advance=301)
    assert enforced.results("reset_gpu") == ["started", "succeeded"] * 2


async def test_observe_mode_runs_no_diagnostic_before_an_uncordon(tmp_path: Path) -> None:
    from test_diag_gate import FakeDcgm, runner  # noqa: PLC0415 - the gate's own doubles

    cordon = dataclasses.replace(config().cordon, uncordon_after_recovery=True)
    h = Harness(tmp_path, enforce(cordon=cordon), diag=runner(FakeDcgm()))
    await h.cycle(IDLE)
    for _ in range(3):
        await h.cycle(HEALTHY)
    assert h.results("reset_gpu")[-1] == "verified"
    diagnostics = len(h.results("diag"))
    h.executor.set_mode("observe")
    await h.cycle(HEALTHY, advance=2000)
    await h.cycle(HEALTHY, advance=1)
    assert h.results("uncordon") == ["planned"]
    detail = h.executor.audit.last("uncordon", None, ("planned",))
    assert detail is not None
    assert detail.detail == (
        "observe mode: not done; would ask fake after DCGM's diagnostic level 1 passes"
    )
    assert len(h.results("diag")) == diagnostics
    assert [kind for kind, _ in h.backend.requests] == ["cordon"]


async def test_status_shows_the_plan_as_the_trail_says(tmp_path: Path) -> None:
    h = Harness(tmp_path, observe(cordon=NO_BACKEND), backend=None)
    await h.cycle(LOST)
    await h.cycle(LOST, advance=301)
    scheduler = RemediationScheduler()
    scheduler.remediator = h.executor
    doc = status_document(dataclasses.replace(LOST, remediation=scheduler.status()))
    refused = {
        "action": "cordon",
        "target": "gpu-node-07",
        "result": "refused",
        "reason": f"GPU {BUS0}: GPU is lost (fallen off the bus) (availability)",
        "detail": "cordon: no backend configured",
        "count": 2,
    }
    assert doc["remediation"]["plan"] == [refused]
    assert doc["remediation"]["counts"] == [{"action": "cordon", "result": "refused", "count": 2}]
    text = render_status(doc, now=doc["taken_at"])
    assert "Remediation plan (observe):" in text
    assert (
        f"  refused (2 times) cordon gpu-node-07: GPU {BUS0}: GPU is lost (fallen off the bus)"
        " (availability) [cordon: no backend configured]"
    ) in text
