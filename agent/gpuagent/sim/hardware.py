"""What every simulated GPU shares, whatever its model, and each GPU's fixed identity.

Identities (UUID, serial) are derived from the scenario seed and GPU index so every run
of a scenario shows the same GPUs. What differs between models is in their
`gpuagent.sim.profiles.GpuProfile`.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass

MAX_NVLINKS = 18  # NVML_NVLINK_MAX_LINKS
MIB = 1024 * 1024
PCIE_WIDTHS = (1, 2, 4, 8, 16)
# NVSwitches of an HGX baseboard (PCI class 0x068000), by bus number.
NVSWITCH_BUSES = (0x05, 0x06, 0x07, 0x08)

ENCODER_SAMPLING_PERIOD_US = 167_000
NO_INSTANCE_ID = 0xFFFFFFFF  # gpuInstanceId/computeInstanceId when MIG is off
# Each GPU instance has one compute instance spanning it (`nvidia-smi mig -cgi ... -C`),
# and the first compute instance of a GPU instance gets id 0.
COMPUTE_INSTANCE_ID = 0
# Namespace of the MIG device UUIDs (uuid5 of the GPU's UUID and the instance ids).
_MIG_UUID_NAMESPACE = uuid.UUID("6f1c3e2a-8d4b-5a7e-9c0f-1b2d3e4f5a6b")

# nvmlPlatformInfo_v2_t: the chassis serial's buffer, and the peer types nvidia-smi prints
# as "Direct Connected" and "Switch Connected" (nvml.h does not publish the encoding; this
# is the one NVIDIA's own NVML mock pins to that rendering).
CHASSIS_SERIAL_LEN = 16
IB_GUID_LEN = 16
PEER_TYPE_DIRECT_CONNECTED = 0
PEER_TYPE_SWITCH_CONNECTED = 1
FABRIC_UUID_LEN = 16  # NVML_GPU_FABRIC_UUID_LEN


def milliwatts(watts: float | None) -> int | None:
    """Watts as NVML reports power: whole milliwatts (None stays None)."""
    return None if watts is None else round(watts * 1000)


def fabric_uuid_bytes(text: str) -> bytes:
    """A cluster UUID as printed ("00000001-0000-...") as NVML's 16 bytes, in that order."""
    return uuid.UUID(text).bytes


# How the simulated readings drift: slow sine waves, one phase per GPU.
LOAD_PERIOD_SECONDS = 600.0


@dataclass(frozen=True, slots=True)
class BoardIdentity:
    """The fixed identity of one simulated GPU."""

    index: int
    bus: int
    uuid: str
    serial: str
    phase: float  # radians: where this GPU starts on the drift wave
    temperature_offset: float  # degrees: GPUs in the same chassis differ a little
    initial_energy_mj: int  # energy since the driver loaded, before the simulation
    device: int = 0  # the PCI device number on its bus
    # The PCI domain: 0 on most hosts; a GB200/GB300 tray puts each GPU in its own
    # (0008, 0009, 0018, 0019 on a captured GB300).
    domain: int = 0

    @property
    def bus_id(self) -> str:
        """NVML's ``busId``: 8-digit domain, as in ``00000000:18:00.0``."""
        return f"{self.domain:08X}:{self.bus:02X}:{self.device:02X}.0"

    @property
    def bus_id_legacy(self) -> str:
        return f"{self.domain:04X}:{self.bus:02X}:{self.device:02X}.0"


def make_identity(seed: int, index: int, bus: int, device: int = 0) -> BoardIdentity:
    # A string seed is hashed with SHA-512, so identities are stable across runs.
    rng = random.Random(f"gpuagent-sim:{seed}:{index}")  # noqa: S311 - not for secrets
    return BoardIdentity(
        index=index,
        bus=bus,
        device=device,
        uuid=f"GPU-{uuid.UUID(int=rng.getrandbits(128))}",
        serial="165" + "".join(str(rng.randrange(10)) for _ in range(10)),
        phase=rng.uniform(0.0, 6.283185307179586),
        temperature_offset=rng.uniform(0.0, 3.0),
        initial_energy_mj=rng.randrange(10**9, 5 * 10**10),
    )


def mig_device_uuid(gpu_uuid: str, gpu_instance_id: int, compute_instance_id: int) -> str:
    """A MIG device's UUID ("MIG-<uuid>"): the same for the same GPU and instance ids in
    every run, and distinct between GPUs and instances. Like the driver's, it does not
    show its GPU's UUID."""
    name = f"{gpu_uuid}/{gpu_instance_id}/{compute_instance_id}"
    return f"MIG-{uuid.uuid5(_MIG_UUID_NAMESPACE, name)}"
