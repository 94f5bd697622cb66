"""RMA evidence bundles: what goes in, the bug report bounded in time, when remediation
collects one, and pruning."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import sys
import tarfile
import time
from pathlib import Path
from typing import Literal

import pytest

from gpuagent.config import RemediationEvidence
from gpuagent.model import GpuEvent, NodeSnapshot
from gpuagent.remediation.evidence import SUFFIX, EvidenceCollector, rma_trigger
from test_remediation_executor import DBE, IDLE, Harness, Ops, enforce
from test_remediation_planner import BUS0, BUS1, CRITICAL, OK, WARN, finding, gpu, snapshot

REMAP_FAILED = finding(
    "row_remap",
    CRITICAL,
    "row remapping failed: no spare rows left",
    action="reseat_or_replace",
    evidence=(("row_remap_failure", True),),
)
XID_LINE = "NVRM: Xid (PCI:0000:18:00): 64, pid=1234, name=python, Row remapper error"

# Stands in for nvidia-bug-report.sh: takes --output-file like it, writes the report and
# gzips it to FILE.gz as it does; "hang" makes it write part and then never finish.
FAKE_BUG_REPORT = """#!{python}
import gzip, os, sys, time
path = sys.argv[sys.argv.index("--output-file") + 1]
with open(path, "w") as out:
    out.write("nvidia-bug-report.sh Version: 570.86.15\\n")
    out.flush()
    if "{behaviour}" == "hang":
        if os.fork() == 0:
            time.sleep(3600)  # a child the report left running, stopped with its group
        time.sleep(3600)
with open(path, "rb") as raw, gzip.open(path + ".gz", "wb") as packed:
    packed.write(raw.read())
os.unlink(path)
"""


def fake_bug_report(tmp_path: Path, behaviour: str = "ok") -> str:
    script = tmp_path / f"nvidia-bug-report-{behaviour}.sh"
    script.write_text(FAKE_BUG_REPORT.format(python=sys.executable, behaviour=behaviour))
    script.chmod(0o755)
    return str(script)


def failing_node() -> NodeSnapshot:
    event = GpuEvent(
        event_id="kmsg:1",
        source="kmsg",
        kind="xid",
        gpu=BUS0,
        time=1_700_000_000.0,
        monotonic=10.0,
        code=64,
        line=XID_LINE,
    )
    other = event._replace(event_id="kmsg:2", gpu=BUS1, line="another GPU")
    snap = snapshot(REMAP_FAILED, finding("ecc", OK, "ok"), gpus=(gpu(), gpu(BUS1, 1)))
    return dataclasses.replace(snap, events=(event, other))


def collector(tmp_path: Path, **config: object) -> EvidenceCollector:
    section = RemediationEvidence(**config)  # type: ignore[arg-type]
    return EvidenceCollector(section, tmp_path / "evidence", node="gpu-node-07")


def members(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as tar:
        return {
            m.name.split("/", 1)[1]: tar.extractfile(m).read()  # type: ignore[union-attr]
            for m in tar.getmembers()
            if m.isfile()
        }


async def test_a_bundle_holds_the_agents_view_of_the_gpu_and_the_bug_report(
    tmp_path: Path,
) -> None:
    evidence = collector(tmp_path, bug_report_command=fake_bug_report(tmp_path))
    bundle = await evidence.collect(failing_node(), BUS0, "row_remap_failure", "no spare rows")
    assert bundle.path.parent == tmp_path / "evidence"
    assert bundle.path.name.endswith(f"-{BUS0.replace(':', '_')}-row_remap_failure{SUFFIX}")
    assert bundle.bug_report == "included"
    files = members(bundle.path)
    assert set(files) == {
        "manifest.json",
        "status.json",
        "gpu.json",
        "events.txt",
        "inventory.json",
        "nvidia-bug-report.log.gz",
    }
    manifest = json.loads(files["manifest.json"])
    assert manifest["gpu"] == BUS0
    assert manifest["trigger"] == "row_remap_failure"
    assert manifest["nvidia_bug_report"] == "included"
    assert "nvidia-bug-report.log.gz" in manifest["files"]
    gpu_doc = json.loads(files["gpu.json"])
    assert gpu_doc["pci_bus_id"] == BUS0
    assert [f["check"] for f in gpu_doc["findings"]] == ["row_remap"]
    # Every check of the GPU, the OK ones too: what was looked at and found fine.
    assert {f["check"] for f in gpu_doc["all_findings"]} == {"row_remap", "ecc"}
    # Only this GPU's kernel-log lines.
    assert XID_LINE in files["events.txt"].decode()
    assert "another GPU" not in files["events.txt"].decode()
    assert json.loads(files["status.json"])["node"]["name"] == "gpu-node-07"
    # Root's only: a bug report holds the host's details.
    assert bundle.path.stat().st_mode & 0o777 == 0o600
    assert bundle.path.parent.stat().st_mode & 0o777 == 0o700
    # Nothing partial is left beside the bundle.
    assert [p.name for p in (tmp_path / "evidence").iterdir()] == [bundle.path.name]


async def test_a_hanging_bug_report_is_stopped_with_its_children_and_kept_in_part(
    tmp_path: Path,
) -> None:
    evidence = collector(
        tmp_path,
        bug_report_command=fake_bug_report(tmp_path, "hang"),
        bug_report_timeout_seconds=1.0,
    )
    started = time.monotonic()
    bundle = await evidence.collect(failing_node(), BUS0, "escalated", "reset did not help")
    assert time.monotonic() - started < 30
    assert bundle.bug_report == "timed out after 1 s (partial)"
    assert b"Version: 570.86.15" in members(bundle.path)["nvidia-bug-report.log"]
    # The report's whole process group went with it.
    leftovers = [
        pid
        for pid in Path("/proc").iterdir()
        if pid.name.isdigit() and "nvidia-bug-report-hang" in _read(pid / "cmdline")
    ]
    assert leftovers == []


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:  # the process ended meanwhile
        return ""


@pytest.mark.parametrize(
    ("command", "said"),
    [
        pytest.param("", "not configured", id="off"),
        pytest.param(
            "/nonexistent/nvidia-bug-report.sh",
            "/nonexistent/nvidia-bug-report.sh not installed",
            id="not-installed",
        ),
        pytest.param("/bin/false", "exited 1 without a report", id="fails-without-report"),
    ],
)
async def test_without_a_bug_report_the_bundle_says_why(
    tmp_path: Path, command: str, said: str
) -> None:
    bundle = await collector(tmp_path, bug_report_command=command).collect(
        failing_node(), BUS0, "escalated", "reset did not help"
    )
    assert bundle.bug_report == said
    assert "nvidia-bug-report.log.gz" not in members(bundle.path)
    assert json.loads(members(bundle.path)["manifest.json"])["nvidia_bug_report"] == said


async def test_bundles_are_pruned_by_age_then_by_size_newest_kept(tmp_path: Path) -> None:
    evidence = collector(tmp_path, bug_report_command="", max_age_days=1.0, max_total_mib=1)
    directory = tmp_path / "evidence"
    directory.mkdir()
    now = time.time()
    ancient = directory / f"old{SUFFIX}"
    ancient.write_bytes(b"x")
    os.utime(ancient, (now - 2 * 86400, now - 2 * 86400))
    big = [directory / f"big{n}{SUFFIX}" for n in range(3)]
    for age, path in zip((300, 200, 100), big, strict=True):
        path.write_bytes(b"x" * 600_000)
        os.utime(path, (now - age, now - age))
    removed = evidence.prune()
    assert sorted(p.name for p in removed) == sorted([ancient.name, big[0].name, big[1].name])
    assert [p.name for p in evidence.bundles()] == [big[2].name]
    # A crash's partial bundle is removed before the next one is written.
    (directory / ".partial-crashed").mkdir()
    await evidence.collect(failing_node(), BUS0, "escalated", "reset did not help")
    assert not (directory / ".partial-crashed").exists()


@pytest.mark.parametrize(
    ("found", "trigger"),
    [
        pytest.param(REMAP_FAILED, "row_remap_failure", id="row-remap-failure"),
        pytest.param(
            finding("row_remap", WARN, "row remap pending", action="reset_gpu"),
            None,
            id="row-remap-pending",
        ),
        pytest.param(
            finding(
                "retired_pages",
                WARN,
                "pages pending retirement; reset required; 61 retired pages",
                action="reset_gpu",
                evidence=(
                    ("retired_pages_sbe", 1),
                    ("retired_pages_dbe", 60),
                    ("retired_pages_pending", True),
                    ("retired_pages_limit", 60),
                ),
            ),
            "retired_page_limit",
            id="retired-pages-at-limit-whatever-leads",
        ),
        pytest.param(
            finding(
                "retired_pages",
                WARN,
                "pages pending retirement",
                action="reset_gpu",
                evidence=(("retired_pages_dbe", 3), ("retired_pages_limit", 60)),
            ),
            None,
            id="retired-pages-below-limit",
        ),
        pytest.param(DBE, None, id="dbe-alone"),
        pytest.param(
            dataclasses.replace(REMAP_FAILED, gpu=None), None, id="node-finding-has-no-gpu"
        ),
    ],
)
def test_which_findings_call_for_a_bundle(found: object, trigger: str | None) -> None:
    assert rma_trigger(found) == trigger  # type: ignore[arg-type]


async def _settle(h: Harness) -> None:
    """Wait for background bundles to finish."""
    for _ in range(200):
        if not h.executor._collecting:
            return
        await asyncio.sleep(0.02)
    raise AssertionError("evidence still being collected")


def with_evidence(tmp_path: Path, mode: Literal["observe", "enforce"] = "enforce") -> Harness:
    h = Harness(tmp_path, dataclasses.replace(enforce(), mode=mode))
    h.executor.evidence = collector(tmp_path, bug_report_command="")
    return h


async def test_remediation_collects_one_bundle_per_gpu_in_observe_mode_too(
    tmp_path: Path,
) -> None:
    h = with_evidence(tmp_path, mode="observe")
    failing = failing_node()
    for _ in range(3):
        await h.cycle(failing)
        await _settle(h)
    assert h.results("evidence") == ["started", "succeeded"]
    record = h.executor.audit.last("evidence", BUS0, ("succeeded",))
    assert record is not None
    assert record.reason == REMAP_FAILED.reason
    assert record.evidence["params"] == {"trigger": "row_remap_failure"}
    assert str(tmp_path / "evidence") in record.detail
    assert len(h.executor.evidence.bundles()) == 1  # type: ignore[union-attr]
    # A restart does not collect it again: the trail says it is there.
    h.executor = h.make()
    h.executor.evidence = collector(tmp_path, bug_report_command="")
    await h.cycle(failing)
    await _settle(h)
    assert h.results("evidence") == ["started", "succeeded"]


async def test_an_escalated_reset_collects_a_bundle(tmp_path: Path) -> None:
    h = Harness(tmp_path, enforce(), ops=Ops(fail_reset=True))
    h.executor.evidence = collector(tmp_path, bug_report_command="")
    await h.cycle(IDLE)
    await _settle(h)
    assert h.results("reset_gpu") == ["started", "failed", "escalated"]
    assert h.results("evidence") == ["started", "succeeded"]
    record = h.executor.audit.last("evidence", BUS0, ("succeeded",))
    assert record is not None
    assert record.evidence["params"] == {"trigger": "escalated"}
    assert record.reason.startswith("reset escalated: reset failed")


async def test_a_bundle_that_cannot_be_written_is_audited_and_tried_again_later(
    tmp_path: Path,
) -> None:
    h = with_evidence(tmp_path)
    (tmp_path / "evidence").write_text("a file where the directory should be")
    await h.cycle(failing_node())
    await _settle(h)
    assert h.results("evidence") == ["started", "failed"]
    assert "cannot write the bundle" in h.executor.audit.last("evidence", BUS0, ("failed",)).detail  # type: ignore[union-attr]
    await h.cycle(failing_node(), advance=60.0)
    await _settle(h)
    assert h.results("evidence") == ["started", "failed"]  # not every poll
    (tmp_path / "evidence").unlink()
    await h.cycle(failing_node(), advance=3600.0)
    await _settle(h)
    assert h.results("evidence") == ["started", "failed", "started", "succeeded"]


async def test_stopping_the_agent_stops_a_bundle_and_says_so(tmp_path: Path) -> None:
    h = with_evidence(tmp_path)
    h.executor.evidence = collector(tmp_path, bug_report_command=fake_bug_report(tmp_path, "hang"))
    await h.cycle(failing_node())
    for _ in range(100):
        if h.results("evidence") == ["started"]:
            break
        await asyncio.sleep(0.02)
    await h.executor.close()
    assert h.results("evidence") == ["started", "failed"]
    record = h.executor.audit.last("evidence", BUS0, ("failed",))
    assert record is not None
    assert record.detail == "stopped with the agent"
