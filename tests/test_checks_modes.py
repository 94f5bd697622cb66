"""persistence, mig and nvlink: the checks of GPU modes and links."""

from __future__ import annotations

from typing import Any, Literal

import pytest

from gpuagent.checks.common import GpuView, to_finding
from gpuagent.checks.memory import GpuMemory
from gpuagent.checks.settings import check_persistence
from gpuagent.config import MigCheck
from gpuagent.model import GpuReadings, Severity
from test_checks_support import BUS, DEFAULTS, check_once, identity, with_checks


@pytest.mark.parametrize(
    ("mode", "wanted", "severity", "reason", "action", "runbook"),
    [
        # No expectation: the mode is a fact, whichever it is (whole fleets run it off).
        pytest.param(True, None, Severity.OK, "persistence mode on", "none", "", id="on"),
        pytest.param(False, None, Severity.OK, "persistence mode off", "none", "", id="off"),
        pytest.param(None, None, Severity.OK, "persistence mode not reported", "none", "", id="na"),
        pytest.param(
            True, (True, "expected"), Severity.OK, "persistence mode on, as expected", "none", "",
            id="on-as-declared",
        ),
        pytest.param(
            False, (True, "expected"), Severity.WARN, "persistence mode off, expected on",
            "enable_persistence", "gpu-persistence-off", id="off-declared-on",
        ),
        pytest.param(
            False, (True, "baseline"), Severity.WARN, "persistence mode off, baseline on",
            "enable_persistence", "gpu-persistence-off", id="off-learned-on",
        ),
        pytest.param(
            True, (False, "expected"), Severity.WARN, "persistence mode on, expected off",
            "disable_persistence", "gpu-persistence-mismatch", id="on-declared-off",
        ),
        pytest.param(
            False, (False, "baseline"), Severity.OK, "persistence mode off, as baseline", "none",
            "", id="off-as-learned",
        ),
    ],
)  # fmt: skip
def test_persistence_is_judged_only_against_an_expectation(
    mode: bool | None,
    wanted: tuple[bool, str] | None,
    severity: Severity,
    reason: str,
    action: str,
    runbook: str,
) -> None:
    view = GpuView(
        identity(), GpuReadings(persistence_mode=mode), DEFAULTS, GpuMemory(), 0.0,
        persistence_wanted=wanted,
    )  # fmt: skip
    found = to_finding("persistence", BUS, check_persistence(view))
    assert (found.severity, found.reason, found.action) == (severity, reason, action)
    assert found.runbook == runbook


def test_without_an_expectation_persistence_off_is_ok_in_the_engine() -> None:
    assert check_once("persistence", persistence_mode=False).severity is Severity.OK


Expected = Literal["any", "enabled", "disabled"]


@pytest.mark.parametrize(
    ("expected", "current", "pending", "severity", "runbooks"),
    [
        pytest.param("any", None, None, Severity.OK, "", id="any-unsupported"),
        pytest.param("any", True, True, Severity.OK, "", id="any-enabled"),
        pytest.param("any", False, False, Severity.OK, "", id="any-disabled"),
        pytest.param("any", False, True, Severity.WARN, "gpu-mig-pending", id="any-pending"),
        pytest.param("enabled", True, True, Severity.OK, "", id="enabled-as-expected"),
        pytest.param(
            "enabled", False, False, Severity.WARN, "gpu-mig-mismatch", id="enabled-but-off"
        ),
        pytest.param(
            "enabled", None, None, Severity.WARN, "gpu-mig-mismatch", id="enabled-unsupported"
        ),
        pytest.param(
            "enabled",
            False,
            True,
            Severity.WARN,
            "gpu-mig-pending",
            id="enabled-pending-only-needs-reset",
        ),
        pytest.param(
            "enabled",
            True,
            False,
            Severity.WARN,
            "gpu-mig-pending",
            id="enabled-but-disable-pending",
        ),
        pytest.param("disabled", False, False, Severity.OK, "", id="disabled-as-expected"),
        pytest.param("disabled", None, None, Severity.OK, "", id="disabled-unsupported-ok"),
        pytest.param(
            "disabled", True, True, Severity.WARN, "gpu-mig-mismatch", id="disabled-but-on"
        ),
        pytest.param(
            "disabled", True, None, Severity.WARN, "gpu-mig-mismatch", id="pending-unknown"
        ),
    ],
)
def test_mig(
    expected: Expected,
    current: bool | None,
    pending: bool | None,
    severity: Severity,
    runbooks: str,
) -> None:
    config = with_checks(mig=MigCheck(expected=expected))
    found = check_once("mig", config, mig_mode_current=current, mig_mode_pending=pending)
    assert (found.severity, found.runbook) == (severity, runbooks)
    assert found.evidence_dict()["mig_mode_expected"] == expected


@pytest.mark.parametrize(
    ("expected", "current", "pending", "reason", "action"),
    [
        pytest.param(
            "any",
            False,
            True,
            "MIG mode enabled is pending; reset required to apply MIG mode",
            "reset_gpu",
            id="pending",
        ),
        pytest.param(
            "enabled",
            False,
            False,
            "MIG mode is disabled, expected enabled",
            "set_mig_mode",
            id="mismatch",
        ),
        pytest.param(
            "enabled",
            True,
            False,
            "MIG mode disabled is pending; reset required to apply MIG mode",
            "reset_gpu",
            id="wrong-change-pending",
        ),
        pytest.param("any", True, True, "MIG mode enabled", "none", id="ok"),
        pytest.param("any", None, None, "MIG mode not supported", "none", id="unsupported"),
    ],
)
def test_mig_reasons(
    expected: Expected, current: bool | None, pending: bool | None, reason: str, action: str
) -> None:
    config = with_checks(mig=MigCheck(expected=expected))
    found = check_once("mig", config, mig_mode_current=current, mig_mode_pending=pending)
    assert (found.reason, found.action) == (reason, action)


@pytest.mark.parametrize(
    ("links", "severity", "reason"),
    [
        pytest.param((), Severity.OK, "no NVLink", id="no-links"),
        pytest.param((True,) * 18, Severity.OK, "18 of 18 NVLinks up, none down", id="all-up"),
        pytest.param((None, None), Severity.OK, "0 of 2 NVLinks up, none down", id="unknown"),
        pytest.param(
            (True, False, True), Severity.CRITICAL, "NVLink 1 down (1 of 3)", id="one-down"
        ),
        pytest.param(
            (False, True, None, False),
            Severity.CRITICAL,
            "NVLinks 0, 3 down (2 of 4)",
            id="two-down",
        ),
    ],
)
def test_nvlink(links: tuple[bool | None, ...], severity: Severity, reason: str) -> None:
    found = check_once("nvlink", nvlink_up=links)
    assert (found.severity, found.reason) == (severity, reason)
    if severity is Severity.CRITICAL:
        assert (found.action, found.runbook) == ("drain_and_reboot", "gpu-nvlink-down")


def test_nvlink_evidence() -> None:
    evidence: dict[str, Any] = check_once("nvlink", nvlink_up=(True, False, False)).evidence_dict()
    links = {k: evidence[k] for k in ("links", "links_up", "links_down")}
    assert links == {"links": 3, "links_up": 1, "links_down": "1,2"}
