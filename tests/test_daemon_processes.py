"""Integration: memory held with no process, processes gone from /proc and a hung job, from
a simulator fault to the finding, its metrics and `gpuagent status`, in the real daemon."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from conftest import DaemonProcess

pytestmark = pytest.mark.integration

Run = Callable[..., DaemonProcess]
NODE = '[node]\ngpus = 3\nmodel = "NVIDIA H100 80GB HBM3"\n'
# Hold times short enough for a test; the rules are the defaults' otherwise.
QUICK = "[checks.processes]\nleak_seconds = 1.0\ngone_seconds = 0.5\nhung_seconds = 2.0\n"
MIB = 1024 * 1024


def _processes(doc: dict[str, Any], index: int) -> dict[str, Any] | None:
    gpu = next(g for g in doc["gpus"] if g["index"] == index)
    return next((f for f in gpu["findings"] if f["check"] == "processes"), None)


def _runbook(index: int, runbook: str) -> Callable[[dict[str, Any]], bool]:
    def fired(doc: dict[str, Any]) -> bool:
        found = _processes(doc, index)
        return found is not None and found["runbook"] == runbook

    return fired


def test_held_memory_gone_pids_and_a_hung_job_end_to_end(run_daemon: Run) -> None:
    daemon = run_daemon(NODE, config_extra=QUICK)
    # Healthy first: a running job, and idle GPUs, are no finding.
    daemon.inject("process", 1, pid=4242, name="train.py", used_mib=2048, uid=0)
    daemon.inject("process", 2, pid=5151, name="/usr/bin/python3", used_mib=8192, uid=0)
    doc = daemon.wait_for(lambda d: all(g["processes"] for g in d["gpus"][1:]), timeout=15)
    assert [_processes(doc, i) for i in range(3)] == [None, None, None]
    assert daemon.metric("gpuagent_gpu_processes_gone", gpu="1") == 0.0

    # GPU 0: 30000 MiB held by no process (a leaked context).
    daemon.inject("memory_leak", 0, used_mib=30000)
    # GPU 1: the job's PID leaves the process table while NVML still lists it.
    daemon.inject("process_gone", 1, pid=4242)
    # GPU 2: the job stops making progress, holding its memory.
    daemon.inject("hung", 2, pid=5151)

    doc = daemon.wait_for(_runbook(0, "gpu-memory-held"), timeout=20)
    held = _processes(doc, 0)
    assert held is not None
    assert (held["severity"], held["action"]) == ("WARN", "investigate")
    assert held["reason"].startswith("30000 MiB of GPU memory held with no process for ")

    doc = daemon.wait_for(_runbook(1, "gpu-process-gone"), timeout=20)
    gone = _processes(doc, 1)
    assert gone is not None
    assert gone["reason"] == (
        "1 process NVML lists no longer in /proc: 4242 train.py (owner unknown, 2048 MiB)"
    )
    assert gone["evidence"]["gone_pids"] == "4242"

    doc = daemon.wait_for(_runbook(2, "gpu-process-hung"), timeout=20)
    hung = _processes(doc, 2)
    assert hung is not None
    # The owner comes from the simulator's process table (uid 0), the name from NVML.
    assert hung["reason"].endswith("on the GPU (hung?): 5151 /usr/bin/python3 (root, 8192 MiB)")
    assert hung["action"] == "restart_app"
    assert next(g for g in doc["gpus"] if g["index"] == 2)["utilization_gpu_pct"] == 0

    # Metrics: the health gauge per check, and the two values an alert is built on.
    for gpu in ("0", "1", "2"):
        assert daemon.metric("gpuagent_gpu_health", gpu=gpu, check="processes") == 1.0
    assert daemon.metric("gpuagent_gpu_memory_unattributed_bytes", gpu="0") == 30000 * MIB
    assert daemon.metric("gpuagent_gpu_processes", gpu="0") == 0.0
    assert daemon.metric("gpuagent_gpu_processes_gone", gpu="1") == 1.0

    # `gpuagent status`: each GPU's row leads with its finding.
    table = daemon.cli("status", "--socket", str(daemon.socket)).stdout
    assert "memory held with no process" in table
    assert "no longer in /proc" in table
    assert "hung?" in table

    # WARN only: nothing was planned or done about any of them.
    remediation = daemon.status().get("remediation") or {}
    assert not remediation.get("counts")

    # The job ends: the driver lets go of it, and the GPU is healthy again.
    daemon.inject("process_exit", 1, pid=4242)
    daemon.wait_for(lambda d: _processes(d, 1) is None, timeout=20)
