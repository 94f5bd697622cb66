"""The NVIDIA daemons a node needs, judged from systemd's view of them: `services`
(nvidia-persistenced) and `fabric` (NVSwitch and NVL systems: Fabric Manager, the IMEX
daemon, and each GPU's registration with the fabric).

The daemon probes them every `inventory.services_probe_seconds` and its liveness
tracking (`gpuagent.inventory.liveness`) says whether a stopped one is down yet (several
probes in a row) and whether systemd keeps restarting it (flapping); a one-shot check
judges the state as read. Pure functions of the inventory.
"""

from __future__ import annotations

from gpuagent.checks.common import Evidence, Outcome, Problem, in_boot_grace, plural
from gpuagent.checks.inventory import InventoryView
from gpuagent.checks.vocabulary import Action, Runbook
from gpuagent.inventory.model import (
    FABRIC_MANAGER,
    IMEX,
    PERSISTENCED,
    GpuInventory,
    Service,
)
from gpuagent.model import Severity

# --- services ----------------------------------------------------------------------------


def _liveness(service: Service | None) -> str:
    """What a service's probes add to its state, for a reason or the evidence."""
    if service is None:
        return ""
    if service.pending:
        return f" (stopped at {plural(service.down_probes, 'probe')} in a row, not yet down)"
    return f" ({plural(service.down_probes, 'probe')} in a row)" if service.down_probes else ""


def _flapping(service: Service | None, severity: Severity) -> list[Problem]:
    if service is None or not service.flapping:
        return []
    problem = Problem(
        severity,
        f"{service.name} restarted {plural(service.recent_restarts, 'time')} recently: flapping",
        Action.INVESTIGATE,
        Runbook.NODE_SERVICE_FLAPPING,
        f"{service.name} flapping",
    )
    return [problem]


def _service_evidence(key: str, service: Service | None) -> Evidence:
    if service is None:
        return ((key, "unknown"),)
    return (
        (key, service.state),
        (f"{key}_down_probes", service.down_probes),
        (f"{key}_recent_restarts", service.recent_restarts),
    )


def check_services(view: InventoryView) -> Outcome:
    service = view.inventory.host.service_facts(PERSISTENCED)
    state = service.state if service is not None else "unknown"
    evidence = _service_evidence("nvidia_persistenced", service)
    problems = _flapping(service, Severity.WARN)
    # Not installed, masked (an operator's choice), or no systemd to ask: persistence
    # itself is the persistence check's. Stopped at fewer probes than make it down: a
    # restart in passing.
    if service is not None and service.down:
        problems.insert(
            0,
            Problem(
                Severity.WARN,
                f"{PERSISTENCED} is installed but {state}{_liveness(service)}",
                Action.START_SERVICE,
                Runbook.NODE_PERSISTENCED_DOWN,
            ),
        )
    ok = f"{PERSISTENCED} {state.replace('_', ' ')}{_liveness(service)}"
    return Outcome("" if problems else ok, evidence, tuple(problems))


# --- fabric ------------------------------------------------------------------------------


_REGISTERING = frozenset({"not_started", "in_progress"})


def _fabric_word(gpu: GpuInventory) -> str:
    if gpu.fabric_state == "completed":
        return "failed" if gpu.fabric_ok is False else "completed"
    return (gpu.fabric_state or "not supported").replace("_", " ")


def _imex_problems(imex: Service | None) -> list[Problem]:
    """The IMEX daemon (GB200/GB300 NVL racks), judged where it is installed."""
    if imex is None or imex.state in ("not_installed", "masked", "unknown"):
        return []
    problems = _flapping(imex, Severity.CRITICAL)
    if imex.down:
        problems.insert(
            0,
            Problem(
                Severity.CRITICAL,
                f"{IMEX} is {imex.state}{_liveness(imex)}: multi-node NVLink memory "
                "sharing is down",
                Action.START_SERVICE,
                Runbook.NODE_IMEX_DOWN,
            ),
        )
    elif imex.not_ready:
        probes = f", {plural(imex.unready_probes, 'probe')} in a row" if imex.unready_probes else ""
        problems.insert(
            0,
            Problem(
                Severity.CRITICAL,
                f"{IMEX} runs but is not ready (nvidia-imex-ctl -q: {imex.readiness!r}{probes}): "
                "multi-node NVLink memory sharing is down",
                Action.INVESTIGATE,
                Runbook.NODE_IMEX_NOT_READY,
            ),
        )
    return problems


def check_fabric(view: InventoryView) -> Outcome:
    inventory = view.inventory
    switches = inventory.pci("nvswitch") or ()
    fabric_gpus = [g for g in inventory.gpus if g.fabric_state is not None]
    service = inventory.host.service_facts(FABRIC_MANAGER)
    manager = service.state if service is not None else "unknown"
    imex = inventory.host.service_facts(IMEX)
    evidence: Evidence = (
        ("nvswitches", len(switches)),
        *_service_evidence("fabric_manager", service),
        ("imex", imex.state if imex is not None else "unknown"),
        ("imex_readiness", (imex.readiness if imex is not None else None) or "unknown"),
        *((f"gpu{g.index}_fabric", _fabric_word(g)) for g in fabric_gpus),
        ("seconds_since_boot", None if view.boot is None else round(view.boot.seconds, 1)),
        ("boot_grace_seconds", None if view.boot is None else view.boot.grace_seconds),
    )
    if not switches and not fabric_gpus:
        return Outcome("no NVSwitch fabric", evidence, tuple(_imex_problems(imex)))
    unregistered = [g for g in fabric_gpus if _fabric_word(g) != "completed"]
    # Right after a boot Fabric Manager is still placing the GPUs: a registration not yet
    # completed (never a failed one) is no fault during checks.nvlink.boot_grace_seconds.
    training = [g for g in unregistered if g.fabric_state in _REGISTERING]
    if in_boot_grace(view.boot) and training:
        unregistered = [g for g in unregistered if g not in training]
    else:
        training = []
    # Fabric Manager may run elsewhere (in the GPU Operator's driver container): with no
    # unit on the host (or one masked there), every GPU registered is what counts.
    off_host = manager in ("not_installed", "masked") and bool(fabric_gpus) and not unregistered
    problems: list[Problem] = []
    # Only a known state counts: without systemd the GPUs' registration still tells. A
    # stop seen at fewer probes in a row than make it down is a restart in passing.
    pending = service is not None and service.pending
    if manager not in ("active", "activating", "unknown") and not off_host and not pending:
        problems.append(
            Problem(
                Severity.CRITICAL,
                f"{FABRIC_MANAGER} is {manager.replace('_', ' ')} on an NVSwitch system"
                f"{_liveness(service)}",
                Action.START_SERVICE,
                Runbook.NODE_FABRIC_MANAGER,
            )
        )
    problems += _flapping(service, Severity.CRITICAL) + _imex_problems(imex)
    if unregistered:
        listed = ", ".join(f"GPU {g.index} {_fabric_word(g)}" for g in unregistered)
        problems.append(
            Problem(
                Severity.CRITICAL,
                f"GPU fabric registration not completed: {listed}",
                Action.START_SERVICE,
                Runbook.NODE_FABRIC_MANAGER,
            )
        )
    count = f"{len(switches)} NVSwitch{'' if len(switches) == 1 else 'es'}"
    if training and view.boot is not None:
        listed = ", ".join(f"GPU {g.index} {_fabric_word(g)}" for g in training)
        ok = f"NVSwitch fabric registering {view.boot.words()} ({count}; {listed})"
    elif off_host:
        ok = f"NVSwitch fabric up ({count}, every GPU registered; {FABRIC_MANAGER} not on the host)"
    else:
        state = f"{manager.replace('_', ' ')}{_liveness(service)}"
        ok = f"NVSwitch fabric up ({count}, {FABRIC_MANAGER} {state})"
    return Outcome(ok, evidence, tuple(problems))
