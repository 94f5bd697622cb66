"""The Node's conditions and events, from findings and records (pure; the writer's end to
end tests are in test_daemon_kubernetes_output)."""

from __future__ import annotations

from typing import Any

import pytest

from gpuagent.checks import (
    CHECK_NAMES,
    INVENTORY_CHECK_NAMES,
    INVENTORY_NODE_CHECK_NAMES,
    NODE_CHECK_NAMES,
)
from gpuagent.k8s.conditions import (
    MAX_MESSAGE,
    PROBLEM_CLASSES,
    SUMMARY_ONLY_CHECKS,
    node_conditions,
)
from gpuagent.k8s.events import (
    MAX_NOTE,
    action_event,
    event_body,
    event_name,
    kernel_event,
    series_patch,
)
from gpuagent.model import Finding, GpuEvent, NodeHealth, NodeSnapshot, Severity
from gpuagent.remediation.audit import AuditRecord
from test_checks_support import BUS, NVML_OK, OTHER_BUS, gpu, identity

GPUS = (gpu(ident=identity(BUS, 0)), gpu(ident=identity(OTHER_BUS, 1)))
OK, WARN, CRIT, UNKNOWN = Severity.OK, Severity.WARN, Severity.CRITICAL, Severity.UNKNOWN


def _finding(check: str, severity: Severity, reason: str = "", **fields: Any) -> Finding:
    fields.setdefault("gpu", OTHER_BUS)
    fields.setdefault("cause", f"{check}-cause" if severity is not OK else "")
    return Finding(check, severity, reason or f"{check} {severity.name}", **fields)


def _snapshot(*findings: Finding) -> NodeSnapshot:
    return NodeSnapshot(
        node_name="n",
        cluster="c",
        hostname="n",
        sequence=1,
        taken_at=1.7e9,
        nvml=NVML_OK,
        gpus=GPUS,
        health=NodeHealth(findings),
    )


def _conditions(*findings: Finding) -> dict[str, tuple[str, str, str]]:
    return {
        c.type: (c.status, c.reason, c.message)
        for c in node_conditions(_snapshot(*findings), "GpuHealthy")
    }


def test_every_check_feeds_one_class_or_only_the_summary() -> None:
    checks = {
        *CHECK_NAMES,
        *NODE_CHECK_NAMES,
        *INVENTORY_CHECK_NAMES,
        *INVENTORY_NODE_CHECK_NAMES,
        "infiniband",
        "kubernetes",
        "dcgm",
    }
    placed = [check for _, fed, _ in PROBLEM_CLASSES for check in fed]
    assert len(placed) == len(set(placed)), "a check feeds two classes"
    assert set(placed) | SUMMARY_ONLY_CHECKS == checks
    assert not set(placed) & SUMMARY_ONLY_CHECKS


# (findings, summary (status, reason), the classes that are True)
CASES: list[tuple[tuple[Finding, ...], tuple[str, str], set[str]]] = [
    ((), ("True", "GpuHealthy"), set()),
    ((_finding("ecc", OK),), ("True", "GpuHealthy"), set()),
    ((_finding("ecc", WARN, runbook="gpu-ecc-sbe-rate"),), ("True", "GpuHealthy"), set()),
    (
        (_finding("ecc", CRIT, runbook="gpu-ecc-dbe"),),
        ("False", "GpuUnhealthy"),
        {"GpuMemoryErrors"},
    ),
    (
        (_finding("xid", CRIT, runbook="gpu-xid-reset"), _finding("nvlink", CRIT)),
        ("False", "GpuUnhealthy"),
        {"GpuXidCritical", "GpuFabricDegraded"},
    ),
    ((_finding("availability", CRIT, runbook="gpu-lost"),), ("False", "GpuUnhealthy"), {"GpuLost"}),
    ((_finding("sxid", CRIT, gpu=None),), ("False", "GpuUnhealthy"), {"GpuFabricDegraded"}),
    ((_finding("driver", CRIT, gpu=None),), ("False", "GpuUnhealthy"), {"GpuDriverProblem"}),
    ((_finding("thermal", CRIT),), ("False", "GpuUnhealthy"), {"GpuThermalProblem"}),
    ((_finding("aer", CRIT),), ("False", "GpuUnhealthy"), {"GpuPcieDegraded"}),
    # A summary-only check: no class, but the summary says it.
    ((_finding("kubernetes", CRIT, gpu=None),), ("False", "GpuUnhealthy"), set()),
    # NVML cannot read a GPU: unknown, not unhealthy.
    ((_finding("availability", UNKNOWN),), ("Unknown", "GpuHealthUnknown"), set()),
    # A lost GPU's other checks are masked: its one fault counts once.
    (
        (_finding("availability", CRIT), _finding("ecc", UNKNOWN, masked=True)),
        ("False", "GpuUnhealthy"),
        {"GpuLost"},
    ),
]


@pytest.mark.parametrize(("findings", "summary", "true"), CASES)
def test_conditions_from_findings(
    findings: tuple[Finding, ...], summary: tuple[str, str], true: set[str]
) -> None:
    conditions = _conditions(*findings)
    assert next(iter(conditions)) == "GpuHealthy"
    assert conditions["GpuHealthy"][:2] == summary
    assert {kind for kind, c in conditions.items() if c[0] == "True"} - {"GpuHealthy"} == true
    assert set(conditions) == {"GpuHealthy", *(kind for kind, _, _ in PROBLEM_CLASSES)}


def test_reasons_and_messages_name_the_gpu_and_the_runbook() -> None:
    dbe = _finding(
        "ecc", CRIT, "1 uncorrectable ECC error since the last reset", runbook="gpu-ecc-dbe"
    )
    sbe = _finding("ecc", WARN, "SBE rate 150/h", gpu=BUS, runbook="gpu-ecc-sbe-rate")
    conditions = _conditions(dbe, sbe)
    status, reason, message = conditions["GpuMemoryErrors"]
    assert (status, reason) == ("True", "GpuEccDbe")
    assert message == f"GPU 1 ({OTHER_BUS}) ecc: 1 uncorrectable ECC error since the last reset"
    # A warning alone leaves the class False, and is named in its message.
    status, reason, message = _conditions(sbe)["GpuMemoryErrors"]
    assert (status, reason) == ("False", "NoGpuMemoryErrors")
    assert message == f"no critical finding; warnings: GPU 0 ({BUS}) ecc: SBE rate 150/h"
    assert _conditions()["GpuHealthy"][2] == "all 2 GPUs healthy"


def test_a_reason_whose_numbers_change_changes_no_key() -> None:
    """The key (what a patch is sent for) is the finding's identity and severity."""

    def keys(reason: str, severity: Severity = CRIT) -> tuple[object, ...]:
        snapshot = _snapshot(_finding("ecc", severity, reason))
        return tuple(c.key for c in node_conditions(snapshot, "AcceleratedHardwareReady"))

    assert keys("2 uncorrectable ECC errors") == keys("3 uncorrectable ECC errors")
    assert keys("2 uncorrectable ECC errors") != keys("2 uncorrectable ECC errors", WARN)


def test_a_long_message_is_cut() -> None:
    many = tuple(_finding("xid", CRIT, "x" * 300, cause=f"Xid {n}") for n in range(10))
    message = _conditions(*many)["GpuXidCritical"][2]
    assert len(message) == MAX_MESSAGE
    assert message.endswith("...")


# --- events ---------------------------------------------------------------------------


def _event(kind: str, code: int | None = None, **fields: Any) -> GpuEvent:
    return GpuEvent(
        event_id=f"kmsg:{kind}:1",
        source="kmsg",
        kind=kind,  # type: ignore[arg-type]
        gpu=BUS,
        time=1_700_000_000.5,
        monotonic=10.0,
        code=code,
        line="NVRM: Xid (PCI:0000:18:00): 79, pid=4100, name=train.py, GPU has fallen off the bus.",
        **fields,
    )


@pytest.mark.parametrize(
    ("kind", "code", "made"),
    [
        ("xid", 79, ("Warning", "Xid79")),
        ("sxid", 12028, ("Warning", "SXid12028")),
        ("fallen_off_bus", None, ("Warning", "GpuFallenOffBus")),
        ("gpu_removed", None, ("Warning", "GpuRemoved")),
        ("gpu_added", None, ("Normal", "GpuAdded")),
        ("aer", None, None),  # in the agent's log and the fleet's, not an event
        ("gsp", None, None),
        ("crash_dump", None, None),
    ],
)
def test_kernel_events(kind: str, code: int | None, made: tuple[str, str] | None) -> None:
    event = kernel_event(_event(kind, code))
    assert (event and (event.type, event.reason)) == made


def test_a_drills_event_says_drill_and_a_reset_is_normal() -> None:
    drill = kernel_event(_event("xid", 79)._replace(source="drill"))
    assert drill is not None
    assert drill.note.startswith("DRILL: 0000:18:00.0: NVRM: Xid")
    real = kernel_event(_event("xid", 79))
    assert real is not None
    assert not real.note.startswith("DRILL")
    reset = kernel_event(_event("gpu_reset"))
    assert reset is not None
    assert (reset.type, reset.reason) == ("Normal", "GpuReset")


def test_an_event_body_is_what_the_api_server_validates() -> None:
    made = kernel_event(_event("xid", 79, workloads="pod ml/train-0 (trainer)"))
    assert made is not None
    body = event_body(made, node="gpu-node-1", node_uid="uid-1", namespace="default")
    assert body["metadata"] == {"name": event_name("gpu-node-1", made.key), "namespace": "default"}
    assert body["eventTime"] == "2023-11-14T22:13:20.500000Z"
    assert body["regarding"] == {
        "apiVersion": "v1",
        "kind": "Node",
        "name": "gpu-node-1",
        "uid": "uid-1",
    }
    assert body["action"] == "Detected"
    assert body["note"].startswith(f"{BUS}: NVRM: Xid")
    assert body["note"].endswith("(on the GPU: pod ml/train-0 (trainer))")
    # The name is the same after a restart, and a DNS subdomain.
    assert event_name("gpu-node-1", made.key) == event_name("gpu-node-1", made.key)
    assert event_name("gpu-node-1", made.key).startswith("gpu-node-1.")
    long = made._replace(note="é" * 2000)
    assert len(event_body(long, node="n", node_uid="", namespace="d")["note"].encode()) <= MAX_NOTE
    assert series_patch(400, 1_700_000_001.0) == {
        "series": {"count": 400, "lastObservedTime": "2023-11-14T22:13:21.000000Z"}
    }


def _record(kind: str, result: str, mode: str = "enforce", detail: str = "") -> AuditRecord:
    return AuditRecord(
        id=7,
        time=1.7e9,
        kind=kind,  # type: ignore[arg-type]
        target=BUS,
        result=result,  # type: ignore[arg-type]
        mode=mode,
        reason="Xid 79: GPU has fallen off the bus",
        check="xid",
        severity="CRITICAL",
        evidence={},
        detail=detail,
    )


@pytest.mark.parametrize(
    ("kind", "result", "mode", "made"),
    [
        ("reset_gpu", "succeeded", "enforce", ("Normal", "ResetGpuSucceeded", "ResetGpu")),
        ("reset_gpu", "refused", "enforce", ("Warning", "ResetGpuRefused", "ResetGpu")),
        ("cordon", "planned", "observe", ("Normal", "CordonPlanned", "Cordon")),
        ("cordon", "failed", "enforce", ("Warning", "CordonFailed", "Cordon")),
        ("reset_gpu", "started", "enforce", None),  # its outcome follows
        ("reset_gpu", "skipped", "enforce", None),  # a budget saying no again
        ("report", "planned", "observe", None),
    ],
)
def test_action_events(kind: str, result: str, mode: str, made: tuple[str, ...] | None) -> None:
    event = action_event(_record(kind, result, mode, detail="busy"))
    assert (event and (event.type, event.reason, event.action)) == made
    if event is not None:
        assert event.note.startswith("[observe] " if mode == "observe" else BUS)
        assert event.note.endswith("(busy)")
