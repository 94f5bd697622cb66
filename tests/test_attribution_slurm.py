"""Slurm attribution against a real job: a single-node cluster (slurm_cluster.py) whose
slurmd tracks jobs with proctrack/cgroup, so a batch job's processes run in the cgroups
slurmd makes, and the agent's look-up in the real /proc must name the job Slurm reports."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import deadline_in, require_that
from gpuagent.attribution.slurm import SlurmStep, parse_cgroup
from gpuagent.model import GpuProcess
from gpuagent.sources.procfs import ProcessTable
from slurm_cluster import CGROUP_ROOT, SlurmCluster, require_programs, start_cluster

PROC = Path("/proc")
JOB_SECONDS = 20.0


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[SlurmCluster]:
    require_programs()
    require_that(
        os.geteuid() == 0, "slurmd runs jobs in cgroups only as root (run the tests as root)"
    )
    require_that(
        (CGROUP_ROOT / "freezer" / "cgroup.procs").exists(),
        f"proctrack/cgroup needs the cgroup v1 freezer hierarchy at {CGROUP_ROOT / 'freezer'}",
    )
    # A node name of its own: slurmd names its cgroup tree after the node, and a cluster
    # started by another test run at the same time must not share it.
    node = f"gpuagent-cg-{os.getpid()}"
    started = start_cluster(tmp_path / "slurm", node, proctrack="cgroup")
    yield started
    started.stop()
    # Nothing left behind: the slurm_<node> trees in every hierarchy are gone.
    assert started.cgroups() == []


def job_processes(cluster: SlurmCluster, job: str) -> dict[int, str]:
    """{pid: step} of the job's processes on the node, as ``scontrol listpids`` reports."""
    result = cluster.run("scontrol", "listpids", job)
    if result.returncode != 0:  # the job's step has not started on the node yet
        return {}
    rows = (line.split() for line in result.stdout.splitlines()[1:])  # below the header
    return {int(row[0]): row[2] for row in rows if len(row) >= 3}  # PID JOBID STEPID ...


def wait_for_sleep(cluster: SlurmCluster, job: str) -> tuple[int, str]:
    """(pid, step) of the job's ``sleep`` once slurmd has started it."""
    deadline = deadline_in(JOB_SECONDS)
    while True:
        for pid, step in job_processes(cluster, job).items():
            comm = PROC / str(pid) / "comm"
            if comm.exists() and comm.read_text().strip() == "sleep":
                return pid, step
        if time.monotonic() > deadline:
            state = cluster.scontrol("show", "job", job, "--oneliner")
            raise AssertionError(f"job {job}'s sleep did not start: {state}\n{cluster.logs()}")
        time.sleep(0.1)


def test_a_real_jobs_process_is_attributed_to_its_job(cluster: SlurmCluster) -> None:
    # The job's output goes to the cluster's directory, not wherever the tests run from.
    output = f"--output={cluster.root / 'slurm-%j.out'}"
    submitted = cluster.run("sbatch", "--parsable", output, "--wrap", "sleep 300")
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]  # "<id>" or "<id>;<cluster>"
    pid, step = wait_for_sleep(cluster, job)

    # The agent's look-up, on the real /proc, as the NVML worker makes it for a GPU process.
    table = ProcessTable(PROC, slurm=True)
    described = table.describe(GpuProcess(pid, f"pid {pid}", 1.0))
    assert (described.alive, described.name, described.job) == (True, "sleep", job)
    # The parser also finds the step, which Slurm reports as listpids' STEPID ("batch").
    cgroup = (PROC / str(pid) / "cgroup").read_text()
    assert parse_cgroup(cgroup) == SlurmStep(job, step), cgroup
    # The test's own process runs in no job.
    assert table.describe(GpuProcess(os.getpid(), "pytest", 1.0)).job is None

    # The job's cgroup exists now, so its removal below is a real change.
    assert cluster.job_cgroups(job), cgroup
    cancelled = cluster.run("scancel", job)
    assert cancelled.returncode == 0, cancelled.stderr
    # slurmd ends the job's processes and removes the job's cgroups when the job ends.
    deadline = deadline_in(JOB_SECONDS)
    while (PROC / str(pid)).exists() or cluster.job_cgroups(job):
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job} still has a process or a cgroup\n{cluster.logs()}")
        time.sleep(0.1)
    assert table.describe(GpuProcess(pid, "sleep", 1.0)).alive is False
