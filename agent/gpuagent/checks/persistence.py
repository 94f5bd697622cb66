"""``persistence``: persistence mode keeps the driver initialised between jobs.

Without it the driver tears the GPU state down whenever the last client exits, which
adds seconds to every job start and loses ECC and clock settings in between.
"""

from __future__ import annotations

from gpuagent.checks.common import GpuView, Outcome, Problem
from gpuagent.checks.vocabulary import Action, Runbook
from gpuagent.model import Severity


def check_persistence(view: GpuView) -> Outcome:
    mode = view.readings.persistence_mode
    evidence = (("persistence_mode", mode),)
    if mode is None:
        return Outcome("persistence mode not reported", evidence)
    if mode:
        return Outcome("persistence mode enabled", evidence)
    problem = Problem(
        Severity.WARN,
        "persistence mode is disabled",
        Action.ENABLE_PERSISTENCE,
        Runbook.GPU_PERSISTENCE_OFF,
    )
    return Outcome("", evidence, (problem,))
