"""The node inventory: what the node is, as opposed to how healthy it is.

Host facts (sysfs, procfs, os-release, systemd) are collected off the event loop every
few minutes; the NVML side comes from the latest poll. `build_inventory` joins the two
into one immutable `NodeInventory`, whose JSON form carries a fleet fingerprint.

This module is a leaf: it imports nothing from gpuagent, so `gpuagent.model` (whose
`NodeSnapshot` carries a `NodeInventory`) can import it at runtime without a cycle, and
`typing.get_type_hints` resolves both modules' annotations. `FabricState` lives here for
that reason; `gpuagent.model` re-exports it for the GPU readings.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any, Literal

# NVSwitch systems: a GPU's registration with Fabric Manager (NVML's fabric state).
FabricState = Literal["not_started", "in_progress", "completed"]
PciRole = Literal["gpu", "nvswitch"]
# systemd's ActiveState, plus "not_installed" (no such unit), "masked" (the unit is
# masked: an operator's choice that it never runs) and "unknown" (no systemd, or the
# question could not be answered): unknown is never taken for failed.
ServiceState = Literal[
    "active",
    "activating",
    "deactivating",
    "inactive",
    "failed",
    "not_installed",
    "masked",
    "unknown",
]
PERSISTENCED = "nvidia-persistenced"
FABRIC_MANAGER = "nvidia-fabricmanager"
# The IMEX daemon: multi-node NVLink memory export on GB200/GB300 NVL racks.
IMEX = "nvidia-imex"
SERVICES = (PERSISTENCED, FABRIC_MANAGER, IMEX)
# What `nvidia-imex-ctl -q` prints (alone on its line) when the local IMEX daemon is ready.
READY = "READY"
# Installed but not running: what a probe must find several times in a row to call it down.
STOPPED_STATES = frozenset({"inactive", "failed", "deactivating"})
NVIDIA_DRIVER = "nvidia"
# A PCI function's driver link that cannot be followed (a symlink loop): bound to
# something, but to what is not known.
UNKNOWN_DRIVER = "unknown"
# Kernel modules reported whether or not they are required.
KNOWN_MODULES = ("nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm", "nvidia_peermem")
_VERSION_PART_RE = re.compile(r"(\d+)|(\D+)")


@dataclass(frozen=True, slots=True)
class KernelModuleState:
    """One installed kernel: whether an nvidia module is installed or built for it."""

    release: str
    has_nvidia: bool | None  # None: the kernel's module tree could not be read
    where: str = ""  # the module's path relative to the kernel's tree, or the DKMS build


def version_key(release: str) -> tuple[tuple[int, str], ...]:
    """Sort key for kernel releases: numbers compare as numbers ("6.1.0-28" after
    "6.1.0-9"), so the last release sorted is the newest installed."""
    return tuple(
        (int(number), "") if number else (-1, text)
        for number, text in _VERSION_PART_RE.findall(release)
    )


def newest(states: tuple[KernelModuleState, ...]) -> KernelModuleState | None:
    return max(states, key=lambda s: version_key(s.release), default=None)


@dataclass(frozen=True, slots=True)
class PciFunction:
    """An NVIDIA GPU or NVSwitch function in sysfs."""

    address: str  # canonical bus id
    role: PciRole
    device_id: int | None = None
    # The bound driver ("nvidia", "vfio-pci", UNKNOWN_DRIVER); None: unbound.
    driver: str | None = None


@dataclass(frozen=True, slots=True)
class Service:
    name: str
    state: ServiceState
    restarts: int | None = None  # systemd's NRestarts; None where systemd does not say
    # The daemon's liveness tracking (gpuagent.inventory.liveness) fills these in; a single
    # read (`gpuagent check`) leaves them, and its state alone is judged.
    down_probes: int = 0  # probes in a row that found it stopped
    pending: bool = False  # stopped, but at fewer probes in a row than make it down
    recent_restarts: int = 0  # automatic restarts within the restart window
    flapping: bool = False  # recent_restarts at or above the limit
    # What the daemon itself says of its readiness, where it can be asked (the IMEX
    # daemon: `nvidia-imex-ctl -q` prints READY); None: not asked, or no answer.
    readiness: str | None = None
    unready_probes: int = 0  # probes in a row that found it running and not ready
    readiness_pending: bool = False  # not ready, at fewer probes in a row than count

    @property
    def down(self) -> bool:
        """Installed and stopped, at enough probes in a row (or read once)."""
        return self.state in STOPPED_STATES and not self.pending

    @property
    def says_unready(self) -> bool:
        """This probe's answer was something other than READY (no answer says nothing)."""
        return self.readiness not in (None, READY)

    @property
    def not_ready(self) -> bool:
        """Running and saying it is not ready, at enough probes in a row (or read once)."""
        return self.says_unready and not self.readiness_pending


@dataclass(frozen=True, slots=True)
class HostFacts:
    """What the host says about the node, without NVML."""

    pci: tuple[PciFunction, ...] | None = None  # None: sysfs could not be read
    modules: tuple[tuple[str, bool | None], ...] = ()  # (module, loaded); None: unknown
    module_version: str | None = None  # /sys/module/nvidia/version
    # The installed NVML library's driver version (libnvidia-ml.so.1's target), known
    # even when NVML cannot start.
    library_version: str | None = None
    kernel_release: str | None = None
    # Every installed kernel and whether it has an nvidia module, oldest first (see
    # gpuagent.inventory.kernels); () when not read.
    kernels: tuple[KernelModuleState, ...] = ()
    os_release: str | None = None  # PRETTY_NAME
    services: tuple[Service, ...] = ()
    collected_at: float = 0.0  # wall clock

    def module_loaded(self, name: str) -> bool | None:
        return dict(self.modules).get(name)

    def loaded_modules(self) -> tuple[str, ...] | None:
        """The NVIDIA modules loaded, sorted; None when /sys/module could not be read."""
        if any(loaded is None for _, loaded in self.modules):
            return None
        return tuple(sorted(name for name, loaded in self.modules if loaded))

    @property
    def newest_kernel(self) -> KernelModuleState | None:
        return newest(self.kernels)

    def service(self, name: str) -> ServiceState:
        found = self.service_facts(name)
        return found.state if found is not None else "unknown"

    def service_facts(self, name: str) -> Service | None:
        return next((s for s in self.services if s.name == name), None)


@dataclass(frozen=True, slots=True)
class GpuInventory:
    """One GPU as NVML describes it: versions, modes and settings (None: not reported)."""

    index: int
    pci_bus_id: str
    uuid: str
    model: str
    serial: str | None = None
    vbios_version: str | None = None
    inforom_version: str | None = None
    gsp_firmware_version: str | None = None
    ecc_current: bool | None = None
    ecc_pending: bool | None = None
    mig_current: bool | None = None
    mig_pending: bool | None = None
    mig_instances: tuple[str, ...] | None = None  # GPU-instance profiles, sorted
    persistence: bool | None = None
    power_limit_w: float | None = None  # current (enforced)
    power_requested_limit_w: float | None = None
    power_default_limit_w: float | None = None
    applications_clock_mhz: int | None = None
    applications_clock_default_mhz: int | None = None
    compute_mode: str | None = None
    # nvmlClocksEventReasonApplicationsClocksSetting: clocks held by a user setting
    # (applications clocks or locked clocks).
    clocks_set_by_user: bool | None = None
    fabric_state: FabricState | None = None
    fabric_ok: bool | None = None


@dataclass(frozen=True, slots=True)
class NodeInventory:
    host: HostFacts
    agent_version: str
    nvml_ok: bool
    driver_version: str | None = None
    nvml_version: str | None = None
    cuda_driver_version: str | None = None
    gpus: tuple[GpuInventory, ...] = ()
    expected_gpus: int = 0  # inventory.expected.gpus, carried for outputs; 0: not set

    @property
    def nvml_library_version(self) -> str | None:
        """The driver version of the NVML library: "12.550.54.15" → "550.54.15"."""
        if self.nvml_version is None:
            return None
        major, dot, rest = self.nvml_version.partition(".")
        return rest if dot and major.isdigit() and rest.count(".") >= 1 else self.nvml_version

    def pci(self, role: PciRole) -> tuple[PciFunction, ...] | None:
        if self.host.pci is None:
            return None
        return tuple(f for f in self.host.pci if f.role == role)

    @property
    def gpus_seen(self) -> int | None:
        """GPUs the node has: every GPU on the PCI bus, whichever driver holds it (NVML's
        count when sysfs cannot be read); None when neither can tell."""
        pci_gpus = self.pci("gpu")
        if pci_gpus is not None:
            return len(pci_gpus)
        return len(self.gpus) if self.nvml_ok else None

    @property
    def nvswitches_seen(self) -> int | None:
        """NVSwitches on the PCI bus; None when sysfs cannot be read."""
        switches = self.pci("nvswitch")
        return None if switches is None else len(switches)

    def gpus_on_other_drivers(self) -> tuple[PciFunction, ...]:
        """GPUs on the PCI bus that a driver other than nvidia holds (vfio-pci: passed
        through to a virtual machine), so NVML rightly does not list them."""
        listed = {g.pci_bus_id for g in self.gpus}
        return tuple(
            f
            for f in self.pci("gpu") or ()
            if f.driver not in (None, NVIDIA_DRIVER) and f.address not in listed
        )

    def to_json(self) -> dict[str, Any]:
        host = self.host
        print_ = fingerprint(self)
        return {
            "collected_at": host.collected_at,
            "agent_version": self.agent_version,
            "driver_version": self.driver_version,
            "nvml_version": self.nvml_version,
            "cuda_driver_version": self.cuda_driver_version,
            "module_version": host.module_version,
            "library_version": host.library_version,
            "modules": dict(host.modules),
            "kernel_release": host.kernel_release,
            "kernels": {k.release: k.has_nvidia for k in host.kernels},
            "os_release": host.os_release,
            "services": {s.name: s.state for s in host.services},
            "gpus_expected": self.expected_gpus or None,
            "gpus_nvml": len(self.gpus) if self.nvml_ok else None,
            "gpus_other_driver": {f.address: f.driver for f in self.gpus_on_other_drivers()},
            "pci": None
            if host.pci is None
            else [
                {
                    "address": f.address,
                    "role": f.role,
                    "device_id": None if f.device_id is None else f"0x{f.device_id:04x}",
                    "driver": f.driver,
                }
                for f in host.pci
            ],
            "gpus": [_gpu_json(g) for g in self.gpus],
            "fingerprint": print_,
            "fingerprint_id": fingerprint_hash(print_),
        }


def _gpu_json(gpu: GpuInventory) -> dict[str, Any]:
    return {
        "index": gpu.index,
        "pci_bus_id": gpu.pci_bus_id,
        "uuid": gpu.uuid,
        "model": gpu.model,
        "serial": gpu.serial,
        "vbios_version": gpu.vbios_version,
        "inforom_version": gpu.inforom_version,
        "gsp_firmware_version": gpu.gsp_firmware_version,
        "ecc": {"current": gpu.ecc_current, "pending": gpu.ecc_pending},
        "mig": {
            "current": gpu.mig_current,
            "pending": gpu.mig_pending,
            "instances": None if gpu.mig_instances is None else list(gpu.mig_instances),
        },
        "persistence": gpu.persistence,
        "power_limit_w": gpu.power_limit_w,
        "power_requested_limit_w": gpu.power_requested_limit_w,
        "power_default_limit_w": gpu.power_default_limit_w,
        "applications_clock_mhz": gpu.applications_clock_mhz,
        "applications_clock_default_mhz": gpu.applications_clock_default_mhz,
        "clocks_set_by_user": gpu.clocks_set_by_user,
        "compute_mode": gpu.compute_mode,
        "fabric": {"state": gpu.fabric_state, "ok": gpu.fabric_ok},
    }


def joined(values: list[str | None]) -> str:
    """A set of per-GPU versions as one stable string ("" when none is known)."""
    return ",".join(sorted({v for v in values if v}))


def fingerprint(inventory: NodeInventory) -> dict[str, str]:
    """What nodes of one fleet image share; nodes that differ here have drifted apart.

    Per-GPU versions are sets, so the GPUs' order (and their count) does not matter.
    """
    return {
        "driver": inventory.driver_version or inventory.host.module_version or "",
        "cuda": inventory.cuda_driver_version or "",
        "kernel": inventory.host.kernel_release or "",
        "vbios": joined([g.vbios_version for g in inventory.gpus]),
        "gsp_firmware": joined([g.gsp_firmware_version for g in inventory.gpus]),
        "agent": inventory.agent_version,
    }


def fingerprint_hash(print_: dict[str, str]) -> str:
    """A short, stable hash of a fingerprint (key order does not matter)."""
    canonical = json.dumps(print_, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]
