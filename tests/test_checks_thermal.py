from __future__ import annotations

from typing import Any

import pytest

from gpuagent.config import ThermalCheck
from gpuagent.model import GpuIdentity, Severity
from test_checks_support import check_once, identity, with_checks

# Fallbacks (87 / 92) with 5 °C margins: WARN from 82 °C, CRITICAL from 87 °C.
FALLBACK = identity()
# An A100-like board reporting its own thresholds: WARN from 80 °C, CRITICAL from 90 °C.
REPORTED = identity(temperature_slowdown_c=85.0, temperature_shutdown_c=95.0)
HBM = identity(temperature_memory_max_c=95.0)


@pytest.mark.parametrize(
    ("ident", "readings", "severity", "runbook"),
    [
        pytest.param(FALLBACK, {}, Severity.OK, "", id="nothing-reported"),
        pytest.param(FALLBACK, {"temperature_c": 81.9}, Severity.OK, "", id="fallback-below-warn"),
        pytest.param(
            FALLBACK, {"temperature_c": 82.0}, Severity.WARN, "gpu-thermal-slowdown", id="fb-warn"
        ),
        pytest.param(
            FALLBACK, {"temperature_c": 86.9}, Severity.WARN, "gpu-thermal-slowdown", id="fb-86.9"
        ),
        pytest.param(
            FALLBACK,
            {"temperature_c": 87.0},
            Severity.CRITICAL,
            "gpu-thermal-shutdown",
            id="fb-critical",
        ),
        pytest.param(REPORTED, {"temperature_c": 79.0}, Severity.OK, "", id="reported-ok"),
        pytest.param(
            REPORTED, {"temperature_c": 80.0}, Severity.WARN, "gpu-thermal-slowdown", id="rep-warn"
        ),
        pytest.param(
            REPORTED, {"temperature_c": 89.0}, Severity.WARN, "gpu-thermal-slowdown", id="rep-89"
        ),
        pytest.param(
            REPORTED,
            {"temperature_c": 90.0},
            Severity.CRITICAL,
            "gpu-thermal-shutdown",
            id="rep-critical",
        ),
        pytest.param(
            identity(temperature_slowdown_c=0.0, temperature_shutdown_c=0.0),
            {"temperature_c": 50.0},
            Severity.OK,
            "",
            id="zero-thresholds-use-fallback",
        ),
        pytest.param(HBM, {"memory_temperature_c": 89.9}, Severity.OK, "", id="hbm-below"),
        pytest.param(
            HBM, {"memory_temperature_c": 90.0}, Severity.WARN, "gpu-memory-thermal", id="hbm-warn"
        ),
        pytest.param(
            FALLBACK, {"memory_temperature_c": 120.0}, Severity.OK, "", id="hbm-no-max-reported"
        ),
        pytest.param(
            FALLBACK,
            {"temperature_c": 40.0, "clock_event_reasons": 0x1 | 0x4},
            Severity.OK,
            "",
            id="idle-and-power-cap-are-normal",
        ),
        pytest.param(
            FALLBACK,
            {"temperature_c": 40.0, "clock_event_reasons": 0x40},
            Severity.WARN,
            "gpu-clocks-throttled",
            id="hw-thermal-slowdown-bit",
        ),
        pytest.param(
            FALLBACK,
            {"temperature_c": 90.0, "clock_event_reasons": 0x40},
            Severity.CRITICAL,
            "gpu-thermal-shutdown",
            id="hot-and-throttled-worst-wins",
        ),
    ],
)
def test_thermal_levels(
    ident: GpuIdentity, readings: dict[str, Any], severity: Severity, runbook: str
) -> None:
    found = check_once("thermal", ident=ident, **readings)
    assert (found.severity, found.runbook) == (severity, runbook)
    assert found.action == ("none" if severity is Severity.OK else "check_cooling")


@pytest.mark.parametrize(
    ("mask", "reason", "action"),
    [
        pytest.param(0x8, "clocks throttled: hw_slowdown", "check_cooling", id="hw-slowdown"),
        pytest.param(
            0x20, "clocks throttled: sw_thermal_slowdown", "check_cooling", id="sw-thermal"
        ),
        pytest.param(
            0x40, "clocks throttled: hw_thermal_slowdown", "check_cooling", id="hw-thermal"
        ),
        pytest.param(0x80, "clocks throttled: hw_power_brake", "check_power", id="power-brake"),
        pytest.param(
            0x8 | 0x80 | 0x1,
            "clocks throttled: hw_slowdown, hw_power_brake",
            "check_cooling",
            id="several-named-in-bit-order",
        ),
    ],
)
def test_throttle_reasons_are_named(mask: int, reason: str, action: str) -> None:
    found = check_once("thermal", temperature_c=45.0, clock_event_reasons=mask)
    assert (found.severity, found.reason, found.action) == (Severity.WARN, reason, action)
    assert found.evidence_dict()["clock_event_reasons"] == mask


@pytest.mark.parametrize(
    ("ident", "readings", "reason"),
    [
        pytest.param(
            FALLBACK,
            {"temperature_c": 88.0},
            "GPU at 88 °C, within 5 °C of its 92 °C shutdown temperature",
            id="critical",
        ),
        pytest.param(
            REPORTED,
            {"temperature_c": 82.5},
            "GPU at 82.5 °C, near its 85 °C slowdown temperature",
            id="warn",
        ),
        pytest.param(
            HBM,
            {"temperature_c": 50.0, "memory_temperature_c": 93.0},
            "memory at 93 °C, near its 95 °C maximum",
            id="memory",
        ),
        pytest.param(
            FALLBACK, {"temperature_c": 41.0}, "GPU at 41 °C, below its 87 °C slowdown", id="ok"
        ),
        pytest.param(
            FALLBACK, {}, "temperature not reported; no thermal throttling", id="not-reported"
        ),
    ],
)
def test_thermal_reasons(ident: GpuIdentity, readings: dict[str, Any], reason: str) -> None:
    assert check_once("thermal", ident=ident, **readings).reason == reason


def test_margins_come_from_config() -> None:
    config = with_checks(thermal=ThermalCheck(slowdown_margin_c=0.0, shutdown_margin_c=0.0))
    assert check_once("thermal", config, temperature_c=86.9).severity is Severity.OK
    assert check_once("thermal", config, temperature_c=87.0).severity is Severity.WARN
    assert check_once("thermal", config, temperature_c=92.0).severity is Severity.CRITICAL


def test_fallback_thresholds_come_from_config() -> None:
    config = with_checks(thermal=ThermalCheck(fallback_slowdown_c=70.0, fallback_shutdown_c=80.0))
    found = check_once("thermal", config, temperature_c=66.0)
    assert found.severity is Severity.WARN
    assert found.evidence_dict()["slowdown_c"] == 70.0
    assert found.evidence_dict()["shutdown_c"] == 80.0
