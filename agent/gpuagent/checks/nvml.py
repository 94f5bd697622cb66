"""``nvml`` (node level): whether the NVML library can be used at all.

Each way NVML initialisation fails has a different fix, so the reason names the class
and the action follows from it.
"""

from __future__ import annotations

from gpuagent.checks.common import Outcome, Problem
from gpuagent.checks.vocabulary import Action, Runbook
from gpuagent.model import NvmlInitProblem, NvmlStatus, Severity

_PROBLEMS: dict[NvmlInitProblem | None, tuple[str, Action, Runbook]] = {
    "driver_not_loaded": (
        "NVIDIA driver not loaded",
        Action.LOAD_DRIVER,
        Runbook.NVML_DRIVER_NOT_LOADED,
    ),
    "library_not_found": (
        "NVML library not found",
        Action.INSTALL_DRIVER,
        Runbook.NVML_LIBRARY_NOT_FOUND,
    ),
    # The usual cause is a driver upgrade without a reboot: the old kernel module is
    # still loaded under the new user-space library.
    "version_mismatch": (
        "driver/library version mismatch",
        Action.REBOOT,
        Runbook.NVML_VERSION_MISMATCH,
    ),
    "no_permission": ("no permission to use NVML", Action.RUN_AS_ROOT, Runbook.NVML_NO_PERMISSION),
    "timeout": ("NVML timed out", Action.INVESTIGATE, Runbook.NVML_TIMEOUT),
    "other": ("NVML failed", Action.INVESTIGATE, Runbook.NVML_ERROR),
}


def check_nvml(status: NvmlStatus) -> Outcome:
    evidence = (
        ("ok", status.ok),
        ("problem", status.problem),
        ("message", status.message),
        ("driver_version", status.driver_version),
        ("nvml_version", status.nvml_version),
        ("cuda_driver_version", status.cuda_driver_version),
    )
    if status.ok:
        driver = f" (driver {status.driver_version})" if status.driver_version else ""
        return Outcome(f"NVML usable{driver}", evidence)
    # A failure reported without a class is treated like "other".
    label, action, runbook = _PROBLEMS.get(status.problem, _PROBLEMS["other"])
    reason = f"{label}: {status.message}" if status.message else label
    return Outcome("", evidence, (Problem(Severity.CRITICAL, reason, action, runbook),))
