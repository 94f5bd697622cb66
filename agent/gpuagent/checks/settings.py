"""GPU settings: facts to show, and faults only against an expectation.

Per GPU: `persistence` (persistence mode; a readings check, which without an inventory has
no expectation), `ecc_mode` (an ECC mode change waiting for a reset) and `settings` (the
power limit, applications clocks and compute mode). Whole fleets run persistence off and
set power limits on purpose, so a setting is judged only against what
`[inventory.expected]` declares or, where it declares nothing, what the node's learned
baseline holds; with neither it is OK and its value is in the reason. One setting is judged
without either, because it is ours: a power cap the agent's thermal remediation set and has
not restored.
"""

from __future__ import annotations

from typing import TypeVar

from gpuagent.checks.common import Evidence, GpuView, Outcome, Problem, fmt
from gpuagent.checks.inventory import InventoryView
from gpuagent.checks.vocabulary import Action, Runbook
from gpuagent.config import ChecksSection
from gpuagent.inventory.baseline import LearnedSettings
from gpuagent.inventory.model import GpuInventory
from gpuagent.model import Severity

_T = TypeVar("_T")
# Watts a power limit may differ from the reference before it counts as changed: NVML
# reports milliwatts, and some boards settle a few watts off what was asked.
POWER_TOLERANCE_W = 1.0
DECLARED, LEARNED = "expected", "baseline"


def _learned(view: InventoryView, index: int) -> LearnedSettings | None:
    return None if view.baseline is None else view.baseline.settings_of(index)


def _expectation(declared: _T | None, learned: _T | None) -> tuple[_T, str] | None:
    """What a setting should be, and who says so: the declared value, else the learned
    baseline's; None where neither says (the setting is then a fact)."""
    if declared is not None:
        return declared, DECLARED
    return None if learned is None else (learned, LEARNED)


def _on_off(enabled: bool | None) -> str:
    return "not supported" if enabled is None else ("on" if enabled else "off")


# --- persistence ---------------------------------------------------------------------------


def persistence_wanted(index: int, view: InventoryView | None) -> tuple[bool, str] | None:
    """The persistence mode GPU ``index`` should be in (True: on), and who says so; None
    without an inventory, or where nothing is declared or learned."""
    if view is None:
        return None
    declared, learned = view.expected.persistence, _learned(view, index)
    return _expectation(
        None if declared == "any" else declared == "enabled",
        None if learned is None else learned.persistence,
    )


def check_persistence(view: GpuView) -> Outcome:
    """Persistence mode against the declared or learned mode; without one, a fact."""
    mode, wanted = view.readings.persistence_mode, view.persistence_wanted
    evidence: Evidence = (
        ("persistence_mode", mode),
        ("persistence_expected", None if wanted is None else _on_off(wanted[0])),
        ("persistence_expected_by", None if wanted is None else wanted[1]),
    )
    if mode is None:
        return Outcome("persistence mode not reported", evidence)
    word = _on_off(mode)
    if wanted is None:
        return Outcome(f"persistence mode {word}", evidence)
    if wanted[0] == mode:
        return Outcome(f"persistence mode {word}, as {wanted[1]}", evidence)
    if mode:
        action, runbook = Action.DISABLE_PERSISTENCE, Runbook.GPU_PERSISTENCE_MISMATCH
    else:
        action, runbook = Action.ENABLE_PERSISTENCE, Runbook.GPU_PERSISTENCE_OFF
    problem = Problem(
        Severity.WARN,
        f"persistence mode {word}, {wanted[1]} {_on_off(wanted[0])}",
        action,
        runbook,
    )
    return Outcome("", evidence, (problem,))


# --- ecc_mode ------------------------------------------------------------------------------


def check_ecc_mode(gpu: GpuInventory, _view: InventoryView, _checks: ChecksSection) -> Outcome:
    evidence: Evidence = (("ecc_current", gpu.ecc_current), ("ecc_pending", gpu.ecc_pending))
    current, pending = gpu.ecc_current, gpu.ecc_pending
    if current is None or pending is None or current == pending:
        return Outcome(f"ECC mode {_on_off(current)}, nothing pending", evidence)
    problem = Problem(
        Severity.WARN,
        f"ECC mode {_on_off(pending)} is pending; reset required to apply ECC mode",
        Action.RESET_GPU,
        Runbook.GPU_ECC_PENDING,
    )
    return Outcome("", evidence, (problem,))


# --- settings ------------------------------------------------------------------------------


def _power(gpu: GpuInventory, view: InventoryView) -> tuple[str, Evidence, list[Problem]]:
    current, requested = gpu.power_limit_w, gpu.power_requested_limit_w
    asked = requested if requested is not None else current
    learned = _learned(view, gpu.index)
    wanted = _expectation(
        view.expected.power_limit_watts or None, None if learned is None else learned.power_limit_w
    )
    capped_from = dict(view.power_capped).get(gpu.pci_bus_id)
    evidence: Evidence = (
        ("power_limit_w", current),
        ("power_requested_limit_w", requested),
        ("power_default_limit_w", gpu.power_default_limit_w),
        ("power_expected_w", None if wanted is None else wanted[0]),
        ("power_expected_by", None if wanted is None else wanted[1]),
        ("power_capped_from_w", capped_from),
    )
    if current is None:
        return "power limit not reported", evidence, []
    fact = f"power limit {fmt(current)} W"
    if requested is not None and current < requested - POWER_TOLERANCE_W:
        # Lowered by the platform (a GH200 module shares its power), not by anyone's setting.
        fact += f" (the platform's; {fmt(requested)} W requested)"
    default = gpu.power_default_limit_w
    if default and asked is not None and abs(asked - default) > POWER_TOLERANCE_W:
        fact += f", default {fmt(default)} W"
    problems: list[Problem] = []
    if capped_from is not None:
        problems.append(
            Problem(
                Severity.WARN,
                f"power limit {fmt(current)} W is gpuagent's thermal cap "
                f"(was {fmt(capped_from)} W)",
                Action.RESTORE_SETTINGS,
                Runbook.GPU_POWER_LIMIT_CHANGED,
                cause="thermal_cap",
            )
        )
    elif wanted is not None and asked is not None and abs(asked - wanted[0]) > POWER_TOLERANCE_W:
        problems.append(
            Problem(
                Severity.WARN,
                f"power limit {fmt(asked)} W requested, {wanted[1]} {fmt(wanted[0])} W",
                Action.RESTORE_SETTINGS,
                Runbook.GPU_POWER_LIMIT_CHANGED,
            )
        )
    return fact, evidence, problems


def _clocks(gpu: GpuInventory, view: InventoryView) -> tuple[str, Evidence, list[Problem]]:
    app, default = gpu.applications_clock_mhz, gpu.applications_clock_default_mhz
    learned = _learned(view, gpu.index)
    baseline = None if learned is None else learned.applications_clock_mhz
    declared = view.expected.applications_clocks == "default"
    evidence: Evidence = (
        ("applications_clock_mhz", app),
        ("applications_clock_default_mhz", default),
        ("applications_clock_baseline_mhz", baseline),
        ("applications_clocks_expected", view.expected.applications_clocks),
        ("clocks_set_by_user", gpu.clocks_set_by_user),
    )
    facts = []
    if app is not None:
        differs = default is not None and app != default
        facts.append(f"applications clock {app} MHz" + (f", default {default}" if differs else ""))
    if gpu.clocks_set_by_user:
        facts.append("clocks set by a user")
    problems: list[Problem] = []
    if declared and app is not None and default is not None and app != default:
        problems.append(_clock_problem(f"applications clock {app} MHz, default {default} MHz"))
    elif declared and gpu.clocks_set_by_user:
        # Applications clocks at their default yet held by a user setting: locked clocks.
        problems.append(_clock_problem("GPU clocks locked by a user setting"))
    elif not declared and None not in (app, baseline) and app != baseline:
        problems.append(_clock_problem(f"applications clock {app} MHz, baseline {baseline} MHz"))
    return "; ".join(facts), evidence, problems


def _clock_problem(reason: str) -> Problem:
    return Problem(Severity.WARN, reason, Action.RESTORE_SETTINGS, Runbook.GPU_CLOCKS_SET)


def _compute_mode(gpu: GpuInventory, view: InventoryView) -> tuple[str, Evidence, list[Problem]]:
    mode, learned, declared = (
        gpu.compute_mode,
        _learned(view, gpu.index),
        view.expected.compute_mode,
    )
    wanted = _expectation(
        None if declared == "any" else declared, None if learned is None else learned.compute_mode
    )
    evidence: Evidence = (
        ("compute_mode", mode),
        ("compute_mode_expected", None if wanted is None else wanted[0]),
    )
    if mode is None:
        return "", evidence, []
    problems = []
    if wanted is not None and mode != wanted[0]:
        problems.append(
            Problem(
                Severity.WARN,
                f"compute mode {mode}, {wanted[1]} {wanted[0]}",
                Action.RESTORE_SETTINGS,
                Runbook.GPU_COMPUTE_MODE,
            )
        )
    return f"compute mode {mode}", evidence, problems


def check_settings(gpu: GpuInventory, view: InventoryView, _checks: ChecksSection) -> Outcome:
    """The power limit, applications clocks and compute mode: each a fact in the reason,
    and a finding where it differs from its expectation (or is our own power cap)."""
    facts: list[str] = []
    evidence: Evidence = ()
    problems: list[Problem] = []
    for part in (_power, _clocks, _compute_mode):
        fact, more, found = part(gpu, view)
        facts += [fact] if fact else []
        evidence += more
        problems += found
    return Outcome("; ".join(facts) or "settings not reported", evidence, tuple(problems))
