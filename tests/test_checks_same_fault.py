"""One fault that two checks see is one finding: the owner's, carrying both pieces of
evidence (Xid 48 and the DBE counter, Xid 79 and GPU_IS_LOST, Xid 63/64 and the row remap
flags); each alone is found as before, and the planner acts on the pair as on the state."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import pytest

from gpuagent.config import EccCheck, RemediationCordon, RemediationSection, XidCheck
from gpuagent.model import (
    Finding,
    GpuEvent,
    GpuState,
    NodeHealth,
    NodeSnapshot,
    Severity,
)
from gpuagent.remediation.planner import plan
from gpuagent.remediation.types import History
from test_checks_support import (
    BUS,
    NVML_OK,
    finding,
    gpu,
    kernel_event,
    run,
    with_checks,
)

# Real kernel lines (tests/data/kmsg_corpus.tsv); the tests say which GPU each names.
XID_48 = (
    "Dec  2 11:38:47 worker4 kernel: [  219.470994] NVRM: Xid (PCI:0000:07:00): 48, "
    "pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has been "
    "detected on GPU in the framebuffer at physAddr 0x7fffa8860 partition 7, subpartition 1."
)
XID_79 = (
    "[6781741.548779] NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, "
    "GPU has fallen off the bus."
)
XID_63 = (
    "NVRM: Xid (PCI:0000:0f:00): 63, pid=57530, name=python3, Row Remapper: New row "
    "(0x00000005d28c03a0) Marked for Remapping, reset gpu to activate."
)
XID_64 = (
    "NVRM: Xid (PCI:0000:0f:00): 64, pid=57530, Row Remapper Error: (0x00000005d28c03a0) "
    "- All reserved rows for bank are remapped"
)
XID_13 = (
    "NVRM: Xid (PCI:0000:cb:00): 13, pid=4242, name=python3, Graphics SM Warp Exception on "
    "(GPC 7, TPC 7, SM 0): Illegal Instruction Parameter"
)
XID_43 = "NVRM: Xid (PCI:0000:01:00): 43, pid=1814139, name=cuda_assert_64b, Ch 00000018"


@dataclass(frozen=True)
class Pair:
    """A fault: the state a check reads, the XID the driver logs, and who owns it."""

    state: GpuState
    line: str
    xid: int
    owner: str
    cause: str
    severity: Severity
    state_evidence: tuple[str, Any]  # the owner's own evidence that shows the state


def _dbe() -> GpuState:
    return gpu(ecc_enabled=True, ecc_dbe_volatile=1, ecc_sbe_volatile=0)


def _remap(*, pending: bool, failure: bool) -> GpuState:
    return gpu(
        remapped_rows_correctable=0,
        remapped_rows_uncorrectable=1,
        row_remap_pending=pending,
        row_remap_failure=failure,
    )


PAIRS = {
    "dbe": Pair(_dbe(), XID_48, 48, "ecc", "gpu-ecc-dbe", Severity.CRITICAL, ("dbe_volatile", 1)),
    "lost": Pair(
        gpu("lost", error="GPU is lost"),
        XID_79,
        79,
        "availability",
        "gpu-lost",
        Severity.CRITICAL,
        ("status", "lost"),
    ),
    "remap-pending": Pair(
        _remap(pending=True, failure=False),
        XID_63,
        63,
        "row_remap",
        "gpu-row-remap-pending",
        Severity.WARN,
        ("row_remap_pending", True),
    ),
    "remap-failure": Pair(
        _remap(pending=False, failure=True),
        XID_64,
        64,
        "row_remap",
        "gpu-row-remap-failure",
        Severity.CRITICAL,
        ("row_remap_failure", True),
    ),
    "remap-failure-63": Pair(
        _remap(pending=False, failure=True),
        XID_63,
        63,
        "row_remap",
        "gpu-row-remap-failure",
        Severity.CRITICAL,
        ("row_remap_failure", True),
    ),
}
# Without its XID's state: what the XID alone is (Xid 63 needs nothing by itself).
ALONE_XID = {48: Severity.CRITICAL, 79: Severity.CRITICAL, 63: Severity.OK, 64: Severity.CRITICAL}


def _healthy() -> GpuState:
    """A GPU answering NVML with nothing wrong in what an owner reads."""
    return gpu(
        ecc_enabled=True,
        ecc_dbe_volatile=0,
        remapped_rows_correctable=0,
        remapped_rows_uncorrectable=0,
        row_remap_pending=False,
        row_remap_failure=False,
    )


def _problems(health: NodeHealth) -> list[Finding]:
    """The GPU's findings that are a problem of their own (not OK, not masked)."""
    return [f for f in health.for_gpu(BUS) if f.severity is not Severity.OK and not f.masked]


def _xid(line: str, at: float = 0.0) -> GpuEvent:
    return kernel_event(line, at=at)


@pytest.mark.parametrize("pair", PAIRS.values(), ids=PAIRS.keys())
def test_a_fault_two_checks_see_is_one_finding_with_both_evidences(pair: Pair) -> None:
    health, _ = run(pair.state, events=(_xid(pair.line),))
    (found,) = _problems(health)
    assert (found.check, found.cause, found.severity) == (pair.owner, pair.cause, pair.severity)
    evidence = found.evidence_dict()
    key, value = pair.state_evidence
    assert evidence[key] == value
    assert (evidence["xid"], evidence["xid_line"], evidence["xid_count"]) == (
        pair.xid,
        pair.line,
        1,
    )
    assert f"also reported as Xid {pair.xid}" in found.reason
    xid = finding(health, "xid")
    assert xid.severity is Severity.OK
    assert f"Xid {pair.xid} in the {pair.owner} finding" in xid.reason


@pytest.mark.parametrize("pair", PAIRS.values(), ids=PAIRS.keys())
def test_the_state_alone_is_the_same_finding(pair: Pair) -> None:
    alone, _ = run(pair.state)
    with_xid, _ = run(pair.state, events=(_xid(pair.line),))
    (found,) = _problems(alone)
    (merged,) = _problems(with_xid)
    assert (found.identity, found.severity) == (merged.identity, merged.severity)
    assert "xid" not in found.evidence_dict()


@pytest.mark.parametrize("pair", PAIRS.values(), ids=PAIRS.keys())
def test_the_xid_alone_is_the_xid_checks(pair: Pair) -> None:
    health, _ = run(_healthy(), events=(_xid(pair.line),))
    xid = finding(health, "xid")
    assert xid.severity is ALONE_XID[pair.xid]
    assert finding(health, pair.owner).severity is Severity.OK
    if xid.severity is Severity.OK:
        assert _problems(health) == []
    else:
        assert _problems(health) == [xid]
        assert xid.cause == f"Xid {pair.xid}"


def _plan(state: GpuState, health: NodeHealth) -> list[tuple[str, str]]:
    snapshot = NodeSnapshot(
        node_name="gpu-node-07",
        cluster="dev",
        hostname="gpu-node-07",
        sequence=1,
        taken_at=0.0,
        nvml=NVML_OK,
        gpus=(state,),
        health=health,
    )
    config = RemediationSection(cordon=replace(RemediationCordon(), backends=["command"]))
    return [(a.kind, a.target) for a in plan(snapshot, History(), 0.0, config)]


@pytest.mark.parametrize("pair", PAIRS.values(), ids=PAIRS.keys())
def test_the_planner_acts_on_the_pair_as_on_the_state(pair: Pair) -> None:
    alone, _ = run(pair.state)
    with_xid, _ = run(pair.state, events=(_xid(pair.line),))
    assert _plan(pair.state, with_xid) == _plan(pair.state, alone)
    assert _plan(pair.state, alone)  # every pair asks for something


def test_a_dbe_with_its_xid_still_plans_a_cordon_and_a_reset() -> None:
    health, _ = run(_dbe(), events=(_xid(XID_48),))
    assert _plan(_dbe(), health) == [("cordon", "gpu-node-07"), ("reset_gpu", BUS)]


def test_the_other_xids_of_the_gpu_stay_the_xid_checks() -> None:
    # An application's XID beside the DBE: xid reports it, with its own evidence.
    events = (_xid(XID_48, at=1.0), _xid(XID_13, at=500.0))
    health, _ = run(_dbe(), events=events, now=600.0)
    ecc, xid = finding(health, "ecc"), finding(health, "xid")
    assert (ecc.severity, ecc.evidence_dict()["xid"]) == (Severity.CRITICAL, 48)
    assert (xid.severity, xid.evidence_dict()["xid"]) == (Severity.WARN, 13)
    assert "Xid 48" not in xid.reason


def test_the_teardowns_after_the_xid_go_with_it() -> None:
    # Channel teardowns right after Xid 48 are its consequence, not application errors.
    events = (_xid(XID_48, at=1.0), *(_xid(XID_43, at=2.0 + n) for n in range(3)))
    health, _ = run(_dbe(), events=events, now=10.0)
    assert [f.check for f in _problems(health)] == ["ecc"]


def test_after_a_reset_the_logged_xid_is_the_xid_checks_again() -> None:
    # The counter clears at the reset; the XID stays in the event log for its retention,
    # as it would alone, and the ecc finding does not outlive the state it reads.
    healthy = gpu(ecc_enabled=True, ecc_dbe_volatile=0)
    health, _ = run(healthy, events=(_xid(XID_48),))
    assert [f.check for f in _problems(health)] == ["xid"]


def test_an_xid_worse_than_the_state_stays_its_own_finding() -> None:
    # Xid 64 asks for a reset, CRITICAL; a pending remap is a WARN: not the same fault.
    health, _ = run(_remap(pending=True, failure=False), events=(_xid(XID_64),))
    assert sorted((f.check, f.severity) for f in _problems(health)) == [
        ("row_remap", Severity.WARN),
        ("xid", Severity.CRITICAL),
    ]


def test_with_the_owner_off_the_xid_check_reports_the_fault() -> None:
    config = with_checks(ecc=EccCheck(enabled=False))
    health, _ = run(_dbe(), events=(_xid(XID_48),), config=config)
    assert [(f.check, f.cause) for f in _problems(health)] == [("xid", "Xid 48")]


def test_with_the_xid_check_off_the_owner_reports_the_state_alone() -> None:
    config = with_checks(xid=XidCheck(enabled=False))
    health, _ = run(_dbe(), events=(_xid(XID_48),), config=config)
    (found,) = _problems(health)
    assert found.check == "ecc"
    assert "xid" not in found.evidence_dict()


def test_a_lost_gpus_xid_counts_every_record() -> None:
    events = (_xid(XID_79, at=1.0), _xid(XID_79, at=2.0))
    health, _ = run(gpu("lost"), events=events, now=3.0)
    (found,) = _problems(health)
    assert (found.check, found.evidence_dict()["xid_count"]) == ("availability", 2)
