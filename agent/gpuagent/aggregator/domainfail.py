"""Domains failing together: when at least half the nodes of a declared domain (a rack,
leaf switch or power feed label) report a fault of their own within a few minutes, the
cause is the domain, not each node (docs/fleet.md#a-domain-failing-together). (An
NVLink domain's records are joined by the correlator itself, its root named there.)

Kept here: which nodes each domain has (from their state reports), which of them faulted
within the window, and which node of a domain the arbiter let be cordoned. The correlator
turns a domain crossing the threshold into one fleet incident; the arbiter lets at most
one node per failing domain be cordoned. Memory is one entry per node and domain, and a
domain's faults never outnumber its nodes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

# (cluster, domain key): the key is "label:rack=r12".
DomainKey = tuple[str, str]
MIN_NODES: Final = 4  # a smaller domain is no crowd: two nodes failing is two faults


@dataclass(frozen=True, slots=True)
class Crossing:
    key: str
    nodes: tuple[str, ...]  # the nodes that faulted within the window, first first
    size: int


def describe(key: str) -> str:
    """ "label:rack=r12" -> "rack=r12"."""
    return key.removeprefix("label:")


class DomainFailures:
    def __init__(self, labels: Iterable[str], *, window: float, fraction: float) -> None:
        self.labels = tuple(labels)
        self.window = window
        self.fraction = fraction
        self._nodes: dict[DomainKey, set[str]] = {}
        self._of: dict[tuple[str, str], frozenset[str]] = {}
        # One object per distinct set of domains (a rack's nodes share theirs): 10,000
        # nodes keep a few hundred for the garbage collector to walk, not 10,000.
        self._keysets: dict[frozenset[str], frozenset[str]] = {}
        # Nodes that faulted, with when they last did, oldest first.
        self._faults: dict[DomainKey, dict[str, float]] = {}
        # The one node of a domain let be cordoned, and when.
        self._cordoned: dict[DomainKey, tuple[str, float]] = {}

    def observe(self, cluster: str, node: str, keys: frozenset[str]) -> None:
        """The node's domains as its last state report says."""
        before = self._of.get((cluster, node), frozenset())
        if keys == before:
            return
        for key in before - keys:
            members = self._nodes.get((cluster, key))
            if members is not None:
                members.discard(node)
                if not members:
                    del self._nodes[(cluster, key)]
                    self._faults.pop((cluster, key), None)
                    self._cordoned.pop((cluster, key), None)
        for key in keys - before:
            self._nodes.setdefault((cluster, key), set()).add(node)
        self._of[(cluster, node)] = self._keysets.setdefault(keys, keys)

    def keys_of(self, cluster: str, node: str) -> frozenset[str]:
        return self._of.get((cluster, node), frozenset())

    def threshold(self, size: int) -> int:
        return max(2, math.ceil(size * self.fraction))

    def fault(self, cluster: str, node: str, now: float) -> list[Crossing]:
        """The node faulted: the domains this makes cross the threshold (each once per
        crossing: the caller opens an incident, which then takes the rest)."""
        crossed = []
        for key in self.keys_of(cluster, node):
            size = len(self._nodes.get((cluster, key), ()))
            if size < MIN_NODES:
                continue
            faults = self._recent(cluster, key, now)
            was = len(faults)
            faults.pop(node, None)
            faults[node] = now
            limit = self.threshold(size)
            if was < limit <= len(faults):
                crossed.append(Crossing(key, tuple(faults), size))
        return crossed

    def _recent(self, cluster: str, key: str, now: float) -> dict[str, float]:
        faults = self._faults.setdefault((cluster, key), {})
        horizon = now - self.window
        while faults:
            oldest = next(iter(faults))
            if faults[oldest] > horizon:
                break
            del faults[oldest]
        return faults

    def others_cordoned(self, cluster: str, node: str, now: float) -> tuple[str, str] | None:
        """(domain key, node) when another node of one of this node's domains was let be
        cordoned within the window: a second one waits for the window (half the domain
        failing by then is a common cause, not two faults)."""
        for key in self.keys_of(cluster, node):
            held = self._cordoned.get((cluster, key))
            if held is not None and held[0] != node and now - held[1] < self.window:
                return key, held[0]
        return None

    def cordoned(self, cluster: str, node: str, now: float) -> None:
        """The node was let be cordoned: the one of each of its domains for a window."""
        for key in self.keys_of(cluster, node):
            held = self._cordoned.get((cluster, key))
            if held is None or now - held[1] >= self.window:
                self._cordoned[(cluster, key)] = (node, now)

    def cordoned_node(self, cluster: str, key: str, now: float) -> str | None:
        """The node of the domain let be cordoned within the window, if any."""
        held = self._cordoned.get((cluster, key))
        return held[0] if held is not None and now - held[1] < self.window else None
