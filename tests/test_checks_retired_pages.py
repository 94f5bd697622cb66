from __future__ import annotations

from typing import Any

import pytest

from gpuagent.model import Severity
from test_checks_support import check_once


@pytest.mark.parametrize(
    ("readings", "severity", "reason", "action", "runbook"),
    [
        pytest.param(
            {}, Severity.OK, "page retirement not supported", "none", "", id="unsupported"
        ),
        pytest.param(
            {"retired_pages_sbe": 0, "retired_pages_dbe": 0, "retired_pages_pending": False},
            Severity.OK,
            "0 retired pages, none pending",
            "none",
            "",
            id="clean",
        ),
        pytest.param(
            {"retired_pages_sbe": 1, "retired_pages_dbe": 0, "retired_pages_pending": False},
            Severity.OK,
            "1 retired page, none pending",
            "none",
            "",
            id="one-retired-is-ok",
        ),
        pytest.param(
            {"retired_pages_sbe": 2, "retired_pages_dbe": 1, "retired_pages_pending": True},
            Severity.WARN,
            "pages pending retirement; reset required",
            "reset_gpu",
            "gpu-retired-pages-pending",
            id="pending",
        ),
        pytest.param(
            {"retired_pages_sbe": 40, "retired_pages_dbe": 19, "retired_pages_pending": False},
            Severity.OK,
            "59 retired pages, none pending",
            "none",
            "",
            id="59-below-limit",
        ),
        pytest.param(
            {"retired_pages_sbe": 40, "retired_pages_dbe": 20, "retired_pages_pending": False},
            Severity.WARN,
            "60 retired pages (20 DBE, 40 SBE), at or above the 60-page replacement guidance",
            "contact_support",
            "gpu-retired-pages-limit",
            id="60-at-limit",
        ),
        pytest.param(
            {"retired_pages_dbe": 64},
            Severity.WARN,
            "64 retired pages (64 DBE, 0 SBE), at or above the 60-page replacement guidance",
            "contact_support",
            "gpu-retired-pages-limit",
            id="dbe-only-counter",
        ),
        pytest.param(
            {"retired_pages_sbe": 50, "retired_pages_dbe": 20, "retired_pages_pending": True},
            Severity.WARN,
            "pages pending retirement; reset required; 70 retired pages (20 DBE, 50 SBE), "
            "at or above the 60-page replacement guidance",
            "reset_gpu",
            "gpu-retired-pages-pending",
            id="pending-and-over-limit",
        ),
    ],
)
def test_retired_pages(
    readings: dict[str, Any], severity: Severity, reason: str, action: str, runbook: str
) -> None:
    found = check_once("retired_pages", **readings)
    assert (found.severity, found.reason, found.action, found.runbook) == (
        severity,
        reason,
        action,
        runbook,
    )


@pytest.mark.parametrize(
    ("readings", "severity", "reason", "action", "runbook"),
    [
        pytest.param({}, Severity.OK, "row remapping not supported", "none", "", id="unsupported"),
        pytest.param(
            {"row_remap_pending": False, "row_remap_failure": False},
            Severity.OK,
            "no row remap pending or failed",
            "none",
            "",
            id="clean",
        ),
        pytest.param(
            {"remapped_rows_correctable": 3, "row_remap_pending": False},
            Severity.OK,
            "no row remap pending or failed",
            "none",
            "",
            id="remapped-rows-alone-are-ok",
        ),
        pytest.param(
            {"row_remap_pending": True, "row_remap_failure": False},
            Severity.WARN,
            "row remap pending; reset required",
            "reset_gpu",
            "gpu-row-remap-pending",
            id="pending",
        ),
        pytest.param(
            {"row_remap_pending": False, "row_remap_failure": True},
            Severity.CRITICAL,
            "row remapping failed: no spare rows left",
            "reseat_or_replace",
            "gpu-row-remap-failure",
            id="failure",
        ),
        pytest.param(
            {"row_remap_pending": True, "row_remap_failure": True},
            Severity.CRITICAL,
            "row remapping failed: no spare rows left; row remap pending; reset required",
            "reseat_or_replace",
            "gpu-row-remap-failure",
            id="failure-outranks-pending",
        ),
    ],
)
def test_row_remap(
    readings: dict[str, Any], severity: Severity, reason: str, action: str, runbook: str
) -> None:
    found = check_once("row_remap", **readings)
    assert (found.severity, found.reason, found.action, found.runbook) == (
        severity,
        reason,
        action,
        runbook,
    )


def test_row_remap_evidence() -> None:
    found = check_once(
        "row_remap",
        remapped_rows_correctable=2,
        remapped_rows_uncorrectable=1,
        row_remap_pending=True,
        row_remap_failure=False,
        remap_banks=(2555, 3, 1, 1, 0),
    )
    assert found.evidence_dict() == {
        "remapped_rows_correctable": 2,
        "remapped_rows_uncorrectable": 1,
        "row_remap_pending": True,
        "row_remap_failure": False,
        "remap_banks_low": 1,
        "remap_banks_none": 0,
    }
