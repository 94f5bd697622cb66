"""The simulator's GPM (nvmlGpm*) through the real pynvml code."""

from __future__ import annotations

import ctypes
import dataclasses
from typing import Any

import pynvml
import pytest

from conftest import FakeClock, MakeNode
from gpuagent.sim import Scenario, SimulatedNode, catalog, parse_scenario

_BUSY = {"pid": 40, "name": "train.py", "used_mib": 1000}
_ACTIVITY = (
    pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL,
    pynvml.NVML_GPM_METRIC_SM_UTIL,
    pynvml.NVML_GPM_METRIC_SM_OCCUPANCY,
    pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL,
    pynvml.NVML_GPM_METRIC_HMMA_TENSOR_UTIL,
    pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL,
    pynvml.NVML_GPM_METRIC_FP32_UTIL,
)
_BYTES = (
    pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC,
    pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC,
    pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC,
    pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC,
)


def metrics(first: Any, second: Any, ids: tuple[int, ...]) -> dict[int, float | int]:
    """metric id → value, or the metric's NVML error code (as a negative number)."""
    request = pynvml.c_nvmlGpmMetricsGet_t()
    request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = len(ids)
    request.sample1, request.sample2 = first, second
    for slot, metric in enumerate(ids):
        request.metrics[slot].metricId = metric
    pynvml.nvmlGpmMetricsGet(request)
    found: dict[int, float | int] = {}
    for slot, metric in enumerate(ids):
        entry = request.metrics[slot]
        ok = entry.nvmlReturn == pynvml.NVML_SUCCESS
        found[metric] = entry.value if ok else -entry.nvmlReturn
    return found


class Sampler:
    """Two samples of one GPU (or GPU instance), alternated as a poller does."""

    def __init__(self, handle: Any, clock: FakeClock, instance: int | None = None) -> None:
        self.handle, self.clock, self.instance = handle, clock, instance
        self.samples = [pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()]
        self._take(self.samples[0])

    def _take(self, sample: Any) -> None:
        if self.instance is None:
            pynvml.nvmlGpmSampleGet(self.handle, sample)
        else:
            pynvml.nvmlGpmMigSampleGet(self.handle, self.instance, sample)

    def after(self, seconds: float, ids: tuple[int, ...] = _ACTIVITY) -> dict[int, float | int]:
        self.clock.advance(seconds)
        previous, current = self.samples
        self._take(current)
        self.samples.reverse()
        return metrics(previous, current, ids)


def test_hopper_has_gpm_and_older_gpus_do_not(make_node: MakeNode) -> None:
    make_node('[node]\ngpus = 1\nmodel = "h200"\n')
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice == 1
    for model in ("a100-sxm4", "l40s", "v100-sxm2"):
        make_node(f'[node]\ngpus = 1\nmodel = "{model}"\n')
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        assert pynvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice == 0, model
        sample = pynvml.nvmlGpmSampleAlloc()
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlGpmSampleGet(handle, sample)
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlGpmMigSampleGet(handle, 1, sample)
        pynvml.nvmlGpmSampleFree(sample)


def test_blackwell_has_gpm() -> None:
    hopper = catalog.H100_SXM
    blackwell = dataclasses.replace(hopper, key="b200-test", architecture="Blackwell")
    with SimulatedNode(Scenario(profile=blackwell)) as node:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        assert pynvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice == 1
        assert node.gpu_count == 8


def test_a_driver_before_gpm_has_no_gpm_functions(make_node: MakeNode) -> None:
    make_node('[node]\ngpus = 1\ndriver_version = "515.105.01"\n')
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        pynvml.nvmlGpmQueryDeviceSupport(handle)


def test_idle_is_near_zero_and_a_process_raises_activity(make_node: MakeNode) -> None:
    clock = FakeClock()
    node = make_node('[node]\ngpus = 2\nmodel = "h100-sxm"\n', clock=clock)
    sampler = Sampler(pynvml.nvmlDeviceGetHandleByIndex(0), clock)
    idle = sampler.after(5, _ACTIVITY + _BYTES)
    assert all(idle[m] == 0.0 for m in _ACTIVITY)
    assert 0 < idle[pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC] < 1  # MiB/s: a trickle
    node.inject("process", 0, _BUSY)
    rising = sampler.after(5)  # the start falls between the two samples
    busy = sampler.after(5, _ACTIVITY + _BYTES)
    sm, tensor = pynvml.NVML_GPM_METRIC_SM_UTIL, pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL
    assert 0 < rising[sm] < busy[sm]
    assert 0 < rising[tensor] < busy[tensor]
    graphics = busy[pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL]
    assert 85 <= graphics <= 100  # follows the GPU's utilization
    assert graphics > busy[sm] > busy[tensor] > busy[pynvml.NVML_GPM_METRIC_HMMA_TENSOR_UTIL] > 0
    assert busy[pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC] > 1000  # MiB/s
    nvlink = busy[pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC]
    assert nvlink > 10_000  # 18 NVLinks carrying collectives
    # The other GPU stayed idle.
    other = Sampler(pynvml.nvmlDeviceGetHandleByIndex(1), clock)
    assert other.after(5)[sm] == 0.0
    node.inject("process_exit", 0, {"pid": 40})
    sampler.after(5)
    assert sampler.after(5)[sm] == 0.0


def test_links_and_units(make_node: MakeNode) -> None:
    clock = FakeClock()
    node = make_node('[node]\ngpus = 1\nmodel = "h100-sxm"\nnvlinks = 18\n', clock=clock)
    node.inject("process", 0, _BUSY)
    sampler = Sampler(pynvml.nvmlDeviceGetHandleByIndex(0), clock)
    links = tuple(pynvml.NVML_GPM_METRIC_NVLINK_L0_RX_PER_SEC + 2 * n for n in range(18))
    found = sampler.after(2, (pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC, *links))
    total = found[pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC]
    assert sum(found[link] for link in links) == pytest.approx(total)
    # Link 18 and up do not exist on an H100; NVDEC is not modelled: NOT_SUPPORTED each.
    found = sampler.after(1, (pynvml.NVML_GPM_METRIC_NVLINK_L18_RX_PER_SEC, 30))
    assert set(found.values()) == {-pynvml.NVML_ERROR_NOT_SUPPORTED}


def test_a_gpu_without_nvlink_has_no_nvlink_rate(make_node: MakeNode) -> None:
    clock = FakeClock()
    make_node('[node]\ngpus = 1\nmodel = "h100-pcie"\n', clock=clock)
    sampler = Sampler(pynvml.nvmlDeviceGetHandleByIndex(0), clock)
    found = sampler.after(1, _BYTES)
    assert found[pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC] == -pynvml.NVML_ERROR_NOT_SUPPORTED
    assert found[pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC] > 0


def test_wrong_versions_and_bad_samples_fail_as_nvml_documents(make_node: MakeNode) -> None:
    clock = FakeClock()
    make_node('[node]\ngpus = 2\nmodel = "h100-sxm"\n', clock=clock)
    first, second = (pynvml.nvmlDeviceGetHandleByIndex(i) for i in (0, 1))
    support = pynvml.c_nvmlGpmSupport_t()
    support.version = 7
    code = pynvml.nvmlLib.nvmlGpmQueryDeviceSupport(first, ctypes.byref(support))
    assert code == pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH

    one, two = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
    with pytest.raises(pynvml.NVMLError_InvalidArgument):  # never filled
        metrics(one, two, _ACTIVITY)
    pynvml.nvmlGpmSampleGet(first, one)
    clock.advance(1)
    pynvml.nvmlGpmSampleGet(second, two)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):  # two different GPUs
        metrics(one, two, _ACTIVITY)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):  # no time between them
        metrics(one, one, _ACTIVITY)

    request = pynvml.c_nvmlGpmMetricsGet_t()
    request.version = 2
    with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch):
        pynvml.nvmlGpmMetricsGet(request)
    request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = 0
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlGpmMetricsGet(request)

    pynvml.nvmlGpmSampleFree(two)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):  # freed
        pynvml.nvmlGpmSampleGet(first, two)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):  # freed twice
        pynvml.nvmlGpmSampleFree(two)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):  # NULL
        pynvml.nvmlGpmSampleGet(first, pynvml.c_nvmlGpmSample_t())


def test_mig_instances_are_sampled_by_id(make_node: MakeNode) -> None:
    clock = FakeClock()
    node = make_node(
        '[node]\ngpus = 1\nmodel = "h100-sxm"\nnvlinks = 18\nmig_mode = true\n'
        'mig_profiles = ["3g.40gb", "2g.20gb", "1g.10gb"]\n',
        clock=clock,
    )
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    profile = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(
        handle, pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE
    )
    slots = (pynvml.c_nvmlGpuInstance_t * profile.instanceCount)()
    count = ctypes.c_uint(0)
    pynvml.nvmlDeviceGetGpuInstances(handle, profile.id, slots, ctypes.byref(count))
    assert count.value == 1
    info = pynvml.nvmlGpuInstanceGetInfo(slots[0])
    assert (info.id, info.profileId) == (1, profile.id)
    node.inject("process", 0, _BUSY)
    busy = Sampler(handle, clock, instance=1)
    idle = Sampler(handle, clock, instance=2)
    whole = Sampler(handle, clock)
    clock.advance(5)
    sm = pynvml.NVML_GPM_METRIC_SM_UTIL
    in_busy, in_idle, in_whole = busy.after(0), idle.after(0), whole.after(0)
    assert in_busy[sm] > 50
    assert in_idle[sm] == 0.0
    assert in_whole[sm] == pytest.approx(in_busy[sm] * 3 / 7)  # 3 of the 7 slices busy
    # NVLink belongs to the whole GPU, not to an instance.
    nvlink = (pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC,)
    assert busy.after(1, nvlink) == {nvlink[0]: -pynvml.NVML_ERROR_NOT_SUPPORTED}
    sample = pynvml.nvmlGpmSampleAlloc()
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlGpmMigSampleGet(handle, 9, sample)


def test_mig_sampling_needs_mig_mode(make_node: MakeNode) -> None:
    make_node('[node]\ngpus = 1\nmodel = "h100-sxm"\n')
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlGpmMigSampleGet(handle, 1, pynvml.nvmlGpmSampleAlloc())


def test_nvlink_throughput_fields_count_kib_with_the_load(make_node: MakeNode) -> None:
    clock = FakeClock()
    node = make_node('[node]\ngpus = 1\nmodel = "h100-sxm"\nnvlinks = 18\n', clock=clock)
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    every = 0xFFFFFFFF
    wanted = [
        (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, every),
        (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, every),
        (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, 0),
    ]

    def read() -> list[int]:
        values = pynvml.nvmlDeviceGetFieldValues(handle, wanted)
        assert all(v.nvmlReturn == pynvml.NVML_SUCCESS for v in values)
        return [v.value.ullVal for v in values]

    start = read()
    clock.advance(10)
    assert read() == start  # idle: no NVLink traffic
    node.inject("process", 0, _BUSY)
    clock.advance(10)
    tx, rx, link0 = (now - then for now, then in zip(read(), start, strict=True))
    assert tx == rx > 10 * 1024 * 1024  # KiB over 10 s: tens of GB/s
    assert link0 == pytest.approx(rx / 18, rel=0.01)


def test_no_nvlink_no_throughput_field(make_node: MakeNode) -> None:
    make_node('[node]\ngpus = 1\nmodel = "h100-pcie"\n')
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    (value,) = pynvml.nvmlDeviceGetFieldValues(
        handle, [(pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 0xFFFFFFFF)]
    )
    assert value.nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED


def test_samples_are_recognised_by_the_pointer_handed_out() -> None:
    with SimulatedNode(parse_scenario('[node]\ngpus = 1\nmodel = "h100-sxm"\n')):
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        sample = pynvml.nvmlGpmSampleAlloc()
        # A pointer to memory the library did not hand out is not a sample.
        stranger = pynvml.c_nvmlGpmSample_t(pynvml.struct_c_nvmlGpmSample_t())
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            pynvml.nvmlGpmSampleGet(handle, stranger)
        assert pynvml.nvmlGpmSampleGet(handle, sample) is sample
