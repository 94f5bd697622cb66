"""Who shares what: each GPU's NVLink domain and rack position, and the node's location
labels, in the status document, `gpuagent status` and the fabric info metric."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from conftest import run_cli
from gpuagent.config import ConfigError, parse_config
from gpuagent.model import GpuReadings, PlatformInfo, nvlink_domain
from gpuagent.render import render_status
from gpuagent.statusview import status_document
from hardware_profiles_doc import REAL_HOSTS, collect
from test_metrics_support import ok_gpu, samples, snapshot

CLUSTER = "00000001-0000-0000-0000-000000000001"
ZERO = "00000000-0000-0000-0000-000000000000"


@pytest.mark.parametrize(
    ("state", "cluster", "clique", "domain"),
    [
        pytest.param("completed", CLUSTER, 2, f"{CLUSTER}/2", id="assigned"),
        # GB200/GB300 racks share the sentinel clique: only the pair tells them apart.
        pytest.param("completed", CLUSTER, 32766, f"{CLUSTER}/32766", id="sentinel-clique"),
        pytest.param("completed", ZERO, 2, None, id="zero-cluster"),
        pytest.param("completed", CLUSTER, 0, None, id="clique-0"),
        pytest.param("in_progress", CLUSTER, 2, None, id="not-completed"),
        pytest.param(None, None, None, None, id="no-fabric"),
    ],
)
def test_a_domain_is_the_cluster_and_clique_once_registered(
    state: Any, cluster: str | None, clique: int | None, domain: str | None
) -> None:
    readings = GpuReadings(fabric_state=state, fabric_cluster_uuid=cluster, fabric_clique_id=clique)
    assert nvlink_domain(readings) == domain


def test_racks_with_the_same_clique_are_different_domains() -> None:
    racks = {
        nvlink_domain(
            GpuReadings(fabric_state="completed", fabric_cluster_uuid=u, fabric_clique_id=32766)
        )
        for u in (CLUSTER, CLUSTER.replace("1", "2"), CLUSTER.replace("1", "3"))
    }
    assert len(racks) == 3


def test_location_labels_are_read_and_checked() -> None:
    config = parse_config('[agent]\nlabels = {rack = "r129", power_feed = "b"}\n')
    assert config.agent.labels == {"rack": "r129", "power_feed": "b"}
    for bad, why in (
        ('labels = {Rack = "r129"}', "a label is"),
        ('labels = {rack = ""}', "a value is"),
        ("labels = {rack = 7}", "a table of strings"),
    ):
        with pytest.raises(ConfigError) as info:
            parse_config(f"[agent]\n{bad}\n")
        assert (info.value.key, info.value.line) == ("agent.labels", 2)
        assert why in str(info.value)


def test_a_bad_label_exits_2_naming_the_key(tmp_path: Any) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[agent]\nlabels = {"leaf switch" = "l7"}\n')
    result = run_cli("config", "check", str(path))
    assert result.returncode == 2
    assert "agent.labels (line 2)" in result.stderr
    assert "Traceback" not in result.stderr


PLACE = PlatformInfo(chassis_serial="1821224000123", slot_number=7, tray_index=3, host_id=1,
                     module_id=2)  # fmt: skip


def _rack_gpu(index: int) -> Any:
    gpu = ok_gpu(index)
    assert gpu.readings is not None
    readings = replace(
        gpu.readings,
        fabric_state="completed",
        fabric_ok=True,
        fabric_cluster_uuid=CLUSTER,
        fabric_clique_id=32766,
    )
    return replace(gpu, identity=replace(gpu.identity, platform=PLACE), readings=readings)


def test_the_status_document_and_table_say_where_each_gpu_sits() -> None:
    gpus = (_rack_gpu(0), _rack_gpu(1), ok_gpu(2))
    snap = replace(snapshot(gpus=gpus), location_labels=(("leaf", "l7"), ("rack", "r129")))
    doc = status_document(snap)
    assert doc["node"]["labels"] == {"leaf": "l7", "rack": "r129"}
    first = doc["gpus"][0]
    assert first["fabric"] == {
        "state": "completed",
        "ok": True,
        "cluster_uuid": CLUSTER,
        "clique_id": 32766,
        "nvlink_domain": f"{CLUSTER}/32766",
    }
    assert first["platform"] == {
        "chassis_serial": "1821224000123",
        "slot_number": 7,
        "tray_index": 3,
        "host_id": 1,
        "module_id": 2,
    }
    assert doc["gpus"][2]["platform"] is None
    text = render_status(doc, now=doc["taken_at"])
    assert "Labels: leaf=l7, rack=r129" in text
    assert (
        f"NVLink domain of GPU 0,1: {CLUSTER}/32766, chassis 1821224000123 slot 7 tray 3 host 1"
        in text
    )


def test_the_fabric_info_metric_carries_the_domain_and_the_place() -> None:
    found = samples(snapshot(gpus=(_rack_gpu(0), ok_gpu(1))))
    (rack,) = [s for s in found["gpuagent_gpu_fabric_info"] if s.labels["gpu"] == "0"]
    assert rack.value == 1.0
    assert {k: rack.labels[k] for k in ("nvlink_domain", "cluster_uuid", "clique_id")} == {
        "nvlink_domain": f"{CLUSTER}/32766",
        "cluster_uuid": CLUSTER,
        "clique_id": "32766",
    }
    assert (rack.labels["chassis_serial"], rack.labels["tray"], rack.labels["slot"]) == (
        "1821224000123",
        "3",
        "7",
    )


def test_a_replayed_gb200_tray_reports_its_domain_and_place() -> None:
    doc = status_document(collect(REAL_HOSTS / "gb200-x4-arm64.580.173.02.nvidia-smi-q.xml"))
    domains = {gpu["fabric"]["nvlink_domain"] for gpu in doc["gpus"]}
    assert domains == {f"{CLUSTER}/2"}
    assert all(gpu["platform"] is not None for gpu in doc["gpus"])


def test_a_replayed_pass_through_h100_has_no_domain_and_no_place() -> None:
    doc = status_document(collect(REAL_HOSTS / "h100-x1-idle.590.48.01.nvidia-smi-q.txt"))
    (gpu,) = doc["gpus"]
    assert (gpu["fabric"]["clique_id"], gpu["fabric"]["nvlink_domain"]) == (0, None)
    assert gpu["platform"] is None
