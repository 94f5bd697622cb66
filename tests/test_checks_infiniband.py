"""The `infiniband` check: pure function of the RDMA ports, their memory and expectations,
and how the engine runs it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpuagent.checks import HealthMemory, evaluate
from gpuagent.checks.infiniband import (
    IbExpected,
    IbInput,
    IbView,
    applies,
    check_infiniband,
    remember_infiniband,
)
from gpuagent.checks.memory import IbMemory
from gpuagent.config import ChecksSection, InfinibandCheck
from gpuagent.model import IbDevice, IbPort, NvmlStatus, Severity

CONFIG = InfinibandCheck()
DEFAULTS = ChecksSection()
EMPTY = HealthMemory()
NOTHING_EXPECTED = IbExpected()
ACTIVE = {"state_id": 4, "state": "ACTIVE", "phys_state_id": 5, "phys_state": "LinkUp"}
DOWN = {"state_id": 1, "state": "DOWN", "phys_state_id": 2, "phys_state": "Polling"}


def port(
    device: str,
    *,
    rate: float = 400.0,
    layer: str = "InfiniBand",
    errors: int = 0,
    downed: int = 0,
    up: bool = True,
) -> IbPort:
    counters = (("link_downed", downed), ("port_xmit_discards", 999), ("symbol_error", errors))
    return IbPort(
        device,
        1,
        rate_gbps=rate,
        link_layer=layer,
        counters=counters,
        **(ACTIVE if up else DOWN),  # type: ignore[arg-type]
    )


def node(*ports: IbPort) -> tuple[IbDevice, ...]:
    return tuple(IbDevice(p.device, "MT4129", ports=(p,)) for p in ports)


def healthy(count: int = 4) -> tuple[IbDevice, ...]:
    return node(*(port(f"mlx5_{i}") for i in range(count)))


def run(
    *polls: tuple[float, tuple[IbDevice, ...] | None],
    expected: IbExpected = NOTHING_EXPECTED,
    peermem: bool | None = None,
    config: InfinibandCheck = CONFIG,
) -> tuple[Severity, str, str, dict[str, object]]:
    """The finding after feeding each (time, devices) poll in turn."""
    memory = IbMemory()
    devices: tuple[IbDevice, ...] | None = ()
    for now, devices in polls:
        memory = remember_infiniband(memory, devices, config, now)
    view = IbView(devices, memory, config, expected, peermem)
    outcome = check_infiniband(view)
    ranked = sorted(outcome.problems, key=lambda p: -p.severity.rank)
    if not ranked:
        return Severity.OK, outcome.ok_reason, "", dict(outcome.evidence)
    return (
        ranked[0].severity,
        "; ".join(p.reason for p in ranked),
        ranked[0].runbook.value,
        dict(outcome.evidence),
    )


def test_healthy_ports() -> None:
    severity, reason, _, evidence = run((0.0, healthy()))
    assert (severity, reason) == (Severity.OK, "4 RDMA ports active at full rate, no link errors")
    assert evidence["ports_judged"] == 4
    assert evidence["expected_rate_gbps"] == "400"


def test_a_port_that_went_down_is_critical() -> None:
    down = node(*(port(f"mlx5_{i}", up=i != 2) for i in range(4)))
    severity, reason, runbook, evidence = run((0.0, healthy()), (30.0, down))
    assert (severity, runbook) == (Severity.CRITICAL, "node-ib-port-down")
    assert "mlx5_2/1 DOWN/Polling" in reason
    assert evidence["ports_active"] == 3


def test_a_port_never_seen_up_is_not_judged_without_expected_hcas() -> None:
    # A second port without a cable: down from the start, not a problem.
    ports = node(port("mlx5_0"), port("mlx5_1", up=False))
    severity, reason, _, evidence = run((0.0, ports), (30.0, ports))
    assert (severity, reason) == (Severity.OK, "1 RDMA port active at full rate, no link errors")
    assert evidence["ports_judged"] == 1
    # Named in the expectation, the same port is judged from the first poll.
    expected = IbExpected(hcas=("mlx5_0", "mlx5_1"))
    severity, reason, runbook, _ = run((0.0, ports), expected=expected)
    assert (severity, runbook) == (Severity.CRITICAL, "node-ib-port-down")


def test_a_port_in_init_without_a_subnet_manager_is_down() -> None:
    init = IbPort("mlx5_0", 1, 2, "INIT", 5, "LinkUp", 400.0, "InfiniBand")
    severity, reason, _, _ = run(
        (0.0, (IbDevice("mlx5_0", ports=(init,)),)), expected=IbExpected(("mlx5_0",))
    )
    assert severity is Severity.CRITICAL
    assert "mlx5_0/1 INIT/LinkUp" in reason


@pytest.mark.parametrize(
    ("present", "expected", "missing"),
    [
        (healthy(2), ("mlx5_0", "mlx5_1", "mlx5_2"), "mlx5_2"),
        ((), ("mlx5_0",), "mlx5_0"),
    ],
)
def test_an_expected_hca_missing_is_critical(
    present: tuple[IbDevice, ...], expected: tuple[str, ...], missing: str
) -> None:
    severity, reason, runbook, _ = run((0.0, present), expected=IbExpected(hcas=expected))
    assert (severity, runbook) == (Severity.CRITICAL, "node-ib-hca-missing")
    assert reason.endswith(f"missing from /sys/class/infiniband: {missing}")


def test_an_hca_seen_up_then_gone_is_critical() -> None:
    severity, reason, runbook, _ = run((0.0, healthy(4)), (30.0, healthy(3)))
    assert (severity, runbook) == (Severity.CRITICAL, "node-ib-hca-missing")
    assert "mlx5_3" in reason
    # Back again: fine.
    assert run((0.0, healthy(4)), (30.0, healthy(3)), (60.0, healthy(4)))[0] is Severity.OK
    # With a list of HCAs, only those matter: an unlisted one may come and go.
    listed = IbExpected(hcas=("mlx5_0", "mlx5_1", "mlx5_2"))
    assert run((0.0, healthy(4)), (30.0, healthy(3)), expected=listed)[0] is Severity.OK


def test_a_slow_link_against_the_most_common_rate() -> None:
    ports = node(port("mlx5_0"), port("mlx5_1"), port("mlx5_2", rate=200.0), port("mlx5_3"))
    severity, reason, runbook, _ = run((0.0, ports))
    assert (severity, runbook) == (Severity.WARN, "node-ib-rate")
    assert reason == "RDMA link below the expected rate: mlx5_2/1 200 Gb/s (want 400)"


def test_ties_go_to_the_faster_rate_and_layers_are_apart() -> None:
    ports = node(
        port("mlx5_0"),
        port("mlx5_1", rate=200.0),
        # A 100 GbE RoCE NIC is not held to the InfiniBand ports' rate.
        port("mlx5_2", rate=100.0, layer="Ethernet"),
    )
    severity, reason, _, evidence = run((0.0, ports))
    assert severity is Severity.WARN
    assert "mlx5_1/1 200 Gb/s (want 400)" in reason
    assert "mlx5_2" not in reason
    assert evidence["expected_rate_gbps"] == "100,400"


def test_a_configured_rate_wins() -> None:
    severity, reason, _, _ = run((0.0, healthy(2)), expected=IbExpected(rate_gbps=800.0))
    assert severity is Severity.WARN
    assert "mlx5_0/1 400 Gb/s (want 800)" in reason
    # All at the configured rate: fine, whatever is most common.
    assert run((0.0, healthy(2)), expected=IbExpected(rate_gbps=400.0))[0] is Severity.OK


def test_error_rate_above_the_threshold_warns() -> None:
    before = healthy(2)
    after = node(port("mlx5_0", errors=50), port("mlx5_1"))
    severity, reason, runbook, _ = run((0.0, before), (30.0, after))
    assert (severity, runbook) == (Severity.WARN, "node-ib-errors")
    assert reason == "RDMA link errors above 1/min: mlx5_0/1 50 in 30 s"


def test_old_errors_and_slow_ones_are_fine() -> None:
    # Errors from before the agent started are never judged...
    old = node(port("mlx5_0", errors=10_000))
    assert run((0.0, old), (30.0, old))[0] is Severity.OK
    # ...and a few over the window stay under 1 per minute (5 in a 600 s window).
    few = node(port("mlx5_0", errors=10_005))
    assert run((0.0, old), (30.0, few))[0] is Severity.OK
    # Transmit discards are congestion, not link errors.
    congested = node(replace(port("mlx5_0"), counters=(("port_xmit_discards", 10**9),)))
    assert run((0.0, healthy(1)), (30.0, congested))[0] is Severity.OK


def test_a_counter_reset_starts_over() -> None:
    high, reset = node(port("mlx5_0", errors=500)), node(port("mlx5_0", errors=0))
    assert run((0.0, high), (30.0, reset))[0] is Severity.OK


def test_errors_age_out_of_the_window() -> None:
    config = InfinibandCheck(rate_window_seconds=60.0)
    before, after = healthy(1), node(port("mlx5_0", errors=50))
    assert run((0.0, before), (30.0, after), config=config)[0] is Severity.WARN
    assert run((0.0, before), (30.0, after), (100.0, after), config=config)[0] is Severity.OK


def test_a_link_that_went_down_and_back_warns() -> None:
    severity, reason, runbook, _ = run((0.0, healthy(1)), (30.0, node(port("mlx5_0", downed=1))))
    assert (severity, runbook) == (Severity.WARN, "node-ib-errors")
    assert reason == "RDMA link went down and retrained: mlx5_0/1 1 time in 30 s"


@pytest.mark.parametrize(
    ("gpudirect", "loaded", "severity"),
    [
        (True, False, Severity.WARN),
        (True, True, Severity.OK),
        (True, None, Severity.OK),  # modules unknown (no inventory): not judged
        (False, False, Severity.OK),
    ],
)
def test_gpudirect_needs_nvidia_peermem(
    gpudirect: bool, loaded: bool | None, severity: Severity
) -> None:
    found, reason, runbook, evidence = run(
        (0.0, healthy(1)), expected=IbExpected(gpudirect=gpudirect), peermem=loaded
    )
    assert found is severity
    assert evidence["nvidia_peermem"] is loaded
    if severity is Severity.WARN:
        assert runbook == "node-ib-peermem"
        assert "nvidia_peermem is not loaded" in reason


def test_every_problem_is_listed_worst_first() -> None:
    ports = node(port("mlx5_0", up=False), port("mlx5_1", rate=100.0), port("mlx5_2"))
    severity, reason, _, _ = run(
        (0.0, ports), expected=IbExpected(hcas=("mlx5_0", "mlx5_1", "mlx5_2")), peermem=False
    )
    assert severity is Severity.CRITICAL
    assert reason.startswith("RDMA port not ACTIVE/LinkUp: mlx5_0/1")
    assert "mlx5_1/1 100 Gb/s (want 400)" in reason


def test_unreadable_class_directory() -> None:
    severity, reason, _, _ = run((0.0, None))
    assert (severity, reason) == (
        Severity.OK,
        "RDMA devices cannot be read (/sys/class/infiniband)",
    )


def test_applies_only_to_nodes_with_rdma_or_expectations() -> None:
    empty = IbView((), IbMemory(), CONFIG)
    assert not applies(empty)
    assert applies(replace(empty, devices=healthy(1)))
    assert applies(replace(empty, expected=IbExpected(gpudirect=True)))
    assert applies(replace(empty, memory=IbMemory(seen_active=frozenset({"mlx5_0/1"}))))


# --- through the engine ---------------------------------------------------------------


def _evaluate(
    given: IbInput | None,
    memory: HealthMemory = EMPTY,
    config: ChecksSection = DEFAULTS,
    now: float = 0.0,
) -> tuple[list[tuple[str, Severity]], HealthMemory]:
    health, memory = evaluate((), NvmlStatus(ok=True), config, memory, now, infiniband=given)
    return [(f.check, f.severity) for f in health.node_findings()], memory


def test_engine_appends_the_finding_after_the_node_checks() -> None:
    found, _ = _evaluate(IbInput(healthy(2)))
    assert found[-1] == ("infiniband", Severity.OK)
    assert [c for c, _ in found].count("infiniband") == 1


@pytest.mark.parametrize(
    "given",
    [None, IbInput(()), IbInput(None)],
    ids=["sysfs-off", "no-rdma", "unreadable-nothing-expected"],
)
def test_engine_gives_no_finding_without_rdma(given: IbInput | None) -> None:
    found, memory = _evaluate(given)
    assert "infiniband" not in [c for c, _ in found]
    assert memory.infiniband == IbMemory()


def test_engine_remembers_ports_across_polls() -> None:
    _, memory = _evaluate(IbInput(healthy(2)))
    assert memory.infiniband.seen_active == {"mlx5_0/1", "mlx5_1/1"}
    down = node(port("mlx5_0"), port("mlx5_1", up=False))
    found, _ = _evaluate(IbInput(down), memory, now=30.0)
    assert found[-1] == ("infiniband", Severity.CRITICAL)


def test_engine_skips_the_check_when_disabled() -> None:
    config = replace(ChecksSection(), infiniband=InfinibandCheck(enabled=False))
    found, memory = _evaluate(IbInput(healthy(2)), config=config)
    assert "infiniband" not in [c for c, _ in found]
    assert memory.infiniband == IbMemory()
