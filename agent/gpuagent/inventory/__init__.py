"""The node inventory: PCI functions, driver and kernel module, firmware, kernel, OS and
services, collected at start, on PCI changes and every `inventory.refresh_seconds`.

See docs/inventory.md.

The package re-exports only the data types (`gpuagent.inventory.model`, which imports
nothing from gpuagent): `gpuagent.model` imports them, so importing this package must not
import `gpuagent.model` back. `build_inventory` is in `gpuagent.inventory.build`.
"""

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
    "fingerprint",
    "fingerprint_hash",
]
