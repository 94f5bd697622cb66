"""Properties of `evaluate` for arbitrary readings, configuration and poll timing."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuagent.checks import CHECK_NAMES, Action, HealthMemory, Runbook, evaluate
from gpuagent.checks.memory import MAX_SAMPLES
from gpuagent.config import (
    ChecksSection,
    EccCheck,
    MigCheck,
    NvlinkCheck,
    PcieCheck,
    PersistenceCheck,
    ThermalCheck,
)
from gpuagent.model import (
    GpuIdentity,
    GpuReadings,
    GpuState,
    NvmlInitProblem,
    NvmlStatus,
    Severity,
)

ANY_FLOAT = st.floats(allow_nan=True, allow_infinity=True)
# NVML counters are unsigned 64-bit; negatives stand in for a broken binding.
COUNTER = st.integers(min_value=-(2**63), max_value=2**64)
MAYBE_BOOL = st.none() | st.booleans()


def _field_strategy(hint: Any) -> st.SearchStrategy[Any]:
    strategies: dict[Any, st.SearchStrategy[Any]] = {
        float | None: st.none() | ANY_FLOAT,
        int | None: st.none() | COUNTER,
        bool | None: MAYBE_BOOL,
        tuple[bool | None, ...]: st.lists(MAYBE_BOOL, max_size=18).map(tuple),
    }
    return strategies.get(hint, st.nothing())


def _readings_fields() -> dict[str, st.SearchStrategy[Any]]:
    hints = typing.get_type_hints(GpuReadings)
    fields = {f.name: _field_strategy(hints[f.name]) for f in dataclasses.fields(GpuReadings)}
    fields["processes"] = st.just(())  # no check reads processes
    return fields


READINGS = st.builds(GpuReadings, **_readings_fields())


@st.composite
def gpu_states(draw: st.DrawFn, index: int) -> GpuState:
    bus_id = f"0000:{index:02x}:00.0"
    identity = GpuIdentity(
        index=index,
        pci_bus_id=bus_id,
        uuid=f"GPU-{index}",
        name="GPU",
        temperature_slowdown_c=draw(st.none() | ANY_FLOAT),
        temperature_shutdown_c=draw(st.none() | ANY_FLOAT),
        temperature_memory_max_c=draw(st.none() | ANY_FLOAT),
        pcie_max_generation=draw(st.none() | st.integers(0, 6)),
        pcie_max_width=draw(st.none() | st.integers(0, 32)),
    )
    status = draw(st.sampled_from(["ok", "lost", "timeout", "error"]))
    # Mostly as the sources build them, sometimes inconsistent on purpose.
    readings = draw(READINGS) if status == "ok" or draw(st.booleans()) else None
    return GpuState(identity, status, readings, error=draw(st.none() | st.text(max_size=20)))


@st.composite
def polls(draw: st.DrawFn) -> tuple[GpuState, ...]:
    present = draw(st.lists(st.integers(0, 7), unique=True, max_size=4))
    return tuple(draw(gpu_states(index)) for index in present)


CONFIGS = st.builds(
    ChecksSection,
    ecc=st.builds(
        EccCheck,
        enabled=st.booleans(),
        sbe_rate_per_hour=ANY_FLOAT,
        rate_window_seconds=st.floats(min_value=1e-3, max_value=1e7) | ANY_FLOAT,
    ),
    thermal=st.builds(
        ThermalCheck,
        enabled=st.booleans(),
        slowdown_margin_c=ANY_FLOAT,
        shutdown_margin_c=ANY_FLOAT,
        fallback_slowdown_c=ANY_FLOAT,
        fallback_shutdown_c=ANY_FLOAT,
    ),
    pcie=st.builds(
        PcieCheck,
        enabled=st.booleans(),
        degraded_hold_seconds=ANY_FLOAT,
        degraded_min_utilization_pct=ANY_FLOAT,
        replay_rate_per_minute=ANY_FLOAT,
    ),
    persistence=st.builds(PersistenceCheck, enabled=st.booleans()),
    mig=st.builds(
        MigCheck,
        enabled=st.booleans(),
        expected=st.sampled_from(["any", "enabled", "disabled"]),
    ),
    nvlink=st.builds(NvlinkCheck, enabled=st.booleans()),
)

NVML = st.builds(
    NvmlStatus,
    ok=st.booleans(),
    problem=st.none() | st.sampled_from(typing.get_args(NvmlInitProblem)),
    message=st.text(max_size=30),
)

STEPS = st.lists(st.tuples(st.floats(-10.0, 1e5), polls()), min_size=1, max_size=6)


def _enabled(config: ChecksSection) -> list[str]:
    switches = {
        "availability": True,
        "ecc": config.ecc.enabled,
        "retired_pages": config.ecc.enabled,
        "row_remap": config.ecc.enabled,
        "thermal": config.thermal.enabled,
        "pcie": config.pcie.enabled,
        "persistence": config.persistence.enabled,
        "mig": config.mig.enabled,
        "nvlink": config.nvlink.enabled,
    }
    return [name for name in CHECK_NAMES if switches[name]]


@settings(max_examples=200, deadline=None)
@given(config=CONFIGS, nvml=NVML, steps=STEPS, start=st.floats(0.0, 1e9))
def test_evaluate_always_gives_one_finding_per_gpu_and_enabled_check(
    config: ChecksSection,
    nvml: NvmlStatus,
    steps: list[tuple[float, tuple[GpuState, ...]]],
    start: float,
) -> None:
    memory, now = HealthMemory(), start
    for delta, gpus in steps:
        now += delta
        health, memory = evaluate(gpus, nvml, config, memory, now)

        assert [(f.gpu, f.check) for f in health.node_findings()] == [(None, "nvml")]
        for state in gpus:
            bus_id = state.identity.pci_bus_id
            assert [f.check for f in health.for_gpu(bus_id)] == _enabled(config)
            if state.status != "ok":
                others = health.for_gpu(bus_id)[1:]
                assert all(f.severity is Severity.UNKNOWN for f in others)
        assert len(health.findings) == 1 + len(gpus) * len(_enabled(config))

        for found in health.findings:
            assert found.action in {a.value for a in Action}
            assert found.runbook in {r.value for r in Runbook}
            assert (found.severity is Severity.OK) == (found.action == "none")
            assert (found.severity is Severity.OK) == (found.runbook == "")
            assert found.reason
            for key, value in found.evidence:
                assert isinstance(key, str)
                assert value is None or isinstance(value, str | int | float | bool)
            for key in ("sbe_rate_per_hour", "replay_rate_per_minute"):
                rate = found.evidence_dict().get(key)
                assert rate is None or isinstance(rate, float)
                assert rate is None or rate >= 0

        _assert_memory_bounded(memory, gpus, now)


def _assert_memory_bounded(memory: HealthMemory, gpus: tuple[GpuState, ...], now: float) -> None:
    assert {bus for bus, _ in memory.gpus} == {g.identity.pci_bus_id for g in gpus}
    for _, gpu_memory in memory.gpus:
        for series in (gpu_memory.sbe, gpu_memory.pcie_replay):
            assert len(series.samples) <= MAX_SAMPLES
            times = [t for t, _ in series.samples]
            assert times == sorted(set(times))
            assert all(t <= now for t in times)
            values = [v for _, v in series.samples]
            assert values == sorted(values)  # resets start a new series
