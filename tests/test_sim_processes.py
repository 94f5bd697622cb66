"""The simulator's processes: owners, a process gone from the process table, a hung
process, memory held with no process, and the /proc-like tree the agent reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pynvml
import pytest

from gpuagent.sim import SimulatedNode

MIB = 1024 * 1024


def handle(index: int) -> Any:
    return pynvml.nvmlDeviceGetHandleByIndex(index)


def used_bytes(index: int) -> int:
    memory = pynvml.nvmlDeviceGetMemoryInfo(handle(index), version=pynvml.nvmlMemory_v2)
    return int(memory.used)


def utilization(index: int) -> int:
    return int(pynvml.nvmlDeviceGetUtilizationRates(handle(index)).gpu)


def pids(index: int) -> list[int]:
    return [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle(index))]


def test_the_process_table_lists_running_processes_with_their_owner(
    node: SimulatedNode, tmp_path: Path
) -> None:
    node.inject("process", 0, {"pid": 4242, "name": "/opt/venv/bin/train.py", "used_mib": 10})
    node.serve_host_files(tmp_path)
    tmp_path /= "proc"
    node.inject("process", 1, {"pid": 77, "name": "eval", "used_mib": 10, "uid": 1234})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["4242", "77"]
    # comm holds the base name, cut to the kernel's 15 bytes.
    assert (tmp_path / "4242" / "comm").read_text() == "train.py\n"
    status = (tmp_path / "77" / "status").read_text()
    assert "Name:\teval\n" in status
    assert "Uid:\t1234\t1234\t1234\t1234\n" in status
    assert "Uid:\t0\t" in (tmp_path / "4242" / "status").read_text()
    node.inject("process_exit", 0, {"pid": 4242})
    assert [p.name for p in tmp_path.iterdir()] == ["77"]
    node.inject("clear", 1, {})
    assert list(tmp_path.iterdir()) == []


def test_a_gone_process_leaves_the_table_but_not_nvml(node: SimulatedNode, tmp_path: Path) -> None:
    node.serve_host_files(tmp_path)
    tmp_path /= "proc"
    node.inject("process", 2, {"pid": 31, "name": "job", "used_mib": 2048})
    node.inject("process_gone", 2, {"pid": 31})
    node.inject("process_gone", 2, {"pid": 99})  # not running: nothing happens
    assert not (tmp_path / "31").exists()
    assert pids(2) == [31]
    assert used_bytes(2) == 2048 * MIB
    assert utilization(2) >= 80  # still running as far as the GPU can tell
    node.inject("process_exit", 2, {"pid": 31})
    assert pids(2) == []


def test_a_hung_process_holds_its_memory_at_zero_utilization(node: SimulatedNode) -> None:
    node.inject("process", 3, {"pid": 40, "name": "stuck", "used_mib": 4096})
    node.inject("process", 4, {"pid": 41, "name": "stuck", "used_mib": 4096})
    node.inject("process", 4, {"pid": 42, "name": "working", "used_mib": 4096})
    assert utilization(3) >= 80
    node.inject("hung", 3, {"pid": 40})
    node.inject("hung", 4, {"pid": 41})
    node.inject("hung", 4, {"pid": 99})  # not running: nothing happens
    assert utilization(3) == 0
    assert pids(3) == [40]
    assert used_bytes(3) == 4096 * MIB
    # Not idle: the process keeps the clocks up, as a real context does.
    reasons = pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle(3))
    assert not reasons & pynvml.nvmlClocksEventReasonGpuIdle
    assert utilization(4) >= 80  # the other process on that GPU still works


def test_leaked_memory_is_held_with_no_process_until_a_reset(node: SimulatedNode) -> None:
    node.inject("memory_leak", 5, {"used_mib": 30000})
    node.inject("memory_leak", 5, {"used_mib": 1000})
    assert used_bytes(5) == 31000 * MIB
    assert pids(5) == []
    assert utilization(5) == 0
    node.reset_gpu(5)
    assert used_bytes(5) == 0
    node.inject("memory_leak", 5, {"used_mib": 10})
    node.inject("clear", 5, {})
    assert used_bytes(5) == 0


@pytest.mark.parametrize(
    ("kind", "params", "message"),
    [
        ("memory_leak", {"used_mib": 90000}, "used_mib: must be at most 81008"),
        ("memory_leak", {}, "used_mib: required"),
        ("process", {"pid": 1, "name": "a", "used_mib": 1, "uid": -1}, "uid: must be at least 0"),
        ("hung", {}, "pid: required"),
        ("process_gone", {"pid": 0}, "pid: must be at least 1"),
    ],
)
def test_invalid_process_faults_are_refused(
    node: SimulatedNode, kind: str, params: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        node.inject(kind, 0, params)
