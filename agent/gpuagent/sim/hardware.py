"""What an 8x H100 SXM (HGX) node reports when nothing is wrong.

Values follow `nvidia-smi -q` on such a node; identities (UUID, serial) are derived from
the scenario seed and GPU index so every run of a scenario shows the same GPUs.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass

from gpuagent.sim import codes

# The eight GPU bus numbers of an HGX H100 baseboard, in NVML (bus) order.
HGX_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
# Nodes with more than eight GPUs use a 16-slot layout: two GPUs behind each switch pair.
WIDE_BUSES = (
    0x18, 0x1B, 0x2A, 0x2D, 0x3A, 0x3D, 0x5D, 0x60,
    0x9A, 0x9D, 0xAB, 0xAE, 0xBA, 0xBD, 0xDB, 0xDE,
)  # fmt: skip
MAX_GPUS = len(WIDE_BUSES)
MAX_NVLINKS = 18

PCI_DEVICE_ID = 0x233010DE  # H100 SXM5 80GB
PCI_SUBSYSTEM_ID = 0x16C110DE
VBIOS_VERSION = "96.00.99.00.01"
INFOROM_VERSION = "G520.0200.00.05"
APPLICATIONS_CLOCK_DEFAULT_MHZ = 1980
# NVSwitches of an HGX H100 baseboard (PCI class 0x068000, device 0x22a3), by bus number.
NVSWITCH_BUSES = (0x05, 0x06, 0x07, 0x08)
NVSWITCH_DEVICE_ID = 0x22A3

MIB = 1024 * 1024
MEMORY_TOTAL_MIB = 81559
MEMORY_RESERVED_MIB = 527

POWER_DEFAULT_LIMIT_MW = 700_000
POWER_MIN_LIMIT_MW = 200_000
POWER_MAX_LIMIT_MW = 700_000
POWER_IDLE_MW = 70_000
POWER_PER_UTIL_PCT_MW = 4_300  # ~500 W between idle and fully busy

TEMPERATURE_SHUTDOWN_C = 92
TEMPERATURE_SLOWDOWN_C = 87
TEMPERATURE_GPU_MAX_C = 85
TEMPERATURE_MEM_MAX_C = 95
MEMORY_TEMPERATURE_OFFSET_C = 6  # HBM runs a few degrees above the GPU die

SM_CLOCK_MAX_MHZ = 1980
SM_CLOCK_POWER_CAPPED_MHZ = 1665
SM_CLOCK_SLOWDOWN_MHZ = 1095
SM_CLOCK_IDLE_MHZ = 345
MEMORY_CLOCK_MHZ = 2619
VIDEO_CLOCK_MAX_MHZ = 1755

PCIE_MAX_GENERATION = 5
PCIE_MAX_WIDTH = 16
PCIE_WIDTHS = (1, 2, 4, 8, 16)


@dataclass(frozen=True, slots=True)
class MigProfile:
    """A GPU-instance profile of the H100 80GB, as `nvidia-smi mig -lgip` lists it."""

    name: str
    index: int  # NVML_GPU_INSTANCE_PROFILE_*: what the profile info call takes
    profile_id: int  # what nvmlDeviceGetGpuInstances takes
    slices: int
    max_instances: int
    memory_mib: int


MIG_PROFILES = (
    MigProfile("1g.10gb", codes.GPU_INSTANCE_PROFILE_1_SLICE, 19, 1, 7, 9984),
    MigProfile("1g.10gb+me", codes.GPU_INSTANCE_PROFILE_1_SLICE_REV1, 20, 1, 1, 9984),
    MigProfile("1g.20gb", codes.GPU_INSTANCE_PROFILE_1_SLICE_REV2, 15, 1, 4, 20096),
    MigProfile("2g.20gb", codes.GPU_INSTANCE_PROFILE_2_SLICE, 14, 2, 3, 20096),
    MigProfile("3g.40gb", codes.GPU_INSTANCE_PROFILE_3_SLICE, 9, 3, 2, 40448),
    MigProfile("4g.40gb", codes.GPU_INSTANCE_PROFILE_4_SLICE, 5, 4, 1, 40448),
    MigProfile("7g.80gb", codes.GPU_INSTANCE_PROFILE_7_SLICE, 0, 7, 1, 81152),
)
MIG_PROFILE_NAMES = tuple(p.name for p in MIG_PROFILES)
MIG_SLICES = 7  # compute slices one GPU divides into
MIG_SMS_PER_SLICE = 16


def mig_layout_problem(profiles: list[str] | tuple[str, ...]) -> str | None:
    """Why these GPU instances cannot share one GPU, or None when they can.

    Counted by slices and by each profile's instance limit (placement is not modelled).
    """
    known = {p.name: p for p in MIG_PROFILES}
    unknown = [name for name in profiles if name not in known]
    if unknown:
        return f"unknown profile {unknown[0]!r} (known: {', '.join(MIG_PROFILE_NAMES)})"
    for name in dict.fromkeys(profiles):
        if profiles.count(name) > known[name].max_instances:
            return f"at most {known[name].max_instances} {name} instances fit on one GPU"
    slices = sum(known[name].slices for name in profiles)
    if slices > MIG_SLICES:
        return f"{slices} slices do not fit on one GPU of {MIG_SLICES}"
    return None


ENCODER_SAMPLING_PERIOD_US = 167_000
NO_INSTANCE_ID = 0xFFFFFFFF  # gpuInstanceId/computeInstanceId when MIG is off

# How the simulated load drifts: slow sine waves, one phase per GPU.
LOAD_PERIOD_SECONDS = 600.0


@dataclass(frozen=True, slots=True)
class BoardIdentity:
    """The fixed identity of one simulated GPU."""

    index: int
    bus: int
    uuid: str
    serial: str
    phase: float  # radians: where this GPU starts on the load wave
    base_utilization: float  # percent
    temperature_offset: float  # degrees: GPUs in the same chassis differ a little
    initial_energy_mj: int  # energy since the driver loaded, before the simulation

    @property
    def bus_id(self) -> str:
        """NVML's ``busId``: 8-digit domain, as in ``00000000:18:00.0``."""
        return f"00000000:{self.bus:02X}:00.0"

    @property
    def bus_id_legacy(self) -> str:
        return f"0000:{self.bus:02X}:00.0"


def bus_numbers(gpus: int) -> tuple[int, ...]:
    layout = HGX_BUSES if gpus <= len(HGX_BUSES) else WIDE_BUSES
    return layout[:gpus]


def make_identity(seed: int, index: int, bus: int) -> BoardIdentity:
    # A string seed is hashed with SHA-512, so identities are stable across runs.
    rng = random.Random(f"gpuagent-sim:{seed}:{index}")  # noqa: S311 - not for secrets
    return BoardIdentity(
        index=index,
        bus=bus,
        uuid=f"GPU-{uuid.UUID(int=rng.getrandbits(128))}",
        serial="165" + "".join(str(rng.randrange(10)) for _ in range(10)),
        phase=rng.uniform(0.0, 6.283185307179586),
        base_utilization=rng.uniform(22.0, 30.0),
        temperature_offset=rng.uniform(0.0, 3.0),
        initial_energy_mj=rng.randrange(10**9, 5 * 10**10),
    )
