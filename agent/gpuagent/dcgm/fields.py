"""DCGM profiling fields for the GPUs GPM does not cover. Blocking: on the DCGM thread.

Fields are named by number only: DCGM 4.6 renamed hundreds of field constants and kept
their numbers, so a lookup by name would break on one version or the other. Each GPU
gets its own group, so one GPU without profiling (DCGMError_ProfilingNotSupported on its
watch) is left out without taking the others with it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gpuagent.dcgm.bindings import DcgmBindings
from gpuagent.model import GpuProfiling

# DCGM_FI_PROF_GR_ENGINE_ACTIVE (1001) ... DCGM_FI_PROF_NVLINK_RX_BYTES (1012), and
# DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL (449).
PROFILING_FIELDS: tuple[int, ...] = (*range(1001, 1013), 449)
_GPU = 1  # DCGM_FE_GPU
_DOUBLE, _INT64 = ord("d"), ord("i")
_NOT_SUPPORTED = ("DCGM_ST_PROFILING_NOT_SUPPORTED", "DCGM_ST_NOT_SUPPORTED")


class ProfilingWatch:
    """One connection's profiling watches (made again after a reconnect)."""

    def __init__(self, dcgm: DcgmBindings, interval_seconds: float) -> None:
        self._dcgm = dcgm
        self._interval_us = int(interval_seconds * 1e6)
        self._field_group: Any = None
        self.watched: set[int] = set()
        self.unsupported: set[int] = set()

    def _unsupported(self, exc: Exception) -> bool:
        codes = {getattr(self._dcgm.structs, name, None) for name in _NOT_SUPPORTED}
        return getattr(exc, "value", None) in codes

    def watch(self, handle: Any, gpus: Iterable[int]) -> None:
        agent, structs = self._dcgm.agent, self._dcgm.structs
        new = [g for g in gpus if g not in self.watched and g not in self.unsupported]
        if not new:
            return
        if self._field_group is None:
            self._field_group = agent.dcgmFieldGroupCreate(
                handle, list(PROFILING_FIELDS), "gpuagent-profiling"
            )
        for gpu in new:
            group = agent.dcgmGroupCreate(handle, structs.DCGM_GROUP_EMPTY, f"gpuagent-prof-{gpu}")
            agent.dcgmGroupAddDevice(handle, group, gpu)
            try:
                agent.dcgmWatchFields(
                    handle, group, self._field_group, self._interval_us, 3600.0, 0
                )
            except structs.DCGMError as exc:
                if not self._unsupported(exc):
                    raise
                self.unsupported.add(gpu)
                agent.dcgmGroupDestroy(handle, group)
                continue
            self.watched.add(gpu)
        if self.watched:
            agent.dcgmUpdateAllFields(handle, 1)

    def read(self, handle: Any, gpus: Iterable[int]) -> dict[int, GpuProfiling]:
        """The latest values of the watched ``gpus``; blank and failed values skipped."""
        wanted = [g for g in gpus if g in self.watched]
        if not wanted:
            return {}
        structs, blank = self._dcgm.structs, self._dcgm.value
        pairs = []
        for gpu in wanted:
            pair = structs.c_dcgmGroupEntityPair_t()
            pair.entityGroupId, pair.entityId = _GPU, gpu
            pairs.append(pair)
        values = self._dcgm.agent.dcgmEntitiesGetLatestValues(
            handle, pairs, list(PROFILING_FIELDS), 0
        )
        found: dict[int, list[tuple[int, float]]] = {}
        for fv in values:
            if fv.status != structs.DCGM_ST_OK:
                continue
            if fv.fieldType == _DOUBLE:
                number = float(fv.value.dbl)
                if blank.DCGM_FP64_IS_BLANK(number):
                    continue
            elif fv.fieldType == _INT64:
                integer = int(fv.value.i64)
                if blank.DCGM_INT64_IS_BLANK(integer):
                    continue
                number = float(integer)
            else:
                continue
            found.setdefault(int(fv.entityId), []).append((int(fv.fieldId), number))
        return {
            gpu: GpuProfiling(source="dcgm", values=tuple(sorted(pairs_)))
            for gpu, pairs_ in found.items()
        }
