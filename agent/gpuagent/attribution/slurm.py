"""The Slurm job of a process, from its /proc/<pid>/cgroup.

slurmd's cgroup plugins put every step's tasks in a cgroup under the job's:

- cgroup v2 (cgroup/v2): ``0::/system.slice/slurmstepd.scope/job_42/step_0/user/task_0``
- cgroup v1 (cgroup/v1): ``7:devices:/slurm/uid_1000/job_42/step_batch/task_0``, one line
  per controller hierarchy; ``/slurm_<node>/...`` where several slurmd run on one host.

Only a ``job_<id>`` component below a Slurm component counts, so another manager's cgroup
that happens to have such a name is not taken for a job.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_JOB = re.compile(r"job_(\d+)")
# step_0, step_batch, step_extern, step_interactive
_STEP = re.compile(r"step_(\w+)")


@dataclass(frozen=True, slots=True)
class SlurmStep:
    job: str
    step: str | None = None


def parse_cgroup(text: str) -> SlurmStep | None:
    """The job (and step) in a /proc/<pid>/cgroup's text, or None outside any job."""
    for line in text.splitlines():
        # "hierarchy-ID:controller-list:cgroup-path"; the path may itself contain colons.
        parts = line.split(":", 2)
        if len(parts) == 3:  # the three fields of a cgroup line
            found = _from_path(parts[2])
            if found is not None:
                return found
    return None


def _from_path(path: str) -> SlurmStep | None:
    components = [c for c in path.split("/") if c]
    under_slurm = False
    for index, component in enumerate(components):
        if component.startswith("slurm"):  # slurm, slurm_<node>, slurmstepd.scope
            under_slurm = True
            continue
        job = _JOB.fullmatch(component)
        if under_slurm and job is not None:
            following = components[index + 1] if index + 1 < len(components) else ""
            step = _STEP.fullmatch(following)
            return SlurmStep(job[1], step[1] if step is not None else None)
    return None
