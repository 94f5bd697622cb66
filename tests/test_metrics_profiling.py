"""The profiling series (DCGM_FI_PROF_*, NVLink bandwidth): GPM first, DCGM for the rest."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pynvml
import pytest

from conftest import parse_metrics
from gpuagent.metrics import names
from gpuagent.model import DcgmStatus, GpuProfiling
from test_metrics_support import (
    BUS_IDS,
    NVML_BUS_IDS,
    exposition,
    failed_gpu,
    gpm,
    ok_gpu,
    profiled_snapshot,
    profiling_values,
    readings,
    samples,
    snapshot,
)

NAMES = {m.name: m for m in names.DCGM_PROFILING_METRICS}
TENSOR = "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"
PCIE_RX = "DCGM_FI_PROF_PCIE_RX_BYTES"
NVLINK = "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"


def by_gpu(found: dict[str, list], name: str) -> dict[str, float]:
    return {s.labels["gpu"]: s.value for s in found[name] if "GPU_I_ID" not in s.labels}


def test_gpm_values_are_served_per_gpu_with_dcgm_labels() -> None:
    found = samples(profiled_snapshot())
    for metric in names.DCGM_PROFILING_METRICS:
        expected = {str(i): dict(profiling_values(i))[metric.field_id] for i in range(8)}
        assert by_gpu(found, metric.name) == pytest.approx(expected), metric.name
        assert all(set(s.labels) == set(names.DCGM_LABELS) for s in found[metric.name])
    # Ratios stay ratios and rates stay bytes per second: served as given.
    assert by_gpu(found, TENSOR)["0"] == pytest.approx(0.4)
    assert by_gpu(found, PCIE_RX)["3"] == 2e9 + 3


def test_types_and_help_follow_dcgm_exporter() -> None:
    text = exposition(profiled_snapshot())
    families = {f.name: f for f in parse_metrics(text)}
    assert families[TENSOR].type == "gauge"
    assert families[TENSOR].documentation == "Ratio of cycles the tensor (HMMA) pipe is active."
    assert families[NVLINK].type == "counter"  # a dcgm-exporter counter, under its name


def test_a_gpu_without_values_gets_no_series_never_zeros() -> None:
    # GPUs 0-3 have GPM values; 4-7 (say A100s without DCGM) have none.
    gpus = tuple(
        ok_gpu(i, replace(readings(i), profiling=(gpm(i),) if i < 4 else ())) for i in range(8)
    )
    found = samples(snapshot(gpus=gpus))
    for metric in names.DCGM_PROFILING_METRICS:
        assert set(by_gpu(found, metric.name)) == {"0", "1", "2", "3"}
    # With no values anywhere, the families are not exported at all.
    plain = samples(snapshot())
    assert not set(NAMES) & set(plain)


def test_a_gpu_that_did_not_answer_gets_no_series() -> None:
    snap = profiled_snapshot()
    gpus = (failed_gpu(0, "lost"), *snap.gpus[1:])
    found = samples(replace(snap, gpus=gpus))
    assert "0" not in by_gpu(found, TENSOR)
    assert len(by_gpu(found, TENSOR)) == 7


def test_only_the_fields_measured_are_served() -> None:
    partial = GpuProfiling(source="gpm", values=((1004, 0.25),))
    gpus = (ok_gpu(0, replace(readings(0), profiling=(partial,))),)
    found = samples(snapshot(gpus=gpus))
    assert set(NAMES) & set(found) == {TENSOR}


def test_mig_instances_carry_dcgm_exporters_labels() -> None:
    found = samples(profiled_snapshot((1, "3g.40gb"), (5, "1g.10gb")))
    tensor = found[TENSOR]
    instances = {
        (s.labels["GPU_I_ID"], s.labels["GPU_I_PROFILE"]): s.value
        for s in tensor
        if "GPU_I_ID" in s.labels
    }
    assert instances == pytest.approx({("1", "3g.40gb"): 0.401, ("5", "1g.10gb"): 0.405})
    for sample in tensor:
        if "GPU_I_ID" in sample.labels:
            assert sample.labels["gpu"] == "0"
            assert set(sample.labels) == {*names.DCGM_LABELS, *names.MIG_LABELS}
    # The whole GPU keeps its own series; NVLink is only the whole GPU's.
    assert by_gpu(found, TENSOR)["0"] == pytest.approx(0.4)
    assert all("GPU_I_ID" not in s.labels for s in found[NVLINK])


def _dcgm(*entries: tuple[str, GpuProfiling]) -> DcgmStatus:
    return DcgmStatus(state="up", profiling=entries)


def test_gpus_without_gpm_take_the_dcgm_sources_values() -> None:
    # A100s: no GPM. DCGM gives values for GPUs 1 (sysfs address) and 2 (NVML's form).
    from_dcgm = GpuProfiling(source="dcgm", values=((1004, 0.75), (1009, 123.0)))
    dcgm = _dcgm((BUS_IDS[1], from_dcgm), (NVML_BUS_IDS[2], from_dcgm))
    found = samples(snapshot(dcgm=dcgm))
    assert by_gpu(found, TENSOR) == {"1": 0.75, "2": 0.75}
    assert by_gpu(found, "DCGM_FI_PROF_PCIE_TX_BYTES") == {"1": 123.0, "2": 123.0}
    assert "DCGM_FI_PROF_SM_ACTIVE" not in found


def test_gpm_values_win_over_dcgm_for_the_same_gpu() -> None:
    from_dcgm = GpuProfiling(source="dcgm", values=((1004, 0.99),))
    snap = replace(profiled_snapshot(), dcgm=_dcgm((BUS_IDS[0], from_dcgm)))
    assert by_gpu(samples(snap), TENSOR)["0"] == pytest.approx(0.4)


def test_dcgm_mig_instances_are_labelled_too() -> None:
    instance = GpuProfiling(
        source="dcgm", values=((1004, 0.5),), gpu_instance_id=3, gpu_instance_profile="2g.20gb"
    )
    found = samples(snapshot(dcgm=_dcgm((BUS_IDS[4], instance))))
    (sample,) = found[TENSOR]
    assert sample.labels["gpu"] == "4"
    assert (sample.labels["GPU_I_ID"], sample.labels["GPU_I_PROFILE"]) == ("3", "2g.20gb")


def test_a_scrape_never_calls_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(name: str) -> None:
        raise AssertionError(f"a scrape called NVML ({name})")

    monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer", refuse)
    found = samples(profiled_snapshot((1, "3g.40gb")))
    assert TENSOR in found


def test_every_profiling_series_is_documented() -> None:
    docs = (Path(__file__).resolve().parents[1] / "docs" / "metrics.md").read_text()
    for metric in names.DCGM_PROFILING_METRICS:
        assert f"`{metric.name}`" in docs, metric.name
        assert metric.help in docs, metric.name
    for label in names.MIG_LABELS:
        assert f"`{label}`" in docs
