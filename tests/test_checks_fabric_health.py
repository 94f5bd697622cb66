"""The fabric_health check: NVML's fabric info v3 health mask, one condition at a time."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from conftest import DaemonProcess
from gpuagent.config import FabricHealthCheck
from gpuagent.model import FABRIC_CONDITIONS, Severity, fabric_conditions, fabric_health_mask
from test_checks_support import check_once, check_series, finding, gpu, run, with_checks

CLEAR = dict.fromkeys(FABRIC_CONDITIONS, False)


def _mask(*true: str, configuration_error: int = 5) -> int:
    return fabric_health_mask({**CLEAR, **dict.fromkeys(true, True)}, configuration_error)


@pytest.mark.parametrize(
    ("conditions", "severity", "action", "runbook", "reason"),
    [
        pytest.param(
            ("route_unhealthy",),
            Severity.CRITICAL,
            "drain_and_reboot",
            "gpu-fabric-route-unhealthy",
            "a fabric route to a peer GPU is unhealthy",
            id="route-unhealthy",
        ),
        pytest.param(
            ("incorrect_configuration",),
            Severity.CRITICAL,
            "investigate",
            "gpu-fabric-configuration",
            "fabric configuration incorrect for this GPU: insufficient NVLinks",
            id="incorrect-configuration",
        ),
        pytest.param(
            ("route_recovery",),
            Severity.WARN,
            "investigate",
            "gpu-fabric-recovery",
            "fabric route recovery in progress (0 s)",
            id="route-recovery",
        ),
        pytest.param(
            ("access_timeout_recovery",),
            Severity.WARN,
            "investigate",
            "gpu-fabric-recovery",
            "fabric access timeout recovery in progress (0 s)",
            id="access-timeout-recovery",
        ),
        pytest.param(
            ("bandwidth_degraded",),
            Severity.WARN,
            "investigate",
            "gpu-fabric-degraded",
            "fabric bandwidth degraded (NVLinks lost; traffic still flows)",
            id="bandwidth-degraded",
        ),
        pytest.param(
            ("gfm_disconnected",),
            Severity.WARN,
            "restart_fabric_manager",
            "gpu-fabric-manager-disconnected",
            "the global Fabric Manager is disconnected from this GPU's fabric",
            id="gfm-disconnected",
        ),
    ],
)
def test_each_condition_is_one_finding_with_its_runbook(
    conditions: tuple[str, ...], severity: Severity, action: str, runbook: str, reason: str
) -> None:
    found = check_once("fabric_health", fabric_health_mask=_mask(*conditions))
    assert (found.severity, found.action, found.runbook, found.reason) == (
        severity,
        action,
        runbook,
        reason,
    )
    assert found.evidence_dict()[conditions[0]] is True


def test_the_worst_condition_leads_and_every_one_is_named() -> None:
    found = check_once(
        "fabric_health", fabric_health_mask=_mask("bandwidth_degraded", "route_unhealthy")
    )
    assert found.severity is Severity.CRITICAL
    assert found.runbook == "gpu-fabric-route-unhealthy"
    assert "fabric bandwidth degraded" in found.reason


@pytest.mark.parametrize(
    ("code", "what"),
    [(2, "incorrect system GUID"), (4, "no partition"), (6, "incompatible GPU firmware")],
)
def test_an_incorrect_configuration_names_what_is_wrong(code: int, what: str) -> None:
    mask = _mask("incorrect_configuration", configuration_error=code)
    found = check_once("fabric_health", fabric_health_mask=mask)
    assert found.reason == f"fabric configuration incorrect for this GPU: {what}"


def test_a_healthy_fabric_names_what_it_reported() -> None:
    # The GB200 capture: bandwidth full, the recoveries false, the rest not supported.
    mask = fabric_health_mask(
        {"bandwidth_degraded": False, "route_recovery": False, "route_unhealthy": False,
         "access_timeout_recovery": False}
    )  # fmt: skip
    found = check_once("fabric_health", fabric_health_mask=mask)
    assert found.severity is Severity.OK
    assert found.reason == (
        "fabric healthy (bandwidth degraded, route recovery, route unhealthy, "
        "access timeout recovery: none)"
    )
    assert found.evidence_dict()["incorrect_configuration"] is None


@pytest.mark.parametrize("mask", [None, 0], ids=["no-v3-fabric-info", "nothing-supported"])
def test_a_fabric_that_reports_nothing_is_not_judged(mask: int | None) -> None:
    found = check_once("fabric_health", fabric_health_mask=mask)
    assert found.severity is Severity.OK
    assert found.reason == "fabric health not reported by this GPU and driver"


def test_a_recovery_that_does_not_end_becomes_critical() -> None:
    recovering = {"fabric_health_mask": _mask("route_recovery")}
    steps = [(0.0, recovering), (200.0, recovering), (301.0, recovering)]
    found = check_series("fabric_health", steps)
    assert [f.severity for f in found] == [Severity.WARN, Severity.WARN, Severity.CRITICAL]
    assert found[1].reason == "fabric route recovery in progress (200 s)"
    assert found[2].reason == "fabric route recovery in progress for 301 s, past 300 s"
    assert found[2].action == "drain_and_reboot"


def test_a_poll_without_recovery_starts_the_count_over() -> None:
    recovering = {"fabric_health_mask": _mask("route_recovery")}
    steps = [
        (0.0, recovering),
        (250.0, {"fabric_health_mask": _mask()}),
        (260.0, recovering),
        (500.0, recovering),
    ]
    found = check_series("fabric_health", steps)
    assert found[1].severity is Severity.OK
    assert [f.severity for f in found[2:]] == [Severity.WARN, Severity.WARN]


def test_the_timeout_and_the_switch_come_from_config() -> None:
    recovering = {"fabric_health_mask": _mask("access_timeout_recovery")}
    quick = with_checks(fabric_health=FabricHealthCheck(recovery_timeout_seconds=30.0))
    found = check_series("fabric_health", [(0.0, recovering), (31.0, recovering)], quick)
    assert found[-1].severity is Severity.CRITICAL
    off = with_checks(fabric_health=FabricHealthCheck(enabled=False))
    with pytest.raises(AssertionError, match="expected one fabric_health finding"):
        check_once("fabric_health", off, fabric_health_mask=_mask("route_unhealthy"))


def test_the_mask_round_trips_nvml_layout() -> None:
    for condition in FABRIC_CONDITIONS:
        conditions = {**CLEAR, condition: True}
        assert fabric_conditions(fabric_health_mask(conditions)) == conditions
    assert fabric_conditions(0) == {}


def test_the_daemon_finds_an_unhealthy_route_and_exports_each_condition(
    run_daemon: Callable[..., DaemonProcess],
) -> None:
    daemon = run_daemon(
        '[node]\ngpus = 2\nfabric_state = "completed"\n', interval=0.5, slow_interval=1
    )
    daemon.wait_for(lambda d: d["node"]["health"] == "OK" and len(d["gpus"]) == 2)
    daemon.inject("fabric_health", 1, bits=["route_unhealthy"])
    doc = daemon.wait_for(
        lambda d: any(f["check"] == "fabric_health" for f in d["gpus"][1]["findings"]),
        timeout=15,
    )
    (found,) = (f for f in doc["gpus"][1]["findings"] if f["check"] == "fabric_health")
    assert (found["severity"], found["runbook"]) == ("CRITICAL", "gpu-fabric-route-unhealthy")
    series = [
        line
        for line in daemon.metrics().splitlines()
        if line.startswith("gpuagent_gpu_fabric_health{")
    ]
    gpu1 = {
        line.split('condition="')[1].split('"')[0]: line.rsplit(" ", 1)[1]
        for line in series
        if 'gpu="1"' in line
    }
    # Every condition is reported on GPU 1, only the unhealthy route is true.
    assert gpu1 == {
        name: "1.0" if name == "route_unhealthy" else "0.0" for name in FABRIC_CONDITIONS
    }
    # GPU 0's fabric reports nothing (as an R580 H200 answers): no series at all.
    assert not [line for line in series if 'gpu="0"' in line]


# --- right after a boot: the fabric still registering the GPU ---------------------------------

UNPLACED = _mask("route_unhealthy", "incorrect_configuration", configuration_error=3)


@pytest.mark.parametrize(
    ("state", "seconds", "booted", "severity"),
    [
        pytest.param("in_progress", 42.0, True, Severity.OK, id="registering-in-the-grace"),
        pytest.param("not_started", 42.0, True, Severity.OK, id="not-started-in-the-grace"),
        pytest.param("in_progress", 300.0, True, Severity.CRITICAL, id="grace-over"),
        pytest.param("in_progress", 42.0, False, Severity.CRITICAL, id="boot-time-unknown"),
        pytest.param("completed", 42.0, True, Severity.CRITICAL, id="registered-is-judged"),
    ],
)
def test_the_mask_of_a_gpu_still_registering_after_boot_is_not_judged(
    state: str, seconds: float, booted: bool, severity: Severity
) -> None:
    readings = {"fabric_state": state, "fabric_health_mask": UNPLACED}
    health, _ = run(gpu(**readings), now=1000.0 + seconds, booted_at=1000.0 if booted else None)
    found = finding(health, "fabric_health")
    assert found.severity is severity
    evidence = found.evidence_dict()
    assert (evidence["fabric_state"], evidence["route_unhealthy"]) == (state, True)
    if severity is Severity.OK:
        words = state.replace("_", " ")
        assert found.reason == (
            f"fabric registration {words} after boot (42 s ago, grace 300 s): health not judged yet"
        )
        assert (evidence["seconds_since_boot"], evidence["boot_grace_seconds"]) == (42.0, 300.0)
