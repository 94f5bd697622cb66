from __future__ import annotations

import pytest

from gpuagent.checks import CHECK_NAMES
from gpuagent.model import GpuReadings, GpuState, GpuStatus, Severity
from test_checks_support import (
    BUS,
    EVENT_CHECKS,
    OTHER_BUS,
    event,
    finding,
    gpu,
    identity,
    run,
)


@pytest.mark.parametrize(
    ("state", "severity", "reason", "action", "runbook"),
    [
        pytest.param(gpu("ok"), Severity.OK, "GPU responds to NVML", "none", "", id="ok"),
        pytest.param(
            gpu("lost", error="GPU is lost"),
            Severity.CRITICAL,
            "GPU has fallen off the bus / is lost (NVML GPU_IS_LOST)",
            "drain_and_reboot",
            "gpu-lost",
            id="lost",
        ),
        pytest.param(
            gpu("timeout", error="nvmlDeviceGetTemperature took longer than 2 s"),
            Severity.UNKNOWN,
            "nvml_timeout: nvmlDeviceGetTemperature took longer than 2 s",
            "investigate",
            "gpu-nvml-timeout",
            id="timeout-with-error-text",
        ),
        pytest.param(
            gpu("timeout"),
            Severity.UNKNOWN,
            "nvml_timeout: no error text",
            "investigate",
            "gpu-nvml-timeout",
            id="timeout-without-error-text",
        ),
        pytest.param(
            gpu("error", error="NVML_ERROR_UNKNOWN"),
            Severity.UNKNOWN,
            "nvml_error: NVML_ERROR_UNKNOWN",
            "investigate",
            "gpu-nvml-error",
            id="error",
        ),
    ],
)
def test_availability(
    state: GpuState, severity: Severity, reason: str, action: str, runbook: str
) -> None:
    health, _ = run(state)
    found = finding(health, "availability")
    assert (found.severity, found.reason, found.action, found.runbook) == (
        severity,
        reason,
        action,
        runbook,
    )
    assert found.evidence_dict()["status"] == state.status


@pytest.mark.parametrize(
    ("status", "action", "runbook"),
    [
        pytest.param("lost", "drain_and_reboot", "gpu-lost", id="lost"),
        pytest.param("timeout", "investigate", "gpu-nvml-timeout", id="timeout"),
        pytest.param("error", "investigate", "gpu-nvml-error", id="error"),
    ],
)
def test_gpu_without_readings_makes_every_readings_check_unknown(
    status: GpuStatus, action: str, runbook: str
) -> None:
    health, _ = run(gpu(status, error="boom"))
    others = [f for f in health.for_gpu(BUS) if f.check != "availability"]
    assert [f.check for f in others] == list(CHECK_NAMES[1:])
    for found in others:
        if found.check in EVENT_CHECKS:
            continue
        assert found.severity is Severity.UNKNOWN
        assert found.reason == f"no data: GPU {status}"
        assert (found.action, found.runbook) == (action, runbook)


def test_event_checks_still_judge_a_gpu_without_readings() -> None:
    # A GPU that stopped answering is exactly when its kernel-log lines matter: they say why.
    timeout = event(
        "xid",
        "NVRM: Xid (PCI:0000:18:00): 119, pid=2024380, name=nvidia-smi, Timeout after 6s of "
        "waiting for RPC response from GPU0 GSP!",
        code=119,
    )
    health, _ = run(gpu("timeout", error="slow"), events=(timeout,))
    assert finding(health, "xid").severity is Severity.CRITICAL
    assert finding(health, "bus").severity is Severity.OK  # no "fallen off the bus" line
    assert finding(health, "aer").severity is Severity.OK


def test_a_lost_gpus_xid_79_is_evidence_of_its_availability_finding() -> None:
    # Xid 79 and GPU_IS_LOST are one fault: one finding, with both evidences.
    fallen = event(
        "xid",
        "NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, "
        "GPU has fallen off the bus.",
        code=79,
    )
    health, _ = run(gpu("lost"), events=(fallen,))
    lost = finding(health, "availability")
    assert (lost.severity, lost.cause) == (Severity.CRITICAL, "gpu-lost")
    assert (lost.evidence_dict()["status"], lost.evidence_dict()["xid"]) == ("lost", 79)
    assert finding(health, "xid").severity is Severity.OK


def test_no_data_does_not_mask_a_lost_gpu() -> None:
    health, _ = run(gpu("lost"))
    assert finding(health, "availability").severity is Severity.CRITICAL
    # CRITICAL outranks the UNKNOWN "no data" findings, so the GPU reads as failed.
    assert health.gpu_severity(BUS) is Severity.CRITICAL
    assert health.problems(BUS)[0].check == "availability"


def test_readings_on_a_gpu_that_is_not_ok_are_ignored() -> None:
    hot = GpuReadings(temperature_c=120.0, ecc_dbe_volatile=5)
    state = GpuState(identity=identity(), status="timeout", readings=hot, error="slow")
    health, _ = run(state)
    assert finding(health, "ecc").reason == "no data: GPU timeout"
    assert finding(health, "thermal").severity is Severity.UNKNOWN


def test_ok_status_without_readings_is_unknown_data_but_available() -> None:
    health, _ = run(GpuState(identity=identity(), status="ok", readings=None))
    assert finding(health, "availability").severity is Severity.OK
    ecc = finding(health, "ecc")
    assert (ecc.severity, ecc.reason) == (Severity.UNKNOWN, "no data: GPU returned no readings")


def test_one_lost_gpu_leaves_the_others_checked() -> None:
    healthy = gpu(ident=identity(OTHER_BUS, index=1), temperature_c=40.0)
    health, _ = run(gpu("lost"), healthy)
    assert finding(health, "thermal", OTHER_BUS).severity is Severity.OK
    assert finding(health, "thermal", BUS).severity is Severity.UNKNOWN
