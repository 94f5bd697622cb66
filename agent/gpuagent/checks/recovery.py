"""``recovery``: what the driver itself says the GPU needs before it can be trusted again.

NVML's recovery action (field 230) is set by the driver on an uncorrectable fault and
stays set until the action is done, so it is known even to an agent that was not running
when the Xid was logged: a GPU that asks for a reset is CRITICAL from the first snapshot
after a start, and stays so until NVML says none. Channel and TPC repairs pending take
effect at the next reset; memory the GPU cannot repair is for service.
"""

from __future__ import annotations

from gpuagent.checks.common import Evidence, GpuView, Outcome, Problem
from gpuagent.checks.vocabulary import Action, Runbook
from gpuagent.model import RECOVERY_ACTIONS, Severity

# What an operator does for each action the driver asks for (NVIDIA's descriptions of
# nvmlDeviceGpuRecoveryAction_t: reset the GPU; reboot the node; drain P2P traffic, and
# with it reset; recover the IMEX domain; reset the PCIe bus; reboot the system).
_ACTIONS: dict[str, tuple[str, Action]] = {
    "reset": ("GPU reset required", Action.RESET_GPU),
    "reboot": ("node reboot required", Action.DRAIN_AND_REBOOT),
    "drain_p2p": (
        "peer-to-peer traffic must be drained, then the GPU reset",
        Action.DRAIN_AND_RESET,
    ),
    "drain_and_reset": ("drain and GPU reset required", Action.DRAIN_AND_RESET),
    "recover_imex_domain": ("the IMEX domain must be recovered", Action.INVESTIGATE),
    "bus_reset": ("PCIe bus reset required", Action.RESET_GPU),
    "system_reboot": ("system reboot required", Action.DRAIN_AND_REBOOT),
}


def check_recovery(view: GpuView) -> Outcome:
    readings = view.readings
    code = readings.recovery_action
    action = None if code is None else RECOVERY_ACTIONS.get(code, f"unknown ({code})")
    evidence: Evidence = (
        ("recovery_action", action),
        ("channel_repair_pending", readings.channel_repair_pending),
        ("tpc_repair_pending", readings.tpc_repair_pending),
        ("unrepairable_memory", readings.unrepairable_memory),
    )
    if all(value is None for _, value in evidence):
        return Outcome("recovery state not reported by this driver", evidence)
    problems: list[Problem] = []
    if action is not None and action != "none":
        reason, recommended = _ACTIONS.get(
            action, (f"recovery action {action}", Action.INVESTIGATE)
        )
        problems.append(
            Problem(
                Severity.CRITICAL,
                f"driver recovery action pending: {reason}",
                recommended,
                Runbook.GPU_RECOVERY_ACTION,
            )
        )
    if readings.unrepairable_memory:
        problems.append(
            Problem(
                Severity.CRITICAL,
                "memory the GPU cannot repair (unrepairable memory flag set)",
                Action.RESEAT_OR_REPLACE,
                Runbook.GPU_UNREPAIRABLE_MEMORY,
            )
        )
    pending = [
        unit
        for unit, flag in (
            ("channel", readings.channel_repair_pending),
            ("TPC", readings.tpc_repair_pending),
        )
        if flag
    ]
    if pending:
        problems.append(
            Problem(
                Severity.WARN,
                f"{' and '.join(pending)} repair pending; takes effect at the next reset",
                Action.RESET_GPU,
                Runbook.GPU_REPAIR_PENDING,
            )
        )
    return Outcome("no recovery action or repair pending", evidence, tuple(problems))
