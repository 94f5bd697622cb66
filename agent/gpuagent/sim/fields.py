"""nvmlDeviceGetFieldValues: one reader per supported field id.

A reader returns (nvmlReturn, valueType, value); the value lands in the union member that
matches the type, as NVML does. Ids without a reader, and values the GPU's model does not
have, are answered NOT_SUPPORTED per entry.
"""

from __future__ import annotations

import ctypes
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pynvml

from gpuagent.sim import codes, hardware
from gpuagent.sim.gpm import nvlink_throughput_field
from gpuagent.sim.gpu import SimGpu

if TYPE_CHECKING:
    from gpuagent.smi.model import CapturedGpu, TemperatureThresholds

Result = tuple[int, int, int | float]
Reader = Callable[[SimGpu, float, int], Result]

NOT_SUPPORTED: Result = (codes.ERROR_NOT_SUPPORTED, codes.VALUE_UINT, 0)
# An argument the driver rejects: a link past the GPU's last, a field id it does not know.
_INVALID: Result = (codes.ERROR_INVALID_ARGUMENT, codes.VALUE_UINT, 0)
_UNION_MEMBER = {
    codes.VALUE_DOUBLE: "dVal",
    codes.VALUE_UINT: "uiVal",
    codes.VALUE_ULONGLONG: "ullVal",
    codes.VALUE_SLONGLONG: "sllVal",
    codes.VALUE_SINT: "siVal",
}


def _ecc_mode(mode: Callable[[SimGpu], bool]) -> Reader:
    def read(gpu: SimGpu, _now: float, _scope: int) -> Result:
        if not gpu.profile.ecc:
            return NOT_SUPPORTED
        return codes.SUCCESS, codes.VALUE_UINT, int(mode(gpu))

    return read


def _ecc(count: Callable[[SimGpu], int], printed: Callable[[CapturedGpu], int | None]) -> Reader:
    """An ECC count; in a replay not where the capture shows it N/A with ECC on (with ECC
    off every count is N/A, which says nothing of the count once ECC is turned on)."""

    def captured(capture: CapturedGpu) -> int | None:
        return printed(capture) if capture.ecc_current else 0

    def read(gpu: SimGpu, _now: float, _scope: int) -> Result:
        if not gpu.ecc_enabled or not gpu.reports(captured):
            return NOT_SUPPORTED  # nvidia-smi shows N/A for ECC counts with ECC off
        return codes.SUCCESS, codes.VALUE_ULONGLONG, count(gpu)

    return read


def _retired(count: Callable[[SimGpu], int]) -> Reader:
    def read(gpu: SimGpu, _now: float, _scope: int) -> Result:
        if not gpu.retired_pages_supported():
            return NOT_SUPPORTED  # Ampere and later remap rows instead; or ECC is off
        return codes.SUCCESS, codes.VALUE_ULONGLONG, count(gpu)

    return read


def _remapped(value: Callable[[SimGpu], int]) -> Reader:
    def read(gpu: SimGpu, _now: float, _scope: int) -> Result:
        if not gpu.remapped_rows_supported():
            return NOT_SUPPORTED
        return codes.SUCCESS, codes.VALUE_UINT, value(gpu)

    return read


def _uint_at(value: Callable[[SimGpu, float], int | None]) -> Reader:
    """An unsigned-int field read at the call's time; NOT_SUPPORTED where None."""

    def read(gpu: SimGpu, now: float, _scope: int) -> Result:
        answer = value(gpu, now)
        return NOT_SUPPORTED if answer is None else (codes.SUCCESS, codes.VALUE_UINT, answer)

    return read


def _uint(value: Callable[[SimGpu], int]) -> Reader:
    return _uint_at(lambda gpu, _now: value(gpu))


def enforced_limit_mw(gpu: SimGpu, _now: float) -> int | None:
    """The enforced (current) power limit, as field 190 and nvmlDeviceGetEnforcedPowerLimit
    report it; None where a replayed capture shows it N/A."""
    return gpu.power_limit_mw if gpu.reports(lambda c: c.power_limit_w) else None


def requested_limit_mw(gpu: SimGpu, _now: float) -> int | None:
    """The requested power limit (field 192, nvmlDeviceGetPowerManagementLimit)."""
    return (
        gpu.power_requested_limit_mw if gpu.reports(lambda c: c.power_requested_limit_w) else None
    )


def default_limit_mw(gpu: SimGpu, _now: float) -> int | None:
    profile = gpu.profile
    return hardware.milliwatts(
        gpu.fixed(profile.power_default_limit_w, lambda c: c.power_default_limit_w)
    )


def min_limit_mw(gpu: SimGpu, _now: float) -> int | None:
    return hardware.milliwatts(
        gpu.fixed(gpu.profile.power_min_limit_w, lambda c: c.power_min_limit_w)
    )


def max_limit_mw(gpu: SimGpu, _now: float) -> int | None:
    return hardware.milliwatts(
        gpu.fixed(gpu.profile.power_max_limit_w, lambda c: c.power_max_limit_w)
    )


def pcie_replays(gpu: SimGpu, _now: float) -> int | None:
    """The PCIe replay count, as field 94 and nvmlDeviceGetPcieReplayCounter report it."""
    return gpu.pcie_replays if gpu.reports(lambda c: c.pcie_replays) else None


def _recovery_action(gpu: SimGpu, _now: float, _scope: int) -> Result:
    # A driver without the field does not know its id, as R580 answers for 291-307.
    if gpu.recovery_action is None:
        return _INVALID
    return codes.SUCCESS, codes.VALUE_UINT, gpu.recovery_action


def _all_links(counters: Callable[[SimGpu], list[int]]) -> Reader:
    """An NVLink error counter's `*_TOTAL` field: the sum over every link, as NVML defines
    it (``scopeId`` does not pick a link)."""

    def read(gpu: SimGpu, _now: float, _scope: int) -> Result:
        if gpu.nvlinks == 0:
            return NOT_SUPPORTED
        return codes.SUCCESS, codes.VALUE_ULONGLONG, sum(counters(gpu))

    return read


def _nvlink_state(gpu: SimGpu, _now: float, scope: int) -> Result:
    if gpu.nvlinks == 0:
        return NOT_SUPPORTED
    if scope >= gpu.nvlinks:
        return _INVALID
    return codes.SUCCESS, codes.VALUE_UINT, int(gpu.nvlink_up[scope])


def encode_ber(ber: float) -> int:
    """A bit-error rate packed as NVML does: mantissa (bits 8-11) * 10^-exponent (bits
    0-7), one significant digit; zero is mantissa 15 with exponent 255."""
    if ber <= 0:
        return (15 << 8) | 255
    exponent = -math.floor(math.log10(ber))
    mantissa = round(ber * 10.0**exponent)
    if mantissa == 10:  # 9.6e-12 rounds up to 1e-11
        mantissa, exponent = 1, exponent - 1
    return (mantissa << 8) | min(exponent, 254)


def _per_link_ber(rates: Callable[[SimGpu], list[float]]) -> Reader:
    """A per-link bit-error rate (``scopeId`` is the link), on GPUs with NVLink."""

    def read(gpu: SimGpu, _now: float, scope: int) -> Result:
        if gpu.nvlinks == 0:
            return NOT_SUPPORTED  # as the R580 H200 without NVLinks answers
        if scope >= gpu.nvlinks:
            return _INVALID
        return codes.SUCCESS, codes.VALUE_ULONGLONG, encode_ber(rates(gpu)[scope])

    return read


def _c2c_link_count(gpu: SimGpu, _now: float, _scope: int) -> Result:
    if not gpu.profile.c2c_links:
        return NOT_SUPPORTED  # as the R580 H200 (no C2C) answers
    return codes.SUCCESS, codes.VALUE_UINT, gpu.profile.c2c_links


def _per_c2c_link(value: Callable[[SimGpu, int], int]) -> Reader:
    """A C2C link's value (``scopeId`` is the link)."""

    def read(gpu: SimGpu, _now: float, scope: int) -> Result:
        if not gpu.profile.c2c_links:
            return NOT_SUPPORTED
        if scope >= gpu.profile.c2c_links:
            return _INVALID
        return codes.SUCCESS, codes.VALUE_UINT, value(gpu, scope)

    return read


def _tlimit(
    threshold: Callable[[SimGpu], int | None],
    printed: Callable[[TemperatureThresholds], float | None],
) -> Reader:
    """A threshold on NVML's T.Limit scale, not in degrees Celsius; in a replay only where
    the capture prints it (``printed`` of its thresholds).

    T.Limit counts degrees below the GPU's limit point (its max operating temperature),
    so thresholds above that point are negative: slowdown -2, shutdown -8 on an H100. The
    absolute threshold is ``temperature + nvmlDeviceGetMarginTemperature - value``.
    """

    def read(gpu: SimGpu, _now: float, _scope: int) -> Result:
        value = threshold(gpu)
        if (
            not gpu.tlimit_fields
            or value is None
            or not gpu.reports(lambda c: printed(c.thresholds))
        ):
            return NOT_SUPPORTED
        return codes.SUCCESS, codes.VALUE_SINT, gpu.profile.temperature_gpu_max_c - value

    return read


def _memory_tlimit(gpu: SimGpu, _now: float, _scope: int) -> Result:
    # The memory's limit is on its own scale: its max operating point is 0, as the H100
    # captures show ("Memory Max Operating T.Limit Temp : 0 C").
    if not gpu.tlimit_fields or gpu.profile.temperature_memory_max_c is None:
        return NOT_SUPPORTED
    return codes.SUCCESS, codes.VALUE_SINT, 0


def _memory_temp(gpu: SimGpu, now: float, _scope: int) -> Result:
    temperature = gpu.readings.memory_temperature(now)
    if temperature is None:
        return NOT_SUPPORTED  # GDDR boards have no memory sensor
    return codes.SUCCESS, codes.VALUE_UINT, round(temperature)


def _energy(gpu: SimGpu, now: float, _scope: int) -> Result:
    return codes.SUCCESS, codes.VALUE_ULONGLONG, gpu.energy_mj_at(now)


def _violation(name: str, *, per_reason: bool = False) -> Reader:
    """A throttle-duration counter (ns); ``per_reason``: one of the R550 fields 269-271."""

    def read(gpu: SimGpu, now: float, _scope: int) -> Result:
        supported = gpu.throttle_reason_fields if per_reason else gpu.profile.violation_counters
        if not supported:
            return NOT_SUPPORTED
        return codes.SUCCESS, codes.VALUE_ULONGLONG, gpu.violation_ns_at(now, name)

    return read


PowerAt = Callable[[SimGpu, float], int | None]


def _power(at_gpu: PowerAt, at_module: PowerAt) -> Reader:
    """A power field (mW) at its scope: the GPU's, or, on Grace-Blackwell models, the
    module's (None: the GPU or model has none); any other scope is not supported."""

    def read(gpu: SimGpu, now: float, scope: int) -> Result:
        if scope == pynvml.NVML_POWER_SCOPE_GPU:
            power = at_gpu(gpu, now)
        elif scope == pynvml.NVML_POWER_SCOPE_MODULE:
            power = at_module(gpu, now)
        else:
            power = None
        return NOT_SUPPORTED if power is None else (codes.SUCCESS, codes.VALUE_UINT, power)

    return read


def _module_draw(at_gpu: PowerAt) -> PowerAt:
    """The module's draw: its GPU's plus the rest of the module."""

    def draw(gpu: SimGpu, now: float) -> int | None:
        extra = gpu.profile.module_power_extra_w
        drawn = at_gpu(gpu, now)
        return None if extra is None or drawn is None else drawn + round(extra * 1000)

    return draw


def _module_limit(gpu: SimGpu, _now: float) -> int | None:
    return hardware.milliwatts(gpu.profile.module_power_limit_w)


def _no_module(_gpu: SimGpu, _now: float) -> int | None:
    return None


def _average_mw(gpu: SimGpu, now: float) -> int | None:
    return gpu.readings.average_power_mw(now)


def _instant_mw(gpu: SimGpu, now: float) -> int | None:
    return gpu.readings.power_mw(now)


READERS: dict[int, Reader] = {
    codes.FI_ECC_CURRENT: _ecc_mode(lambda g: g.ecc_enabled),
    codes.FI_ECC_PENDING: _ecc_mode(lambda g: g.ecc_pending),
    codes.FI_ECC_SBE_VOL_TOTAL: _ecc(
        lambda g: g.ecc_sbe_volatile, lambda c: c.ecc_corrected_volatile
    ),
    codes.FI_ECC_DBE_VOL_TOTAL: _ecc(
        lambda g: g.ecc_dbe_volatile, lambda c: c.ecc_uncorrected_volatile
    ),
    codes.FI_ECC_SBE_AGG_TOTAL: _ecc(
        lambda g: g.ecc_sbe_aggregate, lambda c: c.ecc_corrected_aggregate
    ),
    codes.FI_ECC_DBE_AGG_TOTAL: _ecc(
        lambda g: g.ecc_dbe_aggregate, lambda c: c.ecc_uncorrected_aggregate
    ),
    codes.FI_RETIRED_SBE: _retired(lambda g: g.retired_sbe),
    codes.FI_RETIRED_DBE: _retired(lambda g: g.retired_dbe),
    codes.FI_RETIRED_PENDING: _retired(lambda g: int(g.retired_pending)),
    codes.FI_REMAPPED_COR: _remapped(lambda g: g.remapped_correctable),
    codes.FI_REMAPPED_UNC: _remapped(lambda g: g.remapped_uncorrectable),
    codes.FI_REMAPPED_PENDING: _remapped(lambda g: int(g.remap_pending)),
    codes.FI_REMAPPED_FAILURE: _remapped(lambda g: int(g.remap_failure)),
    codes.FI_PCIE_REPLAY_COUNTER: _uint_at(pcie_replays),
    codes.FI_TOTAL_ENERGY_CONSUMPTION: _energy,
    codes.FI_MEMORY_TEMP: _memory_temp,
    codes.FI_POWER_AVERAGE: _power(_average_mw, _module_draw(_average_mw)),
    codes.FI_POWER_INSTANT: _power(_instant_mw, _module_draw(_instant_mw)),
    codes.FI_POWER_CURRENT_LIMIT: _power(enforced_limit_mw, _module_limit),
    # The module's own requested, default and extreme limits are not modelled.
    pynvml.NVML_FI_DEV_POWER_REQUESTED_LIMIT: _power(requested_limit_mw, _no_module),
    pynvml.NVML_FI_DEV_POWER_DEFAULT_LIMIT: _power(default_limit_mw, _no_module),
    pynvml.NVML_FI_DEV_POWER_MIN_LIMIT: _power(min_limit_mw, _no_module),
    pynvml.NVML_FI_DEV_POWER_MAX_LIMIT: _power(max_limit_mw, _no_module),
    codes.FI_GPU_RECOVERY_ACTION: _recovery_action,
    codes.FI_NVLINK_LINK_COUNT: _uint(lambda g: g.nvlinks),
    codes.FI_NVLINK_GET_STATE: _nvlink_state,
    codes.FI_NVLINK_CRC_FLIT_TOTAL: _all_links(lambda g: g.nvlink_crc_flit),
    codes.FI_NVLINK_CRC_DATA_TOTAL: _all_links(lambda g: g.nvlink_crc_data),
    codes.FI_NVLINK_REPLAY_TOTAL: _all_links(lambda g: g.nvlink_replay),
    codes.FI_NVLINK_RECOVERY_TOTAL: _all_links(lambda g: g.nvlink_recovery),
    pynvml.NVML_FI_DEV_C2C_LINK_COUNT: _c2c_link_count,
    pynvml.NVML_FI_DEV_C2C_LINK_GET_STATUS: _per_c2c_link(lambda _g, _link: 1),  # active
    pynvml.NVML_FI_DEV_C2C_LINK_ERROR_INTR: _per_c2c_link(lambda g, n: g.c2c_errors["crc"][n]),
    pynvml.NVML_FI_DEV_C2C_LINK_ERROR_REPLAY: _per_c2c_link(lambda g, n: g.c2c_errors["replay"][n]),
    pynvml.NVML_FI_DEV_C2C_LINK_ERROR_REPLAY_B2B: _per_c2c_link(
        lambda g, n: g.c2c_errors["replay_b2b"][n]
    ),
    pynvml.NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_BER: _per_link_ber(lambda g: g.nvlink_effective_ber),
    pynvml.NVML_FI_DEV_NVLINK_COUNT_SYMBOL_BER: _per_link_ber(lambda g: g.nvlink_symbol_ber),
    pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: nvlink_throughput_field(receive=False),
    pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: nvlink_throughput_field(receive=True),
    codes.FI_TEMPERATURE_SHUTDOWN_TLIMIT: _tlimit(
        lambda g: g.profile.temperature_shutdown_c, lambda t: t.shutdown
    ),
    codes.FI_TEMPERATURE_SLOWDOWN_TLIMIT: _tlimit(
        lambda g: g.profile.temperature_slowdown_c, lambda t: t.slowdown
    ),
    codes.FI_TEMPERATURE_GPU_MAX_TLIMIT: _tlimit(
        lambda g: g.profile.temperature_gpu_max_c, lambda t: t.gpu_max
    ),
    codes.FI_TEMPERATURE_MEM_MAX_TLIMIT: _memory_tlimit,
    codes.FI_PERF_POLICY_POWER: _violation("power"),
    codes.FI_PERF_POLICY_THERMAL: _violation("thermal"),
    codes.FI_PERF_POLICY_SYNC_BOOST: _violation("sync_boost"),
    codes.FI_PERF_POLICY_BOARD_LIMIT: _violation("board_limit"),
    codes.FI_PERF_POLICY_LOW_UTILIZATION: _violation("low_utilization"),
    codes.FI_PERF_POLICY_RELIABILITY: _violation("reliability"),
    codes.FI_CLOCKS_EVENT_REASON_SW_THERMAL: _violation("sw_thermal", per_reason=True),
    codes.FI_CLOCKS_EVENT_REASON_HW_THERMAL: _violation("hw_thermal", per_reason=True),
    codes.FI_CLOCKS_EVENT_REASON_POWER_BRAKE: _violation("power_brake", per_reason=True),
}


class _RawFieldValue(ctypes.Structure):
    """c_nvmlFieldValue_t's layout without pynvml's Python-level attribute hooks.

    pynvml's printable structs route every attribute access through Python code; writing
    through this plain view of the same memory keeps a 50-field poll cheap.
    """

    _fields_ = pynvml.c_nvmlFieldValue_t._fields_


def fill_field_values(gpu: SimGpu, now: float, values: Any, count: int) -> None:
    """Answer each requested entry of the c_nvmlFieldValue_t array ``values``."""
    entries = (_RawFieldValue * count).from_buffer(values)
    timestamp = int(time.time() * 1_000_000)  # NVML stamps samples in wall-clock microseconds
    for entry in entries:
        reader = READERS.get(entry.fieldId)
        result = NOT_SUPPORTED if reader is None else reader(gpu, now, entry.scopeId)
        entry.timestamp = timestamp
        entry.latencyUsec = 0
        entry.nvmlReturn = result[0]
        entry.valueType = result[1]
        if result[0] == codes.SUCCESS:
            setattr(entry.value, _UNION_MEMBER[result[1]], result[2])
