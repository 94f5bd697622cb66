"""The node inventory: PCI functions, driver and kernel module, firmware, kernel, OS and
services, collected at start, on PCI changes and every `inventory.refresh_seconds`.

See docs/inventory.md.
"""

from gpuagent.inventory.build import build_inventory
from gpuagent.inventory.model import (
    GpuInventory,
    HostFacts,
    NodeInventory,
    PciFunction,
    Service,
    fingerprint,
    fingerprint_hash,
)

__all__ = [
    "GpuInventory",
    "HostFacts",
    "NodeInventory",
    "PciFunction",
    "Service",
    "build_inventory",
    "fingerprint",
    "fingerprint_hash",
]
