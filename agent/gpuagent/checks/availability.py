"""``availability``: can NVML still talk to the GPU at all.

This check always runs. When it fails the other checks have nothing to look at, so
they report UNKNOWN "no data" pointing at the same action and runbook.
"""

from __future__ import annotations

from gpuagent.checks.common import Outcome, Problem
from gpuagent.checks.vocabulary import Action, Runbook
from gpuagent.model import GpuState, Severity

LOST_REASON = "GPU has fallen off the bus / is lost (NVML GPU_IS_LOST)"


def _problem(state: GpuState) -> Problem | None:
    error = state.error or "no error text"
    if state.status == "lost":
        return Problem(Severity.CRITICAL, LOST_REASON, Action.DRAIN_AND_REBOOT, Runbook.GPU_LOST)
    if state.status == "timeout":
        # A single slow call is not proof of a broken GPU, so this is UNKNOWN, not CRITICAL.
        return Problem(
            Severity.UNKNOWN,
            f"nvml_timeout: {error}",
            Action.INVESTIGATE,
            Runbook.GPU_NVML_TIMEOUT,
        )
    if state.status == "error":
        return Problem(
            Severity.UNKNOWN, f"nvml_error: {error}", Action.INVESTIGATE, Runbook.GPU_NVML_ERROR
        )
    return None


def check_availability(state: GpuState) -> Outcome:
    evidence = (("status", state.status), ("error", state.error))
    problem = _problem(state)
    return Outcome("GPU responds to NVML", evidence, () if problem is None else (problem,))


def no_data(state: GpuState) -> Outcome:
    """The outcome of every other check for a GPU that served no readings this poll."""
    problem = _problem(state)
    action = Action.INVESTIGATE if problem is None else problem.action
    runbook = Runbook.GPU_NVML_ERROR if problem is None else problem.runbook
    # status "ok" without readings should not happen; say so rather than "GPU ok".
    reason = f"no data: GPU {state.status}" if problem else "no data: GPU returned no readings"
    unknown = Problem(Severity.UNKNOWN, reason, action, runbook)
    return Outcome(reason, (("status", state.status),), (unknown,))
