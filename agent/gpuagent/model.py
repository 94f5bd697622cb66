"""The data every part of the agent shares: observations, findings and the node snapshot.

Everything here is immutable. Sources build new values, the state store swaps whole
snapshots, and outputs read them without locks.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

# A runtime import (not under TYPE_CHECKING), so `typing.get_type_hints(NodeSnapshot)`
# resolves: gpuagent.inventory.model imports nothing from gpuagent, hence no cycle.
# FabricState is defined there (the inventory reports it too) and re-exported here.
from gpuagent.inventory.model import FabricState as FabricState  # noqa: PLC0414 - re-export
from gpuagent.inventory.model import NodeInventory


class Severity(enum.Enum):
    """Health of one check, one GPU or the node.

    ``value`` is the number exported in metrics and used as the `gpuagent check` exit
    code (the Nagios convention); ``rank`` orders severities when combining them, where a
    GPU we cannot see (UNKNOWN) is worse than a warning but better than a known failure.
    """

    OK = 0
    WARN = 1
    CRITICAL = 2
    UNKNOWN = 3

    @property
    def rank(self) -> int:
        return _RANK[self]

    @staticmethod
    def worst(severities: tuple[Severity, ...] | list[Severity]) -> Severity:
        return max(severities, key=_RANK.__getitem__, default=Severity.OK)


_RANK = {Severity.OK: 0, Severity.WARN: 1, Severity.UNKNOWN: 2, Severity.CRITICAL: 3}

EvidenceValue = str | int | float | bool | None


@dataclass(frozen=True, slots=True)
class Finding:
    """The result of one check for one GPU (``gpu`` is its PCI bus id) or the node (None)."""

    check: str
    severity: Severity
    reason: str
    gpu: str | None = None
    evidence: tuple[tuple[str, EvidenceValue], ...] = ()
    action: str = "none"
    runbook: str = ""
    # What it is about (an XID, a counter, a link; the runbook when nothing finer): with
    # the check and the GPU, the finding's identity. Outputs key on identity and severity,
    # never on the reason, whose numbers change at every poll. "" when OK.
    cause: str = ""
    # UNKNOWN only because the GPU gave no readings: the `availability` finding is the one
    # fault, so this one is no problem of its own (not listed, logged, reported or counted).
    masked: bool = False
    # Only fault drills' events (`gpuagent inject`) stand behind it: its reason says DRILL.
    drill: bool = False

    @property
    def identity(self) -> tuple[str | None, str, str]:
        return (self.gpu, self.check, self.cause)

    def evidence_dict(self) -> dict[str, EvidenceValue]:
        return dict(self.evidence)


CONSUMER_BRANDS = frozenset({"GeForce", "Titan", "GeForce RTX", "Titan RTX"})
# Workstation boards: those with ECC ship with it off (RTX A6000, RTX 4000 SFF Ada, RTX PRO
# 6000 Blackwell), so off is their default, as on consumer boards.
WORKSTATION_BRANDS = frozenset({"Quadro", "Quadro RTX", "NVIDIA RTX", "NVS"})
# NVML's compute modes (nvmlComputeMode_t), by the names `nvidia-smi` prints in lower case.
COMPUTE_MODES: dict[str, int] = {
    "default": 0,
    "exclusive_thread": 1,
    "prohibited": 2,
    "exclusive_process": 3,
}


# What NVML reports for a GPU no fabric manager has placed in a cluster.
ZERO_UUID = "00000000-0000-0000-0000-000000000000"


def nvlink_domain(readings: GpuReadings | None) -> str | None:
    """The GPU's NVLink domain, "<cluster UUID>/<clique id>"; None while it is unassigned
    (no fabric, registration not completed, a zero cluster UUID or clique 0)."""
    if readings is None or readings.fabric_state != "completed":
        return None
    uuid, clique = readings.fabric_cluster_uuid, readings.fabric_clique_id
    if not uuid or uuid == ZERO_UUID or not clique:
        return None
    return f"{uuid}/{clique}"


@dataclass(frozen=True, slots=True)
class PlatformInfo:
    """Where the GPU sits (nvmlDeviceGetPlatformInfo; GB200/GB300 NVL racks): the rack's
    chassis serial, the compute tray's slot and index, the host in the tray, the GPU's
    module."""

    chassis_serial: str
    slot_number: int
    tray_index: int
    host_id: int
    module_id: int


@dataclass(frozen=True, slots=True)
class GpuIdentity:
    """What does not change while the driver is loaded: read once per NVML session."""

    index: int
    pci_bus_id: str  # canonical sysfs form: "0000:18:00.0"
    uuid: str
    name: str
    serial: str | None = None
    vbios_version: str | None = None
    minor_number: int | None = None  # /dev/nvidiaN
    temperature_slowdown_c: float | None = None
    temperature_shutdown_c: float | None = None
    temperature_gpu_max_c: float | None = None
    temperature_memory_max_c: float | None = None
    power_default_limit_w: float | None = None
    pcie_max_generation: int | None = None
    pcie_max_width: int | None = None
    nvlink_count: int = 0
    inforom_version: str | None = None  # the InfoROM image version
    gsp_firmware_version: str | None = None  # None: no GSP firmware, or not reported
    applications_clock_default_mhz: int | None = None  # graphics
    sm_clock_max_mhz: int | None = None  # what the SM clock reaches when nothing holds it back
    brand: str | None = None  # "Product Brand": "NVIDIA", "GeForce", "Titan", ...
    # The ECC mode the board ships with (nvmlDeviceGetDefaultEccMode); None: not reported.
    ecc_default: bool | None = None
    platform: PlatformInfo | None = None  # None: not reported (not an NVL rack's GPU)

    @property
    def consumer(self) -> bool:
        """A GeForce or Titan board: ECC, when it has it at all, ships switched off."""
        return self.brand in CONSUMER_BRANDS

    @property
    def ecc_on_by_default(self) -> bool:
        """Whether the board ships with ECC on: its own word where NVML gives it, else its
        class (data-center boards on; consumer and workstation boards off)."""
        if self.ecc_default is not None:
            return self.ecc_default
        return not (self.consumer or self.brand in WORKSTATION_BRANDS)

    @property
    def device(self) -> str:
        """dcgm-exporter's ``device`` label: the device node name."""
        return f"nvidia{self.minor_number if self.minor_number is not None else self.index}"


@dataclass(frozen=True, slots=True)
class GpuProcess:
    pid: int
    name: str
    used_mib: float | None
    # From procfs, looked up where NVML is read: whether /proc/<pid> exists and who owns
    # it (a user name, or "uid N" where the uid has no name). None: not looked up.
    alive: bool | None = None
    user: str | None = None
    # The Slurm job the process runs in, from its cgroup path (job_<id>); read only with
    # `attribution.slurm` on. None: not in a job, or not looked up.
    job: str | None = None


@dataclass(frozen=True, slots=True)
class Workload:
    """Who a GPU (or one of its MIG devices) belongs to: a Kubernetes container the kubelet
    allocated it to, or a Slurm job one of its processes runs in. Empty strings: not known
    by that scheme (the labels dcgm-exporter leaves empty)."""

    pod: str = ""
    namespace: str = ""
    container: str = ""
    hpc_job: str = ""
    # The MIG device's UUID ("MIG-..."); "" for the whole GPU.
    device: str = ""


@dataclass(frozen=True, slots=True)
class MigDevice:
    """One MIG device (a compute instance of a GPU instance), as the device plugin hands
    it to containers: by its own UUID, which does not name the GPU it is on."""

    uuid: str  # "MIG-<uuid>"
    gpu_instance_id: int
    compute_instance_id: int


# Profiling values, keyed by DCGM field id number (DCGM_FI_PROF_GR_ENGINE_ACTIVE is 1001,
# DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL 449, ...), in DCGM's units: ratios 0-1 for activity,
# bytes per second for PCIe and NVLink traffic. Field numbers, not names, since DCGM
# renamed many field constants between versions while keeping their numbers.
ProfilingValues = tuple[tuple[int, float], ...]
ProfilingSource = Literal["gpm", "dcgm"]


@dataclass(frozen=True, slots=True)
class GpuProfiling:
    """One GPU's, or one MIG GPU instance's, profiling values and what measured them."""

    source: ProfilingSource
    values: ProfilingValues
    gpu_instance_id: int | None = None  # MIG GPU instance; None: the whole GPU
    gpu_instance_profile: str | None = None  # "1g.10gb", with gpu_instance_id


# nvmlDeviceGpuRecoveryAction_t, by the names findings, status and captures use.
RECOVERY_ACTIONS: dict[int, str] = {
    0: "none",
    1: "reset",
    2: "reboot",
    3: "drain_p2p",
    4: "drain_and_reset",
    5: "recover_imex_domain",
    6: "bus_reset",
    7: "system_reboot",
}

# The fabric's health mask (nvmlGpuFabricInfo_v3 healthMask): two-bit fields, each 0 not
# supported, 1 true, 2 false, by (condition, shift); incorrect configuration four bits at 8
# (0 not supported, 1 none, 2.. what is wrong); the global Fabric Manager two bits at 14
# (0 not supported, 1 connected, 2 disconnected).
_FABRIC_FLAGS = (
    ("bandwidth_degraded", 0),
    ("route_recovery", 2),
    ("route_unhealthy", 4),
    ("access_timeout_recovery", 6),
)
_FABRIC_CONFIGURATION_SHIFT = 8
_FABRIC_GFM_SHIFT = 14
FABRIC_CONFIGURATION_ERRORS: dict[int, str] = {
    2: "incorrect system GUID",
    3: "incorrect chassis serial number",
    4: "no partition",
    5: "insufficient NVLinks",
    6: "incompatible GPU firmware",
    7: "invalid location",
    8: "GPU state invalid",
}
# Every condition the mask can report, in the order findings and series name them.
FABRIC_CONDITIONS = (
    *(name for name, _ in _FABRIC_FLAGS),
    "incorrect_configuration",
    "gfm_disconnected",
)


def fabric_conditions(mask: int) -> dict[str, bool]:
    """Each condition the mask reports (those it marks not supported are left out)."""
    found: dict[str, bool] = {}
    for name, shift in _FABRIC_FLAGS:
        field_ = (mask >> shift) & 0x3
        if field_:
            found[name] = field_ == 1
    configuration = fabric_configuration_error(mask)
    if configuration is not None:
        found["incorrect_configuration"] = configuration != 1
    gfm = (mask >> _FABRIC_GFM_SHIFT) & 0x3
    if gfm:
        found["gfm_disconnected"] = gfm == 2
    return found


def fabric_configuration_error(mask: int) -> int | None:
    """The incorrect-configuration code (1 none, 2.. FABRIC_CONFIGURATION_ERRORS), or None
    where it is not supported."""
    code = (mask >> _FABRIC_CONFIGURATION_SHIFT) & 0xF
    return code or None


def fabric_health_mask(conditions: dict[str, bool], configuration_error: int = 5) -> int:
    """The mask that reports ``conditions`` (the rest not supported): fabric_conditions'
    inverse, for the simulator and the replay. An incorrect configuration is reported as
    ``configuration_error`` (insufficient NVLinks unless said)."""
    mask = 0
    for name, shift in _FABRIC_FLAGS:
        if name in conditions:
            mask |= (1 if conditions[name] else 2) << shift
    if "incorrect_configuration" in conditions:
        code = configuration_error if conditions["incorrect_configuration"] else 1
        mask |= code << _FABRIC_CONFIGURATION_SHIFT
    if "gfm_disconnected" in conditions:
        mask |= (2 if conditions["gfm_disconnected"] else 1) << _FABRIC_GFM_SHIFT
    return mask


@dataclass(frozen=True, slots=True)
class GpuReadings:
    """One poll of one GPU. ``None`` means the GPU does not support the value."""

    temperature_c: float | None = None
    memory_temperature_c: float | None = None
    power_w: float | None = None  # averaged over the last second, as DCGM reports it
    power_instant_w: float | None = None
    power_limit_w: float | None = None  # the current (enforced) limit
    # The limit asked for (nvmlDeviceGetPowerManagementLimit). The current one may sit
    # below it where the platform limits power (a GH200 module shares its 1000 W).
    power_requested_limit_w: float | None = None
    # Grace-Blackwell: the module's average power (the GPU with its share of the module)
    # and the module's power limit; None on other GPUs.
    module_power_w: float | None = None
    module_power_limit_w: float | None = None
    energy_mj: int | None = None
    sm_clock_mhz: int | None = None
    memory_clock_mhz: int | None = None
    utilization_gpu_pct: float | None = None
    utilization_memory_pct: float | None = None
    utilization_encoder_pct: float | None = None
    utilization_decoder_pct: float | None = None
    fb_used_mib: float | None = None
    fb_free_mib: float | None = None
    fb_reserved_mib: float | None = None
    ecc_enabled: bool | None = None
    ecc_sbe_volatile: int | None = None
    ecc_dbe_volatile: int | None = None
    ecc_sbe_aggregate: int | None = None
    ecc_dbe_aggregate: int | None = None
    retired_pages_sbe: int | None = None
    retired_pages_dbe: int | None = None
    retired_pages_pending: bool | None = None
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    row_remap_pending: bool | None = None
    row_remap_failure: bool | None = None
    # The row remapper's bank availability histogram: banks with max, high, partial, low
    # and no spare rows left (nvmlDeviceGetRowRemapperHistogram; read on the slow cadence).
    remap_banks: tuple[int, int, int, int, int] | None = None
    # What the driver says the GPU needs before it can be trusted again (NVML field 230,
    # nvmlDeviceGpuRecoveryAction_t; RECOVERY_ACTIONS names it), and the repairs and memory
    # state newer drivers report beside it. Read at start and on the slow cadence.
    recovery_action: int | None = None
    channel_repair_pending: bool | None = None
    tpc_repair_pending: bool | None = None
    unrepairable_memory: bool | None = None
    pcie_generation: int | None = None
    pcie_width: int | None = None
    pcie_replay_count: int | None = None
    clock_event_reasons: int | None = None  # NVML bitmask (nvmlClocksEventReason*)
    persistence_mode: bool | None = None
    mig_mode_current: bool | None = None
    mig_mode_pending: bool | None = None
    # The GPU instances' profile names ("1g.10gb"), sorted; None unless MIG mode is on and
    # NVML lists them (read on the slow cadence).
    mig_instances: tuple[str, ...] | None = None
    # The MIG devices, by slot; empty unless MIG mode is on (read on the slow cadence).
    mig_devices: tuple[MigDevice, ...] = ()
    ecc_enabled_pending: bool | None = None  # takes effect at the next reset
    applications_clock_mhz: int | None = None  # graphics; the default unless someone set it
    compute_mode: str | None = None  # a COMPUTE_MODES name
    # NVSwitch systems: the GPU's registration with Fabric Manager. None: not supported.
    fabric_state: FabricState | None = None
    fabric_ok: bool | None = None  # the registration's result, once completed
    # The fabric's health mask (nvmlGpuFabricInfo_v3 healthMask, decoded by
    # gpuagent.checks.fabric_health); None where the driver has no v3 fabric info.
    fabric_health_mask: int | None = None
    # The NVLink domain the fabric put the GPU in: its cluster UUID and clique id. Unrelated
    # racks report the same clique (32766), so only the pair names a domain (nvlink_domain).
    fabric_cluster_uuid: str | None = None
    fabric_clique_id: int | None = None
    # One entry per NVLink: True up, False down, None unknown/unsupported.
    nvlink_up: tuple[bool | None, ...] = ()
    nvlink_crc_flit_errors: int | None = None
    nvlink_crc_data_errors: int | None = None
    nvlink_replay_errors: int | None = None
    nvlink_recovery_errors: int | None = None
    # Per NVLink, the bit-error rates the link measures (NVML fields 220 and 222, decoded):
    # effective (after forward error correction) and symbol; None where not reported.
    nvlink_effective_ber: tuple[float | None, ...] = ()
    nvlink_symbol_ber: tuple[float | None, ...] = ()
    # NVLink-C2C to the CPU (Grace-Blackwell): each link up or not, and its CRC, replay and
    # back-to-back replay error counters summed over the links, since the driver loaded.
    c2c_up: tuple[bool | None, ...] = ()
    c2c_crc_errors: int | None = None
    c2c_replay_errors: int | None = None
    c2c_replay_b2b_errors: int | None = None
    processes: tuple[GpuProcess, ...] = ()  # compute processes
    # Graphics processes (a display server): read only while no compute process is listed
    # and memory is in use, to tell a desktop's display from memory held by no one.
    graphics_processes: tuple[GpuProcess, ...] = ()
    performance_state: int | None = None  # P-state: 0 (fastest) to 15; None: not reported
    # How long NVML has held the clocks back, per cause, in ns since the driver loaded
    # (nvmlDeviceGetViolationStatus's perf policy counters, the fields DCGM exports as
    # *_VIOLATION); None where the GPU or driver does not count that cause.
    violation_power_ns: int | None = None
    violation_thermal_ns: int | None = None
    violation_sync_boost_ns: int | None = None
    violation_board_limit_ns: int | None = None
    violation_low_utilization_ns: int | None = None
    violation_reliability_ns: int | None = None
    # The same for single clock event reasons (drivers 550 and later).
    throttle_sw_thermal_ns: int | None = None
    throttle_hw_thermal_ns: int | None = None
    throttle_hw_power_brake_ns: int | None = None
    # When the slow counters (energy, the throttle durations above, PCIe replays) were read
    # (monotonic s): they are read on the slow cadence, so a rate over them uses this time,
    # not the poll's. None: read with the rest of the poll.
    counters_at: float | None = None
    # NVML GPM (Hopper and later): the whole GPU first, then each MIG GPU instance; empty
    # where the GPU has no GPM, so such a GPU exports no profiling series at all.
    profiling: tuple[GpuProfiling, ...] = ()

    def counters_sampled_at(self, now: float) -> float:
        """The time a slow counter's sample belongs to, for a poll judged at ``now`` (a
        time that is no number would put the sample outside every window)."""
        at = self.counters_at
        return now if at is None or not math.isfinite(at) else min(at, now)

    @property
    def c2c_errors(self) -> tuple[tuple[str, int | None], ...]:
        """The C2C error counters by the names metrics give them."""
        return (
            ("crc", self.c2c_crc_errors),
            ("replay", self.c2c_replay_errors),
            ("replay_b2b", self.c2c_replay_b2b_errors),
        )


GpuStatus = Literal["ok", "lost", "timeout", "error"]


@dataclass(frozen=True, slots=True)
class GpuState:
    """What the agent knows about one GPU right now.

    ``readings`` is None unless ``status == "ok"``: a lost or wedged GPU serves no values,
    so nothing stale is ever exported.
    """

    identity: GpuIdentity
    status: GpuStatus
    readings: GpuReadings | None = None
    error: str | None = None
    sampled_at: float | None = None  # wall clock of the last successful sample
    # Its owners (workload attribution); empty when attribution is off or none is known.
    # Several on a time-sliced or MIG GPU.
    workloads: tuple[Workload, ...] = ()


NvmlInitProblem = Literal[
    "driver_not_loaded",
    "library_not_found",
    "version_mismatch",
    "no_permission",
    "timeout",
    "other",
]


@dataclass(frozen=True, slots=True)
class NvmlStatus:
    """Node-level NVML state: whether the library is usable at all."""

    ok: bool
    problem: NvmlInitProblem | None = None
    message: str = ""
    driver_version: str | None = None
    nvml_version: str | None = None
    cuda_driver_version: str | None = None


@dataclass(frozen=True, slots=True)
class SourceStatus:
    """Supervisor bookkeeping for one source, exported like node_exporter's collector stats."""

    name: str
    up: bool
    # False: what the source needs is absent on this host (no udevd, say); not a failure.
    available: bool = True
    last_success: float | None = None  # wall clock
    last_error: str | None = None  # or, when unavailable, why
    last_duration_seconds: float | None = None
    consecutive_failures: int = 0


# --- DCGM: health incidents, profiling for GPUs without GPM, diagnostics ---------------------

DcgmState = Literal["absent", "down", "up"]


@dataclass(frozen=True, slots=True)
class DcgmIncident:
    """One incident of `dcgmHealthCheck`: DCGM's verdict on one system of one GPU."""

    system: str  # "pcie", "memory", "inforom", "thermal", "power", "nvlink", "nvswitch", ...
    severity: Severity  # DCGM_HEALTH_RESULT_WARN → WARN, _FAIL → CRITICAL
    code: str  # DCGM's error code name, "DCGM_FR_..."
    message: str
    gpu: str | None = None  # PCI bus id; None for an entity that is not a GPU


@dataclass(frozen=True, slots=True)
class DcgmStatus:
    """The DCGM source's state: "absent" (no bindings), "down" (host engine unreachable,
    reconnecting) or "up"."""

    state: DcgmState
    detail: str = ""
    version: str | None = None  # of the bindings / host engine, when known
    hostengine: str | None = None  # "embedded", or the address connected to
    incidents: tuple[DcgmIncident, ...] = ()
    # Profiling values for GPUs GPM does not cover, by PCI bus id.
    profiling: tuple[tuple[str, GpuProfiling], ...] = ()


DiagOutcome = Literal["pass", "fail", "warn", "skip", "notrun"]


@dataclass(frozen=True, slots=True)
class DiagTest:
    """One test of a DCGM diagnostic, for one GPU (or the whole system when ``gpu`` is None)."""

    name: str  # DCGM's test name: "software", "pcie", "memory", "diagnostic", ...
    outcome: DiagOutcome
    gpu: int | None = None  # DCGM's GPU id (the NVML index)
    info: str = ""  # DCGM's message for a failure or warning


@dataclass(frozen=True, slots=True)
class DiagResult:
    """One run of `dcgmi diag -r <level>` or the bindings' dcgmActionValidate_v2."""

    level: int  # 1 quick, 2 medium, 3 long
    gpus: tuple[int, ...]  # the GPU ids tested
    started: float  # wall clock
    finished: float
    via: Literal["bindings", "dcgmi"]
    tests: tuple[DiagTest, ...] = ()
    error: str = ""  # why the diagnostic could not run at all; a failure too

    @property
    def passed(self) -> bool:
        return not self.error and all(t.outcome != "fail" for t in self.tests)

    def failures(self, gpu: int | None = None) -> tuple[DiagTest, ...]:
        return tuple(t for t in self.tests if t.outcome == "fail" and (gpu is None or t.gpu == gpu))


# --- kernel log, events and the PCIe bus ---------------------------------------------------

KernelKind = Literal[
    "xid",
    "sxid",
    "fallen_off_bus",
    "aer",
    "gsp",
    "driver_mismatch",
    "crash_dump",
    "other_nvrm",
    "noise",
]
AerSeverity = Literal["corrected", "nonfatal", "fatal"]


class KernelLine(NamedTuple):
    """What one kernel-log message says, as the parsers read it (pure data). A named tuple:
    a storm builds 100,000 of them, and a tuple is built in a quarter of the time."""

    kind: KernelKind
    code: int | None = None  # XID or SXid number
    pci: str | None = None  # the bus id as the line gives it ("0000:3b:00", "0000:3b:00.0")
    pid: int | None = None
    process: str | None = None
    aer_severity: AerSeverity | None = None
    text: str = ""  # the message without timestamp or syslog prefixes
    # Where on the die an Xid 13 happened, as its line names it ("(GPC 7, TPC 7, SM 0)";
    # older drivers name no SM); None where the line names none.
    gpc: int | None = None
    tpc: int | None = None
    sm: int | None = None


# "remediation": what the agent did itself (a GPU reset it ran).
EventSource = Literal["kmsg", "nvml", "nvml_operational", "udev", "drill", "dcgm", "remediation"]
# Kernel kinds, udev's, and a DCGM policy violation that has no XID of its own (PCIe,
# retired pages, thermal, power, NVLink; DCGM's DBE and XID notifications are XIDs).
# And a GPU reset seen or done (gpuagent.events.reset_event).
EventKind = (
    KernelKind
    | Literal[
        "gpu_removed", "gpu_added", "driver_unbound", "driver_bound", "dcgm_policy", "gpu_reset"
    ]
)


class GpuEvent(NamedTuple):
    """A fault or bus event the agent saw. ``event_id`` is stable across restarts and
    sources retries, so it can be de-duplicated end to end. A named tuple: a storm builds
    100,000 of them, and a frozen dataclass costs four times as much to build."""

    event_id: str
    source: EventSource
    kind: EventKind
    gpu: str | None  # canonical bus id ("0000:3b:00.0") when the event names a known device
    time: float  # wall clock of the event itself (for kmsg: boot time + the record's usec)
    # When it happened on the monotonic clock (the checks' time base): for kernel records
    # their own timestamp (the kernel stamps records on the boot-time clock), else arrival.
    monotonic: float
    pci: str | None = None  # the bus id as reported
    code: int | None = None
    line: str = ""  # the evidence: the raw kernel line, or a description
    pid: int | None = None
    process: str | None = None
    aer_severity: AerSeverity | None = None
    # Who was on the GPU when it happened (workload attribution): "pod ml/train-0
    # (trainer); job 42"; "" when attribution is off or nobody was known.
    workloads: str = ""
    # The kernel line's Xid 13 location (KernelLine.gpc, .tpc, .sm); None elsewhere.
    gpc: int | None = None
    tpc: int | None = None
    sm: int | None = None


PcieRole = Literal["gpu", "nvswitch", "bridge"]


@dataclass(frozen=True, slots=True)
class PcieLink:
    """One PCI function's link as sysfs shows it (speeds in GT/s, as sysfs writes them)."""

    address: str  # canonical bus id
    role: PcieRole
    current_speed_gts: float | None = None
    max_speed_gts: float | None = None
    current_width: int | None = None
    max_width: int | None = None
    aer_correctable: int | None = None  # totals from aer_dev_* (None: no AER reporting)
    aer_nonfatal: int | None = None
    aer_fatal: int | None = None


@dataclass(frozen=True, slots=True)
class PciePath:
    """A GPU (or NVSwitch) and every bridge above it, device first, root port last."""

    device: PcieLink
    bridges: tuple[PcieLink, ...] = ()


@dataclass(frozen=True, slots=True)
class IbPort:
    """One port of an RDMA device (InfiniBand, or RoCE on Ethernet) as sysfs shows it."""

    device: str  # "mlx5_0"
    port: int
    state_id: int | None = None  # `state`: 4 is ACTIVE (None: unreadable)
    state: str = ""
    phys_state_id: int | None = None  # `phys_state`: 5 is LinkUp
    phys_state: str = ""
    rate_gbps: float | None = None
    link_layer: str = ""  # "InfiniBand" or "Ethernet" (RoCE)
    # counters/ by file name (the data counters in bytes); hw_counters/ (the driver's).
    counters: tuple[tuple[str, int], ...] = ()
    hw_counters: tuple[tuple[str, int], ...] = ()

    @property
    def key(self) -> str:
        return f"{self.device}/{self.port}"

    @property
    def active(self) -> bool:
        return self.state_id == 4 and self.phys_state_id == 5

    def counter(self, name: str) -> int | None:
        return dict(self.counters).get(name)


@dataclass(frozen=True, slots=True)
class IbDevice:
    """An RDMA device under /sys/class/infiniband and its ports."""

    name: str
    hca_type: str = ""  # "MT4129" (ConnectX-7)
    board_id: str = ""
    firmware_version: str = ""
    pci_address: str | None = None  # the PCI function it is, when sysfs links one
    ports: tuple[IbPort, ...] = ()


@dataclass(frozen=True, slots=True)
class EventCount:
    """How many events of one kind (and code or AER severity) a device had since start."""

    gpu: str | None
    kind: EventKind
    code: int | None
    aer_severity: AerSeverity | None
    count: int
    last_time: float  # wall clock of the newest one


@dataclass(frozen=True, slots=True)
class KmsgCounters:
    records_read: int = 0
    records_lost: int = 0  # overwritten before we read them (EPIPE)
    lines_unparsed: int = 0  # malformed records


@dataclass(frozen=True, slots=True)
class RemediationStatus:
    mode: str  # "observe" or "enforce"
    paused: bool
    cordoned_by_us: bool = False
    # (action, result, count) since the agent started
    counts: tuple[tuple[str, str, int], ...] = ()
    # (action, scope, attempts left) of the node-wide budgets
    budgets: tuple[tuple[str, str, int], ...] = ()
    # (bus id, the limit before) of each GPU our thermal cap holds: the settings check's
    power_capped: tuple[tuple[str, float], ...] = ()
    # The latest plan, one entry per action, as the newest audit record of it says:
    # (action, target, result, reason, detail, count); observe mode's refusals read
    # "refused", and a cordon's reason is the one it would request.
    plan: tuple[tuple[str, str, str, str, str, int], ...] = ()


@dataclass(frozen=True, slots=True)
class MqttStatus:
    """The MQTT reporter's state, for metrics and status."""

    connected: bool
    connections: int = 0  # successful connects since start
    spool_depth: int = 0  # messages waiting to be sent or acknowledged
    spool_bytes: int = 0
    awaiting_ack: int = 0  # of those, sent and waiting for the aggregator's acknowledgement
    acknowledged: int = 0  # messages the aggregator acknowledged since start
    spool_dropped: int = 0  # dropped by the spool's bounds since start
    published: tuple[tuple[str, int], ...] = ()  # (channel, acknowledged publishes)
    refused: tuple[tuple[str, int], ...] = ()  # (channel, publishes the broker refused)
    commands: tuple[tuple[str, int], ...] = ()  # (command, received)
    rejected_commands: tuple[tuple[str, int], ...] = ()  # (reason, count)
    disconnects: tuple[tuple[str, int], ...] = ()  # (the broker's reason, count)
    # Why the spool cannot be opened or written (messages are held in memory), or "".
    spool_error: str = ""


@dataclass(frozen=True, slots=True)
class NodeHealth:
    findings: tuple[Finding, ...] = ()

    def for_gpu(self, pci_bus_id: str) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.gpu == pci_bus_id)

    def node_findings(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.gpu is None)

    def gpu_severity(self, pci_bus_id: str) -> Severity:
        return Severity.worst([f.severity for f in self.for_gpu(pci_bus_id)])

    @property
    def severity(self) -> Severity:
        return Severity.worst([f.severity for f in self.findings])

    def problems(self, pci_bus_id: str | None = None) -> tuple[Finding, ...]:
        """Non-OK findings, worst first; for one GPU, or all when ``pci_bus_id`` is None.
        Masked findings (a lost GPU's checks that cannot read it) are its availability
        finding's symptoms, not problems."""
        chosen = self.findings if pci_bus_id is None else self.for_gpu(pci_bus_id)
        bad = [f for f in chosen if f.severity is not Severity.OK and not f.masked]
        return tuple(sorted(bad, key=lambda f: -f.severity.rank))


@dataclass(frozen=True, slots=True)
class NodeSnapshot:
    """Everything outputs may show, from one moment. Replaced whole, never mutated."""

    node_name: str
    cluster: str
    hostname: str
    sequence: int
    taken_at: float  # wall clock
    nvml: NvmlStatus
    gpus: tuple[GpuState, ...] = ()
    health: NodeHealth = field(default_factory=NodeHealth)
    sources: tuple[SourceStatus, ...] = ()
    simulated: bool = False
    # Local API requests refused so far, by reason ("malformed", "oversized", ...).
    rejected_api_requests: tuple[tuple[str, int], ...] = ()
    # Recent events, oldest first (bounded by the event log's retention).
    events: tuple[GpuEvent, ...] = ()
    pcie: tuple[PciePath, ...] = ()
    # RDMA devices from sysfs; None: the sysfs source is off or could not list them.
    infiniband: tuple[IbDevice, ...] | None = None
    kmsg: KmsgCounters = field(default_factory=KmsgCounters)
    event_counts: tuple[EventCount, ...] = ()
    remediation: RemediationStatus | None = None
    mqtt: MqttStatus | None = None
    inventory: NodeInventory | None = None
    dcgm: DcgmStatus | None = None  # None: the DCGM source is not configured
    diag: tuple[DiagResult, ...] = ()  # the latest diagnostic of each level, oldest first
    # Workload attribution's labels on the DCGM_FI_DEV_* series (pod, namespace, container,
    # hpc_job: the Workload fields of that name); empty when attribution is off.
    attribution_labels: tuple[str, ...] = ()
    # [agent] labels: where the node sits (rack, leaf switch, power feed), sorted by name.
    location_labels: tuple[tuple[str, str], ...] = ()

    def gpu(self, pci_bus_id: str) -> GpuState | None:
        return next((g for g in self.gpus if g.identity.pci_bus_id == pci_bus_id), None)
