"""The fleet cordon budget: a circuit breaker over cordon requests, per cluster.

A "cordon" request is approved only while, counting it, at most ``max_nodes`` nodes and at
most ``max_percent`` % of the cluster's known nodes (never less than one) hold an approval
given within ``window_seconds``. A bad driver push or a flapping check then cordons a
handful of nodes, not the fleet. Pure: the clock is passed in, nothing is stored here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from gpuagent.config import CordonBudgetSection
from gpuagent.fleet.schema import Decision

CordonAction = Literal["cordon", "uncordon"]


@dataclass(frozen=True, slots=True)
class BudgetDecision:
    decision: Decision
    reason: str
    retry_after_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class BudgetState:
    """One cluster's budget at one moment: its limit, the nodes holding a slot (node,
    approval time; oldest first) and when each slot leaves the window."""

    cluster: str
    known_nodes: int
    limit: int
    window_seconds: float
    holders: tuple[tuple[str, float], ...]

    @property
    def used(self) -> int:
        return len(self.holders)

    @property
    def remaining(self) -> int:
        return max(0, self.limit - self.used)

    def json(self) -> dict[str, object]:
        frees = [t + self.window_seconds for _, t in self.holders]
        return {
            "cluster": self.cluster,
            "nodes": self.known_nodes,
            "limit": self.limit,
            "used": self.used,
            "remaining": self.remaining,
            "spent": self.remaining == 0,
            # When a new node may be cordoned again (None: now, or never with max_nodes 0).
            "next_free_at": min(frees) if self.remaining == 0 and frees else None,
            "holders": [
                {"node": node, "approved_at": t, "frees_at": t + self.window_seconds}
                for node, t in self.holders
            ],
        }


@dataclass
class CordonBudget:
    config: CordonBudgetSection
    # cluster -> node -> time of the approval that gave it its slot.
    _approved: dict[str, dict[str, float]] = field(default_factory=dict)

    def restore(self, cluster: str, node: str, approved_at: float) -> None:
        """Take back an approval given before a restart (from the store)."""
        self._approved.setdefault(cluster, {})[node] = approved_at

    def clear(self) -> None:
        self._approved.clear()

    def release(self, cluster: str, node: str) -> None:
        self._approved.get(cluster, {}).pop(node, None)

    def limit(self, known_nodes: int) -> int:
        by_share = math.floor(known_nodes * self.config.max_percent / 100)
        return min(self.config.max_nodes, max(1, by_share))

    def _current(self, cluster: str, now: float) -> dict[str, float]:
        slots = self._approved.setdefault(cluster, {})
        horizon = now - self.config.window_seconds
        for node in [n for n, t in slots.items() if t <= horizon]:
            del slots[node]
        return slots

    def remaining(self, cluster: str, known_nodes: int, now: float) -> int:
        return max(0, self.limit(known_nodes) - len(self._current(cluster, now)))

    def clusters(self) -> list[str]:
        """Clusters with an approval held (perhaps out of the window by now)."""
        return sorted(c for c, slots in self._approved.items() if slots)

    def state(self, cluster: str, known_nodes: int, now: float) -> BudgetState:
        slots = self._current(cluster, now)
        holders = tuple(sorted(slots.items(), key=lambda item: (item[1], item[0])))
        return BudgetState(
            cluster, known_nodes, self.limit(known_nodes), self.config.window_seconds, holders
        )

    def decide(
        self, cluster: str, node: str, action: str, known_nodes: int, now: float
    ) -> BudgetDecision:
        """Decide one request from ``node``; ``known_nodes`` counts the cluster's nodes."""
        if action == "uncordon":
            self.release(cluster, node)
            return BudgetDecision("approved", "uncordon: slot released")
        if action != "cordon":
            return BudgetDecision("denied", f"unknown action {action!r}")
        slots = self._current(cluster, now)
        limit = self.limit(known_nodes)
        if node in slots:
            return BudgetDecision("approved", "already holds an approval in the window")
        if len(slots) + 1 > limit:
            # max_nodes = 0 refuses every cordon, and no approval will ever free a slot.
            retry = (
                max(0.0, min(slots.values()) + self.config.window_seconds - now) if slots else None
            )
            return BudgetDecision(
                "denied",
                f"fleet cordon budget spent: {len(slots)} of {limit} nodes of {cluster} "
                f"cordoned within {self.config.window_seconds:g} s",
                retry,
            )
        slots[node] = now
        return BudgetDecision("approved", f"within budget ({len(slots)} of {limit})")
