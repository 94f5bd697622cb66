"""Profiling metrics from NVML's GPU Performance Monitoring (GPM), under DCGM's field ids.

GPM (Hopper and later, R520+ drivers) hands out opaque samples of cumulative counters;
nvmlGpmMetricsGet turns two samples into rates over the time between them. Each GPU
(and each MIG GPU instance) keeps two allocated samples and alternates between them, so
a poll costs one nvmlGpmSampleGet and one nvmlGpmMetricsGet per GPU or instance: the new
sample against the previous one. Support is asked once; a GPU without GPM costs nothing
more. Samples are freed when the GPU leaves the session (`release`).

Runs on the GPU's worker thread, every call through `CallWorker.call`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import pynvml

from gpuagent.model import GpuProfiling
from gpuagent.nvml.errors import GpuLostError, NvmlCallError, NvmlUnavailableError, optional
from gpuagent.nvml.worker import CallWorker

log = logging.getLogger(__name__)

_RATIO = 0.01  # GPM's percent → DCGM's ratio (0-1)
_BYTES = 1024.0 * 1024.0  # GPM's MiB/s → DCGM's bytes/s

# GPM metric → (DCGM field id, factor from GPM's unit to DCGM's): the DCGM_FI_PROF_*
# fields of dcgm_fields.h (1001-1016) that GPM measures.
GPM_TO_DCGM: dict[int, tuple[int, float]] = {
    pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: (1001, _RATIO),  # GR_ENGINE_ACTIVE
    pynvml.NVML_GPM_METRIC_SM_UTIL: (1002, _RATIO),  # SM_ACTIVE
    pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: (1003, _RATIO),  # SM_OCCUPANCY
    pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: (1004, _RATIO),  # PIPE_TENSOR_ACTIVE
    pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: (1005, _RATIO),  # DRAM_ACTIVE
    pynvml.NVML_GPM_METRIC_FP64_UTIL: (1006, _RATIO),  # PIPE_FP64_ACTIVE
    pynvml.NVML_GPM_METRIC_FP32_UTIL: (1007, _RATIO),  # PIPE_FP32_ACTIVE
    pynvml.NVML_GPM_METRIC_FP16_UTIL: (1008, _RATIO),  # PIPE_FP16_ACTIVE
    pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC: (1009, _BYTES),  # PCIE_TX_BYTES
    pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC: (1010, _BYTES),  # PCIE_RX_BYTES
    pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC: (1011, _BYTES),  # NVLINK_TX_BYTES
    pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC: (1012, _BYTES),  # NVLINK_RX_BYTES
    pynvml.NVML_GPM_METRIC_IMMA_TENSOR_UTIL: (1013, _RATIO),  # PIPE_TENSOR_IMMA_ACTIVE
    pynvml.NVML_GPM_METRIC_HMMA_TENSOR_UTIL: (1014, _RATIO),  # PIPE_TENSOR_HMMA_ACTIVE
    pynvml.NVML_GPM_METRIC_DFMA_TENSOR_UTIL: (1015, _RATIO),  # PIPE_TENSOR_DFMA_ACTIVE
    pynvml.NVML_GPM_METRIC_INTEGER_UTIL: (1016, _RATIO),  # PIPE_INT_ACTIVE
}
_METRICS = tuple(GPM_TO_DCGM)

# A MIG GPU instance: (GPU instance id, profile name such as "1g.10gb").
GpuInstance = tuple[int, str]


@dataclass(slots=True)
class _Target:
    """The whole GPU (``instance`` None) or one GPU instance, with its two samples."""

    instance: GpuInstance | None
    samples: list[Any]
    latest: int | None = None  # which sample holds the newest counters


class GpmSampler:
    """One GPU's GPM samples; `poll` returns its profiling values (GPU first)."""

    def __init__(self, worker: CallWorker, handle: Any) -> None:
        self._worker = worker
        self._handle = handle
        self.supported: bool | None = None  # None: not asked yet
        self._targets: dict[int | None, _Target] = {}  # by GPU instance id
        self._request: pynvml.c_nvmlGpmMetricsGet_t | None = None

    def _call(self, name: str, *args: object) -> Any:
        """``pynvml.<name>(*args)`` through the worker; None where GPM does not answer."""
        return self._worker.call(name, optional, name, getattr(pynvml, name), *args)

    def query_support(self) -> bool:
        """Whether this GPU and driver have GPM; asked once per session."""
        if self.supported is None:
            support = self._call("nvmlGpmQueryDeviceSupport", self._handle)
            self.supported = support is not None and bool(support.isSupportedDevice)
        return self.supported

    def poll(self, instances: tuple[GpuInstance, ...]) -> tuple[GpuProfiling, ...]:
        """Sample the GPU and ``instances``; the rates since the previous poll.

        Raises GpuLostError; other failures leave that target without values this poll.
        """
        if not self.query_support():
            return ()
        wanted: dict[int | None, GpuInstance | None] = {None: None}
        wanted.update((gi_id, (gi_id, name)) for gi_id, name in instances)
        for gone in [key for key in self._targets if key not in wanted]:
            self._free(self._targets.pop(gone))
        found: list[GpuProfiling] = []
        for key, instance in wanted.items():
            target = self._targets.get(key)
            if target is None or target.instance != instance:
                if target is not None:
                    self._free(target)
                target = self._allocate(instance)
                if target is None:
                    continue
                self._targets[key] = target
            values = self._measure(target)
            if values:
                found.append(
                    GpuProfiling(
                        source="gpm",
                        values=values,
                        gpu_instance_id=None if instance is None else instance[0],
                        gpu_instance_profile=None if instance is None else instance[1],
                    )
                )
        return tuple(found)

    def release(self) -> None:
        """Free every sample (the GPU leaves the session). Never raises."""
        targets, self._targets = list(self._targets.values()), {}
        for target in targets:
            self._free(target)

    # --- samples ----------------------------------------------------------------------

    def _allocate(self, instance: GpuInstance | None) -> _Target | None:
        samples: list[Any] = []
        try:
            for _ in range(2):
                sample = self._call("nvmlGpmSampleAlloc")
                if sample is None:
                    break
                samples.append(sample)
        except NvmlCallError as exc:
            log.warning("GPM sample allocation failed: %s", exc)
        if len(samples) == 2:
            return _Target(instance, samples)
        self._free(_Target(instance, samples))
        return None

    def _free(self, target: _Target) -> None:
        for sample in target.samples:
            try:
                self._call("nvmlGpmSampleFree", sample)
            except (GpuLostError, NvmlCallError, NvmlUnavailableError) as exc:
                # Unavailable: NVML is shutting down, which frees every sample anyway.
                log.debug("GPM sample not freed: %s", exc)
        target.samples = []
        target.latest = None

    def _take(self, target: _Target, sample: Any) -> Any:
        if target.instance is None:
            return self._call("nvmlGpmSampleGet", self._handle, sample)
        return self._call("nvmlGpmMigSampleGet", self._handle, target.instance[0], sample)

    def _measure(self, target: _Target) -> tuple[tuple[int, float], ...]:
        """Take a new sample into the spare slot and measure it against the newest."""
        previous = target.latest
        slot = 0 if previous is None else 1 - previous
        try:
            taken = self._take(target, target.samples[slot])
            if taken is None:
                target.latest = None
                return ()
            target.latest = slot
            if previous is None:
                return ()  # the first sample: rates need two
            request = self._metrics_request()
            request.sample1 = target.samples[previous]
            request.sample2 = target.samples[slot]
            answered = self._call("nvmlGpmMetricsGet", request)
        except NvmlCallError as exc:
            log.warning("GPM sampling failed: %s", exc)
            target.latest = None
            return ()
        if answered is None:
            return ()
        values = []
        for index, metric_id in enumerate(_METRICS):
            metric = request.metrics[index]
            if metric.nvmlReturn == pynvml.NVML_SUCCESS:
                field_id, factor = GPM_TO_DCGM[metric_id]
                values.append((field_id, float(metric.value) * factor))
        return tuple(values)

    def _metrics_request(self) -> pynvml.c_nvmlGpmMetricsGet_t:
        """The request struct, built once: ~20 kB, and its metric ids never change."""
        if self._request is None:
            request = pynvml.c_nvmlGpmMetricsGet_t()
            request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
            request.numMetrics = len(_METRICS)
            for index, metric_id in enumerate(_METRICS):
                request.metrics[index].metricId = metric_id
            self._request = request
        return self._request
