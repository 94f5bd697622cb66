"""``row_remap``: row remapping, how Ampere and later GPUs fence off bad HBM rows.

A remap that is pending takes effect at the next GPU reset. A failed remap means the
bank has no spare rows left, which no reset fixes: the board needs service.
"""

from __future__ import annotations

from gpuagent.checks.common import Evidence, GpuView, Outcome, Problem
from gpuagent.checks.vocabulary import Action, Runbook
from gpuagent.model import Severity


def check_row_remap(view: GpuView) -> Outcome:
    readings = view.readings
    evidence: Evidence = (
        ("remapped_rows_correctable", readings.remapped_rows_correctable),
        ("remapped_rows_uncorrectable", readings.remapped_rows_uncorrectable),
        ("row_remap_pending", readings.row_remap_pending),
        ("row_remap_failure", readings.row_remap_failure),
    )
    if all(value is None for _, value in evidence):
        return Outcome("row remapping not supported", evidence)
    banks = readings.remap_banks
    # Banks with few or no spare rows left: how close the next failed remap is.
    evidence += (
        ("remap_banks_low", None if banks is None else banks[3]),
        ("remap_banks_none", None if banks is None else banks[4]),
    )
    problems: list[Problem] = []
    if readings.row_remap_failure:
        problems.append(
            Problem(
                Severity.CRITICAL,
                "row remapping failed: no spare rows left",
                Action.RESEAT_OR_REPLACE,
                Runbook.GPU_ROW_REMAP_FAILURE,
            )
        )
    if readings.row_remap_pending:
        problems.append(
            Problem(
                Severity.WARN,
                "row remap pending; reset required",
                Action.RESET_GPU,
                Runbook.GPU_ROW_REMAP_PENDING,
            )
        )
    return Outcome("no row remap pending or failed", evidence, tuple(problems))
