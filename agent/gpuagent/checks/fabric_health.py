"""``fabric_health``: what the NVLink fabric says about its own health, per GPU.

Fabric Manager's registration (the node's ``fabric`` check) is a latched outcome: it reads
"completed" while routes have since gone bad. Drivers with fabric info v3 (R550 and
later, on NVSwitch and NVL72 systems) report the fabric's health in a mask of fields, each
"not supported", "true" or "false" (NVML's nvmlGpuFabricInfo_v3 healthMask; DCGM fails its
fabric watch on any of them):

- a route to a peer is unhealthy, or the fabric is configured wrong for this GPU (wrong
  system GUID or chassis, no partition, too few NVLinks, firmware, location): CRITICAL,
  jobs that span the fabric fail;
- the bandwidth is degraded (links lost, traffic still flows): WARN;
- route or access-timeout recovery in progress: WARN while it lasts, CRITICAL when it has
  not ended within ``recovery_timeout_seconds``;
- the global Fabric Manager is disconnected: WARN (the fabric runs on; it cannot change).

A field the driver does not support is left out, never read as healthy or unhealthy.
Right after a boot the fabric is still being set up: while the GPU's registration is not
completed, for ``checks.nvlink.boot_grace_seconds`` after the node booted, the mask is
shown, not judged (Fabric Manager has not yet placed the GPU: no partition, no routes).
"""

from __future__ import annotations

from gpuagent.checks.common import (
    Evidence,
    GpuView,
    Outcome,
    Problem,
    boot_evidence,
    fmt,
)
from gpuagent.checks.memory import GpuMemory, MemoryChanges
from gpuagent.checks.vocabulary import Action, Runbook
from gpuagent.config import FabricHealthCheck
from gpuagent.model import (
    FABRIC_CONDITIONS,
    FABRIC_CONFIGURATION_ERRORS,
    GpuReadings,
    Severity,
    fabric_conditions,
    fabric_configuration_error,
)

_RECOVERIES = ("route_recovery", "access_timeout_recovery")


def _recovering(readings: GpuReadings | None) -> bool:
    if readings is None or readings.fabric_health_mask is None:
        return False
    conditions = fabric_conditions(readings.fabric_health_mask)
    return any(conditions.get(name) for name in _RECOVERIES)


def remember_fabric_recovery(
    memory: GpuMemory, readings: GpuReadings | None, now: float
) -> MemoryChanges:
    """When the current unbroken run of fabric recovery began (None while none runs)."""
    since = memory.fabric_recovery_since
    if not _recovering(readings):
        since = None
    elif since is None or since > now:
        since = now
    return MemoryChanges(fabric_recovery_since=since)


def _recovery_problem(
    names: list[str], since: float | None, now: float, config: FabricHealthCheck
) -> Problem:
    what = " and ".join(name.replace("_", " ") for name in names)
    lasted = 0.0 if since is None else now - since
    if lasted > config.recovery_timeout_seconds:
        return Problem(
            Severity.CRITICAL,
            f"fabric {what} in progress for {fmt(lasted)} s, past "
            f"{fmt(config.recovery_timeout_seconds)} s",
            Action.DRAIN_AND_REBOOT,
            Runbook.GPU_FABRIC_RECOVERY,
        )
    return Problem(
        Severity.WARN,
        f"fabric {what} in progress ({fmt(lasted)} s)",
        Action.INVESTIGATE,
        Runbook.GPU_FABRIC_RECOVERY,
    )


def check_fabric_health(view: GpuView) -> Outcome:
    mask = view.readings.fabric_health_mask
    conditions = {} if mask is None else fabric_conditions(mask)
    state = view.readings.fabric_state
    evidence: Evidence = (
        ("fabric_health_mask", None if mask is None else f"0x{mask:04x}"),
        *((name, conditions.get(name)) for name in FABRIC_CONDITIONS),
        ("recovery_timeout_seconds", view.config.fabric_health.recovery_timeout_seconds),
        ("fabric_state", state),
        *boot_evidence(view.boot, view.config.nvlink.boot_grace_seconds),
    )
    if not conditions:
        return Outcome("fabric health not reported by this GPU and driver", evidence)
    boot = view.boot
    if state in ("not_started", "in_progress") and boot is not None and boot.in_grace:
        words = state.replace("_", " ")
        return Outcome(
            f"fabric registration {words} {boot.words()}: health not judged yet", evidence
        )
    problems: list[Problem] = []
    if conditions.get("route_unhealthy"):
        problems.append(
            Problem(
                Severity.CRITICAL,
                "a fabric route to a peer GPU is unhealthy",
                Action.DRAIN_AND_REBOOT,
                Runbook.GPU_FABRIC_ROUTE_UNHEALTHY,
            )
        )
    if conditions.get("incorrect_configuration") and mask is not None:
        code = fabric_configuration_error(mask) or 0
        what = FABRIC_CONFIGURATION_ERRORS.get(code, f"code {code}")
        problems.append(
            Problem(
                Severity.CRITICAL,
                f"fabric configuration incorrect for this GPU: {what}",
                Action.INVESTIGATE,
                Runbook.GPU_FABRIC_CONFIGURATION,
            )
        )
    recovering = [name for name in _RECOVERIES if conditions.get(name)]
    if recovering:
        since = view.memory.fabric_recovery_since
        problems.append(_recovery_problem(recovering, since, view.now, view.config.fabric_health))
    if conditions.get("bandwidth_degraded"):
        problems.append(
            Problem(
                Severity.WARN,
                "fabric bandwidth degraded (NVLinks lost; traffic still flows)",
                Action.INVESTIGATE,
                Runbook.GPU_FABRIC_DEGRADED,
            )
        )
    if conditions.get("gfm_disconnected"):
        problems.append(
            Problem(
                Severity.WARN,
                "the global Fabric Manager is disconnected from this GPU's fabric",
                Action.RESTART_FABRIC_MANAGER,
                Runbook.GPU_FABRIC_MANAGER_DISCONNECTED,
            )
        )
    reported = ", ".join(name.replace("_", " ") for name in conditions)
    return Outcome(f"fabric healthy ({reported}: none)", evidence, tuple(problems))
