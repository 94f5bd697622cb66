"""sxid and kernel (node level): NVSwitch errors, driver mismatches, crash dumps, GSP."""

from __future__ import annotations

import pytest

from gpuagent.config import SxidCheck
from gpuagent.kernel.parse import parse_message
from gpuagent.model import Finding, GpuEvent, Severity
from test_checks_support import (
    BOOT_WALL,
    BUS,
    OTHER_BUS,
    check_events,
    gpu,
    kernel_event,
    run,
    with_checks,
)

# Real lines (tests/data/kmsg_corpus.tsv).
SXID_FATAL = (
    "[6781753.400584] nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, "
    "Link 48 LTSSM Fault Up"
)
SXID_FATAL_DETAIL = (
    "[6781753.404848] nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 20034, Severity 1 "
    "Engine instance 60 Sub-engine instance 00"
)
SXID_FATAL_DATA = (
    "[6781753.406566] nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Data {0x10000000, "
    "0x10000000, 0x00000000, 0x10000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, "
    "0x00000000}"
)
SXID_NONFATAL = (
    "[73309.599396] nvidia-nvswitch0: SXid (PCI:0000:06:00.0): 20009, Non-fatal, "
    "Link 04 RX Short Error Rate"
)
SXID_SOE = "nvidia-nvswitch0: SXid (PCI:0004:00:00.0): 26008, SOE Watchdog error"
SXID_SOURCETRACK = (
    "[ 1108.858286] nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 24007, Fatal, Link 28 "
    "sourcetrack timeout error (First)"
)
MISMATCH = "[    9.424670] NVRM: API mismatch: the client 'kwin_wayland' (pid 1005)"
CRASH_DUMP = "[  239.061398] NVRM: A GPU crash dump has been created. If possible, please run"
GSP_HEARTBEAT = "Mar 21 21:42:01 kernel: NVRM: GPU0 _kgspRpcRecvPoll: GSP RM heartbeat timed out"
GSP_FOR_A_GPU = (
    "[Sun Feb 23 16:24:36 2025] NVRM: Rate limiting GSP RPC error prints for GPU at "
    "PCI:0000:9b:00 (printing 1 of every 30).  The GPU likely needs to be reset."
)
XID_119 = (
    "NVRM: Xid (PCI:0000:9b:00): 119, pid=28098, name=gpu-feature-dis, Timeout after 45s of "
    "waiting for RPC response from GPU4 GSP! Expected function 76 (GSP_RM_CONTROL) "
    "(0x20803039 0x20)."
)


def line_event(line: str, *, at: float = 0.0, gpu: str | None = None) -> GpuEvent:
    """The event of ``line``; SXids name their NVSwitch (the line's own bus id)."""
    parsed = parse_message(line)
    return kernel_event(line, gpu=parsed.pci if parsed.kind == "sxid" else gpu, at=at)


def sxid_check(*events: GpuEvent, now: float = 0.0) -> Finding:
    return check_events("sxid", *events, now=now, bus=None)


def kernel_check(*events: GpuEvent, now: float = 0.0) -> Finding:
    return check_events("kernel", *events, now=now, bus=None)


@pytest.mark.parametrize(
    ("line", "severity", "action", "runbook", "reason"),
    [
        pytest.param(
            SXID_FATAL,
            Severity.CRITICAL,
            "drain_and_reboot",
            "node-sxid-fatal",
            "1 fatal NVSwitch error (last SXid 20034 on 0000:06:00.0)",
            id="fatal",
        ),
        pytest.param(
            SXID_SOURCETRACK,
            Severity.CRITICAL,
            "drain_and_reboot",
            "node-sxid-fatal",
            "1 fatal NVSwitch error (last SXid 24007 on 0000:c3:00.0)",
            id="fatal-first",
        ),
        pytest.param(
            SXID_NONFATAL,
            Severity.WARN,
            "investigate",
            "node-sxid",
            "1 NVSwitch SXid in the last hour (last SXid 20009 on 0000:06:00.0)",
            id="non-fatal",
        ),
        pytest.param(
            SXID_SOE,
            Severity.WARN,
            "investigate",
            "node-sxid",
            "1 NVSwitch SXid in the last hour (last SXid 26008 on 0004:00:00.0)",
            id="no-fatality-printed",
        ),
        pytest.param(
            SXID_FATAL_DATA,
            Severity.WARN,
            "investigate",
            "node-sxid",
            "1 NVSwitch SXid in the last hour (last SXid 20034 on 0000:05:00.0)",
            id="detail-line-alone",
        ),
    ],
)
def test_sxid_lines(line: str, severity: Severity, action: str, runbook: str, reason: str) -> None:
    found = sxid_check(line_event(line, at=2.0), now=10.0)
    assert (found.severity, found.action, found.runbook, found.reason) == (
        severity,
        action,
        runbook,
        reason,
    )
    assert (found.evidence_dict()["line"], found.evidence_dict()["time"]) == (line, BOOT_WALL + 2)


def test_a_fatal_report_with_its_detail_lines() -> None:
    report = [line_event(line, at=1.0) for line in (SXID_FATAL, SXID_FATAL_DETAIL, SXID_FATAL_DATA)]
    found = sxid_check(*report, now=5.0)
    assert found.severity is Severity.CRITICAL
    assert found.reason == (
        "1 fatal NVSwitch error (last SXid 20034 on 0000:06:00.0); "
        "2 NVSwitch SXids in the last hour (last SXid 20034 on 0000:05:00.0)"
    )
    assert found.evidence_dict()["line"] == SXID_FATAL


def test_fatal_stays_while_retained_others_fade_after_an_hour() -> None:
    events = (line_event(SXID_FATAL), line_event(SXID_NONFATAL))
    later = sxid_check(*events, now=3601.0)
    assert (later.severity, later.evidence_dict()["other_sxids_last_hour"]) == (
        Severity.CRITICAL,
        0,
    )
    assert sxid_check(line_event(SXID_NONFATAL), now=3601.0).severity is Severity.OK


def test_sxid_switch_off() -> None:
    health, _ = run(
        gpu(), events=(line_event(SXID_FATAL),), config=with_checks(sxid=SxidCheck(enabled=False))
    )
    assert [f.check for f in health.node_findings()] == ["nvml", "kernel", "state_dir"]


def test_no_sxids() -> None:
    found = sxid_check()
    assert (found.severity, found.reason, found.evidence_dict()["sxid"]) == (
        Severity.OK,
        "no NVSwitch errors",
        None,
    )


# --- kernel ----------------------------------------------------------------------------------


def test_driver_mismatch_is_critical_while_retained() -> None:
    found = kernel_check(line_event(MISMATCH, at=9.0), now=80_000.0)
    assert (found.severity, found.reason, found.action, found.runbook) == (
        Severity.CRITICAL,
        "driver/library version mismatch (1 kernel message)",
        "drain_and_reboot",
        "node-driver-mismatch",
    )
    assert found.evidence_dict()["line"] == MISMATCH


@pytest.mark.parametrize(("now", "severity"), [(3600.0, Severity.WARN), (3601.0, Severity.OK)])
def test_crash_dump_warns_for_an_hour(now: float, severity: Severity) -> None:
    found = kernel_check(line_event(CRASH_DUMP), now=now)
    assert found.severity is severity
    if severity is Severity.WARN:
        assert (found.reason, found.runbook) == (
            "1 GPU crash dump created in the last hour",
            "node-crash-dump",
        )


def test_gsp_without_a_known_gpu_or_an_xid_warns_at_node_level() -> None:
    found = kernel_check(line_event(GSP_HEARTBEAT, at=10.0), now=20.0)
    assert (found.severity, found.reason, found.runbook) == (
        Severity.WARN,
        "1 GSP error message in the last hour without an XID",
        "node-gsp-error",
    )


def test_gsp_near_an_xid_is_its_detail() -> None:
    xid = kernel_event(XID_119, gpu="0000:9b:00.0", at=10.0)
    assert kernel_check(xid, line_event(GSP_HEARTBEAT, at=40.0), now=50.0).severity is Severity.OK
    assert kernel_check(xid, line_event(GSP_HEARTBEAT, at=71.0), now=80.0).severity is Severity.WARN


def test_gsp_of_a_known_gpu_is_left_to_its_xid_check() -> None:
    mine = line_event(GSP_FOR_A_GPU, gpu=BUS)
    assert kernel_check(mine).severity is Severity.OK
    assert check_events("xid", mine).severity is Severity.WARN
    # A GPU the agent does not list (NVML lost it, or the line names another one).
    assert kernel_check(line_event(GSP_FOR_A_GPU, gpu=OTHER_BUS)).severity is Severity.WARN


def test_worst_kernel_problem_leads() -> None:
    events = (
        line_event(CRASH_DUMP, at=1.0),
        line_event(MISMATCH, at=2.0),
        line_event(GSP_HEARTBEAT, at=300.0),
    )
    found = kernel_check(*events, now=400.0)
    assert found.reason == (
        "driver/library version mismatch (1 kernel message); "
        "1 GPU crash dump created in the last hour; "
        "1 GSP error message in the last hour without an XID"
    )
    assert found.evidence_dict()["line"] == MISMATCH


def test_nothing_in_the_kernel_log() -> None:
    found = kernel_check()
    assert (found.severity, found.reason) == (
        Severity.OK,
        "no driver mismatch, crash dump or unexplained GSP error in the kernel log",
    )
