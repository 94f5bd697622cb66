"""Prometheus families for the node inventory: info-style gauges and GPU counts.

Info gauges are always 1 and carry their values as labels, so dashboards join them
onto other series and alerts compare labels across the fleet (count by fingerprint).
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client.core import Metric

from gpuagent.inventory.model import (
    IMEX,
    READY,
    HostFacts,
    NodeInventory,
    fingerprint,
    fingerprint_hash,
)
from gpuagent.metrics import names

GpuLabels = Callable[[str], tuple[str, ...]]


def inventory_families(inventory: NodeInventory | None, gpu_labels: GpuLabels) -> list[Metric]:
    """The inventory's families; ``gpu_labels`` gives a GPU's standard labels by bus id."""
    if inventory is None:
        return []
    host = inventory.host
    node = names.NODE_INFO.gauge()
    node.add_metric(
        [
            inventory.driver_version or "",
            host.module_version or "",
            inventory.nvml_version or "",
            inventory.cuda_driver_version or "",
            host.kernel_release or "",
            host.os_release or "",
            inventory.agent_version,
            fingerprint_hash(fingerprint(inventory)),
        ],
        1.0,
    )
    gpus = names.GPU_INVENTORY_INFO.gauge()
    for gpu in inventory.gpus:
        gpus.add_metric(
            [
                *gpu_labels(gpu.pci_bus_id),
                gpu.serial or "",
                gpu.vbios_version or "",
                gpu.inforom_version or "",
                gpu.gsp_firmware_version or "",
            ],
            1.0,
        )
    wanted = names.GPUS_EXPECTED.gauge()
    if inventory.expected_gpus:
        wanted.add_metric([], float(inventory.expected_gpus))
    seen = names.GPUS_SEEN.gauge()
    if inventory.nvml_ok:
        seen.add_metric(["nvml"], float(len(inventory.gpus)))
    pci_gpus, switches = inventory.pci("gpu"), inventory.nvswitches_seen
    nvswitches = names.NVSWITCHES_SEEN.gauge()
    if pci_gpus is not None and switches is not None:
        seen.add_metric(["pci"], float(len(pci_gpus)))
        # Served as 0 too, so an alert can subtract it from the PCI count.
        seen.add_metric(["pci_other_driver"], float(len(inventory.gpus_on_other_drivers())))
        nvswitches.add_metric([], float(switches))
    return [node, gpus, wanted, seen, nvswitches, *_host_families(inventory.host)]


def _host_families(host: HostFacts) -> list[Metric]:
    """Kernel modules loaded, installed kernels with or without the driver, services."""
    modules = names.KERNEL_MODULE_LOADED.gauge()
    for module, loaded in host.modules:
        if loaded is not None:  # /sys/module unreadable: no series rather than a false 0
            modules.add_metric([module], float(loaded))
    kernels = names.KERNEL_NVIDIA_MODULE_INSTALLED.gauge()
    newest = host.newest_kernel
    for kernel in host.kernels:
        if kernel.has_nvidia is not None:  # unreadable: no series rather than a false 0
            flags = (kernel is newest, kernel.release == host.kernel_release)
            kernels.add_metric(
                [kernel.release, *("true" if flag else "false" for flag in flags)],
                float(kernel.has_nvidia),
            )
    services = names.SERVICE_STATE.gauge()
    restarts = names.SERVICE_RESTARTS.counter()
    imex = names.IMEX_READY.gauge()
    for service in host.services:
        services.add_metric([service.name, service.state], 1.0)
        if service.restarts is not None:
            restarts.add_metric([service.name], float(service.restarts))
        if service.name == IMEX and service.readiness is not None:
            imex.add_metric([], float(service.readiness == READY))
    return [modules, kernels, services, restarts, imex]
