"""Metric families for DCGM's diagnostic: the latest run of each level (`NodeSnapshot.diag`).

`gpu` is the NVML index DCGM tested, "" for a result about no one GPU; `level` is 1, 2 or 3.
A level never run on this node since the agent started has no series.
"""

from __future__ import annotations

from prometheus_client.core import Metric

from gpuagent.metrics.names import MetricSpec
from gpuagent.model import DiagOutcome, NodeSnapshot

# 1 pass and 0 fail, so `== 0` finds failures; the rest say why a test gave no verdict.
OUTCOME_VALUES: dict[DiagOutcome, float] = {
    "fail": 0.0,
    "pass": 1.0,
    "warn": 2.0,
    "skip": 3.0,
    "notrun": 4.0,
}

DIAG_RESULT = MetricSpec(
    "gpuagent_diag_result",
    "Result of one test of the latest DCGM diagnostic of a level, per GPU: "
    "0 fail, 1 pass, 2 warn, 3 skip, 4 not run.",
    ("level", "gpu", "test"),
)
DIAG_PASSED = MetricSpec(
    "gpuagent_diag_passed",
    "1 if the latest DCGM diagnostic of a level passed, 0 if it failed or could not run.",
    ("level",),
)
DIAG_LAST_RUN = MetricSpec(
    "gpuagent_diag_last_run_timestamp_seconds",
    "When the latest DCGM diagnostic of a level finished (Unix time).",
    ("level",),
)
DIAG_DURATION = MetricSpec(
    "gpuagent_diag_duration_seconds",
    "How long the latest DCGM diagnostic of a level ran.",
    ("level",),
)
SPECS = (DIAG_RESULT, DIAG_PASSED, DIAG_LAST_RUN, DIAG_DURATION)


def diag_families(snapshot: NodeSnapshot) -> list[Metric]:
    result, passed, last_run, duration = (s.gauge() for s in SPECS)
    for diag in snapshot.diag:
        level = str(diag.level)
        passed.add_metric([level], 1.0 if diag.passed else 0.0)
        last_run.add_metric([level], diag.finished)
        duration.add_metric([level], max(0.0, diag.finished - diag.started))
        seen: set[tuple[str, str]] = set()
        for test in diag.tests:
            key = ("" if test.gpu is None else str(test.gpu), test.name)
            if key in seen:
                continue  # one series per test and GPU: DCGM's first verdict
            seen.add(key)
            result.add_metric([level, *key], OUTCOME_VALUES[test.outcome])
    return [result, passed, last_run, duration]
