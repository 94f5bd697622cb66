"""``nvlink``: every NVLink the GPU has should be up.

A down link halves (or worse) the bandwidth of collective operations and usually hangs
multi-GPU jobs that expect the full fabric.
"""

from __future__ import annotations

from gpuagent.checks.common import GpuView, Outcome, Problem
from gpuagent.checks.vocabulary import Action, Runbook
from gpuagent.model import Severity


def check_nvlink(view: GpuView) -> Outcome:
    links = view.readings.nvlink_up
    down = [index for index, up in enumerate(links) if up is False]
    up_count = sum(1 for up in links if up is True)
    evidence = (
        ("links", len(links)),
        ("links_up", up_count),
        ("links_down", ",".join(str(i) for i in down)),
    )
    if not links:
        return Outcome("no NVLink", evidence)
    if not down:
        return Outcome(f"{up_count} of {len(links)} NVLinks up, none down", evidence)
    noun = "NVLink" if len(down) == 1 else "NVLinks"
    problem = Problem(
        Severity.CRITICAL,
        f"{noun} {', '.join(str(i) for i in down)} down ({len(down)} of {len(links)})",
        Action.DRAIN_AND_REBOOT,
        Runbook.GPU_NVLINK_DOWN,
    )
    return Outcome("", evidence, (problem,))
