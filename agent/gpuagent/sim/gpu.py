"""The state of one simulated GPU and the readings derived from it.

Readings that real hardware varies continuously (load, power, temperature) are pure
functions of the elapsed time, so a scenario replays identically; counters and modes are
plain attributes that faults, setters and resets change. Callers hold the node lock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pynvml

from gpuagent.sim import codes, hardware
from gpuagent.sim.hardware import BoardIdentity

_TWO_PI = 2.0 * math.pi
_SLOWDOWN_REASONS = (
    codes.REASON_HW_SLOWDOWN
    | codes.REASON_HW_THERMAL
    | codes.REASON_SW_THERMAL
    | codes.REASON_POWER_BRAKE
)


@dataclass(slots=True)
class SimProcess:
    pid: int
    name: str
    used_bytes: int


@dataclass(slots=True)
class SimGpuInstance:
    """A MIG GPU instance; NVML hands out a pointer to ``handle``."""

    profile: hardware.MigProfile
    handle: pynvml.struct_c_nvmlGpuInstance_t


def make_instances(profiles: tuple[str, ...]) -> list[SimGpuInstance]:
    by_name = {p.name: p for p in hardware.MIG_PROFILES}
    return [SimGpuInstance(by_name[n], pynvml.struct_c_nvmlGpuInstance_t()) for n in profiles]


class SimGpu:
    """One GPU: identity, modes, counters and fault state."""

    def __init__(
        self,
        board: BoardIdentity,
        *,
        model: str,
        nvlinks: int,
        ecc: bool,
        persistence: bool,
        mig_mode: bool,
        mig_profiles: tuple[str, ...] = (),
    ) -> None:
        self.board = board
        self.index = board.index
        self.name = model.encode()
        self.uuid = board.uuid.encode()
        self.serial = board.serial.encode()
        self.bus_id = board.bus_id.encode()
        self.bus_id_legacy = board.bus_id_legacy.encode()
        # The handle NVML hands out points at this struct; its address identifies the GPU.
        self.device = pynvml.struct_c_nvmlDevice_t()
        self.handle = pynvml.c_nvmlDevice_t(self.device)
        self.nvlinks = nvlinks
        self.default_persistence = persistence

        self.ecc_enabled = ecc
        self.persistence = persistence
        self.mig_mode = mig_mode
        # Mode changes wait for the next reset, as on a real GPU.
        self.ecc_pending = ecc
        self.mig_pending = mig_mode
        # The GPU instances MIG mode carries at start (and after `clear`).
        self.default_mig_profiles = mig_profiles
        self.mig_instances = make_instances(mig_profiles) if mig_mode else []
        self.power_limit_mw = hardware.POWER_DEFAULT_LIMIT_MW
        self.applications_clock_mhz = hardware.APPLICATIONS_CLOCK_DEFAULT_MHZ
        # nvmlGpuFabricState_t and the registration's nvmlReturn_t (NVSwitch systems).
        self.fabric_state = codes.FABRIC_STATE_NOT_SUPPORTED
        self.fabric_status = codes.SUCCESS

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
        self.pcie_generation = hardware.PCIE_MAX_GENERATION
        self.pcie_width = hardware.PCIE_MAX_WIDTH
        self.pcie_replays = 0
        self.nvlink_up = [True] * nvlinks
        self.nvlink_crc_flit = [0] * nvlinks
        self.nvlink_crc_data = [0] * nvlinks
        self.nvlink_replay = [0] * nvlinks
        self.nvlink_recovery = [0] * nvlinks

        self.temperature_override: float | None = None
        self.throttle_reasons = 0
        self.lost = False
        # Listed in the simulated PCI tree (host facts); `pci_remove` takes it off.
        self.on_pci_bus = True
        self.hang_until = 0.0  # elapsed seconds; calls before this block
        self.processes: dict[int, SimProcess] = {}

        self.energy_mj = float(board.initial_energy_mj)
        self.energy_at = 0.0

    # --- continuous readings ----------------------------------------------------------

    def utilization(self, now: float) -> float:
        """GPU utilization percent: a light background load, busy while processes run."""
        wave = math.sin(_TWO_PI * now / hardware.LOAD_PERIOD_SECONDS + self.board.phase)
        if self.processes:
            return 88.0 + 8.0 * wave
        return self.board.base_utilization + 10.0 * wave

    def memory_utilization(self, now: float) -> float:
        return self.utilization(now) * 0.45

    def power_demand_mw(self, now: float) -> float:
        return hardware.POWER_IDLE_MW + self.utilization(now) * hardware.POWER_PER_UTIL_PCT_MW

    def power_mw(self, now: float) -> int:
        return int(min(self.power_demand_mw(now), self.power_limit_mw))

    def temperature(self, now: float) -> float:
        if self.temperature_override is not None:
            return self.temperature_override
        return 27.0 + self.power_mw(now) * 0.000055 + self.board.temperature_offset

    def memory_temperature(self, now: float) -> float:
        return self.temperature(now) + hardware.MEMORY_TEMPERATURE_OFFSET_C

    def clock_event_reasons(self, now: float) -> int:
        """Injected reasons plus those the GPU would raise itself at this heat and power."""
        reasons = self.throttle_reasons
        if self.applications_clock_mhz != hardware.APPLICATIONS_CLOCK_DEFAULT_MHZ:
            reasons |= codes.REASON_APPLICATIONS_CLOCKS
        temperature = self.temperature(now)
        if temperature >= hardware.TEMPERATURE_GPU_MAX_C:
            reasons |= codes.REASON_SW_THERMAL
        if temperature >= hardware.TEMPERATURE_SLOWDOWN_C:
            reasons |= codes.REASON_HW_SLOWDOWN | codes.REASON_HW_THERMAL
        if self.power_demand_mw(now) > self.power_limit_mw:
            reasons |= codes.REASON_SW_POWER_CAP
        return reasons

    def sm_clock_mhz(self, now: float) -> int:
        reasons = self.clock_event_reasons(now)
        if reasons & _SLOWDOWN_REASONS:
            return hardware.SM_CLOCK_SLOWDOWN_MHZ
        if reasons & codes.REASON_SW_POWER_CAP:
            return hardware.SM_CLOCK_POWER_CAPPED_MHZ
        if reasons & codes.REASON_GPU_IDLE:
            return hardware.SM_CLOCK_IDLE_MHZ
        return hardware.SM_CLOCK_MAX_MHZ

    def energy_mj_at(self, now: float) -> int:
        """Energy since the driver loaded: integrates power over time, never decreases."""
        self.settle_energy(now)
        return int(self.energy_mj)

    def settle_energy(self, now: float) -> None:
        """Account energy up to ``now``; call before anything that changes the power draw."""
        if now > self.energy_at:
            self.energy_mj += self.power_mw(now) * (now - self.energy_at)  # mW x s = mJ
            self.energy_at = now

    # --- memory -----------------------------------------------------------------------

    def memory_used_bytes(self) -> int:
        used = sum(p.used_bytes for p in self.processes.values())
        return min(used, (hardware.MEMORY_TOTAL_MIB - hardware.MEMORY_RESERVED_MIB) * hardware.MIB)

    # --- recovery ---------------------------------------------------------------------

    def reset(self) -> None:
        """What a GPU reset does: volatile counters cleared, pending repairs applied."""
        self.ecc_sbe_volatile = 0
        self.ecc_dbe_volatile = 0
        self.retired_pending = False
        self.remap_pending = False
        self.hang_until = 0.0
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
        self.temperature_override = None
        self.throttle_reasons = 0
        self.pcie_generation = hardware.PCIE_MAX_GENERATION
        self.pcie_width = hardware.PCIE_MAX_WIDTH
        self.persistence = self.default_persistence
        self.applications_clock_mhz = hardware.APPLICATIONS_CLOCK_DEFAULT_MHZ
        self.power_limit_mw = hardware.POWER_DEFAULT_LIMIT_MW
        self.ecc_pending = self.ecc_enabled
        self.mig_pending = self.mig_mode
        self.mig_instances = make_instances(self.default_mig_profiles) if self.mig_mode else []
        self.nvlink_up = [True] * self.nvlinks
        self.processes.clear()
