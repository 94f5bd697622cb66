"""The ``processes`` check: memory held with no process, PIDs gone from /proc, hung jobs."""

from __future__ import annotations

from typing import Any

import pytest

from gpuagent.config import ProcessesCheck
from gpuagent.model import GpuProcess, Severity
from gpuagent.remediation.planner import plan
from gpuagent.remediation.types import History
from test_checks_support import check_once, check_series, finding, gpu, run, with_checks
from test_remediation_planner import config as remediation_config
from test_remediation_planner import snapshot as node_snapshot

TRAIN = GpuProcess(4242, "train.py", 20480.0, alive=True, user="alice")
GONE = GpuProcess(5151, "pid 5151", 2048.0, alive=False)
# What an idle H100 reports: its reserved share apart, a little in use, no process.
IDLE: dict[str, Any] = {"fb_used_mib": 0.0, "fb_reserved_mib": 551.0, "utilization_gpu_pct": 0}
LEAKED: dict[str, Any] = {**IDLE, "fb_used_mib": 30000.0}
BUSY: dict[str, Any] = {"fb_used_mib": 20480.0, "processes": (TRAIN,), "utilization_gpu_pct": 93}
STALLED: dict[str, Any] = {**BUSY, "utilization_gpu_pct": 0}


def _series(readings: dict[str, Any], *times: float, **config: Any) -> list[Severity]:
    checks = with_checks(processes=ProcessesCheck(**config))
    return [f.severity for f in check_series("processes", [(t, readings) for t in times], checks)]


def test_idle_gpu_and_busy_gpu_are_ok_for_hours() -> None:
    assert _series(IDLE, 0, 60, 3600, 36000) == [Severity.OK] * 4
    assert _series(BUSY, 0, 60, 3600, 36000) == [Severity.OK] * 4


def test_memory_held_with_no_process_is_warn_after_the_hold_time() -> None:
    assert _series(LEAKED, 0, 30, 59, 60, 600) == [Severity.OK] * 3 + [Severity.WARN] * 2
    finding = check_series("processes", [(0, LEAKED), (90, LEAKED)])[-1]
    assert finding.reason == (
        "30000 MiB of GPU memory held with no process for 90 s "
        "(a leaked context or a zombie process)"
    )
    assert (finding.action, finding.runbook) == ("investigate", "gpu-memory-held")
    evidence = finding.evidence_dict()
    assert evidence["unattributed_mib"] == 30000.0
    assert evidence["memory_held_seconds"] == 90


def test_one_capture_never_shows_memory_held() -> None:
    assert check_once("processes", **LEAKED).severity is Severity.OK


def test_memory_below_the_threshold_is_an_idle_gpu() -> None:
    small = {**IDLE, "fb_used_mib": 600.0}
    assert _series(small, 0, 3600) == [Severity.OK] * 2
    assert _series(small, 0, 3600, leak_threshold_mib=512) == [Severity.OK, Severity.WARN]


def test_a_process_or_a_display_server_ends_the_hold() -> None:
    xorg = GpuProcess(1800, "Xorg", 2000.0, alive=True, user="root")
    steps = [(0.0, LEAKED), (50.0, {**LEAKED, "graphics_processes": (xorg,)}), (100.0, LEAKED)]
    assert [f.severity for f in check_series("processes", steps)] == [Severity.OK] * 3
    steps = [(0.0, LEAKED), (50.0, BUSY), (100.0, LEAKED), (170.0, LEAKED)]
    assert [f.severity for f in check_series("processes", steps)] == [Severity.OK] * 3 + [
        Severity.WARN
    ]


def test_a_poll_without_memory_figures_ends_the_hold() -> None:
    steps: list[tuple[float, dict[str, Any]]] = [(0.0, LEAKED), (50.0, {}), (100.0, LEAKED)]
    assert check_series("processes", steps)[-1].severity is Severity.OK


def test_a_poll_the_gpu_did_not_answer_ends_every_hold() -> None:
    checks = with_checks(processes=ProcessesCheck(leak_seconds=60, hung_seconds=60))
    memory = None
    for now, state in [(0.0, gpu(**LEAKED)), (30.0, gpu("timeout")), (70.0, gpu(**LEAKED))]:
        health, memory = run(state, config=checks, memory=memory, now=now)
    assert finding(health, "processes").severity is Severity.OK
    memory = None
    for now, state in [(0.0, gpu(**STALLED)), (30.0, gpu("timeout")), (70.0, gpu(**STALLED))]:
        health, memory = run(state, config=checks, memory=memory, now=now)
    assert finding(health, "processes").severity is Severity.OK


def test_a_pid_missing_from_proc_is_warn_naming_it() -> None:
    readings = {**BUSY, "processes": (TRAIN, GONE)}
    assert _series(readings, 0, 29, 30) == [Severity.OK, Severity.OK, Severity.WARN]
    finding = check_series("processes", [(0, readings), (30, readings)])[-1]
    assert finding.reason == (
        "1 process NVML lists no longer in /proc: 5151 (owner unknown, 2048 MiB)"
    )
    assert finding.runbook == "gpu-process-gone"
    assert finding.evidence_dict()["gone_pids"] == "5151"


def test_a_pid_that_comes_back_or_was_not_looked_up_is_not_gone() -> None:
    unknown = GpuProcess(5151, "pid 5151", 2048.0)  # a replayed capture: no procfs facts
    assert _series({**BUSY, "processes": (unknown,)}, 0, 3600) == [Severity.OK] * 2
    steps = [
        (0.0, {**BUSY, "processes": (GONE,)}),
        (20.0, {**BUSY, "processes": (TRAIN,)}),
        (40.0, {**BUSY, "processes": (GONE,)}),
    ]
    assert check_series("processes", steps)[-1].severity is Severity.OK


def test_processes_at_zero_utilization_for_the_window_are_hung() -> None:
    assert _series(STALLED, 0, 1799, 1800) == [Severity.OK, Severity.OK, Severity.WARN]
    finding = check_series("processes", [(0, STALLED), (1800, STALLED)])[-1]
    assert finding.reason == (
        "utilization at or below 1% for 1800 s with 1 process on the GPU (hung?): "
        "4242 train.py (alice, 20480 MiB)"
    )
    assert (finding.action, finding.runbook) == ("restart_app", "gpu-process-hung")
    assert finding.evidence_dict()["process_list"] == "4242 train.py (alice, 20480 MiB)"


def test_any_busy_poll_restarts_the_hung_window() -> None:
    steps = [(0.0, STALLED), (1000.0, BUSY), (1001.0, STALLED), (2000.0, STALLED)]
    assert check_series("processes", steps)[-1].severity is Severity.OK


def test_a_new_job_starts_its_own_window() -> None:
    other = GpuProcess(7, "eval.py", 100.0, alive=True, user="bob")
    steps = [
        (0.0, STALLED),
        (1000.0, {**STALLED, "processes": (TRAIN, other)}),
        (1900.0, {**STALLED, "processes": (TRAIN, other)}),
    ]
    assert check_series("processes", steps)[-1].severity is Severity.OK
    # A process leaving does not: the one left has been idle all along.
    steps = [(0.0, {**STALLED, "processes": (TRAIN, other)}), (1800.0, STALLED)]
    assert check_series("processes", steps)[-1].severity is Severity.WARN


def test_mig_gpu_without_utilization_is_never_hung() -> None:
    mig = {**STALLED, "utilization_gpu_pct": None, "mig_mode_current": True}
    assert _series(mig, 0, 36000) == [Severity.OK] * 2


def test_thresholds_come_from_config() -> None:
    slow = {**BUSY, "utilization_gpu_pct": 4}
    assert _series(slow, 0, 1800) == [Severity.OK] * 2
    assert _series(slow, 0, 60, hung_utilization_pct=5, hung_seconds=60) == [
        Severity.OK,
        Severity.WARN,
    ]


def test_switched_off_it_reports_nothing() -> None:
    health, _ = run(gpu(**LEAKED), config=with_checks(processes=ProcessesCheck(enabled=False)))
    assert not [f for f in health.findings if f.check == "processes"]


@pytest.mark.parametrize("readings", [LEAKED, STALLED, {**BUSY, "processes": (GONE,)}])
def test_the_default_rules_never_act_on_it(readings: dict[str, Any]) -> None:
    checks = with_checks(processes=ProcessesCheck(leak_seconds=0, gone_seconds=0, hung_seconds=0))
    found = check_series("processes", [(0, readings)], checks)[0]
    assert found.severity is Severity.WARN
    # With every backend configured, so a cordon or a reset could be planned if a rule
    # matched: none does.
    remediation = remediation_config(backends=("slurm", "kubernetes", "command"))
    assert plan(node_snapshot(found), History(), 0.0, remediation) == ()
