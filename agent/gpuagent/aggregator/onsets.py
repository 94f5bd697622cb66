"""When each finding a node reports started, as far as the aggregator can tell.

The agent reports what is wrong now, not since when; the aggregator sees every report, so
the first report carrying a finding dates it. A finding that goes away and comes back
starts again. Kept in memory: after a restart, findings date from their first report
since then (or from the stored report the node table is loaded from).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from gpuagent.aggregator.records import NodeRecord

# (GPU bus id, "" for the node; check; cause): one finding of one node.
FindingKey = tuple[str, str, str]


def with_gpu(record: NodeRecord) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every finding of the node with its GPU's bus id ("" for node findings)."""
    for finding in record.findings:
        yield "", finding
    for gpu in record.gpus:
        for finding in gpu.findings:
            yield gpu.pci_bus_id, finding


def finding_key(gpu: str, finding: dict[str, Any]) -> FindingKey:
    # A finding's identity is its cause; agents older than `cause` only had the reason.
    identity = finding.get("cause") or finding.get("reason", "")
    return (gpu, str(finding.get("check", "")), str(identity))


class Onsets:
    def __init__(self) -> None:
        self._first: dict[tuple[str, str], dict[FindingKey, float]] = {}

    def observe(self, record: NodeRecord) -> None:
        if not record.online:
            return  # an offline record repeats the last report: it dates nothing
        before = self._first.get(record.key, {})
        self._first[record.key] = {
            finding_key(gpu, f): before.get(finding_key(gpu, f), record.last_seen)
            for gpu, f in with_gpu(record)
        }

    def since(self, record: NodeRecord, gpu: str, finding: dict[str, Any]) -> float | None:
        return self._first.get(record.key, {}).get(finding_key(gpu, finding))
