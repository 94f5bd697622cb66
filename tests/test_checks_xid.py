"""xid: XIDs judged by the catalog's action buckets, decoded workflows, app-error rates."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from gpuagent.checks.xid import judge, policy
from gpuagent.config import XidCheck, XidRepeat
from gpuagent.model import Finding, GpuEvent, Severity
from test_checks_support import (
    BOOT_WALL,
    BUS,
    OTHER_BUS,
    SWITCH_DOWN,
    check_events,
    event,
    finding,
    gpu,
    identity,
    kernel_event,
    run,
    with_checks,
)

# Real kernel lines (tests/data/kmsg_corpus.tsv). The line's own bus id does not matter
# here: the tests say which GPU each event names.
XID_13 = (
    "[Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', "
    "name=<unknown>, Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): "
    "Illegal Instruction Parameter"
)
XID_31 = (
    "[Mon Aug  5 03:54:13 2024] NVRM: Xid (PCI:0000:00:07): 31, pid=2512125, name=python3.10, "
    "Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_8 faulted @ "
    "0x73ac_1c000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_WRITE"
)
XID_8 = "NVRM: Xid (0000:01:00): 8, Channel 00000000"
XID_43 = "NVRM: Xid (PCI:0000:01:00): 43, pid=1814139, name=cuda_assert_64b, Ch 00000018"
XID_45 = (
    "Oct 03 17:59:47 mnemosyne kernel: NVRM: Xid (PCI:0000:01:00): 45, pid=2171, "
    "name=xdg-desktop-por, channel 0x0000000a"
)
XID_45_BY_149 = (
    "kernel: NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, "
    "Ch 00000001 caused by previous Xid 149"
)
XID_48 = (
    "Dec  2 11:38:47 worker4 kernel: [  219.470994] NVRM: Xid (PCI:0000:07:00): 48, "
    "pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has been "
    "detected on GPU in the framebuffer at physAddr 0x7fffa8860 partition 7, subpartition 1."
)
XID_62 = (
    "Dec 23 23:32:27 rescue kernel: [ 270.439207] NVRM: Xid (PCI:0000:01:00): 62, "
    "0096(1c54) 00000000 00000000"
)
XID_64 = (
    "NVRM: Xid (PCI:0000:0f:00): 64, pid=57530, Row Remapper Error: (0x00000005d28c03a0) "
    "- All reserved rows for bank are remapped"
)
XID_79 = "[  239.061387] NVRM: Xid (PCI:0000:06:00): 79, GPU has fallen off the bus."
XID_109 = (
    "[Fri Aug 30 11:43:14 2024] NVRM: Xid (PCI:0000:cb:00): 109, pid=1797828, "
    "name=pt_main_thread, Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005"
)
XID_119 = (
    "[Sun Feb 23 16:24:18 2025] NVRM: Xid (PCI:0000:9b:00): 119, pid=2024380, name=nvidia-smi, "
    "Timeout after 6s of waiting for RPC response from GPU4 GSP! Expected function 103 "
    "(GSP_RM_ALLOC) (0x2081 0x4)."
)
XID_145_NONFATAL = (
    "NVRM: Xid (PCI:0018:01:00): 145, pid=876767, name=ray::WorkerDict, RLW_RXPIPE Nonfatal "
    "XC0 i0 Link 13 (0x0409a0c2 0x00000008 0x00000001 0x00000000 0x00100000 0x00000004)"
)
XID_149_FATAL = (
    "[171167.620236] NVRM: Xid (PCI:0009:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 01 "
    "(0x021425c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)"
)
XID_149_BER = (
    "NVRM: Xid (PCI:0018:01:00): 149, NETIR_BER_EVENT Nonfatal XC0 i0 Link 03 "
    "(0x00086226 0x00000001 0x00000000 0x00000000 0x00000000 0x00000000)"
)
XID_154_DRAIN = (
    "[171167.621162] NVRM: Xid (PCI:0009:01:00): 154, GPU recovery action changed from "
    "0x0 (None) to 0x4 (Drain and Reset)"
)
XID_154_RESET = (
    "[171167.897562] NVRM: Xid (PCI:0019:01:00): 154, GPU recovery action changed from "
    "0x4 (Drain and Reset) to 0x1 (GPU Reset Required)"
)
XID_154_FLR = (
    "NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (PF FLR)"
)
GSP_RATE_LIMIT = (
    "[Sun Feb 23 16:24:36 2025] NVRM: Rate limiting GSP RPC error prints for GPU at "
    "PCI:0000:9b:00 (printing 1 of every 30).  The GPU likely needs to be reset."
)


def xid_line(code: int, rest: str) -> str:
    """An XID line in the driver's format, for cases no collected line shows."""
    return f"NVRM: Xid (PCI:0000:18:00): {code}, {rest}"


def xid(line: str, *, at: float = 0.0, gpu: str | None = BUS) -> GpuEvent:
    found = kernel_event(line, gpu=gpu, at=at)
    assert found.kind == "xid"
    return found


def check(*events: GpuEvent, now: float = 0.0, **config: Any) -> Finding:
    return check_events("xid", *events, now=now, config=with_checks(xid=XidCheck(**config)))


@pytest.mark.parametrize(
    ("line", "severity", "action", "runbook", "reason"),
    [
        pytest.param(
            XID_13,
            Severity.WARN,
            "restart_app",
            "gpu-xid-app-error",
            "application error Xid 13 (ROBUST_CHANNEL_GR_EXCEPTION / "
            "ROBUST_CHANNEL_GR_ERROR_SW_NOTIFY) in an unknown process",
            id="13-app-error-unknown-process",
        ),
        pytest.param(
            XID_31,
            Severity.WARN,
            "restart_app",
            "gpu-xid-app-error",
            "application error Xid 31 (ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT) "
            "in python3.10 (pid 2512125)",
            id="31-app-error-names-the-process",
        ),
        pytest.param(
            XID_8,
            Severity.WARN,
            "restart_app",
            "gpu-xid-app-error",
            "application error Xid 8 (ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT) "
            "in an unknown process",
            id="8-restart-app-bucket",
        ),
        pytest.param(
            XID_43,
            Severity.WARN,
            "restart_app",
            "gpu-xid-app-error",
            "application error Xid 43 (ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR) "
            "in cuda_assert_64b (pid 1814139)",
            id="43-ignore-bucket-but-app-error",
        ),
        pytest.param(
            XID_45,
            Severity.WARN,
            "restart_fabric_manager",
            "gpu-xid-solo-teardown",
            "Xid 45 (ROBUST_CHANNEL_PREEMPTIVE_REMOVAL) in xdg-desktop-por (pid 2171): "
            "channels removed with no other XID",
            id="45-solo-restart-fabric-manager",
        ),
        pytest.param(
            XID_45_BY_149,
            Severity.WARN,
            "investigate",
            "gpu-xid-consequence",
            "Xid 45 (ROBUST_CHANNEL_PREEMPTIVE_REMOVAL) caused by Xid 149: "
            "consequence of a fault elsewhere",
            id="45-root-not-on-this-gpu-is-a-consequence",
        ),
        pytest.param(
            XID_48,
            Severity.CRITICAL,
            "drain_and_reset",
            "gpu-ecc-dbe",
            "Xid 48 (ROBUST_CHANNEL_GPU_ECC_DBE): "
            "uncorrectable ECC error, drain and reset required",
            id="48-dbe",
        ),
        pytest.param(
            XID_62,
            Severity.CRITICAL,
            "reset_gpu",
            "gpu-xid-reset-required",
            "Xid 62 (PMU_HALT_ERROR): reset required",
            id="62-reset",
        ),
        pytest.param(
            XID_64,
            Severity.CRITICAL,
            "reset_gpu",
            "gpu-xid-reset-required",
            "Xid 64 (INFOROM_DRAM_RETIREMENT_FAILURE): reset required",
            id="64-reset",
        ),
        pytest.param(
            XID_79,
            Severity.CRITICAL,
            "drain_and_reboot",
            "gpu-xid-reboot-required",
            "Xid 79 (ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS): reboot required",
            id="79-reboot",
        ),
        pytest.param(
            XID_109,
            Severity.CRITICAL,
            "reset_gpu",
            "gpu-xid-reset-required",
            "Xid 109 (ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR): reset required",
            id="109-reset-outranks-app-error",
        ),
        pytest.param(
            XID_119,
            Severity.CRITICAL,
            "reset_gpu",
            "gpu-xid-reset-required",
            "Xid 119 (GSP_RPC_TIMEOUT): reset required",
            id="119-gsp-timeout",
        ),
        pytest.param(
            XID_145_NONFATAL,
            Severity.WARN,
            "investigate",
            "gpu-xid-nvlink-nonfatal",
            "Xid 145 (NVLINK_RLW_ERROR) non-fatal: non-fatal NVLink error",
            id="145-nvlink5-nonfatal",
        ),
        pytest.param(
            XID_149_FATAL,
            Severity.CRITICAL,
            "reset_gpu",
            "gpu-xid-reset-required",
            "Xid 149 (NVLINK_NETIR_ERROR) fatal: reset required",
            id="149-nvlink5-fatal",
        ),
        pytest.param(
            XID_149_BER,
            Severity.WARN,
            "investigate",
            "gpu-xid-nvlink-nonfatal",
            "Xid 149 (NVLINK_NETIR_ERROR) non-fatal: non-fatal NVLink error",
            id="149-bit-error-rate-event",
        ),
        pytest.param(
            XID_154_DRAIN,
            Severity.CRITICAL,
            "drain_and_reset",
            "gpu-xid-reset-required",
            "Xid 154 (GPU_RECOVERY_ACTION_CHANGED) recovery action 0x4 (Drain and Reset): "
            "drain and reset required",
            id="154-drain-and-reset",
        ),
        pytest.param(
            XID_154_RESET,
            Severity.CRITICAL,
            "reset_gpu",
            "gpu-xid-reset-required",
            "Xid 154 (GPU_RECOVERY_ACTION_CHANGED) recovery action 0x1 (GPU Reset Required): "
            "reset required",
            id="154-gpu-reset",
        ),
        pytest.param(
            XID_154_FLR,
            Severity.CRITICAL,
            "reset_gpu",
            "gpu-xid-reset-required",
            "Xid 154 (GPU_RECOVERY_ACTION_CHANGED) recovery action 0x1 (PF FLR): reset required",
            id="154-newer-drivers-name-the-reset-pf-flr",
        ),
    ],
)
def test_real_lines(line: str, severity: Severity, action: str, runbook: str, reason: str) -> None:
    found = check_events("xid", xid(line))
    assert (found.severity, found.action, found.runbook, found.reason) == (
        severity,
        action,
        runbook,
        reason,
    )


@pytest.mark.parametrize(
    ("code", "rest", "severity", "action"),
    [
        pytest.param(
            154,
            "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",
            Severity.CRITICAL,
            "drain_and_reboot",
            id="154-node-reboot",
        ),
        pytest.param(
            154,
            "GPU recovery action changed from 0x0 (None) to 0x3 (Drain P2P)",
            Severity.CRITICAL,
            "drain_and_reset",
            id="154-drain-p2p-is-covered-by-draining",
        ),
        pytest.param(
            154,
            "GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)",
            Severity.OK,
            "none",
            id="154-none",
        ),
        pytest.param(
            154,
            "GPU recovery action changed from 0x0 (None) to 0x9 (Something New)",
            Severity.CRITICAL,
            "contact_support",
            id="154-unknown-action",
        ),
        pytest.param(
            154, "GPU recovery action", Severity.CRITICAL, "contact_support", id="154-unreadable"
        ),
        pytest.param(
            45,
            "pid=1818990, name=python3, Ch 00000001 caused by previous Xid 119",
            Severity.WARN,
            "investigate",
            id="45-after-a-reset-root-is-its-consequence",
        ),
        pytest.param(
            45,
            "pid=1818990, name=python3, Ch 00000001 caused by previous Xid 13",
            Severity.WARN,
            "restart_app",
            id="45-after-an-app-error-is-that-crash",
        ),
        pytest.param(
            45,
            "pid=1818990, name=python3, Ch 00000001 caused by previous Xid 63",
            Severity.OK,
            "none",
            id="45-judged-by-an-ignored-root",
        ),
        pytest.param(
            45,
            "pid=1818990, name=python3, Ch 00000001 caused by previous Xid 45",
            Severity.WARN,
            "restart_fabric_manager",
            id="45-naming-itself-is-alone",
        ),
        pytest.param(
            149,
            "NETIR_MFDE_EVENT XC0 i0 Link 03 (0x1)",
            Severity.CRITICAL,
            "contact_support",
            id="nvlink5-without-fatality",
        ),
        pytest.param(
            74,
            "Link 0 (0x1 0x2)",
            Severity.CRITICAL,
            "contact_support",
            id="74-nvlink-register-workflow",
        ),
        pytest.param(54, "Power", Severity.WARN, "check_power", id="54-check-mechanicals"),
        pytest.param(63, "Row Remapper: New row marked", Severity.OK, "none", id="63-ignore"),
        pytest.param(
            151,
            "Key rotation",
            Severity.CRITICAL,
            "drain_and_reboot",
            id="151-restart-vm-is-a-reboot",
        ),
        pytest.param(159, "CHI", Severity.CRITICAL, "contact_support", id="159-check-uvm"),
        pytest.param(171, "DRAM", Severity.CRITICAL, "contact_support", id="171-no-bucket-yet"),
        pytest.param(999, "from the future", Severity.WARN, "investigate", id="unknown"),
    ],
)
def test_decoded_and_other_buckets(code: int, rest: str, severity: Severity, action: str) -> None:
    found = check_events("xid", xid(xid_line(code, rest)))
    assert (found.severity, found.action) == (severity, action)


def test_unknown_xid_is_named_and_never_dropped() -> None:
    found = check_events("xid", xid(xid_line(999, "pid=1, name=x, something")))
    assert found.reason == "unknown XID 999"
    assert (found.runbook, found.evidence_dict()["xid"]) == ("gpu-xid-unknown", 999)
    no_number = check_events("xid", event("xid", "NVRM: Xid from NVML", code=None))
    assert (no_number.severity, no_number.reason) == (Severity.WARN, "unknown XID (no number)")


def test_evidence_keeps_the_line_time_and_catalog_facts() -> None:
    first, last = xid(XID_119, at=10.0), xid(XID_119.replace("6s", "45s"), at=20.0)
    found = check_events("xid", first, last, now=30.0)
    assert found.reason == "Xid 119 (GSP_RPC_TIMEOUT): reset required (2 times)"
    evidence = found.evidence_dict()
    assert evidence["line"] == last.line
    assert evidence["time"] == BOOT_WALL + 20.0
    assert (evidence["xid"], evidence["mnemonic"], evidence["catalog_action"]) == (
        119,
        "GSP_RPC_TIMEOUT",
        "RESET_GPU",
    )
    assert (evidence["count"], evidence["xid_events"]) == (2, 2)
    assert (evidence["pid"], evidence["process"]) == (2024380, "nvidia-smi")


def test_ignored_xid_is_ok_but_kept_in_evidence() -> None:
    found = check_events("xid", xid(xid_line(63, "Row Remapper: New row marked for remapping")))
    assert (found.severity, found.reason) == (Severity.OK, "1 XID seen, none needing action")
    assert (found.evidence_dict()["xid"], found.evidence_dict()["catalog_action"]) == (63, "IGNORE")


def test_no_xids() -> None:
    found = check_events("xid")
    assert (found.severity, found.reason) == (Severity.OK, "no XIDs")
    assert found.evidence_dict()["line"] is None


def test_reset_and_reboot_findings_stay_while_the_event_is_retained() -> None:
    day_later = 86_000.0
    assert check_events("xid", xid(XID_119), now=day_later).severity is Severity.CRITICAL
    assert check_events("xid", xid(XID_79), now=day_later).severity is Severity.CRITICAL


def test_worst_problem_leads_and_every_problem_is_listed() -> None:
    events = (xid(XID_119, at=1.0), xid(XID_31, at=2.0), xid(XID_79, at=3.0))
    found = check_events("xid", *events, now=10.0)
    assert found.reason == (
        "Xid 79 (ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS): reboot required; "
        "Xid 119 (GSP_RPC_TIMEOUT): reset required; "
        "application error Xid 31 (ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT) "
        "in python3.10 (pid 2512125)"
    )
    assert (found.action, found.evidence_dict()["xid"]) == ("drain_and_reboot", 79)


def test_among_equals_the_newest_leads() -> None:
    found = check_events("xid", xid(XID_62, at=1.0), xid(XID_119, at=2.0), now=5.0)
    assert found.reason.startswith("Xid 119")
    assert found.evidence_dict()["xid"] == 119


def test_only_the_newest_recovery_action_counts() -> None:
    back_to_none = xid_line(
        154, "GPU recovery action changed from 0x4 (Drain and Reset) to 0x0 (None)"
    )
    recovered = check_events("xid", xid(XID_154_DRAIN, at=1.0), xid(back_to_none, at=2.0))
    assert recovered.severity is Severity.OK
    assert recovered.evidence_dict()["recovery_action"] == "0x0 (None)"
    escalated = check_events("xid", xid(XID_154_DRAIN, at=1.0), xid(XID_154_RESET, at=2.0))
    assert escalated.reason.endswith("recovery action 0x1 (GPU Reset Required): reset required")


def test_an_xid_reporting_a_conditions_end_clears_its_start() -> None:
    # The catalog's power-smoothing pair: 163 "capability disengaged", 162 "reengaged".
    disengaged = xid_line(163, "Power Smoothing HW Circuitry capability disengaged")
    reengaged = xid_line(162, "Power Smoothing HW Circuitry capability reengaged")
    assert check_events("xid", xid(disengaged, at=1.0), now=5.0).severity is Severity.CRITICAL
    ended = check_events("xid", xid(disengaged, at=1.0), xid(reengaged, at=2.0), now=5.0)
    assert (ended.severity, ended.reason) == (Severity.OK, "2 XIDs seen, none needing action")
    alone = check_events("xid", xid(reengaged, at=1.0), now=5.0)
    assert alone.severity is Severity.OK
    again = check_events("xid", xid(reengaged, at=1.0), xid(disengaged, at=2.0), now=5.0)
    assert again.severity is Severity.CRITICAL
    assert again.reason.startswith("Xid 163 (PSHC_DISENGAGED)")


def test_root_xid_is_in_evidence() -> None:
    found = check_events("xid", xid(XID_45_BY_149))
    assert (found.evidence_dict()["xid"], found.evidence_dict()["root_xid"]) == (45, 149)


# --- causality: consequences join their root ---------------------------------------------

ROOT_149 = xid_line(149, "pid=1818990, name=python3, NETIR_LINK_EVT Fatal XC0 i0 Link 03")


def _teardowns(count: int, *, root: int = 149, start: float = 1.0) -> list[GpuEvent]:
    """``count`` channel teardowns naming ``root``, one per channel of the job's processes."""
    rest = "pid={pid}, name=python3, Ch {ch:08x} caused by previous Xid {root}"
    return [
        xid(xid_line(45, rest.format(pid=1000 + n % 4, ch=n, root=root)), at=start + n * 0.01)
        for n in range(count)
    ]


def test_the_failed_gpu_keeps_its_own_verdict_with_its_consequences_counted() -> None:
    found = check_events("xid", xid(ROOT_149, at=0.5), *_teardowns(300), now=10.0)
    assert (found.severity, found.action) == (Severity.CRITICAL, "reset_gpu")
    assert found.reason == (
        "Xid 149 (NVLINK_NETIR_ERROR) fatal: reset required, and 300 channel teardowns after it"
    )
    evidence = found.evidence_dict()
    assert (evidence["xid"], evidence["consequences"], evidence["root_xid"]) == (149, 300, None)


def test_consequences_arriving_before_their_root_still_join_it() -> None:
    # The NVML event for the root can be read after the kernel's teardown lines.
    found = check_events("xid", *_teardowns(5), xid(ROOT_149, at=2.0), now=10.0)
    assert found.severity is Severity.CRITICAL
    assert found.evidence_dict()["consequences"] == 5


@pytest.mark.parametrize("count", [1, 10_000])
def test_a_root_this_gpu_did_not_log_is_a_warning_at_most(count: int) -> None:
    found = check_events("xid", *_teardowns(count), now=60.0)
    assert (found.severity, found.action, found.runbook) == (
        Severity.WARN,
        "investigate",
        "gpu-xid-consequence",
    )
    times_seen = f" ({count} times)" if count > 1 else ""
    assert found.reason == (
        "Xid 45 (ROBUST_CHANNEL_PREEMPTIVE_REMOVAL) caused by Xid 149: "
        f"consequence of a fault elsewhere{times_seen}"
    )
    assert found.evidence_dict()["root_xid"] == 149


def test_a_consequence_of_a_fault_elsewhere_fades_like_an_app_error() -> None:
    events = _teardowns(3)
    assert check(*events, now=59.0, app_error_hold_seconds=60.0).severity is Severity.WARN
    assert check(*events, now=120.0, app_error_hold_seconds=60.0).severity is Severity.OK


def test_a_root_on_another_gpu_of_the_node_does_not_make_this_one_critical() -> None:
    events = [xid(ROOT_149, at=0.5, gpu=OTHER_BUS), *_teardowns(50)]
    assert check_events("xid", *events, now=10.0).severity is Severity.WARN


@pytest.mark.parametrize(
    ("after", "severity", "lead"),
    [
        pytest.param(5.0, Severity.CRITICAL, "Xid 119", id="within-60-s-part-of-the-fault"),
        pytest.param(61.0, Severity.CRITICAL, "Xid 119", id="later-still-critical-by-the-root"),
    ],
)
def test_unnamed_teardowns_right_after_a_fault_are_its_consequence(
    after: float, severity: Severity, lead: str
) -> None:
    teardown = xid(xid_line(43, "pid=7, name=train, Ch 00000002"), at=1.0 + after)
    found = check_events("xid", xid(XID_119, at=1.0), teardown, now=1.0 + after)
    assert found.severity is severity
    assert found.reason.startswith(lead)
    followed = "1 channel teardown after it" in found.reason
    assert followed is (after <= 60.0)
    # Later than that, the teardown is an application error of its own, listed too.
    assert ("application error Xid 43" in found.reason) is (after > 60.0)


def test_a_solo_xid_45_asks_for_a_fabric_manager_restart_but_one_after_a_crash_does_not() -> None:
    solo = check_events("xid", xid(xid_line(45, "pid=7, name=train, Ch 1")), now=1.0)
    assert (solo.severity, solo.action) == (Severity.WARN, "restart_fabric_manager")
    crash = [
        xid(xid_line(13, "pid=7, name=train, Graphics Exception"), at=0.0),
        xid(xid_line(45, "pid=7, name=train, Ch 1"), at=0.5),
    ]
    found = check_events("xid", *crash, now=1.0)
    assert (found.severity, found.action) == (Severity.WARN, "restart_app")


# --- the same XID repeating --------------------------------------------------------------


@pytest.mark.parametrize(("times", "severity"), [(4, Severity.WARN), (5, Severity.CRITICAL)])
def test_a_warning_xid_repeating_on_a_gpu_escalates(times: int, severity: Severity) -> None:
    events = [xid(XID_145_NONFATAL, at=n * 600.0) for n in range(times)]
    found = check_events("xid", *events, now=times * 600.0)
    assert found.severity is severity
    if severity is Severity.CRITICAL:
        assert found.reason.startswith(
            "Xid 145 (NVLINK_RLW_ERROR) 5 times in the last 3600 s, at or above 5: repeating"
        )
        assert (found.action, found.runbook) == ("investigate", "gpu-xid-repeating")


def test_repeats_count_within_the_window_only() -> None:
    events = [xid(XID_145_NONFATAL, at=n * 900.0) for n in range(5)]
    assert check_events("xid", *events, now=3600.0).severity is Severity.CRITICAL
    assert check_events("xid", *events, now=3601.0).severity is Severity.WARN


def test_per_xid_repeat_limits_and_window_are_configurable() -> None:
    events = [xid(XID_145_NONFATAL, at=float(n)) for n in range(5)]
    relaxed = check(*events, now=5.0, repeat=[XidRepeat(xid=145, count=20)])
    assert relaxed.severity is Severity.WARN
    assert check(*events, now=5.0, repeat_window_seconds=2.0).severity is Severity.WARN


def test_application_xids_and_teardowns_never_escalate_by_repeating() -> None:
    crashes = [xid(xid_line(31, "pid=7, name=train, MMU Fault"), at=float(n)) for n in range(50)]
    assert check_events("xid", *crashes, now=60.0).severity is Severity.WARN
    assert check_events("xid", *_teardowns(50), now=60.0).severity is Severity.WARN


# --- application errors ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("now", "severity"),
    [
        pytest.param(0.0, Severity.WARN, id="fresh"),
        pytest.param(3599.0, Severity.WARN, id="inside-the-hold"),
        pytest.param(3600.0, Severity.OK, id="hold-over"),
        pytest.param(86_000.0, Severity.OK, id="long-gone"),
    ],
)
def test_app_error_fades_after_the_hold(now: float, severity: Severity) -> None:
    assert check_events("xid", xid(XID_31), now=now).severity is severity


def test_app_error_hold_is_configurable() -> None:
    assert check(xid(XID_31), now=61.0, app_error_hold_seconds=60.0).severity is Severity.OK
    assert check(xid(XID_31), now=59.0, app_error_hold_seconds=60.0).severity is Severity.WARN


def _crashes(count: int, *, every: float, start: float = 0.0) -> list[GpuEvent]:
    """``count`` crashes of different processes, each an XID 13 and its Xid 45."""
    events = []
    for n in range(count):
        at, pid = start + n * every, 1000 + n
        events.append(xid(xid_line(13, f"pid={pid}, name=train, Graphics Exception"), at=at))
        events.append(xid(xid_line(45, f"pid={pid}, name=train, channel 0x0a"), at=at + 0.5))
    return events


@pytest.mark.parametrize(
    ("crashes", "severity"),
    [
        pytest.param(6, Severity.WARN, id="at-the-limit"),
        pytest.param(7, Severity.CRITICAL, id="above-the-limit"),
    ],
)
def test_app_error_rate(crashes: int, severity: Severity) -> None:
    found = check_events("xid", *_crashes(crashes, every=300.0), now=3000.0)
    assert found.severity is severity
    assert found.evidence_dict()["app_error_incidents_last_hour"] == crashes
    if severity is Severity.CRITICAL:
        assert found.reason.startswith("7 application XID incidents in the last hour, above 6; ")
        assert (found.action, found.runbook) == ("investigate", "gpu-xid-app-error-rate")


def test_app_error_rate_counts_the_last_hour_only() -> None:
    # Ten crashes five minutes apart; an hour and 58 minutes after the first, only the
    # newest is within the hour.
    found = check_events("xid", *_crashes(10, every=300.0), now=6200.0)
    assert found.evidence_dict()["app_error_incidents_last_hour"] == 1
    assert found.severity is Severity.WARN


def test_lines_of_one_crash_are_one_incident() -> None:
    # One process, its warp exceptions on many SMs and a channel teardown each: one crash.
    storm = [
        xid(xid_line(13, f"pid=77, name=train, Graphics SM Warp Exception on (SM {n})"), at=n * 0.1)
        for n in range(40)
    ]
    found = check_events("xid", *storm, xid(xid_line(45, "pid=77, name=train, ch 1"), at=5.0))
    assert found.severity is Severity.WARN
    assert found.evidence_dict()["app_error_incidents_last_hour"] == 1


def test_app_error_rate_is_configurable() -> None:
    events = _crashes(2, every=60.0)
    assert check(*events, now=200.0, app_error_rate_per_hour=1.0).severity is Severity.CRITICAL
    assert check(*events, now=200.0, app_error_rate_per_hour=2.0).severity is Severity.WARN


# --- GSP messages ----------------------------------------------------------------------------


def gsp(at: float, gpu: str | None = BUS) -> GpuEvent:
    found = kernel_event(GSP_RATE_LIMIT, gpu=gpu, at=at)
    assert found.kind == "gsp"
    return found


def test_gsp_messages_that_follow_an_xid_are_its_details() -> None:
    found = check_events("xid", xid(XID_119, at=100.0), gsp(118.0), now=200.0)
    assert found.reason == "Xid 119 (GSP_RPC_TIMEOUT): reset required"
    assert found.evidence_dict()["gsp_messages_last_hour"] == 0


def test_gsp_messages_without_an_xid_warn_for_an_hour() -> None:
    found = check_events("xid", gsp(100.0), gsp(200.0), now=300.0)
    assert (found.severity, found.reason) == (
        Severity.WARN,
        "2 GSP error messages in the last hour without an XID",
    )
    assert (found.action, found.runbook) == ("investigate", "gpu-gsp-error")
    assert found.evidence_dict()["line"] == GSP_RATE_LIMIT
    assert check_events("xid", gsp(100.0), now=3701.0).severity is Severity.OK


def test_events_of_other_devices_do_not_count() -> None:
    others = (xid(XID_79, gpu=OTHER_BUS), xid(XID_79, gpu=SWITCH_DOWN), xid(XID_79, gpu=None))
    assert check_events("xid", *others).severity is Severity.OK


def test_xid_from_nvml_is_judged_like_the_kernel_line() -> None:
    from_nvml = event("xid", "Xid 119 reported by NVML", code=119)
    assert check_events("xid", from_nvml).action == "reset_gpu"


def test_judge_is_stable_for_the_same_line() -> None:
    assert judge(45, XID_45_BY_149) == judge(45, XID_45_BY_149)
    assert judge(None, "") == judge(None, "anything")


# --- Xid 74: decoded by its registers (NVIDIA's WORKFLOW_NVLINK_ERR, Hopper) --------------------

# NVIDIA/NVSentinel's parser test (csv_test.go at 3e97fd0; tests/data/kmsg_corpus.tsv): the
# third register's bit 16, which the catalog asks to report only if it repeats.
XID_74 = (
    "NVRM: Xid (PCI:0003:00:00): 74, pid='<unknown>', name=<unknown>, NVLink: fatal error "
    "detected on link 14(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)"
)


def xid74(*registers: int, link: int = 6) -> str:
    """XID_74's format with other register values (the bits each class is made of)."""
    shown = ", ".join(hex(value) for value in registers)
    return xid_line(74, f"pid='<unknown>', name=<unknown>, NVLink: fatal error detected on "
                    f"link {link}({shown})")  # fmt: skip


@pytest.mark.parametrize(
    ("line", "severity", "action", "runbook", "cause"),
    [
        pytest.param(
            XID_74,
            Severity.WARN,
            "investigate",
            "gpu-xid-nvlink-hardware",
            "Xid 74 on NVLink 14, error to watch",
            id="nvsentinel-line-register3-bit16",
        ),
        pytest.param(
            xid74(0x10000, 0, 0, 0, 0, 0, 0),
            Severity.CRITICAL,
            "reseat_or_replace",
            "gpu-xid-nvlink-hardware",
            "Xid 74 on NVLink 6, hardware",
            id="register1-bit16-hardware",
        ),
        pytest.param(
            xid74(0x2, 0, 0, 0, 0, 0, 0),
            Severity.WARN,
            "investigate",
            "gpu-xid-nvlink-sympathetic",
            "Xid 74 on NVLink 6, sympathetic",
            id="register1-bit1-sympathetic",
        ),
        pytest.param(
            xid74(0, 0, 0, 0x10000, 0, 0, 0),
            Severity.WARN,
            "investigate",
            "gpu-xid-nvlink-sympathetic",
            "Xid 74 on NVLink 6, sympathetic",
            id="register4-bit16-sympathetic",
        ),
        pytest.param(
            # With another bit set, the sympathetic one does not decide.
            xid74(0x100002, 0, 0, 0, 0x40000, 0, 0),
            Severity.WARN,
            "investigate",
            "gpu-xid-nvlink-ecc",
            "Xid 74 on NVLink 6, ECC/parity",
            id="sympathetic-with-ecc-is-ecc",
        ),
        pytest.param(
            xid74(0x10, 0, 0, 0, 0, 0, 0),
            Severity.WARN,
            "investigate",
            "gpu-xid-nvlink-ecc",
            "Xid 74 on NVLink 6, ECC/parity",
            id="register1-bit4-ecc-parity",
        ),
        pytest.param(
            xid74(0, 0, 0, 0, 0x100000, 0, 0),
            Severity.WARN,
            "investigate",
            "gpu-xid-nvlink-ecc",
            "Xid 74 on NVLink 6, ECC error threshold",
            id="register5-bit20-ecc-threshold",
        ),
        pytest.param(
            xid74(0x200000, 0, 0, 0, 0, 0, 0),
            Severity.WARN,
            "reseat_or_replace",
            "gpu-xid-nvlink-hardware",
            "Xid 74 on NVLink 6, signal integrity",
            id="register1-bit21-signal-integrity",
        ),
        pytest.param(
            xid74(0x200000, 0, 0x40, 0, 0, 0, 0),
            Severity.WARN,
            "investigate",
            "gpu-xid-nvlink-ecc",
            "Xid 74 on NVLink 6, ECC/parity",
            id="signal-integrity-with-ecc-is-ecc",
        ),
        pytest.param(
            xid74(0, 0, 0x2000, 0, 0, 0, 0),
            Severity.CRITICAL,
            "contact_support",
            "gpu-xid-contact-support",
            "Xid 74 on NVLink 6, unexpected bit",
            id="register3-bit13-unexpected",
        ),
        pytest.param(
            xid74(0x8, 0, 0, 0, 0, 0, 0),
            Severity.CRITICAL,
            "contact_support",
            "gpu-xid-contact-support",
            "Xid 74 on NVLink 6, undocumented bits",
            id="a-bit-the-catalog-does-not-list",
        ),
        pytest.param(
            xid74(0, 0, 0, 0, 0, 0, 0),
            Severity.CRITICAL,
            "contact_support",
            "gpu-xid-contact-support",
            "Xid 74 on NVLink 6, no register bit set",
            id="no-bit-set",
        ),
        pytest.param(
            # The HyperPod documentation's bare form: no registers to decode.
            xid_line(74, "pid=<unknown>, name=<unknown>, NVLink: fatal error detected on link 6"),
            Severity.CRITICAL,
            "contact_support",
            "gpu-xid-contact-support",
            "Xid 74 on NVLink 6",
            id="no-register-dump",
        ),
    ],
)
def test_xid74_is_decoded_by_its_registers(
    line: str, severity: Severity, action: str, runbook: str, cause: str
) -> None:
    found = check_events("xid", xid(line))
    assert (found.severity, found.action, found.runbook) == (severity, action, runbook)
    assert found.reason.startswith(f"Xid 74 (NVLINK_ERROR) {cause.removeprefix('Xid 74 ')}")
    assert found.cause == cause


def test_xid74_reason_and_evidence_name_the_link_and_bits() -> None:
    found = check_events("xid", xid(xid74(0x2, 0, 0, 0x40000, 0, 0, 0, link=9)))
    assert found.reason == (
        "Xid 74 (NVLINK_ERROR) on NVLink 9, sympathetic: the peer GPU or NVSwitch at the "
        "link's other end failed: investigate it, not this GPU; the fabric needs a reset"
    )
    evidence = found.evidence_dict()
    assert (evidence["nvlink"], evidence["nvlink_error"]) == (9, "sympathetic")
    assert evidence["nvlink_error_bits"] == "register 1 bit 1; register 4 bit 18"
    assert evidence["nvlink_registers"] == "0x2,0x0,0x0,0x40000,0x0,0x0,0x0"


def test_xid74_with_only_ignorable_bits_needs_nothing() -> None:
    found = check_events("xid", xid(xid74(0x40800001, 0, 0, 0, 0, 0, 0)))
    assert (found.severity, found.reason) == (Severity.OK, "1 XID seen, none needing action")
    assert found.evidence_dict()["nvlink_registers"] == "0x40800001,0x0,0x0,0x0,0x0,0x0,0x0"


def test_xid74_on_a_gpu_other_than_a_hopper_is_not_decoded() -> None:
    # NVIDIA's catalog documents the register layout of Hopper GPUs only.
    a100 = gpu(ident=replace(identity(), name="NVIDIA A100-SXM4-80GB"))
    health, _ = run(a100, events=(xid(xid74(0x2, 0, 0, 0, 0, 0, 0)),))
    found = finding(health, "xid")
    assert (found.severity, found.action) == (Severity.CRITICAL, "contact_support")
    assert found.reason == "Xid 74 (NVLINK_ERROR) on NVLink 6: contact support"
    assert found.evidence_dict()["nvlink_error"] is None


def test_xid74_ecc_parity_more_than_twice_on_one_link_is_a_support_case() -> None:
    ecc = xid74(0x10, 0, 0, 0, 0, 0, 0, link=5)
    twice = check_events("xid", xid(ecc, at=0.0), xid(ecc, at=10.0), now=20.0)
    assert (twice.severity, twice.action) == (Severity.WARN, "investigate")
    # Twice more, but on another link: still counted per link.
    other = xid74(0x10, 0, 0, 0, 0, 0, 0, link=7)
    spread = check_events("xid", xid(ecc, at=0.0), xid(ecc, at=10.0), xid(other, at=15.0), now=20.0)
    assert spread.severity is Severity.WARN
    thrice = check_events("xid", *(xid(ecc, at=t) for t in (0.0, 10.0, 20.0)), now=30.0)
    assert (thrice.severity, thrice.action, thrice.runbook) == (
        Severity.CRITICAL,
        "contact_support",
        "gpu-xid-nvlink-ecc",
    )
    assert thrice.reason.startswith(
        "Xid 74 (NVLINK_ERROR) on NVLink 5, ECC/parity 3 times in the last 3600 s, at or above 3"
    )


def test_xid74_to_watch_is_a_support_case_the_second_time() -> None:
    once = check_events("xid", xid(XID_74))
    twice = check_events("xid", xid(XID_74, at=0.0), xid(XID_74, at=60.0), now=61.0)
    assert (once.severity, twice.severity, twice.action) == (
        Severity.WARN,
        Severity.CRITICAL,
        "contact_support",
    )
    # A per-XID count in the configuration replaces NVIDIA's.
    relaxed = check(
        xid(XID_74, at=0.0), xid(XID_74, at=60.0), now=61.0, repeat=[XidRepeat(xid=74, count=4)]
    )
    assert relaxed.severity is Severity.WARN


def test_sympathetic_xid74_never_escalates() -> None:
    sympathetic = xid74(0x2, 0, 0, 0, 0, 0, 0)
    found = check_events("xid", *(xid(sympathetic, at=t) for t in range(10)), now=10.0)
    assert (found.severity, found.action) == (Severity.WARN, "investigate")


# `gpuagent xid explain` and `xid list` print the check's own verdict (checks.xid.policy):
# on a real line whose number alone decides, it is what the finding says.
@pytest.mark.parametrize(
    "line", [XID_8, XID_13, XID_31, XID_48, XID_62, XID_64, XID_79, XID_109, XID_119]
)
def test_the_catalog_view_says_what_a_finding_says(line: str) -> None:
    found = check_events("xid", xid(line))
    code = xid(line).code
    assert code is not None
    verdict = policy(code).verdict
    assert policy(code).decided_by == ""
    assert (verdict.severity, verdict.action.value, verdict.runbook.value) == (
        found.severity,
        found.action,
        found.runbook,
    )
    assert verdict.label in found.reason
