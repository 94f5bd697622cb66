"""The state of one simulated GPU: identity, modes, counters and fault state.

Counters and modes are plain attributes that faults, setters and resets change; what
follows the load (utilization, power, heat, clocks) is `readings`. Counters that grow
with time (energy, throttle durations) are integrated: `settle` accounts them up to a
time, and is called before anything that changes the GPU's load or limits, and on read.
Callers hold the node lock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

import pynvml

from gpuagent.sim import codes, hardware
from gpuagent.sim.hardware import BoardIdentity
from gpuagent.sim.infiniband import SimHca
from gpuagent.sim.profiles import GpuProfile, MigProfile
from gpuagent.sim.readings import LiveReadings, Readings

if TYPE_CHECKING:
    from gpuagent.smi.model import CapturedGpu

_T = TypeVar("_T")

# The driver releases that brought what the simulator answers (its assumptions; see
# docs/simulation.md): the *_TLIMIT fields and the margin temperature from R535, the
# per-reason throttle-duration fields (ids 269-271) from R550.
TLIMIT_DRIVER_MAJOR = 535
THROTTLE_REASON_FIELDS_DRIVER_MAJOR = 550

# What each throttle-duration counter counts: the clock event reasons that make it grow
# (0: a cause the simulator never raises, so the counter stays at 0).
VIOLATION_REASONS: dict[str, int] = {
    "power": codes.REASON_SW_POWER_CAP,
    "thermal": codes.REASON_SW_THERMAL | codes.REASON_HW_THERMAL,
    "sync_boost": codes.REASON_SYNC_BOOST,
    "board_limit": 0,
    "low_utilization": codes.REASON_GPU_IDLE,
    "reliability": 0,
    "sw_thermal": codes.REASON_SW_THERMAL,
    "hw_thermal": codes.REASON_HW_THERMAL,
    "power_brake": codes.REASON_POWER_BRAKE,
}
_NS_PER_SECOND = 1_000_000_000

# Recovery actions a GPU reset completes (reset, drain P2P, drain and reset, bus reset);
# a reboot or an IMEX domain recovery is not done by resetting the GPU.
_CLEARED_BY_RESET = frozenset(
    {
        pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET,
        pynvml.NVML_GPU_RECOVERY_ACTION_DRAIN_P2P,
        pynvml.NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET,
        pynvml.NVML_GPU_RECOVERY_ACTION_BUS_RESET,
    }
)


@dataclass(slots=True)
class SimProcess:
    pid: int
    name: str
    used_bytes: int
    uid: int = 0
    job: int = 0  # the Slurm job it runs in (its cgroup says so); 0: none
    # False: gone from the process table while NVML still lists it (`process_gone`).
    alive: bool = True
    # True: holds its memory but makes no progress, so it adds no load (`hung`).
    hung: bool = False


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a GPU physically sits, as nvmlDeviceGetPlatformInfo (v2) reports it."""

    chassis_serial: bytes = b""
    slot_number: int = 0
    tray_index: int = 0
    host_id: int = 0
    peer_type: int = hardware.PEER_TYPE_SWITCH_CONNECTED
    module_id: int = 0


# The C2C error counters, as the fault and the field readers name them.
C2C_COUNTERS = ("crc", "replay", "replay_b2b")


@dataclass(slots=True)
class SimGpuInstance:
    """A MIG GPU instance; NVML hands out a pointer to ``handle``, and a pointer to
    ``device`` for the MIG device of its one compute instance."""

    profile: MigProfile
    handle: pynvml.struct_c_nvmlGpuInstance_t
    device: pynvml.struct_c_nvmlDevice_t = field(default_factory=pynvml.struct_c_nvmlDevice_t)


def make_instances(profile: GpuProfile, names: tuple[str, ...]) -> list[SimGpuInstance]:
    found = [profile.mig_profile(name) for name in names]
    return [SimGpuInstance(p, pynvml.struct_c_nvmlGpuInstance_t()) for p in found if p]


class SimGpu:
    """One GPU of model ``profile``."""

    def __init__(
        self,
        board: BoardIdentity,
        *,
        profile: GpuProfile,
        name: str,
        driver_major: int,
        nvlinks: int,
        ecc: bool,
        persistence: bool,
        mig_mode: bool,
        mig_profiles: tuple[str, ...] = (),
        compute_mode: int = codes.COMPUTE_MODES["default"],
    ) -> None:
        self.board = board
        self.profile = profile
        self.index = board.index
        self.name = name.encode()
        self.uuid = board.uuid.encode()
        self.serial = board.serial.encode()
        self.bus_id = board.bus_id.encode()
        self.bus_id_legacy = board.bus_id_legacy.encode()
        # The handle NVML hands out points at this struct; its address identifies the GPU.
        self.device = pynvml.struct_c_nvmlDevice_t()
        self.handle = pynvml.c_nvmlDevice_t(self.device)
        self.nvlinks = nvlinks
        self.default_persistence = persistence
        self.driver_major = driver_major
        self.tlimit_fields = profile.tlimit_fields and driver_major >= TLIMIT_DRIVER_MAJOR
        self.throttle_reason_fields = (
            profile.violation_counters and driver_major >= THROTTLE_REASON_FIELDS_DRIVER_MAJOR
        )

        self.ecc_enabled = ecc
        self.persistence = persistence
        self.mig_mode = mig_mode
        # Mode changes wait for the next reset, as on a real GPU.
        self.ecc_pending = ecc
        self.mig_pending = mig_mode
        # The GPU instances MIG mode carries at start (and after `clear`).
        self.default_mig_profiles = mig_profiles
        self.mig_instances = make_instances(profile, mig_profiles) if mig_mode else []
        self._init_settings(compute_mode)
        # The capture this GPU replays (gpuagent.sim.replay); None in a simulation.
        self.captured: CapturedGpu | None = None
        # nvmlGpuFabricState_t and the registration's nvmlReturn_t (NVSwitch systems).
        self.fabric_state = codes.FABRIC_STATE_NOT_SUPPORTED
        self.fabric_status = codes.SUCCESS
        # What the fabric's health mask reports, by condition (model.FABRIC_CONDITIONS);
        # empty: nothing supported, as an R580 H200 answers fabric info v3.
        self.fabric_health: dict[str, bool] = {}
        # The NVLink domain the fabric info names: cluster UUID (16 bytes) and clique id.
        # No fault changes them, so `clear` has nothing to put back.
        self.fabric_cluster_uuid = bytes(hardware.FABRIC_UUID_LEN)
        self.fabric_clique_id = 0
        # nvmlDeviceGetPlatformInfo's answer; None: NOT_SUPPORTED.
        self.platform: Placement | None = None

        self._init_counters()
        # The highest generation the link can train to (a `pcie_degrade` lowers it).
        self.pcie_generation_limit = profile.pcie_max_generation
        self.pcie_width = profile.pcie_max_width
        self.nvlink_up = [True] * nvlinks

        self.temperature_override: float | None = None
        self.throttle_reasons = 0
        self.lost = False
        # Listed in the simulated PCI tree (host facts); `pci_remove` takes it off.
        self.on_pci_bus = True
        self.hang_until = 0.0  # elapsed seconds; calls before this block
        self.processes: dict[int, SimProcess] = {}
        # When the load last started or stopped, and whether the GPU was busy before: the
        # power average still holds the old load for a second.
        self.load_step = (0.0, False)
        # Memory held with no process (a leaked context, `memory_leak`); a reset frees it.
        self.leaked_bytes = 0
        # The RDMA port beside this GPU (shown only when the node has `ib_hcas`).
        self.hca = SimHca()
        # The Kubernetes GPU stack's view (`cdi_stale`, `device_plugin_down`).
        self.in_cdi_spec = True
        self.device_plugin_down = False
        # Node-wide services gone wrong (`fabric_manager`), kept on this GPU until `clear`:
        # unit name → "down" | "flapping".
        self.service_faults: dict[str, str] = {}

        self.readings: Readings = LiveReadings(self)
        self.energy_mj = float(board.initial_energy_mj)
        self.violation_ns = dict.fromkeys(VIOLATION_REASONS, 0)
        self.settled_at = 0.0

    def _init_settings(self, compute_mode: int) -> None:
        """The settings of a new GPU: its model's, and the node's compute mode."""
        profile = self.profile
        # The limit asked for (nvmlDeviceGetPowerManagementLimit) and the one enforced: the
        # request up to what the platform allows (``power_ceiling_mw``; None: nothing more,
        # so the two are equal). A GH200 module sharing its power holds the enforced one
        # below the request.
        self.power_ceiling_mw: int | None = None
        self.set_power_limit(round(profile.power_default_limit_w * 1000))
        self.applications_clock_mhz = profile.applications_clock_mhz
        # nvmlComputeMode_t; None: not reported (a capture's N/A).
        self.compute_mode: int | None = compute_mode
        # The ECC mode the board ships with; None where it has no ECC mode.
        self.ecc_default: bool | None = profile.ecc_default if profile.ecc else None

    def _init_counters(self) -> None:
        """The error counters of a new GPU: all zero, nothing pending."""
        self.ecc_sbe_volatile = 0
        self.ecc_dbe_volatile = 0
        self.ecc_sbe_aggregate = 0
        self.ecc_dbe_aggregate = 0
        self.retired_sbe = 0
        self.retired_dbe = 0
        self.retired_pending = False
        self.remapped_correctable = 0
        self.remapped_uncorrectable = 0
        self.remap_pending = False
        self.remap_failure = False
        # Banks by remapping resources left: max, high, partial, low, none (InfoROM).
        self.remap_histogram = [self.profile.remap_banks, 0, 0, 0, 0]
        # nvmlDeviceGpuRecoveryAction_t (model.RECOVERY_ACTIONS), the (channel, TPC) repairs
        # pending and the unrepairable-memory flag; None: the driver does not report it
        # (a capture from a driver without them).
        self.recovery_action: int | None = 0
        self.repair_pending: tuple[bool, bool] | None = (False, False)
        self.unrepairable_memory: bool | None = False
        self.pcie_replays = 0
        self.nvlink_crc_flit = [0] * self.nvlinks
        self.nvlink_crc_data = [0] * self.nvlinks
        self.nvlink_replay = [0] * self.nvlinks
        self.nvlink_recovery = [0] * self.nvlinks
        # NVLink-C2C links to the CPU (Grace-Blackwell): each link's CRC, replay and
        # back-to-back replay error counters (`c2c_errors`), since the driver loaded.
        self.c2c_errors = {counter: [0] * self.profile.c2c_links for counter in C2C_COUNTERS}
        # Bit-error rates each link measures (`nvlink_ber`): effective (after FEC), symbol.
        self.nvlink_effective_ber = [0.0] * self.nvlinks
        self.nvlink_symbol_ber = [0.0] * self.nvlinks

    # --- what the model has -------------------------------------------------------------

    def reports(self, printed: Callable[[CapturedGpu], object]) -> bool:
        """Whether the GPU reports a value at all: always in a simulation; in a replay only
        where its capture printed it (``printed`` of the capture is not None). What a
        capture shows as N/A NVML answers NOT_SUPPORTED, whatever the profile holds."""
        return self.captured is None or printed(self.captured) is not None

    def fixed(self, live: _T, printed: Callable[[CapturedGpu], _T | None]) -> _T | None:
        """A value of the board that does not move (a limit, a maximum, a version): the
        model's ``live`` one in a simulation; in a replay the capture's, None where it
        shows N/A (the profile's value, which fills that gap for the live model, is never
        answered)."""
        return live if self.captured is None else printed(self.captured)

    def remapped_rows_supported(self) -> bool:
        profile = self.profile
        return profile.row_remapping and (profile.row_remapping_under_mig or not self.mig_mode)

    def mig_device_count(self) -> int:
        """nvmlDeviceGetMaxMigDeviceCount: as many MIG devices as the smallest profile's
        instances fit (7 on an A100 or H100)."""
        return max((p.max_instances for p in self.profile.mig_profiles), default=0)

    def gpu_instance_id(self, instance: SimGpuInstance) -> int:
        """The GPU instance id NVML reports: 1, 2, ... in creation order."""
        return self.mig_instances.index(instance) + 1

    def mig_device_uuid(self, instance: SimGpuInstance) -> bytes:
        gi = self.gpu_instance_id(instance)
        return hardware.mig_device_uuid(self.board.uuid, gi, hardware.COMPUTE_INSTANCE_ID).encode()

    def retired_pages_supported(self) -> bool:
        # Page retirement needs ECC on, as nvidia-smi's N/A with ECC off shows.
        return self.profile.retired_pages and self.ecc_enabled

    # --- integrated counters -------------------------------------------------------------

    def settle(self, now: float) -> None:
        """Account energy and throttle durations up to ``now`` at the current state."""
        if now <= self.settled_at:
            return
        seconds = now - self.settled_at
        # What the GPU draws: its instantaneous power, else (a replay of an older driver's
        # capture) the power it reports; nothing where it reports none.
        drawn = self.readings.power_mw(now) or self.readings.power_usage_mw(now) or 0
        self.energy_mj += drawn * seconds  # mW x s = mJ
        reasons = self.readings.clock_event_reasons(now) or 0
        nanoseconds = round(seconds * _NS_PER_SECOND)
        for name, mask in VIOLATION_REASONS.items():
            if reasons & mask:
                self.violation_ns[name] += nanoseconds
        self.settled_at = now

    def energy_mj_at(self, now: float) -> int:
        """Energy since the driver loaded: integrates power over time, never decreases."""
        self.settle(now)
        return int(self.energy_mj)

    def violation_ns_at(self, now: float, name: str) -> int:
        """Nanoseconds the clocks were held back for ``name`` (see VIOLATION_REASONS)."""
        self.settle(now)
        return self.violation_ns[name]

    # --- power --------------------------------------------------------------------------

    def set_power_limit(self, milliwatts: int) -> None:
        """What setting the power limit does: it is the request, and the enforced limit
        follows it up to the ceiling."""
        self.power_requested_limit_mw = milliwatts
        ceiling = self.power_ceiling_mw
        self.power_limit_mw = milliwatts if ceiling is None else min(milliwatts, ceiling)

    # --- memory -----------------------------------------------------------------------

    def memory_used_bytes(self) -> int:
        used = self.leaked_bytes + sum(p.used_bytes for p in self.processes.values())
        usable = self.profile.memory_total_mib - self.profile.memory_reserved_mib
        return min(used, usable * hardware.MIB)

    # --- recovery ---------------------------------------------------------------------

    def reset(self) -> None:
        """What a GPU reset does: volatile counters cleared, pending repairs applied."""
        self.ecc_sbe_volatile = 0
        self.ecc_dbe_volatile = 0
        self.retired_pending = False
        self.remap_pending = False
        if self.recovery_action in _CLEARED_BY_RESET:
            self.recovery_action = 0
        if self.repair_pending is not None:
            self.repair_pending = (False, False)  # applied by the reset
        self.hang_until = 0.0
        self.leaked_bytes = 0
        self.ecc_enabled = self.ecc_pending
        self.mig_mode = self.mig_pending
        # GPU instances do not survive a reset; they are created again by whoever owns them.
        self.mig_instances = []

    def clear(self) -> None:
        """Back to healthy: every fault condition removed, lifetime counters kept."""
        self.reset()
        self.lost = False
        self.on_pci_bus = True
        self.remap_failure = False
        if self.recovery_action is not None:
            self.recovery_action = 0  # `clear` stands for a reboot: nothing left pending
        if self.unrepairable_memory is not None:
            self.unrepairable_memory = False
        self.fabric_health = dict.fromkeys(self.fabric_health, False)
        self.temperature_override = None
        self.throttle_reasons = 0
        self.pcie_generation_limit = self.profile.pcie_max_generation
        self.pcie_width = self.profile.pcie_max_width
        self.persistence = self.default_persistence
        self.applications_clock_mhz = self.profile.applications_clock_mhz
        self.set_power_limit(round(self.profile.power_default_limit_w * 1000))
        self.ecc_pending = self.ecc_enabled
        self.mig_pending = self.mig_mode
        self.mig_instances = (
            make_instances(self.profile, self.default_mig_profiles) if self.mig_mode else []
        )
        self.nvlink_up = [True] * self.nvlinks
        self.nvlink_effective_ber = [0.0] * self.nvlinks
        self.nvlink_symbol_ber = [0.0] * self.nvlinks
        self.processes.clear()
        self.hca.clear()
        self.in_cdi_spec = True
        self.device_plugin_down = False
        self.service_faults.clear()
