"""`gpuagent.dcgm.diag.validate` against the DCGM stand-in bindings (tests/dcgm_standin):
the request it builds, and DCGM's response per test and GPU (pass, fail, warn, skip, not
run, messages), and a diagnostic that cannot run."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from gpuagent.dcgm.diag import validate
from gpuagent.dcgm.runner import failed_tests

STANDIN = Path(__file__).resolve().parent / "dcgm_standin"
MODULES = ("_standin_engine", "dcgm_structs", "dcgm_agent", "dcgm_fields", "dcgmvalue", "pydcgm")


class Dcgm:
    def __init__(self, modules: dict[str, ModuleType], control: Any) -> None:
        self.agent = modules["dcgm_agent"]
        self.structs = modules["dcgm_structs"]
        self.control = control
        self.handle = modules["pydcgm"].DcgmHandle(ipAddress="127.0.0.1:5555")

    def validate(self, level: int, gpus: tuple[int, ...] = ()) -> Any:
        return validate(self.agent, self.structs, self.handle.handle, level, gpus)

    def last_call(self) -> dict[str, Any]:
        calls: list[dict[str, Any]] = self.control.calls("dcgmActionValidate_v2")
        return calls[-1]


@pytest.fixture
def dcgm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Dcgm]:
    monkeypatch.syspath_prepend(str(STANDIN))
    stale = [name for name in sys.modules if name in MODULES or name.startswith(("dcgm", "Dcgm"))]
    for name in stale:
        sys.modules.pop(name)
    engine = importlib.import_module("_standin_engine")
    control = engine.Control(tmp_path / "dcgm.json")  # two GPUs, all up
    monkeypatch.setenv(engine.STATE_ENV, str(control.path))
    modules = {name: importlib.import_module(name) for name in MODULES}
    d = Dcgm(modules, control)
    yield d
    d.handle.Shutdown()
    engine.reset_process()
    for name in [n for n in sys.modules if n in MODULES or n.startswith(("dcgm", "Dcgm"))]:
        sys.modules.pop(name)


def outcomes(result: Any) -> dict[tuple[str, int | None], str]:
    return {(t.name, t.gpu): t.outcome for t in result.tests}


def test_a_passing_level_1(dcgm: Dcgm) -> None:
    result = dcgm.validate(1)
    assert (result.via, result.level, result.error) == ("bindings", 1, "")
    assert result.passed
    assert outcomes(result) == {("software", 0): "pass", ("software", 1): "pass"}
    # No GPU named: every GPU, as DCGM's entity list says it.
    call = dcgm.last_call()
    assert (call["level"], call["gpus"]) == (1, [0, 1])


def test_a_failure_on_one_gpu_with_dcgms_message(dcgm: Dcgm) -> None:
    dcgm.control.set_diag_test(
        "memory",
        results={1: "fail"},
        errors=[{"gpu": 1, "code": 52, "msg": "A memory mismatch was detected on GPU 1"}],
        info=[{"gpu": 0, "msg": "allocated 95% of the framebuffer"}],
    )
    result = dcgm.validate(2, (0, 1))
    assert not result.passed
    assert failed_tests(result) == ["memory (GPU 1)"]
    assert result.failures(0) == ()
    [failure] = result.failures(1)
    assert failure.info == "A memory mismatch was detected on GPU 1"
    passed = next(t for t in result.tests if (t.name, t.gpu) == ("memory", 0))
    assert passed.info == "allocated 95% of the framebuffer"
    assert outcomes(result)[("pcie", 1)] == "pass"


def test_warn_skip_and_not_run_do_not_fail(dcgm: Dcgm) -> None:
    dcgm.control.set_diag_test(
        "pcie", default="warn", errors=[{"gpu": 0, "code": 69, "msg": "link width x8"}]
    )
    dcgm.control.set_diag_test("memory", results={0: "skip", 1: "notrun"})
    result = dcgm.validate(2)
    assert result.passed
    assert outcomes(result) == {
        ("software", 0): "pass",
        ("software", 1): "pass",
        ("pcie", 0): "warn",
        ("pcie", 1): "warn",
        ("memory", 0): "skip",
        ("memory", 1): "notrun",
    }
    assert next(t for t in result.tests if (t.name, t.gpu) == ("pcie", 0)).info == "link width x8"


def test_only_the_gpus_asked_for(dcgm: Dcgm) -> None:
    result = dcgm.validate(3, (1,))
    call = dcgm.last_call()
    assert (call["level"], call["gpus"]) == (3, [1])
    assert result.gpus == (1,)
    assert {t.gpu for t in result.tests} == {1}
    assert [t.name for t in result.tests][:3] == ["software", "pcie", "memory"]


def test_a_diagnostic_that_cannot_run_is_an_error(dcgm: Dcgm) -> None:
    dcgm.control.set_diag_error(dcgm.structs.DCGM_ST_NVVS_ERROR, "the NVVS binary crashed")
    result = dcgm.validate(1)
    assert not result.passed
    assert result.tests == ()
    assert "could not run" in result.error
    assert "the NVVS binary crashed" in result.error


def test_a_diagnostic_already_running(dcgm: Dcgm) -> None:
    dcgm.control.set_diag_error(dcgm.structs.DCGM_ST_DIAG_ALREADY_RUNNING, "another one runs")
    result = dcgm.validate(1)
    assert not result.passed
    assert "another one runs" in result.error


def test_an_unknown_gpu_is_refused_by_dcgm(dcgm: Dcgm) -> None:
    result = dcgm.validate(1, (7,))
    assert not result.passed
    assert result.error


def test_a_detached_driver_cannot_be_diagnosed(dcgm: Dcgm) -> None:
    dcgm.agent.dcgmDetachDriver(dcgm.handle.handle)
    result = dcgm.validate(1)
    assert not result.passed
    assert "detached" in result.error


def test_no_such_level(dcgm: Dcgm) -> None:
    result = dcgm.validate(5)
    assert "no diagnostic level 5" in result.error
    assert dcgm.control.calls("dcgmActionValidate_v2") == []


def test_the_request_struct(dcgm: Dcgm) -> None:
    from gpuagent.dcgm.diag import _request  # noqa: PLC0415

    request, version = _request(dcgm.structs, 3, (0, 2))
    assert isinstance(request, dcgm.structs.c_dcgmRunDiag_v10)
    assert version == request.version == dcgm.structs.dcgmRunDiag_version10
    assert request.validate == 3
    assert request.entityIds == "0,2"
    assert request.flags & dcgm.structs.DCGM_RUN_FLAGS_VERBOSE
    everything, _ = _request(dcgm.structs, 1, ())
    assert everything.entityIds == "*"
