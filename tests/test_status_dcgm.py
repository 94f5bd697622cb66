"""`gpuagent status` shows DCGM's state and the latest diagnostics, and nothing of either
on a node without DCGM."""

from __future__ import annotations

import dataclasses

from gpuagent.model import (
    DcgmIncident,
    DcgmStatus,
    DiagResult,
    DiagTest,
    NodeSnapshot,
    NvmlStatus,
    Severity,
)
from gpuagent.render import render_status
from gpuagent.statusview import status_document

NOW = 10_000.0


def snapshot(**changes: object) -> NodeSnapshot:
    base = NodeSnapshot(
        node_name="n1",
        cluster="c",
        hostname="h",
        sequence=1,
        taken_at=NOW,
        nvml=NvmlStatus(ok=True),
    )
    return dataclasses.replace(base, **changes)


def rendered(snap: NodeSnapshot) -> list[str]:
    return render_status(status_document(snap), now=NOW).splitlines()


def test_a_node_without_dcgm_shows_nothing_of_it() -> None:
    for dcgm in (None, DcgmStatus(state="absent", detail="no bindings")):
        lines = rendered(snapshot(dcgm=dcgm))
        assert not [line for line in lines if "DCGM" in line or "Diagnostic" in line]


def test_dcgm_up_with_incidents_and_down_with_the_reason() -> None:
    incident = DcgmIncident(
        "pcie", Severity.WARN, "DCGM_FR_PCI_REPLAY_RATE", "replays", "0000:1b:00.0"
    )
    up = DcgmStatus("up", version="4.5.0", hostengine="localhost:5555", incidents=(incident,))
    assert "DCGM up (4.5.0, localhost:5555), 1 health incident" in rendered(snapshot(dcgm=up))
    down = DcgmStatus("down", detail="connection refused", hostengine="localhost:5555")
    assert "DCGM DOWN (localhost:5555): connection refused" in rendered(snapshot(dcgm=down))


def test_the_latest_diagnostic_of_each_level() -> None:
    passed = DiagResult(
        1, (0, 1), NOW - 700, NOW - 600, "bindings", (DiagTest("software", "pass", 0),)
    )
    failed = DiagResult(
        3,
        (1,),
        NOW - 3000,
        NOW - 120,
        "dcgmi",
        (DiagTest("memory", "fail", 1, "mismatch"), DiagTest("pcie", "warn", 1)),
    )
    lines = rendered(snapshot(diag=(passed, failed)))
    assert "Diagnostic level 1 passed 10 min ago" in lines
    assert "Diagnostic level 3 FAILED 2 min ago: memory (GPU 1)" in lines
    doc = status_document(snapshot(diag=(failed,)))
    assert doc["diag"] == [
        {
            "level": 3,
            "passed": False,
            "via": "dcgmi",
            "finished": NOW - 120,
            "gpus": [1],
            "failed": [{"test": "memory", "gpu": 1, "info": "mismatch"}],
            "error": "",
        }
    ]
