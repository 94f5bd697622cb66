from __future__ import annotations

from typing import Any

import pytest

from gpuagent.config import ThermalCheck
from gpuagent.model import GpuIdentity, GpuProcess, Severity
from test_checks_support import check_once, check_series, identity, with_checks

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


# --- throttling: judged by what it costs over a window, never by one sample of the bits ----

SECOND_NS = 1_000_000_000
# H100 SXM at work: busy, SM clock held well below its 1980 MHz maximum.
H100 = identity(sm_clock_max_mhz=1980)
BUSY = {"temperature_c": 60.0, "utilization_gpu_pct": 95.0, "sm_clock_mhz": 1095}


def _throttled(
    share: float, *, field: str = "violation_thermal_ns", mask: int = 0x8 | 0x40, **extra: Any
) -> list[tuple[float, dict[str, Any]]]:
    """Polls every 10 s for 400 s, the counter growing by ``share`` of the elapsed time."""
    return [
        (
            float(t),
            {**BUSY, "clock_event_reasons": mask, field: int(t * share * SECOND_NS), **extra},
        )
        for t in range(0, 401, 10)
    ]


@pytest.mark.parametrize(
    "mask",
    [
        pytest.param(0x8 | 0x80, id="hw-slowdown-and-power-brake-as-real-idle-h100s"),
        pytest.param(0x8, id="hw-slowdown"),
        pytest.param(0x20, id="sw-thermal"),
        pytest.param(0x40, id="hw-thermal"),
        pytest.param(0x80, id="power-brake"),
    ],
)
def test_one_sample_of_throttle_bits_is_never_a_finding(mask: int) -> None:
    # The old rule turned any active bit into WARN from a single sample: every GPU of a
    # healthy idle H100 node (HW Slowdown + HW Power Brake asserted) sat in WARN for ever.
    idle = check_once("thermal", temperature_c=29.0, clock_event_reasons=mask,
                      utilization_gpu_pct=0.0)  # fmt: skip
    assert idle.severity is Severity.OK
    assert "asserted, not costing performance (the GPU is idle)" in idle.reason
    busy = check_once("thermal", ident=H100, clock_event_reasons=mask, **BUSY)
    assert busy.severity is Severity.OK
    assert "not yet measured over a window" in busy.reason


def test_idle_gpu_with_throttle_bits_for_hours_stays_ok() -> None:
    steps = [
        (float(t), {"temperature_c": 29.0, "utilization_gpu_pct": 0.0, "sm_clock_mhz": 86,
                    "clock_event_reasons": 0x8 | 0x80, "violation_thermal_ns": t * SECOND_NS})
        for t in range(0, 7200, 60)
    ]  # fmt: skip
    found = check_series("thermal", steps, ident=H100)
    assert {f.severity for f in found} == {Severity.OK}


@pytest.mark.parametrize(
    ("field", "mask", "action"),
    [
        pytest.param("violation_thermal_ns", 0x8 | 0x40, "check_cooling", id="thermal-policy"),
        pytest.param("throttle_hw_thermal_ns", 0x8 | 0x40, "check_cooling", id="hw-thermal-550"),
        pytest.param("throttle_sw_thermal_ns", 0x20, "check_cooling", id="sw-thermal-550"),
        pytest.param("throttle_hw_power_brake_ns", 0x8 | 0x80, "check_power", id="power-brake"),
    ],
)
def test_sustained_throttling_of_a_busy_gpu_is_warn(field: str, mask: int, action: str) -> None:
    found = check_series("thermal", _throttled(0.5, field=field, mask=mask), ident=H100)
    assert found[0].severity is Severity.OK  # one sample: nothing measured yet
    last = found[-1]
    assert (last.severity, last.action, last.runbook) == (
        Severity.WARN,
        action,
        "gpu-clocks-throttled",
    )
    assert "clocks held back 50% of the last 300 s while busy" in last.reason
    assert "SM clock 1095 of 1980 MHz" in last.reason
    assert last.evidence_dict()["throttled_share"] == pytest.approx(0.5)


def test_counters_read_on_the_slow_cadence_are_timed_by_their_read() -> None:
    # Polls every 5 s; the duration counters are read every 40 s and carried between (as on
    # a real node, where they cost 2 ms of CPU): the share uses the time of their read.
    steps = []
    for t in range(0, 401, 5):
        read_at = float(t - t % 40)
        counters = {"violation_thermal_ns": int(read_at * 0.5 * SECOND_NS), "counters_at": read_at}
        steps.append((float(t), {**BUSY, "clock_event_reasons": 0x8 | 0x40, **counters}))
    last = check_series("thermal", steps, ident=H100)[-1]
    # The reads in the last 300 s are those at 120..400 s: 140 s throttled over the window.
    # Timed by the polls instead, the reads at 80 s and 400 s would give 160 s.
    assert last.evidence_dict()["throttled_share"] == pytest.approx(140 / 300)
    assert last.severity is Severity.WARN


def test_a_short_burst_is_not_sustained() -> None:
    # 20 s of throttling in a 300 s window is under the 25 % default.
    steps = [
        (float(t), {**BUSY, "violation_thermal_ns": min(t, 20) * SECOND_NS})
        for t in range(0, 401, 10)
    ]
    assert check_series("thermal", steps, ident=H100)[-1].severity is Severity.OK


def test_throttling_below_the_share_is_ok_and_the_share_is_configurable() -> None:
    assert check_series("thermal", _throttled(0.2), ident=H100)[-1].severity is Severity.OK
    config = with_checks(thermal=ThermalCheck(throttle_min_fraction=0.1))
    found = check_series("thermal", _throttled(0.2), config, ident=H100)[-1]
    assert found.severity is Severity.WARN


def test_counted_throttling_at_full_clock_is_ok() -> None:
    steps = _throttled(0.9, sm_clock_mhz=1980)
    assert check_series("thermal", steps, ident=H100)[-1].severity is Severity.OK


def test_idle_polls_end_the_series() -> None:
    # Throttle time accrued while idle (or across an idle gap) never counts.
    steps = _throttled(0.9)
    steps[-1] = (steps[-1][0], {**steps[-1][1], "utilization_gpu_pct": 0.0})
    last = check_series("thermal", steps, ident=H100)[-1]
    assert last.severity is Severity.OK
    assert last.evidence_dict()["throttled_share"] is None


def test_mig_gpu_with_processes_counts_as_busy() -> None:
    steps = _throttled(0.5, utilization_gpu_pct=None,
                       processes=(GpuProcess(pid=1, name="train", used_mib=1.0),))  # fmt: skip
    assert check_series("thermal", steps, ident=H100)[-1].severity is Severity.WARN


def test_without_duration_counters_throttling_is_not_judged() -> None:
    steps = [(float(t), {**BUSY, "clock_event_reasons": 0x40}) for t in range(0, 401, 10)]
    last = check_series("thermal", steps, ident=H100)[-1]
    assert last.severity is Severity.OK
    assert "hw_thermal_slowdown asserted, not costing performance" in last.reason


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
        pytest.param(FALLBACK, {}, "temperature not reported", id="not-reported"),
    ],
)
def test_thermal_reasons(ident: GpuIdentity, readings: dict[str, Any], reason: str) -> None:
    assert check_once("thermal", ident=ident, **readings).reason == reason


# Where the temperature stands to the limit is said as it is: near it (within the margin),
# at it, or above it. Above the memory's maximum it runs out of its specification: CRITICAL.
@pytest.mark.parametrize(
    ("ident", "readings", "severity", "reason"),
    [
        pytest.param(
            HBM,
            {"temperature_c": 50.0, "memory_temperature_c": 100.0},
            Severity.CRITICAL,
            "memory at 100 °C, above its 95 °C maximum",
            id="memory-above-max",
        ),
        pytest.param(
            HBM,
            {"temperature_c": 50.0, "memory_temperature_c": 95.0},
            Severity.WARN,
            "memory at 95 °C, at its 95 °C maximum",
            id="memory-at-max",
        ),
        pytest.param(
            HBM,
            {"temperature_c": 50.0, "memory_temperature_c": 95.04},
            Severity.WARN,
            "memory at 95 °C, at its 95 °C maximum",
            id="memory-at-max-as-printed",
        ),
        pytest.param(
            HBM,
            {"temperature_c": 50.0, "memory_temperature_c": 95.1},
            Severity.CRITICAL,
            "memory at 95.1 °C, above its 95 °C maximum",
            id="memory-just-above-max",
        ),
        pytest.param(
            REPORTED,
            {"temperature_c": 85.0},
            Severity.WARN,
            "GPU at 85 °C, at its 85 °C slowdown temperature",
            id="gpu-at-slowdown",
        ),
        pytest.param(
            REPORTED,
            {"temperature_c": 88.0},
            Severity.WARN,
            "GPU at 88 °C, above its 85 °C slowdown temperature",
            id="gpu-above-slowdown",
        ),
        pytest.param(
            REPORTED,
            {"temperature_c": 95.0},
            Severity.CRITICAL,
            "GPU at 95 °C, at its 95 °C shutdown temperature",
            id="gpu-at-shutdown",
        ),
        pytest.param(
            REPORTED,
            {"temperature_c": 97.0},
            Severity.CRITICAL,
            "GPU at 97 °C, above its 95 °C shutdown temperature",
            id="gpu-above-shutdown",
        ),
    ],
)
def test_at_and_above_a_limit_say_so(
    ident: GpuIdentity, readings: dict[str, Any], severity: Severity, reason: str
) -> None:
    found = check_once("thermal", ident=ident, **readings)
    assert (found.severity, found.reason) == (severity, reason)


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
