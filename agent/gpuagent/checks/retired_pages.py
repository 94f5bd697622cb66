"""``retired_pages``: page retirement, the pre-Ampere way of fencing off bad memory.

A page queued for retirement only leaves service at the next GPU reset. NVIDIA's
field guidance treats 60 or more retired pages (SBE + DBE) as grounds for replacing the
board, so reaching that count is flagged too.
"""

from __future__ import annotations

from gpuagent.checks.common import GpuView, Outcome, Problem, plural
from gpuagent.checks.vocabulary import Action, Runbook
from gpuagent.model import Severity

# NVIDIA's RMA guidance for page retirement (pre-Ampere GPUs).
RETIRED_PAGES_LIMIT = 60


def check_retired_pages(view: GpuView) -> Outcome:
    readings = view.readings
    sbe, dbe, pending = (
        readings.retired_pages_sbe,
        readings.retired_pages_dbe,
        readings.retired_pages_pending,
    )
    evidence = (
        ("retired_pages_sbe", sbe),
        ("retired_pages_dbe", dbe),
        ("retired_pages_pending", pending),
        ("retired_pages_limit", RETIRED_PAGES_LIMIT),
    )
    if sbe is None and dbe is None and pending is None:
        return Outcome("page retirement not supported", evidence)
    problems: list[Problem] = []
    if pending:
        problems.append(
            Problem(
                Severity.WARN,
                "pages pending retirement; reset required",
                Action.RESET_GPU,
                Runbook.GPU_RETIRED_PAGES_PENDING,
            )
        )
    total = (sbe or 0) + (dbe or 0)
    if total >= RETIRED_PAGES_LIMIT:
        problems.append(
            Problem(
                Severity.WARN,
                f"{plural(total, 'retired page')} ({dbe or 0} DBE, {sbe or 0} SBE), "
                f"at or above the {RETIRED_PAGES_LIMIT}-page replacement guidance",
                Action.CONTACT_SUPPORT,
                Runbook.GPU_RETIRED_PAGES_LIMIT,
            )
        )
    return Outcome(f"{plural(total, 'retired page')}, none pending", evidence, tuple(problems))
