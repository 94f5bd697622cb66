"""A real single-node Slurm cluster on loopback, for the Slurm cordon backend's tests.

munged, slurmctld and slurmd from Debian's packages run in the foreground as children of
the test process, with a key, a socket, a slurm.conf, state and logs of their own in a
temporary directory and free ports on 127.0.0.1, so they neither need nor touch a Slurm
or munge installation of the machine. By default nothing uses cgroups (tests may run in a
container); ``start_cluster(..., proctrack="cgroup")`` has slurmd put jobs in cgroups v1.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from conftest import deadline_in, free_port, require

PROGRAMS = ("munged", "slurmctld", "slurmd", "scontrol", "sinfo")
PACKAGES = "slurmctld slurmd slurm-client munge"
NODE = "gpuagent-test-node"
STARTUP_SECONDS = 30.0
# Where the host mounts its cgroup hierarchies (one directory per v1 controller).
CGROUP_ROOT = Path("/sys/fs/cgroup")


def require_programs() -> None:
    """Every program the cluster runs: one missing skips the test, or fails it under CI."""
    for name in PROGRAMS:
        _program(name)


def _program(name: str) -> str:
    # The daemons live in sbin, which is not on every user's PATH: require looks there too.
    return require(name, f"the Slurm test cluster (Debian packages {PACKAGES}; scripts/test)")


@dataclass
class SlurmCluster:
    root: Path
    node: str
    conf: Path
    munge_socket: Path
    # "cgroup": slurmd creates cgroups for the jobs' processes, which stop() removes.
    proctrack: str = "linuxproc"
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    # slurmd's spool holds each step's Unix socket, whose path may not pass 108 bytes:
    # a short directory of its own, not one under a test's (long) temporary path.
    spool: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="slurmd-")))

    @property
    def env(self) -> dict[str, str]:
        """What a Slurm client needs to talk to this cluster (on top of os.environ)."""
        return {"SLURM_CONF": str(self.conf)}

    def run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        """A Slurm client command against this cluster (``scontrol ...``, ``sinfo ...``)."""
        return subprocess.run(
            [_program(argv[0]), *argv[1:]],
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            check=False,
            timeout=20,
        )

    def scontrol(self, *args: str) -> str:
        result = self.run("scontrol", *args)
        if result.returncode != 0:
            raise AssertionError(f"scontrol {' '.join(args)}: {result.stderr}{result.stdout}")
        return result.stdout

    def sinfo(self) -> tuple[str, str]:
        """(state, reason) of the node as sinfo shows them, e.g. ("drained", "gpuagent: x")."""
        result = self.run("sinfo", "--noheader", "--nodes", self.node, "--format", "%T|%E")
        state, _, reason = result.stdout.strip().partition("|")
        return state, "" if reason == "none" else reason  # sinfo's word for no reason

    def node_line(self) -> str:
        return self.scontrol("show", "node", self.node, "--oneliner")

    def wait_for(self, predicate: Callable[[tuple[str, str]], bool], timeout: float = 15.0) -> None:
        """Poll sinfo until ``predicate((state, reason))`` holds."""
        deadline = deadline_in(timeout)
        while not predicate(seen := self.sinfo()):
            if time.monotonic() > deadline:
                raise AssertionError(f"node {self.node} is {seen} after {timeout} s")
            time.sleep(0.1)

    def reset(self) -> None:
        """Back to idle and undrained, whoever drained it (between tests)."""
        line = self.node_line()
        if "DRAIN" in line or "DOWN" in line:
            self.scontrol("update", f"NodeName={self.node}", "State=RESUME")
        self.wait_for(lambda seen: seen[0] == "idle")

    def logs(self) -> str:
        return "\n".join(
            f"--- {path.name}\n{path.read_text(errors='replace')[-3000:]}"
            for path in sorted((self.root / "log").glob("*"))
        )

    def cgroups(self) -> list[Path]:
        """The cgroup v1 trees slurmd made for this node's jobs: ``slurm_<node>`` in each
        hierarchy proctrack/cgroup uses (Debian's slurmd names its root after the node)."""
        return sorted(CGROUP_ROOT.glob(f"*/slurm_{self.node}"))

    def job_cgroups(self, job: str = "*") -> list[Path]:
        """The cgroups of job ``job`` (of every job by default): ``slurm_<node>/uid_<uid>/
        job_<id>`` in each tree; slurmd removes them when the job ends."""
        return [path for tree in self.cgroups() for path in tree.glob(f"uid_*/job_{job}")]

    def stop(self) -> None:
        """Stop the daemons, newest first (slurmd, slurmctld, munged), and reap them; with
        proctrack/cgroup, end the jobs first and remove the cgroups slurmd made."""
        if self.proctrack == "cgroup" and self.processes:
            self._end_jobs()
        for process in reversed(self.processes):
            _stop(process)
        self.processes.clear()
        if self.proctrack == "cgroup":
            _remove_cgroups(self.cgroups())
        shutil.rmtree(self.spool, ignore_errors=True)

    def _end_jobs(self) -> None:
        # A job's slurmstepd and tasks outlive slurmd (they are not in its process group):
        # cancel every job and let slurmd clean each one up while it still runs. squeue
        # lists a job until slurmd reports it done, including one still being launched.
        if jobs := self._jobs():
            self.run("scancel", *jobs)
        deadline = deadline_in(15)
        while self._jobs() or self.job_cgroups():
            if time.monotonic() > deadline:
                break  # _remove_cgroups kills what is left
            time.sleep(0.1)

    def _jobs(self) -> list[str]:
        """The ids of the jobs slurmctld has not seen end (none if it does not answer)."""
        return self.run("squeue", "--noheader", "--format=%i").stdout.split()


def _stop(process: subprocess.Popen[bytes]) -> None:
    # Each daemon leads a process group of its own: the group goes, helpers included.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def _remove_cgroups(trees: list[Path]) -> None:
    """Kill any process left in ``trees`` and remove their cgroups, deepest first."""
    for tree in trees:
        directories = sorted((d for d in tree.rglob("*") if d.is_dir()), reverse=True)
        for directory in [*directories, tree]:
            deadline = deadline_in(10)
            while pids := (directory / "cgroup.procs").read_text().split():
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)
                if time.monotonic() > deadline:
                    raise AssertionError(f"processes {pids} outlived SIGKILL in {directory}")
                time.sleep(0.05)
            directory.rmdir()


def start_cluster(root: Path, node: str = NODE, *, proctrack: str = "linuxproc") -> SlurmCluster:
    """Start munged, slurmctld and slurmd under ``root``; return once the node is idle.

    ``proctrack="cgroup"`` tracks jobs with proctrack/cgroup (see _write_cgroup_conf): each
    step's processes then run in cgroups slurmd creates, which needs root and the host's
    cgroup hierarchies. The default uses no cgroups."""
    for sub in ("munge", "state", "log"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    # munged wants its socket's directory searchable by everyone.
    (root / "munge").chmod(0o755)
    cluster = SlurmCluster(
        root, node, root / "slurm.conf", root / "munge" / "munge.sock", proctrack=proctrack
    )
    try:
        _start_munged(cluster)
        _write_conf(cluster)
        cluster.processes.append(_spawn(cluster, "slurmctld", ["-D"]))
        cluster.processes.append(_spawn(cluster, "slurmd", ["-D", "-N", node]))
        _wait_until_idle(cluster)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _start_munged(cluster: SlurmCluster) -> None:
    munge = cluster.root / "munge"
    key = munge / "munge.key"
    # A fresh random key, readable by its owner only (munged refuses anything else).
    fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, os.urandom(1024))
    finally:
        os.close(fd)
    args = [
        # In the foreground munged logs to stderr, which goes to log/munged.out.
        "--foreground",
        # Go on although a directory above the socket (pytest's base temp) is private.
        "--force",
        f"--key-file={key}",
        f"--socket={cluster.munge_socket}",
        f"--pid-file={munge / 'munged.pid'}",
        f"--seed-file={munge / 'munged.seed'}",
    ]
    cluster.processes.append(_spawn(cluster, "munged", args))
    _wait(cluster, cluster.munge_socket.exists, "munged did not create its socket")


def _spawn(cluster: SlurmCluster, name: str, args: list[str]) -> subprocess.Popen[bytes]:
    # Foreground daemons log to a file of their own: an unread pipe would fill up and block.
    with (cluster.root / "log" / f"{name}.out").open("wb") as out:
        return subprocess.Popen(
            [_program(name), *args],
            env={**os.environ, **cluster.env},
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _node_hardware() -> str:
    """The node's CPU layout as ``slurmd -C`` reports it (CPUs=, Boards=, ...).

    slurmctld drains a node that reports fewer sockets, cores or threads than configured,
    so the configuration takes exactly what slurmd will find. Memory stays unconfigured.
    """
    result = subprocess.run(
        [_program("slurmd"), "-C"], capture_output=True, text=True, check=True, timeout=20
    )
    first = result.stdout.splitlines()[0].split()
    return " ".join(word for word in first if not word.startswith(("NodeName=", "RealMemory=")))


def _write_conf(cluster: SlurmCluster) -> None:
    root = cluster.root
    # The user the daemons run as (not $USER, which may name someone else under su/sudo).
    user = pwd.getpwuid(os.getuid()).pw_name
    # slurmctld only runs on the host SlurmctldHost names (its short host name).
    host = socket.gethostname().split(".")[0]
    lines = [
        "ClusterName=gpuagent-test",
        f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={free_port()}",
        f"SlurmdPort={free_port()}",
        f"SlurmUser={user}",
        f"SlurmdUser={user}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={cluster.munge_socket}",
        f"StateSaveLocation={root / 'state'}",
        f"SlurmdSpoolDir={cluster.spool}",
        f"SlurmctldPidFile={root / 'slurmctld.pid'}",
        f"SlurmdPidFile={root / 'slurmd.pid'}",
        f"SlurmctldLogFile={root / 'log' / 'slurmctld.log'}",
        f"SlurmdLogFile={root / 'log' / 'slurmd.log'}",
        # By default no cgroups, no accounting, no job containers: nothing outside the
        # temp dir.
        f"ProctrackType=proctrack/{cluster.proctrack}",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "SwitchType=switch/none",
        "MpiDefault=none",
        "SchedulerType=sched/builtin",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "MailProg=/bin/true",
        f"NodeName={_node_definition(cluster.node, host)}",
        f"PartitionName=gpu Nodes={cluster.node} Default=YES MaxTime=INFINITE State=UP",
    ]
    cluster.conf.write_text("\n".join(lines) + "\n")
    if cluster.proctrack == "cgroup":
        _write_cgroup_conf(cluster)


def _write_cgroup_conf(cluster: SlurmCluster) -> None:
    # slurmd reads cgroup.conf from slurm.conf's directory. cgroup/v1, not autodetect: its
    # cgroups are the slurm_<node> trees SlurmCluster.cgroups() knows how to find and remove
    # (cgroup/v2 in 22.05 asks systemd for a scope, which a container may not have). Nothing
    # is constrained: proctrack/cgroup only needs the freezer hierarchy to track processes.
    lines = [
        "CgroupPlugin=cgroup/v1",
        f"CgroupMountpoint={CGROUP_ROOT}",
        "ConstrainCores=no",
        "ConstrainRAMSpace=no",
        "ConstrainSwapSpace=no",
        "ConstrainDevices=no",
    ]
    (cluster.conf.parent / "cgroup.conf").write_text("\n".join(lines) + "\n")


def _node_definition(node: str, host: str) -> str:
    return f"{node} NodeHostname={host} NodeAddr=127.0.0.1 {_node_hardware()} State=UNKNOWN"


def _wait_until_idle(cluster: SlurmCluster) -> None:
    _wait(cluster, lambda: cluster.sinfo()[0] == "idle", "the node did not become idle")


def _wait(cluster: SlurmCluster, ready: Callable[[], bool], what: str) -> None:
    """Poll ``ready`` during start-up; a daemon that exits ends the wait at once."""
    deadline = deadline_in(STARTUP_SECONDS)
    while not ready():
        for process in cluster.processes:
            if process.poll() is not None:
                raise AssertionError(
                    f"{process.args!r} exited with {process.returncode}\n{cluster.logs()}"
                )
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} in {STARTUP_SECONDS:g} s\n{cluster.logs()}")
        time.sleep(0.1)
