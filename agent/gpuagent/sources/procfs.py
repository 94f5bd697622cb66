"""What procfs says about the processes NVML lists: whether each still exists, its owner.

Read on the GPU's NVML worker thread, right after the process list, so the check that
judges them stays pure and the event loop never touches the filesystem for it.

NVML reports PIDs in the host's PID namespace. An agent running in a container without
the host's PID namespace sees none of them in its own /proc, so every process would look
gone: run it under systemd on the host, share the host's PID namespace (hostPID), or mount
the host's /proc and point `sources.nvml.proc_root` there.
"""

from __future__ import annotations

import pwd
from dataclasses import replace
from pathlib import Path

from gpuagent.model import GpuProcess, GpuReadings
from gpuagent.sources.pcie import read_stripped


class ProcessTable:
    """Looks processes up under ``root`` (/proc, or a tree laid out like it)."""

    def __init__(self, root: Path, *, slurm: bool = False) -> None:
        self.root = root
        # Read each process's cgroup for its Slurm job: only with attribution.slurm on, so
        # attribution off costs not one more read.
        self.slurm = slurm
        self._users: dict[int, str] = {}

    def describe(self, process: GpuProcess) -> GpuProcess:
        """``process`` with ``alive``, ``user`` (and with Slurm on ``job``) filled in, and
        its name where NVML and the host gave none ("pid N")."""
        entry = self.root / str(process.pid)
        status = read_stripped(entry / "status")
        if status is None:
            # Either the PID has no entry (gone) or it vanished between the two reads;
            # only a missing directory says gone, an unreadable one says nothing.
            return replace(process, alive=False if not entry.exists() else None)
        fields = _status_fields(status)
        name = process.name
        if name == f"pid {process.pid}":
            name = (read_stripped(entry / "comm") or fields.get("Name", "")).strip() or name
        job = self._job(entry) if self.slurm else None
        return replace(process, name=name, alive=True, user=self._user(fields.get("Uid")), job=job)

    def _job(self, entry: Path) -> str | None:
        from gpuagent.attribution.slurm import parse_cgroup  # noqa: PLC0415 - Slurm nodes only

        cgroup = read_stripped(entry / "cgroup")
        step = parse_cgroup(cgroup) if cgroup is not None else None
        return step.job if step is not None else None

    def describe_all(self, readings: GpuReadings) -> GpuReadings:
        """``readings`` with every compute and graphics process described."""
        if not readings.processes and not readings.graphics_processes:
            return readings
        return replace(
            readings,
            processes=tuple(self.describe(p) for p in readings.processes),
            graphics_processes=tuple(self.describe(p) for p in readings.graphics_processes),
        )

    def _user(self, uid_line: str | None) -> str | None:
        # "Uid:\t<real>\t<effective>\t<saved>\t<fs>": the real uid owns the process.
        parts = (uid_line or "").split()
        if not parts or not parts[0].isdigit():
            return None
        uid = int(parts[0])
        # Cached: the name may come from a directory service (NSS: LDAP, sssd), which is
        # asked once per uid rather than on every poll of the GPU's worker.
        if uid not in self._users:
            try:
                self._users[uid] = pwd.getpwuid(uid).pw_name
            except KeyError:  # a uid with no passwd entry (a container's, a deleted user)
                self._users[uid] = f"uid {uid}"
        return self._users[uid]


def _status_fields(text: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key] = value.strip()
    return fields
