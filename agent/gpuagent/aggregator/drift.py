"""Configuration drift: a cluster's nodes grouped by inventory fingerprint (driver, CUDA,
kernel, VBIOS, GSP firmware, agent version). The fingerprint most nodes share is taken as
the cluster's intended configuration; nodes on any other are flagged. Nodes that report no
fingerprint (older agents) are listed as unknown, neither majority nor drift.

Settings drift: per cluster, GPU model and driver, the value most GPUs hold of each GPU
setting (`records.SETTINGS`) is the expectation, and a GPU holding another is flagged. A
setting is a fault only against an expectation, so the majority must be real: more than
half of the group's GPUs that report the setting, with at least `MIN_NODES` nodes reporting
it. GPUs that do not report a setting (N/A, unsupported) are neither majority nor drift."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gpuagent.aggregator.records import (
    SETTINGS,
    UNKNOWN_FINGERPRINT,
    GpuSummary,
    NodeRecord,
    SettingValue,
)
from gpuagent.checks.settings import POWER_TOLERANCE_W


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


# --- settings ------------------------------------------------------------------------------

# Nodes that must report a setting before its majority counts: with two, "most" would be
# one node against the other.
MIN_NODES = 3
_POWER = SETTINGS.index("power_requested_limit_w")


def _driver(record: NodeRecord) -> str:
    for key, value in record.fingerprint:
        if key == "driver":
            return value
    return ""


def _comparable(index: int, value: SettingValue) -> SettingValue:
    """What GPUs are counted by: a power limit in whole watts (NVML reports milliwatts,
    and boards settle a little off what was asked); any other setting as it is."""
    return float(round(value)) if index == _POWER and value is not None else value


def _differs(index: int, value: SettingValue, majority: SettingValue) -> bool:
    if index == _POWER and value is not None and majority is not None:
        return abs(value - majority) > POWER_TOLERANCE_W
    return value != majority


@dataclass(frozen=True, slots=True)
class SettingCount:
    """One setting in one group: the GPUs and nodes that report it, its majority value
    (None without a real one) and the GPUs that hold it."""

    gpus: int
    nodes: int
    majority: SettingValue
    at_majority: int

    def json(self) -> dict[str, Any]:
        return {"gpus": self.gpus, "nodes": self.nodes, "at_majority": self.at_majority}


@dataclass(frozen=True, slots=True)
class SettingsGroup:
    model: str
    driver: str
    nodes: int
    gpus: int
    settings: dict[str, SettingCount]  # the settings some GPU of the group reports

    def majority(self) -> dict[str, SettingValue]:
        """The expectation the group sets: each setting with a real majority, its value."""
        return {k: c.majority for k, c in self.settings.items() if c.majority is not None}

    def json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "driver": self.driver,
            "nodes": self.nodes,
            "gpus": self.gpus,
            "majority": self.majority(),
            "reported": {k: c.json() for k, c in self.settings.items()},
        }


@dataclass(frozen=True, slots=True)
class SettingDrift:
    """GPUs of one node that hold another value of a setting than their group's majority."""

    node: str
    setting: str
    value: SettingValue
    majority: SettingValue
    gpus: tuple[int | None, ...]  # their indexes
    group: SettingsGroup

    def json(self) -> dict[str, Any]:
        count = self.group.settings[self.setting]
        return {
            "node": self.node,
            "setting": self.setting,
            "value": self.value,
            "majority": self.majority,
            "gpus": list(self.gpus),
            "group": {
                "model": self.group.model,
                "driver": self.group.driver,
                "nodes": count.nodes,
                "gpus": count.gpus,
                "at_majority": count.at_majority,
            },
        }


@dataclass(frozen=True, slots=True)
class ClusterSettings:
    cluster: str
    groups: tuple[SettingsGroup, ...]  # by model, then driver
    drifted: tuple[SettingDrift, ...]  # by node, then setting

    def json(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster,
            "groups": [g.json() for g in self.groups],
            "drifted": [d.json() for d in self.drifted],
        }


_Group = tuple[str, str, str]  # cluster, GPU model, driver
_Values = tuple[SettingValue, ...]  # a GPU's settings, in SETTINGS order
_Pair = tuple[str, _Values]  # a GPU's model and settings
# A node counted: its record, driver, pairs with their GPUs, and each pair's `_Count`.
_Seen = tuple[NodeRecord, str, list[tuple[_Pair, int]], list["_Count"]]


def _pairs(gpus: tuple[GpuSummary, ...]) -> list[tuple[_Pair, int]]:
    """A node's GPUs as (model, settings) with how many GPUs have them: a node's GPUs
    mostly agree, so the fleet is counted per node's distinct pair, not per GPU."""
    first = gpus[0]
    model, values = first.model, first.settings
    for gpu in gpus:  # a loop, not all(): this runs for every GPU of the fleet
        if gpu.settings != values or gpu.model != model:
            return list(Counter((g.model, g.settings) for g in gpus).items())
    return [((model, values), len(gpus))]


class _Tally:
    """One group's counts: GPUs by each setting's (comparable) value, and nodes."""

    __slots__ = ("gpus", "nodes", "reporting", "values")

    def __init__(self) -> None:
        self.nodes = 0
        self.gpus = 0
        self.values: list[Counter[SettingValue]] = [Counter() for _ in SETTINGS]
        self.reporting = [0] * len(SETTINGS)  # nodes

    def add(self, values: _Values, gpus: int, nodes: int) -> None:
        self.gpus += gpus
        self.nodes += nodes
        for index, value in enumerate(values):
            if value is not None:
                self.values[index][_comparable(index, value)] += gpus
                self.reporting[index] += nodes

    def uncount(self, pairs: list[_Values]) -> None:
        """One node was counted once per pair of ``pairs``: count it once."""
        self.nodes -= len(pairs) - 1
        for index in range(len(SETTINGS)):
            reported = sum(1 for values in pairs if values and values[index] is not None)
            self.reporting[index] -= max(reported - 1, 0)

    def group(self, model: str, driver: str) -> SettingsGroup:
        settings = {}
        for index, counts in enumerate(self.values):
            if not counts:
                continue
            total = sum(counts.values())
            ((value, held),) = counts.most_common(1)
            real = held * 2 > total and self.reporting[index] >= MIN_NODES
            settings[SETTINGS[index]] = SettingCount(
                total, self.reporting[index], value if real else None, held if real else 0
            )
        return SettingsGroup(model, driver, self.nodes, self.gpus, settings)


@dataclass(slots=True)
class _Count:
    """GPUs and nodes with one settings pair in one group, and whether it is off."""

    gpus: int
    nodes: int = 1
    off: bool = False


def _count(
    records: Iterable[NodeRecord],
) -> tuple[dict[tuple[_Group, _Values], _Count], list[_Seen], list[tuple[_Group, list[_Values]]]]:
    """Every distinct (group, settings) with its counts; the nodes counted, with their
    pairs' counts; and the nodes whose GPUs hold two pairs in one group."""
    counts: dict[tuple[_Group, _Values], _Count] = {}
    seen: list[_Seen] = []
    overlaps: list[tuple[_Group, list[_Values]]] = []
    for record in records:
        driver = _driver(record)
        if not driver or not record.gpus:
            continue
        pairs = _pairs(record.gpus)
        mine = []
        for (model, values), gpus in pairs:
            at = ((record.cluster, model, driver), values)
            if (count := counts.get(at)) is None:
                count = counts[at] = _Count(gpus)
            else:
                count.gpus += gpus
                count.nodes += 1
            mine.append(count)
        seen.append((record, driver, pairs, mine))
        if len(pairs) > 1:
            overlaps += _overlaps(record.cluster, driver, pairs)
    return counts, seen, overlaps


def settings_drift(records: Iterable[NodeRecord]) -> list[ClusterSettings]:
    """Every cluster's settings groups and the nodes off their majority; nodes with no
    driver known (no fingerprint) are left out. Linear in the nodes: counted per distinct
    (group, settings) pair, then each pair judged once."""
    counts, seen, overlaps = _count(records)
    tallies: dict[_Group, _Tally] = defaultdict(_Tally)
    for (group_key, values), count in counts.items():
        tallies[group_key].add(values, count.gpus, count.nodes)
    for group_key, apart in overlaps:
        tallies[group_key].uncount(apart)
    groups = {key: tally.group(key[1], key[2]) for key, tally in tallies.items()}
    # Each distinct pair is judged once; mostly none is off, and the nodes are not walked again.
    for (group_key, values), count in counts.items():
        count.off = bool(_off(groups[group_key], values))
    drifted: dict[str, list[SettingDrift]] = defaultdict(list)
    for record, driver, pairs, mine in seen if any(c.off for c in counts.values()) else ():
        if any(c.off for c in mine):
            drifted[record.cluster] += _node_drift(record, driver, pairs, groups)
    by_cluster: dict[str, list[SettingsGroup]] = defaultdict(list)
    for key in sorted(groups):
        by_cluster[key[0]].append(groups[key])
    return [
        ClusterSettings(
            cluster,
            tuple(by_cluster[cluster]),
            tuple(sorted(drifted[cluster], key=lambda d: d.node)),
        )
        for cluster in sorted(by_cluster)
    ]


def _overlaps(
    cluster: str, driver: str, pairs: list[tuple[_Pair, int]]
) -> list[tuple[_Group, list[_Values]]]:
    """The groups in which a node's GPUs hold two or more pairs (counted as two nodes)."""
    by_model: dict[str, list[_Values]] = defaultdict(list)
    for (model, values), _ in pairs:
        by_model[model].append(values)
    return [((cluster, m, driver), v) for m, v in by_model.items() if len(v) > 1]


def _off(group: SettingsGroup, values: _Values) -> list[int]:
    """The settings (indexes) in which ``values`` differ from the group's majority."""
    out = []
    for index, value in enumerate(values):
        count = group.settings.get(SETTINGS[index])
        majority = None if count is None else count.majority
        if value is not None and majority is not None and _differs(index, value, majority):
            out.append(index)
    return out


def _node_drift(
    record: NodeRecord,
    driver: str,
    pairs: list[tuple[_Pair, int]],
    groups: dict[_Group, SettingsGroup],
) -> list[SettingDrift]:
    """The node's GPUs off their group's majority, one entry per setting, model and value."""
    found: dict[tuple[int, str, SettingValue], SettingDrift] = {}
    for (model, values), _ in pairs:
        group = groups[(record.cluster, model, driver)]
        for index in _off(group, values):
            value, majority = values[index], group.settings[SETTINGS[index]].majority
            gpus = tuple(g.index for g in record.gpus if g.model == model and g.settings == values)
            at = (index, model, _comparable(index, value))
            if at in found:  # GPUs apart in another setting, the same in this one
                gpus = tuple(sorted(found[at].gpus + gpus, key=lambda i: (i is None, i or 0)))
            found[at] = SettingDrift(record.node, SETTINGS[index], value, majority, gpus, group)
    return [found[k] for k in sorted(found)]


def node_settings_drift(records: Iterable[NodeRecord], record: NodeRecord) -> list[SettingDrift]:
    """Where ``record``'s GPUs are off their group's majority (its cluster's nodes only)."""
    peers = (r for r in records if r.cluster == record.cluster)
    return [d for c in settings_drift(peers) for d in c.drifted if d.node == record.node]
