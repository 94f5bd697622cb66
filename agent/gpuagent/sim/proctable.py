"""The simulated node's process table: a small tree laid out like /proc.

Simulated PIDs do not exist on the machine running the simulator, so the agent, which
looks each GPU process up in procfs (`sources.nvml.proc_root`), is pointed at this tree
instead: one ``<pid>/status`` (Name, Uid), ``<pid>/comm`` and ``<pid>/cgroup`` (a Slurm
job's where the process has one) per running simulated process. A process a
`process_gone` fault took out of the table has no entry, although NVML still lists it.
Written under the node lock whenever a fault changes processes.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path

from gpuagent.sim.files import replace_text
from gpuagent.sim.gpu import SimGpu, SimProcess

# /proc/<pid>/comm holds at most this many bytes of the name (TASK_COMM_LEN - 1).
_COMM_LENGTH = 15


def write_process_table(root: Path, gpus: Iterable[SimGpu]) -> None:
    """Make ``root`` list exactly the live processes of ``gpus``."""
    live: dict[int, SimProcess] = {}
    for gpu in gpus:
        live.update({pid: p for pid, p in gpu.processes.items() if p.alive})
    root.mkdir(parents=True, exist_ok=True)
    for entry in root.iterdir():
        if entry.name.isdigit() and int(entry.name) not in live:
            shutil.rmtree(entry, ignore_errors=True)
    for pid, process in live.items():
        entry = root / str(pid)
        entry.mkdir(exist_ok=True)
        comm = process.name.rsplit("/", 1)[-1][:_COMM_LENGTH]
        uid = process.uid
        replace_text(entry / "comm", f"{comm}\n")
        replace_text(
            entry / "status", f"Name:\t{comm}\nPid:\t{pid}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n"
        )
        replace_text(entry / "cgroup", _cgroup(process))


def _cgroup(process: SimProcess) -> str:
    """A cgroup v2 /proc/<pid>/cgroup: slurmstepd's layout for a job's step, else a login
    session's."""
    if process.job:
        return f"0::/system.slice/slurmstepd.scope/job_{process.job}/step_0/user/task_0\n"
    return f"0::/user.slice/user-{process.uid}.slice/session-1.scope\n"
