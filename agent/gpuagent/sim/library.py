"""The simulated libnvidia-ml: Python functions with the C functions' names and arguments.

pynvml calls these exactly as it would call the shared library: handles are ctypes
pointers, outputs arrive as ``byref(...)`` objects or buffers, and every function returns
an NVML return code. Each entry is a plain function (pynvml sets ``restype`` on some).
"""

from __future__ import annotations

import ctypes
import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pynvml

from gpuagent.model import fabric_health_mask
from gpuagent.sim import codes, costs, hardware
from gpuagent.sim.events import (
    OPERATIONAL_EVENT,
    OPERATIONAL_EVENTS_DRIVER_MAJOR,
    EventSet,
    supported_event_types,
)
from gpuagent.sim.fields import (
    default_limit_mw,
    enforced_limit_mw,
    fill_field_values,
    max_limit_mw,
    min_limit_mw,
    pcie_replays,
    requested_limit_mw,
)
from gpuagent.sim.gpm import GpmDriver
from gpuagent.sim.gpu import SimGpu, SimGpuInstance
from gpuagent.sim.state import NodeState

if TYPE_CHECKING:
    from gpuagent.smi.model import CapturedGpu

Entry = Callable[..., Any]
# A device function's answer for a MIG device handle: (parent GPU, its instance, now, args).
MigEntry = Callable[..., int]
_ERROR_STRINGS: dict[int, bytes] = {
    code: text.encode()
    for code, text in pynvml.NVMLError._errcode_to_string.items()  # noqa: SLF001
}
_ERROR_STRINGS[codes.SUCCESS] = b"Success"
_BUS_ID_RE = re.compile(r"^(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])$")
# nvmlDeviceGetViolationStatus's policies, by the counter each reads (gpu.VIOLATION_REASONS).
_POLICY_COUNTERS = dict(
    zip(
        codes.PERF_POLICIES,
        ("power", "thermal", "sync_boost", "board_limit", "low_utilization", "reliability"),
        strict=True,
    )
)


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
        mig_functions = _mig_device_functions()
        for name, device_impl in self._device_functions().items():
            self._install(name, self._device_entry(name, device_impl, mig_functions.get(name)))
        # GPM (Hopper and later, R520+ drivers): samples and metrics, see sim/gpm.py.
        self.gpm = GpmDriver(state)
        for name, impl in self.gpm.system_functions().items():
            self._install(name, self._system_entry(name, impl, needs_init=True))
        for name, device_impl in self.gpm.device_functions().items():
            self._install(name, self._device_entry(name, device_impl))

    def _install(self, name: str, entry: Entry) -> None:
        if self._state.spec.nvml_costs:
            entry = self._charged(name, entry)
        entry.__name__ = name
        entry.__qualname__ = f"SimulatedLibrary.{name}"
        self._state.counts[name] = 0
        setattr(self, name, entry)

    # --- call wrappers ----------------------------------------------------------------

    def _charged(self, name: str, entry: Entry) -> Entry:
        """``entry``, burning the CPU the call takes on a real GPU after it answers (outside
        the simulator's lock: real calls on different GPUs run side by side)."""
        state = self._state
        fixed = costs.call_ms(name)

        def charged(*args: Any) -> Any:
            started = time.thread_time()
            result = entry(*args)
            # nvmlDeviceGetFieldValues(handle, count, values): the batch costs its fields.
            ms = (
                costs.field_values_ms(e.fieldId for e in _out(args[2])[: _int(args[1])])
                if name == costs.FIELD_VALUES_CALL
                else fixed
            )
            burn_started = time.thread_time()
            costs.burn(ms)
            burnt = time.thread_time() - burn_started
            with state.cond:
                state.charged_ms += ms
                # The simulator's own work, answering and charging: a real node does not do
                # it (its library's cost is what is charged), so a benchmark takes it off.
                state.simulator_ms += (time.thread_time() - started - burnt) * 1000
            return result

        return charged

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

    def _device_entry(self, name: str, impl: Entry, mig_impl: MigEntry | None = None) -> Entry:
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
                instance: SimGpuInstance | None = None
                if gpu is None:
                    found = state.mig_for_handle(handle)
                    if found is None:
                        return codes.ERROR_INVALID_ARGUMENT
                    gpu, instance = found
                per_device[gpu.index] += 1
                # A MIG device is part of its GPU: a hung or lost GPU takes it along.
                if gpu.lost or gpu.hang_until > now:
                    code, now = state.gate(gpu, now)
                    if code != codes.SUCCESS:
                        return code
                if instance is not None:
                    # Most queries have no per-MIG-device answer: a driver refuses them.
                    if mig_impl is None:
                        return codes.ERROR_NOT_SUPPORTED
                    return mig_impl(gpu, instance, now, *args)
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
        operational: dict[str, Entry] = {}
        if spec.driver_major >= OPERATIONAL_EVENTS_DRIVER_MAJOR:
            operational = {
                "nvmlEventSetRegisterGpuOperationalEvents_v1": self._register_operational,
                "nvmlEventSetWait_v3": self._event_set_wait_v3,
                "nvmlEventSetGetContextCount_v1": self._context_count,
                "nvmlEventSetGetContextInfo_v1": self._context_info,
                "nvmlEventSetGetGpuOperationalEventContextLegacyXid_v1": self._context_xid,
            }
        return {
            **operational,
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
            if wanted == (gpu.board.domain, gpu.board.bus, gpu.board.device):
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

    # GPU operational events (R615 and later): nvmlEventSetWait_v3 returns them and the
    # classic events alike; the context calls describe the operational event it returned
    # last, whose one context is its legacy Xid.

    def _register_operational(self, _now: float, pointer: Any, config: Any) -> int:
        event_set = self._state.event_set_for(pointer)
        wanted = _out(config).uuid  # pynvml's printable structs hand strings back as str
        wanted = wanted.encode() if isinstance(wanted, str) else wanted
        gpu = next((g for g in self._state.gpus if g.uuid == wanted), None)
        if event_set is None or gpu is None:
            return codes.ERROR_INVALID_ARGUMENT
        event_set.operational.add(gpu.index)
        return codes.SUCCESS

    def _event_set_wait_v3(self, _now: float, pointer: Any, params: Any) -> int:
        event_set = self._state.event_set_for(pointer)
        if event_set is None:
            return codes.ERROR_INVALID_ARGUMENT
        target = _out(params)
        outcome = self._state.wait_event(event_set, target.timeoutMs / 1000.0)
        if isinstance(outcome, int):
            return outcome
        gpu, event_type, event_data = outcome
        target.uuid = gpu.uuid
        target.gpuInstanceId = target.computeInstanceId = hardware.NO_INSTANCE_ID
        target.timestampUsec = int(time.time() * 1_000_000)
        if event_type != OPERATIONAL_EVENT:
            target.dataType = pynvml.NVML_EVENT_DATA_TYPE_NVML_EVENT
            target.eventType, target.eventData = event_type, event_data
            return codes.SUCCESS
        event_set.context_xid = event_data
        event_set.operational_count += 1
        target.dataType = pynvml.NVML_EVENT_DATA_TYPE_GPU_OPERATIONAL_EVENT
        target.sourceModule = b"RM"
        target.severity = pynvml.NVML_OPERATIONAL_EVENT_SEVERITY_FATAL
        target.categoryId = 1
        target.moduleEventCode = event_data
        target.instanceId = event_set.operational_count
        target.attributes = pynvml.NVML_OPERATIONAL_EVENT_ATTR_PRIMARY
        return codes.SUCCESS

    def _context_count(self, _now: float, pointer: Any, params: Any) -> int:
        event_set = self._state.event_set_for(pointer)
        if event_set is None:
            return codes.ERROR_INVALID_ARGUMENT
        _out(params).count = 0 if event_set.context_xid is None else 1
        return codes.SUCCESS

    def _legacy_xid_context(self, pointer: Any, params: Any) -> tuple[Any, int] | None:
        """The request and the legacy Xid of its set's last operational event, for the one
        context (index 0) that event has; None for any other request."""
        event_set = self._state.event_set_for(pointer)
        target = _out(params)
        if event_set is None or event_set.context_xid is None or target.index != 0:
            return None
        return target, event_set.context_xid

    def _context_info(self, _now: float, pointer: Any, params: Any) -> int:
        found = self._legacy_xid_context(pointer, params)
        if found is None:
            return codes.ERROR_INVALID_ARGUMENT
        target, _xid = found
        target.nvmlGpuOperationalEventContextType = (
            pynvml.NVML_GPU_OPERATIONAL_EVENT_CONTEXT_TYPE_LEGACY_XID
        )
        return codes.SUCCESS

    def _context_xid(self, _now: float, pointer: Any, params: Any) -> int:
        found = self._legacy_xid_context(pointer, params)
        if found is None:
            return codes.ERROR_INVALID_ARGUMENT
        target, xid = found
        target.xidCode = xid
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
        vbios = self._state.hardware.vbios_version
        return {
            "nvmlDeviceGetName": lambda g, _n, buf, size: _put_string(buf, size, g.name),
            "nvmlDeviceGetUUID": lambda g, _n, buf, size: _put_string(buf, size, g.uuid),
            "nvmlDeviceGetSerial": _serial,
            "nvmlDeviceGetBrand": _reply(lambda g, _n: g.profile.brand),
            "nvmlDeviceGetVbiosVersion": lambda g, _n, buf, size: _put_text(
                buf, size, g.fixed(vbios, lambda c: c.vbios_version)
            ),
            "nvmlDeviceGetPciInfo_v3": _pci_info,
            "nvmlDeviceGetMinorNumber": _reply(lambda g, _n: g.index),
            "nvmlDeviceGetIndex": _reply(lambda g, _n: g.index),
            "nvmlDeviceGetPowerManagementDefaultLimit": _reply(default_limit_mw),
            "nvmlDeviceGetPowerManagementLimit": _reply(requested_limit_mw),
            "nvmlDeviceGetEnforcedPowerLimit": _reply(enforced_limit_mw),
            "nvmlDeviceGetPowerManagementLimitConstraints": _power_constraints,
            "nvmlDeviceGetPowerUsage": _reply(lambda g, now: g.readings.power_usage_mw(now)),
            "nvmlDeviceGetTotalEnergyConsumption": _reply(lambda g, now: g.energy_mj_at(now)),
            "nvmlDeviceGetPerformanceState": _reply(
                lambda g, now: g.readings.performance_state(now)
            ),
            "nvmlDeviceGetViolationStatus": _violation_status,
            # None where the chassis cools the GPU: no fan of its own.
            "nvmlDeviceGetFanSpeed": _reply(lambda g, now: g.readings.fan_speed_pct(now)),
            "nvmlDeviceGetMaxPcieLinkGeneration": _reply(
                lambda g, _n: g.fixed(
                    g.profile.pcie_max_generation, lambda c: c.pcie_generation_max
                )
            ),
            "nvmlDeviceGetMaxPcieLinkWidth": _reply(
                lambda g, _n: g.fixed(g.profile.pcie_max_width, lambda c: c.pcie_width_max)
            ),
            "nvmlDeviceGetCurrPcieLinkGeneration": _reply(
                lambda g, now: g.readings.pcie_generation(now)
            ),
            "nvmlDeviceGetCurrPcieLinkWidth": _reply(
                lambda g, _n: g.pcie_width if g.reports(lambda c: c.pcie_width_current) else None
            ),
            "nvmlDeviceGetPcieReplayCounter": _reply(pcie_replays),
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
                lambda g, now: g.readings.clock_event_reasons(now)
            ),
            "nvmlDeviceGetCurrentClocksThrottleReasons": _reply(
                lambda g, now: g.readings.clock_event_reasons(now)
            ),
            "nvmlDeviceGetComputeRunningProcesses_v3": _compute_processes,
            "nvmlDeviceGetGraphicsRunningProcesses_v3": _no_processes,
            "nvmlDeviceGetPersistenceMode": _reply(lambda g, _n: int(g.persistence)),
            "nvmlDeviceGetComputeMode": _reply(lambda g, _n: g.compute_mode),
            "nvmlDeviceGetDefaultEccMode": _reply(
                lambda g, _n: None if g.ecc_default is None else int(g.ecc_default)
            ),
            "nvmlDeviceGetMigMode": _pair(
                lambda g: g.profile.mig, lambda g: (int(g.mig_mode), int(g.mig_pending))
            ),
            "nvmlDeviceGetEccMode": _pair(
                lambda g: g.profile.ecc, lambda g: (int(g.ecc_enabled), int(g.ecc_pending))
            ),
            "nvmlDeviceGetGpuInstanceProfileInfoV": _gpu_instance_profile_info,
            "nvmlDeviceGetGpuInstances": _gpu_instances,
            # None without MIG on this model, or with MIG mode off.
            "nvmlDeviceGetMaxMigDeviceCount": _reply(
                lambda g, _n: g.mig_device_count() if g.mig_mode else None
            ),
            "nvmlDeviceGetMigDeviceHandleByIndex": _mig_device_handle,
            # Only MIG device handles have instance ids (see _mig_device_functions).
            "nvmlDeviceGetGpuInstanceId": _not_a_mig_device,
            "nvmlDeviceGetComputeInstanceId": _not_a_mig_device,
            "nvmlDeviceGetInforomImageVersion": lambda g, _n, buf, size: _put_text(
                buf, size, g.fixed(g.profile.inforom_version, lambda c: c.inforom_image_version)
            ),
            "nvmlDeviceGetGspFirmwareVersion": self._gsp_firmware_version,
            "nvmlDeviceGetApplicationsClock": _applications_clock,
            "nvmlDeviceGetDefaultApplicationsClock": _default_applications_clock,
            "nvmlDeviceGetGpuFabricInfo": _fabric_info,
            "nvmlDeviceGetGpuFabricInfoV": _fabric_info_v,
            "nvmlDeviceGetPlatformInfo": _platform_info,
            "nvmlDeviceGetRemappedRows": _remapped_rows,
            "nvmlDeviceGetRowRemapperHistogram": _remap_histogram,
            "nvmlDeviceGetRepairStatus": _repair_status,
            "nvmlDeviceGetUnrepairableMemoryFlag_v1": _unrepairable_memory,
            "nvmlDeviceGetRetiredPagesPendingStatus": _reply(
                lambda g, _n: int(g.retired_pending) if g.retired_pages_supported() else None
            ),
            "nvmlDeviceGetNvLinkState": _nvlink_state,
            "nvmlDeviceSetPersistenceMode": _set_persistence,
            "nvmlDeviceSetPowerManagementLimit": _set_power_limit,
            "nvmlDeviceGetSupportedEventTypes": _reply(
                lambda g, _n: supported_event_types(g.profile)
            ),
            "nvmlDeviceRegisterEvents": self._register_events,
        }

    def _gsp_firmware_version(self, _gpu: SimGpu, _now: float, buffer: Any) -> int:
        version = self._state.hardware.gsp_firmware_version
        if version is None:
            return codes.ERROR_NOT_SUPPORTED  # GSP firmware off (or a pre-Turing GPU)
        # The C function takes no length: the caller's buffer is NVML_GSP_FIRMWARE_VERSION_BUF_SIZE.
        return _put_string(buffer, len(buffer), version.encode())

    def _register_events(self, gpu: SimGpu, _now: float, event_types: Any, pointer: Any) -> int:
        event_set = self._state.event_set_for(pointer)
        if event_set is None:
            return codes.ERROR_INVALID_ARGUMENT
        wanted = _int(event_types)
        if wanted & ~supported_event_types(gpu.profile):
            return codes.ERROR_NOT_SUPPORTED
        event_set.masks[gpu.index] = event_set.masks.get(gpu.index, 0) | wanted
        return codes.SUCCESS


# --- device functions (lock held, GPU reachable) -----------------------------------------


def _reply(value: Callable[[SimGpu, float], int | None]) -> Entry:
    """A getter with a single ``byref`` output; NOT_SUPPORTED where ``value`` is None."""

    def impl(gpu: SimGpu, now: float, out: Any) -> int:
        answer = value(gpu, now)
        if answer is None:
            return codes.ERROR_NOT_SUPPORTED
        _out(out).value = answer
        return codes.SUCCESS

    return impl


def _put_text(buffer: Any, length: Any, text: str | None) -> int:
    return codes.ERROR_NOT_SUPPORTED if text is None else _put_string(buffer, length, text.encode())


def _pair(
    supported: Callable[[SimGpu], bool], values: Callable[[SimGpu], tuple[int, int]]
) -> Entry:
    """A getter with current and pending outputs (MIG mode, ECC mode)."""

    def impl(gpu: SimGpu, _now: float, current: Any, pending: Any) -> int:
        if not supported(gpu):
            return codes.ERROR_NOT_SUPPORTED  # the model has no such mode: N/A
        _out(current).value, _out(pending).value = values(gpu)
        return codes.SUCCESS

    return impl


def _serial(gpu: SimGpu, _now: float, buffer: Any, length: Any) -> int:
    if not gpu.profile.serial_number:
        return codes.ERROR_NOT_SUPPORTED
    return _put_string(buffer, length, gpu.serial)


def _pci_info(gpu: SimGpu, _now: float, out: Any) -> int:
    info = _out(out)
    info.busIdLegacy = gpu.bus_id_legacy
    info.domain = gpu.board.domain
    info.bus = gpu.board.bus
    info.device = gpu.board.device
    info.pciDeviceId = gpu.profile.pci_device_id
    info.pciSubSystemId = gpu.profile.pci_subsystem_id
    info.busId = gpu.bus_id
    return codes.SUCCESS


def _limit_range(gpu: SimGpu, now: float) -> tuple[int, int] | None:
    """The power limit's minimum and maximum (mW); None where the GPU reports none."""
    low, high = min_limit_mw(gpu, now), max_limit_mw(gpu, now)
    return None if low is None or high is None else (low, high)


def _power_constraints(gpu: SimGpu, now: float, minimum: Any, maximum: Any) -> int:
    limits = _limit_range(gpu, now)
    if limits is None:
        return codes.ERROR_NOT_SUPPORTED
    _out(minimum).value, _out(maximum).value = limits
    return codes.SUCCESS


def _violation_status(gpu: SimGpu, now: float, policy: Any, out: Any) -> int:
    which = _int(policy)
    if not 0 <= which < codes.PERF_POLICY_COUNT:
        return codes.ERROR_INVALID_ARGUMENT
    counter = _POLICY_COUNTERS.get(which)
    if counter is None or not gpu.profile.violation_counters:
        return codes.ERROR_NOT_SUPPORTED
    status = _out(out)
    status.referenceTime = int(time.time() * 1_000_000)  # wall-clock µs, as NVML stamps it
    status.violationTime = gpu.violation_ns_at(now, counter)
    return codes.SUCCESS


def _captured_threshold(captured: CapturedGpu, which: int) -> float | None:
    """A threshold as the capture prints it (the profile holds it in degrees); None where
    N/A, and on the T.Limit scale without the point it counts from (the margin)."""
    limits = captured.thresholds
    if limits.tlimit and (limits.margin is None or captured.temperature_c is None):
        return None
    return {
        codes.THRESHOLD_SHUTDOWN: limits.shutdown,
        codes.THRESHOLD_SLOWDOWN: limits.slowdown,
        codes.THRESHOLD_MEM_MAX: limits.memory_max,
        codes.THRESHOLD_GPU_MAX: limits.gpu_max,
    }.get(which)


def _temperature_threshold(gpu: SimGpu, _now: float, threshold: Any, out: Any) -> int:
    which = _int(threshold)
    if not 0 <= which < codes.THRESHOLD_COUNT:
        return codes.ERROR_INVALID_ARGUMENT
    profile = gpu.profile
    value = {
        codes.THRESHOLD_SHUTDOWN: profile.temperature_shutdown_c,
        codes.THRESHOLD_SLOWDOWN: profile.temperature_slowdown_c,
        codes.THRESHOLD_MEM_MAX: profile.temperature_memory_max_c,
        codes.THRESHOLD_GPU_MAX: profile.temperature_gpu_max_c,
    }.get(which)
    if value is None or not gpu.reports(lambda c: _captured_threshold(c, which)):
        return codes.ERROR_NOT_SUPPORTED  # acoustic limits, no memory sensor, or N/A
    _out(out).value = value
    return codes.SUCCESS


def _temperature(gpu: SimGpu, now: float, sensor: Any, out: Any) -> int:
    if _int(sensor) != codes.TEMPERATURE_GPU:
        return codes.ERROR_INVALID_ARGUMENT
    temperature = gpu.readings.temperature(now)
    if temperature is None:
        return codes.ERROR_NOT_SUPPORTED
    _out(out).value = round(temperature)
    return codes.SUCCESS


def _margin_temperature(gpu: SimGpu, now: float, out: Any) -> int:
    # Degrees left before the T.Limit point (the max operating temperature).
    if not gpu.tlimit_fields:
        return codes.ERROR_NOT_SUPPORTED  # nvidia-smi's "GPU T.Limit Temp: N/A"
    margin = _out(out)
    if margin.version != codes.MARGIN_TEMPERATURE_V1:
        return codes.ERROR_ARGUMENT_VERSION_MISMATCH
    temperature = gpu.readings.temperature(now)
    if temperature is None:
        return codes.ERROR_NOT_SUPPORTED
    margin.marginTemperature = gpu.profile.temperature_gpu_max_c - round(temperature)
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
    busy = gpu.readings.utilization(now)
    memory = gpu.readings.memory_utilization(now)
    if busy is None or memory is None:
        return codes.ERROR_NOT_SUPPORTED
    rates = _out(out)
    rates.gpu, rates.memory = round(busy), round(memory)
    return codes.SUCCESS


def _codec_utilization(gpu: SimGpu, _now: float, utilization: Any, period_us: Any) -> int:
    if gpu.mig_mode or not gpu.profile.codec_utilization:
        return codes.ERROR_NOT_SUPPORTED
    _out(utilization).value = 0
    _out(period_us).value = hardware.ENCODER_SAMPLING_PERIOD_US
    return codes.SUCCESS


def _memory_v1(gpu: SimGpu, now: float, out: Any) -> int:
    fb = gpu.readings.fb_memory(now)
    if fb is None:
        return codes.ERROR_NOT_SUPPORTED
    # The v1 struct counts the driver's reserved memory as used.
    memory = _out(out)
    memory.total, memory.used, memory.free = fb.total, fb.used + (fb.reserved or 0), fb.free
    return codes.SUCCESS


def _memory_v2(gpu: SimGpu, now: float, out: Any) -> int:
    memory = _out(out)
    if memory.version != codes.MEMORY_V2:
        return codes.ERROR_ARGUMENT_VERSION_MISMATCH
    fb = gpu.readings.fb_memory(now)
    if fb is None or fb.reserved is None:
        return codes.ERROR_NOT_SUPPORTED  # a capture from before R510, which had no v2
    memory.total, memory.reserved = fb.total, fb.reserved
    memory.used, memory.free = fb.used, fb.free
    return codes.SUCCESS


def _clock(gpu: SimGpu, now: float, clock_type: Any, out: Any) -> int:
    readings = gpu.readings
    clocks = {
        codes.CLOCK_GRAPHICS: readings.graphics_clock_mhz,
        codes.CLOCK_SM: readings.sm_clock_mhz,
        codes.CLOCK_MEM: readings.memory_clock_mhz,
        codes.CLOCK_VIDEO: readings.video_clock_mhz,
    }
    clock = clocks.get(_int(clock_type))
    if clock is None:
        return codes.ERROR_INVALID_ARGUMENT
    value = clock(now)
    if value is None:
        return codes.ERROR_NOT_SUPPORTED
    _out(out).value = value
    return codes.SUCCESS


def _max_clock(gpu: SimGpu, _now: float, clock_type: Any, out: Any) -> int:
    profile = gpu.profile
    maxima: dict[int, tuple[int, Callable[[CapturedGpu], int | None]]] = {
        codes.CLOCK_GRAPHICS: (profile.sm_clock_max_mhz, lambda c: c.max_clock_graphics_mhz),
        codes.CLOCK_SM: (profile.sm_clock_max_mhz, lambda c: c.max_clock_sm_mhz),
        codes.CLOCK_MEM: (profile.memory_clock_max_mhz, lambda c: c.max_clock_memory_mhz),
        codes.CLOCK_VIDEO: (profile.video_clock_max_mhz, lambda c: c.max_clock_video_mhz),
    }
    found = maxima.get(_int(clock_type))
    if found is None:
        return codes.ERROR_INVALID_ARGUMENT
    live, printed = found
    value = gpu.fixed(live, printed)
    if value is None:
        return codes.ERROR_NOT_SUPPORTED
    _out(out).value = value
    return codes.SUCCESS


def _clock_setting(gpu: SimGpu, graphics_mhz: int | None, clock_type: Any, out: Any) -> int:
    """An applications clock: ``graphics_mhz`` for graphics and SM, the memory's maximum."""
    if graphics_mhz is None:
        return codes.ERROR_NOT_SUPPORTED  # GeForce: no applications clocks
    which = _int(clock_type)
    if which in (codes.CLOCK_GRAPHICS, codes.CLOCK_SM):
        _out(out).value = graphics_mhz
    elif which == codes.CLOCK_MEM:
        _out(out).value = gpu.profile.memory_clock_max_mhz
    else:
        return codes.ERROR_INVALID_ARGUMENT
    return codes.SUCCESS


def _applications_clock(gpu: SimGpu, _now: float, clock_type: Any, out: Any) -> int:
    return _clock_setting(gpu, gpu.applications_clock_mhz, clock_type, out)


def _default_applications_clock(gpu: SimGpu, _now: float, clock_type: Any, out: Any) -> int:
    return _clock_setting(gpu, gpu.profile.applications_clock_mhz, clock_type, out)


def _fabric_info(gpu: SimGpu, _now: float, out: Any) -> int:
    if gpu.fabric_state == codes.FABRIC_STATE_NOT_SUPPORTED:
        return codes.ERROR_NOT_SUPPORTED  # no NVSwitch fabric on this system
    info = _out(out)
    info.state = gpu.fabric_state
    info.status = gpu.fabric_status
    info.clusterUuid[:] = gpu.fabric_cluster_uuid
    info.cliqueId = gpu.fabric_clique_id
    return codes.SUCCESS


_FABRIC_INFO_VERSIONS = (pynvml.nvmlGpuFabricInfo_v2, pynvml.nvmlGpuFabricInfo_v3)
_FABRIC_HEALTH_DRIVER_MAJOR = 550  # fabric info with a health mask (v2, v3): R550 and later


def _fabric_info_v(gpu: SimGpu, now: float, out: Any) -> int:
    """Fabric info v2/v3: v1's state and status, and the health mask (and its summary)."""
    if gpu.driver_major < _FABRIC_HEALTH_DRIVER_MAJOR:
        return codes.ERROR_FUNCTION_NOT_FOUND
    info = _out(out)
    if info.version not in _FABRIC_INFO_VERSIONS:
        return codes.ERROR_ARGUMENT_VERSION_MISMATCH
    answered = _fabric_info(gpu, now, out)
    if answered != codes.SUCCESS:
        return answered
    info.healthMask = fabric_health_mask(gpu.fabric_health)
    if info.version == pynvml.nvmlGpuFabricInfo_v3:
        info.healthSummary = _fabric_health_summary(gpu.fabric_health)
    return codes.SUCCESS


def _fabric_health_summary(conditions: dict[str, bool]) -> int:
    if not conditions:
        return int(pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_NOT_SUPPORTED)
    if any(conditions.values()):
        return int(pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY)
    return int(pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY)


def _platform_info(gpu: SimGpu, _now: float, out: Any) -> int:
    """Platform info v2 only: v1 has a rack GUID where v2 has the chassis serial."""
    info = _out(out)
    if info.version != pynvml.nvmlPlatformInfo_v2:
        return codes.ERROR_ARGUMENT_VERSION_MISMATCH
    placement = gpu.platform
    if placement is None:
        return codes.ERROR_NOT_SUPPORTED  # not a rack-scale platform (nvidia-smi: all N/A)
    # Every byte written (the caller's struct may hold anything). nvidia-smi's "GPU Fabric
    # GUID" comes from another call: the IB GUID is left zero.
    info.ibGuid = bytes(hardware.IB_GUID_LEN)
    info.chassisSerialNumber = placement.chassis_serial.ljust(hardware.CHASSIS_SERIAL_LEN, b"\0")
    info.slotNumber = placement.slot_number
    info.trayIndex = placement.tray_index
    info.hostId = placement.host_id
    info.peerType = placement.peer_type
    info.moduleId = placement.module_id
    return codes.SUCCESS


def _gpu_instance_profile_info(gpu: SimGpu, _now: float, profile: Any, out: Any) -> int:
    which = _int(profile)
    if not 0 <= which < codes.GPU_INSTANCE_PROFILE_COUNT:
        return codes.ERROR_INVALID_ARGUMENT
    info = _out(out)
    if info.version != codes.GPU_INSTANCE_PROFILE_INFO_V2:
        return codes.ERROR_ARGUMENT_VERSION_MISMATCH
    spec = gpu.profile.mig_by_index(which)
    if not gpu.mig_mode or spec is None:
        return codes.ERROR_NOT_SUPPORTED  # MIG off, or a profile this GPU does not offer
    info.id = spec.profile_id
    info.isP2pSupported = 0
    info.sliceCount = spec.slices
    info.instanceCount = spec.max_instances
    info.multiprocessorCount = spec.slices * gpu.profile.mig_sms_per_slice
    info.copyEngineCount = spec.slices
    info.memorySizeMB = spec.memory_mib
    info.name = f"MIG {spec.name}".encode()
    return codes.SUCCESS


def _gpu_instances(gpu: SimGpu, _now: float, profile_id: Any, instances: Any, count: Any) -> int:
    spec = gpu.profile.mig_by_id(_int(profile_id))
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


def _mig_device_handle(gpu: SimGpu, _now: float, index: Any, out: Any) -> int:
    if not gpu.mig_mode:
        return codes.ERROR_NOT_SUPPORTED
    which = _int(index)
    if not 0 <= which < gpu.mig_device_count():
        return codes.ERROR_INVALID_ARGUMENT
    if which >= len(gpu.mig_instances):
        return codes.ERROR_NOT_FOUND  # an empty slot: no compute instance there
    _out(out).contents = gpu.mig_instances[which].device
    return codes.SUCCESS


def _not_a_mig_device(_gpu: SimGpu, _now: float, _out_id: Any) -> int:
    return codes.ERROR_NOT_SUPPORTED


def _mig_device_functions() -> dict[str, MigEntry]:
    """What a MIG device handle answers; every other device function refuses it."""
    return {
        "nvmlDeviceGetUUID": lambda g, i, _n, buf, size: _put_string(
            buf, size, g.mig_device_uuid(i)
        ),
        "nvmlDeviceGetGpuInstanceId": _mig_gpu_instance_id,
        "nvmlDeviceGetComputeInstanceId": _mig_compute_instance_id,
    }


def _mig_gpu_instance_id(gpu: SimGpu, instance: SimGpuInstance, _now: float, out: Any) -> int:
    _out(out).value = gpu.gpu_instance_id(instance)
    return codes.SUCCESS


def _mig_compute_instance_id(_gpu: SimGpu, _instance: SimGpuInstance, _now: float, out: Any) -> int:
    _out(out).value = hardware.COMPUTE_INSTANCE_ID
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


def _remap_histogram(gpu: SimGpu, _now: float, out: Any) -> int:
    if not gpu.remapped_rows_supported():
        return codes.ERROR_NOT_SUPPORTED
    values = _out(out)
    values.max, values.high, values.partial, values.low, values.none = gpu.remap_histogram
    return codes.SUCCESS


def _repair_status(gpu: SimGpu, _now: float, out: Any) -> int:
    if gpu.repair_pending is None:
        return codes.ERROR_NOT_SUPPORTED
    status = _out(out)
    status.bChannelRepairPending, status.bTpcRepairPending = (int(p) for p in gpu.repair_pending)
    return codes.SUCCESS


def _unrepairable_memory(gpu: SimGpu, _now: float, out: Any) -> int:
    if gpu.unrepairable_memory is None:
        return codes.ERROR_NOT_SUPPORTED
    _out(out).unrepairableMemory = int(gpu.unrepairable_memory)
    return codes.SUCCESS


def _remapped_rows(
    gpu: SimGpu, _now: float, correctable: Any, uncorrectable: Any, pending: Any, failure: Any
) -> int:
    if not gpu.remapped_rows_supported():
        return codes.ERROR_NOT_SUPPORTED
    _out(correctable).value = gpu.remapped_correctable
    _out(uncorrectable).value = gpu.remapped_uncorrectable
    _out(pending).value = int(gpu.remap_pending)
    _out(failure).value = int(gpu.remap_failure)
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
    limits = _limit_range(gpu, now)
    if limits is None:
        return codes.ERROR_NOT_SUPPORTED  # no power management (a capture's N/A limits)
    wanted = _int(limit)
    if not limits[0] <= wanted <= limits[1]:
        return codes.ERROR_INVALID_ARGUMENT
    gpu.settle(now)
    gpu.set_power_limit(wanted)
    return codes.SUCCESS
