"""The snapshot collector: names, labels, values, lost GPUs, health and caching."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY, generate_latest

from gpuagent.metrics import SnapshotCollector, build_registry, names
from gpuagent.metrics.collector import nvml_bus_id
from gpuagent.metrics.names import AGENT_GPU_METRICS, DCGM_GPU_METRICS, DCGM_LABELS, GPU_LABELS
from gpuagent.metrics.process import process_families
from gpuagent.model import Finding, GpuReadings, NodeHealth, NvmlStatus, Severity
from test_metrics_support import (
    BUS_IDS,
    DRIVER,
    HOSTNAME,
    MODEL,
    NVML_BUS_IDS,
    VERSION,
    degraded_snapshot,
    exposition,
    families_by_name,
    for_gpu,
    ok_findings,
    ok_gpu,
    readings,
    samples,
    samples_from_text,
    snapshot,
)

# As the text parser names the families: a counter's without its _total suffix.
PER_GPU_VALUE_NAMES = {
    m.name.removesuffix("_total") for m in (*DCGM_GPU_METRICS, *AGENT_GPU_METRICS)
} | {
    "gpuagent_gpu_clock_event_reasons",
    "gpuagent_gpu_nvlink_up",
}
HEALTH_NAMES = {"gpuagent_gpu_health", "gpuagent_gpu_health_status"}


def values(found: dict[str, list], name: str) -> dict[str, float]:
    """gpu index -> value, for a family with one sample per GPU."""
    return {s.labels["gpu"]: s.value for s in found[name]}


# --- no snapshot yet ----------------------------------------------------------------------


def test_no_snapshot_exports_only_build_info_and_the_process():
    found = samples(None)
    assert set(found) - {f.name for f in process_families()} == {"gpuagent_build_info"}
    assert found["process_resident_memory_bytes"][0].value > 0
    assert found["process_threads"][0].value >= 1
    (info,) = found["gpuagent_build_info"]
    assert info.value == 1.0
    assert info.labels == {
        "version": VERSION,
        "driver_version": "",
        "nvml_version": "",
        "cuda_driver_version": "",
    }


# --- eight healthy GPUs -------------------------------------------------------------------


def test_build_info_carries_versions():
    (info,) = samples(snapshot())["gpuagent_build_info"]
    assert info.labels == {
        "version": VERSION,
        "driver_version": DRIVER,
        "nvml_version": "12.550.54.15",
        "cuda_driver_version": "12.4",
    }


def test_dcgm_series_carry_dcgm_exporter_labels():
    found = samples(snapshot())
    temps = sorted(found["DCGM_FI_DEV_GPU_TEMP"], key=lambda s: int(s.labels["gpu"]))
    assert len(temps) == 8
    for index, sample in enumerate(temps):
        assert sample.labels == {
            "gpu": str(index),
            "UUID": f"GPU-00000000-0000-0000-0000-00000000000{index}",
            "pci_bus_id": NVML_BUS_IDS[index],
            "device": f"nvidia{index}",
            "modelName": MODEL,
            "Hostname": HOSTNAME,
            "DCGM_FI_DRIVER_VERSION": DRIVER,
        }
        assert sample.value == 30.0 + index


def test_every_table_metric_is_exported_for_every_gpu_with_its_labels():
    found = samples(snapshot())
    for metric in (*DCGM_GPU_METRICS, *AGENT_GPU_METRICS):
        expected_labels = set(DCGM_LABELS if metric.name.startswith("DCGM_") else GPU_LABELS)
        # The text parser names a counter's family without its _total suffix.
        family = found[metric.name.removesuffix("_total")]
        assert len(family) == 8, metric.name
        assert all(s.name == metric.name for s in family), metric.name
        assert all(set(s.labels) == expected_labels for s in family), metric.name


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("DCGM_FI_DEV_SM_CLOCK", 1980.0),
        ("DCGM_FI_DEV_MEM_CLOCK", 2619.0),
        ("DCGM_FI_DEV_MEMORY_TEMP", 42.0),
        ("DCGM_FI_DEV_GPU_TEMP", 32.0),
        ("DCGM_FI_DEV_POWER_USAGE", 102.5),
        ("DCGM_FI_DEV_POWER_USAGE_INSTANT", 105.25),
        ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 1_000_000_002.0),
        ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", 14.0),
        ("DCGM_FI_DEV_PCIE_LINK_GEN", 5.0),
        ("DCGM_FI_DEV_PCIE_LINK_WIDTH", 16.0),
        ("DCGM_FI_DEV_GPU_UTIL", 92.0),
        ("DCGM_FI_DEV_MEM_COPY_UTIL", 52.0),
        ("DCGM_FI_DEV_ENC_UTIL", 0.0),
        ("DCGM_FI_DEV_DEC_UTIL", 1.0),
        ("DCGM_FI_DEV_FB_FREE", 81559.0 - 2048.0),
        ("DCGM_FI_DEV_FB_USED", 2048.0),
        ("DCGM_FI_DEV_FB_RESERVED", 520.0),
        ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", 2.0),
        ("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", 12.0),
        ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", 2.0),
        ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", 0.0),
        ("DCGM_FI_DEV_ROW_REMAP_FAILURE", 0.0),
        ("DCGM_FI_DEV_RETIRED_PENDING", 0.0),
        ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", 2.0),
        ("DCGM_FI_DEV_POWER_MGMT_LIMIT", 700.0),
        ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", 1.0),
        ("gpuagent_gpu_persistence_mode", 1.0),
        ("gpuagent_gpu_mig_mode", 0.0),
        ("gpuagent_gpu_ecc_enabled", 1.0),
        ("gpuagent_gpu_pcie_link_generation", 5.0),
        ("gpuagent_gpu_pcie_link_generation_max", 5.0),
        ("gpuagent_gpu_pcie_link_width", 16.0),
        ("gpuagent_gpu_pcie_link_width_max", 16.0),
        ("gpuagent_gpu_power_limit_watts", 700.0),
        ("gpuagent_gpu_power_limit_requested_watts", 700.0),
        ("gpuagent_gpu_compute_mode", 3.0),
        ("gpuagent_gpu_ecc_default_enabled", 1.0),
        ("gpuagent_gpu_processes", 1.0),
        # 2048 MiB in use, 1024 of them held by the GPU's one process.
        ("gpuagent_gpu_memory_unattributed_bytes", 1024.0 * 1024 * 1024),
        ("gpuagent_gpu_processes_gone", 0.0),
    ],
)
def test_values_come_from_the_right_gpu(name, expected):
    assert values(samples(snapshot()), name)["2"] == expected


def test_counters_are_counters_under_dcgm_exporters_exact_names():
    types = families_by_name(snapshot())
    assert types["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == "counter"
    assert types["DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"] == "counter"
    assert types["DCGM_FI_DEV_GPU_TEMP"] == "gauge"
    text = exposition(snapshot())
    assert "\n# TYPE DCGM_FI_DEV_PCIE_REPLAY_COUNTER counter\n" in text
    assert "\n# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n" in text
    assert "\nDCGM_FI_DEV_PCIE_REPLAY_COUNTER{" in text
    assert "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total" not in text
    assert "_TOTAL_total" not in text
    assert "untyped" not in text


def test_all_gpus_up_and_node_metrics():
    found = samples(snapshot())
    assert values(found, "gpuagent_gpu_up") == {str(i): 1.0 for i in range(8)}
    assert [s.value for s in found["gpuagent_nvml_up"]] == [1.0]
    assert [s.value for s in found["gpuagent_snapshot_timestamp_seconds"]] == [1_700_000_001.5]
    assert [s.value for s in found["gpuagent_simulated"]] == [0.0]
    assert "gpuagent_snapshot_age_seconds" not in found


def test_clock_event_reasons_decode_each_bit():
    values_ = replace(readings(0), clock_event_reasons=0x4 | 0x40)
    found = samples(snapshot(gpus=(ok_gpu(0, values_),), findings=()))
    active = {s.labels["reason"]: s.value for s in found["gpuagent_gpu_clock_event_reasons"]}
    assert active == {
        "gpu_idle": 0.0,
        "applications_clocks": 0.0,
        "sw_power_cap": 1.0,
        "hw_slowdown": 0.0,
        "sync_boost": 0.0,
        "sw_thermal": 0.0,
        "hw_thermal": 1.0,
        "power_brake": 0.0,
    }
    # And the mask itself under DCGM's name, every bit of it (0x100: display clock setting).
    values_ = replace(readings(0), clock_event_reasons=0x4 | 0x40 | 0x100)
    found = samples(snapshot(gpus=(ok_gpu(0, values_),), findings=()))
    assert values(found, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS") == {"0": 324.0}


@pytest.mark.parametrize(
    ("requested", "enforced", "served"),
    [
        (700.0, 700.0, 700.0),  # an H200 at its default
        (1000.0, 900.0, 1000.0),  # a GH200 module sharing power: the limit asked for
        (450.5, 450.5, 450.0),  # DCGM divides NVML's milliwatts in integers
    ],
)
def test_power_management_limit_is_the_requested_limit_in_whole_watts(requested, enforced, served):
    values_ = replace(readings(0), power_requested_limit_w=requested, power_limit_w=enforced)
    found = samples(snapshot(gpus=(ok_gpu(0, values_),), findings=()))
    assert values(found, "DCGM_FI_DEV_POWER_MGMT_LIMIT") == {"0": served}
    assert values(found, "gpuagent_gpu_power_limit_watts") == {"0": enforced}


def test_nvlink_up_per_link_skips_unknown_links():
    values_ = replace(readings(0), nvlink_up=(True, False, None, True))
    found = samples(snapshot(gpus=(ok_gpu(0, values_),), findings=()))
    links = {s.labels["link"]: s.value for s in found["gpuagent_gpu_nvlink_up"]}
    assert links == {"0": 1.0, "1": 0.0, "3": 1.0}


def test_source_metrics_like_node_exporter_collector_stats():
    found = samples(snapshot())

    def by_source(name):
        return {s.labels["source"]: s.value for s in found[name]}

    assert by_source("gpuagent_source_up") == {"nvml": 1.0, "kmsg": 0.0}
    assert by_source("gpuagent_source_consecutive_failures") == {"nvml": 0.0, "kmsg": 3.0}
    # Never succeeded / never timed: absent rather than a made-up zero.
    assert by_source("gpuagent_source_last_success_timestamp_seconds") == {"nvml": 1_700_000_000.0}
    assert by_source("gpuagent_source_duration_seconds") == {"nvml": 0.012}


def test_nvml_down_is_exported():
    found = samples(snapshot(nvml=NvmlStatus(ok=False, problem="driver_not_loaded"), gpus=()))
    assert [s.value for s in found["gpuagent_nvml_up"]] == [0.0]
    assert "gpuagent_gpu_up" not in found
    assert not any(name.startswith("DCGM_") for name in found)


# --- lost, timed out and failed GPUs ------------------------------------------------------


@pytest.mark.parametrize(("index", "status"), [(3, "lost"), (5, "timeout"), (6, "error")])
def test_a_gpu_that_does_not_answer_serves_only_up_zero_and_health(index, status):
    found = samples(degraded_snapshot())
    assert values(found, "gpuagent_gpu_up")[str(index)] == 0.0, status
    served = {name for name, got in found.items() if for_gpu(got, index)}
    assert served == {"gpuagent_gpu_up", *HEALTH_NAMES}


def test_the_other_gpus_keep_all_their_series():
    found = samples(degraded_snapshot())
    for name in PER_GPU_VALUE_NAMES:
        gpus = {s.labels["gpu"] for s in found[name]}
        assert gpus == {"0", "1", "2", "4", "7"}, name


def test_ok_status_without_readings_is_not_up():
    no_readings = replace(ok_gpu(0), readings=None)
    found = samples(snapshot(gpus=(no_readings,), findings=()))
    assert values(found, "gpuagent_gpu_up") == {"0": 0.0}
    assert not PER_GPU_VALUE_NAMES & set(found)


def test_unsupported_values_are_absent_not_zero():
    found = samples(snapshot(gpus=(ok_gpu(0, GpuReadings()),), findings=()))
    assert values(found, "gpuagent_gpu_up") == {"0": 1.0}
    # The last XID is event history (0 until one), not a reading.
    assert {name for name in found if name.startswith("DCGM_")} == {"DCGM_FI_DEV_XID_ERRORS"}
    # Only what does not depend on a reading: static limits, and the (empty) process list.
    served = PER_GPU_VALUE_NAMES & set(found)
    assert served == {
        "gpuagent_gpu_ecc_default_enabled",
        "gpuagent_gpu_pcie_link_generation_max",
        "gpuagent_gpu_pcie_link_width_max",
        "gpuagent_gpu_processes",
        "gpuagent_gpu_processes_gone",
        "gpuagent_gpu_sm_clock_max_mhz",
    }
    assert values(found, "gpuagent_gpu_processes") == {"0": 0.0}


# --- health -------------------------------------------------------------------------------


def test_gpu_health_per_check_and_worst_per_gpu():
    findings = (
        *ok_findings(),
        Finding(check="ecc", severity=Severity.WARN, reason="sbe storm", gpu=BUS_IDS[1]),
        Finding(check="xid", severity=Severity.CRITICAL, reason="XID 79", gpu=BUS_IDS[2]),
        Finding(check="thermal", severity=Severity.UNKNOWN, reason="no sensor", gpu=BUS_IDS[4]),
    )
    found = samples(snapshot(findings=findings))
    checks = {(s.labels["gpu"], s.labels["check"]): s.value for s in found["gpuagent_gpu_health"]}
    assert checks[("0", "ecc")] == 0.0
    # Two findings for GPU 1's "ecc" check: one series, the worse one.
    assert checks[("1", "ecc")] == 1.0
    assert checks[("2", "xid")] == 2.0
    assert checks[("4", "thermal")] == 3.0
    assert len(found["gpuagent_gpu_health"]) == len(checks)
    status = values(found, "gpuagent_gpu_health_status")
    assert status == {"0": 0, "1": 1, "2": 2, "3": 0, "4": 3, "5": 0, "6": 0, "7": 0}
    # CRITICAL outranks UNKNOWN for the node.
    assert [s.value for s in found["gpuagent_node_health"]] == [2.0]


def test_gpu_health_series_carry_gpu_labels():
    found = samples(snapshot())
    sample = for_gpu(found["gpuagent_gpu_health"], 0)[0]
    assert set(sample.labels) == {*GPU_LABELS, "check"}
    assert sample.labels["pci_bus_id"] == NVML_BUS_IDS[0]


def test_lost_gpu_health_is_critical():
    found = samples(degraded_snapshot())
    assert values(found, "gpuagent_gpu_health_status")["3"] == 2.0
    assert values(found, "gpuagent_gpu_health_status")["5"] == 3.0


def test_node_level_checks():
    findings = (
        Finding(check="driver", severity=Severity.OK, reason="loaded"),
        Finding(check="fabricmanager", severity=Severity.WARN, reason="restarting"),
        Finding(check="fabricmanager", severity=Severity.OK, reason="was fine"),
    )
    found = samples(snapshot(findings=findings))
    checks = {s.labels["check"]: s.value for s in found["gpuagent_node_check_health"]}
    assert checks == {"driver": 0.0, "fabricmanager": 1.0}
    assert [s.value for s in found["gpuagent_node_health"]] == [1.0]
    assert "gpuagent_gpu_health" not in found


def test_finding_for_a_gpu_nvml_does_not_list_keeps_its_health():
    stray = Finding(check="xid", severity=Severity.CRITICAL, reason="XID 79", gpu="0000:e1:00.0")
    found = samples(snapshot(findings=(*ok_findings(), stray)))
    (status,) = [
        s
        for s in found["gpuagent_gpu_health_status"]
        if s.labels["pci_bus_id"] == "00000000:E1:00.0"
    ]
    assert status.value == 2.0
    assert status.labels["gpu"] == ""
    assert status.labels["Hostname"] == HOSTNAME
    assert "00000000:E1:00.0" not in {s.labels["pci_bus_id"] for s in found["gpuagent_gpu_up"]}


def test_no_findings_means_ok():
    found = samples(snapshot(findings=()))
    assert values(found, "gpuagent_gpu_health_status") == {str(i): 0.0 for i in range(8)}
    assert [s.value for s in found["gpuagent_node_health"]] == [0.0]
    assert "gpuagent_gpu_health" not in found
    assert "gpuagent_node_check_health" not in found


# --- PCI bus ids --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sysfs", "nvml"),
    [
        ("0000:18:00.0", "00000000:18:00.0"),
        ("0000:3b:00.0", "00000000:3B:00.0"),
        ("0001:ab:1f.7", "00000001:AB:1F.7"),
        ("00000000:18:00.0", "00000000:18:00.0"),
        ("not-a-bus-id", "not-a-bus-id"),
    ],
)
def test_nvml_bus_id(sysfs, nvml):
    assert nvml_bus_id(sysfs) == nvml


# --- one snapshot per scrape, built once --------------------------------------------------


class _Holder:
    def __init__(self, snap):
        self.snap = snap
        self.reads = 0

    def __call__(self):
        self.reads += 1
        return self.snap


def test_same_snapshot_reuses_the_same_families():
    holder = _Holder(snapshot())
    collector = SnapshotCollector(holder, VERSION)
    first = collector.collect()
    assert collector.collect() is first
    assert holder.reads == 2  # exactly one read per scrape


def test_new_snapshot_rebuilds():
    holder = _Holder(snapshot())
    collector = SnapshotCollector(holder, VERSION)
    first = collector.collect()
    holder.snap = degraded_snapshot()
    second = collector.collect()
    assert second is not first
    assert collector.collect() is second
    # An equal but distinct snapshot is a new snapshot: identity, not equality, decides.
    holder.snap = replace(holder.snap)
    assert collector.collect() is not second


def test_no_snapshot_is_cached_too():
    collector = SnapshotCollector(lambda: None, VERSION)
    assert collector.collect() is collector.collect()


def test_registering_does_not_read_the_snapshot():
    holder = _Holder(snapshot())
    build_registry(holder, VERSION)
    assert holder.reads == 0


def test_the_global_registry_is_untouched():
    registry = build_registry(snapshot, VERSION)
    generate_latest(registry)
    assert b"gpuagent_" not in generate_latest(REGISTRY)


def test_simulated_snapshot_is_marked():
    found = samples(snapshot(simulated=True))
    assert [s.value for s in found["gpuagent_simulated"]] == [1.0]


def test_only_gpu_findings_reach_gpu_families():
    health = NodeHealth(findings=(Finding(check="driver", severity=Severity.WARN, reason="x"),))
    found = samples(snapshot(health=health))
    assert "gpuagent_gpu_health" not in found
    assert values(found, "gpuagent_gpu_health_status") == {str(i): 0.0 for i in range(8)}


# --- any combination of supported and unsupported values renders -------------------------

_OPTIONAL_FIELDS = [
    name
    for name in GpuReadings.__slots__
    if name
    not in (  # tuples, covered above
        "nvlink_up",
        "nvlink_effective_ber",
        "nvlink_symbol_ber",
        "c2c_up",
        "processes",
        "graphics_processes",
    )
]


@settings(max_examples=60, deadline=None)
@given(missing=st.sets(st.sampled_from(_OPTIONAL_FIELDS)), mask=st.integers(0, 0xFFFF))
def test_any_mix_of_missing_values_renders_valid_exposition(missing, mask):
    changes = {"clock_event_reasons": mask, **dict.fromkeys(missing)}
    values_ = replace(readings(0), **changes)
    text = exposition(snapshot(gpus=(ok_gpu(0, values_), ok_gpu(1)), findings=()))
    found = samples_from_text(text)
    dcgm_fields = {
        "DCGM_FI_DEV_GPU_TEMP": "temperature_c",
        "DCGM_FI_DEV_POWER_USAGE": "power_w",
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": "energy_mj",
    }
    for name, field in dcgm_fields.items():
        gpus = {s.labels["gpu"] for s in found.get(name, [])}
        assert gpus == ({"1"} if field in missing else {"0", "1"})
    # No duplicate series anywhere.
    for name, got in found.items():
        keys = [(s.name, tuple(sorted(s.labels.items()))) for s in got]
        assert len(keys) == len(set(keys)), name


# --- docs/metrics.md lists everything -----------------------------------------------------


def test_every_exported_name_is_documented():
    docs = (Path(__file__).resolve().parents[1] / "docs" / "metrics.md").read_text()
    specs = [v for v in vars(names).values() if isinstance(v, names.MetricSpec)]
    documented = [*DCGM_GPU_METRICS, *AGENT_GPU_METRICS, *specs]
    for metric in documented:
        assert f"| `{metric.name}` |" in docs, metric.name
        assert metric.help in docs, metric.name
    for reason, bit in names.CLOCK_EVENT_REASONS:
        assert f"| `{reason}` | {bit:#x} |" in docs
    process = {family.name for family in process_families()}
    for sample in (s for family in process_families() for s in family.samples):
        assert f"| `{sample.name}` |" in docs, sample.name
    # And nothing is exported that is not in the table.
    exported = set(samples(degraded_snapshot())) | set(samples(snapshot(simulated=True)))
    exported -= process | {f"{name}_total" for name in process}
    # The text parser names a counter's family without its _total suffix.
    assert exported <= {m.name for m in documented} | {
        m.name.removesuffix("_total") for m in documented
    }
