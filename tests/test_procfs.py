"""procfs facts about GPU processes (owner, still there), and the NVML source carrying
them in its readings, looked up on the GPU's worker."""

from __future__ import annotations

import os
import pwd
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import FakeClock
from gpuagent.config import NvmlSourceSection
from gpuagent.model import GpuProcess, GpuReadings
from gpuagent.sim import SimulatedNode, parse_scenario
from gpuagent.sources.nvml import NvmlSource
from gpuagent.sources.procfs import ProcessTable

# A uid no passwd file names (the highest valid one, below the "no uid" value).
UNNAMED_UID = 4294967294


def _entry(root: Path, pid: int, *, uid: int | None = 0, comm: str | None = "python3") -> None:
    entry = root / str(pid)
    entry.mkdir()
    if uid is not None:
        (entry / "status").write_text(f"Name:\tpython3\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
    if comm is not None:
        (entry / "comm").write_text(f"{comm}\n")


def test_a_running_process_gets_its_owner(tmp_path: Path) -> None:
    _entry(tmp_path, 10, uid=0)
    _entry(tmp_path, 11, uid=UNNAMED_UID)
    table = ProcessTable(tmp_path)
    root = table.describe(GpuProcess(10, "train.py", 512.0))
    assert (root.name, root.alive, root.user, root.used_mib) == ("train.py", True, "root", 512.0)
    assert table.describe(GpuProcess(11, "x", None)).user == f"uid {UNNAMED_UID}"


def test_a_process_without_an_entry_is_gone(tmp_path: Path) -> None:
    gone = ProcessTable(tmp_path).describe(GpuProcess(12, "pid 12", 2048.0))
    assert (gone.alive, gone.user, gone.name) == (False, None, "pid 12")


def test_an_entry_that_cannot_be_read_is_not_called_gone(tmp_path: Path) -> None:
    _entry(tmp_path, 13, uid=None)  # no status file: nothing is known
    described = ProcessTable(tmp_path).describe(GpuProcess(13, "job", 1.0))
    assert (described.alive, described.user) == (None, None)


def test_a_process_nvml_could_not_name_is_named_from_comm(tmp_path: Path) -> None:
    _entry(tmp_path, 14, comm="worker-7")
    _entry(tmp_path, 15, comm=None)
    table = ProcessTable(tmp_path)
    assert table.describe(GpuProcess(14, "pid 14", 1.0)).name == "worker-7"
    assert table.describe(GpuProcess(15, "pid 15", 1.0)).name == "python3"  # status Name


def test_the_host_proc_describes_this_very_process() -> None:
    me = ProcessTable(Path("/proc")).describe(GpuProcess(os.getpid(), "pytest", None))
    assert (me.alive, me.user) == (True, pwd.getpwuid(os.getuid()).pw_name)


def test_readings_without_processes_are_left_alone(tmp_path: Path) -> None:
    readings = GpuReadings(fb_used_mib=0.0)
    assert ProcessTable(tmp_path).describe_all(readings) is readings


@pytest.fixture
def node() -> Iterator[SimulatedNode]:
    with SimulatedNode(parse_scenario('[node]\ngpus = 2\nmodel = "NVIDIA H100 80GB HBM3"\n')) as n:
        yield n


async def test_the_nvml_source_carries_owner_and_presence(
    node: SimulatedNode, tmp_path: Path
) -> None:
    node.serve_host_files(tmp_path)
    node.inject("process", 0, {"pid": 4242, "name": "train.py", "used_mib": 1024, "uid": 0})
    node.inject("process", 1, {"pid": 5151, "name": "eval.py", "used_mib": 512})
    node.inject("process_gone", 1, {"pid": 5151})
    source = NvmlSource(
        NvmlSourceSection(),
        process_name=node.process_name,
        process_table=ProcessTable(tmp_path / "proc"),
        clock=FakeClock(),
    )
    try:
        observation = await source.poll()
    finally:
        await source.close()
    readings = [gpu.readings for gpu in observation.gpus]
    assert readings[0] is not None
    assert readings[1] is not None
    assert readings[0].processes == (GpuProcess(4242, "train.py", 1024.0, alive=True, user="root"),)
    assert readings[1].processes == (GpuProcess(5151, "eval.py", 512.0, alive=False),)


async def test_held_memory_with_no_compute_process_asks_for_graphics_processes(
    node: SimulatedNode,
) -> None:
    node.inject("memory_leak", 0, {"used_mib": 3000})
    source = NvmlSource(NvmlSourceSection(), process_name=node.process_name, clock=FakeClock())
    try:
        observation = await source.poll()
    finally:
        await source.close()
    # The simulated GPUs run no display server: none listed, and only GPU 0 was asked.
    readings = observation.gpus[0].readings
    assert readings is not None
    assert (readings.fb_used_mib, readings.graphics_processes) == (3000.0, ())
    assert node.call_counts()["nvmlDeviceGetGraphicsRunningProcesses_v3"] == 1
