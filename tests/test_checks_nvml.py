from __future__ import annotations

import pytest

from gpuagent.model import NvmlInitProblem, NvmlStatus, Severity
from test_checks_support import finding, run


@pytest.mark.parametrize(
    ("problem", "message", "reason", "action", "runbook"),
    [
        pytest.param(
            "driver_not_loaded",
            "NVML_ERROR_DRIVER_NOT_LOADED",
            "NVIDIA driver not loaded: NVML_ERROR_DRIVER_NOT_LOADED",
            "load_driver",
            "nvml-driver-not-loaded",
            id="driver-not-loaded",
        ),
        pytest.param(
            "library_not_found",
            "libnvidia-ml.so.1: cannot open shared object file",
            "NVML library not found: libnvidia-ml.so.1: cannot open shared object file",
            "install_driver",
            "nvml-library-not-found",
            id="library-not-found",
        ),
        pytest.param(
            "version_mismatch",
            "Driver/library version mismatch",
            "driver/library version mismatch: Driver/library version mismatch",
            "reboot",
            "nvml-version-mismatch",
            id="version-mismatch",
        ),
        pytest.param(
            "no_permission",
            "NVML_ERROR_NO_PERMISSION",
            "no permission to use NVML: NVML_ERROR_NO_PERMISSION",
            "run_as_root",
            "nvml-no-permission",
            id="no-permission",
        ),
        pytest.param(
            "timeout",
            "nvmlInit took longer than 2 s",
            "NVML timed out: nvmlInit took longer than 2 s",
            "investigate",
            "nvml-timeout",
            id="timeout",
        ),
        pytest.param(
            "other",
            "NVML_ERROR_UNKNOWN",
            "NVML failed: NVML_ERROR_UNKNOWN",
            "investigate",
            "nvml-error",
            id="other",
        ),
        pytest.param(None, "", "NVML failed", "investigate", "nvml-error", id="unclassified"),
        pytest.param(
            "driver_not_loaded",
            "",
            "NVIDIA driver not loaded",
            "load_driver",
            "nvml-driver-not-loaded",
            id="no-message",
        ),
    ],
)
def test_nvml_failures(
    problem: NvmlInitProblem | None, message: str, reason: str, action: str, runbook: str
) -> None:
    health, _ = run(nvml=NvmlStatus(ok=False, problem=problem, message=message))
    found = finding(health, "nvml", bus=None)
    assert (found.severity, found.reason, found.action, found.runbook) == (
        Severity.CRITICAL,
        reason,
        action,
        runbook,
    )
    assert found.evidence_dict()["problem"] == problem
    assert found.evidence_dict()["message"] == message
    assert health.severity is Severity.CRITICAL


def test_nvml_ok() -> None:
    status = NvmlStatus(ok=True, driver_version="550.54.15", nvml_version="12.550.54.15")
    health, _ = run(nvml=status)
    found = finding(health, "nvml", bus=None)
    assert (found.severity, found.reason, found.action, found.runbook) == (
        Severity.OK,
        "NVML usable (driver 550.54.15)",
        "none",
        "",
    )
    assert found.evidence_dict()["nvml_version"] == "12.550.54.15"
    # No GPUs: the node findings are all there is, NVML's first.
    assert health.findings[0] == found
    assert [f.check for f in health.findings] == ["nvml", "sxid", "kernel", "state_dir"]


def test_nvml_finding_comes_first_among_node_findings() -> None:
    health, _ = run(nvml=NvmlStatus(ok=True))
    assert [f.check for f in health.node_findings()] == ["nvml", "sxid", "kernel", "state_dir"]
    assert health.node_findings()[0].reason == "NVML usable"
