from __future__ import annotations

import pytest

from gpuagent.aggregator.budget import CordonBudget
from gpuagent.config import CordonBudgetSection


def budget(max_nodes: int = 2, max_percent: float = 100.0, window: float = 600.0) -> CordonBudget:
    return CordonBudget(CordonBudgetSection(max_nodes, max_percent, window))


def test_five_nodes_at_once_two_approved_then_the_window_passes() -> None:
    b = budget(max_nodes=2)
    now = 1000.0
    results = [b.decide("c1", f"n{i}", "cordon", 5, now) for i in range(5)]
    assert [r.decision for r in results] == ["approved"] * 2 + ["denied"] * 3
    assert all(r.retry_after_seconds == pytest.approx(600.0) for r in results[2:])
    assert b.remaining("c1", 5, now) == 0
    # 100 s later the oldest approval leaves the window 500 s later.
    assert b.decide("c1", "n2", "cordon", 5, now + 100).retry_after_seconds == pytest.approx(500)
    later = now + 600.5
    assert b.decide("c1", "n2", "cordon", 5, later).decision == "approved"
    assert b.remaining("c1", 5, later) == 1


def test_percent_of_the_cluster_limits_and_at_least_one_node() -> None:
    b = budget(max_nodes=100, max_percent=10.0)
    assert b.limit(50) == 5
    assert b.limit(5) == 1  # 10 % of 5 rounds down to 0: still one
    results = [b.decide("c1", f"n{i}", "cordon", 5, 0.0).decision for i in range(3)]
    assert results == ["approved", "denied", "denied"]


def test_a_node_holding_an_approval_is_approved_again_without_a_new_slot() -> None:
    b = budget(max_nodes=1)
    assert b.decide("c1", "n1", "cordon", 10, 0.0).decision == "approved"
    again = b.decide("c1", "n1", "cordon", 10, 5.0)
    assert again.decision == "approved"
    assert "already" in again.reason
    assert b.decide("c1", "n2", "cordon", 10, 5.0).decision == "denied"


def test_uncordon_releases_the_slot_and_is_always_approved() -> None:
    b = budget(max_nodes=1)
    b.decide("c1", "n1", "cordon", 10, 0.0)
    assert b.decide("c1", "n9", "uncordon", 10, 1.0).decision == "approved"  # held nothing
    assert b.decide("c1", "n2", "cordon", 10, 1.0).decision == "denied"
    assert b.decide("c1", "n1", "uncordon", 10, 2.0).decision == "approved"
    assert b.decide("c1", "n2", "cordon", 10, 3.0).decision == "approved"


def test_clusters_have_separate_budgets() -> None:
    b = budget(max_nodes=1)
    assert b.decide("a", "n1", "cordon", 10, 0.0).decision == "approved"
    assert b.decide("b", "n1", "cordon", 10, 0.0).decision == "approved"
    assert b.decide("a", "n2", "cordon", 10, 0.0).decision == "denied"


def test_zero_budget_denies_without_a_retry_time_and_unknown_actions_are_denied() -> None:
    b = budget(max_nodes=0)
    result = b.decide("c1", "n1", "cordon", 10, 0.0)
    assert (result.decision, result.retry_after_seconds) == ("denied", None)
    assert budget().decide("c1", "n1", "drain", 10, 0.0).decision == "denied"


def test_restored_approvals_count() -> None:
    b = budget(max_nodes=1)
    b.restore("c1", "n1", 100.0)
    assert b.decide("c1", "n2", "cordon", 10, 200.0).decision == "denied"
    assert b.decide("c1", "n2", "cordon", 10, 701.0).decision == "approved"
