"""The executor's rails, one at a time: cooldown, mode, kill switch, budgets that survive a
new executor, preconditions, verification and escalation, power cap and restore, and
someone else's cordon. The cordon backend and GPU operations are in-memory doubles at
their boundary; the planner and the audit trail are the real ones."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from gpuagent.config import RemediationBudgets, RemediationSection
from gpuagent.model import GpuProcess, NodeSnapshot
from gpuagent.remediation.audit import AuditStore
from gpuagent.remediation.executor import Remediator
from gpuagent.remediation.gpu_ops import GpuOperationError
from gpuagent.remediation.types import CordonRequest, CordonResult, CordonState
from test_remediation_planner import BUS0, CRITICAL, OK, WARN, config, finding, gpu, snapshot

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
