"""The simulated node's host side: what sysfs, procfs and systemd would say about it.

A simulated node has no devices on the host's PCI bus, so the inventory reads these
facts from the scenario instead of the host's files.
"""

from __future__ import annotations

import time

from gpuagent.inventory.model import (
    FABRIC_MANAGER,
    IMEX,
    KNOWN_MODULES,
    PERSISTENCED,
    HostFacts,
    KernelModuleState,
    PciFunction,
    Service,
    version_key,
)
from gpuagent.sim import hardware
from gpuagent.sim.profiles import GpuProfile, PciSlot
from gpuagent.sim.scenario import NodeSpec

# Where a DKMS build puts the module in a kernel's tree.
_DKMS_MODULE = "updates/dkms/nvidia.ko"


def _address(slot: PciSlot) -> str:
    return f"0000:{slot[0]:02x}:{slot[1]:02x}.0"


def pci_functions(
    spec: NodeSpec, profile: GpuProfile, off_bus: frozenset[int] = frozenset()
) -> tuple[PciFunction, ...]:
    """The GPUs NVML lists (but those of ``off_bus``, the GPU indices a `pci_remove` took
    off the bus), the GPUs only PCI sees (no driver bound), the NVSwitches."""
    slots = profile.slots(spec.gpus)
    listed = [slot for index, slot in enumerate(slots) if index not in off_bus]
    wider = profile.slots(spec.gpus + spec.pci_only_gpus)
    unlisted = [slot for slot in wider if slot not in slots][: spec.pci_only_gpus]
    if len(unlisted) < spec.pci_only_gpus:  # the wide layout may reuse the narrow slots
        spare = [slot for slot in profile.wide_buses if slot not in slots and slot not in unlisted]
        unlisted += spare[: spec.pci_only_gpus - len(unlisted)]
    device_id = profile.pci_device_id >> 16
    functions = [
        *(PciFunction(_address(slot), "gpu", device_id, "nvidia") for slot in listed),
        *(PciFunction(_address(slot), "gpu", device_id, None) for slot in unlisted),
    ]
    if profile.nvswitch_device_id is not None:
        functions += [
            PciFunction(_address((bus, 0)), "nvswitch", profile.nvswitch_device_id, "nvidia")
            for bus in hardware.NVSWITCH_BUSES[: spec.nvswitches]
        ]
    return tuple(sorted(functions, key=lambda f: f.address))


def spec_services(spec: NodeSpec) -> tuple[Service, ...]:
    """The NVIDIA services as the scenario installs them (before any fault)."""
    return (
        Service(PERSISTENCED, spec.persistenced),
        Service(FABRIC_MANAGER, spec.fabricmanager),
        Service(IMEX, spec.imex),
    )


def host_facts(
    spec: NodeSpec, profile: GpuProfile, off_bus: frozenset[int] = frozenset()
) -> HostFacts:
    loaded = set(spec.modules)
    names = (*KNOWN_MODULES, *sorted(loaded - set(KNOWN_MODULES)))
    return HostFacts(
        pci=pci_functions(spec, profile, off_bus),
        modules=tuple((name, name in loaded) for name in names),
        module_version=spec.resolved_module_version if "nvidia" in loaded else None,
        # The user-space driver is driver_version's, unless it is not installed at all.
        library_version=None if spec.init_error == "library_not_found" else spec.driver_version,
        kernel_release=spec.kernel_release,
        kernels=tuple(
            KernelModuleState(
                release,
                has_nvidia=release not in spec.kernels_without_module,
                where="" if release in spec.kernels_without_module else _DKMS_MODULE,
            )
            for release in sorted({spec.kernel_release, *spec.installed_kernels}, key=version_key)
        ),
        os_release=spec.os_release,
        services=spec_services(spec),
        collected_at=time.time(),
    )
