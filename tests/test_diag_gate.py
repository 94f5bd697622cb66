"""DCGM's diagnostic as a remediation gate: after a reset (a failure escalates), before an
uncordon (a failure keeps the node cordoned), when it is unavailable (pass or block), every
run audited; and a reset detaching DCGM from the GPUs first and attaching it after. DCGM is
an in-memory DcgmControl double; the executor, runner, planner and audit trail are real."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest

from gpuagent.config.schema.remediation import RemediationDiag
from gpuagent.dcgm.control import DiagUnavailableError
from gpuagent.dcgm.runner import DiagRunner
from gpuagent.model import DiagResult, DiagTest
from gpuagent.remediation.gpu_ops import GpuOperationError, GpuOps
from test_remediation_executor import HEALTHY, IDLE, Harness, enforce
from test_remediation_planner import BUS0, CRITICAL, OK, config, finding, gpu, snapshot


class FakeDcgm:
    """A DcgmControl: every GPU asked for passes "software" and "memory" except the
    (test, gpu) pairs in ``fail``; ``unavailable``: run_diag raises DiagUnavailableError."""

    def __init__(
        self,
        *,
        fail: set[tuple[str, int]] | None = None,
        unavailable: bool = False,
        can_detach: bool = True,
        flag: Path | None = None,
    ) -> None:
        self.fail = fail or set()
        self.unavailable = unavailable
        self.can_detach = can_detach
        self.flag = flag  # exists while detached
        self.calls: list[tuple[str, object]] = []

    async def run_diag(
        self, level: int, gpu_ids: tuple[int, ...], limit_seconds: float
    ) -> DiagResult:
        self.calls.append(("diag", (level, gpu_ids)))
        if self.unavailable:
            raise DiagUnavailableError("host engine down")
        tests = tuple(
            DiagTest(
                name,
                "fail" if (name, g) in self.fail else "pass",
                g,
                "bad" * ((name, g) in self.fail),
            )
            for name in ("software", "memory")
            for g in gpu_ids or (0, 1)
        )
        now = time.time()
        return DiagResult(level, gpu_ids, now, now, "bindings", tests)

    async def detach_driver(self) -> bool:
        self.calls.append(("detach", None))
        if self.can_detach and self.flag is not None:
            self.flag.touch()
        return self.can_detach

    async def attach_driver(self) -> bool:
        self.calls.append(("attach", None))
        if self.flag is not None:
            self.flag.unlink(missing_ok=True)
        return True


def runner(dcgm: FakeDcgm | None, dcgmi: str | None = None) -> DiagRunner:
    """The real runner over ``dcgm``; dcgmi is found only when ``dcgmi`` is given."""
    return DiagRunner(dcgm=lambda: dcgm, which=lambda _name: dcgmi)


def gated(**diag: object) -> object:
    return enforce(diag=dataclasses.replace(RemediationDiag(), **diag))


def diag_records(h: Harness) -> list[tuple[str, dict[str, object], str]]:
    return [
        (r.result, r.evidence, r.detail)
        for r in reversed(h.executor.audit.recent(1000))
        if r.kind == "diag"
    ]


# --- after a reset ---------------------------------------------------------------------------


async def _reset_and_verify(h: Harness) -> None:
    await h.cycle(IDLE)
    assert h.results("reset_gpu") == ["started", "succeeded"]
    for _ in range(3):
        await h.cycle(HEALTHY)


async def test_a_passed_diagnostic_after_the_reset_verifies_it(tmp_path: Path) -> None:
    dcgm = FakeDcgm()
    h = Harness(tmp_path, gated(), diag=runner(dcgm))
    await _reset_and_verify(h)
    assert h.results("reset_gpu")[-1] == "verified"
    assert dcgm.calls[-1] == ("diag", (1, (0,)))  # level 1 on the reset GPU only
    [(result, evidence, detail)] = diag_records(h)
    assert result == "succeeded"
    assert (evidence["level"], evidence["gpus"], evidence["passed"]) == (1, "0", True)
    assert detail == "passed"
    last = h.executor.audit.last("reset_gpu", BUS0, ("verified",))
    assert last is not None
    assert "DCGM diagnostic level 1 passed" in last.detail


async def test_a_failed_diagnostic_after_the_reset_escalates(tmp_path: Path) -> None:
    h = Harness(tmp_path, gated(), diag=runner(FakeDcgm(fail={("memory", 0)})))
    await _reset_and_verify(h)
    assert h.results("reset_gpu")[-1] == "escalated"
    assert h.results("cordon")[-2:] == ["started", "succeeded"]  # drain and reboot asked for
    [(result, evidence, detail)] = diag_records(h)
    assert result == "failed"
    assert evidence["failed_tests"] == "memory (GPU 0)"
    assert detail == "failed: memory (GPU 0)"


async def test_a_diagnostic_that_could_not_run_escalates(tmp_path: Path) -> None:
    class Broken(FakeDcgm):
        async def run_diag(
            self, level: int, gpu_ids: tuple[int, ...], limit_seconds: float
        ) -> DiagResult:
            return DiagResult(level, gpu_ids, 0.0, 1.0, "bindings", error="NVVS killed")

    h = Harness(tmp_path, gated(), diag=runner(Broken()))
    await _reset_and_verify(h)
    assert h.results("reset_gpu")[-1] == "escalated"
    assert diag_records(h)[0][2] == "could not run: NVVS killed"


@pytest.mark.parametrize(("when", "last"), [("pass", "verified"), ("block", "escalated")])
async def test_an_unavailable_diagnostic_passes_or_blocks(
    tmp_path: Path, when: str, last: str
) -> None:
    h = Harness(tmp_path, gated(when_unavailable=when), diag=runner(None))
    await _reset_and_verify(h)
    assert h.results("reset_gpu")[-1] == last
    [(result, _evidence, detail)] = diag_records(h)
    assert result == "skipped"
    assert "dcgmi is not installed" in detail


async def test_an_unavailable_host_engine_without_dcgmi_is_unavailable(tmp_path: Path) -> None:
    dcgm = FakeDcgm(unavailable=True)
    h = Harness(tmp_path, gated(when_unavailable="block"), diag=runner(dcgm))
    await _reset_and_verify(h)
    assert h.results("reset_gpu")[-1] == "escalated"
    assert "host engine down" in diag_records(h)[0][2]


async def test_level_0_runs_no_diagnostic_after_a_reset(tmp_path: Path) -> None:
    dcgm = FakeDcgm(fail={("memory", 0)})
    h = Harness(tmp_path, gated(after_reset_level=0), diag=runner(dcgm))
    await _reset_and_verify(h)
    assert h.results("reset_gpu")[-1] == "verified"
    assert dcgm.calls == []
    assert diag_records(h) == []


# --- before an uncordon ----------------------------------------------------------------------

OFF_BUS = finding("bus", CRITICAL, "GPU has fallen off the bus")
BUS_OK = snapshot(finding("bus", OK, "ok"), gpus=(gpu(), gpu("0000:2a:00.0", 1)))


def recovering(**diag: object) -> object:
    section = gated(**diag)
    cordon = dataclasses.replace(config().cordon, uncordon_after_recovery=True)
    return dataclasses.replace(section, cordon=cordon)  # type: ignore[type-var]


async def _cordon_then_recover(h: Harness) -> None:
    await h.cycle(snapshot(OFF_BUS, gpus=(gpu(), gpu("0000:2a:00.0", 1))))
    assert h.results("cordon") == ["started", "succeeded"]
    await h.cycle(BUS_OK)
    await h.cycle(BUS_OK, advance=1801)  # past cordon.healthy_hold_seconds


async def test_a_failed_diagnostic_keeps_the_node_cordoned(tmp_path: Path) -> None:
    dcgm = FakeDcgm(fail={("software", 0)})
    h = Harness(tmp_path, recovering(), diag=runner(dcgm))
    await _cordon_then_recover(h)
    # Only the GPU the cordon was for is tested.
    assert dcgm.calls == [("diag", (1, (0,)))]
    assert h.results("uncordon") == ["refused"]
    refused = h.executor.audit.last("uncordon", None, ("refused",))
    assert refused is not None
    assert "software (GPU 0)" in refused.detail
    assert "stays cordoned" in refused.detail
    assert h.backend.cordoned
    assert "uncordon" not in [kind for kind, _ in h.backend.requests]
    assert [r[0] for r in diag_records(h)] == ["failed"]


async def test_a_passed_diagnostic_lets_the_uncordon_through(tmp_path: Path) -> None:
    dcgm = FakeDcgm()
    h = Harness(tmp_path, recovering(before_uncordon_level=2), diag=runner(dcgm))
    await _cordon_then_recover(h)
    assert dcgm.calls == [("diag", (2, (0,)))]
    assert h.results("uncordon") == ["started", "succeeded"]
    assert not h.backend.cordoned
    assert [r[0] for r in diag_records(h)] == ["succeeded"]


@pytest.mark.parametrize(("when", "uncordoned"), [("pass", True), ("block", False)])
async def test_an_unavailable_diagnostic_before_the_uncordon(
    tmp_path: Path, when: str, uncordoned: bool
) -> None:
    h = Harness(tmp_path, recovering(when_unavailable=when), diag=runner(None))
    await _cordon_then_recover(h)
    assert h.backend.cordoned is not uncordoned
    assert [r[0] for r in diag_records(h)] == ["skipped"]


async def test_observe_mode_runs_no_diagnostic_before_an_uncordon(tmp_path: Path) -> None:
    dcgm = FakeDcgm()
    section = dataclasses.replace(recovering(), mode="observe")  # type: ignore[type-var]
    h = Harness(tmp_path, section, diag=runner(dcgm))
    await h.cycle(snapshot(OFF_BUS))
    assert dcgm.calls == []


# --- a reset with DCGM holding the GPUs --------------------------------------------------------


def _ops(tmp_path: Path, dcgm: FakeDcgm, command: str) -> GpuOps:
    return GpuOps(reset_command=command, timeout=10.0, dcgm=lambda: dcgm)


async def test_a_reset_detaches_dcgm_first_and_attaches_it_after(tmp_path: Path) -> None:
    flag = tmp_path / "detached"
    dcgm = FakeDcgm(flag=flag)
    # The reset command succeeds only while DCGM has let go of the GPUs.
    ops = _ops(tmp_path, dcgm, f"test -e {flag}")
    await ops.reset(BUS0, 0)
    assert [c for c, _ in dcgm.calls] == ["detach", "attach"]
    assert not flag.exists()


async def test_a_failed_reset_attaches_dcgm_again(tmp_path: Path) -> None:
    dcgm = FakeDcgm(flag=tmp_path / "detached")
    ops = _ops(tmp_path, dcgm, "false")
    with pytest.raises(GpuOperationError):
        await ops.reset(BUS0, 0)
    assert [c for c, _ in dcgm.calls] == ["detach", "attach"]


async def test_a_dcgm_that_cannot_detach_is_not_attached(tmp_path: Path) -> None:
    dcgm = FakeDcgm(can_detach=False)
    ops = _ops(tmp_path, dcgm, "true")
    assert await ops.reset(BUS0, 0) == "reset"
    assert [c for c, _ in dcgm.calls] == ["detach"]


async def test_a_detach_error_does_not_stop_the_reset(tmp_path: Path) -> None:
    class Failing(FakeDcgm):
        async def detach_driver(self) -> bool:
            raise RuntimeError("DCGM_ST_NOT_SUPPORTED")

    dcgm = Failing()
    ops = _ops(tmp_path, dcgm, "true")
    assert await ops.reset(BUS0, 0) == "reset"
    assert dcgm.calls == []  # never attached what was not detached


async def test_without_dcgm_a_reset_is_just_the_command(tmp_path: Path) -> None:
    ops = GpuOps(reset_command="true", timeout=10.0)
    assert await ops.reset(BUS0, 0) == "reset"
