"""The simulated libnvidia-ml: Python functions with the C functions' names and arguments.

pynvml calls these exactly as it would call the shared library: handles are ctypes
pointers, outputs arrive as ``byref(...)`` objects or buffers, and every function returns
an NVML return code. Each entry is a plain function (pynvml sets ``restype`` on some).
"""

from __future__ import annotations

import ctypes
import re
from collections.abc import Callable
from typing import Any

import pynvml

from gpuagent.sim import codes, hardware
from gpuagent.sim.events import SUPPORTED_EVENT_TYPES, EventSet
from gpuagent.sim.fields import fill_field_values
from gpuagent.sim.gpu import SimGpu
from gpuagent.sim.state import NodeState

Entry = Callable[..., Any]
_ERROR_STRINGS: dict[int, bytes] = {
    code: text.encode()
    for code, text in pynvml.NVMLError._errcode_to_string.items()  # noqa: SLF001
}
_ERROR_STRINGS[codes.SUCCESS] = b"Success"
_BUS_ID_RE = re.compile(r"^(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])$")
_THRESHOLDS = {
    codes.THRESHOLD_SHUTDOWN: hardware.TEMPERATURE_SHUTDOWN_C,
    codes.THRESHOLD_SLOWDOWN: hardware.TEMPERATURE_SLOWDOWN_C,
    codes.THRESHOLD_MEM_MAX: hardware.TEMPERATURE_MEM_MAX_C,
    codes.THRESHOLD_GPU_MAX: hardware.TEMPERATURE_GPU_MAX_C,
}
_MAX_CLOCKS = {
    codes.CLOCK_GRAPHICS: hardware.SM_CLOCK_MAX_MHZ,
    codes.CLOCK_SM: hardware.SM_CLOCK_MAX_MHZ,
    codes.CLOCK_MEM: hardware.MEMORY_CLOCK_MHZ,
    codes.CLOCK_VIDEO: hardware.VIDEO_CLOCK_MAX_MHZ,
}


def _int(value: Any) -> int:
    """A C integer argument: pynvml passes ctypes values or plain ints."""
    return value if isinstance(value, int) else int(value.value)


def _out(reference: Any) -> Any:
    """The object a ``byref(...)`` argument points at."""
    return reference._obj  # noqa: SLF001 - ctypes keeps the byref target here


def _put_string(buffer: Any, length: Any, text: bytes) -> int:
    if len(text) >= _int(length):  # room for the terminating NUL, as C strings need
        return codes.ERROR_INSUFFICIENT_SIZE
    buffer.value = text
    return codes.SUCCESS


def _parse_bus_id(text: bytes) -> tuple[int, int, int] | None:
    match = _BUS_ID_RE.match(text.decode(errors="replace").strip())
    if match is None:
        return None
    domain, bus, device, _function = match.groups()
    return int(domain or "0", 16), int(bus, 16), int(device, 16)


class SimulatedLibrary:
    """Installed as ``pynvml.nvmlLib``: one attribute per NVML C function it implements.

    A function that is not here makes pynvml raise NVMLError_FunctionNotFound, as an
    older driver's library would.
    """

    def __init__(self, state: NodeState) -> None:
        self._state = state
        for name, impl in self._system_functions().items():
            self._install(name, self._system_entry(name, impl, needs_init=True))
        for name, impl in self._before_init_functions().items():
            self._install(name, self._system_entry(name, impl, needs_init=False))
        for name, device_impl in self._device_functions().items():
            self._install(name, self._device_entry(name, device_impl))

    def _install(self, name: str, entry: Entry) -> None:
        entry.__name__ = name
        entry.__qualname__ = f"SimulatedLibrary.{name}"
        self._state.counts[name] = 0
        setattr(self, name, entry)

    # --- call wrappers ----------------------------------------------------------------

    def _system_entry(self, name: str, impl: Entry, *, needs_init: bool) -> Entry:
        state = self._state
        counts = state.counts

        def entry(*args: Any) -> Any:
            now = state.clock() - state.start
            with state.cond:
                if now >= state.next_due:
                    state.apply_due(now)
                counts[name] += 1
                if needs_init and state.init_count == 0:
                    return codes.ERROR_UNINITIALIZED
                return impl(now, *args)

        return entry

    def _device_entry(self, name: str, impl: Entry) -> Entry:
        state = self._state
        counts = state.counts
        per_device = state.per_device

        def entry(handle: Any, *args: Any) -> int:
            now = state.clock() - state.start
            with state.cond:
                if now >= state.next_due:
                    state.apply_due(now)
                counts[name] += 1
                if state.init_count == 0:
                    return codes.ERROR_UNINITIALIZED
                gpu = state.gpu_for_handle(handle)
                if gpu is None:
                    return codes.ERROR_INVALID_ARGUMENT
                per_device[gpu.index] += 1
                if gpu.lost or gpu.hang_until > now:
                    code, now = state.gate(gpu, now)
                    if code != codes.SUCCESS:
                        return code
                result: int = impl(gpu, now, *args)
                return result

        return entry

    # --- library and system ------------------------------------------------------------

    def _before_init_functions(self) -> dict[str, Entry]:
        return {
            "nvmlInit_v2": self._init,
            "nvmlInitWithFlags": lambda now, _flags: self._init(now),
            "nvmlShutdown": self._shutdown,
            "nvmlErrorString": self._error_string,
        }

    def _init(self, now: float) -> int:
        state = self._state
        if state.init_error == codes.ERROR_TIMEOUT:
            state.wait_out_init_hang(now)
        if state.init_error is not None:
            return state.init_error
        state.init_count += 1
        return codes.SUCCESS

    def _shutdown(self, _now: float) -> int:
        if self._state.init_count == 0:
            return codes.ERROR_UNINITIALIZED
        self._state.init_count -= 1
        return codes.SUCCESS

    @staticmethod
    def _error_string(_now: float, result: Any) -> bytes:
        return _ERROR_STRINGS.get(_int(result), b"Unknown Error")

    def _system_functions(self) -> dict[str, Entry]:
        spec = self._state.spec
        driver = spec.driver_version.encode()
        nvml = spec.resolved_nvml_version.encode()
        return {
            "nvmlSystemGetDriverVersion": lambda _n, buf, size: _put_string(buf, size, driver),
            "nvmlSystemGetNVMLVersion": lambda _n, buf, size: _put_string(buf, size, nvml),
            "nvmlSystemGetCudaDriverVersion": self._cuda_version,
            "nvmlSystemGetCudaDriverVersion_v2": self._cuda_version,
            "nvmlSystemGetProcessName": self._process_name,
            "nvmlDeviceGetCount_v2": self._device_count,
            "nvmlDeviceGetHandleByIndex_v2": self._handle_by_index,
            "nvmlDeviceGetHandleByUUID": self._handle_by_uuid,
            "nvmlDeviceGetHandleByPciBusId_v2": self._handle_by_bus_id,
            "nvmlEventSetCreate": self._event_set_create,
            "nvmlEventSetWait_v2": self._event_set_wait,
            "nvmlEventSetFree": self._event_set_free,
        }

    def _cuda_version(self, _now: float, out: Any) -> int:
        _out(out).value = self._state.spec.cuda_driver_version
        return codes.SUCCESS

    def _process_name(self, _now: float, pid: Any, buffer: Any, length: Any) -> int:
        wanted = _int(pid)
        for gpu in self._state.gpus:
            process = gpu.processes.get(wanted)
            if process is not None:
                return _put_string(buffer, length, process.name.encode())
        return codes.ERROR_NOT_FOUND

    def _device_count(self, _now: float, out: Any) -> int:
        _out(out).value = len(self._state.gpus)
        return codes.SUCCESS

    @staticmethod
    def _hand_out(gpu: SimGpu, out: Any) -> int:
        # NVML enumerates GPUs at init and hands out handles from that table: it reports
        # a GPU that fell off the bus, but does not wait on a wedged one.
        if gpu.lost:
            return codes.ERROR_GPU_IS_LOST
        _out(out).contents = gpu.device
        return codes.SUCCESS

    def _handle_by_index(self, _now: float, index: Any, out: Any) -> int:
        wanted = _int(index)
        if not 0 <= wanted < len(self._state.gpus):
            return codes.ERROR_INVALID_ARGUMENT
        return self._hand_out(self._state.gpus[wanted], out)

    def _handle_by_uuid(self, _now: float, uuid: Any, out: Any) -> int:
        wanted = uuid.value if hasattr(uuid, "value") else uuid
        for gpu in self._state.gpus:
            if gpu.uuid == wanted:
                return self._hand_out(gpu, out)
        return codes.ERROR_NOT_FOUND

    def _handle_by_bus_id(self, _now: float, bus_id: Any, out: Any) -> int:
        text = bus_id.value if hasattr(bus_id, "value") else bus_id
        wanted = _parse_bus_id(text or b"")
        if wanted is None:
            return codes.ERROR_INVALID_ARGUMENT
        for gpu in self._state.gpus:
            if wanted == (0, gpu.board.bus, 0):
                return self._hand_out(gpu, out)
        return codes.ERROR_NOT_FOUND

    # --- events ------------------------------------------------------------------------

    def _event_set_create(self, _now: float, out: Any) -> int:
        event_set = EventSet()
        self._state.event_sets[ctypes.addressof(event_set.target)] = event_set
        _out(out).contents = event_set.target
        return codes.SUCCESS

    def _event_set_wait(self, _now: float, pointer: Any, data: Any, timeout_ms: Any) -> int:
        event_set = self._state.event_set_for(pointer)
        if event_set is None:
            return codes.ERROR_INVALID_ARGUMENT
        outcome = self._state.wait_event(event_set, _int(timeout_ms) / 1000.0)
        if isinstance(outcome, int):
            return outcome
        gpu, event_type, event_data = outcome
        target = _out(data)
        target.device = gpu.handle
        target.eventType = event_type
        target.eventData = event_data
        target.gpuInstanceId = hardware.NO_INSTANCE_ID
        target.computeInstanceId = hardware.NO_INSTANCE_ID
        return codes.SUCCESS

    def _event_set_free(self, _now: float, pointer: Any) -> int:
        event_set = self._state.event_set_for(pointer)
        if event_set is None:
            return codes.ERROR_INVALID_ARGUMENT
        event_set.freed = True
        del self._state.event_sets[ctypes.addressof(event_set.target)]
        self._state.cond.notify_all()
        return codes.SUCCESS

    # --- devices -------------------------------------------------------------------------

    def _device_functions(self) -> dict[str, Entry]:
        return {
            "nvmlDeviceGetName": lambda g, _n, buf, size: _put_string(buf, size, g.name),
            "nvmlDeviceGetUUID": lambda g, _n, buf, size: _put_string(buf, size, g.uuid),
            "nvmlDeviceGetSerial": lambda g, _n, buf, size: _put_string(buf, size, g.serial),
            "nvmlDeviceGetVbiosVersion": lambda _g, _n, buf, size: _put_string(
                buf, size, self._state.spec.vbios_version.encode()
            ),
            "nvmlDeviceGetPciInfo_v3": _pci_info,
            "nvmlDeviceGetMinorNumber": _reply(lambda g, _n: g.index),
            "nvmlDeviceGetIndex": _reply(lambda g, _n: g.index),
            "nvmlDeviceGetPowerManagementDefaultLimit": _reply(
                lambda _g, _n: hardware.POWER_DEFAULT_LIMIT_MW
            ),
            "nvmlDeviceGetPowerManagementLimit": _reply(lambda g, _n: g.power_limit_mw),
            "nvmlDeviceGetEnforcedPowerLimit": _reply(lambda g, _n: g.power_limit_mw),
            "nvmlDeviceGetPowerManagementLimitConstraints": _power_constraints,
            "nvmlDeviceGetPowerUsage": _reply(lambda g, now: g.power_mw(now)),
            "nvmlDeviceGetTotalEnergyConsumption": _reply(lambda g, now: g.energy_mj_at(now)),
            "nvmlDeviceGetMaxPcieLinkGeneration": _reply(
                lambda _g, _n: hardware.PCIE_MAX_GENERATION
            ),
            "nvmlDeviceGetMaxPcieLinkWidth": _reply(lambda _g, _n: hardware.PCIE_MAX_WIDTH),
            "nvmlDeviceGetCurrPcieLinkGeneration": _reply(lambda g, _n: g.pcie_generation),
            "nvmlDeviceGetCurrPcieLinkWidth": _reply(lambda g, _n: g.pcie_width),
            "nvmlDeviceGetPcieReplayCounter": _reply(lambda g, _n: g.pcie_replays),
            "nvmlDeviceGetTemperatureThreshold": _temperature_threshold,
            "nvmlDeviceGetTemperature": _temperature,
            "nvmlDeviceGetMarginTemperature": _margin_temperature,
            "nvmlDeviceGetFieldValues": _field_values,
            "nvmlDeviceGetUtilizationRates": _utilization,
            "nvmlDeviceGetEncoderUtilization": _codec_utilization,
            "nvmlDeviceGetDecoderUtilization": _codec_utilization,
            "nvmlDeviceGetMemoryInfo": _memory_v1,
            "nvmlDeviceGetMemoryInfo_v2": _memory_v2,
            "nvmlDeviceGetClockInfo": _clock,
            "nvmlDeviceGetMaxClockInfo": _max_clock,
            "nvmlDeviceGetCurrentClocksEventReasons": _reply(
                lambda g, now: g.clock_event_reasons(now)
            ),
            "nvmlDeviceGetCurrentClocksThrottleReasons": _reply(
                lambda g, now: g.clock_event_reasons(now)
            ),
            "nvmlDeviceGetComputeRunningProcesses_v3": _compute_processes,
            "nvmlDeviceGetGraphicsRunningProcesses_v3": _no_processes,
            "nvmlDeviceGetPersistenceMode": _reply(lambda g, _n: int(g.persistence)),
            "nvmlDeviceGetMigMode": _pair(lambda g: (int(g.mig_mode), int(g.mig_pending))),
            "nvmlDeviceGetEccMode": _pair(lambda g: (int(g.ecc_enabled), int(g.ecc_pending))),
            "nvmlDeviceGetGpuInstanceProfileInfoV": _gpu_instance_profile_info,
            "nvmlDeviceGetGpuInstances": _gpu_instances,
            "nvmlDeviceGetInforomImageVersion": lambda _g, _n, buf, size: _put_string(
                buf, size, hardware.INFOROM_VERSION.encode()
            ),
            "nvmlDeviceGetGspFirmwareVersion": self._gsp_firmware_version,
            "nvmlDeviceGetApplicationsClock": _applications_clock,
            "nvmlDeviceGetDefaultApplicationsClock": _default_applications_clock,
            "nvmlDeviceGetGpuFabricInfo": _fabric_info,
            "nvmlDeviceGetRemappedRows": _remapped_rows,
            "nvmlDeviceGetRetiredPagesPendingStatus": _retired_pending,
            "nvmlDeviceGetNvLinkState": _nvlink_state,
            "nvmlDeviceSetPersistenceMode": _set_persistence,
            "nvmlDeviceSetPowerManagementLimit": _set_power_limit,
            "nvmlDeviceGetSupportedEventTypes": _reply(lambda _g, _n: SUPPORTED_EVENT_TYPES),
            "nvmlDeviceRegisterEvents": self._register_events,
        }

    def _gsp_firmware_version(self, _gpu: SimGpu, _now: float, buffer: Any) -> int:
        version = self._state.spec.resolved_gsp_firmware_version
        if version is None:
            return codes.ERROR_NOT_SUPPORTED  # GSP firmware off (or a pre-Turing GPU)
        # The C function takes no length: the caller's buffer is NVML_GSP_FIRMWARE_VERSION_BUF_SIZE.
        return _put_string(buffer, len(buffer), version.encode())

    def _register_events(self, gpu: SimGpu, _now: float, event_types: Any, pointer: Any) -> int:
        event_set = self._state.event_set_for(pointer)
        if event_set is None:
            return codes.ERROR_INVALID_ARGUMENT
        wanted = _int(event_types)
        if wanted & ~SUPPORTED_EVENT_TYPES:
            return codes.ERROR_NOT_SUPPORTED
        event_set.masks[gpu.index] = event_set.masks.get(gpu.index, 0) | wanted
        return codes.SUCCESS


# --- device functions (lock held, GPU reachable) -----------------------------------------


def _reply(value: Callable[[SimGpu, float], int]) -> Entry:
    """A getter with a single ``byref`` output."""

    def impl(gpu: SimGpu, now: float, out: Any) -> int:
        _out(out).value = value(gpu, now)
        return codes.SUCCESS

    return impl


def _pair(values: Callable[[SimGpu], tuple[int, int]]) -> Entry:
    """A getter with current and pending outputs (MIG mode, ECC mode)."""

    def impl(gpu: SimGpu, _now: float, current: Any, pending: Any) -> int:
        _out(current).value, _out(pending).value = values(gpu)
        return codes.SUCCESS

    return impl


def _pci_info(gpu: SimGpu, _now: float, out: Any) -> int:
    info = _out(out)
    info.busIdLegacy = gpu.bus_id_legacy
    info.domain = 0
    info.bus = gpu.board.bus
    info.device = 0
    info.pciDeviceId = hardware.PCI_DEVICE_ID
    info.pciSubSystemId = hardware.PCI_SUBSYSTEM_ID
    info.busId = gpu.bus_id
    return codes.SUCCESS


def _power_constraints(gpu: SimGpu, _now: float, minimum: Any, maximum: Any) -> int:
    del gpu
    _out(minimum).value = hardware.POWER_MIN_LIMIT_MW
    _out(maximum).value = hardware.POWER_MAX_LIMIT_MW
    return codes.SUCCESS


def _temperature_threshold(_gpu: SimGpu, _now: float, threshold: Any, out: Any) -> int:
    which = _int(threshold)
    if not 0 <= which < codes.THRESHOLD_COUNT:
        return codes.ERROR_INVALID_ARGUMENT
    value = _THRESHOLDS.get(which)
    if value is None:
        return codes.ERROR_NOT_SUPPORTED  # acoustic limits: not on a data-centre GPU
    _out(out).value = value
    return codes.SUCCESS


def _temperature(gpu: SimGpu, now: float, sensor: Any, out: Any) -> int:
    if _int(sensor) != codes.TEMPERATURE_GPU:
        return codes.ERROR_INVALID_ARGUMENT
    _out(out).value = round(gpu.temperature(now))
    return codes.SUCCESS


def _margin_temperature(gpu: SimGpu, now: float, out: Any) -> int:
    # Degrees left before the T.Limit point (the max operating temperature).
    margin = _out(out)
    if margin.version != codes.MARGIN_TEMPERATURE_V1:
        return codes.ERROR_ARGUMENT_VERSION_MISMATCH
    margin.marginTemperature = hardware.TEMPERATURE_GPU_MAX_C - round(gpu.temperature(now))
    return codes.SUCCESS


def _field_values(gpu: SimGpu, now: float, count: Any, values: Any) -> int:
    wanted = _int(count)
    entries = _out(values)
    if not 0 <= wanted <= len(entries):
        return codes.ERROR_INVALID_ARGUMENT
    fill_field_values(gpu, now, entries, wanted)
    return codes.SUCCESS


def _utilization(gpu: SimGpu, now: float, out: Any) -> int:
    if gpu.mig_mode:
        return codes.ERROR_NOT_SUPPORTED  # NVML has no whole-GPU utilization under MIG
    rates = _out(out)
    rates.gpu = round(gpu.utilization(now))
    rates.memory = round(gpu.memory_utilization(now))
    return codes.SUCCESS


def _codec_utilization(gpu: SimGpu, _now: float, utilization: Any, period_us: Any) -> int:
    if gpu.mig_mode:
        return codes.ERROR_NOT_SUPPORTED
    _out(utilization).value = 0
    _out(period_us).value = hardware.ENCODER_SAMPLING_PERIOD_US
    return codes.SUCCESS


def _memory_v1(gpu: SimGpu, _now: float, out: Any) -> int:
    # The v1 struct counts the driver's reserved memory as used.
    memory = _out(out)
    total = hardware.MEMORY_TOTAL_MIB * hardware.MIB
    used = hardware.MEMORY_RESERVED_MIB * hardware.MIB + gpu.memory_used_bytes()
    memory.total, memory.used, memory.free = total, used, total - used
    return codes.SUCCESS


def _memory_v2(gpu: SimGpu, _now: float, out: Any) -> int:
    memory = _out(out)
    if memory.version != codes.MEMORY_V2:
        return codes.ERROR_ARGUMENT_VERSION_MISMATCH
    total = hardware.MEMORY_TOTAL_MIB * hardware.MIB
    reserved = hardware.MEMORY_RESERVED_MIB * hardware.MIB
    used = gpu.memory_used_bytes()
    memory.total, memory.reserved, memory.used = total, reserved, used
    memory.free = total - reserved - used
    return codes.SUCCESS


def _clock(gpu: SimGpu, now: float, clock_type: Any, out: Any) -> int:
    which = _int(clock_type)
    if which in (codes.CLOCK_GRAPHICS, codes.CLOCK_SM):
        _out(out).value = gpu.sm_clock_mhz(now)
    elif which == codes.CLOCK_MEM:
        _out(out).value = hardware.MEMORY_CLOCK_MHZ
    elif which == codes.CLOCK_VIDEO:
        # The video clock follows the SM clock down when the GPU slows.
        sm_share = gpu.sm_clock_mhz(now) / hardware.SM_CLOCK_MAX_MHZ
        _out(out).value = round(hardware.VIDEO_CLOCK_MAX_MHZ * sm_share)
    else:
        return codes.ERROR_INVALID_ARGUMENT
    return codes.SUCCESS


def _max_clock(_gpu: SimGpu, _now: float, clock_type: Any, out: Any) -> int:
    value = _MAX_CLOCKS.get(_int(clock_type))
    if value is None:
        return codes.ERROR_INVALID_ARGUMENT
    _out(out).value = value
    return codes.SUCCESS


def _clock_setting(graphics_mhz: int, clock_type: Any, out: Any) -> int:
    """An applications clock: ``graphics_mhz`` for graphics and SM, the fixed memory clock."""
    which = _int(clock_type)
    if which in (codes.CLOCK_GRAPHICS, codes.CLOCK_SM):
        _out(out).value = graphics_mhz
    elif which == codes.CLOCK_MEM:
        _out(out).value = hardware.MEMORY_CLOCK_MHZ
    else:
        return codes.ERROR_INVALID_ARGUMENT
    return codes.SUCCESS


def _applications_clock(gpu: SimGpu, _now: float, clock_type: Any, out: Any) -> int:
    return _clock_setting(gpu.applications_clock_mhz, clock_type, out)


def _default_applications_clock(_gpu: SimGpu, _now: float, clock_type: Any, out: Any) -> int:
    return _clock_setting(hardware.APPLICATIONS_CLOCK_DEFAULT_MHZ, clock_type, out)


def _fabric_info(gpu: SimGpu, _now: float, out: Any) -> int:
    if gpu.fabric_state == codes.FABRIC_STATE_NOT_SUPPORTED:
        return codes.ERROR_NOT_SUPPORTED  # no NVSwitch fabric on this system
    info = _out(out)
    info.state = gpu.fabric_state
    info.status = gpu.fabric_status
    return codes.SUCCESS


_PROFILES_BY_INDEX = {p.index: p for p in hardware.MIG_PROFILES}
_PROFILES_BY_ID = {p.profile_id: p for p in hardware.MIG_PROFILES}


def _gpu_instance_profile_info(gpu: SimGpu, _now: float, profile: Any, out: Any) -> int:
    which = _int(profile)
    if not 0 <= which < codes.GPU_INSTANCE_PROFILE_COUNT:
        return codes.ERROR_INVALID_ARGUMENT
    info = _out(out)
    if info.version != codes.GPU_INSTANCE_PROFILE_INFO_V2:
        return codes.ERROR_ARGUMENT_VERSION_MISMATCH
    spec = _PROFILES_BY_INDEX.get(which)
    if not gpu.mig_mode or spec is None:
        return codes.ERROR_NOT_SUPPORTED  # MIG off, or a profile this GPU does not offer
    info.id = spec.profile_id
    info.isP2pSupported = 0
    info.sliceCount = spec.slices
    info.instanceCount = spec.max_instances
    info.multiprocessorCount = spec.slices * hardware.MIG_SMS_PER_SLICE
    info.copyEngineCount = spec.slices
    info.memorySizeMB = spec.memory_mib
    info.name = f"MIG {spec.name}".encode()
    return codes.SUCCESS


def _gpu_instances(gpu: SimGpu, _now: float, profile_id: Any, instances: Any, count: Any) -> int:
    spec = _PROFILES_BY_ID.get(_int(profile_id))
    if not gpu.mig_mode:
        return codes.ERROR_NOT_SUPPORTED
    if spec is None:
        return codes.ERROR_INVALID_ARGUMENT
    found = [i for i in gpu.mig_instances if i.profile is spec]
    # The caller sizes the array by the profile's instanceCount, as NVML documents.
    if instances is None or len(instances) < len(found):
        return codes.ERROR_INSUFFICIENT_SIZE
    for slot, instance in enumerate(found):
        instances[slot] = ctypes.pointer(instance.handle)
    _out(count).value = len(found)
    return codes.SUCCESS


def _compute_processes(gpu: SimGpu, _now: float, count: Any, infos: Any) -> int:
    capacity = _out(count)
    running = list(gpu.processes.values())
    if infos is None or capacity.value < len(running):
        # The sizing call (or too small an array): say how many entries are needed.
        capacity.value = len(running)
        return codes.SUCCESS if not running else codes.ERROR_INSUFFICIENT_SIZE
    for slot, process in zip(infos, running, strict=False):
        slot.pid = process.pid
        slot.usedGpuMemory = process.used_bytes
        slot.gpuInstanceId = hardware.NO_INSTANCE_ID
        slot.computeInstanceId = hardware.NO_INSTANCE_ID
    capacity.value = len(running)
    return codes.SUCCESS


def _no_processes(_gpu: SimGpu, _now: float, count: Any, _infos: Any) -> int:
    _out(count).value = 0
    return codes.SUCCESS


def _remapped_rows(
    gpu: SimGpu, _now: float, correctable: Any, uncorrectable: Any, pending: Any, failure: Any
) -> int:
    _out(correctable).value = gpu.remapped_correctable
    _out(uncorrectable).value = gpu.remapped_uncorrectable
    _out(pending).value = int(gpu.remap_pending)
    _out(failure).value = int(gpu.remap_failure)
    return codes.SUCCESS


def _retired_pending(gpu: SimGpu, _now: float, out: Any) -> int:
    if not gpu.ecc_enabled:
        return codes.ERROR_NOT_SUPPORTED
    _out(out).value = int(gpu.retired_pending)
    return codes.SUCCESS


def _nvlink_state(gpu: SimGpu, _now: float, link: Any, out: Any) -> int:
    if gpu.nvlinks == 0:
        return codes.ERROR_NOT_SUPPORTED
    which = _int(link)
    if not 0 <= which < gpu.nvlinks:
        return codes.ERROR_INVALID_ARGUMENT
    _out(out).value = int(gpu.nvlink_up[which])
    return codes.SUCCESS


def _set_persistence(gpu: SimGpu, _now: float, mode: Any) -> int:
    wanted = _int(mode)
    if wanted not in (0, 1):
        return codes.ERROR_INVALID_ARGUMENT
    gpu.persistence = bool(wanted)
    return codes.SUCCESS


def _set_power_limit(gpu: SimGpu, now: float, limit: Any) -> int:
    wanted = _int(limit)
    if not hardware.POWER_MIN_LIMIT_MW <= wanted <= hardware.POWER_MAX_LIMIT_MW:
        return codes.ERROR_INVALID_ARGUMENT
    gpu.settle_energy(now)
    gpu.power_limit_mw = wanted
    return codes.SUCCESS
