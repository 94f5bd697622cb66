"""The metric table: every name gpuagent exports, with its type, help text and labels.

The collector and docs/metrics.md both follow this table, so adding a per-GPU value is
one row here. dcgm-exporter names keep dcgm-exporter's help texts word for word.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from gpuagent.checks.processes import gone_pids, unattributed_mib
from gpuagent.model import COMPUTE_MODES, GpuIdentity, GpuReadings

_MIB = 1024 * 1024


class Kind(enum.Enum):
    """How a value behaves: its `# TYPE` in the exposition."""

    GAUGE = "gauge"
    # Monotonic: `# TYPE NAME counter`, under the exact name, with no `_total` added
    # (dcgm-exporter's names; gpuagent.metrics.exposition.BareCounterFamily). gpuagent's
    # own counters are named with the suffix.
    COUNTER = "counter"


GPU_LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname")
DCGM_LABELS = (*GPU_LABELS, "DCGM_FI_DRIVER_VERSION")

ValueOf = Callable[[GpuIdentity, GpuReadings], object]


@dataclass(frozen=True, slots=True)
class GpuMetric:
    """One value per GPU that answers; ``value`` returning None means "not supported"."""

    name: str
    kind: Kind
    help: str
    value: ValueOf


def _reading(field: str) -> ValueOf:
    def value(_identity: GpuIdentity, readings: GpuReadings) -> object:
        return getattr(readings, field)

    return value


def _compute_mode(_identity: GpuIdentity, readings: GpuReadings) -> object:
    mode = readings.compute_mode
    return None if mode is None else COMPUTE_MODES.get(mode)


def _static(field: str) -> ValueOf:
    def value(identity: GpuIdentity, _readings: GpuReadings) -> object:
        return getattr(identity, field)

    return value


def _seconds(field: str) -> ValueOf:
    """A nanosecond reading in seconds, Prometheus's unit of time."""

    def value(_identity: GpuIdentity, readings: GpuReadings) -> object:
        nanoseconds = getattr(readings, field)
        return None if nanoseconds is None else nanoseconds / 1e9

    return value


def _whole_watts(field: str) -> ValueOf:
    """Watts as DCGM serves a limit: NVML's milliwatts divided by 1000 in integers."""

    def value(_identity: GpuIdentity, readings: GpuReadings) -> object:
        watts = getattr(readings, field)
        return None if watts is None else round(watts * 1000) // 1000

    return value


def _process_count(_identity: GpuIdentity, readings: GpuReadings) -> object:
    return len(readings.processes)


def _unattributed_bytes(_identity: GpuIdentity, readings: GpuReadings) -> object:
    mib = unattributed_mib(readings)
    return None if mib is None else mib * _MIB


def _gone_count(_identity: GpuIdentity, readings: GpuReadings) -> object:
    # Not supported where procfs was not consulted (a replayed capture): unknown, not 0.
    if any(p.alive is None for p in readings.processes):
        return None
    return len(gone_pids(readings))


def _dcgm(name: str, kind: Kind, help_text: str, field: str) -> GpuMetric:
    return GpuMetric(f"DCGM_FI_DEV_{name}", kind, help_text, _reading(field))


def _own(name: str, help_text: str, value: ValueOf) -> GpuMetric:
    return GpuMetric(f"gpuagent_gpu_{name}", Kind.GAUGE, help_text, value)


_G, _C = Kind.GAUGE, Kind.COUNTER

# dcgm-exporter's field names, types and help texts (etc/default-counters.csv and
# etc/dcp-metrics-included.csv, including the rows it ships commented out).
DCGM_GPU_METRICS: tuple[GpuMetric, ...] = (
    _dcgm("SM_CLOCK", _G, "SM clock frequency (in MHz).", "sm_clock_mhz"),
    _dcgm("MEM_CLOCK", _G, "Memory clock frequency (in MHz).", "memory_clock_mhz"),
    _dcgm("MEMORY_TEMP", _G, "Memory temperature (in C).", "memory_temperature_c"),
    _dcgm("GPU_TEMP", _G, "GPU temperature (in C).", "temperature_c"),
    _dcgm("POWER_USAGE", _G, "Power draw (in W).", "power_w"),
    # DCGM's field 157: not in dcgm-exporter's CSVs, so the help text is DCGM's description.
    _dcgm("POWER_USAGE_INSTANT", _G, "Instantaneous power draw (in W).", "power_instant_w"),
    _dcgm(
        "TOTAL_ENERGY_CONSUMPTION",
        _C,
        "Total energy consumption since boot (in mJ).",
        "energy_mj",
    ),
    # DCGM's field 160 (nvmlDeviceGetPowerManagementLimit, the limit asked for) and 112
    # (NVML's clock event reason bits, as one number): not in dcgm-exporter's CSVs, so the
    # help texts are DCGM's descriptions.
    GpuMetric(
        "DCGM_FI_DEV_POWER_MGMT_LIMIT",
        _G,
        "Current power management limit for the device (in W).",
        _whole_watts("power_requested_limit_w"),
    ),
    _dcgm(
        "CLOCKS_EVENT_REASONS",
        _G,
        "Current clock event reasons (bitmask of DCGM_CLOCKS_EVENT_REASON_*).",
        "clock_event_reasons",
    ),
    _dcgm("PCIE_REPLAY_COUNTER", _C, "Total number of PCIe retries.", "pcie_replay_count"),
    # DCGM field names (ids 237/238); dcgm-exporter exports them under these names when
    # listed in its counters file, but ships no help text for them.
    _dcgm("PCIE_LINK_GEN", _G, "PCIe current link generation.", "pcie_generation"),
    _dcgm("PCIE_LINK_WIDTH", _G, "PCIe current link width.", "pcie_width"),
    _dcgm("GPU_UTIL", _G, "GPU utilization (in %).", "utilization_gpu_pct"),
    _dcgm("MEM_COPY_UTIL", _G, "Memory utilization (in %).", "utilization_memory_pct"),
    _dcgm("ENC_UTIL", _G, "Encoder utilization (in %).", "utilization_encoder_pct"),
    _dcgm("DEC_UTIL", _G, "Decoder utilization (in %).", "utilization_decoder_pct"),
    _dcgm("FB_FREE", _G, "Framebuffer memory free (in MiB).", "fb_free_mib"),
    _dcgm("FB_USED", _G, "Framebuffer memory used (in MiB).", "fb_used_mib"),
    _dcgm("FB_RESERVED", _G, "Framebuffer memory reserved (in MiB).", "fb_reserved_mib"),
    _dcgm(
        "ECC_SBE_VOL_TOTAL",
        _C,
        "Total number of single-bit volatile ECC errors.",
        "ecc_sbe_volatile",
    ),
    _dcgm(
        "ECC_DBE_VOL_TOTAL",
        _C,
        "Total number of double-bit volatile ECC errors.",
        "ecc_dbe_volatile",
    ),
    _dcgm(
        "ECC_SBE_AGG_TOTAL",
        _C,
        "Total number of single-bit persistent ECC errors.",
        "ecc_sbe_aggregate",
    ),
    _dcgm(
        "ECC_DBE_AGG_TOTAL",
        _C,
        "Total number of double-bit persistent ECC errors.",
        "ecc_dbe_aggregate",
    ),
    _dcgm(
        "RETIRED_SBE",
        _C,
        "Total number of retired pages due to single-bit errors.",
        "retired_pages_sbe",
    ),
    _dcgm(
        "RETIRED_DBE",
        _C,
        "Total number of retired pages due to double-bit errors.",
        "retired_pages_dbe",
    ),
    _dcgm(
        "RETIRED_PENDING",
        _C,
        "Total number of pages pending retirement.",
        "retired_pages_pending",
    ),
    _dcgm(
        "UNCORRECTABLE_REMAPPED_ROWS",
        _C,
        "Number of remapped rows for uncorrectable errors",
        "remapped_rows_uncorrectable",
    ),
    _dcgm(
        "CORRECTABLE_REMAPPED_ROWS",
        _C,
        "Number of remapped rows for correctable errors",
        "remapped_rows_correctable",
    ),
    _dcgm("ROW_REMAP_FAILURE", _G, "Whether remapping of rows has failed", "row_remap_failure"),
    _dcgm(
        "NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        _C,
        "Total number of NVLink flow-control CRC errors.",
        "nvlink_crc_flit_errors",
    ),
    _dcgm(
        "NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
        _C,
        "Total number of NVLink data CRC errors.",
        "nvlink_crc_data_errors",
    ),
    _dcgm(
        "NVLINK_REPLAY_ERROR_COUNT_TOTAL",
        _C,
        "Total number of NVLink retries.",
        "nvlink_replay_errors",
    ),
    _dcgm(
        "NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
        _C,
        "Total number of NVLink recovery errors.",
        "nvlink_recovery_errors",
    ),
    *(
        _dcgm(f"{name}_VIOLATION", _C, f"Throttling duration due to {cause} (in ns).", field)
        for name, cause, field in (
            ("POWER", "power constraints", "violation_power_ns"),
            ("THERMAL", "thermal constraints", "violation_thermal_ns"),
            ("SYNC_BOOST", "sync-boost constraints", "violation_sync_boost_ns"),
            ("BOARD_LIMIT", "board limit constraints", "violation_board_limit_ns"),
            ("LOW_UTIL", "low utilization", "violation_low_utilization_ns"),
            ("RELIABILITY", "reliability constraints", "violation_reliability_ns"),
        )
    ),
)

# MIG GPU instances: dcgm-exporter adds these two labels to an instance's series.
MIG_LABELS = ("GPU_I_PROFILE", "GPU_I_ID")


@dataclass(frozen=True, slots=True)
class ProfilingMetric:
    """A DCGM field served from profiling values (`GpuProfiling`), found by field id.

    Each GPU (and MIG GPU instance) with a value gets a series; one without gets none.
    """

    name: str
    kind: Kind
    help: str
    field_id: int  # dcgm_fields.h


# dcgm-exporter's DCGM_FI_PROF_* rows (etc/default-counters.csv and its DCP list;
# PCIE_*_BYTES appear twice there, and the default list's gauge rows win), and the NVLink
# bandwidth, which NVML's throughput counters give.
DCGM_PROFILING_METRICS: tuple[ProfilingMetric, ...] = (
    ProfilingMetric(
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE", _G, "Ratio of time the graphics engine is active.", 1001
    ),
    ProfilingMetric(
        "DCGM_FI_PROF_SM_ACTIVE",
        _G,
        "The ratio of cycles an SM has at least 1 warp assigned.",
        1002,
    ),
    ProfilingMetric(
        "DCGM_FI_PROF_SM_OCCUPANCY", _G, "The ratio of number of warps resident on an SM.", 1003
    ),
    ProfilingMetric(
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        _G,
        "Ratio of cycles the tensor (HMMA) pipe is active.",
        1004,
    ),
    ProfilingMetric(
        "DCGM_FI_PROF_DRAM_ACTIVE",
        _G,
        "Ratio of cycles the device memory interface is active sending or receiving data.",
        1005,
    ),
    ProfilingMetric(
        "DCGM_FI_PROF_PIPE_FP64_ACTIVE", _G, "Ratio of cycles the fp64 pipes are active.", 1006
    ),
    ProfilingMetric(
        "DCGM_FI_PROF_PIPE_FP32_ACTIVE", _G, "Ratio of cycles the fp32 pipes are active.", 1007
    ),
    ProfilingMetric(
        "DCGM_FI_PROF_PIPE_FP16_ACTIVE", _G, "Ratio of cycles the fp16 pipes are active.", 1008
    ),
    ProfilingMetric(
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        _G,
        "The rate of data transmitted over the PCIe bus - including both protocol headers and"
        " data payloads - in bytes per second.",
        1009,
    ),
    ProfilingMetric(
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        _G,
        "The rate of data received over the PCIe bus - including both protocol headers and"
        " data payloads - in bytes per second.",
        1010,
    ),
    ProfilingMetric(
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        _C,
        "Total number of NVLink bandwidth counters for all lanes.",
        449,
    ),
)

# Values dcgm-exporter has no default name for, under gpuagent's own names.
AGENT_GPU_METRICS: tuple[GpuMetric, ...] = (
    _own("persistence_mode", "1 if persistence mode is enabled.", _reading("persistence_mode")),
    _own("mig_mode", "1 if MIG mode is currently enabled.", _reading("mig_mode_current")),
    _own(
        "mig_mode_pending",
        "1 if MIG mode is enabled after the next GPU reset.",
        _reading("mig_mode_pending"),
    ),
    _own("ecc_enabled", "1 if ECC is currently enabled.", _reading("ecc_enabled")),
    _own(
        "ecc_default_enabled",
        "1 if the board ships with ECC enabled (its default ECC mode).",
        _static("ecc_default"),
    ),
    _own(
        "row_remap_pending",
        "1 if rows are waiting to be remapped at the next GPU reset.",
        _reading("row_remap_pending"),
    ),
    _own(
        "recovery_action",
        "The recovery action the driver asks for: 0 none, 1 GPU reset, 2 node reboot, "
        "3 drain P2P, 4 drain and reset, 5 recover IMEX domain, 6 PCIe bus reset, "
        "7 system reboot.",
        _reading("recovery_action"),
    ),
    _own(
        "channel_repair_pending",
        "1 if a memory channel repair waits for the next GPU reset.",
        _reading("channel_repair_pending"),
    ),
    _own(
        "tpc_repair_pending",
        "1 if a TPC repair waits for the next GPU reset.",
        _reading("tpc_repair_pending"),
    ),
    _own(
        "unrepairable_memory",
        "1 if the GPU reports memory it cannot repair.",
        _reading("unrepairable_memory"),
    ),
    _own("pcie_link_generation", "Current PCIe link generation.", _reading("pcie_generation")),
    _own(
        "pcie_link_generation_max",
        "Highest PCIe link generation possible for the GPU in this system.",
        _static("pcie_max_generation"),
    ),
    _own("pcie_link_width", "Current PCIe link width (lanes).", _reading("pcie_width")),
    _own(
        "pcie_link_width_max",
        "Widest PCIe link (lanes) possible for the GPU in this system.",
        _static("pcie_max_width"),
    ),
    _own(
        "power_limit_watts", "Power limit in force (enforced), in watts.", _reading("power_limit_w")
    ),
    _own(
        "power_limit_requested_watts",
        "Power limit asked for, in watts; the one in force may be lower where the platform "
        "limits power.",
        _reading("power_requested_limit_w"),
    ),
    _own(
        "compute_mode",
        "Compute mode as NVML numbers it: 0 default, 1 exclusive thread, 2 prohibited, "
        "3 exclusive process.",
        _compute_mode,
    ),
    _own(
        "module_power_watts",
        "Grace-Blackwell: the module's average power in watts (the GPU with its share of the "
        "module: Grace CPU, memory, C2C); absent on other GPUs.",
        _reading("module_power_w"),
    ),
    _own(
        "module_power_limit_watts",
        "Grace-Blackwell: the module's power limit in watts; absent on other GPUs.",
        _reading("module_power_limit_w"),
    ),
    _own("processes", "Number of processes using the GPU.", _process_count),
    _own(
        "memory_unattributed_bytes",
        "GPU memory in use beyond what the GPU's listed processes hold (in bytes); with no "
        "process at all, memory held by a leaked context.",
        _unattributed_bytes,
    ),
    _own(
        "processes_gone",
        "Number of processes NVML lists on the GPU that have no /proc entry.",
        _gone_count,
    ),
    _own(
        "performance_state",
        "Performance state (P-state): 0 is the fastest, 15 the slowest.",
        _reading("performance_state"),
    ),
    _own(
        "sm_clock_max_mhz",
        "Highest SM clock the GPU reaches when nothing holds it back (in MHz).",
        _static("sm_clock_max_mhz"),
    ),
    *(
        GpuMetric(
            f"gpuagent_gpu_{reason}_slowdown_seconds_total",
            _C,
            f"Time the clocks were held back by {what} since the driver loaded.",
            _seconds(field),
        )
        for reason, what, field in (
            ("sw_thermal", "software thermal slowdown", "throttle_sw_thermal_ns"),
            ("hw_thermal", "hardware thermal slowdown", "throttle_hw_thermal_ns"),
            ("hw_power_brake", "the hardware power brake", "throttle_hw_power_brake_ns"),
        )
    ),
)

# NVML clock event reason bits (nvmlClocksEventReason*), by the `reason` label value.
CLOCK_EVENT_REASONS: tuple[tuple[str, int], ...] = (
    ("gpu_idle", 0x1),
    ("applications_clocks", 0x2),
    ("sw_power_cap", 0x4),
    ("hw_slowdown", 0x8),
    ("sync_boost", 0x10),
    ("sw_thermal", 0x20),
    ("hw_thermal", 0x40),
    ("power_brake", 0x80),
)


def clock_event_reason_names(mask: int | None) -> list[str] | None:
    """The active reasons' names, in bit order; None when NVML did not report them."""
    if mask is None:
        return None
    return [name for name, bit in CLOCK_EVENT_REASONS if mask & bit]


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """A family whose samples the collector builds by hand (labels beyond the GPU's)."""

    name: str
    help: str
    labels: tuple[str, ...] = ()

    def gauge(self) -> GaugeMetricFamily:
        return GaugeMetricFamily(self.name, self.help, labels=self.labels)

    def counter(self, value: float | None = None) -> CounterMetricFamily:
        """A real counter (``name`` ends in _total); ``value``: its one unlabelled sample."""
        # prometheus_client takes labels or a value, not both.
        return CounterMetricFamily(self.name, self.help, labels=self.labels or None, value=value)


GPU_UP = MetricSpec(
    "gpuagent_gpu_up",
    "1 if the GPU answered the last poll; 0 if it is lost, timed out or failed.",
    GPU_LABELS,
)
GPU_HEALTH = MetricSpec(
    "gpuagent_gpu_health",
    "Result of one health check for the GPU: 0 OK, 1 WARN, 2 CRITICAL, 3 UNKNOWN.",
    (*GPU_LABELS, "check"),
)
GPU_DRILL = MetricSpec(
    "gpuagent_gpu_drill",
    "1 while the check's finding for the GPU rests on fault drills only (gpuagent inject).",
    (*GPU_LABELS, "check"),
)
GPU_HEALTH_STATUS = MetricSpec(
    "gpuagent_gpu_health_status",
    "Worst health check result for the GPU: 0 OK, 1 WARN, 2 CRITICAL, 3 UNKNOWN.",
    GPU_LABELS,
)
GPU_CLOCK_EVENT_REASONS = MetricSpec(
    "gpuagent_gpu_clock_event_reasons",
    "1 if NVML reports this clock event (throttle) reason as active.",
    (*GPU_LABELS, "reason"),
)
GPU_FABRIC_HEALTH = MetricSpec(
    "gpuagent_gpu_fabric_health",
    "1 if the NVLink fabric reports this condition for the GPU, 0 if it reports it clear "
    "(fabric info v3 health mask; conditions the driver does not support are left out).",
    (*GPU_LABELS, "condition"),
)
GPU_FABRIC_INFO = MetricSpec(
    "gpuagent_gpu_fabric_info",
    "Always 1; labels carry the GPU's NVLink domain (the fabric's cluster UUID and clique "
    "id, empty while unassigned), its registration state, and where the GPU sits (chassis "
    "serial, slot, tray, host, module; empty where not reported).",
    (
        *GPU_LABELS,
        "nvlink_domain",
        "cluster_uuid",
        "clique_id",
        "state",
        "chassis_serial",
        "slot",
        "tray",
        "host_id",
        "module_id",
    ),
)
GPU_ROW_REMAP_BANKS = MetricSpec(
    "gpuagent_gpu_row_remap_banks",
    "Memory banks by the row remapping resources they have left (the bank remap "
    "availability histogram): max, high, partial, low, none.",
    (*GPU_LABELS, "availability"),
)
REMAP_AVAILABILITY = ("max", "high", "partial", "low", "none")
GPU_NVLINK_UP = MetricSpec(
    "gpuagent_gpu_nvlink_up",
    "1 if the NVLink is active, 0 if it is down.",
    (*GPU_LABELS, "link"),
)
GPU_C2C_LINK_UP = MetricSpec(
    "gpuagent_gpu_c2c_link_up",
    "1 if the GPU's NVLink-C2C link to the CPU (Grace-Blackwell) is active, 0 if it is down.",
    (*GPU_LABELS, "link"),
)
GPU_C2C_ERRORS = MetricSpec(
    "gpuagent_gpu_c2c_errors_total",
    "NVLink-C2C link errors since the driver loaded, summed over the GPU's C2C links, by "
    "counter (crc, replay, replay_b2b).",
    (*GPU_LABELS, "counter"),
)
GPU_NVLINK_EFFECTIVE_BER = MetricSpec(
    "gpuagent_gpu_nvlink_effective_ber",
    "The NVLink's effective bit-error rate (after forward error correction), as the link "
    "measures it; absent where the GPU or driver does not report it.",
    (*GPU_LABELS, "link"),
)
GPU_NVLINK_SYMBOL_BER = MetricSpec(
    "gpuagent_gpu_nvlink_symbol_ber",
    "The NVLink's symbol bit-error rate, as the link measures it; absent where the GPU or "
    "driver does not report it.",
    (*GPU_LABELS, "link"),
)
AGENT_INFO = MetricSpec(
    "gpuagent_agent_info",
    "Always 1; labels carry the node's name and cluster as the agent reports them "
    "(agent.node_name, agent.cluster), to find a node's scrape instance by its name.",
    ("node", "cluster"),
)
NODE_HEALTH = MetricSpec(
    "gpuagent_node_health",
    "Worst health check result on the node: 0 OK, 1 WARN, 2 CRITICAL, 3 UNKNOWN.",
)
NODE_CHECK_HEALTH = MetricSpec(
    "gpuagent_node_check_health",
    "Result of one node-level health check: 0 OK, 1 WARN, 2 CRITICAL, 3 UNKNOWN.",
    ("check",),
)
NVML_UP = MetricSpec("gpuagent_nvml_up", "1 if the NVML library is initialised and usable.")
SOURCE_UP = MetricSpec("gpuagent_source_up", "1 if the source's last run succeeded.", ("source",))
SOURCE_AVAILABLE = MetricSpec(
    "gpuagent_source_available",
    "0 if what the source needs is absent on this host (no udevd, say): not a failure.",
    ("source",),
)
SOURCE_LAST_SUCCESS = MetricSpec(
    "gpuagent_source_last_success_timestamp_seconds",
    "Unix time of the source's last successful run.",
    ("source",),
)
SOURCE_DURATION = MetricSpec(
    "gpuagent_source_duration_seconds",
    "How long the source's last run took.",
    ("source",),
)
SOURCE_FAILURES = MetricSpec(
    "gpuagent_source_consecutive_failures",
    "Failed runs of the source since its last success.",
    ("source",),
)
BUILD_INFO = MetricSpec(
    "gpuagent_build_info",
    "Always 1; labels carry the agent, driver, NVML and CUDA driver versions.",
    ("version", "driver_version", "nvml_version", "cuda_driver_version"),
)
# --- the node inventory (snapshot.inventory): info-style, the values are labels -------
NODE_INFO = MetricSpec(
    "gpuagent_node_info",
    "Always 1; labels carry what the node is: driver, module, CUDA, kernel, OS, agent and "
    "the fleet fingerprint's hash.",
    (
        "driver_version",
        "module_version",
        "nvml_version",
        "cuda_driver_version",
        "kernel_release",
        "os_release",
        "agent_version",
        "fingerprint",
    ),
)
GPU_INVENTORY_INFO = MetricSpec(
    "gpuagent_gpu_inventory_info",
    "Always 1; labels carry the GPU's serial, VBIOS, InfoROM and GSP firmware versions.",
    (*GPU_LABELS, "serial", "vbios_version", "inforom_version", "gsp_firmware_version"),
)
GPUS_EXPECTED = MetricSpec(
    "gpuagent_gpus_expected",
    "GPUs this node should have (inventory.expected.gpus); absent when not configured.",
)
GPUS_SEEN = MetricSpec(
    "gpuagent_gpus_seen",
    'GPUs seen, by where: "nvml" (listed by NVML), "pci" (NVIDIA GPU functions in sysfs) or '
    '"pci_other_driver" (those of them a driver other than nvidia holds, e.g. vfio-pci).',
    ("source",),
)
NVSWITCHES_SEEN = MetricSpec(
    "gpuagent_nvswitches_seen", "NVSwitch functions on the PCI bus (sysfs)."
)
KERNEL_MODULE_LOADED = MetricSpec(
    "gpuagent_kernel_module_loaded",
    "1 if the NVIDIA kernel module is loaded, 0 if not; absent when /sys/module cannot be read.",
    ("module",),
)
KERNEL_NVIDIA_MODULE_INSTALLED = MetricSpec(
    "gpuagent_kernel_nvidia_module_installed",
    "1 if the installed kernel has an nvidia module (in its tree or built by DKMS), 0 if "
    'not; newest="true" marks the kernel a default boot starts, running="true" the one running.',
    ("kernel", "newest", "running"),
)
SERVICE_STATE = MetricSpec(
    "gpuagent_service_state",
    "1 for the service's current state (active, inactive, failed, not_installed, masked, "
    "unknown, ...), one series per service.",
    ("service", "state"),
)
SERVICE_RESTARTS = MetricSpec(
    "gpuagent_service_restarts_total",
    "Automatic restarts of the service by systemd (its NRestarts: back to 0 when the unit is "
    "reset or started by hand); absent where systemd does not count them.",
    ("service",),
)
IMEX_READY = MetricSpec(
    "gpuagent_imex_ready",
    "1 while the running IMEX daemon says it is ready (nvidia-imex-ctl -q: READY), 0 while "
    "it says anything else; absent while it does not run or cannot be asked.",
)
SNAPSHOT_TIMESTAMP = MetricSpec(
    "gpuagent_snapshot_timestamp_seconds",
    "Unix time the served snapshot was taken; alert on time() minus this for staleness.",
)
SIMULATED = MetricSpec(
    "gpuagent_simulated",
    "1 if the values come from the GPU simulator rather than real hardware.",
)
API_REJECTED = MetricSpec(
    "gpuagent_api_requests_rejected_total",
    "Local API requests refused since start, by reason (malformed, oversized, forbidden, ...).",
    ("reason",),
)
API_CONNECTIONS_REJECTED = MetricSpec(
    "gpuagent_api_connections_rejected_total",
    "Local API connections refused or dropped unserved since start, by reason (limit: "
    "over the connection cap; idle: no request in time; descriptors: a failed accept, "
    "out of file descriptors).",
    ("reason",),
)

# --- The Kubernetes GPU stack (the `kubernetes` finding's evidence; checks.kubernetes) ---
KUBERNETES_GPUS_ALLOCATABLE = MetricSpec(
    "gpuagent_kubernetes_gpus_allocatable",
    "The Node's allocatable count of the device plugin's resource, as last read from the "
    "Kubernetes API; absent until read.",
    ("resource",),
)
KUBERNETES_GPUS_CAPACITY = MetricSpec(
    "gpuagent_kubernetes_gpus_capacity",
    "The Node's capacity of the device plugin's resource (unhealthy devices included).",
    ("resource",),
)
KUBERNETES_GPUS_EXPECTED = MetricSpec(
    "gpuagent_kubernetes_gpus_expected",
    "What the Node should advertise: the GPUs without a CRITICAL finding, times "
    "checks.kubernetes.replicas_per_gpu.",
    ("resource",),
)
KUBERNETES_DEVICE_PLUGIN_REGISTERED = MetricSpec(
    "gpuagent_kubernetes_device_plugin_registered",
    "1 if the device plugin's socket is in kubelet's device plugin directory and kubelet "
    "has its devices registered, 0 if not; absent when the directory cannot be read.",
)
CDI_GPUS_MISSING = MetricSpec(
    "gpuagent_cdi_gpus_missing",
    "GPUs that no NVIDIA CDI spec names (by index or UUID); absent when there is no spec.",
)

# --- PCIe links from sysfs (snapshot.pcie): the GPUs, NVSwitches and every bridge above --
# `pci_bus_id` is the link's own address in sysfs form (bridges are not NVML devices);
# `device_pci_bus_id` is the GPU or NVSwitch the path leads to, in NVML form, to join with
# the per-GPU series.
PCIE_LABELS = ("pci_bus_id", "role", "device_pci_bus_id", "Hostname")

PCIE_LINK_SPEED = MetricSpec(
    "gpuagent_pcie_link_speed_gts",
    "Current PCIe link speed in GT/s, as sysfs reports it.",
    PCIE_LABELS,
)
PCIE_LINK_MAX_SPEED = MetricSpec(
    "gpuagent_pcie_link_max_speed_gts",
    "Highest PCIe link speed in GT/s the function supports.",
    PCIE_LABELS,
)
PCIE_LINK_WIDTH = MetricSpec(
    "gpuagent_pcie_link_width",
    "Current PCIe link width (lanes), as sysfs reports it.",
    PCIE_LABELS,
)
PCIE_LINK_MAX_WIDTH = MetricSpec(
    "gpuagent_pcie_link_max_width",
    "Widest PCIe link (lanes) the function supports.",
    PCIE_LABELS,
)
PCIE_AER_ERRORS = MetricSpec(
    "gpuagent_pcie_aer_errors_total",
    "PCIe errors the kernel's AER driver counted for the function since boot, by severity.",
    (*PCIE_LABELS, "severity"),
)

# Gauges: (family, PcieLink field).
PCIE_LINK_GAUGES: tuple[tuple[MetricSpec, str], ...] = (
    (PCIE_LINK_SPEED, "current_speed_gts"),
    (PCIE_LINK_MAX_SPEED, "max_speed_gts"),
    (PCIE_LINK_WIDTH, "current_width"),
    (PCIE_LINK_MAX_WIDTH, "max_width"),
)
# `severity` label value -> PcieLink field (the aer_dev_* file it was read from).
PCIE_AER_SEVERITIES: tuple[tuple[str, str], ...] = (
    ("correctable", "aer_correctable"),
    ("nonfatal", "aer_nonfatal"),
    ("fatal", "aer_fatal"),
)

# --- RDMA ports from sysfs (snapshot.infiniband) ----------------------------------------
# node_exporter's infiniband collector names and labels, so its dashboards work unchanged.
IB_LABELS = ("device", "port")

IB_INFO = MetricSpec(
    "node_infiniband_info",
    "RDMA device identity from /sys/class/infiniband/<device>; the value is always 1.",
    ("device", "board_id", "firmware_version", "hca_type"),
)
IB_STATE = MetricSpec(
    "node_infiniband_state_id",
    "Logical state of the port (1: down, 2: init, 3: armed, 4: active, 5: active defer).",
    IB_LABELS,
)
IB_PHYSICAL_STATE = MetricSpec(
    "node_infiniband_physical_state_id",
    "Physical state of the port (1: sleep, 2: polling, 3: disabled, 4: port configuration "
    "training, 5: link up, 6: link error recovery, 7: phy test).",
    IB_LABELS,
)
IB_RATE = MetricSpec(
    "node_infiniband_rate_bytes_per_second",
    "Signalling rate of the port's link in bytes per second.",
    IB_LABELS,
)
IB_HW_COUNTERS = MetricSpec(
    "gpuagent_infiniband_hw_events_total",
    "The RDMA driver's per-port counters (hw_counters/: out_of_buffer, "
    "local_ack_timeout_err, ...) since the driver loaded, by counter.",
    (*IB_LABELS, "counter"),
)


def _ib_counter(name: str, help_text: str) -> MetricSpec:
    return MetricSpec(f"node_infiniband_{name}", help_text, IB_LABELS)


# (counters/ file, family): the port counters since the driver loaded.
IB_PORT_COUNTERS: tuple[tuple[str, MetricSpec], ...] = (
    ("symbol_error", _ib_counter(
        "symbol_error_total", "Minor link errors detected on one or more physical lanes.")),
    ("link_error_recovery", _ib_counter(
        "link_error_recovery_total", "Times the link recovered from an error state.")),
    ("link_downed", _ib_counter(
        "link_downed_total", "Times the link failed to recover from an error state and went "
        "down.")),
    ("port_rcv_errors", _ib_counter(
        "port_errors_received_total", "Packets with an error received on the port.")),
    ("port_rcv_remote_physical_errors", _ib_counter(
        "port_receive_remote_physical_errors_total", "Packets received marked bad (EBP "
        "delimiter) by an earlier link.")),
    ("port_rcv_switch_relay_errors", _ib_counter(
        "port_receive_switch_relay_errors_total", "Received packets a switch could not "
        "forward.")),
    ("local_link_integrity_errors", _ib_counter(
        "local_link_integrity_errors_total", "Times local physical errors exceeded the "
        "LocalPhyErrors threshold.")),
    ("excessive_buffer_overrun_errors", _ib_counter(
        "excessive_buffer_overrun_errors_total", "Times buffer overruns persisted over "
        "consecutive flow control update periods.")),
    ("port_rcv_constraint_errors", _ib_counter(
        "port_constraint_errors_received_total", "Received packets discarded by the port's "
        "partition or filtering rules.")),
    ("port_xmit_constraint_errors", _ib_counter(
        "port_constraint_errors_transmitted_total", "Packets not transmitted because of the "
        "port's partition or filtering rules.")),
    ("port_rcv_discards", _ib_counter(
        "port_discards_received_total", "Inbound packets the port discarded (port down or "
        "congested).")),
    ("port_xmit_discards", _ib_counter(
        "port_discards_transmitted_total", "Outbound packets the port discarded (port down or "
        "congested).")),
    ("VL15_dropped", _ib_counter(
        "vl15_dropped_total", "Incoming VL15 (subnet management) packets dropped for lack of "
        "resources.")),
    ("port_xmit_wait", _ib_counter(
        "port_transmit_wait_total", "Ticks during which the port had data to send but sent "
        "none.")),
    ("port_rcv_data", _ib_counter(
        "port_data_received_bytes_total", "Data octets received on the port.")),
    ("port_xmit_data", _ib_counter(
        "port_data_transmitted_bytes_total", "Data octets transmitted on the port.")),
    ("port_rcv_packets", _ib_counter(
        "port_packets_received_total", "Packets received on the port (errors included).")),
    ("port_xmit_packets", _ib_counter(
        "port_packets_transmitted_total", "Packets transmitted on the port (errors "
        "included).")),
    ("unicast_rcv_packets", _ib_counter(
        "unicast_packets_received_total", "Unicast packets received (errors included).")),
    ("unicast_xmit_packets", _ib_counter(
        "unicast_packets_transmitted_total", "Unicast packets transmitted (errors included).")),
    ("multicast_rcv_packets", _ib_counter(
        "multicast_packets_received_total", "Multicast packets received (errors included).")),
    ("multicast_xmit_packets", _ib_counter(
        "multicast_packets_transmitted_total", "Multicast packets transmitted (errors "
        "included).")),
)  # fmt: skip

# --- kernel-log, NVML and bus events (metrics/events.py) -------------------------------

# dcgm-exporter (3.3.6 and later) labels the last XID with its code and its text.
XID_LAST = MetricSpec(
    "DCGM_FI_DEV_XID_ERRORS",
    "Value of the last XID error encountered.",
    (*DCGM_LABELS, "err_code", "err_msg"),
)
XID_TOTAL = MetricSpec(
    "gpuagent_xid_errors_total",
    "XID errors reported for the GPU since the agent started (kernel log or NVML), by XID.",
    (*GPU_LABELS, "xid"),
)
SXID_TOTAL = MetricSpec(
    "gpuagent_sxid_errors_total",
    "NVSwitch SXid errors in the kernel log since the agent started, by SXid.",
    ("pci_bus_id", "sxid", "Hostname"),
)
AER_REPORTS_TOTAL = MetricSpec(
    "gpuagent_aer_reports_total",
    "PCIe AER reports in the kernel log since the agent started, by device and severity.",
    ("pci_bus_id", "severity", "Hostname"),
)
BUS_EVENTS_TOTAL = MetricSpec(
    "gpuagent_bus_events_total",
    "Fallen-off-the-bus lines and udev add/remove/bind/unbind events, by device and kind.",
    ("pci_bus_id", "kind", "Hostname"),
)
GPU_RESETS_TOTAL = MetricSpec(
    "gpuagent_gpu_resets_total",
    "GPU resets since the agent started: its own, and recovery actions NVML showed done.",
    GPU_LABELS,
)
KMSG_READ = MetricSpec("gpuagent_kmsg_records_read_total", "Kernel log records read.")
KMSG_LOST = MetricSpec(
    "gpuagent_kmsg_records_lost_total",
    "Kernel log records overwritten before the agent could read them.",
)
KMSG_UNPARSED = MetricSpec("gpuagent_kmsg_lines_unparsed_total", "Malformed kernel log records.")

# --- remediation --------------------------------------------------------------------------

ACTIONS_TOTAL = MetricSpec(
    "gpuagent_actions_total",
    "Remediation actions since the agent started, by action and result "
    "(planned, started, succeeded, failed, refused, skipped, verified, escalated).",
    ("action", "result"),
)
REMEDIATION_BUDGET = MetricSpec(
    "gpuagent_remediation_budget_remaining",
    "Attempts left in a remediation budget's current window, by action and scope.",
    ("action", "scope"),
)
REMEDIATION_ENFORCING = MetricSpec(
    "gpuagent_remediation_enforcing",
    "1 if remediation acts (mode enforce), 0 if it only plans and audits (observe).",
)
REMEDIATION_PAUSED = MetricSpec(
    "gpuagent_remediation_paused", "1 while the remediation kill switch is set."
)
REMEDIATION_CORDONED = MetricSpec(
    "gpuagent_remediation_cordoned", "1 while the node is cordoned by gpuagent."
)
MQTT_CONNECTED = MetricSpec(
    "gpuagent_mqtt_connected", "1 while the MQTT reporter is connected to the broker."
)
MQTT_CONNECTIONS = MetricSpec(
    "gpuagent_mqtt_connections_total", "Successful connections to the MQTT broker."
)
MQTT_SPOOL_MESSAGES = MetricSpec(
    "gpuagent_mqtt_spool_messages",
    "Events, action records and replies in the spool: not yet sent, or sent and not yet "
    "acknowledged by the aggregator.",
)
MQTT_AWAITING_ACK = MetricSpec(
    "gpuagent_mqtt_spool_awaiting_ack_messages",
    "Of those, the ones sent and waiting for the aggregator to acknowledge storing them "
    "(sent again after `ack_timeout_seconds`, doubling).",
)
MQTT_ACKNOWLEDGED = MetricSpec(
    "gpuagent_mqtt_acknowledged_total",
    "Spooled messages the aggregator acknowledged storing (they left the spool).",
)
MQTT_DISCONNECTS = MetricSpec(
    "gpuagent_mqtt_disconnects_total",
    "Connections the broker ended, by its reason. A client taking over this node's client "
    'id shows here ("Session taken over"; mosquitto 2.0.11 closes the connection without '
    'a reason, seen as "Unspecified error").',
    ("reason",),
)
MQTT_SPOOL_BYTES = MetricSpec("gpuagent_mqtt_spool_bytes", "Bytes waiting in the MQTT spool.")
MQTT_SPOOL_DROPPED = MetricSpec(
    "gpuagent_mqtt_spool_dropped_total",
    "Messages dropped unsent because the spool went past its size or age bound.",
)
MQTT_PUBLISHED = MetricSpec(
    "gpuagent_mqtt_published_total",
    "Publishes the broker acknowledged, by channel (state, events, actions, replies).",
    ("channel",),
)
MQTT_REFUSED = MetricSpec(
    "gpuagent_mqtt_publish_refused_total",
    "Publishes the broker refused (MQTT 5 reason code, e.g. not authorized by its ACL).",
    ("channel",),
)
MQTT_COMMANDS = MetricSpec(
    "gpuagent_mqtt_commands_total", "Commands received from the aggregator.", ("command",)
)
MQTT_COMMANDS_REJECTED = MetricSpec(
    "gpuagent_mqtt_commands_rejected_total",
    "Messages on the command topic that were rejected, by reason "
    "(oversized, malformed, schema, unknown_type, invalid, foreign, not_allowed).",
    ("reason",),
)
