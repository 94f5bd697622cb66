"""GPU Performance Monitoring (GPM): the nvmlGpm* functions of the simulated library.

A real driver keeps cumulative activity counters per GPU (and per MIG GPU instance); a
GPM sample copies them with a timestamp, and nvmlGpmMetricsGet turns two samples into
rates: percent of the time between them a unit was busy, or MiB/s moved. The simulator
does the same. Its counters integrate the load model (`readings.utilization`): each
sample accrues the time since the previous sample of that GPU (or instance) at the mean
of the activity then and now, so a process starting between two samples shows as a
rise over one interval, not a jump. Idle, every activity is 0 and PCIe carries only a
trickle; busy, each unit is active for a fixed share of the GPU's utilization.

Hopper and Blackwell GPUs have GPM; older GPUs answer isSupportedDevice 0 and
NOT_SUPPORTED for samples, as the driver does. Drivers before GPM_DRIVER_MAJOR have no
nvmlGpm* symbols at all (pynvml then raises FunctionNotFound).

MIG: instance ids are 1, 2, ... in the order the instances were created; the GPU's
processes run in its first instance, so that one is busy and the others idle, and the
whole GPU's activity is the busy instance's weighted by its share of the slices.

The NVLink throughput fields of nvmlDeviceGetFieldValues (sim/fields.py) read the same
counters, so they and GPM's NVLink rates agree.
"""

from __future__ import annotations

import ctypes
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pynvml

from gpuagent.sim import codes, hardware
from gpuagent.sim.gpu import SimGpu, SimGpuInstance
from gpuagent.sim.profiles import GpuProfile

if TYPE_CHECKING:
    from gpuagent.sim.state import NodeState

Entry = Callable[..., Any]

# GPM came with the R520 driver (CUDA 11.8) and needs a Hopper or later GPU.
GPM_DRIVER_MAJOR = 520
GPM_ARCHITECTURES = frozenset({"Hopper", "Blackwell"})

# Activity of each unit as a share of the GPU's utilization (0-1): what a typical mixed
# training job shows (SMs mostly busy, tensor cores heavily used, little FP64).
_ACTIVITY_SHARES: dict[int, float] = {
    pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: 1.0,
    pynvml.NVML_GPM_METRIC_SM_UTIL: 0.85,
    pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: 0.45,
    pynvml.NVML_GPM_METRIC_INTEGER_UTIL: 0.12,
    pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 0.6,
    pynvml.NVML_GPM_METRIC_DFMA_TENSOR_UTIL: 0.01,
    pynvml.NVML_GPM_METRIC_HMMA_TENSOR_UTIL: 0.55,
    pynvml.NVML_GPM_METRIC_DMMA_TENSOR_UTIL: 0.02,
    pynvml.NVML_GPM_METRIC_IMMA_TENSOR_UTIL: 0.03,
    pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: 0.5,
    pynvml.NVML_GPM_METRIC_FP64_UTIL: 0.03,
    pynvml.NVML_GPM_METRIC_FP32_UTIL: 0.3,
    pynvml.NVML_GPM_METRIC_FP16_UTIL: 0.2,
}
# PCIe traffic: GB/s per lane by generation (after encoding), shares of the link used.
_PCIE_LANE_BYTES = {1: 0.25e9, 2: 0.5e9, 3: 0.985e9, 4: 1.969e9, 5: 3.938e9, 6: 7.563e9}
_PCIE_RX_SHARE = 0.08  # host to device: input batches
_PCIE_TX_SHARE = 0.03  # device to host: results, checkpoints
_PCIE_IDLE_BYTES = 64 * 1024.0  # driver housekeeping on an idle GPU, each way
# Bytes/s per NVLink and direction: NVLink 2 (Volta) to 4 (Hopper) 25 GB/s, 5 (Blackwell) 50.
_NVLINK_LINK_BYTES = {"Volta": 25e9, "Ampere": 25e9, "Hopper": 25e9, "Blackwell": 50e9}
_NVLINK_SHARE = 0.2  # collectives between the GPUs of a busy node
_PCIE_TX, _PCIE_RX = pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC, pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC
_NVLINK_RX = pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC
_NVLINK_TX = pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC
_NVLINK_L0_RX = pynvml.NVML_GPM_METRIC_NVLINK_L0_RX_PER_SEC
_NVLINK_LINKS_LOW = 18  # links 0-17 have ids 62-97; later links (18+) sit elsewhere
_BYTE_METRICS = frozenset({_PCIE_TX, _PCIE_RX, _NVLINK_RX, _NVLINK_TX})

# Whose counters a sample holds: (GPU index, GPU instance id; None for the whole GPU).
Scope = tuple[int, int | None]
_KIB = 1024.0
ALL_LINKS = 0xFFFFFFFF  # a field value's scopeId for the sum over every link


def supports_gpm(profile: GpuProfile) -> bool:
    return profile.architecture in GPM_ARCHITECTURES


@dataclass(slots=True)
class _Counters:
    """Cumulative activity of one GPU or instance: unit-seconds busy, and bytes moved."""

    at: float = 0.0
    rates: dict[int, float] = field(default_factory=dict)  # at ``at``: per second
    totals: dict[int, float] = field(default_factory=dict)


# Each GPU's counters, by GPU instance id (None: the whole GPU). Kept beside the GPU
# rather than in the library, so the NVLink throughput fields read the same counters.
_LEDGERS: weakref.WeakKeyDictionary[SimGpu, dict[int | None, _Counters]] = (
    weakref.WeakKeyDictionary()
)


def _rates(gpu: SimGpu, instance: SimGpuInstance | None, now: float) -> dict[int, float]:
    """Per-second activity (unit-seconds) and bytes of ``gpu`` or one of its instances."""
    # A replayed GPU without a utilization reading (MIG on) shows no activity.
    load = (gpu.readings.utilization(now) or 0.0) / 100.0
    if gpu.mig_mode and gpu.mig_instances:
        busy = gpu.mig_instances[0]
        if instance is None:
            load *= busy.profile.slices / gpu.profile.mig_slices
        elif instance is not busy:
            load = 0.0
    rates = {metric: share * load for metric, share in _ACTIVITY_SHARES.items()}
    generation = gpu.readings.pcie_generation(now) or 0
    link_bytes = _PCIE_LANE_BYTES.get(generation, 0.0) * gpu.pcie_width
    rates[_PCIE_RX] = _PCIE_IDLE_BYTES + _PCIE_RX_SHARE * link_bytes * load
    rates[_PCIE_TX] = _PCIE_IDLE_BYTES + _PCIE_TX_SHARE * link_bytes * load
    per_link = _NVLINK_LINK_BYTES.get(gpu.profile.architecture, 0.0) * _NVLINK_SHARE * load
    up = sum(gpu.nvlink_up) if instance is None else 0  # NVLink is not per instance
    rates[_NVLINK_RX] = rates[_NVLINK_TX] = per_link * up
    return rates


def counters(gpu: SimGpu, instance: SimGpuInstance | None, now: float) -> _Counters:
    """The counters of ``gpu`` (or one instance), accrued up to ``now``."""
    ledger = _LEDGERS.setdefault(gpu, {})
    key = None if instance is None else gpu.gpu_instance_id(instance)
    rates = _rates(gpu, instance, now)
    found = ledger.get(key)
    if found is None:
        found = ledger[key] = _Counters(now, rates, dict.fromkeys(rates, 0.0))
        return found
    seconds = max(now - found.at, 0.0)
    for metric, rate in rates.items():
        mean = (found.rates.get(metric, rate) + rate) / 2.0
        found.totals[metric] = found.totals.get(metric, 0.0) + mean * seconds
    found.at, found.rates = max(now, found.at), rates
    return found


def nvlink_throughput_kib(gpu: SimGpu, now: float, link: int, *, receive: bool) -> int:
    """NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX/TX: KiB moved since the driver loaded, on
    ``link`` (spread evenly over the links) or on all of them (ALL_LINKS)."""
    total = counters(gpu, None, now).totals[_NVLINK_RX if receive else _NVLINK_TX]
    share = 1.0 if link == ALL_LINKS else 1.0 / max(gpu.nvlinks, 1)
    return int(total * share / _KIB)


@dataclass(slots=True)
class _Sample:
    """What nvmlGpmSampleGet copied: whose counters, when, and their values."""

    target: pynvml.struct_c_nvmlGpmSample_t = field(default_factory=pynvml.struct_c_nvmlGpmSample_t)
    scope: Scope | None = None  # None: allocated, never filled
    at: float = 0.0
    totals: dict[int, float] = field(default_factory=dict)
    nvlinks: int = 0


class GpmDriver:
    """The driver side of GPM for one simulated node. Callers hold the node lock."""

    def __init__(self, state: NodeState) -> None:
        self._state = state
        self._samples: dict[int, _Sample] = {}  # by the address handed out

    # --- sample handles -----------------------------------------------------------------

    def _sample_for(self, pointer: Any) -> _Sample | None:
        try:
            return self._samples.get(ctypes.addressof(pointer.contents))
        except (AttributeError, TypeError, ValueError):  # not a sample pointer, or NULL
            return None

    def _fill(self, gpu: SimGpu, instance: SimGpuInstance | None, pointer: Any, now: float) -> int:
        sample = self._sample_for(pointer)
        if sample is None:
            return codes.ERROR_INVALID_ARGUMENT
        scope = (gpu.index, None if instance is None else gpu.gpu_instance_id(instance))
        accrued = counters(gpu, instance, now)
        sample.scope, sample.at, sample.totals = scope, accrued.at, dict(accrued.totals)
        sample.nvlinks = len(gpu.nvlink_up) if instance is None else 0
        return codes.SUCCESS

    # --- the C functions ------------------------------------------------------------------

    def system_functions(self) -> dict[str, Entry]:
        if self._state.spec.driver_major < GPM_DRIVER_MAJOR:
            return {}
        return {
            "nvmlGpmSampleAlloc": self._sample_alloc,
            "nvmlGpmSampleFree": self._sample_free,
            "nvmlGpmMetricsGet": self._metrics_get,
            "nvmlGpuInstanceGetInfo": self._instance_info,
        }

    def device_functions(self) -> dict[str, Entry]:
        if self._state.spec.driver_major < GPM_DRIVER_MAJOR:
            return {}
        return {
            "nvmlGpmQueryDeviceSupport": self._query_support,
            "nvmlGpmSampleGet": self._sample_get,
            "nvmlGpmMigSampleGet": self._mig_sample_get,
        }

    def _sample_alloc(self, _now: float, out: Any) -> int:
        if out is None:
            return codes.ERROR_INVALID_ARGUMENT
        sample = _Sample()
        self._samples[ctypes.addressof(sample.target)] = sample
        out._obj.contents = sample.target  # noqa: SLF001 - ctypes keeps the byref target here
        return codes.SUCCESS

    def _sample_free(self, _now: float, pointer: Any) -> int:
        sample = self._sample_for(pointer)
        if sample is None:
            return codes.ERROR_INVALID_ARGUMENT
        del self._samples[ctypes.addressof(sample.target)]
        return codes.SUCCESS

    @staticmethod
    def _query_support(gpu: SimGpu, _now: float, out: Any) -> int:
        support = out._obj  # noqa: SLF001 - the byref target
        if support.version != pynvml.NVML_GPM_SUPPORT_VERSION:
            return codes.ERROR_ARGUMENT_VERSION_MISMATCH
        support.isSupportedDevice = int(supports_gpm(gpu.profile))
        return codes.SUCCESS

    def _sample_get(self, gpu: SimGpu, now: float, pointer: Any) -> int:
        if not supports_gpm(gpu.profile):
            return codes.ERROR_NOT_SUPPORTED
        return self._fill(gpu, None, pointer, now)

    def _mig_sample_get(self, gpu: SimGpu, now: float, gi_id: Any, pointer: Any) -> int:
        if not supports_gpm(gpu.profile) or not gpu.mig_mode:
            return codes.ERROR_NOT_SUPPORTED
        wanted = gi_id if isinstance(gi_id, int) else int(gi_id.value)
        for instance in gpu.mig_instances:
            if gpu.gpu_instance_id(instance) == wanted:
                return self._fill(gpu, instance, pointer, now)
        return codes.ERROR_NOT_FOUND

    def _metrics_get(self, _now: float, reference: Any) -> int:
        request = reference._obj  # noqa: SLF001 - the byref target
        if request.version != pynvml.NVML_GPM_METRICS_GET_VERSION:
            return codes.ERROR_ARGUMENT_VERSION_MISMATCH
        count = int(request.numMetrics)
        if not 0 < count <= pynvml.NVML_GPM_METRIC_MAX:
            return codes.ERROR_INVALID_ARGUMENT
        first, second = self._sample_for(request.sample1), self._sample_for(request.sample2)
        if first is None or second is None or first.scope is None or first.scope != second.scope:
            return codes.ERROR_INVALID_ARGUMENT
        seconds = second.at - first.at
        if seconds <= 0:
            return codes.ERROR_INVALID_ARGUMENT  # the same sample twice, or out of order
        for slot in range(count):
            metric = request.metrics[slot]
            value = _rate(first, second, int(metric.metricId), seconds)
            metric.nvmlReturn = codes.ERROR_NOT_SUPPORTED if value is None else codes.SUCCESS
            metric.value = 0.0 if value is None else value
        return codes.SUCCESS

    def _instance_info(self, _now: float, handle: Any, out: Any) -> int:
        try:
            address = ctypes.addressof(handle.contents)
        except (AttributeError, TypeError, ValueError):
            return codes.ERROR_INVALID_ARGUMENT
        for gpu in self._state.gpus:
            for slot, instance in enumerate(gpu.mig_instances):
                if ctypes.addressof(instance.handle) == address:
                    info = out._obj  # noqa: SLF001 - the byref target
                    info.device = gpu.handle
                    info.id = gpu.gpu_instance_id(instance)
                    info.profileId = instance.profile.profile_id
                    info.placement.start = slot
                    info.placement.size = instance.profile.slices
                    return codes.SUCCESS
        return codes.ERROR_INVALID_ARGUMENT


def _rate(first: _Sample, second: _Sample, metric: int, seconds: float) -> float | None:
    """One metric between two samples, in NVML's unit; None: not measured here."""
    if _NVLINK_L0_RX <= metric < _NVLINK_L0_RX + 2 * _NVLINK_LINKS_LOW:
        link, direction = divmod(metric - _NVLINK_L0_RX, 2)
        if link >= second.nvlinks:
            return None
        total = _NVLINK_RX if direction == 0 else _NVLINK_TX
        share = 1.0 / second.nvlinks  # traffic spread evenly over the links
        return _delta(first, second, total) * share / seconds / hardware.MIB
    if metric in _BYTE_METRICS:
        if metric in (_NVLINK_RX, _NVLINK_TX) and second.nvlinks == 0:
            return None
        return _delta(first, second, metric) / seconds / hardware.MIB
    if metric in _ACTIVITY_SHARES:
        return min(_delta(first, second, metric) / seconds * 100.0, 100.0)
    return None


def _delta(first: _Sample, second: _Sample, metric: int) -> float:
    return second.totals.get(metric, 0.0) - first.totals.get(metric, 0.0)


def nvlink_throughput_field(
    *, receive: bool
) -> Callable[[SimGpu, float, int], tuple[int, int, int]]:
    """A field-value reader for NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX/TX (sim/fields.py):
    ``scopeId`` is the link, or ALL_LINKS for the sum."""

    def read(gpu: SimGpu, now: float, scope: int) -> tuple[int, int, int]:
        if gpu.nvlinks == 0:
            return codes.ERROR_NOT_SUPPORTED, codes.VALUE_UINT, 0
        if scope >= gpu.nvlinks and scope != ALL_LINKS:
            return codes.ERROR_INVALID_ARGUMENT, codes.VALUE_UINT, 0
        kib = nvlink_throughput_kib(gpu, now, scope, receive=receive)
        return codes.SUCCESS, codes.VALUE_ULONGLONG, kib

    return read
