from __future__ import annotations

from typing import Any

import pytest

from gpuagent.config import EccCheck
from gpuagent.model import Severity
from test_checks_support import check_once, check_series, identity, with_checks

HOURLY_100 = with_checks(ecc=EccCheck(sbe_rate_per_hour=100.0, rate_window_seconds=3600.0))


@pytest.mark.parametrize(
    ("readings", "severity", "reason", "action", "runbook"),
    [
        pytest.param({}, Severity.OK, "ECC not supported", "none", "", id="all-none-unsupported"),
        pytest.param(
            {"ecc_enabled": True, "ecc_dbe_volatile": 0, "ecc_sbe_volatile": 3},
            Severity.OK,
            "no uncorrectable ECC errors; corrected error rate normal",
            "none",
            "",
            id="clean",
        ),
        pytest.param(
            {"ecc_enabled": True, "ecc_dbe_volatile": 1},
            Severity.CRITICAL,
            "1 uncorrectable ECC error since the last reset",
            "drain_and_reset",
            "gpu-ecc-dbe",
            id="one-dbe",
        ),
        pytest.param(
            {"ecc_enabled": True, "ecc_dbe_volatile": 2},
            Severity.CRITICAL,
            "2 uncorrectable ECC errors since the last reset",
            "drain_and_reset",
            "gpu-ecc-dbe",
            id="two-dbe",
        ),
        pytest.param(
            {"ecc_enabled": True, "ecc_dbe_volatile": 0, "ecc_dbe_aggregate": 7},
            Severity.OK,
            "no uncorrectable ECC errors; corrected error rate normal",
            "none",
            "",
            id="old-aggregate-dbe-only-is-history",
        ),
        pytest.param(
            {"ecc_enabled": False},
            Severity.WARN,
            "ECC is disabled (this board ships with it on)",
            "enable_ecc",
            "gpu-ecc-disabled",
            id="disabled",
        ),
        pytest.param(
            {"ecc_enabled": False, "ecc_dbe_volatile": 1},
            Severity.CRITICAL,
            "1 uncorrectable ECC error since the last reset; "
            "ECC is disabled (this board ships with it on)",
            "drain_and_reset",
            "gpu-ecc-dbe",
            id="dbe-and-disabled-worst-first",
        ),
        pytest.param(
            {"ecc_sbe_volatile": 0},
            Severity.OK,
            "no uncorrectable ECC errors; corrected error rate normal",
            "none",
            "",
            id="only-one-counter-supported",
        ),
    ],
)
def test_ecc_single_poll(
    readings: dict[str, Any], severity: Severity, reason: str, action: str, runbook: str
) -> None:
    found = check_once("ecc", **readings)
    assert (found.severity, found.reason, found.action, found.runbook) == (
        severity,
        reason,
        action,
        runbook,
    )


def test_ecc_evidence_has_the_raw_numbers() -> None:
    found = check_once("ecc", ecc_enabled=True, ecc_dbe_volatile=2, ecc_sbe_aggregate=9)
    evidence = found.evidence_dict()
    assert evidence["dbe_volatile"] == 2
    assert evidence["sbe_aggregate"] == 9
    assert evidence["ecc_enabled"] is True
    assert evidence["sbe_rate_limit_per_hour"] == 100.0
    assert evidence["sbe_rate_per_hour"] is None  # one sample is no rate


def _sbe(aggregate: int | None = None, volatile: int | None = None) -> dict[str, Any]:
    return {"ecc_enabled": True, "ecc_sbe_aggregate": aggregate, "ecc_sbe_volatile": volatile}


@pytest.mark.parametrize(
    ("steps", "severity", "rate"),
    [
        pytest.param([(0.0, _sbe(10))], Severity.OK, None, id="one-sample-no-rate"),
        pytest.param(
            [(5.0, _sbe(10)), (5.0, _sbe(500))], Severity.OK, None, id="same-instant-no-rate"
        ),
        pytest.param(
            [(0.0, _sbe(10)), (3600.0, _sbe(110))], Severity.OK, 100.0, id="at-limit-is-ok"
        ),
        pytest.param(
            [(0.0, _sbe(10)), (3600.0, _sbe(111))], Severity.WARN, 101.0, id="just-above-limit"
        ),
        # Until the series spans the whole hour, the errors seen so far count against the
        # hour: 2 in the first minute is 2 per hour, not 120.
        pytest.param(
            [(0.0, _sbe(0)), (60.0, _sbe(2))],
            Severity.OK,
            2.0,
            id="short-span-counts-against-the-whole-window",
        ),
        pytest.param(
            [(0.0, _sbe(0)), (5.0, _sbe(1))],
            Severity.OK,
            1.0,  # extrapolated from 5 s this would be 720 per hour
            id="one-sbe-right-after-start-stays-ok",
        ),
        pytest.param(
            [(0.0, _sbe(0)), (60.0, _sbe(40)), (120.0, _sbe(101))],
            Severity.WARN,
            101.0,  # 101 errors within the first two minutes already exceed 100 per hour
            id="burst-above-the-limit-in-the-first-minutes-warns",
        ),
        pytest.param(
            [(0.0, _sbe(0)), (1200.0, _sbe(5)), (2400.0, _sbe(10)), (3600.0, _sbe(120))],
            Severity.WARN,
            120.0,  # the last poll alone would be 110 in 1200 s: 330 per hour
            id="several-polls-first-to-last",
        ),
        pytest.param(
            [(0.0, _sbe(volatile=0)), (3600.0, _sbe(volatile=120))],
            Severity.WARN,
            120.0,
            id="falls-back-to-volatile",
        ),
        pytest.param(
            [(0.0, _sbe(1000, volatile=0)), (1800.0, _sbe(1010, volatile=500))],
            Severity.OK,
            10.0,  # the volatile counter would give 500 per hour
            id="aggregate-preferred-over-volatile",
        ),
        pytest.param(
            [(0.0, _sbe(0)), (1800.0, _sbe(100)), (3600.0, _sbe(5)), (5400.0, _sbe(10))],
            Severity.OK,
            5.0,  # 5 errors since the reset at 3600 s, over the hour
            id="counter-reset-restarts-the-series",
        ),
        pytest.param(
            [(0.0, _sbe(0)), (1800.0, _sbe(500)), (3600.0, _sbe(0))],
            Severity.OK,
            None,
            id="counter-reset-never-negative",
        ),
        pytest.param(
            [(0.0, _sbe(0)), (60.0, _sbe(500)), (4000.0, _sbe(500)), (4060.0, _sbe(501))],
            Severity.OK,
            1.0,  # only the 4000 s and 4060 s samples are inside the hour
            id="burst-ages-out-of-the-window",
        ),
        pytest.param(
            [(0.0, _sbe(10)), (1800.0, _sbe()), (3600.0, _sbe(110))],
            Severity.OK,
            100.0,
            id="missing-sample-keeps-series",
        ),
        pytest.param(
            [(0.0, _sbe(0)), (1800.0, _sbe(volatile=150)), (3600.0, _sbe(volatile=300))],
            Severity.WARN,
            150.0,  # 150 -> 300 on the volatile counter; mixing counters would count 0 -> 300
            id="switching-counter-restarts-the-series",
        ),
    ],
)
def test_sbe_rate_over_polls(
    steps: list[tuple[float, dict[str, Any]]], severity: Severity, rate: float | None
) -> None:
    last = check_series("ecc", steps, config=HOURLY_100)[-1]
    assert last.severity is severity
    assert last.evidence_dict()["sbe_rate_per_hour"] == pytest.approx(rate)
    if severity is Severity.WARN:
        assert (last.action, last.runbook) == ("investigate", "gpu-ecc-sbe-rate")
        assert "corrected ECC error" in last.reason
        assert last.reason.endswith("above 100 per hour")


# The reason's numbers are what was seen: the count, its span, and count / span per hour.
# Early in the window the errors are judged against the whole window (no alarm from one
# error after a start), so a WARN's real rate is always at least the limit it names.
@pytest.mark.parametrize(
    ("steps", "reason"),
    [
        pytest.param(
            [(0.0, _sbe(0)), (441.8, _sbe(253))],
            "253 corrected ECC errors in 441.8 s (about 2,062 per hour), above 100 per hour",
            id="early-in-the-window",
        ),
        pytest.param(
            [(0.0, _sbe(10)), (3600.0, _sbe(111))],
            "101 corrected ECC errors in 3600 s (about 101 per hour), above 100 per hour",
            id="a-whole-window",
        ),
        pytest.param(
            [(0.0, _sbe(0)), (60.0, _sbe(40)), (120.0, _sbe(101))],
            "101 corrected ECC errors in 120 s (about 3,030 per hour), above 100 per hour",
            id="a-burst-in-the-first-minutes",
        ),
    ],
)
def test_the_rate_reason_states_the_count_its_span_and_the_real_rate(
    steps: list[tuple[float, dict[str, Any]]], reason: str
) -> None:
    last = check_series("ecc", steps, config=HOURLY_100)[-1]
    assert last.severity is Severity.WARN
    assert last.reason == reason


# RTX 4090 captures: ECC mode Disabled on every GPU of a healthy node; the RTX 4000 SFF Ada
# and RTX PRO 6000 Blackwell workstation boards ship with ECC off too.
@pytest.mark.parametrize("brand", ["GeForce", "Titan", "NVIDIA RTX", "Quadro", "Quadro RTX"])
def test_ecc_off_on_a_board_that_ships_with_it_off_is_a_fact(brand: str) -> None:
    found = check_once("ecc", ident=identity(brand=brand), ecc_enabled=False)
    assert (found.severity, found.reason) == (Severity.OK, "ECC off, as this board ships")


@pytest.mark.parametrize("brand", ["NVIDIA", "Tesla"])
def test_ecc_off_on_a_data_centre_board_is_still_warn(brand: str) -> None:
    found = check_once("ecc", ident=identity(brand=brand), ecc_enabled=False)
    assert (found.severity, found.runbook) == (Severity.WARN, "gpu-ecc-disabled")


@pytest.mark.parametrize(
    ("brand", "default", "severity"),
    [
        pytest.param("NVIDIA RTX", True, Severity.WARN, id="workstation-shipped-on"),
        pytest.param("NVIDIA", False, Severity.OK, id="data-centre-shipped-off"),
    ],
)
def test_the_boards_own_default_ecc_mode_wins_over_its_class(
    brand: str, default: bool, severity: Severity
) -> None:
    ident = identity(brand=brand, ecc_default=default)
    assert check_once("ecc", ident=ident, ecc_enabled=False).severity is severity
