"""What an `nvidia-smi -q` capture says about a node: the values, and what was N/A.

Both `nvidia-smi -q` (text) and `nvidia-smi -q -x` (XML) parse into these records. Every
optional value is None when the capture shows it as N/A (or leaves it out, as older
drivers do): the replay answers NVML's NOT_SUPPORTED for it, never a made-up value.
"""

from __future__ import annotations

from dataclasses import dataclass, field


class CaptureError(ValueError):
    """The file is not a readable `nvidia-smi -q` capture; ``line`` is 1-based."""

    def __init__(self, message: str, line: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.line = line

    def __str__(self) -> str:
        return self.message if self.line is None else f"line {self.line}: {self.message}"


@dataclass(frozen=True, slots=True)
class TemperatureThresholds:
    """Thresholds as the driver printed them.

    Older drivers print absolute degrees ("GPU Shutdown Temp : 101 C"); 535+ on Hopper and
    later print the T.Limit scale ("GPU Shutdown T.Limit Temp : -8 C": degrees *beyond* the
    max operating point, so above it is negative) together with the current margin ("GPU
    T.Limit Temp : 56 C": degrees left before that point). ``tlimit`` says which.
    """

    tlimit: bool = False
    shutdown: float | None = None
    slowdown: float | None = None
    gpu_max: float | None = None
    memory_max: float | None = None
    margin: float | None = None  # "GPU T.Limit Temp": only on the T.Limit scale
    target: float | None = None


@dataclass(frozen=True, slots=True)
class ClockEventReasons:
    """The "Clocks Event Reasons" (formerly "Clocks Throttle Reasons") block.

    None: the driver printed N/A for that reason, or the block is absent.
    """

    idle: bool | None = None
    applications_clocks: bool | None = None
    sw_power_cap: bool | None = None
    hw_slowdown: bool | None = None
    hw_thermal_slowdown: bool | None = None
    hw_power_brake_slowdown: bool | None = None
    sync_boost: bool | None = None
    sw_thermal_slowdown: bool | None = None
    display_clocks: bool | None = None


@dataclass(frozen=True, slots=True)
class CapturedProcess:
    pid: int
    name: str
    type: str = "C"  # "C" compute, "G" graphics, "C+G" both
    used_mib: float | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


@dataclass(frozen=True, slots=True)
class CapturedMigDevice:
    """One MIG device (GPU instance + compute instance) as the capture lists it."""

    index: int
    gpu_instance_id: int
    compute_instance_id: int
    multiprocessor_count: int | None = None
    memory_total_mib: float | None = None
    memory_used_mib: float | None = None


@dataclass(frozen=True, slots=True)
class CapturedGpu:
    """One GPU of the capture. Every None is "N/A" (or missing) in the capture."""

    bus_id: str  # as nvidia-smi prints it: "00000000:19:00.0"
    product_name: str
    line: int = 0  # where this GPU's block starts in the file (1-based)
    product_brand: str | None = None
    architecture: str | None = None
    uuid: str | None = None
    serial: str | None = None
    minor_number: int | None = None
    module_id: int | None = None  # "Module ID": the GPU's position on an HGX baseboard
    vbios_version: str | None = None
    inforom_image_version: str | None = None
    gsp_firmware_version: str | None = None
    pci_device_id: int | None = None  # 0x233010DE
    pci_subsystem_id: int | None = None
    persistence_mode: bool | None = None
    # "None" (bare metal), "Pass-Through" (a VM's GPU), "VGPU", "Host VGPU": as printed.
    virtualization_mode: str | None = None
    # "Default", "Exclusive_Process", "Prohibited" (or "Exclusive_Thread"): as printed.
    compute_mode: str | None = None
    mig_current: bool | None = None
    mig_pending: bool | None = None
    mig_devices: tuple[CapturedMigDevice, ...] = ()
    ecc_current: bool | None = None
    ecc_pending: bool | None = None
    # DRAM counts where the driver splits SRAM/DRAM (Ampere and later, 535+); otherwise the
    # "Single Bit"/"Double Bit" totals of older drivers.
    ecc_corrected_volatile: int | None = None
    ecc_uncorrected_volatile: int | None = None
    ecc_corrected_aggregate: int | None = None
    ecc_uncorrected_aggregate: int | None = None
    sram_corrected_volatile: int | None = None
    sram_uncorrected_volatile: int | None = None
    sram_corrected_aggregate: int | None = None
    sram_uncorrected_aggregate: int | None = None
    # Hopper and later: the aggregate SRAM uncorrectable count passed the RMA threshold.
    sram_threshold_exceeded: bool | None = None
    retired_pages_sbe: int | None = None
    retired_pages_dbe: int | None = None
    retired_pages_pending: bool | None = None
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None
    # Bank remap availability histogram: max, high, partial, low, none (banks).
    remap_histogram: tuple[int, int, int, int, int] | None = None
    reset_required: bool | None = None
    # "GPU Recovery Action" as printed ("None", "Reset", "Drain and Reset", ...) and the
    # repair flags of the ECC section; drivers before 570 or so print none of them.
    recovery_action: str | None = None
    channel_repair_pending: bool | None = None
    tpc_repair_pending: bool | None = None
    unrepairable_memory: bool | None = None
    drain_and_reset_recommended: bool | None = None
    pcie_generation_max: int | None = None  # "Max": what the link can reach
    pcie_generation_current: int | None = None
    pcie_generation_device_max: int | None = None
    pcie_generation_host_max: int | None = None
    pcie_width_max: int | None = None
    pcie_width_current: int | None = None
    pcie_replays: int | None = None
    pcie_replay_rollovers: int | None = None
    pcie_tx_kbps: int | None = None
    pcie_rx_kbps: int | None = None
    fan_speed_pct: float | None = None
    performance_state: int | None = None  # 0 for "P0"
    clock_event_reasons: ClockEventReasons | None = None
    fb_total_mib: float | None = None
    fb_reserved_mib: float | None = None
    fb_used_mib: float | None = None
    fb_free_mib: float | None = None
    utilization_gpu_pct: float | None = None
    utilization_memory_pct: float | None = None
    utilization_encoder_pct: float | None = None
    utilization_decoder_pct: float | None = None
    temperature_c: float | None = None
    memory_temperature_c: float | None = None
    thresholds: TemperatureThresholds = field(default_factory=TemperatureThresholds)
    # The 1 s average: "Power Draw" (before 550), "Average Power Draw"; N/A on GA100 and
    # older GPUs, which print only the instantaneous draw (550+).
    power_draw_w: float | None = None
    power_instant_w: float | None = None
    power_limit_w: float | None = None  # "Current Power Limit" (enforced)
    # "Requested Power Limit" (535+); before, "Power Limit" beside "Enforced Power Limit".
    # The current one may sit below it: a GH200 module shares its power.
    power_requested_limit_w: float | None = None
    power_default_limit_w: float | None = None
    power_min_limit_w: float | None = None
    power_max_limit_w: float | None = None
    # "Module Power Readings" (Grace-Blackwell: the GPU with its share of the module);
    # N/A elsewhere.
    module_power_w: float | None = None
    module_power_limit_w: float | None = None
    clock_graphics_mhz: int | None = None
    clock_sm_mhz: int | None = None
    clock_memory_mhz: int | None = None
    clock_video_mhz: int | None = None
    applications_clock_graphics_mhz: int | None = None
    applications_clock_memory_mhz: int | None = None
    default_applications_clock_graphics_mhz: int | None = None
    default_applications_clock_memory_mhz: int | None = None
    max_clock_graphics_mhz: int | None = None
    max_clock_sm_mhz: int | None = None
    max_clock_memory_mhz: int | None = None
    max_clock_video_mhz: int | None = None
    # "Fabric" block: None when the block is absent or N/A (no NVSwitch fabric).
    fabric_state: str | None = None  # "Completed", "In Progress", "Not Started"
    fabric_status: str | None = None  # "Success" or an error text
    # The fabric's health, by condition (model.FABRIC_CONDITIONS), as far as the capture
    # reports it (drivers 550+ on fabric systems; N/A entries left out).
    fabric_health: tuple[tuple[str, bool], ...] = ()
    # The NVLink domain: "CliqueId" and "ClusterUUID" (canonical lower-case 8-4-4-4-12);
    # all zeros where no fabric manager has placed the GPU in a cluster.
    fabric_clique_id: int | None = None
    fabric_cluster_uuid: str | None = None
    # "Platform Info" (where the GPU sits; rack-scale Blackwell systems). None where N/A:
    # everything but the module id on other GPUs. The chassis serial may be printed empty
    # (""), which is not N/A: the driver answered, with no serial (HGX B200).
    chassis_serial: str | None = None
    slot_number: int | None = None
    tray_index: int | None = None
    host_id: int | None = None
    peer_type: str | None = None  # "Switch Connected", "Direct Connected"
    platform_module_id: int | None = None  # "Module Id" of the block
    processes: tuple[CapturedProcess, ...] = ()


@dataclass(frozen=True, slots=True)
class Capture:
    """A whole `nvidia-smi -q` capture: the node's driver and its GPUs, in file order."""

    format: str  # "text" or "xml"
    driver_version: str
    cuda_version: str | None = None  # "12.2"
    timestamp: str | None = None
    attached_gpus: int | None = None  # as the header says; gpus may list fewer (trimmed)
    gpus: tuple[CapturedGpu, ...] = ()
    # Values read as absent because they were not what the field holds, one note per value:
    # 'line 82: GPU ... / Performance State: expected ..., got "fast" (and 7 more fields)'.
    notes: tuple[str, ...] = ()
