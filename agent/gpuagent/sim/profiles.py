"""GPU models: what one model of GPU reports, and which NVML values it has at all.

A `GpuProfile` is plain data, so a profile can be built in code (for example from an
`nvidia-smi -q` capture) as well as taken from the table in `gpuagent.sim.catalog`.
Everything the simulator answers that depends on the GPU model comes from the GPU's
profile; `gpuagent.sim.hardware` keeps what is the same on every model.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuagent.model import ZERO_UUID

# (bus, device) of a GPU's PCI function 0 in domain 0, as NVML's "00000000:BB:DD.0".
PciSlot = tuple[int, int]


def on_buses(*buses: int) -> tuple[PciSlot, ...]:
    """Slots with one GPU per bus, as device 0: how servers place GPUs behind switches."""
    return tuple((bus, 0) for bus in buses)


@dataclass(frozen=True, slots=True)
class MigProfile:
    """A GPU-instance profile, as `nvidia-smi mig -lgip` lists it."""

    name: str
    index: int  # NVML_GPU_INSTANCE_PROFILE_*: what the profile info call takes
    profile_id: int  # what nvmlDeviceGetGpuInstances takes
    slices: int
    max_instances: int
    memory_mib: int


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuProfile:
    """One GPU model: identity, limits, idle and busy behaviour, and what it supports.

    Power and temperature follow the load: at idle the GPU draws ``power_idle_w`` and sits
    near ``temperature_idle_c``; busy, it asks for up to ``power_full_w`` (at 100 %
    utilization; more than the power limit makes the driver cap it) and warms linearly
    with the power drawn, reaching ``temperature_at_limit_c`` at the default power limit.
    """

    key: str  # what a scenario's `[node] model` may name, e.g. "h100-sxm"
    name: str  # nvmlDeviceGetName
    aliases: tuple[str, ...] = ()  # other names the same model reports (older drivers)
    architecture: str
    pci_device_id: int  # 0x233010DE: device id in the high half, vendor in the low
    pci_subsystem_id: int
    vbios_version: str
    inforom_version: str

    memory_total_mib: int
    memory_reserved_mib: int

    power_default_limit_w: float
    power_min_limit_w: float
    power_max_limit_w: float
    power_idle_w: float
    power_full_w: float

    temperature_idle_c: float
    temperature_at_limit_c: float
    # HBM reports its own temperature, a few degrees off the GPU's; GDDR parts have no
    # sensor (None: the memory temperature and its threshold are N/A).
    memory_temperature_offset_c: float | None
    temperature_shutdown_c: int
    temperature_slowdown_c: int
    temperature_gpu_max_c: int  # max operating temperature: the T.Limit point
    temperature_memory_max_c: int | None
    # Whether NVML answers the *_TLIMIT fields and the margin temperature (Hopper and Ada,
    # with a driver new enough: see gpu.TLIMIT_DRIVER_MAJOR).
    tlimit_fields: bool

    sm_clock_idle_mhz: int
    sm_clock_max_mhz: int
    sm_clock_power_capped_mhz: int  # where the SW power cap holds a busy GPU
    sm_clock_slowdown_mhz: int  # thermal or HW slowdown
    sm_clock_brake_mhz: int  # HW power brake: the clocks drop to the floor
    memory_clock_idle_mhz: int  # GDDR clocks down at idle; HBM stays at its clock
    memory_clock_max_mhz: int
    video_clock_idle_mhz: int
    video_clock_max_mhz: int
    # The default graphics applications clock; None: GeForce boards have no applications
    # clocks (nvidia-smi shows N/A, NVML answers NOT_SUPPORTED).
    applications_clock_mhz: int | None

    pcie_max_generation: int
    pcie_max_width: int
    # The generation the link trains down to at idle; None: it stays at the maximum.
    pcie_idle_generation: int | None

    # NVLinks per GPU on the model's multi-GPU board (18 on HGX and NVL72); a one-GPU node
    # has none unless its scenario says (scenario.default_nvlinks).
    nvlinks: int
    buses: tuple[PciSlot, ...]  # where 1..len(buses) GPUs sit, in NVML (bus) order
    wide_buses: tuple[PciSlot, ...] = ()  # the layout of nodes with more GPUs than that
    # NVSwitch PCI device id on this model's baseboard; None: no NVSwitch system.
    nvswitch_device_id: int | None = None

    mig_profiles: tuple[MigProfile, ...] = ()  # empty: no MIG
    mig_slices: int = 7
    mig_sms_per_slice: int = 0

    idle_pstate: int
    busy_pstate: int

    ecc: bool  # ECC mode exists (False: nvidia-smi shows ECC mode N/A)
    ecc_default: bool  # the mode the board ships with
    retired_pages: bool  # dynamic page retirement (Volta); later GPUs remap rows instead
    row_remapping: bool
    # A100 with MIG on shows remapped rows as N/A.
    row_remapping_under_mig: bool = True
    # Memory banks the row remapper tracks (its availability histogram's total): 2560 on
    # the H100 captures, 3072 on the H200's, 3840 B200, 3968 GB200, 5952 GB300, 192 on the
    # A10, A10G and RTX 4090 ones.
    remap_banks: int = 2560
    gsp_firmware: bool  # GSP firmware runs by default on this model with its drivers
    fabric: bool  # nvmlDeviceGetGpuFabricInfo (NVSwitch fabric, Hopper and later)
    # The NVLink domain the fabric info names when the scenario does not (the model's
    # capture's): its cluster UUID ("8-4-4-4-12" hex) and clique id. All zeros is what NVML
    # answers for a GPU no fabric manager has placed in a cluster.
    fabric_cluster_uuid: str = ZERO_UUID
    fabric_clique_id: int = 0
    # nvmlDeviceGetPlatformInfo (the chassis, slot, tray and host a GPU sits in): answered
    # on the rack-scale Blackwell systems only; NOT_SUPPORTED elsewhere.
    platform_info: bool = False
    # NVLink-C2C links to the Grace CPU (Grace-Blackwell superchips; NVML fields 170-171,
    # 231-233). The captures show "C2C Mode: Enabled" but no count: one link is assumed.
    c2c_links: int = 0
    # A Grace-Blackwell module's power beside its GPU's (NVML's power fields at scope
    # NVML_POWER_SCOPE_MODULE, "Module Power Readings"): the module draws the GPU's power
    # plus this (the Grace CPU's share, its memory, C2C), under this limit. None: no module
    # power (NOT_SUPPORTED; nvidia-smi shows N/A, as on the B200 and H100 captures).
    module_power_extra_w: float | None = None
    module_power_limit_w: float | None = None
    # nvmlDeviceGetViolationStatus and the throttle-duration fields: NVML gives them on
    # "fully supported" products (data-centre, workstation, Titan), not on GeForce.
    violation_counters: bool
    codec_utilization: bool = True  # encoder/decoder utilization
    serial_number: bool = True  # GeForce boards report no serial number (N/A)
    brand: int = 14  # nvmlDeviceGetBrand: NVML_BRAND_NVIDIA ("Product Brand : NVIDIA")
    # Fan speed in percent at idle and at the default power limit; None: no fan reading
    # (boards cooled by the chassis report N/A; some passive boards report 0 %).
    fan_idle_pct: int | None = None
    fan_busy_pct: int = 0

    @property
    def max_gpus(self) -> int:
        return max(len(self.buses), len(self.wide_buses))

    def slots(self, gpus: int) -> tuple[PciSlot, ...]:
        """Where ``gpus`` GPUs of this model sit; ValueError past the layouts."""
        if gpus <= len(self.buses):
            return self.buses[:gpus]
        if gpus <= len(self.wide_buses):
            return self.wide_buses[:gpus]
        raise ValueError(f"{self.key}: no layout for {gpus} GPUs (at most {self.max_gpus})")

    @property
    def mig(self) -> bool:
        return bool(self.mig_profiles)

    @property
    def mig_profile_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.mig_profiles)

    def mig_profile(self, name: str) -> MigProfile | None:
        return next((p for p in self.mig_profiles if p.name == name), None)

    def mig_by_index(self, index: int) -> MigProfile | None:
        return next((p for p in self.mig_profiles if p.index == index), None)

    def mig_by_id(self, profile_id: int) -> MigProfile | None:
        return next((p for p in self.mig_profiles if p.profile_id == profile_id), None)

    def mig_layout_problem(self, profiles: list[str] | tuple[str, ...]) -> str | None:
        """Why these GPU instances cannot share one GPU, or None when they can.

        Counted by slices and by each profile's instance limit (placement is not modelled).
        """
        if not profiles:
            return None
        if not self.mig:
            return f"the {self.name} has no MIG"
        unknown = [name for name in profiles if self.mig_profile(name) is None]
        if unknown:
            known = ", ".join(self.mig_profile_names)
            return f"unknown profile {unknown[0]!r} (known: {known})"
        slices = 0
        for name in dict.fromkeys(profiles):
            spec = self.mig_profile(name)
            assert spec is not None  # every name was found above
            if profiles.count(name) > spec.max_instances:
                return f"at most {spec.max_instances} {name} instances fit on one GPU"
            slices += spec.slices * profiles.count(name)
        if slices > self.mig_slices:
            return f"{slices} slices do not fit on one GPU of {self.mig_slices}"
        return None
