from __future__ import annotations

from typing import Any

import pytest

from gpuagent.checks import HealthMemory
from gpuagent.config import ChecksSection, PcieCheck
from gpuagent.model import Finding, GpuReadings, PciePath, Severity
from test_checks_support import (
    BUS,
    ROOT_PORT,
    SWITCH_DOWN,
    SWITCH_UP,
    check_series,
    finding,
    gen5_x16,
    gpu,
    gpu_path,
    identity,
    run,
    with_checks,
)

GEN5_X16 = identity(pcie_max_generation=5, pcie_max_width=16)
# Hold 300 s, generation only counts from 10 % utilization, 10 replays per minute.
DEFAULT = with_checks(pcie=PcieCheck())


def link(
    gen: int | None = 5, width: int | None = 16, util: float | None = 90.0, **extra: Any
) -> dict[str, Any]:
    return {"pcie_generation": gen, "pcie_width": width, "utilization_gpu_pct": util, **extra}


@pytest.mark.parametrize(
    ("steps", "severities"),
    [
        pytest.param([(0.0, link()), (400.0, link())], ["OK", "OK"], id="full-speed"),
        pytest.param(
            [(0.0, link(width=8)), (300.0, link(width=8)), (300.5, link(width=8))],
            ["OK", "OK", "WARN"],
            id="narrow-width-after-hold",
        ),
        pytest.param(
            [(0.0, link(width=8, util=0.0)), (301.0, link(width=8, util=None))],
            ["OK", "WARN"],
            id="narrow-width-counts-even-idle",
        ),
        pytest.param(
            [(0.0, link(gen=1, util=0.0)), (1000.0, link(gen=1, util=0.0))],
            ["OK", "OK"],
            id="low-gen-at-idle-is-power-saving",
        ),
        pytest.param(
            [(0.0, link(gen=1, util=None)), (1000.0, link(gen=1, util=None))],
            ["OK", "OK"],
            id="low-gen-unknown-utilization-not-counted",
        ),
        pytest.param(
            [(0.0, link(gen=4, util=10.0)), (301.0, link(gen=4, util=10.0))],
            ["OK", "WARN"],
            id="low-gen-at-min-utilization",
        ),
        pytest.param(
            [(0.0, link(gen=4, util=9.9)), (301.0, link(gen=4, util=9.9))],
            ["OK", "OK"],
            id="low-gen-just-under-min-utilization",
        ),
        pytest.param(
            [
                (0.0, link(gen=3)),
                (200.0, link(gen=3, util=0.0)),
                (250.0, link(gen=3)),
                (500.0, link(gen=3)),
                (551.0, link(gen=3)),
            ],
            ["OK", "OK", "OK", "OK", "WARN"],
            id="idle-poll-restarts-the-hold",
        ),
        pytest.param(
            [
                (0.0, link(width=8)),
                (200.0, link()),
                (250.0, link(width=8)),
                (500.0, link(width=8)),
            ],
            ["OK", "OK", "OK", "OK"],
            id="recovery-restarts-the-hold",
        ),
        pytest.param(
            [(0.0, link(width=8)), (400.0, link(width=8)), (500.0, link())],
            ["OK", "WARN", "OK"],
            id="recovery-clears-the-warning",
        ),
        pytest.param(
            [(0.0, link(gen=None, width=None)), (400.0, link(gen=None, width=None))],
            ["OK", "OK"],
            id="not-reported",
        ),
    ],
)
def test_degraded_link_hold(
    steps: list[tuple[float, dict[str, Any]]], severities: list[str]
) -> None:
    found = check_series("pcie", steps, config=DEFAULT, ident=GEN5_X16)
    assert [f.severity.name for f in found] == severities


def test_degraded_reasons_and_evidence() -> None:
    steps = [(0.0, link(gen=4, width=8)), (120.0, link(gen=4, width=8)), (360.0, link(4, 8))]
    first, pending, warned = check_series("pcie", steps, config=DEFAULT, ident=GEN5_X16)
    assert (
        first.reason == "PCIe link below max (Gen4 of Gen5, x8 of x16) for 0 s; flagged after 300 s"
    )
    assert pending.evidence_dict()["degraded_seconds"] == 120.0
    assert warned.reason == "PCIe link degraded (Gen4 of Gen5, x8 of x16) for 360 s"
    assert (warned.action, warned.runbook) == ("reseat_or_replace", "gpu-pcie-degraded")
    evidence = warned.evidence_dict()
    assert (evidence["pcie_width"], evidence["pcie_max_width"]) == (8, 16)
    assert (evidence["pcie_generation"], evidence["pcie_max_generation"]) == (4, 5)


def test_ok_reason_names_the_link() -> None:
    (found,) = check_series("pcie", [(0.0, link())], config=DEFAULT, ident=GEN5_X16)
    assert found.reason == "PCIe link at Gen5 x16, not degraded"


def test_unknown_maximum_never_degrades() -> None:
    steps = [(0.0, link(gen=1, width=1)), (1000.0, link(gen=1, width=1))]
    assert check_series("pcie", steps, config=DEFAULT, ident=identity())[-1].severity is Severity.OK


def test_lost_poll_breaks_the_hold() -> None:
    narrow = gpu(ident=GEN5_X16, **link(width=8))
    _, memory = run(narrow, config=DEFAULT, now=0.0)
    _, memory = run(gpu("timeout", ident=GEN5_X16), config=DEFAULT, memory=memory, now=100.0)
    health, _ = run(narrow, config=DEFAULT, memory=memory, now=350.0)
    assert finding(health, "pcie").severity is Severity.OK
    assert finding(health, "pcie").evidence_dict()["degraded_seconds"] == 0.0


def test_zero_hold_flags_from_the_second_degraded_poll() -> None:
    config = with_checks(pcie=PcieCheck(degraded_hold_seconds=0.0))
    steps = [(0.0, link(width=8)), (5.0, link(width=8))]
    assert [f.severity for f in check_series("pcie", steps, config, GEN5_X16)] == [
        Severity.OK,
        Severity.WARN,
    ]


def replays(count: int | None) -> dict[str, Any]:
    return link(pcie_replay_count=count)


@pytest.mark.parametrize(
    ("steps", "severity", "per_minute"),
    [
        pytest.param([(0.0, replays(5))], Severity.OK, None, id="one-sample"),
        # 10 per minute over the 5-minute window is 50 replays.
        pytest.param([(0.0, replays(0)), (300.0, replays(50))], Severity.OK, 10.0, id="at-limit"),
        pytest.param(
            [(0.0, replays(0)), (300.0, replays(51))], Severity.WARN, 10.2, id="above-limit"
        ),
        pytest.param(
            [(0.0, replays(0)), (60.0, replays(11))],
            Severity.OK,
            2.2,  # 11 in the first minute count against the 5 minutes, not as 11 per minute
            id="short-span-counts-against-the-whole-window",
        ),
        pytest.param(
            [(0.0, replays(0)), (60.0, replays(51))],
            Severity.WARN,
            10.2,
            id="burst-above-the-limit-in-the-first-minute-warns",
        ),
        pytest.param(
            [(0.0, replays(0)), (100.0, replays(0)), (200.0, replays(0)), (300.0, replays(100))],
            Severity.WARN,
            20.0,  # first to last; the last poll alone would be 100 in 100 s: 60 per minute
            id="several-polls",
        ),
        pytest.param(
            [(0.0, replays(1000)), (60.0, replays(3)), (120.0, replays(5))],
            Severity.OK,
            0.4,  # 2 replays since the reset, over 300 s
            id="counter-reset",
        ),
        pytest.param(
            [(0.0, replays(1000)), (60.0, replays(0))], Severity.OK, None, id="reset-not-negative"
        ),
        pytest.param(
            [(0.0, replays(0)), (10.0, replays(500)), (400.0, replays(500)), (460.0, replays(505))],
            Severity.OK,
            1.0,  # only the 400 s and 460 s samples are inside the window: 5 in 300 s
            id="burst-leaves-the-5-minute-window",
        ),
        pytest.param(
            [(0.0, replays(None)), (60.0, replays(None))], Severity.OK, None, id="not-supported"
        ),
        pytest.param(
            # A healthy H100 carries 40-120 replays since boot (real captures); an agent
            # started on it sees the count, not a rate, and it stays flat.
            [(0.0, replays(120)), (60.0, replays(120)), (240.0, replays(120))],
            Severity.OK,
            0.0,
            id="count-since-boot-after-an-agent-restart",
        ),
    ],
)
def test_replay_rate(
    steps: list[tuple[float, dict[str, Any]]], severity: Severity, per_minute: float | None
) -> None:
    last = check_series("pcie", steps, config=DEFAULT, ident=GEN5_X16)[-1]
    assert last.severity is severity
    assert last.evidence_dict()["replay_rate_per_minute"] == pytest.approx(per_minute)
    if severity is Severity.WARN:
        assert (last.action, last.runbook) == ("reseat_or_replace", "gpu-pcie-replay")


@pytest.mark.parametrize(
    ("steps", "reason"),
    [
        pytest.param(
            [(0.0, replays(0)), (300.0, replays(150))],
            "30 PCIe replays per minute (150 in 300 s), above 10",
            id="whole-window",
        ),
        pytest.param(
            [(0.0, replays(0)), (120.0, replays(60))],
            "12 PCIe replays per minute (60 in 120 s), above 10",  # 60 over 300 s
            id="short-span",
        ),
    ],
)
def test_replay_reason(steps: list[tuple[float, dict[str, Any]]], reason: str) -> None:
    last = check_series("pcie", steps, config=DEFAULT, ident=GEN5_X16)[-1]
    assert last.reason == reason


def test_degraded_and_replays_both_reported() -> None:
    steps = [
        (0.0, link(width=8, pcie_replay_count=0)),
        (100.0, link(width=8, pcie_replay_count=0)),
        (301.0, link(width=8, pcie_replay_count=9000)),
    ]
    last = check_series("pcie", steps, config=DEFAULT, ident=GEN5_X16)[-1]
    assert last.severity is Severity.WARN
    assert last.reason.startswith("PCIe link degraded (x8 of x16) for 301 s; ")
    assert "PCIe replays per minute" in last.reason


# --- bridges above the GPU (sysfs) ---------------------------------------------------------


def bridge_series(
    steps: list[tuple[float, PciePath, dict[str, Any]]], config: ChecksSection = DEFAULT
) -> list[Finding]:
    """The pcie finding after each poll of a busy Gen5 x16 GPU with the given sysfs path."""
    memory, out = HealthMemory(), []
    for now, path, readings in steps:
        state = gpu(ident=GEN5_X16, **{**link(), **readings})
        health, memory = run(state, config=config, memory=memory, now=now, pcie=(path,))
        out.append(finding(health, "pcie"))
    return out


def switch_path(**upstream: Any) -> PciePath:
    """BUS under a PCIe switch; ``upstream`` describes the switch-to-root-port link, whose
    two ends (the switch's upstream port and the root port) always show the same state."""
    return gpu_path(
        gen5_x16(SWITCH_DOWN), gen5_x16(SWITCH_UP, **upstream), gen5_x16(ROOT_PORT, **upstream)
    )


HEALTHY = switch_path()
NARROW = switch_path(current_width=8)
SLOW = switch_path(current_speed_gts=16.0)


@pytest.mark.parametrize(
    ("steps", "severities"),
    [
        pytest.param([(0.0, HEALTHY, {}), (400.0, HEALTHY, {})], ["OK", "OK"], id="healthy"),
        pytest.param(
            [(0.0, NARROW, {}), (300.0, NARROW, {}), (301.0, NARROW, {})],
            ["OK", "OK", "WARN"],
            id="narrow-after-hold",
        ),
        pytest.param(
            [
                (0.0, NARROW, {"utilization_gpu_pct": 0.0}),
                (301.0, NARROW, {"utilization_gpu_pct": 0.0}),
            ],
            ["OK", "WARN"],
            id="narrow-counts-even-idle",
        ),
        pytest.param([(0.0, SLOW, {}), (301.0, SLOW, {})], ["OK", "WARN"], id="slow-while-busy"),
        pytest.param(
            [
                (0.0, SLOW, {"utilization_gpu_pct": 0.0}),
                (301.0, SLOW, {"utilization_gpu_pct": 0.0}),
            ],
            ["OK", "OK"],
            id="slow-at-idle-is-power-saving",
        ),
        pytest.param(
            [(0.0, NARROW, {}), (200.0, HEALTHY, {}), (250.0, NARROW, {}), (500.0, NARROW, {})],
            ["OK", "OK", "OK", "OK"],
            id="recovery-restarts-the-hold",
        ),
        pytest.param(
            [(0.0, NARROW, {}), (400.0, NARROW, {}), (500.0, HEALTHY, {})],
            ["OK", "WARN", "OK"],
            id="recovery-clears",
        ),
    ],
)
def test_bridge_hold(
    steps: list[tuple[float, PciePath, dict[str, Any]]], severities: list[str]
) -> None:
    assert [f.severity.name for f in bridge_series(steps)] == severities


def test_bridge_reason_and_evidence() -> None:
    last = bridge_series([(0.0, NARROW, {}), (360.0, NARROW, {})])[-1]
    assert last.reason == (
        f"PCIe bridge {SWITCH_UP} above the GPU degraded (x8 of x16) for 360 s; "
        f"PCIe bridge {ROOT_PORT} above the GPU degraded (x8 of x16) for 360 s"
    )
    assert (last.action, last.runbook) == ("reseat_or_replace", "gpu-pcie-bridge-degraded")
    evidence = last.evidence_dict()
    assert evidence["bridges"] == 3
    assert evidence["bridges_degraded"] == f"{SWITCH_UP} (x8 of x16); {ROOT_PORT} (x8 of x16)"
    assert evidence["bridge_degraded_seconds"] == 360.0
    slow = bridge_series([(0.0, SLOW, {}), (360.0, SLOW, {})])[-1]
    assert f"PCIe bridge {SWITCH_UP} above the GPU degraded (16 of 32 GT/s)" in slow.reason


def test_bridge_and_gpu_link_both_reported() -> None:
    steps = [(0.0, NARROW, {"pcie_width": 8}), (400.0, NARROW, {"pcie_width": 8})]
    last = bridge_series(steps)[-1]
    assert last.reason.startswith("PCIe link degraded (x8 of x16) for 400 s; PCIe bridge ")


@pytest.mark.parametrize(
    "path",
    [
        pytest.param(
            gpu_path(
                gen5_x16(SWITCH_DOWN),
                gen5_x16(SWITCH_UP, current_speed_gts=16.0, max_speed_gts=16.0),
                gen5_x16(ROOT_PORT, current_speed_gts=16.0),
            ),
            id="gen5-root-port-above-a-gen4-switch",
        ),
        pytest.param(
            gpu_path(
                gen5_x16(ROOT_PORT, current_speed_gts=16.0),
                device=gen5_x16(BUS, role="gpu", current_speed_gts=16.0, max_speed_gts=16.0),
            ),
            id="gen4-gpu-below-a-gen5-root-port",
        ),
        pytest.param(
            gpu_path(gen5_x16(ROOT_PORT, current_width=None, current_speed_gts=None)),
            id="link-state-not-readable",
        ),
    ],
)
def test_a_link_at_what_both_ends_allow_is_not_degraded(path: PciePath) -> None:
    last = bridge_series([(0.0, path, {}), (1000.0, path, {})])[-1]
    assert last.severity is Severity.OK
    assert last.evidence_dict()["bridges_degraded"] is None


def test_lost_gpu_breaks_the_bridge_hold() -> None:
    _, memory = run(gpu(ident=GEN5_X16, **link()), config=DEFAULT, pcie=(NARROW,))
    assert [a for a, _ in memory.for_gpu(BUS).bridge_degraded_since] == [SWITCH_UP, ROOT_PORT]
    _, memory = run(gpu("lost", ident=GEN5_X16), memory=memory, now=100.0, pcie=(NARROW,))
    assert memory.for_gpu(BUS).bridge_degraded_since == ()


def test_without_sysfs_there_are_no_bridges() -> None:
    (found,) = check_series("pcie", [(0.0, link())], config=DEFAULT, ident=GEN5_X16)
    assert (found.evidence_dict()["bridges"], found.evidence_dict()["bridge_degraded_seconds"]) == (
        None,
        None,
    )


def test_a_platform_built_narrower_is_judged_against_its_own_link() -> None:
    # An AWS g6e seats its L40S in x8 slots: x8 of x16 is how it is built.
    held = [(0.0, link(width=8)), (400.0, link(width=8))]
    assert check_series("pcie", held, config=DEFAULT, ident=GEN5_X16)[-1].severity is (
        Severity.WARN
    )
    g6e = with_checks(pcie=PcieCheck(expected_width=8))
    last = check_series("pcie", held, config=g6e, ident=GEN5_X16)[-1]
    assert last.severity is Severity.OK
    # Narrower still than the platform gives is degraded there too.
    narrower = [(0.0, link(width=4)), (400.0, link(width=4))]
    last = check_series("pcie", narrower, config=g6e, ident=GEN5_X16)[-1]
    assert last.severity is Severity.WARN
    assert last.reason.startswith("PCIe link degraded (x4 of x8)")


def test_a_slow_sample_time_that_is_no_number_counts_as_now() -> None:
    # The replay series is timed by the slow counters' read; NaN would put every sample
    # outside every window.
    assert GpuReadings(counters_at=float("nan")).counters_sampled_at(12.0) == 12.0
    assert GpuReadings(counters_at=10.0).counters_sampled_at(12.0) == 10.0
    assert GpuReadings(counters_at=None).counters_sampled_at(12.0) == 12.0
