"""Settings drift: each GPU setting against the majority of its cluster's GPUs of the same
model and driver, from the status documents of replayed real-host captures. Pure function
tables, then the API, the metric and the node page through a real aggregator."""

from __future__ import annotations

import copy
import functools
import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import REPO
from fleet_support import chromium
from gpuagent.aggregator.drift import MIN_NODES, ClusterSettings, settings_drift
from gpuagent.aggregator.records import (
    NodeRecord,
    from_online_state,
    from_summary,
    summary_json,
)
from gpuagent.fleet import schema
from gpuagent.statusview import status_document
from hardware_profiles_doc import REAL_HOSTS, collect
from page_support import browser
from test_aggregator_http import Rig, running

H100_535_161 = "h100-sxm-x8.535.161.08.nvidia-smi-q.txt"
H100_535_183 = "h100-sxm-x8.535.183.01.nvidia-smi-q.txt"
RTX2080S = "RTX2080S-idle.610.57.04.nvidia-smi-q.txt"  # ECC mode N/A
H100 = "NVIDIA H100 80GB HBM3"


@functools.cache
def _captured(capture: str) -> str:
    return json.dumps(status_document(collect(REAL_HOSTS / capture)))


def status(capture: str = H100_535_161, **gpu_changes: Any) -> dict[str, Any]:
    """The status document an agent replaying ``capture`` sends (as JSON gives it back),
    with ``gpu_changes`` set on every GPU."""
    doc: dict[str, Any] = json.loads(_captured(capture))
    for gpu in doc["gpus"]:
        gpu.update(gpu_changes)
    return doc


def state(node: str, doc: dict[str, Any], cluster: str = "train") -> dict[str, Any]:
    message = schema.envelope("state", f"{node}:state:{time.monotonic_ns()}", node, cluster)
    message.update(online=True, agent_version="0.1.0", status=copy.deepcopy(doc))
    return message


def record(node: str, doc: dict[str, Any], cluster: str = "train") -> NodeRecord:
    message = state(node, doc, cluster)
    return from_online_state(message, json.dumps(message), message["time"])


def fleet(count: int, doc: dict[str, Any], prefix: str = "gpu-") -> list[NodeRecord]:
    return [record(f"{prefix}{i:03d}", doc) for i in range(count)]


def drifted(clusters: list[ClusterSettings]) -> list[tuple[str, str, Any, Any, list[Any]]]:
    return [
        (d.node, d.setting, d.value, d.majority, list(d.gpus)) for c in clusters for d in c.drifted
    ]


def test_the_one_node_of_100_with_persistence_off_is_flagged_for_that_setting() -> None:
    records = fleet(100, status())
    records[42] = record("gpu-042", status(persistence_mode=False))
    (cluster,) = settings_drift(records)
    assert drifted([cluster]) == [("gpu-042", "persistence_mode", False, True, list(range(8)))]
    (group,) = cluster.groups
    assert (group.model, group.driver, group.nodes, group.gpus) == (H100, "535.161.08", 100, 800)
    # The learned expectation: what a node or an operator can take as declared.
    assert group.majority() == {
        "persistence_mode": True,
        "ecc_enabled": True,
        "power_requested_limit_w": 700.0,
        "applications_clock_mhz": 1980,
        "mig_mode": False,
    }
    persistence = group.settings["persistence_mode"]
    assert (persistence.gpus, persistence.nodes, persistence.at_majority) == (800, 100, 792)
    (entry,) = cluster.json()["drifted"]
    assert entry == {
        "node": "gpu-042",
        "setting": "persistence_mode",
        "value": False,
        "majority": True,
        "gpus": list(range(8)),
        "group": {
            "model": H100,
            "driver": "535.161.08",
            "nodes": 100,
            "gpus": 800,
            "at_majority": 792,
        },
    }


def test_one_gpu_off_names_that_gpu_and_each_setting_it_differs_in() -> None:
    records = fleet(10, status())
    odd = status()
    odd["gpus"][3].update(applications_clock_mhz=1755, mig_mode=True)
    records[7] = record("gpu-007", odd)
    assert drifted(settings_drift(records)) == [
        ("gpu-007", "applications_clock_mhz", 1755, 1980, [3]),
        ("gpu-007", "mig_mode", True, False, [3]),
    ]


@pytest.mark.parametrize(
    ("nodes", "flagged"),
    [
        (2, []),  # one node against the other: no majority to judge by
        (MIN_NODES, ["gpu-000"]),
    ],
)
def test_a_majority_needs_three_nodes(nodes: int, flagged: list[str]) -> None:
    records = fleet(nodes, status())
    records[0] = record("gpu-000", status(persistence_mode=False))
    clusters = settings_drift(records)
    assert [node for node, *_ in drifted(clusters)] == flagged
    (group,) = clusters[0].groups
    assert ("persistence_mode" in group.majority()) is bool(flagged)


def test_no_value_held_by_more_than_half_is_no_majority() -> None:
    limits = [700.0, 700.0, 650.0, 650.0, 600.0, 600.0]
    records = [record(f"gpu-{i}", status(power_requested_limit_w=w)) for i, w in enumerate(limits)]
    (cluster,) = settings_drift(records)
    assert drifted([cluster]) == []
    assert "power_requested_limit_w" not in cluster.groups[0].majority()


def test_gpus_not_reporting_ecc_mode_are_neither_majority_nor_drift() -> None:
    records = fleet(10, status())
    unsupported = status()
    unsupported["gpus"][0]["ecc_enabled"] = None  # as the agent sends N/A
    records[3] = record("gpu-003", unsupported)
    # A model whose ECC mode is N/A on every GPU (a GeForce card), in the same cluster.
    records += fleet(4, status(RTX2080S), prefix="desk-")
    clusters = settings_drift(records)
    assert drifted(clusters) == []
    h100, geforce = sorted(clusters[0].groups, key=lambda g: g.model != H100)
    ecc = h100.settings["ecc_enabled"]
    assert (ecc.gpus, ecc.nodes, ecc.majority) == (79, 10, True)
    assert "ecc_enabled" not in geforce.settings
    assert "ecc_enabled" not in geforce.majority()


def test_different_driver_versions_are_different_groups() -> None:
    # Five nodes on 535.161.08 with persistence on, five on 535.183.01 with it off: two
    # groups, each agreeing with itself.
    records = fleet(5, status(H100_535_161), prefix="old-")
    records += fleet(5, status(H100_535_183, persistence_mode=False), prefix="new-")
    (cluster,) = settings_drift(records)
    assert drifted([cluster]) == []
    assert [(g.driver, g.majority()["persistence_mode"]) for g in cluster.groups] == [
        ("535.161.08", True),
        ("535.183.01", False),
    ]


def test_clusters_are_judged_apart() -> None:
    records = fleet(5, status())
    records += [record(f"lab-{i}", status(persistence_mode=False), "lab") for i in range(2)]
    records.append(record("lab-2", status(), "lab"))
    assert [(c.cluster, drifted([c])) for c in settings_drift(records)] == [
        ("lab", [("lab-2", "persistence_mode", True, False, list(range(8)))]),
        ("train", []),
    ]


def test_a_power_limit_a_watt_off_is_the_same_limit() -> None:
    records = fleet(10, status())
    records[1] = record("gpu-001", status(power_requested_limit_w=699.6))
    records[2] = record("gpu-002", status(power_requested_limit_w=650.0))
    assert drifted(settings_drift(records)) == [
        ("gpu-002", "power_requested_limit_w", 650.0, 700.0, list(range(8)))
    ]


def test_nodes_without_a_driver_and_gpus_without_readings_are_left_out() -> None:
    records = fleet(5, status())
    anonymous = status(persistence_mode=False)
    anonymous["node"]["inventory"] = None  # an agent that reports no fingerprint
    lost = status()
    for gpu in lost["gpus"]:  # a GPU that gives no readings reports no settings
        for key in ("persistence_mode", "ecc_enabled", "mig_mode", "applications_clock_mhz"):
            del gpu[key]
        gpu["power_requested_limit_w"] = "N/A"
    records += [record("anon", anonymous), record("lost", lost)]
    (cluster,) = settings_drift(records)
    assert drifted([cluster]) == []
    (group,) = cluster.groups
    assert (group.nodes, group.settings["persistence_mode"].nodes) == (6, 5)


def test_the_summary_the_database_keeps_holds_the_settings() -> None:
    original = record("gpu-001", status(applications_clock_mhz=None))
    base = NodeRecord(
        original.cluster,
        original.node,
        online=True,
        health="OK",
        reason="",
        last_seen=original.last_seen,
        agent_version="0.1.0",
    )
    back = from_summary(base, summary_json(original))
    assert back is not None
    assert back.gpus == original.gpus
    assert back.gpus[0].json()["settings"] == {
        "persistence_mode": True,
        "ecc_enabled": True,
        "power_requested_limit_w": 700.0,
        "mig_mode": False,
    }


# --- through the aggregator -------------------------------------------------------------


def _send_fleet(rig: Rig, odd: str = "gpu-002", nodes: int = 4) -> None:
    for i in range(nodes):
        name = f"gpu-{i:03d}"
        changes = {"persistence_mode": False} if name == odd else {}
        rig.send("state", state(name, status(**changes)))


async def test_the_api_and_metric_name_the_node_and_the_setting(tmp_path: Path) -> None:
    async with running(tmp_path) as rig:
        _send_fleet(rig)
        rig.send("state", state("x-000", status(), cluster="other"))
        _, drift = await rig.get("/api/v1/drift")
        _, node = await rig.get("/api/v1/nodes/gpu-002")
        _, page = await rig.get("/api/v1/fleet/gpu-002")
        _, fine = await rig.get("/api/v1/nodes/gpu-001")
        _, text = await rig.get("/metrics")
    assert [c["cluster"] for c in drift["clusters"]] == ["other", "train"]  # software drift
    other, train = drift["settings"]
    assert (other["cluster"], other["groups"][0]["majority"], other["drifted"]) == (
        "other",
        {},  # one node: nothing learned
        [],
    )
    (group,) = train["groups"]
    assert (group["model"], group["driver"], group["nodes"], group["gpus"]) == (
        H100,
        "535.161.08",
        4,
        32,
    )
    assert group["majority"]["persistence_mode"] is True
    assert group["reported"]["persistence_mode"] == {"gpus": 32, "nodes": 4, "at_majority": 24}
    (entry,) = train["drifted"]
    assert (entry["node"], entry["setting"], entry["value"], entry["majority"]) == (
        "gpu-002",
        "persistence_mode",
        False,
        True,
    )
    assert node["setting_drift"] == [entry]
    assert page["setting_drift"] == [entry]
    assert fine["setting_drift"] == []
    families = {f.name: f for f in text_string_to_metric_families(text)}
    family = families["gpuagent_fleet_setting_drift"]
    assert [(s.labels, s.value) for s in family.samples] == [
        ({"cluster": "train", "node": "gpu-002", "setting": "persistence_mode"}, 8.0)
    ]
    assert family.documentation in (REPO / "docs" / "metrics.md").read_text()


async def test_the_node_page_lists_its_fleet_drift(tmp_path: Path) -> None:
    executable = chromium()
    async with running(tmp_path / "aggregator") as rig:
        _send_fleet(rig)
        async with browser(executable, tmp_path) as tab:
            await tab.open(f"{rig.base}/#node/train/gpu-002")
            await tab.wait_for("!!document.getElementById('setting-drift')")
            shown = await tab.evaluate("document.getElementById('setting-drift').innerText")
            row = re.sub(r"\s+", " ", shown)
            assert "persistence mode 0, 1, 2, 3, 4, 5, 6, 7 off on" in row, shown
            assert f"{H100}, driver 535.161.08: 24 of 32 GPUs on 4 nodes" in row, shown
            await tab.screenshot("node-fleet-drift")
            await tab.evaluate("location.hash = '#node/train/gpu-001'")
            await tab.wait_for("document.title.startsWith('gpu-001')")
            view = await tab.evaluate("document.getElementById('node-view').innerText")
            after = re.sub(r"\s+", " ", view.split("Fleet drift", 1)[1])
            assert after.startswith(" None: the GPUs' settings agree with the fleet's."), view
