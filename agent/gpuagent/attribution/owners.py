"""Devices and the containers they are allocated to, as the kubelet lists them.

Each container's devices come as device plugin IDs. The NVIDIA device plugin's IDs are the
GPU's UUID ("GPU-..."), a MIG device's UUID ("MIG-..."), or with time-slicing a replica
of a GPU ("GPU-...::N"; each container may get several replicas of one GPU).

A MIG device's UUID does not name its GPU (drivers from 470 on): it is matched to the GPU
through the MIG devices NVML lists on that GPU. Older drivers' IDs ("MIG-GPU-<uuid>/<gi>/<ci>")
carry the GPU's UUID and are matched by it.
"""

from __future__ import annotations

from collections.abc import Collection
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


def device_on_gpu(device: str, gpu_uuid: str, mig_uuids: Collection[str]) -> str | None:
    """Where an allocated device (a `DeviceOwner.device`) is on the GPU ``gpu_uuid``:
    "" for the whole GPU, the device itself for one of the GPU's MIG devices (``mig_uuids``:
    the UUIDs NVML lists for it), None for a device on another GPU."""
    if device == gpu_uuid:
        return ""
    if device in mig_uuids or _mig_parent(device) == gpu_uuid:
        return device
    return None


def _mig_parent(device: str) -> str | None:
    """The GPU UUID inside an old-style MIG device ID ("MIG-GPU-<uuid>/<gi>/<ci>", drivers
    before 470); None for any other ID."""
    if device.startswith("MIG-GPU-"):
        return device.removeprefix("MIG-").split("/", 1)[0]
    return None
