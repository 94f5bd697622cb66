"""The engine: check table, finding order, enabling, and the memory between polls."""

from __future__ import annotations

import dataclasses
import time

import pytest

from conftest import PATIENCE
from gpuagent.checks import CHECK_NAMES, NODE_CHECK_NAMES, HealthMemory, evaluate
from gpuagent.checks.common import Outcome, Problem, fmt, to_finding
from gpuagent.checks.memory import (
    MAX_SAMPLES,
    SAMPLES_PER_WINDOW,
    CounterSeries,
    GpuMemory,
    Rate,
)
from gpuagent.checks.vocabulary import Action, Runbook
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
from gpuagent.model import AerSeverity, EventKind, GpuEvent, GpuState, GpuStatus, Severity
from test_checks_support import (
    BUS,
    NVML_OK,
    OTHER_BUS,
    ROOT_PORT,
    event,
    finding,
    gen5_x16,
    gpu,
    gpu_path,
    identity,
    run,
    with_checks,
)

ALL = (
    "availability",
    "bus",
    "xid",
    "ecc",
    "retired_pages",
    "row_remap",
    "recovery",
    "fabric_health",
    "thermal",
    "pcie",
    "aer",
    "persistence",
    "mig",
    "nvlink",
    "processes",
)
NODE = ("nvml", "sxid", "kernel", "state_dir")
ALL_OFF = ChecksSection(
    ecc=EccCheck(enabled=False),
    thermal=ThermalCheck(enabled=False),
    pcie=PcieCheck(enabled=False),
    persistence=PersistenceCheck(enabled=False),
    recovery=RecoveryCheck(enabled=False),
    fabric_health=FabricHealthCheck(enabled=False),
    mig=MigCheck(enabled=False),
    nvlink=NvlinkCheck(enabled=False),
    xid=XidCheck(enabled=False),
    sxid=SxidCheck(enabled=False),
    aer=AerCheck(enabled=False),
    bus=BusCheck(enabled=False),
    processes=ProcessesCheck(enabled=False),
)


def test_check_names_in_display_order() -> None:
    assert CHECK_NAMES == ALL
    assert NODE_CHECK_NAMES == NODE


def test_findings_come_node_first_then_gpu_by_gpu_in_check_order() -> None:
    second = gpu(ident=identity(OTHER_BUS, index=1))
    health, _ = run(second, gpu())
    order = [(f.gpu, f.check) for f in health.findings]
    assert order == [
        *((None, name) for name in NODE),
        *((OTHER_BUS, name) for name in ALL),
        *((BUS, name) for name in ALL),
    ]


@pytest.mark.parametrize(
    ("config", "missing"),
    [
        pytest.param(ChecksSection(), (), id="defaults-all-on"),
        pytest.param(
            with_checks(ecc=EccCheck(enabled=False)),
            ("ecc", "retired_pages", "row_remap"),
            id="ecc-off-covers-pages-and-rows",
        ),
        pytest.param(with_checks(thermal=ThermalCheck(enabled=False)), ("thermal",), id="thermal"),
        pytest.param(with_checks(pcie=PcieCheck(enabled=False)), ("pcie",), id="pcie"),
        pytest.param(
            with_checks(persistence=PersistenceCheck(enabled=False)),
            ("persistence",),
            id="persistence",
        ),
        pytest.param(with_checks(mig=MigCheck(enabled=False)), ("mig",), id="mig"),
        pytest.param(
            with_checks(recovery=RecoveryCheck(enabled=False)), ("recovery",), id="recovery"
        ),
        pytest.param(
            with_checks(fabric_health=FabricHealthCheck(enabled=False)),
            ("fabric_health",),
            id="fabric_health",
        ),
        pytest.param(with_checks(nvlink=NvlinkCheck(enabled=False)), ("nvlink",), id="nvlink"),
        pytest.param(with_checks(xid=XidCheck(enabled=False)), ("xid",), id="xid"),
        pytest.param(with_checks(bus=BusCheck(enabled=False)), ("bus",), id="bus"),
        pytest.param(with_checks(aer=AerCheck(enabled=False)), ("aer",), id="aer"),
        pytest.param(
            with_checks(processes=ProcessesCheck(enabled=False)), ("processes",), id="processes"
        ),
        pytest.param(with_checks(sxid=SxidCheck(enabled=False)), (), id="sxid-is-node-level"),
        pytest.param(ALL_OFF, ALL[1:], id="all-off-availability-stays"),
    ],
)
@pytest.mark.parametrize("status", ["ok", "lost"])
def test_disabled_checks_produce_no_findings(
    config: ChecksSection, missing: tuple[str, ...], status: GpuStatus
) -> None:
    health, _ = run(gpu(status, persistence_mode=False, ecc_dbe_volatile=3), config=config)
    checks = [f.check for f in health.for_gpu(BUS)]
    assert checks == [name for name in ALL if name not in missing]
    node = ("nvml", "kernel", "state_dir") if not config.sxid.enabled else NODE
    assert [f.check for f in health.node_findings()] == list(node)


def test_disabled_checks_keep_no_samples() -> None:
    config = with_checks(
        ecc=EccCheck(enabled=False), pcie=PcieCheck(enabled=False), aer=AerCheck(enabled=False)
    )
    narrow_root = gen5_x16(ROOT_PORT, current_width=8, aer_correctable=4, aer_fatal=0)
    _, memory = run(
        gpu(ecc_sbe_aggregate=5, pcie_replay_count=3),
        config=config,
        pcie=(gpu_path(narrow_root),),
    )
    assert memory.for_gpu(BUS) == GpuMemory()


def test_memory_is_per_gpu() -> None:
    other = identity(OTHER_BUS, index=1)
    memory = HealthMemory()
    for now, busy_sbe in ((0.0, 0), (1800.0, 1000)):
        gpus = (gpu(ecc_sbe_aggregate=busy_sbe), gpu(ident=other, ecc_sbe_aggregate=7))
        health, memory = evaluate(gpus, NVML_OK, ChecksSection(), memory, now)
    assert finding(health, "ecc", BUS).severity is Severity.WARN
    assert finding(health, "ecc", OTHER_BUS).severity is Severity.OK
    assert memory.for_gpu(OTHER_BUS).sbe.samples == ((0.0, 7), (1800.0, 7))


def test_gpus_that_disappear_are_forgotten() -> None:
    other = identity(OTHER_BUS, index=1)
    _, memory = run(gpu(ecc_sbe_aggregate=1), gpu(ident=other, ecc_sbe_aggregate=1))
    assert {bus for bus, _ in memory.gpus} == {BUS, OTHER_BUS}
    _, memory = run(gpu(ecc_sbe_aggregate=1), memory=memory, now=5.0)
    assert [bus for bus, _ in memory.gpus] == [BUS]
    # NVML going away entirely empties the memory too.
    _, memory = run(memory=memory, now=10.0)
    assert memory == HealthMemory()


def test_a_lost_gpu_stays_remembered_without_hold_time() -> None:
    ident = identity(pcie_max_width=16)
    _, memory = run(gpu(ident=ident, pcie_width=8, ecc_sbe_aggregate=4), now=0.0)
    assert memory.for_gpu(BUS).pcie_degraded_since == 0.0
    _, memory = run(gpu("lost", ident=ident), memory=memory, now=5.0)
    assert memory.for_gpu(BUS).pcie_degraded_since is None
    assert memory.for_gpu(BUS).sbe.samples == ((0.0, 4),)


def test_memory_stays_bounded_by_the_window() -> None:
    config = with_checks(ecc=EccCheck(rate_window_seconds=60.0))
    memory = HealthMemory()
    for step in range(1000):
        now = step * 5.0
        _, memory = run(
            gpu(ecc_sbe_aggregate=step, pcie_replay_count=step),
            config=config,
            memory=memory,
            now=now,
        )
    sbe = memory.for_gpu(BUS).sbe.samples
    assert len(sbe) == 13  # 60 s of 5 s polls, both ends included
    assert sbe[0][0] == now - 60.0
    assert len(memory.for_gpu(BUS).pcie_replay.samples) == 61  # the fixed 300 s window


def test_default_window_is_thinned_to_about_sixty_samples() -> None:
    # 5 s polls, one-hour window: a poll replaces the newest sample until it comes at least
    # 3600 / 60 = 60 s after the sample before, so every 55th second stays (0, 55, 110, ...).
    memory = HealthMemory()
    for step in range(1000):
        _, memory = run(gpu(ecc_sbe_aggregate=step), memory=memory, now=step * 5.0)
    # At 4995 s the hour starts at 1395 s: the kept ones are 1430 ... 4950, then 4995.
    kept = tuple((55.0 * k, 11 * k) for k in range(26, 91))
    assert memory.for_gpu(BUS).sbe.samples == (*kept, (4995.0, 999))  # 66, not 721


def test_thinning_keeps_the_first_and_newest_sample_of_a_burst() -> None:
    # Polls 1 ms apart never get 1e9 / 60 s past the first sample: each replaces the newest.
    series = CounterSeries()
    for step in range(MAX_SAMPLES + 50):
        series = series.observe(step * 0.001, step, "aggregate", window=1e9)
    assert series.samples == ((0.0, 0), ((MAX_SAMPLES + 49) * 0.001, MAX_SAMPLES + 49))


def test_thinning_bounds_the_series_over_a_long_run() -> None:
    # 1 s polls, 600 s window: a poll replaces the newest sample until it comes at least
    # 600 / 60 = 10 s after the sample before, so every 9th second stays (0, 9, 18, ...).
    series = CounterSeries()
    for step in range(3600):
        series = series.observe(float(step), step, "aggregate", window=600.0)
    # At 3599 s the window starts at 2999 s: the kept ones are 3006 ... 3591, then 3599.
    kept = tuple((float(t), t) for t in range(3006, 3592, 9))
    assert series.samples == (*kept, (3599.0, 3599))
    assert len(series.samples) == 67  # about SAMPLES_PER_WINDOW, not 601
    assert len(series.samples) < 2 * SAMPLES_PER_WINDOW


def test_sample_cap_backs_up_the_window() -> None:
    # Thinning keeps a series far below the cap, so start from one already at the cap (as
    # memory built with denser sampling would be) and add a sample thinning lets through.
    full = CounterSeries("aggregate", tuple((float(t), t) for t in range(MAX_SAMPLES)))
    now = MAX_SAMPLES + 1000.0  # 1001 s after the second-newest sample, window / 60 = 100 s
    series = full.observe(now, MAX_SAMPLES, "aggregate", window=6000.0)
    assert len(series.samples) == MAX_SAMPLES
    assert series.samples[0] == (1.0, 1)  # the oldest sample made room
    assert series.samples[-2:] == ((MAX_SAMPLES - 1.0, MAX_SAMPLES - 1), (now, MAX_SAMPLES))


def test_evaluate_does_not_change_its_inputs() -> None:
    state = gpu(ecc_sbe_aggregate=10)
    _, memory = run(state)
    before = dataclasses.replace(memory)
    first, _ = run(gpu(ecc_sbe_aggregate=5000), memory=memory, now=60.0)
    again, _ = run(gpu(ecc_sbe_aggregate=5000), memory=memory, now=60.0)
    assert memory == before
    assert first == again


def test_clock_going_backwards_drops_samples_from_the_future() -> None:
    memory = HealthMemory()
    for now, count in ((100.0, 0), (200.0, 50), (150.0, 60), (170.0, 61)):
        health, memory = run(gpu(ecc_sbe_aggregate=count), memory=memory, now=now)
    evidence = finding(health, "ecc").evidence_dict()
    # The 200 s sample is dropped once the clock reads 150 s: 61 errors over 100 s -> 170 s,
    # a 70 s span counted against the default one-hour window.
    assert evidence["sbe_rate_span_seconds"] == 70.0
    assert evidence["sbe_rate_per_hour"] == pytest.approx(61.0)
    assert memory.for_gpu(BUS).sbe.samples == ((100.0, 0), (150.0, 60), (170.0, 61))


@pytest.mark.parametrize(
    ("samples", "value", "expected"),
    [
        pytest.param((), 5, ((10.0, 5),), id="first"),
        pytest.param(((0.0, 1),), 5, ((0.0, 1), (10.0, 5)), id="grows"),
        pytest.param(((0.0, 1),), 1, ((0.0, 1), (10.0, 1)), id="flat"),
        pytest.param(((0.0, 9),), 2, ((10.0, 2),), id="reset"),
        pytest.param(((-5.0, 1), (0.0, 2)), 3, ((0.0, 2), (10.0, 3)), id="window-edge-kept"),
        pytest.param(((0.0, 1),), None, ((0.0, 1),), id="missing-value"),
    ],
)
def test_counter_series_observe(
    samples: tuple[tuple[float, int], ...],
    value: int | None,
    expected: tuple[tuple[float, int], ...],
) -> None:
    series = CounterSeries("aggregate", samples).observe(10.0, value, "aggregate", window=10.0)
    assert series.samples == expected


@pytest.mark.parametrize(
    ("samples", "value", "expected"),
    [
        # window=60: a new sample replaces the newest one while it is less than 1 s after
        # the sample before the newest.
        pytest.param(((9.5, 1),), 2, ((9.5, 1), (10.0, 2)), id="first-sample-always-kept"),
        pytest.param(((9.5, 1), (9.75, 2)), 3, ((9.5, 1), (10.0, 3)), id="replaces-the-newest"),
        pytest.param(
            ((9.0, 1), (9.5, 2)), 3, ((9.0, 1), (9.5, 2), (10.0, 3)), id="appends-after-1-s"
        ),
        pytest.param(
            ((0.0, 1), (9.25, 2), (9.5, 3)),
            4,
            ((0.0, 1), (9.25, 2), (10.0, 4)),
            id="only-the-second-newest-counts",
        ),
        pytest.param(((9.5, 5), (9.75, 6)), 1, ((10.0, 1),), id="reset-starts-over"),
        pytest.param(((9.5, 1), (9.75, 2)), None, ((9.5, 1), (9.75, 2)), id="missing-value"),
    ],
)
def test_counter_series_thinning(
    samples: tuple[tuple[float, int], ...],
    value: int | None,
    expected: tuple[tuple[float, int], ...],
) -> None:
    series = CounterSeries("aggregate", samples).observe(10.0, value, "aggregate", window=60.0)
    assert series.samples == expected


def test_counter_series_rate_needs_two_samples_apart() -> None:
    assert CounterSeries().rate(60.0) is None
    assert CounterSeries("x", ((1.0, 5),)).rate(60.0) is None
    assert CounterSeries("x", ((1.0, 5), (1.0, 6))).rate(60.0) is None


@pytest.mark.parametrize(
    ("window", "per_second"),
    [
        pytest.param(5.0, 2.0, id="span-covers-the-window"),
        pytest.param(10.0, 2.0, id="span-equals-the-window"),
        pytest.param(40.0, 0.5, id="short-span-counts-against-the-window"),
    ],
)
def test_counter_series_rate(window: float, per_second: float) -> None:
    # 20 more over 10 s: divided by the span or the window, whichever is longer.
    rate = CounterSeries("x", ((1.0, 5), (3.0, 6), (11.0, 25))).rate(window)
    assert rate == Rate(increase=20, span_seconds=10.0, samples=3, window_seconds=window)
    assert rate.per_second == per_second


def test_to_finding_combines_problems_worst_first() -> None:
    warn = Problem(Severity.WARN, "warm", Action.CHECK_COOLING, Runbook.GPU_THERMAL_SLOWDOWN)
    unknown = Problem(Severity.UNKNOWN, "odd", Action.INVESTIGATE, Runbook.GPU_NVML_ERROR)
    crit = Problem(Severity.CRITICAL, "broken", Action.DRAIN_AND_RESET, Runbook.GPU_ECC_DBE)
    found = to_finding("x", BUS, Outcome("fine", (("n", 1),), (warn, unknown, crit)))
    assert (found.severity, found.reason, found.action, found.runbook) == (
        Severity.CRITICAL,
        "broken; odd; warm",
        "drain_and_reset",
        "gpu-ecc-dbe",
    )
    assert type(found.action) is str
    assert type(found.runbook) is str
    ok = to_finding("x", None, Outcome("fine", (("n", 1),)))
    assert (ok.severity, ok.reason, ok.action, ok.runbook, ok.gpu) == (
        Severity.OK,
        "fine",
        "none",
        "",
        None,
    )


@pytest.mark.parametrize(
    ("value", "text"),
    [
        pytest.param(87.0, "87", id="whole"),
        pytest.param(82.5, "82.5", id="half"),
        pytest.param(101.04, "101", id="rounds-to-whole"),
        pytest.param(0.25, "0.2", id="small"),
        pytest.param(float("inf"), "inf", id="inf"),
        pytest.param(float("nan"), "nan", id="nan"),
    ],
)
def test_fmt(value: float, text: str) -> None:
    assert fmt(value) == text


def _busy_node(gpus: int, events: int) -> tuple[tuple[GpuState, ...], tuple[GpuEvent, ...]]:
    """``gpus`` GPUs and a full event log of XIDs, AER reports and noise spread over them."""
    states = tuple(gpu(ident=identity(f"0000:{0x10 + i:02x}:00.0", index=i)) for i in range(gpus))
    kinds: list[tuple[EventKind, int | None, AerSeverity | None]] = [
        ("xid", 13, None),
        ("xid", 119, None),
        ("xid", 45, None),
        ("aer", None, "corrected"),
        ("gsp", None, None),
        ("sxid", 20034, None),
        ("other_nvrm", None, None),
    ]
    log = []
    for n in range(events):
        kind, code, severity = kinds[n % len(kinds)]
        bus = states[n % gpus].identity.pci_bus_id
        log.append(
            event(
                kind,
                f"NVRM: Xid (PCI:{bus}): {code}, pid={n}, name=python3, "
                "Ch 00000001 caused by previous Xid 13",
                gpu=bus,
                code=code,
                at=n * 0.5,
                pid=n,
                aer_severity=severity,
            )
        )
    return states, tuple(log)


def test_a_full_event_log_is_indexed_not_rescanned() -> None:
    # The budget (well under 10 ms for this load) is measured, not asserted: a busy machine
    # must not fail the suite. This bound only catches a check that rescans the whole log
    # for every GPU or event, which costs seconds.
    states, log = _busy_node(gpus=8, events=10_000)
    started = time.perf_counter()
    health, _ = evaluate(states, NVML_OK, ChecksSection(), HealthMemory(), 5000.0, events=log)
    assert time.perf_counter() - started < 0.25 * PATIENCE  # a busy machine is slow
    assert finding(health, "xid", "0000:10:00.0").severity is Severity.CRITICAL


def test_events_of_devices_that_are_not_gpus_are_ignored_per_gpu() -> None:
    elsewhere = (
        event("xid", "NVRM: Xid (PCI:0000:99:00): 119, ...", gpu="0000:99:00.0", code=119),
        event("xid", "NVRM: Xid 119 without a bus id", gpu=None, code=119),
        event("fallen_off_bus", "NVRM: GPU 0000:99:00.0: GPU has fallen off the bus.", gpu=None),
        event(
            "aer",
            "pcieport 0000:00:03.0: PCIe Bus Error: severity=Uncorrected (Fatal)",
            gpu="0000:00:03.0",
            aer_severity="fatal",
        ),
    )
    health, _ = run(gpu(), events=elsewhere)
    assert health.gpu_severity(BUS) is Severity.OK


def test_evaluate_with_events_does_not_change_its_inputs() -> None:
    log = (event("xid", "NVRM: Xid (PCI:0000:18:00): 119, ...", code=119),)
    paths = (gpu_path(gen5_x16(ROOT_PORT, aer_correctable=5, aer_nonfatal=0, aer_fatal=0)),)
    _, memory = run(gpu(), events=log, pcie=paths)
    before = dataclasses.replace(memory)
    first, _ = run(gpu(), memory=memory, now=60.0, events=log, pcie=paths)
    again, _ = run(gpu(), memory=memory, now=60.0, events=log, pcie=paths)
    assert memory == before
    assert first == again


@pytest.mark.parametrize(("status", "severity"), [("lost", "CRITICAL"), ("timeout", "UNKNOWN")])
def test_a_gpu_without_readings_is_one_problem_not_one_per_check(
    status: GpuStatus, severity: str
) -> None:
    health, _ = run(gpu(status))
    (problem,) = health.problems(BUS)
    assert (problem.check, problem.severity.name) == ("availability", severity)
    masked = [f for f in health.for_gpu(BUS) if f.masked]
    # Every check that needs readings still has its finding (its metric a value): UNKNOWN,
    # masked by the availability finding. The event checks judge the GPU as usual.
    assert {f.check for f in masked} >= {"ecc", "thermal", "pcie", "nvlink", "persistence"}
    assert {f.severity for f in masked} == {Severity.UNKNOWN}
    assert not {"availability", "xid", "bus", "aer"} & {f.check for f in masked}
    assert health.gpu_severity(BUS).name == severity
