"""Devices and the containers they are allocated to, as the kubelet lists them.

Each container's devices come as device plugin IDs. The NVIDIA device plugin's IDs are the
GPU's UUID ("GPU-..."), a MIG device's UUID ("MIG-..."), or with time-slicing a replica
of a GPU ("GPU-...::N"; each container may get several replicas of one GPU).
"""

from __future__ import annotations

from dataclasses import dataclass

# The device plugin's time-slicing replicas: "<UUID>::<replica>".
_REPLICA_SEPARATOR = "::"


@dataclass(frozen=True, slots=True)
class DeviceOwner:
    """One device allocated to one container."""

    device: str  # the GPU's or MIG device's UUID, replica suffix removed
    pod: str
    namespace: str
    container: str
    resource: str  # "nvidia.com/gpu", "nvidia.com/mig-1g.10gb", ...


def device_uuid(device_id: str) -> str:
    """A device plugin ID as the UUID NVML reports: "GPU-x::3" → "GPU-x"."""
    return device_id.split(_REPLICA_SEPARATOR, 1)[0]
