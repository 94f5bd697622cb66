"""Configuration drift: a cluster's nodes grouped by inventory fingerprint (driver, CUDA,
kernel, VBIOS, GSP firmware, agent version). The fingerprint most nodes share is taken as
the cluster's intended configuration; nodes on any other are flagged. Nodes that report no
fingerprint (older agents) are listed as unknown, neither majority nor drift."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gpuagent.aggregator.records import UNKNOWN_FINGERPRINT, NodeRecord


@dataclass(frozen=True, slots=True)
class FingerprintGroup:
    fingerprint_id: str
    fields: dict[str, str]
    nodes: tuple[str, ...]

    def json(self, *, majority: bool) -> dict[str, Any]:
        return {
            "fingerprint_id": self.fingerprint_id,
            "nodes": len(self.nodes),
            "fields": self.fields,
            "majority": majority,
        }


@dataclass(frozen=True, slots=True)
class ClusterDrift:
    cluster: str
    groups: tuple[FingerprintGroup, ...]  # known fingerprints, most nodes first
    unknown: tuple[str, ...]

    @property
    def majority(self) -> FingerprintGroup | None:
        return self.groups[0] if self.groups else None

    @property
    def drifted(self) -> list[tuple[str, FingerprintGroup]]:
        return [(node, group) for group in self.groups[1:] for node in group.nodes]

    def json(self) -> dict[str, Any]:
        majority = self.majority
        return {
            "cluster": self.cluster,
            "majority": majority.fingerprint_id if majority else None,
            "fingerprints": [g.json(majority=g is majority) for g in self.groups],
            "drifted_nodes": [
                {
                    "node": node,
                    "fingerprint_id": group.fingerprint_id,
                    "differs": _diff(majority, group),
                }
                for node, group in self.drifted
                if majority is not None
            ],
            "unknown_nodes": list(self.unknown),
        }


def _diff(majority: FingerprintGroup | None, group: FingerprintGroup) -> dict[str, Any]:
    """Fields that differ from the majority: {field: {"majority": a, "node": b}}."""
    if majority is None:
        return {}
    keys = sorted(set(majority.fields) | set(group.fields))
    return {
        k: {"majority": majority.fields.get(k), "node": group.fields.get(k)}
        for k in keys
        if majority.fields.get(k) != group.fields.get(k)
    }


def fleet_drift(records: Iterable[NodeRecord]) -> list[ClusterDrift]:
    by_cluster: dict[str, dict[str, list[NodeRecord]]] = defaultdict(lambda: defaultdict(list))
    for record in records:
        by_cluster[record.cluster][record.fingerprint_id].append(record)
    result = []
    for cluster in sorted(by_cluster):
        fingerprints = by_cluster[cluster]
        unknown = tuple(sorted(r.node for r in fingerprints.pop(UNKNOWN_FINGERPRINT, [])))
        groups = [
            FingerprintGroup(
                fid, dict(members[0].fingerprint), tuple(sorted(r.node for r in members))
            )
            for fid, members in fingerprints.items()
        ]
        # Most nodes first; a tie goes to the lower id, so the answer does not flap.
        groups.sort(key=lambda g: (-len(g.nodes), g.fingerprint_id))
        result.append(ClusterDrift(cluster, tuple(groups), unknown))
    return result
