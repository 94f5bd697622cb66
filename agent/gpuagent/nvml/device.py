"""One GPU through pynvml: identity once, readings every poll, and the setters.

Runs on the GPU's worker thread (blocking), every call through `CallWorker.call`. Calls
per poll are kept low: most counters come in one `nvmlDeviceGetFieldValues` batch, and
values that rarely change (persistence, MIG/ECC mode, PCIe link state, memory clock, and
the GPU instances and MIG devices while MIG is on) and the counters that are costly to read
(energy, throttle durations) are read on the slower cadence and carried between slow
reads. On GPUs with GPM, profiling values (`gpuagent.nvml.gpm`) cost one sample and one
metrics call per GPU (and MIG GPU instance) per profiling interval.
"""

from __future__ import annotations

import ctypes
import dataclasses
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pynvml

from gpuagent.model import (
    COMPUTE_MODES,
    GpuIdentity,
    GpuProcess,
    GpuProfiling,
    GpuReadings,
    MigDevice,
    PlatformInfo,
)
from gpuagent.nvml.errors import GpuLostError, optional, required, return_code, text
from gpuagent.nvml.gpm import GpmSampler, GpuInstance
from gpuagent.nvml.worker import CallWorker

_MIB = 1024 * 1024

# Field id → GpuReadings attribute, read in one batch each poll.
_COUNTER_FIELDS: dict[int, str] = {
    pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL: "ecc_sbe_volatile",
    pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL: "ecc_dbe_volatile",
    pynvml.NVML_FI_DEV_ECC_SBE_AGG_TOTAL: "ecc_sbe_aggregate",
    pynvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL: "ecc_dbe_aggregate",
    pynvml.NVML_FI_DEV_RETIRED_SBE: "retired_pages_sbe",
    pynvml.NVML_FI_DEV_RETIRED_DBE: "retired_pages_dbe",
    pynvml.NVML_FI_DEV_RETIRED_PENDING: "retired_pages_pending",
    pynvml.NVML_FI_DEV_REMAPPED_COR: "remapped_rows_correctable",
    pynvml.NVML_FI_DEV_REMAPPED_UNC: "remapped_rows_uncorrectable",
    pynvml.NVML_FI_DEV_REMAPPED_PENDING: "row_remap_pending",
    pynvml.NVML_FI_DEV_REMAPPED_FAILURE: "row_remap_failure",
    pynvml.NVML_FI_DEV_MEMORY_TEMP: "memory_temperature_c",
    # The 1 s average (what nvmlDeviceGetPowerUsage, DCGM field 155 and `nvidia-smi
    # power.draw` report) and the instantaneous draw (DCGM field 157).
    pynvml.NVML_FI_DEV_POWER_AVERAGE: "power_w",
    pynvml.NVML_FI_DEV_POWER_INSTANT: "power_instant_w",
    pynvml.NVML_FI_DEV_POWER_CURRENT_LIMIT: "power_limit_w",
    pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL: "nvlink_crc_flit_errors",
    pynvml.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL: "nvlink_crc_data_errors",
    pynvml.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL: "nvlink_replay_errors",
    pynvml.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL: "nvlink_recovery_errors",
}
# Read in one batch on the slow cadence, with the time they were read (``counters_at``):
# on a real H200 the energy counter costs 3.2 ms of CPU, the thermal, HW-thermal and
# power-brake durations 0.65 ms each and the PCIe replay counter 0.17 ms, 5.2 ms of the
# batch's 5.5 ms, while every other field costs 0.005 ms. They are counters: a rate over
# their own timestamps loses nothing by being sampled less often, and the throttle and
# replay windows are minutes. All throttle durations go together, so the throttle check
# never mixes readings of two moments.
_SLOW_COUNTER_FIELDS: dict[int, str] = {
    pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION: "energy_mj",
    pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER: "pcie_replay_count",
    pynvml.NVML_FI_DEV_PERF_POLICY_POWER: "violation_power_ns",
    pynvml.NVML_FI_DEV_PERF_POLICY_THERMAL: "violation_thermal_ns",
    pynvml.NVML_FI_DEV_PERF_POLICY_SYNC_BOOST: "violation_sync_boost_ns",
    pynvml.NVML_FI_DEV_PERF_POLICY_BOARD_LIMIT: "violation_board_limit_ns",
    pynvml.NVML_FI_DEV_PERF_POLICY_LOW_UTILIZATION: "violation_low_utilization_ns",
    pynvml.NVML_FI_DEV_PERF_POLICY_RELIABILITY: "violation_reliability_ns",
    pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN: "throttle_sw_thermal_ns",
    pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN: "throttle_hw_thermal_ns",
    pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN: "throttle_hw_power_brake_ns",
    # NVML's recovery action (None / reset / reboot / drain and reset), read with them.
    pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: "recovery_action",
    # Settings, which change only when someone changes them: asked in this batch rather
    # than a call each (nvmlDeviceGetEccMode, nvmlDeviceGetPowerManagementLimit).
    pynvml.NVML_FI_DEV_ECC_CURRENT: "ecc_enabled",
    pynvml.NVML_FI_DEV_ECC_PENDING: "ecc_enabled_pending",
    pynvml.NVML_FI_DEV_POWER_REQUESTED_LIMIT: "power_requested_limit_w",
}
# NVLink-C2C error counters (CRC, replay, back-to-back replay), each asked per link.
_C2C_COUNTERS: dict[str, int] = {
    "c2c_crc_errors": pynvml.NVML_FI_DEV_C2C_LINK_ERROR_INTR,
    "c2c_replay_errors": pynvml.NVML_FI_DEV_C2C_LINK_ERROR_REPLAY,
    "c2c_replay_b2b_errors": pynvml.NVML_FI_DEV_C2C_LINK_ERROR_REPLAY_B2B,
}
_C2C_FIELDS = (pynvml.NVML_FI_DEV_C2C_LINK_GET_STATUS, *_C2C_COUNTERS.values())
# Per-link bit-error rates (NVML_NVLINK_ERROR_COUNTER_BER_*), each asked per link.
_BER_FIELDS: dict[str, int] = {
    "nvlink_effective_ber": pynvml.NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_BER,
    "nvlink_symbol_ber": pynvml.NVML_FI_DEV_NVLINK_COUNT_SYMBOL_BER,
}
# NVLink data moved (KiB since the driver loaded, TX and RX, summed over every link): what
# DCGM turns into DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL, read here in the same batch.
_ALL_LINKS = 0xFFFFFFFF
_NVLINK_THROUGHPUT = (
    (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, _ALL_LINKS),
    (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, _ALL_LINKS),
)
NVLINK_BANDWIDTH_TOTAL = 449  # DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL, in MB/s as DCGM reports it
# A Grace-Blackwell module's power (its GPU with its share of the module: the Grace CPU,
# its memory, C2C) and its limit, in mW: the power fields at the module's scope, asked only
# of GPUs that answered the first at start ("Module Power Readings" is N/A elsewhere).
_MODULE_POWER = {
    "module_power_w": (pynvml.NVML_FI_DEV_POWER_AVERAGE, pynvml.NVML_POWER_SCOPE_MODULE),
    "module_power_limit_w": (
        pynvml.NVML_FI_DEV_POWER_CURRENT_LIMIT,
        pynvml.NVML_POWER_SCOPE_MODULE,
    ),
}
_KIB = 1024
_MB = 1_000_000
_CADENCE_SLACK = 0.5  # s
_BOOL_ATTRS = {
    "retired_pages_pending",
    "row_remap_pending",
    "row_remap_failure",
    "ecc_enabled",
    "ecc_enabled_pending",
}
_MILLIWATT_ATTRS = {"power_w", "power_instant_w", "power_limit_w", "power_requested_limit_w"}

# Temperature thresholds, read once with the identity. (The *_TLIMIT fields are offsets on
# NVML's T.Limit scale, not degrees, so the classic call is the one to use.)
_THRESHOLDS = {
    "temperature_slowdown_c": pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN,
    "temperature_shutdown_c": pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN,
    "temperature_gpu_max_c": pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX,
    "temperature_memory_max_c": pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX,
}

_FABRIC_KEYS = (
    "fabric_state",
    "fabric_ok",
    "fabric_health_mask",
    "fabric_cluster_uuid",
    "fabric_clique_id",
)
_FABRIC_STATES = {
    pynvml.NVML_GPU_FABRIC_STATE_NOT_STARTED: "not_started",
    pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS: "in_progress",
    pynvml.NVML_GPU_FABRIC_STATE_COMPLETED: "completed",
}

# nvmlBrandType_t, named as nvidia-smi prints "Product Brand".
_BRANDS: dict[int | None, str] = {
    pynvml.NVML_BRAND_QUADRO: "Quadro",
    pynvml.NVML_BRAND_TESLA: "Tesla",
    pynvml.NVML_BRAND_NVS: "NVS",
    pynvml.NVML_BRAND_GEFORCE: "GeForce",
    pynvml.NVML_BRAND_TITAN: "Titan",
    pynvml.NVML_BRAND_QUADRO_RTX: "Quadro RTX",
    pynvml.NVML_BRAND_NVIDIA_RTX: "NVIDIA RTX",
    pynvml.NVML_BRAND_NVIDIA: "NVIDIA",
    pynvml.NVML_BRAND_GEFORCE_RTX: "GeForce RTX",
    pynvml.NVML_BRAND_TITAN_RTX: "Titan RTX",
}

_COMPUTE_MODE_NAMES: dict[int | None, str] = {code: name for name, code in COMPUTE_MODES.items()}

_VALUE_MEMBER = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal",
}


@dataclass(frozen=True, slots=True)
class MigProfile:
    """A GPU-instance profile the GPU offers (fixed for the GPU)."""

    profile_id: int  # what nvmlDeviceGetGpuInstances takes
    name: str  # "1g.10gb"
    max_instances: int


def mig_profile_name(slices: int, memory_mib: int, nvml_name: str = "") -> str:
    """A GPU-instance profile's name as nvidia-smi shows it ("1g.10gb", "1g.10gb+me").

    NVML's own name (the v2 profile info's, "MIG 1g.10gb") is used when it gives one;
    otherwise the name is built from the slice count and the memory, rounded up to whole
    GiB the way NVIDIA names profiles (9984 MiB → 10gb, 81152 MiB → 80gb).
    """
    name = nvml_name.strip().removeprefix("MIG ").strip()
    if name:
        return name
    return f"{slices}g.{math.ceil(memory_mib / 1024)}gb"


def canonical_bus_id(nvml_bus_id: str) -> str:
    """NVML's "00000000:18:00.0" → sysfs's "0000:18:00.0" (lower case)."""
    domain, _, rest = nvml_bus_id.strip().lower().partition(":")
    return f"{int(domain, 16):04x}:{rest}" if rest else nvml_bus_id.lower()


class _PlainPlatformInfo(ctypes.Structure):
    """nvmlPlatformInfo_v2_t with its one-byte fields as numbers (pynvml types them as
    characters)."""

    _fields_ = [
        ("version", ctypes.c_uint),
        ("ibGuid", ctypes.c_uint8 * 16),
        ("chassisSerialNumber", ctypes.c_char * 16),
        ("slotNumber", ctypes.c_uint8),
        ("trayIndex", ctypes.c_uint8),
        ("hostId", ctypes.c_uint8),
        ("peerType", ctypes.c_uint8),
        ("moduleId", ctypes.c_uint8),
    ]


class _PlainFieldValue(ctypes.Structure):
    """nvmlFieldValue_t's layout without pynvml's attribute hooks: its structures decode
    bytes on every attribute read, which made reading a batch's answers cost more CPU than
    NVML spent answering it. The answers are read through this view of the same memory."""

    _fields_ = pynvml.c_nvmlFieldValue_t._fields_


def _field_values(worker: CallWorker, handle: Any, ids: list[Any]) -> list[float | int | None]:
    values = worker.call(
        "nvmlDeviceGetFieldValues",
        optional,
        "fieldValues",
        pynvml.nvmlDeviceGetFieldValues,
        handle,
        ids,
    )
    if values is None:
        return [None] * len(ids)
    out: list[float | int | None] = []
    for value in (_PlainFieldValue * len(values)).from_buffer(values):
        if value.nvmlReturn != pynvml.NVML_SUCCESS:
            if value.nvmlReturn == pynvml.NVML_ERROR_GPU_IS_LOST:
                raise GpuLostError("nvmlDeviceGetFieldValues")
            out.append(None)
            continue
        member = _VALUE_MEMBER.get(value.valueType)
        out.append(getattr(value.value, member) if member else None)
    return out


class Device:
    """One GPU's handle and the reads made through its worker thread."""

    def __init__(
        self,
        index: int,
        handle: Any,
        worker: CallWorker,
        process_name: Callable[[int], str | None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.index = index
        self._clock = clock  # the poller's: counter times and the GPM cadence are on it
        self.handle = handle
        self.worker = worker
        self._process_name = process_name
        self._slow: dict[str, Any] = {}
        self._fields: list[Any] = list(_COUNTER_FIELDS)
        self._nvlink_count = 0
        self._c2c_count = 0
        self._ber_fields: list[tuple[int, int]] = []
        # Whether the classic power calls stand in for the power fields (None: not known
        # yet): drivers without the fields, and boards without the 1 s average (Turing,
        # GA100), answer nvmlDeviceGetPowerUsage; decided at its first answer.
        self._classic_power: bool | None = None
        # Whether the GPU answers only the v1 memory call (drivers before R510 lack v2).
        self._memory_v1: bool | None = None
        self._mig_profiles: tuple[MigProfile, ...] | None = None  # read once, when MIG is on
        self.gpm = GpmSampler(worker, handle)
        # (id, profile) of the GPU instances, for GPM: read on the slow cadence with the
        # instance list, and only while GPM sampling is on and the GPU has it.
        self._gpu_instances: tuple[GpuInstance, ...] = ()
        self._profiling = False
        # (monotonic time, values) of the last GPM sample: carried until the next is due.
        self._profiled: tuple[float, tuple[GpuProfiling, ...]] | None = None
        self._nvlink_kib: tuple[int, float] | None = None  # (total, monotonic time) last poll

    # Each call below is ``pynvml.<call>(handle, *args)`` through the worker, the function
    # looked up when called; ``fn`` only where pynvml's name for it differs.

    def _get(self, call: str, *args: object, fn: Callable[..., Any] | None = None) -> Any:
        """None where the GPU or driver does not provide the value."""
        return self._get_on(self.handle, call, *args, fn=fn)

    def _code(self, call: str, *args: object) -> int:
        """NVML's return code of a call that fills a structure in place (``args``), for a
        caller that acts on which error it was."""
        fn = getattr(pynvml, call)
        return int(self.worker.call(call, return_code, call, fn, self.handle, *args))

    def _set(self, call: str, *args: object) -> None:
        self.worker.call(call, required, call, getattr(pynvml, call), self.handle, *args)

    # --- setters (remediation; raise GpuLostError or NvmlCallError) ----------------------

    def set_persistence_mode(self, enabled: bool) -> None:
        mode = pynvml.NVML_FEATURE_ENABLED if enabled else pynvml.NVML_FEATURE_DISABLED
        self._set("nvmlDeviceSetPersistenceMode", mode)

    def set_power_limit(self, milliwatts: int) -> None:
        self._set("nvmlDeviceSetPowerManagementLimit", milliwatts)

    # --- identity (once per NVML session) -----------------------------------------------

    def read_identity(self) -> GpuIdentity:
        pci = self._get("nvmlDeviceGetPciInfo")
        bus_id = canonical_bus_id(text(pci.busId) or "") if pci is not None else ""
        thresholds = {
            attr: self._get("nvmlDeviceGetTemperatureThreshold", threshold)
            for attr, threshold in _THRESHOLDS.items()
        }
        links, c2c_links, module_power = _field_values(
            self.worker,
            self.handle,
            [
                pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT,
                pynvml.NVML_FI_DEV_C2C_LINK_COUNT,
                _MODULE_POWER["module_power_w"],
            ],
        )
        self._nvlink_count = int(links or 0)
        self._c2c_count = int(c2c_links or 0)
        self._fields = list(_COUNTER_FIELDS) + [
            (pynvml.NVML_FI_DEV_NVLINK_GET_STATE, link) for link in range(self._nvlink_count)
        ]
        if self._nvlink_count:
            self._fields += _NVLINK_THROUGHPUT
        # NVLink-C2C to the CPU (Grace-Blackwell): each link's state and error counters.
        self._fields += [(field, link) for link in range(self._c2c_count) for field in _C2C_FIELDS]
        if module_power is not None:
            self._fields += _MODULE_POWER.values()
        # Per-link bit-error rates, read with the slow counters (they are measured over
        # time by the link, and a GPU without NVLink has none to ask for).
        self._ber_fields = [
            (field, link) for link in range(self._nvlink_count) for field in _BER_FIELDS.values()
        ]
        default_limit = self._get("nvmlDeviceGetPowerManagementDefaultLimit")
        ecc_default = self._get("nvmlDeviceGetDefaultEccMode")
        return GpuIdentity(
            index=self.index,
            pci_bus_id=bus_id or f"unknown-{self.index}",
            uuid=text(self._get("nvmlDeviceGetUUID")) or "",
            name=text(self._get("nvmlDeviceGetName")) or "",
            serial=text(self._get("nvmlDeviceGetSerial")),
            vbios_version=text(self._get("nvmlDeviceGetVbiosVersion")),
            minor_number=self._get("nvmlDeviceGetMinorNumber"),
            power_default_limit_w=None if default_limit is None else default_limit / 1000,
            pcie_max_generation=self._get("nvmlDeviceGetMaxPcieLinkGeneration"),
            pcie_max_width=self._get("nvmlDeviceGetMaxPcieLinkWidth"),
            nvlink_count=self._nvlink_count,
            inforom_version=text(self._get("nvmlDeviceGetInforomImageVersion")),
            gsp_firmware_version=text(self._get("nvmlDeviceGetGspFirmwareVersion")),
            applications_clock_default_mhz=self._get(
                "nvmlDeviceGetDefaultApplicationsClock", pynvml.NVML_CLOCK_GRAPHICS
            ),
            brand=_BRANDS.get(self._get("nvmlDeviceGetBrand")),
            platform=self._read_platform(),
            ecc_default=None
            if ecc_default is None
            else ecc_default[0] == pynvml.NVML_FEATURE_ENABLED,  # pynvml answers [mode]
            sm_clock_max_mhz=self._get("nvmlDeviceGetMaxClockInfo", pynvml.NVML_CLOCK_SM),
            **{k: None if v is None else float(v) for k, v in thresholds.items()},
        )

    # --- readings (every poll) -------------------------------------------------------------

    def release(self) -> None:
        """Give back what the GPU holds in the driver (GPM samples): it leaves the session."""
        self.gpm.release()

    def read(
        self, include_slow: bool, profiling: bool = True, profiling_interval: float = 0.0
    ) -> GpuReadings:
        """One poll. Raises GpuLostError or NvmlCallError; CallWorker times the calls.

        ``profiling``: sample GPM (one nvmlGpmSampleGet and one nvmlGpmMetricsGet per GPU
        and MIG instance, on GPUs that have it), at most every ``profiling_interval``
        seconds; the polls between carry the last values.
        """
        self._set_profiling(profiling)
        if include_slow or not self._slow:
            self._slow = self._read_slow()
        values = dict(
            zip(self._fields, _field_values(self.worker, self.handle, self._fields), strict=True)
        )
        readings = _named(_COUNTER_FIELDS, values)
        readings["nvlink_up"] = tuple(
            _link_state(values.get((pynvml.NVML_FI_DEV_NVLINK_GET_STATE, link)))
            for link in range(self._nvlink_count)
        )
        readings.update(self._c2c(values))
        for attr, scoped in _MODULE_POWER.items():
            milliwatts = values.get(scoped)
            readings[attr] = None if milliwatts is None else milliwatts / 1000
        if readings["power_w"] is None and self._classic_power is not False:
            # No average field: the classic call reads the power (the instantaneous draw
            # where the board has no average), every poll once it has answered.
            power = self._get("nvmlDeviceGetPowerUsage")
            if self._classic_power is None:
                self._classic_power = power is not None
            readings["power_w"] = None if power is None else power / 1000
        readings.update(self._read_fast())
        for key, value in self._slow.items():
            if readings.get(key) is None:
                readings[key] = value
        if self._profiling:
            readings["profiling"] = self._profiling_due(
                bool(readings.get("mig_mode_current")), values, profiling_interval
            )
        return GpuReadings(**readings)

    def _c2c(self, values: dict[Any, Any]) -> dict[str, Any]:
        """The C2C links' states, and each error counter summed over the links (None when
        a link does not report it)."""
        links = range(self._c2c_count)
        out: dict[str, Any] = {
            "c2c_up": tuple(
                _link_state(values.get((pynvml.NVML_FI_DEV_C2C_LINK_GET_STATUS, link)))
                for link in links
            )
        }
        for key, field in _C2C_COUNTERS.items():
            counts = [values.get((field, link)) for link in links]
            known = [int(count) for count in counts if count is not None]
            out[key] = sum(known) if known and len(known) == len(counts) else None
        return out

    def _profiling_due(
        self, mig: bool, values: dict[Any, Any], interval: float
    ) -> tuple[GpuProfiling, ...]:
        """GPM's values: sampled anew once ``interval`` has passed (a poll up to
        _CADENCE_SLACK early counts, so the cadence does not slip a whole poll), or while
        there are none yet (the first values need a second sample)."""
        now, last = self._clock(), self._profiled
        if last is not None and last[1] and now - last[0] < interval - _CADENCE_SLACK:
            return last[1]
        found = self._read_profiling(mig, self._nvlink_bandwidth(values))
        self._profiled = (now, found)
        return found

    def _read_profiling(self, mig: bool, nvlink_mb_s: float | None) -> tuple[GpuProfiling, ...]:
        """GPM's values; the NVLink bandwidth goes with the whole GPU's."""
        found = self.gpm.poll(self._gpu_instances if mig else ())
        if nvlink_mb_s is None or not found or found[0].gpu_instance_id is not None:
            return found
        whole = found[0]
        values = (*whole.values, (NVLINK_BANDWIDTH_TOTAL, nvlink_mb_s))
        return (dataclasses.replace(whole, values=values), *found[1:])

    def _nvlink_bandwidth(self, values: dict[Any, Any]) -> float | None:
        """NVLink TX+RX in MB/s since the previous poll, as DCGM computes field 449."""
        tx, rx = (values.get(key) for key in _NVLINK_THROUGHPUT)
        if tx is None or rx is None:
            self._nvlink_kib = None
            return None
        now, total = self._clock(), int(tx) + int(rx)
        previous, self._nvlink_kib = self._nvlink_kib, (total, now)
        if previous is None or now <= previous[1] or total < previous[0]:
            return None  # the first reading, or the counters restarted (driver reload)
        return (total - previous[0]) * _KIB / _MB / (now - previous[1])

    def _set_profiling(self, wanted: bool) -> None:
        # Asked before the slow read, so the first one already lists the GPU instances.
        self._profiling = wanted and self.gpm.query_support()
        if not self._profiling:
            self.gpm.release()  # sampling turned off: nothing held in the driver
            self._profiled = None

    def _read_fast(self) -> dict[str, Any]:
        util = self._get("nvmlDeviceGetUtilizationRates")
        enc = self._get("nvmlDeviceGetEncoderUtilization")
        dec = self._get("nvmlDeviceGetDecoderUtilization")
        memory = self._memory()
        procs = self._get("nvmlDeviceGetComputeRunningProcesses")
        return {
            "temperature_c": self._get("nvmlDeviceGetTemperature", pynvml.NVML_TEMPERATURE_GPU),
            "utilization_gpu_pct": None if util is None else util.gpu,
            "utilization_memory_pct": None if util is None else util.memory,
            "utilization_encoder_pct": None if enc is None else enc[0],
            "utilization_decoder_pct": None if dec is None else dec[0],
            "fb_used_mib": None if memory is None else memory.used / _MIB,
            "fb_free_mib": None if memory is None else memory.free / _MIB,
            "fb_reserved_mib": _reserved_mib(memory),
            "sm_clock_mhz": self._get("nvmlDeviceGetClockInfo", pynvml.NVML_CLOCK_SM),
            "clock_event_reasons": self._get("nvmlDeviceGetCurrentClocksEventReasons"),
            "processes": tuple(self._process(p) for p in procs or ()),
            "graphics_processes": self._graphics_processes(procs, memory),
            "performance_state": _pstate(self._get("nvmlDeviceGetPerformanceState")),
        }

    def _memory(self) -> Any:
        """The memory info: v2 (with the reserved memory), else v1 on drivers before R510,
        which lack v2; once v1 is what answers, only v1 is asked."""
        if self._memory_v1 is not True:
            memory = self._get("nvmlDeviceGetMemoryInfo", pynvml.nvmlMemory_v2)
            if memory is not None or self._memory_v1 is False:
                return memory
        memory = self._get("nvmlDeviceGetMemoryInfo")
        self._memory_v1 = memory is not None
        return memory

    def _read_slow(self) -> dict[str, Any]:
        mig = self._get("nvmlDeviceGetMigMode")
        persistence = self._get("nvmlDeviceGetPersistenceMode")
        compute_mode = self._get("nvmlDeviceGetComputeMode")
        slow: dict[str, Any] = {
            "memory_clock_mhz": self._get("nvmlDeviceGetClockInfo", pynvml.NVML_CLOCK_MEM),
            "persistence_mode": None
            if persistence is None
            else persistence == pynvml.NVML_FEATURE_ENABLED,
            "applications_clock_mhz": self._get(
                "nvmlDeviceGetApplicationsClock", pynvml.NVML_CLOCK_GRAPHICS
            ),
            "compute_mode": _COMPUTE_MODE_NAMES.get(compute_mode),
            "mig_mode_current": None if mig is None else mig[0] == pynvml.NVML_DEVICE_MIG_ENABLE,
            "mig_mode_pending": None if mig is None else mig[1] == pynvml.NVML_DEVICE_MIG_ENABLE,
            "pcie_generation": self._get("nvmlDeviceGetCurrPcieLinkGeneration"),
            "pcie_width": self._get("nvmlDeviceGetCurrPcieLinkWidth"),
        }
        histogram = self._get("nvmlDeviceGetRowRemapperHistogram")
        slow["remap_banks"] = (
            None
            if histogram is None
            else (histogram.max, histogram.high, histogram.partial, histogram.low, histogram.none)
        )
        counters: list[Any] = [*_SLOW_COUNTER_FIELDS, *self._ber_fields]
        values = dict(zip(counters, _field_values(self.worker, self.handle, counters), strict=True))
        slow.update(_named(_SLOW_COUNTER_FIELDS, values), counters_at=self._clock())
        if slow.get("ecc_enabled") is None and slow.get("ecc_enabled_pending") is None:
            # No ECC fields (a board without ECC answers the call the same way).
            ecc = self._get("nvmlDeviceGetEccMode")
            if ecc is not None:
                slow["ecc_enabled"] = ecc[0] == pynvml.NVML_FEATURE_ENABLED
                slow["ecc_enabled_pending"] = ecc[1] == pynvml.NVML_FEATURE_ENABLED
        for key, field in _BER_FIELDS.items():
            slow[key] = tuple(
                decode_ber(values.get((field, link))) for link in range(self._nvlink_count)
            )
        slow.update(self._read_fabric())
        slow.update(self._read_repairs())
        slow["mig_instances"] = self._read_mig_instances() if slow["mig_mode_current"] else None
        # Only GPUs in MIG mode are asked: a whole GPU costs no call for this.
        slow["mig_devices"] = self._read_mig_devices() if slow["mig_mode_current"] else ()
        if self._classic_power:
            limit = self._get("nvmlDeviceGetEnforcedPowerLimit")
            slow["power_limit_w"] = None if limit is None else limit / 1000
        if self._classic_power and slow.get("power_requested_limit_w") is None:
            # A driver without the power fields: the classic call has the requested limit.
            requested = self._get("nvmlDeviceGetPowerManagementLimit")
            slow["power_requested_limit_w"] = None if requested is None else requested / 1000
        return slow

    def _read_repairs(self) -> dict[str, Any]:
        """Repairs pending and unrepairable memory; None where the driver lacks them (the
        calls are missing from the library or NOT_SUPPORTED on the board). The recovery
        action comes with the slow counters (field 230; INVALID_ARGUMENT on older drivers)."""
        repair = self._get("nvmlDeviceGetRepairStatus")
        unrepairable = self._get("nvmlDeviceGetUnrepairableMemoryFlag_v1")
        return {
            "channel_repair_pending": None if repair is None else bool(repair[0]),
            "tpc_repair_pending": None if repair is None else bool(repair[1]),
            "unrepairable_memory": None if unrepairable is None else bool(unrepairable),
        }

    def _read_fabric(self) -> dict[str, Any]:
        """The GPU's Fabric Manager registration (NVSwitch systems) and, where the driver
        has fabric info v3, the fabric's health mask; absent elsewhere. One call on a GPU
        without a fabric: v3 answering NOT_SUPPORTED means no fabric, and only a driver
        without v3 (no such function, an older struct version) is asked the first one."""
        info: Any = pynvml.c_nvmlGpuFabricInfo_v3_t()
        code = self._code("nvmlDeviceGetGpuFabricInfoV", ctypes.byref(info))
        health: int | None = None
        if code == pynvml.NVML_SUCCESS:
            answered, health = True, int(info.healthMask)
        elif code == pynvml.NVML_ERROR_NOT_SUPPORTED:
            answered = False
        else:
            info = pynvml.c_nvmlGpuFabricInfo_t()
            answered = self._get("nvmlDeviceGetGpuFabricInfo", ctypes.byref(info)) is not None
        state = _FABRIC_STATES.get(int(info.state)) if answered else None
        if state is None:
            return dict.fromkeys(_FABRIC_KEYS)
        # The status only means something once registration has completed.
        ok = int(info.status) == pynvml.NVML_SUCCESS if state == "completed" else None
        return {
            "fabric_state": state,
            "fabric_ok": ok,
            "fabric_health_mask": health,
            "fabric_cluster_uuid": str(uuid.UUID(bytes=bytes(info.clusterUuid))),
            "fabric_clique_id": int(info.cliqueId),
        }

    def _read_platform(self) -> PlatformInfo | None:
        """Where the GPU sits in an NVL rack (read once: it does not move while the driver
        is loaded); None where the GPU does not report it (NOT_SUPPORTED off such racks)."""
        info: Any = pynvml.c_nvmlPlatformInfo_v2_t()
        code = self._code("nvmlDeviceGetPlatformInfo", ctypes.byref(info))
        if code != pynvml.NVML_SUCCESS:
            return None
        raw = _PlainPlatformInfo.from_buffer(info)  # the bytes as they are, not decoded
        return PlatformInfo(
            chassis_serial=raw.chassisSerialNumber.decode(errors="replace").strip(),
            slot_number=raw.slotNumber,
            tray_index=raw.trayIndex,
            host_id=raw.hostId,
            module_id=raw.moduleId,
        )

    def _read_mig_profiles(self) -> tuple[MigProfile, ...]:
        """The GPU-instance profiles this GPU offers; NotSupported ones are left out."""
        profiles = []
        for index in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
            info = self._get(
                "nvmlDeviceGetGpuInstanceProfileInfoV",
                index,
                fn=pynvml.nvmlDeviceGetGpuInstanceProfileInfo,
            )
            if info is None or info.instanceCount == 0:
                continue
            name = mig_profile_name(info.sliceCount, info.memorySizeMB, text(info.name) or "")
            profiles.append(MigProfile(int(info.id), name, int(info.instanceCount)))
        return tuple(profiles)

    def _read_mig_instances(self) -> tuple[str, ...] | None:
        """The profile of every GPU instance, sorted; None when NVML cannot list them."""
        if self._mig_profiles is None:
            self._mig_profiles = self._read_mig_profiles()
        if not self._mig_profiles:
            return None
        names: list[str] = []
        instances: list[GpuInstance] = []
        for profile in self._mig_profiles:
            slots = (pynvml.c_nvmlGpuInstance_t * profile.max_instances)()
            count = ctypes.c_uint(0)
            listed = self._get(
                "nvmlDeviceGetGpuInstances", profile.profile_id, slots, ctypes.byref(count)
            )
            if listed is None:
                return None  # one profile not answering: the layout is not known
            names += [profile.name] * int(count.value)
            if self._profiling:
                instances += self._instance_ids(profile.name, slots[: int(count.value)])
        self._gpu_instances = tuple(sorted(instances))
        return tuple(sorted(names))

    def _read_mig_devices(self) -> tuple[MigDevice, ...]:
        """Every MIG device, by slot: what a "MIG-<uuid>" device plugin ID is matched to.

        Slots are not filled in order (destroying an instance empties its slot), so each
        one up to the maximum is asked; an empty one answers NotFound.
        """
        count = self._get("nvmlDeviceGetMaxMigDeviceCount")
        found = []
        for slot in range(count or 0):
            handle = self._get("nvmlDeviceGetMigDeviceHandleByIndex", slot)
            device = None if handle is None else self._mig_device(handle)
            if device is not None:
                found.append(device)
        return tuple(found)

    def _mig_device(self, handle: Any) -> MigDevice | None:
        """One MIG device's UUID and instance ids; None unless all three answer."""
        uuid = text(self._get_on(handle, "nvmlDeviceGetUUID"))
        gpu_instance = self._get_on(handle, "nvmlDeviceGetGpuInstanceId")
        compute_instance = self._get_on(handle, "nvmlDeviceGetComputeInstanceId")
        if not uuid or gpu_instance is None or compute_instance is None:
            return None
        return MigDevice(uuid, int(gpu_instance), int(compute_instance))

    def _get_on(
        self, handle: Any, call: str, *args: object, fn: Callable[..., Any] | None = None
    ) -> Any:
        """`_get` on another handle of this GPU (a MIG device's, a GPU instance's)."""
        fn = fn or getattr(pynvml, call)
        return self.worker.call(call, optional, call, fn, handle, *args)

    def _instance_ids(self, profile: str, handles: list[Any]) -> list[GpuInstance]:
        """(GPU instance id, profile) of each instance handle that answers."""
        found = []
        for handle in handles:
            info = self._get_on(handle, "nvmlGpuInstanceGetInfo")
            if info is not None:
                found.append((int(info.id), profile))
        return found

    def _graphics_processes(self, compute: Any, memory: Any) -> tuple[GpuProcess, ...]:
        # Only asked for when memory is in use with no compute process: then a display
        # server is what tells a desktop apart from memory held by no process.
        if compute or memory is None or not memory.used:
            return ()
        procs = self._get("nvmlDeviceGetGraphicsRunningProcesses")
        return tuple(self._process(p) for p in procs or ())

    def _process(self, info: Any) -> GpuProcess:
        used = getattr(info, "usedGpuMemory", None)
        return GpuProcess(
            pid=int(info.pid),
            name=self._process_name(int(info.pid)) or f"pid {info.pid}",
            used_mib=None if used is None else used / _MIB,
        )


def decode_ber(packed: float | None) -> float | None:
    """An NVLink bit-error rate as NVML packs it: mantissa in bits 8-11, exponent in bits
    0-7, BER = mantissa * 10^-exponent; mantissa 15 with exponent 255 is zero."""
    if packed is None:
        return None
    raw = int(packed)
    mantissa, exponent = (raw >> 8) & 0xF, raw & 0xFF
    if (mantissa, exponent) == (15, 255):
        return 0.0
    return mantissa * 10.0**-exponent


def _named(fields: dict[int, str], values: dict[Any, Any]) -> dict[str, Any]:
    """Each field's value under its GpuReadings attribute, in that attribute's unit."""
    named: dict[str, Any] = {}
    for field_id, attr in fields.items():
        value = values.get(field_id)
        if value is not None:
            if attr in _BOOL_ATTRS:
                value = bool(value)
            elif attr in _MILLIWATT_ATTRS:
                value = value / 1000
        named[attr] = value
    return named


def _reserved_mib(memory: Any) -> float | None:
    """The reserved memory: v2 reports it, v1 has no such value (absent, not 0)."""
    reserved = getattr(memory, "reserved", None)
    return None if reserved is None else reserved / _MIB


def _pstate(value: int | None) -> int | None:
    # NVML_PSTATE_UNKNOWN (32) means the driver could not tell: as good as not reported.
    return value if value is not None and 0 <= value <= pynvml.NVML_PSTATE_15 else None


def _link_state(value: float | None) -> bool | None:
    return None if value is None else value == pynvml.NVML_FEATURE_ENABLED
