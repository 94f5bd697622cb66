"""A captured host, served beneath NVML: the simulated GPUs answer what `nvidia-smi -q` said.

A replay shows what the capture prints and nothing else. Each captured GPU becomes a
simulated GPU that keeps its capture (`SimGpu.captured`): the board's fixed values (power
limits, maximum clocks, the PCIe link's maximum, VBIOS) are answered as printed, and what
the capture shows as N/A NVML answers NOT_SUPPORTED, never a model's number. Counters,
modes, the power limits, the PCIe link, MIG instances, the fabric state and NVLink domain
(clique and cluster UUID), the platform block (chassis, slot, tray, host) and the
processes start as captured; temperatures, power, utilization, clocks, P-state, clock event
reasons and framebuffer use stay exactly as captured (`CapturedReadings`) until a fault
changes what they depend on (`LIVE_AFTER`), when the live model of the GPU's profile
takes over. The profile is the catalog's model of the same name (or the default one, for
a model the catalog lacks) with the captured values put in its place; where the capture
has none it keeps the model's, for that live model only. What the capture cannot say is
not invented either: it shows no NVLinks and no throttle-duration counters (`nvidia-smi
-q` prints neither), no default ECC mode, and the host's services, PCI tree and kernel
modules are unknown (`unknown_host_facts`).
"""

from __future__ import annotations

import dataclasses
import re
import time
from typing import TYPE_CHECKING

import pynvml

from gpuagent.inventory.model import FABRIC_MANAGER, KNOWN_MODULES, PERSISTENCED, HostFacts, Service
from gpuagent.model import ZERO_UUID
from gpuagent.sim import catalog, codes, hardware
from gpuagent.sim.gpu import Placement, SimGpu, SimGpuInstance, SimProcess, make_instances
from gpuagent.sim.readings import FbMemory, LiveReadings, Readings

if TYPE_CHECKING:
    from gpuagent.sim.profiles import GpuProfile
    from gpuagent.sim.scenario import NodeSpec
    from gpuagent.smi import CapturedGpu, ClockEventReasons

_BUS_ID_RE = re.compile(r"^([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.[0-7]$")
# Faults that change what the captured readings depend on (load, memory, heat, clocks,
# limits): after one, the GPU's readings follow the profile's live model.
LIVE_AFTER = frozenset(
    {
        "process",
        "process_exit",
        "hung",
        "memory_leak",
        "throttle",
        "app_clocks",
        "power_limit",
        "clear",
        "temperature",
    }
)
_REASON_BITS = (
    ("idle", codes.REASON_GPU_IDLE),
    ("applications_clocks", codes.REASON_APPLICATIONS_CLOCKS),
    ("sw_power_cap", codes.REASON_SW_POWER_CAP),
    ("hw_slowdown", codes.REASON_HW_SLOWDOWN),
    ("sync_boost", codes.REASON_SYNC_BOOST),
    ("sw_thermal_slowdown", codes.REASON_SW_THERMAL),
    ("hw_thermal_slowdown", codes.REASON_HW_THERMAL),
    ("hw_power_brake_slowdown", codes.REASON_POWER_BRAKE),
    ("display_clocks", pynvml.nvmlClocksEventReasonDisplayClockSetting),
)


def _mib(value: float | None, fallback: int) -> int:
    return fallback if value is None else round(value)


def _with_thresholds(profile: GpuProfile, gpu: CapturedGpu) -> GpuProfile:
    """The thresholds in degrees Celsius, as the profile holds them. An absolute capture
    gives them as they are; a T.Limit one as degrees beyond the max operating point, which
    is the current temperature plus the margin ("GPU T.Limit Temp")."""
    limits = gpu.thresholds
    point = profile.temperature_gpu_max_c
    if limits.tlimit and limits.margin is not None and gpu.temperature_c is not None:
        point = round(gpu.temperature_c + limits.margin)

    def celsius(value: float | None, fallback: int) -> int:
        if value is None:
            return fallback
        return round(point - value) if limits.tlimit else round(value)

    memory_max = profile.temperature_memory_max_c
    if not limits.tlimit:  # on the T.Limit scale the memory's point is its own: unknown
        memory_max = None if limits.memory_max is None else round(limits.memory_max)
    return dataclasses.replace(
        profile,
        temperature_shutdown_c=celsius(limits.shutdown, profile.temperature_shutdown_c),
        temperature_slowdown_c=celsius(limits.slowdown, profile.temperature_slowdown_c),
        temperature_gpu_max_c=celsius(limits.gpu_max, profile.temperature_gpu_max_c),
        temperature_memory_max_c=memory_max,
        tlimit_fields=limits.tlimit,
    )


def _module_extra(gpu: CapturedGpu) -> float | None:
    """What the module drew beside its GPU when captured (None: no module readings)."""
    if gpu.module_power_w is None or gpu.power_draw_w is None:
        return None
    return max(0.0, gpu.module_power_w - gpu.power_draw_w)


def profile_for(gpu: CapturedGpu) -> GpuProfile:
    """The catalog's model of this GPU with what the capture shows put in its place: the
    live model a fault hands the GPU to. Where the capture has no value the model's stays,
    for that model to run on; NVML never answers it for the replayed GPU (`SimGpu.fixed`
    and `SimGpu.reports` answer from the capture)."""
    found = catalog.find_profile(gpu.product_name)
    base = found[0] if found else catalog.DEFAULT
    power_limit = gpu.power_limit_w
    memory_offset = None
    if gpu.memory_temperature_c is not None and gpu.temperature_c is not None:
        memory_offset = gpu.memory_temperature_c - gpu.temperature_c
    captured = dataclasses.replace(
        base,
        key=base.key if found else f"captured:{gpu.product_name}",
        name=gpu.product_name,
        architecture=gpu.architecture or base.architecture,
        pci_device_id=gpu.pci_device_id if gpu.pci_device_id is not None else base.pci_device_id,
        pci_subsystem_id=gpu.pci_subsystem_id
        if gpu.pci_subsystem_id is not None
        else base.pci_subsystem_id,
        vbios_version=gpu.vbios_version or base.vbios_version,
        inforom_version=gpu.inforom_image_version or base.inforom_version,
        memory_total_mib=_mib(gpu.fb_total_mib, base.memory_total_mib),
        memory_reserved_mib=_mib(gpu.fb_reserved_mib, base.memory_reserved_mib),
        power_default_limit_w=gpu.power_default_limit_w
        or power_limit
        or base.power_default_limit_w,
        power_min_limit_w=gpu.power_min_limit_w or base.power_min_limit_w,
        power_max_limit_w=gpu.power_max_limit_w or power_limit or base.power_max_limit_w,
        memory_temperature_offset_c=memory_offset,
        sm_clock_max_mhz=gpu.max_clock_sm_mhz or base.sm_clock_max_mhz,
        memory_clock_max_mhz=gpu.max_clock_memory_mhz or base.memory_clock_max_mhz,
        video_clock_max_mhz=gpu.max_clock_video_mhz or base.video_clock_max_mhz,
        applications_clock_mhz=gpu.default_applications_clock_graphics_mhz,
        pcie_max_generation=gpu.pcie_generation_max or base.pcie_max_generation,
        pcie_max_width=gpu.pcie_width_max or base.pcie_max_width,
        module_power_extra_w=_module_extra(gpu),
        module_power_limit_w=gpu.module_power_limit_w,
        nvlinks=0,
        ecc=gpu.ecc_current is not None,
        ecc_default=bool(gpu.ecc_current),
        retired_pages=gpu.retired_pages_sbe is not None,
        row_remapping=gpu.remapped_rows_correctable is not None,
        remap_banks=sum(gpu.remap_histogram) if gpu.remap_histogram else base.remap_banks,
        # The capture already says whether rows are N/A under its MIG mode.
        row_remapping_under_mig=True,
        gsp_firmware=gpu.gsp_firmware_version is not None,
        fabric=gpu.fabric_state is not None,
        fabric_cluster_uuid=gpu.fabric_cluster_uuid or ZERO_UUID,
        fabric_clique_id=gpu.fabric_clique_id or 0,
        platform_info=gpu.chassis_serial is not None,
        violation_counters=False,
        codec_utilization=gpu.utilization_encoder_pct is not None,
        serial_number=gpu.serial is not None,
        brand=codes.BRANDS.get((gpu.product_brand or "").strip().casefold(), base.brand),
        fan_idle_pct=None if gpu.fan_speed_pct is None else round(gpu.fan_speed_pct),
    )
    return _with_thresholds(captured, gpu)


def reason_mask(reasons: ClockEventReasons | None) -> int | None:
    """The NVML bitmask of the captured clock event reasons; None when not captured."""
    if reasons is None:
        return None
    return sum(bit for name, bit in _REASON_BITS if getattr(reasons, name))


def _bytes(mib: float | None) -> int | None:
    return None if mib is None else round(mib * hardware.MIB)


def _fb_memory(gpu: CapturedGpu) -> FbMemory | None:
    """The "FB Memory Usage" block as printed; None unless total, used and free are.
    Drivers before R510 print no Reserved, and count it in Used."""
    total, used, free = _bytes(gpu.fb_total_mib), _bytes(gpu.fb_used_mib), _bytes(gpu.fb_free_mib)
    if total is None or used is None or free is None:
        return None
    return FbMemory(total=total, used=used, free=free, reserved=_bytes(gpu.fb_reserved_mib))


class CapturedReadings:
    """The readings as captured, each None where the capture shows N/A. The live model
    answers only whether the GPU is busy, until a fault hands the GPU to it (LIVE_AFTER)."""

    def __init__(self, gpu: SimGpu, captured: CapturedGpu) -> None:
        self._gpu = gpu
        self._live = LiveReadings(gpu)
        self._captured = captured
        self._reasons = reason_mask(captured.clock_event_reasons)
        self._fb = _fb_memory(captured)

    def after_fault(self, kind: str) -> Readings:
        return self._live if kind in LIVE_AFTER else self

    def busy(self) -> bool:
        return self._live.busy()

    def utilization(self, _now: float) -> float | None:
        return self._captured.utilization_gpu_pct

    def memory_utilization(self, _now: float) -> float | None:
        return self._captured.utilization_memory_pct

    def power_mw(self, _now: float) -> int | None:
        return hardware.milliwatts(self._captured.power_instant_w)

    def average_power_mw(self, _now: float) -> int | None:
        return hardware.milliwatts(self._captured.power_draw_w)

    def power_usage_mw(self, now: float) -> int | None:
        # GA100 and older GPUs have no average (N/A) and report their instantaneous draw.
        average = self.average_power_mw(now)
        return self.power_mw(now) if average is None else average

    def temperature(self, _now: float) -> float | None:
        return self._captured.temperature_c

    def memory_temperature(self, _now: float) -> float | None:
        return self._captured.memory_temperature_c

    def fan_speed_pct(self, _now: float) -> int | None:
        value = self._captured.fan_speed_pct
        return None if value is None else round(value)

    def clock_event_reasons(self, _now: float) -> int | None:
        return self._reasons

    def graphics_clock_mhz(self, _now: float) -> int | None:
        return self._captured.clock_graphics_mhz

    def sm_clock_mhz(self, _now: float) -> int | None:
        return self._captured.clock_sm_mhz

    def memory_clock_mhz(self, _now: float) -> int | None:
        return self._captured.clock_memory_mhz

    def video_clock_mhz(self, _now: float) -> int | None:
        return self._captured.clock_video_mhz

    def performance_state(self, _now: float) -> int | None:
        return self._captured.performance_state

    def pcie_generation(self, _now: float) -> int | None:
        value = self._captured.pcie_generation_current
        # A `pcie_degrade` fault caps the link below what was captured.
        return None if value is None else min(value, self._gpu.pcie_generation_limit)

    def fb_memory(self, _now: float) -> FbMemory | None:
        return self._fb


def _slot(bus_id: str, index: int) -> tuple[int, int, int]:
    """(domain, bus, device) of a captured bus id."""
    match = _BUS_ID_RE.match(bus_id)
    if match is None:  # the parser checked it; a made-up slot beats a crash
        return 0, index + 1, 0
    return int(match[1], 16), int(match[2], 16), int(match[3], 16)


def replayed_gpu(
    captured: CapturedGpu, index: int, spec: NodeSpec, profile: GpuProfile | None = None
) -> SimGpu:
    """A simulated GPU that starts exactly as ``captured``."""
    profile = profile or profile_for(captured)
    domain, bus, device = _slot(captured.bus_id, index)
    seeded = hardware.make_identity(spec.seed, index, bus, device)
    board = dataclasses.replace(
        seeded,
        domain=domain,
        uuid=captured.uuid or seeded.uuid,
        serial=captured.serial or "",
        temperature_offset=0.0,
    )
    gpu = SimGpu(
        board,
        profile=profile,
        name=captured.product_name,
        driver_major=spec.driver_major,
        nvlinks=0,
        ecc=bool(captured.ecc_current),
        persistence=bool(captured.persistence_mode),
        mig_mode=bool(captured.mig_current),
    )
    gpu.captured = captured
    _start_state(gpu, captured)
    gpu.readings = CapturedReadings(gpu, captured)
    return gpu


def _start_state(gpu: SimGpu, captured: CapturedGpu) -> None:
    gpu.ecc_pending = bool(
        captured.ecc_pending if captured.ecc_pending is not None else gpu.ecc_enabled
    )
    gpu.mig_pending = bool(
        captured.mig_pending if captured.mig_pending is not None else gpu.mig_mode
    )
    gpu.ecc_sbe_volatile = captured.ecc_corrected_volatile or 0
    gpu.ecc_dbe_volatile = captured.ecc_uncorrected_volatile or 0
    gpu.ecc_sbe_aggregate = captured.ecc_corrected_aggregate or 0
    gpu.ecc_dbe_aggregate = captured.ecc_uncorrected_aggregate or 0
    gpu.retired_sbe = captured.retired_pages_sbe or 0
    gpu.retired_dbe = captured.retired_pages_dbe or 0
    gpu.retired_pending = bool(captured.retired_pages_pending)
    gpu.remapped_correctable = captured.remapped_rows_correctable or 0
    gpu.remapped_uncorrectable = captured.remapped_rows_uncorrectable or 0
    gpu.remap_pending = bool(captured.remapped_rows_pending)
    gpu.remap_failure = bool(captured.remapped_rows_failure)
    if captured.remap_histogram is not None:
        gpu.remap_histogram = list(captured.remap_histogram)
    gpu.pcie_replays = captured.pcie_replays or 0
    if captured.pcie_width_current is not None:
        gpu.pcie_width = captured.pcie_width_current
    _start_power_limits(gpu, captured)
    gpu.compute_mode = _compute_mode(captured.compute_mode)
    gpu.ecc_default = None  # no nvidia-smi layout prints it: ECC Mode is Current and Pending
    gpu.applications_clock_mhz = captured.applications_clock_graphics_mhz
    gpu.fabric_state, gpu.fabric_status = _fabric(captured)
    gpu.fabric_health = dict(captured.fabric_health)
    # A fabric whose clique or cluster is N/A answers zeros: NVML's "not assigned" (a fabric
    # that is N/A as a whole answers NOT_SUPPORTED before these are read).
    gpu.fabric_clique_id = captured.fabric_clique_id or 0
    gpu.fabric_cluster_uuid = hardware.fabric_uuid_bytes(captured.fabric_cluster_uuid or ZERO_UUID)
    gpu.platform = _placement(captured, gpu.index)
    gpu.recovery_action = _recovery_action(captured.recovery_action)
    if captured.channel_repair_pending is None and captured.tpc_repair_pending is None:
        gpu.repair_pending = None
    else:
        gpu.repair_pending = (
            bool(captured.channel_repair_pending),
            bool(captured.tpc_repair_pending),
        )
    gpu.unrepairable_memory = captured.unrepairable_memory
    gpu.mig_instances = _mig_instances(gpu, captured)
    gpu.default_mig_profiles = tuple(i.profile.name for i in gpu.mig_instances)
    gpu.processes = {
        p.pid: SimProcess(p.pid, p.name, round((p.used_mib or 0) * hardware.MIB))
        for p in captured.processes
    }


def _start_power_limits(gpu: SimGpu, captured: CapturedGpu) -> None:
    """The requested and enforced limits as printed. Where the enforced one sits below the
    request (a GH200 module sharing its power), that is the platform's ceiling: a limit
    set later is enforced up to it."""
    current, requested = (
        hardware.milliwatts(captured.power_limit_w),
        hardware.milliwatts(captured.power_requested_limit_w),
    )
    if current is not None and requested is not None and current < requested:
        gpu.power_ceiling_mw = current
    first = requested if requested is not None else current
    if first is not None:
        gpu.set_power_limit(first)
    if current is not None:
        gpu.power_limit_mw = current


def _compute_mode(printed: str | None) -> int | None:
    """nvmlComputeMode_t of "Compute Mode" ("Exclusive_Process"); None where N/A, or a
    mode this simulator does not know."""
    if printed is None:
        return None
    return codes.COMPUTE_MODES.get(printed.strip().lower().replace(" ", "_"))


# Spellings nvidia-smi may use beside the enum's own names.
_RECOVERY_ALIASES = {
    "gpu_reset": "reset",
    "node_reboot": "reboot",
    "drain_p2p_and_reset": "drain_and_reset",
}


def _recovery_action(printed: str | None) -> int | None:
    """The captured recovery action; None (the driver does not report one) when the line
    is absent or reads as no action this simulator knows, rather than a guessed fault."""
    if printed is None:
        return None
    name = printed.strip().lower().replace(" ", "_")
    return codes.RECOVERY_ACTION_CODES.get(_RECOVERY_ALIASES.get(name, name))


def _fabric(captured: CapturedGpu) -> tuple[int, int]:
    # nvidia-smi prints "Not Started", "In Progress", "Completed": codes' keys, spelt out.
    wanted = (captured.fabric_state or "").strip().lower().replace(" ", "_")
    state = codes.FABRIC_STATES.get(wanted)
    if state is None:
        return codes.FABRIC_STATE_NOT_SUPPORTED, codes.SUCCESS
    ok = (captured.fabric_status or "success").strip().lower() == "success"
    return state, codes.SUCCESS if ok else codes.ERROR_UNKNOWN


_PEER_TYPES = {
    "direct connected": hardware.PEER_TYPE_DIRECT_CONNECTED,
    "switch connected": hardware.PEER_TYPE_SWITCH_CONNECTED,
}


def _placement(captured: CapturedGpu, index: int) -> Placement | None:
    """The "Platform Info" block as nvmlDeviceGetPlatformInfo answers it; None (NOT_SUPPORTED)
    where the chassis serial is N/A: nvidia-smi then prints every field N/A but the
    module id, which it reads through another call. A number N/A beside a printed serial
    is 0, what nvidia-smi prints as N/A (an HGX B200 has no slot or tray)."""
    if captured.chassis_serial is None:
        return None
    module_id = captured.platform_module_id
    if module_id is None:
        module_id = captured.module_id
    return Placement(
        chassis_serial=captured.chassis_serial.encode(errors="replace"),
        slot_number=captured.slot_number or 0,
        tray_index=captured.tray_index or 0,
        host_id=captured.host_id or 0,
        peer_type=_PEER_TYPES.get(
            (captured.peer_type or "").strip().lower(), hardware.PEER_TYPE_DIRECT_CONNECTED
        ),
        module_id=index + 1 if module_id is None else module_id,
    )


def _mig_instances(gpu: SimGpu, captured: CapturedGpu) -> list[SimGpuInstance]:
    """The captured MIG devices' GPU instances, by the profile whose memory and slice count
    match (an instance the model's table does not have is left out)."""
    profile = gpu.profile
    names: list[str] = []
    for device in captured.mig_devices:
        per_slice = profile.mig_sms_per_slice or 1
        slices = round((device.multiprocessor_count or per_slice) / per_slice)
        match = next(
            (
                p
                for p in profile.mig_profiles
                if p.slices == slices
                and (
                    device.memory_total_mib is None
                    or abs(p.memory_mib - device.memory_total_mib) < 512
                )
            ),
            None,
        )
        if match is not None:
            names.append(match.name)
    return make_instances(profile, tuple(names)) if gpu.mig_mode else []


def unknown_host_facts() -> HostFacts:
    """A captured host's side the capture does not show: every fact unknown."""
    return HostFacts(
        pci=None,
        modules=tuple((name, None) for name in KNOWN_MODULES),
        services=(Service(PERSISTENCED, "unknown"), Service(FABRIC_MANAGER, "unknown")),
        collected_at=time.time(),
    )
