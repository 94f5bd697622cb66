"""Health checks: pure functions of the latest observations plus a small memory.

The daemon calls `evaluate` after every NVML poll and keeps the returned memory for the
next call. See docs/checks.md for every check, its thresholds, actions and runbooks.
"""

from gpuagent.checks.engine import (
    CHECK_NAMES,
    INVENTORY_CHECK_NAMES,
    INVENTORY_NODE_CHECK_NAMES,
    NODE_CHECK_NAMES,
    evaluate,
)
from gpuagent.checks.inventory import InventoryView
from gpuagent.checks.memory import HealthMemory
from gpuagent.checks.vocabulary import Action, Runbook

__all__ = [
    "CHECK_NAMES",
    "INVENTORY_CHECK_NAMES",
    "INVENTORY_NODE_CHECK_NAMES",
    "NODE_CHECK_NAMES",
    "Action",
    "HealthMemory",
    "InventoryView",
    "Runbook",
    "evaluate",
]
