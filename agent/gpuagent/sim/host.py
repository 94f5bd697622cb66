"""The simulated node's host side: what sysfs, procfs and systemd would say about it.

A simulated node has no devices on the host's PCI bus, so the inventory reads these
facts from the scenario instead of the host's files.
"""

from __future__ import annotations

import time

from gpuagent.inventory.model import (
    FABRIC_MANAGER,
    KNOWN_MODULES,
    PERSISTENCED,
    HostFacts,
    PciFunction,
    Service,
)
from gpuagent.sim import hardware
from gpuagent.sim.scenario import NodeSpec

_GPU_DEVICE_ID = hardware.PCI_DEVICE_ID >> 16


def pci_functions(spec: NodeSpec, off_bus: frozenset[int] = frozenset()) -> tuple[PciFunction, ...]:
    """The GPUs NVML lists (but those of ``off_bus``, the GPU indices a `pci_remove` took
    off the bus), the GPUs only PCI sees (no driver bound), the NVSwitches."""
    buses = hardware.bus_numbers(spec.gpus)
    listed = [bus for index, bus in enumerate(buses) if index not in off_bus]
    wider = hardware.bus_numbers(spec.gpus + spec.pci_only_gpus)
    unlisted = [bus for bus in wider if bus not in buses][: spec.pci_only_gpus]
    if len(unlisted) < spec.pci_only_gpus:  # the 16-slot layout reuses the 8-slot buses
        spare = [bus for bus in hardware.WIDE_BUSES if bus not in buses and bus not in unlisted]
        unlisted += spare[: spec.pci_only_gpus - len(unlisted)]
    functions = [
        *(PciFunction(f"0000:{bus:02x}:00.0", "gpu", _GPU_DEVICE_ID, "nvidia") for bus in listed),
        *(PciFunction(f"0000:{bus:02x}:00.0", "gpu", _GPU_DEVICE_ID, None) for bus in unlisted),
        *(
            PciFunction(f"0000:{bus:02x}:00.0", "nvswitch", hardware.NVSWITCH_DEVICE_ID, "nvidia")
            for bus in hardware.NVSWITCH_BUSES[: spec.nvswitches]
        ),
    ]
    return tuple(sorted(functions, key=lambda f: f.address))


def host_facts(spec: NodeSpec, off_bus: frozenset[int] = frozenset()) -> HostFacts:
    loaded = set(spec.modules)
    names = (*KNOWN_MODULES, *sorted(loaded - set(KNOWN_MODULES)))
    return HostFacts(
        pci=pci_functions(spec, off_bus),
        modules=tuple((name, name in loaded) for name in names),
        module_version=spec.resolved_module_version if "nvidia" in loaded else None,
        # The user-space driver is driver_version's, unless it is not installed at all.
        library_version=None if spec.init_error == "library_not_found" else spec.driver_version,
        kernel_release=spec.kernel_release,
        os_release=spec.os_release,
        services=(
            Service(PERSISTENCED, spec.persistenced),
            Service(FABRIC_MANAGER, spec.fabricmanager),
        ),
        collected_at=time.time(),
    )
