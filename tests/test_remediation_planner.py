"""The remediation planner: findings + history + config → the actions to take, in order."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuagent.checks import HealthMemory, evaluate
from gpuagent.checks.vocabulary import Action
from gpuagent.checks.xid import judge
from gpuagent.config import (
    ChecksSection,
    RemediationCordon,
    RemediationPower,
    RemediationRule,
    RemediationSection,
    _default_rules,
    parse_config,
)
from gpuagent.config.schema.remediation import FindingAction
from gpuagent.kernel.xid import lookup
from gpuagent.model import (
    EvidenceValue,
    Finding,
    GpuEvent,
    GpuIdentity,
    GpuReadings,
    GpuState,
    GpuStatus,
    NodeHealth,
    NodeSnapshot,
    NvmlStatus,
    Severity,
)
from gpuagent.remediation.planner import (
    MAX_CORDON_REASON,
    PERSISTENCED_REPORT,
    bounded_summary,
    node_is_healthy,
    plan,
    rule_matches,
    thermal_ok,
)
from gpuagent.remediation.types import History, PlannedAction

NODE = "gpu-node-07"
BUS0 = "0000:18:00.0"
BUS1 = "0000:2a:00.0"
BUS2 = "0000:3b:00.0"
DEFAULT_W = 700.0
WARN, CRITICAL, UNKNOWN, OK = Severity.WARN, Severity.CRITICAL, Severity.UNKNOWN, Severity.OK
NVML_OK = NvmlStatus(ok=True, driver_version="550.54.15")
Backend = Literal["kubernetes", "slurm", "command", "aggregator"]

# --- builders -----------------------------------------------------------------------------


def gpu(
    bus: str = BUS0,
    index: int = 0,
    status: GpuStatus = "ok",
    *,
    default_w: float | None = DEFAULT_W,
    **readings: Any,
) -> GpuState:
    """A healthy-looking GPU; readings only when it answers, as the sources do."""
    values: dict[str, Any] = {"persistence_mode": True, "power_limit_w": DEFAULT_W} | readings
    return GpuState(
        identity=GpuIdentity(
            index=index,
            pci_bus_id=bus,
            uuid=f"GPU-{bus}",
            name="NVIDIA H100 80GB HBM3",
            power_default_limit_w=default_w,
        ),
        status=status,
        readings=GpuReadings(**values) if status == "ok" else None,
    )


def finding(
    check: str,
    severity: Severity,
    reason: str = "",
    *,
    bus: str | None = BUS0,
    action: str = "none",
    evidence: tuple[tuple[str, EvidenceValue], ...] = (),
) -> Finding:
    return Finding(check, severity, reason or f"{check} {severity.name}", bus, evidence, action)


def xid(code: int, line: str = "", *, bus: str | None = BUS0) -> Finding:
    """An xid finding as the xid check makes it: its verdict, the XID and catalog bucket."""
    info = lookup(code)
    assert info is not None
    verdict = judge(code, line).verdict
    return finding(
        "xid",
        verdict.severity,
        f"Xid {code} ({info.mnemonic}): {verdict.label}",
        bus=bus,
        action=verdict.action.value,
        evidence=(("xid_events", 1), ("xid", code), ("catalog_action", info.action)),
    )


def snapshot(*findings: Finding, gpus: tuple[GpuState, ...] = (gpu(),)) -> NodeSnapshot:
    return NodeSnapshot(
        node_name=NODE,
        cluster="default",
        hostname=NODE,
        sequence=1,
        taken_at=1_700_000_000.0,
        nvml=NVML_OK,
        gpus=gpus,
        health=NodeHealth(findings),
    )


def config(
    *,
    backends: tuple[Backend, ...] = ("slurm",),
    rules: list[RemediationRule] | None = None,
    **cordon: Any,
) -> RemediationSection:
    return RemediationSection(
        rules=_default_rules() if rules is None else rules,
        cordon=RemediationCordon(backends=list(backends), **cordon),
    )


def keys(actions: tuple[PlannedAction, ...]) -> list[str]:
    return [a.key for a in actions]


def one(actions: tuple[PlannedAction, ...], kind: str) -> PlannedAction:
    found = [a for a in actions if a.kind == kind]
    assert len(found) == 1, f"expected one {kind}, got {actions}"
    return found[0]


CORDON = f"cordon:{NODE}"
RESET0 = f"reset_gpu:{BUS0}"
CAP0 = f"cap_power:{BUS0}"

# --- every default rule -------------------------------------------------------------------

DEFAULT_RULE_CASES = [
    pytest.param(
        [finding("persistence", WARN, "persistence mode off", action="enable_persistence")],
        {"persistence_mode": False},
        [f"enable_persistence:{BUS0}"],
        id="persistence-off",
    ),
    pytest.param(
        [finding("ecc", CRITICAL, "1 uncorrectable ECC error", action="drain_and_reset")],
        {},
        [CORDON, RESET0],
        id="ecc-dbe",
    ),
    pytest.param(
        [finding("ecc", WARN, "corrected error rate high", action="investigate")],
        {},
        [],
        id="ecc-sbe-rate-warn-below-rule",
    ),
    pytest.param(
        [finding("row_remap", CRITICAL, "row remapping failed", action="reseat_or_replace")],
        {},
        [CORDON],
        id="row-remap-failure-cordon-only",
    ),
    pytest.param(
        [finding("row_remap", WARN, "row remap pending; reset required", action="reset_gpu")],
        {},
        [CORDON, RESET0],
        id="row-remap-pending",
    ),
    pytest.param(
        [finding("retired_pages", WARN, "pages pending retirement", action="reset_gpu")],
        {},
        [CORDON, RESET0],
        id="retired-pages-pending",
    ),
    pytest.param(
        [finding("retired_pages", WARN, "61 retired pages", action="contact_support")],
        {},
        [CORDON],
        id="retired-pages-limit-no-reset",
    ),
    pytest.param([xid(64)], {}, [CORDON, RESET0], id="xid-64-bucket-reset-gpu"),
    pytest.param([xid(140)], {}, [CORDON, RESET0], id="xid-140-bucket-reset-gpu"),
    pytest.param([xid(79)], {}, [CORDON], id="xid-79-fallen-off-bus"),
    pytest.param([xid(95)], {}, [CORDON, RESET0], id="xid-95-uncontained"),
    pytest.param([xid(119)], {}, [CORDON, RESET0], id="xid-119-gsp-rpc-timeout"),
    pytest.param([xid(120)], {}, [CORDON, RESET0], id="xid-120-gsp-error"),
    pytest.param([xid(31)], {}, [], id="xid-31-application-error"),
    pytest.param(
        [finding("xid", CRITICAL, "application errors too fast", action="investigate")],
        {},
        [],
        id="xid-application-error-rate-no-cordon",
    ),
    pytest.param([xid(74)], {}, [CORDON], id="xid-74-contact-support"),
    pytest.param(
        [finding("xid", CRITICAL, "Xid 74 on NVLink 6, hardware", action="reseat_or_replace")],
        {},
        [CORDON],
        id="xid-74-link-hardware-no-reset",
    ),
    pytest.param(
        [finding("xid", WARN, "Xid 74 on NVLink 6, sympathetic", action="investigate")],
        {},
        [],
        id="xid-74-sympathetic-is-the-peers",
    ),
    pytest.param([xid(48)], {}, [CORDON], id="xid-48-alone"),
    pytest.param(
        [xid(154, "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)")],
        {},
        [CORDON],
        id="xid-154-reboot",
    ),
    pytest.param(
        [xid(154, "GPU recovery action changed from 0x2 (Node Reboot Required) to 0x0 (None)")],
        {},
        [],
        id="xid-154-no-recovery-needed",
    ),
    pytest.param(
        [xid(145, "NVLink: RLW Error (0x1) link 3 RLW_RXPIPE Fatal XC0 i0")],
        {},
        [CORDON],
        id="xid-145-fatal-nvlink5",
    ),
    pytest.param(
        [xid(145, "NVLink: RLW Error (0x1) link 3 RLW_RXPIPE Nonfatal XC0 i0")],
        {},
        [],
        id="xid-145-nonfatal-nvlink5",
    ),
    pytest.param(
        [finding("sxid", CRITICAL, "fatal SXid 12028", bus=None, action="drain_and_reboot")],
        {},
        [CORDON],
        id="sxid-fatal",
    ),
    pytest.param(
        [finding("aer", CRITICAL, "uncorrectable AER error", action="drain_and_reboot")],
        {},
        [CORDON],
        id="aer-uncorrectable",
    ),
    pytest.param(
        [finding("fabric", CRITICAL, "nvidia-fabricmanager is failed", bus=None)],
        {},
        [CORDON],
        id="fabric-manager-down",
    ),
    pytest.param(
        [finding("driver", CRITICAL, "kernel module not loaded: nvidia", bus=None)],
        {},
        [CORDON],
        id="driver-module-not-loaded",
    ),
    pytest.param(
        [finding("kernel", CRITICAL, "driver/library version mismatch", bus=None)],
        {},
        [CORDON],
        id="kernel-api-mismatch",
    ),
    pytest.param(
        [finding("nvml", CRITICAL, "NVIDIA driver not loaded", bus=None, action="load_driver")],
        {},
        [CORDON],
        id="nvml-driver-not-loaded",
    ),
    pytest.param(
        [finding("nvml", CRITICAL, "version mismatch", bus=None, action="reboot")],
        {},
        [CORDON],
        id="nvml-version-mismatch",
    ),
    pytest.param(
        [finding("nvml", CRITICAL, "no permission to use NVML", bus=None, action="run_as_root")],
        {},
        [],
        id="nvml-no-permission-is-ours-to-fix",
    ),
    pytest.param(
        [finding("nvml", CRITICAL, "NVML timed out", bus=None, action="investigate")],
        {},
        [],
        id="nvml-timeout-is-no-reason-to-cordon",
    ),
    pytest.param(
        [
            finding(
                "kubernetes",
                CRITICAL,
                "8 healthy GPUs but 0 nvidia.com/gpu allocatable",
                bus=None,
                action="restart_device_plugin",
            )
        ],
        {},
        [CORDON],
        id="kubernetes-gpus-not-advertised",
    ),
    pytest.param(
        [finding("infiniband", CRITICAL, "mlx5_3/1 DOWN", bus=None, action="investigate")],
        {},
        [CORDON],
        id="infiniband-port-down",
    ),
    pytest.param(
        [finding("gpu_count", CRITICAL, "1 of 8 expected GPUs missing", bus=None)],
        {},
        [CORDON],
        id="gpu-count-missing",
    ),
    pytest.param(
        [finding("dcgm", CRITICAL, "DCGM health: memory failure", action="drain_and_reset")],
        {},
        [CORDON],
        id="dcgm-health-failure",
    ),
    pytest.param(
        [finding("bus", CRITICAL, "GPU has fallen off the bus", action="drain_and_reboot")],
        {},
        [CORDON],
        id="bus-fallen-off",
    ),
    pytest.param(
        [finding("nvlink", CRITICAL, "NVLink 3 down", action="drain_and_reboot")],
        {},
        [CORDON],
        id="nvlink-down",
    ),
    pytest.param(
        [finding("thermal", CRITICAL, "GPU at 90 °C", action="check_cooling")],
        {},
        [CAP0],
        id="thermal-critical-caps",
    ),
    pytest.param(
        [finding("thermal", WARN, "GPU at 84 °C", action="check_cooling")],
        {},
        [],
        id="thermal-warn-below-rule",
    ),
    pytest.param(
        [finding("pcie", WARN, "link degraded", action="investigate")],
        {},
        [],
        id="no-rule-for-pcie",
    ),
    pytest.param([finding("ecc", OK, "fine")], {}, [], id="ok-finding"),
]


@pytest.mark.parametrize(("findings", "readings", "expected"), DEFAULT_RULE_CASES)
def test_default_rules(
    findings: list[Finding], readings: dict[str, Any], expected: list[str]
) -> None:
    actions = plan(snapshot(*findings, gpus=(gpu(**readings),)), History(), 0.0, config())
    assert keys(actions) == expected


def test_availability_lost_cordons_and_nothing_else() -> None:
    lost = finding("availability", CRITICAL, "GPU is lost", action="drain_and_reboot")
    actions = plan(snapshot(lost, gpus=(gpu(status="lost"),)), History(), 0.0, config())
    assert keys(actions) == [CORDON]
    assert actions[0].reason == f"GPU {BUS0}: GPU is lost (availability)"


@pytest.mark.parametrize(
    ("found", "reason"),
    [
        pytest.param(
            finding("row_remap", WARN, "row remap pending; reset required", action="reset_gpu"),
            f"GPU {BUS0}: reset required (row_remap)",
            id="row-remap-pending-rule-reason",
        ),
        pytest.param(
            finding("retired_pages", WARN, "pages pending retirement", action="reset_gpu"),
            f"GPU {BUS0}: reset required (retired_pages)",
            id="retired-pages-rule-reason",
        ),
        pytest.param(
            finding("row_remap", CRITICAL, "row remapping failed", action="reseat_or_replace"),
            f"GPU {BUS0}: row remapping failed (row_remap)",
            id="row-remap-failure-own-reason-not-reset-required",
        ),
        pytest.param(
            finding("retired_pages", WARN, "61 retired pages", action="contact_support"),
            f"GPU {BUS0}: 61 retired pages (retired_pages)",
            id="retired-pages-limit-own-reason",
        ),
        pytest.param(
            finding("ecc", CRITICAL, "1 uncorrectable ECC error", action="drain_and_reset"),
            f"GPU {BUS0}: 1 uncorrectable ECC error (ecc)",
            id="ecc-finding-reason",
        ),
    ],
)
def test_cordon_reason(found: Finding, reason: str) -> None:
    action = one(plan(snapshot(found), History(), 0.0, config()), "cordon")
    assert action.reason == reason
    assert action.target == NODE
    assert action.check == found.check
    assert action.severity == found.severity.name


def test_actions_carry_their_finding() -> None:
    dbe = finding(
        "ecc",
        CRITICAL,
        "1 uncorrectable ECC error",
        action="drain_and_reset",
        evidence=(("ecc_dbe_volatile", 1),),
    )
    reset = one(plan(snapshot(dbe), History(), 0.0, config()), "reset_gpu")
    assert reset == PlannedAction(
        "reset_gpu",
        BUS0,
        "1 uncorrectable ECC error",
        check="ecc",
        severity="CRITICAL",
        evidence=(("ecc_dbe_volatile", 1),),
    )


def test_every_default_rule_is_covered() -> None:
    covered = {"persistence", "ecc", "row_remap", "retired_pages", "xid", "availability"}
    covered |= {"bus", "nvlink", "thermal", "aer", "sxid", "dcgm", "kernel", "nvml"}
    covered |= {"gpu_count", "driver", "fabric", "kubernetes", "infiniband"}
    assert {rule.check for rule in _default_rules()} == covered


# --- what the planner does not do -----------------------------------------------------------


@pytest.mark.parametrize("rule", _default_rules(), ids=lambda r: f"{r.check}-{r.actions[0]}")
def test_unknown_never_acts(rule: RemediationRule) -> None:
    unknown = finding(
        rule.check,
        UNKNOWN,
        "no data: GPU timeout",
        action="investigate",
        evidence=(("xid", 119), ("catalog_action", "RESET_GPU")),
    )
    snap = snapshot(unknown, gpus=(gpu(persistence_mode=False),))
    assert plan(snap, History(), 0.0, config()) == ()
    assert not rule_matches(dataclasses.replace(rule, severity="WARN"), unknown)


@pytest.mark.parametrize(
    "found",
    [
        pytest.param(finding("ecc", WARN, action="drain_and_reset"), id="ecc"),
        pytest.param(dataclasses.replace(xid(119), severity=WARN), id="xid-reset-bucket"),
        pytest.param(finding("availability", WARN), id="availability"),
        pytest.param(finding("bus", WARN), id="bus"),
        pytest.param(finding("nvlink", WARN), id="nvlink"),
        pytest.param(finding("thermal", WARN), id="thermal"),
    ],
)
def test_warn_below_a_critical_rule_does_nothing(found: Finding) -> None:
    assert plan(snapshot(found), History(), 0.0, config()) == ()


def test_cordoned_by_us_is_not_cordoned_again() -> None:
    dbe = finding("ecc", CRITICAL, action="drain_and_reset")
    assert keys(plan(snapshot(dbe), History(), 0.0, config())) == [CORDON, RESET0]
    again = plan(snapshot(dbe), History(cordoned_by_us=True), 0.0, config())
    assert keys(again) == [RESET0]


def test_no_backends_the_cordon_and_the_reset_are_still_planned() -> None:
    # The planner says what the findings ask for; the executor refuses both (no backend
    # to ask; reset.require_cordon can never hold) and audits why.
    dbe = finding("ecc", CRITICAL, action="drain_and_reset")
    actions = plan(snapshot(dbe), History(), 0.0, config(backends=()))
    assert keys(actions) == [CORDON, RESET0]


@pytest.mark.parametrize(
    "found",
    [
        pytest.param(
            finding("availability", CRITICAL, "GPU is lost", action="drain_and_reboot"),
            id="lost-gpu",
        ),
        pytest.param(xid(79), id="xid-79"),
    ],
)
def test_no_backends_a_lost_gpu_still_plans_the_cordon_it_would_request(found: Finding) -> None:
    lost = snapshot(found, gpus=(gpu(status="lost"),))
    (cordon,) = plan(lost, History(), 0.0, config(backends=()))
    assert (cordon.kind, cordon.target, cordon.check) == ("cordon", NODE, found.check)
    assert cordon.reason == f"GPU {BUS0}: {found.reason} ({found.check})"
    assert dict(cordon.evidence)["gpus"] == BUS0


def test_escalated_gpu_is_not_reset_again() -> None:
    dbe0 = finding("ecc", CRITICAL, action="drain_and_reset")
    dbe1 = finding("ecc", CRITICAL, bus=BUS1, action="drain_and_reset")
    gpus = (gpu(), gpu(BUS1, 1))
    actions = plan(snapshot(dbe0, dbe1, gpus=gpus), History(escalated=(BUS0,)), 0.0, config())
    assert keys(actions) == [CORDON, f"reset_gpu:{BUS1}"]


@pytest.mark.parametrize("status", ["lost", "timeout", "error"])
def test_gpu_not_answering_gets_no_gpu_actions(status: GpuStatus) -> None:
    # Event checks still judge such a GPU: its XIDs ask for a reset that cannot happen.
    findings = (
        finding("availability", CRITICAL if status == "lost" else UNKNOWN, action="x"),
        xid(119),
        finding("persistence", WARN, action="enable_persistence"),
        finding("thermal", CRITICAL),
    )
    actions = plan(snapshot(*findings, gpus=(gpu(status=status),)), History(), 0.0, config())
    assert keys(actions) == [CORDON]


@pytest.mark.parametrize(
    "rule_action",
    ["drain_and_reboot", "reboot", "reseat_or_replace", "contact_support"],
)
def test_no_reset_where_the_check_says_a_reset_cannot_help(rule_action: str) -> None:
    rules = [RemediationRule("nvlink", ["cordon", "reset_gpu"], cordon_reason="reset it")]
    down = finding("nvlink", CRITICAL, "NVLink 3 down", action=rule_action)
    actions = plan(snapshot(down), History(), 0.0, config(rules=rules))
    assert keys(actions) == [CORDON]
    assert actions[0].reason == f"GPU {BUS0}: NVLink 3 down (nvlink)"


def test_node_findings_cordon_but_plan_no_gpu_action() -> None:
    rules = [RemediationRule("sxid", ["cordon", "reset_gpu"])]
    fatal = finding("sxid", CRITICAL, "fatal SXid 24007", bus=None, action="investigate")
    actions = plan(snapshot(fatal), History(), 0.0, config(rules=rules))
    assert keys(actions) == [CORDON]
    assert actions[0].reason == "node: fatal SXid 24007 (sxid)"


def test_findings_for_gpus_not_listed_plan_no_gpu_action() -> None:
    dbe = finding("ecc", CRITICAL, bus=BUS2, action="drain_and_reset")
    assert keys(plan(snapshot(dbe), History(), 0.0, config())) == [CORDON]


# --- one cordon for the node --------------------------------------------------------------


def test_one_cordon_summarises_every_gpu_worst_first() -> None:
    gpus = (gpu(), gpu(BUS1, 1), gpu(BUS2, 2))
    findings = (
        finding("row_remap", WARN, "row remap pending", action="reset_gpu"),
        finding("ecc", CRITICAL, "1 uncorrectable ECC error", bus=BUS1, action="drain_and_reset"),
        xid(79, bus=BUS2),
    )
    actions = plan(snapshot(*findings, gpus=gpus), History(), 0.0, config())
    assert keys(actions) == [CORDON, RESET0, f"reset_gpu:{BUS1}"]
    cordon = actions[0]
    assert cordon.reason == (
        f"GPU {BUS1}: 1 uncorrectable ECC error (ecc); "
        f"GPU {BUS2}: Xid 79 (ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS): reboot required (xid); "
        f"GPU {BUS0}: reset required (row_remap)"
    )
    assert (cordon.check, cordon.severity) == ("ecc", "CRITICAL")
    assert cordon.evidence == (
        ("checks", "ecc, xid, row_remap"),
        ("gpus", f"{BUS1}, {BUS2}, {BUS0}"),
        ("findings", 3),
    )


def test_a_finding_matched_by_two_rules_is_named_once() -> None:
    # Xid 119 is in the RESET_GPU bucket and in the xids list: two rules, one cordon part.
    actions = plan(snapshot(xid(119)), History(), 0.0, config())
    assert keys(actions) == [CORDON, RESET0]
    assert actions[0].reason.count("Xid 119") == 1
    assert dict(actions[0].evidence)["findings"] == 1


def test_cordon_reason_is_one_bounded_line() -> None:
    gpus = tuple(gpu(f"0000:{n:02x}:00.0", n) for n in range(8))
    findings = tuple(
        finding("ecc", CRITICAL, f"error\non line two\t{n} " + "x" * 40, bus=g.identity.pci_bus_id)
        for n, g in enumerate(gpus)
    )
    reason = one(plan(snapshot(*findings, gpus=gpus), History(), 0.0, config()), "cordon").reason
    assert len(reason) <= MAX_CORDON_REASON
    assert reason.isprintable()
    assert reason.startswith("GPU 0000:00:00.0: error on line two 0 xxx")
    assert reason.endswith("more)")


@pytest.mark.parametrize(
    ("parts", "limit", "expected"),
    [
        pytest.param(["a", "b"], 10, "a; b", id="fits"),
        pytest.param(["aaaa", "bbbb", "cccc"], 15, "aaaa; (+2 more)", id="whole-parts-then-count"),
        pytest.param(["a" * 30], 10, "aaaaaaaaa…", id="one-long-part-cut"),
        pytest.param(["a" * 30, "b"], 20, "aaaaaaaaa… (+1 more)", id="long-first-part-and-more"),
        pytest.param([], 10, "", id="nothing"),
    ],
)
def test_bounded_summary(parts: list[str], limit: int, expected: str) -> None:
    assert bounded_summary(parts, limit) == expected
    assert len(bounded_summary(parts, limit)) <= limit


# --- persistence --------------------------------------------------------------------------

PERSISTENCE_OFF = finding("persistence", WARN, "persistence mode off", action="enable_persistence")


@pytest.mark.parametrize(
    ("mode", "installed", "expected"),
    [
        pytest.param(False, False, "enable_persistence", id="off-sets-it"),
        pytest.param(False, True, "report", id="off-with-persistenced-reports"),
        pytest.param(None, False, None, id="not-reported-nothing"),
        pytest.param(True, False, None, id="already-on-nothing"),
    ],
)
def test_persistence(mode: bool | None, installed: bool, expected: str | None) -> None:
    snap = snapshot(PERSISTENCE_OFF, gpus=(gpu(persistence_mode=mode),))
    actions = plan(snap, History(persistenced_installed=installed), 0.0, config())
    assert [a.kind for a in actions] == ([expected] if expected else [])


def test_persistenced_installed_report_says_what_to_do() -> None:
    snap = snapshot(PERSISTENCE_OFF, gpus=(gpu(persistence_mode=False),))
    report = one(plan(snap, History(persistenced_installed=True), 0.0, config()), "report")
    assert report.target == BUS0
    assert report.reason == PERSISTENCED_REPORT
    assert report.reason == (
        "nvidia-persistenced is installed but persistence mode is off: "
        "start nvidia-persistenced rather than setting it by hand"
    )
    assert (report.check, report.severity) == ("persistence", "WARN")


# --- power cap and restore ----------------------------------------------------------------

HOT = finding("thermal", CRITICAL, "GPU at 90 °C, within 5 °C of shutdown", action="check_cooling")


def test_cap_power_params() -> None:
    cap = one(plan(snapshot(HOT), History(), 0.0, config()), "cap_power")
    assert cap.params == (("limit_w", 490.0), ("previous_w", 700.0))
    assert (cap.check, cap.severity, cap.reason) == ("thermal", "CRITICAL", HOT.reason)


@pytest.mark.parametrize(
    ("gpu_state", "history", "fraction", "expected"),
    [
        pytest.param(gpu(), History(), 0.7, (490.0, 700.0), id="default"),
        pytest.param(gpu(), History(), 0.5, (350.0, 700.0), id="custom-fraction"),
        pytest.param(gpu(power_limit_w=600.0), History(), 0.7, (490.0, 600.0), id="admin-limit"),
        pytest.param(gpu(default_w=None), History(), 0.7, None, id="default-limit-unknown"),
        pytest.param(gpu(power_limit_w=None), History(), 0.7, None, id="current-limit-unknown"),
        pytest.param(gpu(power_limit_w=450.0), History(), 0.7, None, id="already-below-cap"),
        pytest.param(gpu(power_limit_w=490.0), History(), 0.7, None, id="already-at-cap"),
        pytest.param(
            gpu(power_limit_w=490.0),
            History(power_capped=((BUS0, 700.0),)),
            0.7,
            None,
            id="already-capped-by-us",
        ),
    ],
)
def test_cap_power_cases(
    gpu_state: GpuState, history: History, fraction: float, expected: tuple[float, float] | None
) -> None:
    section = dataclasses.replace(config(), power=RemediationPower(cap_fraction=fraction))
    actions = plan(snapshot(HOT, gpus=(gpu_state,)), history, 0.0, section)
    caps = [(a.param("limit_w"), a.param("previous_w")) for a in actions if a.kind == "cap_power"]
    assert caps == ([expected] if expected else [])


def test_thermal_warn_caps_when_a_rule_says_warn() -> None:
    rules = [RemediationRule("thermal", ["cap_power"], "WARN")]
    warm = finding("thermal", WARN, "GPU at 84 °C")
    assert keys(plan(snapshot(warm), History(), 0.0, config(rules=rules))) == [CAP0]


def test_cap_power_only_for_thermal_findings() -> None:
    # The cap is undone when thermal is OK again; another check's cap would flap.
    rules = [RemediationRule("ecc", ["cap_power"])]
    dbe = finding("ecc", CRITICAL)
    assert plan(snapshot(dbe), History(), 0.0, config(rules=rules)) == ()


CAPPED = ((BUS0, 700.0),)
THERMAL_OK = finding("thermal", OK, "GPU at 60 °C")


@pytest.mark.parametrize(
    ("findings", "gpu_state", "cool_since", "now", "restored"),
    [
        pytest.param((THERMAL_OK,), gpu(), 100.0, 699.999, False, id="just-before-hold"),
        pytest.param((THERMAL_OK,), gpu(), 100.0, 700.0, True, id="exactly-hold"),
        pytest.param((THERMAL_OK,), gpu(), 100.0, 10_000.0, True, id="long-after"),
        pytest.param((), gpu(), 100.0, 700.0, True, id="thermal-check-off"),
        pytest.param((THERMAL_OK,), gpu(), None, 10_000.0, False, id="no-cool-since"),
        pytest.param((finding("thermal", WARN),), gpu(), 100.0, 10_000.0, False, id="still-warm"),
        pytest.param(
            (finding("thermal", UNKNOWN),),
            gpu(status="lost"),
            100.0,
            10_000.0,
            False,
            id="gpu-lost",
        ),
        pytest.param((THERMAL_OK,), gpu(BUS1, 1), 100.0, 10_000.0, False, id="gpu-gone"),
    ],
)
def test_restore_power_hold(
    findings: tuple[Finding, ...],
    gpu_state: GpuState,
    cool_since: float | None,
    now: float,
    restored: bool,
) -> None:
    history = History(
        power_capped=CAPPED,
        cool_since=((BUS0, cool_since),) if cool_since is not None else (),
    )
    actions = plan(snapshot(*findings, gpus=(gpu_state,)), history, now, config())
    assert keys(actions) == ([f"restore_power:{BUS0}"] if restored else [])
    if restored:
        restore = actions[0]
        assert restore.params == (("limit_w", 700.0),)
        assert (restore.check, restore.severity) == (None, None)


def test_restore_needs_the_capped_gpu() -> None:
    history = History(cool_since=((BUS0, 0.0),))
    assert plan(snapshot(THERMAL_OK), history, 10_000.0, config()) == ()


# --- uncordon -------------------------------------------------------------------------------

HEALTHY = (finding("nvml", OK, "NVML usable", bus=None), finding("ecc", OK, "no errors"))


@pytest.mark.parametrize(
    ("flag", "ours", "since", "now", "findings", "expected"),
    [
        pytest.param(True, True, 0.0, 1800.0, HEALTHY, True, id="exactly-hold"),
        pytest.param(True, True, 0.0, 1799.9, HEALTHY, False, id="just-before-hold"),
        pytest.param(False, True, 0.0, 9999.0, HEALTHY, False, id="flag-off"),
        pytest.param(True, False, 0.0, 9999.0, HEALTHY, False, id="not-ours"),
        pytest.param(True, True, None, 9999.0, HEALTHY, False, id="not-healthy-yet"),
        pytest.param(
            True,
            True,
            0.0,
            9999.0,
            (*HEALTHY, finding("pcie", WARN)),
            False,
            id="snapshot-disagrees",
        ),
    ],
)
def test_uncordon(
    flag: bool,
    ours: bool,
    since: float | None,
    now: float,
    findings: tuple[Finding, ...],
    expected: bool,
) -> None:
    section = config(uncordon_after_recovery=flag)
    history = History(cordoned_by_us=ours, healthy_since=since)
    actions = plan(snapshot(*findings), history, now, section)
    assert keys(actions) == ([f"uncordon:{NODE}"] if expected else [])
    if expected:
        assert (actions[0].check, actions[0].severity) == (None, None)
        assert actions[0].reason == "every finding OK for 1800 s (hold 1800 s)"


# --- order and determinism ------------------------------------------------------------------


def _busy_node() -> tuple[NodeSnapshot, History]:
    gpus = (gpu(BUS2, 2), gpu(BUS0, 0, persistence_mode=False), gpu(BUS1, 1))
    findings = (
        xid(119, bus=BUS1),
        finding("persistence", WARN, action="enable_persistence"),
        finding("thermal", CRITICAL),
        finding("ecc", CRITICAL, action="drain_and_reset"),
        finding("thermal", CRITICAL, bus=BUS1),
        finding("thermal", OK, bus=BUS2),
    )
    history = History(power_capped=((BUS2, 650.0),), cool_since=((BUS2, 0.0),))
    return snapshot(*findings, gpus=gpus), history


def test_order_is_cordon_then_gpus_in_index_order_then_undo() -> None:
    snap, history = _busy_node()
    assert keys(plan(snap, history, 10_000.0, config())) == [
        CORDON,
        f"enable_persistence:{BUS0}",
        CAP0,
        RESET0,
        f"cap_power:{BUS1}",
        f"reset_gpu:{BUS1}",
        f"restore_power:{BUS2}",
    ]


def test_same_inputs_same_plan() -> None:
    snap, history = _busy_node()
    first = plan(snap, history, 10_000.0, config())
    assert plan(snap, history, 10_000.0, config()) == first
    shuffled = dataclasses.replace(snap, gpus=tuple(reversed(snap.gpus)))
    assert keys(plan(shuffled, history, 10_000.0, config())) == keys(first)


# --- custom rules -----------------------------------------------------------------------------

CUSTOM = """
[remediation.cordon]
backends = ["command"]
command = "/usr/local/sbin/drain-node"

[[remediation.rules]]
check = "aer"
actions = ["cordon"]
cordon_reason = "uncorrectable PCIe error"

[[remediation.rules]]
check = "xid"
severity = "WARN"
actions = ["cordon"]
xid_buckets = ["RESTART_BM"]
xids = [31]

[[remediation.rules]]
check = "thermal"
severity = "WARN"
actions = ["cap_power"]

[[remediation.rules]]
check = "pcie"
severity = "WARN"
actions = ["cordon"]
finding_actions = ["reseat_or_replace"]
"""


@pytest.mark.parametrize(
    ("found", "expected"),
    [
        pytest.param(finding("aer", CRITICAL, "fatal AER"), [CORDON], id="aer-cordons"),
        pytest.param(finding("aer", WARN, "corrected rate"), [], id="aer-warn-below"),
        pytest.param(xid(79), [CORDON], id="xid-by-bucket"),
        pytest.param(xid(31), [CORDON], id="xid-by-number"),
        pytest.param(xid(119), [], id="xid-neither"),
        pytest.param(finding("thermal", WARN), [CAP0], id="thermal-warn-caps"),
        pytest.param(
            finding("pcie", WARN, action="reseat_or_replace"), [CORDON], id="by-finding-action"
        ),
        pytest.param(finding("pcie", WARN, action="investigate"), [], id="other-finding-action"),
        pytest.param(
            finding("ecc", CRITICAL, action="drain_and_reset"), [], id="defaults-replaced"
        ),
    ],
)
def test_custom_rules_from_config(found: Finding, expected: list[str]) -> None:
    section = parse_config(CUSTOM).remediation
    assert keys(plan(snapshot(found), History(), 0.0, section)) == expected


def test_custom_cordon_reason_from_config() -> None:
    section = parse_config(CUSTOM).remediation
    actions = plan(snapshot(finding("aer", CRITICAL, "fatal AER")), History(), 0.0, section)
    assert actions[0].reason == f"GPU {BUS0}: uncorrectable PCIe error (aer)"


@pytest.mark.parametrize(
    ("evidence", "matches"),
    [
        pytest.param((("xid", 31), ("catalog_action", "RESTART_APP")), True, id="xid"),
        pytest.param((("xid", 79), ("catalog_action", "RESTART_BM")), True, id="bucket"),
        pytest.param((("xid", 13), ("catalog_action", "RESTART_APP")), False, id="neither"),
        pytest.param((("xid", None), ("catalog_action", None)), False, id="gsp-no-xid"),
        pytest.param((("xid", True),), False, id="bool-is-no-xid"),
        pytest.param((), False, id="no-evidence"),
    ],
)
def test_xid_filters(evidence: tuple[tuple[str, EvidenceValue], ...], matches: bool) -> None:
    rule = RemediationRule("xid", ["cordon"], "WARN", xid_buckets=["RESTART_BM"], xids=[1, 31])
    assert rule_matches(rule, finding("xid", CRITICAL, evidence=evidence)) is matches


# --- real findings from the checks ----------------------------------------------------------


def _xid_event(code: int) -> GpuEvent:
    line = f"NVRM: Xid (PCI:0000:18:00): {code}, pid=2512125, name=python3, Ch 00000008"
    return GpuEvent(f"e{code}", "kmsg", "xid", BUS0, 1_700_000_000.0, 0.0, BUS0, code, line)


@pytest.mark.parametrize(
    ("readings", "status", "events", "expected"),
    [
        pytest.param({"ecc_dbe_volatile": 1}, "ok", (), [CORDON, RESET0], id="dbe"),
        pytest.param({"row_remap_failure": True}, "ok", (), [CORDON], id="row-remap-failure"),
        pytest.param({"row_remap_pending": True}, "ok", (), [CORDON, RESET0], id="remap-pending"),
        pytest.param({"retired_pages_sbe": 70}, "ok", (), [CORDON], id="retired-pages-limit"),
        pytest.param({"temperature_c": 89.0}, "ok", (), [CAP0], id="thermal-critical"),
        pytest.param({"temperature_c": 83.0}, "ok", (), [], id="thermal-warn"),
        pytest.param({"nvlink_up": (True, False)}, "ok", (), [CORDON], id="nvlink-down"),
        pytest.param({}, "lost", (), [CORDON], id="lost"),
        pytest.param({}, "timeout", (), [], id="timeout-unknown"),
        pytest.param({}, "ok", (_xid_event(119),), [CORDON, RESET0], id="xid-119"),
        pytest.param({}, "ok", (_xid_event(79),), [CORDON], id="xid-79"),
        # XID 64 (a row remap failed) asks for a reset; with no spare rows it cannot help.
        pytest.param({}, "ok", (_xid_event(64),), [CORDON, RESET0], id="xid-64"),
        pytest.param(
            {"row_remap_failure": True},
            "ok",
            (_xid_event(64),),
            [CORDON],
            id="xid-64-with-row-remap-failure-no-reset",
        ),
        pytest.param({}, "lost", (_xid_event(119),), [CORDON], id="xid-119-on-lost-gpu"),
        pytest.param({}, "ok", (_xid_event(31),), [], id="xid-31-app"),
        pytest.param({}, "ok", (), [], id="healthy"),
    ],
)
def test_plans_for_real_findings(
    readings: dict[str, Any], status: GpuStatus, events: tuple[GpuEvent, ...], expected: list[str]
) -> None:
    state = gpu(status=status, **readings)
    health, _ = evaluate((state,), NVML_OK, ChecksSection(), HealthMemory(), 0.0, events=events)
    snap = dataclasses.replace(snapshot(gpus=(state,)), health=health)
    assert keys(plan(snap, History(), 0.0, config())) == expected
    assert node_is_healthy(snap) is (status == "ok" and not readings and not events)


def test_persistence_off_without_an_expectation_is_healthy_and_left_alone() -> None:
    state = gpu(persistence_mode=False)
    health, _ = evaluate((state,), NVML_OK, ChecksSection(), HealthMemory(), 0.0)
    snap = dataclasses.replace(snapshot(gpus=(state,)), health=health)
    assert keys(plan(snap, History(), 0.0, config())) == []
    assert node_is_healthy(snap)


# --- the executor's helpers -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("snap", "healthy"),
    [
        pytest.param(snapshot(*HEALTHY), True, id="all-ok"),
        pytest.param(snapshot(), False, id="nothing-checked-yet"),
        pytest.param(snapshot(*HEALTHY, finding("pcie", WARN)), False, id="a-warning"),
        pytest.param(snapshot(*HEALTHY, finding("thermal", UNKNOWN)), False, id="unknown"),
        pytest.param(snapshot(*HEALTHY, gpus=(gpu(status="lost"),)), False, id="gpu-lost"),
        pytest.param(
            dataclasses.replace(snapshot(*HEALTHY), nvml=NvmlStatus(ok=False)),
            False,
            id="nvml-down",
        ),
    ],
)
def test_node_is_healthy(snap: NodeSnapshot, healthy: bool) -> None:
    assert node_is_healthy(snap) is healthy


@pytest.mark.parametrize(
    ("snap", "bus", "cool"),
    [
        pytest.param(snapshot(THERMAL_OK), BUS0, True, id="ok"),
        pytest.param(snapshot(), BUS0, True, id="check-off"),
        pytest.param(snapshot(finding("ecc", CRITICAL)), BUS0, True, id="other-check-bad"),
        pytest.param(snapshot(finding("thermal", WARN)), BUS0, False, id="warm"),
        pytest.param(snapshot(finding("thermal", OK, bus=BUS1)), BUS1, False, id="unknown-gpu"),
        pytest.param(snapshot(gpus=(gpu(status="timeout"),)), BUS0, False, id="not-answering"),
    ],
)
def test_thermal_ok(snap: NodeSnapshot, bus: str, cool: bool) -> None:
    assert thermal_ok(snap, bus) is cool


# --- properties -------------------------------------------------------------------------------

BUSES = (BUS0, BUS1, BUS2)
CHECKS = (
    *("availability", "bus", "xid", "ecc", "retired_pages", "row_remap", "thermal"),
    *("persistence", "nvlink", "pcie", "sxid"),
)
ANY_FLOAT = st.floats(allow_nan=True, allow_infinity=True)
MAYBE_FLOAT = st.none() | ANY_FLOAT
KIND_ORDER = (
    *("cordon", "enable_persistence", "report", "cap_power", "reset_gpu"),
    *("restore_power", "uncordon"),
)

gpus_strategy = st.lists(
    st.builds(
        lambda bus, index, status, default, limit, mode: gpu(
            bus, index, status, default_w=default, power_limit_w=limit, persistence_mode=mode
        ),
        st.sampled_from(BUSES),
        st.integers(0, 3),
        st.sampled_from(["ok", "lost", "timeout", "error"]),
        MAYBE_FLOAT,
        MAYBE_FLOAT,
        st.none() | st.booleans(),
    ),
    max_size=4,
).map(tuple)
findings_strategy = st.lists(
    st.builds(
        lambda check, severity, bus, action, code, bucket, reason: finding(
            check,
            severity,
            reason,
            bus=bus,
            action=action,
            evidence=(("xid", code), ("catalog_action", bucket)),
        ),
        st.sampled_from(CHECKS),
        st.sampled_from(list(Severity)),
        st.none() | st.sampled_from(BUSES),
        st.sampled_from(["none", "reset_gpu", "drain_and_reboot", "contact_support"]),
        st.none() | st.booleans() | st.integers(0, 200),
        st.none() | st.sampled_from(["RESET_GPU", "RESTART_BM", "RESTART_APP"]),
        st.text(max_size=120),
    ),
    max_size=12,
).map(tuple)
rules_strategy = st.lists(
    st.builds(
        RemediationRule,
        st.sampled_from(CHECKS),
        st.lists(st.sampled_from(["enable_persistence", "cordon", "reset_gpu", "cap_power"])),
        st.sampled_from(["WARN", "CRITICAL"]),
        st.lists(st.sampled_from(["RESET_GPU", "RESTART_BM"]), max_size=2),
        st.lists(st.integers(0, 200), max_size=3),
        st.text(max_size=40),
    ),
    max_size=6,
).map(lambda extra: _default_rules() + extra)
history_strategy = st.builds(
    History,
    st.booleans(),
    st.lists(st.tuples(st.sampled_from(BUSES), ANY_FLOAT), max_size=4).map(tuple),
    st.lists(st.tuples(st.sampled_from(BUSES), ANY_FLOAT), max_size=4).map(tuple),
    st.none() | ANY_FLOAT,
    st.lists(st.sampled_from(BUSES), max_size=3).map(tuple),
    st.booleans(),
)


@settings(max_examples=300, deadline=None)
@given(
    gpus=gpus_strategy,
    findings=findings_strategy,
    rules=rules_strategy,
    history=history_strategy,
    now=ANY_FLOAT,
    backends=st.sampled_from([(), ("slurm",)]),
    uncordon=st.booleans(),
    fraction=ANY_FLOAT,
)
def test_plan_never_raises_and_keys_are_unique(
    gpus: tuple[GpuState, ...],
    findings: tuple[Finding, ...],
    rules: list[RemediationRule],
    history: History,
    now: float,
    backends: tuple[Backend, ...],
    uncordon: bool,
    fraction: float,
) -> None:
    section = dataclasses.replace(
        config(backends=backends, rules=rules, uncordon_after_recovery=uncordon),
        power=RemediationPower(cap_fraction=fraction),
    )
    actions = plan(snapshot(*findings, gpus=gpus), history, now, section)
    assert len(keys(actions)) == len(set(keys(actions)))
    kinds = [a.kind for a in actions]
    assert not ("cordon" in kinds and "uncordon" in kinds)
    assert kinds[: kinds.count("cordon")] == ["cordon"] * kinds.count("cordon")
    assert kinds[len(kinds) - kinds.count("uncordon") :] == ["uncordon"] * kinds.count("uncordon")
    for action in actions:
        assert action.kind in KIND_ORDER
        if action.kind == "cordon":
            assert len(action.reason) <= MAX_CORDON_REASON
            assert "\n" not in action.reason
        if action.kind == "reset_gpu":
            assert action.target not in history.escalated
        if action.kind in ("reset_gpu", "cap_power", "enable_persistence", "report"):
            assert any(g.identity.pci_bus_id == action.target and g.status == "ok" for g in gpus)
        if action.kind == "cap_power":
            limit, previous = action.param("limit_w"), action.param("previous_w")
            assert isinstance(limit, float)
            assert isinstance(previous, float)
            assert 0 < limit < previous


def test_rules_can_name_every_action_a_finding_recommends() -> None:
    assert set(typing.get_args(FindingAction)) == {action.value for action in Action}
