"""Properties of `evaluate` for arbitrary readings, configuration and poll timing."""

from __future__ import annotations

import dataclasses
import typing
from itertools import chain
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuagent.checks import CHECK_NAMES, Action, HealthMemory, Runbook, evaluate
from gpuagent.checks.memory import MAX_SAMPLES
from gpuagent.config import (
    AerCheck,
    BusCheck,
    ChecksSection,
    EccCheck,
    FabricHealthCheck,
    MigCheck,
    NvlinkCheck,
    PcieCheck,
    PersistenceCheck,
    ProcessesCheck,
    RecoveryCheck,
    SxidCheck,
    ThermalCheck,
    XidCheck,
)
from gpuagent.model import (
    AerSeverity,
    EventKind,
    EventSource,
    FabricState,
    GpuEvent,
    GpuIdentity,
    GpuProcess,
    GpuProfiling,
    GpuReadings,
    GpuState,
    MigDevice,
    NvmlInitProblem,
    NvmlStatus,
    PcieLink,
    PciePath,
    PcieRole,
    Severity,
)
from test_checks_support import EVENT_CHECKS

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
        tuple[float | None, ...]: st.lists(st.none() | ANY_FLOAT, max_size=18).map(tuple),
        FabricState | None: st.none() | st.sampled_from(typing.get_args(FabricState)),
        tuple[str, ...] | None: st.none() | st.lists(st.text(max_size=10), max_size=8).map(tuple),
        # The compute mode: NVML's names, and a name no check knows.
        str | None: st.none() | st.sampled_from(["default", "exclusive_process", "odd"]),
        tuple[int, int, int, int, int] | None: st.none()
        | st.tuples(COUNTER, COUNTER, COUNTER, COUNTER, COUNTER),
        # The thermal check asks only whether any process runs (busy under MIG); the
        # processes check also reads their memory, owner and whether they still exist.
        tuple[GpuProcess, ...]: st.lists(
            st.builds(
                GpuProcess,
                pid=st.integers(1, 2**22),
                name=st.just("job"),
                used_mib=st.none() | ANY_FLOAT,
                alive=MAYBE_BOOL,
                user=st.none() | st.just("alice"),
            ),
            max_size=2,
        ).map(tuple),
        # No check judges profiling values; any of them must leave every check well-behaved.
        tuple[GpuProfiling, ...]: st.lists(
            st.builds(
                GpuProfiling,
                source=st.just("gpm"),
                values=st.lists(st.tuples(st.integers(1001, 1016), ANY_FLOAT), max_size=4).map(
                    tuple
                ),
            ),
            max_size=2,
        ).map(tuple),
        # No check judges MIG devices (attribution reads them); any must be harmless.
        tuple[MigDevice, ...]: st.lists(
            st.builds(
                MigDevice,
                uuid=st.text(max_size=12),
                gpu_instance_id=COUNTER,
                compute_instance_id=COUNTER,
            ),
            max_size=2,
        ).map(tuple),
    }
    # A field without a strategy would make every drawn reading invalid: fail instead.
    assert hint in strategies, f"no strategy for GpuReadings field type {hint}"
    return strategies[hint]


def _readings_fields() -> dict[str, st.SearchStrategy[Any]]:
    hints = typing.get_type_hints(GpuReadings)
    return {f.name: _field_strategy(hints[f.name]) for f in dataclasses.fields(GpuReadings)}


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


def _gpu_bus(index: int) -> str:
    return f"0000:{index:02x}:00.0"


# Bridges: one per GPU, plus a switch and a root port several GPUs share.
BRIDGES = [f"0000:{0x10 + i:02x}:00.0" for i in range(8)] + ["0000:20:00.0", "0000:30:01.0"]
ADDRESSES = (
    st.sampled_from([_gpu_bus(i) for i in range(8)] + BRIDGES) | st.none() | st.text(max_size=14)
)
EVENT_KINDS = tuple(chain.from_iterable(typing.get_args(a) for a in typing.get_args(EventKind)))
LINE_TEMPLATES = (
    "NVRM: Xid (PCI:0000:01:00): 45, pid=1, name=x, Ch 00000001 caused by previous Xid {n}",
    "NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x{n:x} (A)",
    "NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x{n:x} to 0x{n:x}",
    "NVRM: Xid (PCI:0000:01:00): {n}, NETIR_LINK_EVT Fatal XC0 i0 Link 01 (0x0)",
    "NVRM: Xid (PCI:0000:01:00): {n}, RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0)",
    "nvidia-nvswitch1: SXid (PCI:0000:06:00.0): {n}, Fatal, Link 48 LTSSM Fault Up",
    "nvidia-nvswitch1: SXid (PCI:0000:06:00.0): {n}, Non-fatal, Link 4",
    "pcieport 0000:00:03.1: PCIe Bus Error: severity=Correctable, type=Data Link Layer",
)
LINES = st.builds(
    lambda template, n: template.format(n=n),
    st.sampled_from(LINE_TEMPLATES),
    st.integers(0, 2**40),
) | st.text(max_size=60)
XID_CODES = st.sampled_from([13, 31, 43, 45, 48, 54, 63, 74, 79, 119, 145, 149, 151, 154, 171])
EVENTS_AGO = st.lists(
    st.tuples(
        st.none() | st.floats(-100.0, 1e5) | ANY_FLOAT,  # age; None: an absolute time
        st.builds(
            GpuEvent,
            event_id=st.text(max_size=4),
            source=st.sampled_from(typing.get_args(EventSource)),
            kind=st.sampled_from(EVENT_KINDS),
            gpu=ADDRESSES,
            time=ANY_FLOAT,
            monotonic=ANY_FLOAT,
            pci=st.none() | st.text(max_size=14),
            code=st.none() | XID_CODES | COUNTER,
            line=LINES,
            pid=st.none() | COUNTER,
            process=st.none() | st.text(max_size=10),
            aer_severity=st.none() | st.sampled_from(typing.get_args(AerSeverity)),
        ),
    ),
    max_size=30,
)
MAYBE_COUNT = st.none() | COUNTER
LINKS = st.builds(
    PcieLink,
    address=st.sampled_from(BRIDGES) | st.text(max_size=14),
    role=st.sampled_from(typing.get_args(PcieRole)),
    current_speed_gts=st.none() | ANY_FLOAT,
    max_speed_gts=st.none() | ANY_FLOAT,
    current_width=st.none() | st.integers(-1, 32),
    max_width=st.none() | st.integers(-1, 32),
    aer_correctable=MAYBE_COUNT,
    aer_nonfatal=MAYBE_COUNT,
    aer_fatal=MAYBE_COUNT,
)


MAX_FUNCTIONS = 5  # a GPU and up to four bridges


@st.composite
def pcie_paths(draw: st.DrawFn) -> tuple[PciePath, ...]:
    devices = draw(st.lists(st.integers(0, 7), unique=True, max_size=4))
    return tuple(
        PciePath(
            dataclasses.replace(draw(LINKS), address=_gpu_bus(index), role="gpu"),
            tuple(draw(st.lists(LINKS, max_size=MAX_FUNCTIONS - 1))),
        )
        for index in devices
    )


def _at(now: float, events: list[tuple[float | None, GpuEvent]]) -> tuple[GpuEvent, ...]:
    """The drawn events, most placed ``age`` seconds before ``now``."""
    return tuple(e if age is None else e._replace(monotonic=now - age) for age, e in events)


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
    recovery=st.builds(RecoveryCheck, enabled=st.booleans()),
    fabric_health=st.builds(
        FabricHealthCheck,
        enabled=st.booleans(),
        recovery_timeout_seconds=st.floats(min_value=1.0, max_value=3600.0),
    ),
    mig=st.builds(
        MigCheck,
        enabled=st.booleans(),
        expected=st.sampled_from(["any", "enabled", "disabled"]),
    ),
    nvlink=st.builds(NvlinkCheck, enabled=st.booleans()),
    xid=st.builds(
        XidCheck,
        enabled=st.booleans(),
        app_error_hold_seconds=ANY_FLOAT,
        app_error_rate_per_hour=ANY_FLOAT,
    ),
    sxid=st.builds(SxidCheck, enabled=st.booleans()),
    aer=st.builds(
        AerCheck,
        enabled=st.booleans(),
        corrected_rate_per_hour=ANY_FLOAT,
        rate_window_seconds=st.floats(min_value=1e-3, max_value=1e7) | ANY_FLOAT,
    ),
    bus=st.builds(BusCheck, enabled=st.booleans()),
    processes=st.builds(
        ProcessesCheck,
        enabled=st.booleans(),
        leak_threshold_mib=ANY_FLOAT,
        leak_seconds=ANY_FLOAT,
        gone_seconds=ANY_FLOAT,
        hung_utilization_pct=ANY_FLOAT,
        hung_seconds=ANY_FLOAT,
    ),
)

NVML = st.builds(
    NvmlStatus,
    ok=st.booleans(),
    problem=st.none() | st.sampled_from(typing.get_args(NvmlInitProblem)),
    message=st.text(max_size=30),
)

STEPS = st.lists(
    st.tuples(st.floats(-10.0, 1e5), polls(), EVENTS_AGO, pcie_paths()), min_size=1, max_size=6
)


def _enabled(config: ChecksSection) -> list[str]:
    switches = {
        "availability": True,
        "ecc": config.ecc.enabled,
        "retired_pages": config.ecc.enabled,
        "row_remap": config.ecc.enabled,
        "recovery": config.recovery.enabled,
        "fabric_health": config.fabric_health.enabled,
        "thermal": config.thermal.enabled,
        "pcie": config.pcie.enabled,
        "persistence": config.persistence.enabled,
        "mig": config.mig.enabled,
        "nvlink": config.nvlink.enabled,
        "xid": config.xid.enabled,
        "bus": config.bus.enabled,
        "aer": config.aer.enabled,
        "processes": config.processes.enabled,
    }
    return [name for name in CHECK_NAMES if switches[name]]


def _node_enabled(config: ChecksSection) -> list[str]:
    return ["nvml", *(["sxid"] if config.sxid.enabled else []), "kernel", "state_dir"]


@settings(max_examples=200, deadline=None)
@given(config=CONFIGS, nvml=NVML, steps=STEPS, start=st.floats(0.0, 1e9))
def test_evaluate_always_gives_one_finding_per_gpu_and_enabled_check(
    config: ChecksSection,
    nvml: NvmlStatus,
    steps: list[
        tuple[
            float,
            tuple[GpuState, ...],
            list[tuple[float | None, GpuEvent]],
            tuple[PciePath, ...],
        ]
    ],
    start: float,
) -> None:
    memory, now = HealthMemory(), start
    for delta, gpus, drawn, pcie in steps:
        now += delta
        events = _at(now, drawn)
        health, memory = evaluate(gpus, nvml, config, memory, now, events=events, pcie=pcie)

        node = _node_enabled(config)
        assert [(f.gpu, f.check) for f in health.node_findings()] == [(None, c) for c in node]
        for state in gpus:
            bus_id = state.identity.pci_bus_id
            assert [f.check for f in health.for_gpu(bus_id)] == _enabled(config)
            if state.status != "ok":
                others = health.for_gpu(bus_id)[1:]
                needs_readings = [f for f in others if f.check not in EVENT_CHECKS]
                assert all(f.severity is Severity.UNKNOWN for f in needs_readings)
        assert len(health.findings) == len(node) + len(gpus) * len(_enabled(config))

        for found in health.findings:
            assert found.action in {a.value for a in Action}
            assert found.runbook in {r.value for r in Runbook}
            assert (found.severity is Severity.OK) == (found.action == "none")
            assert (found.severity is Severity.OK) == (found.runbook == "")
            assert found.reason
            for key, value in found.evidence:
                assert isinstance(key, str)
                assert value is None or isinstance(value, str | int | float | bool)
            for key in ("sbe_rate_per_hour", "replay_rate_per_minute", "corrected_rate_per_hour"):
                rate = found.evidence_dict().get(key)
                assert rate is None or isinstance(rate, float)
                assert rate is None or rate >= 0

        _assert_memory_bounded(memory, gpus, now, pcie)


def _assert_memory_bounded(
    memory: HealthMemory, gpus: tuple[GpuState, ...], now: float, pcie: tuple[PciePath, ...]
) -> None:
    assert {bus for bus, _ in memory.gpus} == {g.identity.pci_bus_id for g in gpus}
    paths = {path.device.address: path for path in pcie}
    for bus, gpu_memory in memory.gpus:
        for series in (gpu_memory.sbe, gpu_memory.pcie_replay, gpu_memory.aer_corrected):
            assert len(series.samples) <= MAX_SAMPLES
            times = [t for t, _ in series.samples]
            assert times == sorted(set(times))
            assert all(t <= now for t in times)
            values = [v for _, v in series.samples]
            assert values == sorted(values)  # resets start a new series
        path = paths.get(bus)
        bridges = set() if path is None else {b.address for b in path.bridges}
        assert {a for a, _ in gpu_memory.bridge_degraded_since} <= bridges
        assert all(since <= now for _, since in gpu_memory.bridge_degraded_since)
        # One baseline per function of the path (the last path seen while sysfs is silent).
        assert len(gpu_memory.aer_uncorrectable_baseline) <= MAX_FUNCTIONS
