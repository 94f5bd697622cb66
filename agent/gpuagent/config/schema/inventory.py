"""[inventory]: what the node should be."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

from gpuagent.config.ranges import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE


@dataclass(frozen=True)
class ExpectedGpu:
    """One GPU, by NVML index, whose MIG set-up differs from the node-wide expectation."""

    index: Annotated[int, NON_NEGATIVE]
    # Unset: checks.mig.expected applies to this GPU.
    mig_mode: Literal["any", "enabled", "disabled"] | None = None
    # Unset: inventory.expected.mig_profiles applies; []: no expectation for this GPU.
    mig_profiles: list[str] | None = None


@dataclass(frozen=True)
class InventoryExpected:
    """What this node should be; empty strings and 0 mean "no expectation"."""

    gpus: Annotated[int, NON_NEGATIVE] = 0
    # Substring of the NVML product name, e.g. "H100".
    model: str = ""
    # Exact ("550.54.15") or a prefix ending in a dot or a major version ("550." or "550").
    driver_version: str = ""
    cuda_driver_version: str = ""
    vbios_version: str = ""
    kernel_release: str = ""
    # The power limit every GPU should have been asked for (its requested limit); 0: none
    # declared (the learned baseline's, if any, applies).
    power_limit_watts: Annotated[float, NON_NEGATIVE] = 0.0
    # Kernel modules that must be loaded (nvidia_peermem on GPUDirect RDMA nodes).
    modules: list[str] = field(default_factory=lambda: ["nvidia"])
    # GPU-instance profiles every GPU with MIG enabled should carry, as a multiset
    # (["1g.10gb", "1g.10gb", "3g.40gb"]); empty: no expectation. (The MIG mode itself is
    # checks.mig.expected.)
    mig_profiles: list[str] = field(default_factory=list)
    # Persistence mode every GPU should be in; "any": none declared (the learned baseline's,
    # if any, applies). Whole fleets run it off, so off is only a fault against this.
    persistence: Literal["any", "enabled", "disabled"] = "any"
    # Compute mode every GPU should be in; "any": none declared (the baseline's applies).
    compute_mode: Literal["any", "default", "exclusive_process", "prohibited"] = "any"
    # "default": applications clocks at their default and no clocks locked; "any": none
    # declared (the baseline's applications clock applies).
    applications_clocks: Literal["any", "default"] = "any"
    # RDMA (InfiniBand or RoCE) devices that must be present, by name ("mlx5_0"); every
    # port of these is judged even if it never came up. Empty: no expectation.
    hcas: list[str] = field(default_factory=list)
    # Signalling rate (Gb/s) every judged RDMA port should run at; 0: the most common rate
    # of the node's active ports.
    ib_rate_gbps: Annotated[float, NON_NEGATIVE] = 0.0
    # GPUDirect RDMA is used here: nvidia_peermem must be loaded (needs the inventory).
    gpudirect: bool = False
    # GPUs that differ from the node-wide MIG expectation ([[inventory.expected.gpu]]).
    gpu: list[ExpectedGpu] = field(default_factory=list)

    def for_gpu(self, index: int) -> ExpectedGpu | None:
        return next((g for g in self.gpu if g.index == index), None)

    def mig_profiles_for(self, index: int) -> list[str]:
        """The GPU-instance profiles GPU ``index`` should carry ([]: no expectation)."""
        override = self.for_gpu(index)
        if override is None or override.mig_profiles is None:
            return self.mig_profiles
        return override.mig_profiles


@dataclass(frozen=True)
class InventorySection:
    enabled: bool = True
    # The node inventory is read at start, on PCI add/remove (udev) and this often.
    refresh_seconds: Annotated[float, POSITIVE] = 300.0
    # procfs mount point (kernel release); sysfs is sources.sysfs.root.
    proc_root: Path = Path("/proc")
    os_release: Path = Path("/etc/os-release")
    # Where libnvidia-ml.so.1 is looked for (first found wins): the version of the file it
    # links to is compared with the kernel module's even when NVML cannot start.
    library_dirs: list[Path] = field(
        default_factory=lambda: [
            Path("/usr/lib/x86_64-linux-gnu"),
            Path("/usr/lib/aarch64-linux-gnu"),
            Path("/usr/lib64"),
            Path("/usr/lib"),
        ]
    )
    systemctl: str = "systemctl"
    # nvidia-persistenced, nvidia-fabricmanager and nvidia-imex are probed this often. One
    # is down once this many probes in a row found it stopped (fewer is a restart in
    # passing), and flapping when systemd restarted it this many times within the window.
    services_probe_seconds: Annotated[float, POSITIVE] = 30.0
    service_down_probes: Annotated[int, AT_LEAST_ONE] = 3
    service_restart_limit: Annotated[int, AT_LEAST_ONE] = 3
    service_restart_window_seconds: Annotated[float, POSITIVE] = 600.0
    # Asked at each probe while nvidia-imex runs: "-q" prints READY when the local IMEX
    # daemon is (its command service must be on); not ready at service_down_probes
    # answers in a row is a finding.
    imex_ctl: str = "nvidia-imex-ctl"
    # Installed kernels (one directory each) and DKMS builds: a kernel that the next boot
    # may start without an nvidia module is reported before the reboot.
    modules_root: Path = Path("/lib/modules")
    dkms_root: Path = Path("/var/lib/dkms")
    # Record the first healthy inventory as the baseline (in agent.state_dir) and report
    # any later change from it (a GPU fewer than learned when expected.gpus is 0).
    learn: bool = False
    expected: InventoryExpected = field(default_factory=InventoryExpected)
