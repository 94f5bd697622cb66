"""``mig``: Multi-Instance GPU mode against the fleet's expectation, and pending changes.

A MIG mode change only takes effect at the next GPU reset; until then the GPU keeps
running in the old mode, which schedulers see as the wrong shape.
"""

from __future__ import annotations

from gpuagent.checks.common import GpuView, Outcome, Problem
from gpuagent.checks.vocabulary import Action, Runbook
from gpuagent.model import Severity


def _word(mode: bool | None) -> str:
    if mode is None:
        return "not supported"
    return "enabled" if mode else "disabled"


def _matches(mode: bool | None, expected: str) -> bool:
    """Whether ``mode`` is what the fleet expects; a GPU without MIG counts as disabled."""
    if expected == "enabled":
        return mode is True
    if expected == "disabled":
        return mode is not True
    return True


def check_mig(view: GpuView) -> Outcome:
    current, pending = view.readings.mig_mode_current, view.readings.mig_mode_pending
    expected = view.config.mig.expected
    evidence = (
        ("mig_mode_current", current),
        ("mig_mode_pending", pending),
        ("mig_mode_expected", expected),
    )
    problems: list[Problem] = []
    change_pending = current is not None and pending is not None and pending != current
    if change_pending:
        problems.append(
            Problem(
                Severity.WARN,
                f"MIG mode {_word(pending)} is pending; reset required to apply MIG mode",
                Action.RESET_GPU,
                Runbook.GPU_MIG_PENDING,
            )
        )
    # A pending change to the expected mode is already the fix; only the reset is missing.
    fixed_by_reset = change_pending and _matches(pending, expected)
    if not _matches(current, expected) and not fixed_by_reset:
        problems.append(
            Problem(
                Severity.WARN,
                f"MIG mode is {_word(current)}, expected {expected}",
                Action.SET_MIG_MODE,
                Runbook.GPU_MIG_MISMATCH,
            )
        )
    return Outcome(f"MIG mode {_word(current)}", evidence, tuple(problems))
