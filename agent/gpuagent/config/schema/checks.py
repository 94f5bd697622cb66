"""[checks]: the health checks and their thresholds."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

from gpuagent.config.ranges import CELSIUS, FRACTION, NON_NEGATIVE, PERCENT, POSITIVE


@dataclass(frozen=True)
class EccCheck:
    enabled: bool = True
    # Corrected (single-bit) errors per hour above which the GPU is WARN.
    sbe_rate_per_hour: Annotated[float, NON_NEGATIVE] = 100.0
    # Window over which the SBE rate is measured.
    rate_window_seconds: Annotated[float, POSITIVE] = 3600.0


@dataclass(frozen=True)
class ThermalCheck:
    enabled: bool = True
    # WARN when the GPU is within this many degrees of its slowdown threshold.
    slowdown_margin_c: Annotated[float, NON_NEGATIVE] = 5.0
    # CRITICAL when the GPU is within this many degrees of its shutdown threshold.
    shutdown_margin_c: Annotated[float, NON_NEGATIVE] = 5.0
    # Used when NVML does not report thresholds (H100 SXM defaults).
    fallback_slowdown_c: Annotated[float, CELSIUS] = 87.0
    fallback_shutdown_c: Annotated[float, CELSIUS] = 92.0
    # Throttling is a finding only while it costs performance: the GPU at least this busy,
    # and heat or the power brake holding its clocks back for at least
    # throttle_min_fraction of the last throttle_window_seconds (NVML's duration counters).
    throttle_window_seconds: Annotated[float, POSITIVE] = 300.0
    throttle_min_fraction: Annotated[float, FRACTION] = 0.25
    throttle_min_utilization_pct: Annotated[float, PERCENT] = 50.0


@dataclass(frozen=True)
class PcieCheck:
    enabled: bool = True
    # A link below its maximum generation or width for longer than this is WARN.
    # (GPUs drop the link speed at idle to save power, so a short dip is normal.)
    degraded_hold_seconds: Annotated[float, NON_NEGATIVE] = 300.0
    # Only flag a lower generation when the GPU is busy enough that it should be at speed.
    degraded_min_utilization_pct: Annotated[float, PERCENT] = 10.0
    # PCIe replays per minute above which the GPU is WARN.
    replay_rate_per_minute: Annotated[float, NON_NEGATIVE] = 10.0
    # The link the platform gives every GPU, where it is narrower or slower than the GPU
    # can run (an AWS g6e seats its L40S in x8 slots): the link is judged against this.
    # 0: the GPU's own maximum.
    expected_width: Annotated[int, NON_NEGATIVE] = 0
    expected_generation: Annotated[int, NON_NEGATIVE] = 0


@dataclass(frozen=True)
class PersistenceCheck:
    enabled: bool = True


@dataclass(frozen=True)
class RecoveryCheck:
    enabled: bool = True


@dataclass(frozen=True)
class FabricHealthCheck:
    enabled: bool = True
    # Route or access-timeout recovery still in progress after this long is CRITICAL.
    recovery_timeout_seconds: Annotated[float, POSITIVE] = 300.0


@dataclass(frozen=True)
class MigCheck:
    enabled: bool = True
    # "any": no expectation; "enabled"/"disabled": WARN when a GPU differs.
    expected: Literal["any", "enabled", "disabled"] = "any"


@dataclass(frozen=True)
class NvlinkCheck:
    enabled: bool = True
    # CRC errors (flit + data, summed over the links) per second above which the GPU is
    # WARN; DCGM's health watch fails a GPU at 100/s.
    crc_rate_per_second: Annotated[float, NON_NEGATIVE] = 100.0
    # Window over which the CRC rate is measured and replay or recovery errors count as new.
    rate_window_seconds: Annotated[float, POSITIVE] = 60.0
    # A link whose effective bit-error rate is above this is WARN (DCGM fails it above
    # 1e-12). The symbol BER is judged only when a limit is set (0: exported, not judged).
    effective_ber_limit: Annotated[float, POSITIVE] = 1e-12
    symbol_ber_limit: Annotated[float, NON_NEGATIVE] = 0.0
    # For this long after the node booted, NVLinks still training (down) and a fabric
    # registration not yet completed are no fault: shown, judged OK (the nvlink,
    # fabric_health and fabric checks). Kernel-log XIDs are judged as always. 0: no grace.
    boot_grace_seconds: Annotated[float, NON_NEGATIVE] = 300.0


@dataclass(frozen=True)
class XidRepeat:
    """How many times one XID may warn on a GPU within the window before it is CRITICAL."""

    xid: Annotated[int, POSITIVE]
    count: Annotated[int, POSITIVE]


@dataclass(frozen=True)
class XidCheck:
    enabled: bool = True
    # Application XIDs (the catalog's RESTART_APP bucket) make a GPU WARN for this long
    # after the last one...
    app_error_hold_seconds: Annotated[float, NON_NEGATIVE] = 3600.0
    # ...and CRITICAL when they come faster than this.
    app_error_rate_per_hour: Annotated[float, NON_NEGATIVE] = 6.0
    # The same warning-level XID (a non-fatal NVLink error, power cables, an unknown XID;
    # never an application XID or a teardown) this many times on one GPU within
    # repeat_window_seconds is CRITICAL: a GPU that keeps warning needs a person.
    repeat_count: Annotated[int, POSITIVE] = 5
    repeat_window_seconds: Annotated[float, POSITIVE] = 3600.0
    # Per-XID counts instead of repeat_count ([[checks.xid.repeat]] xid = 145, count = 20).
    repeat: list[XidRepeat] = field(default_factory=list)

    def repeat_limit(self, xid: int | None, catalog: int | None = None) -> int:
        """The count for ``xid``: its own [[checks.xid.repeat]], else NVIDIA's (``catalog``,
        where the catalog names one), else repeat_count."""
        found = next((r.count for r in self.repeat if r.xid == xid), None)
        if found is not None:
            return found
        return self.repeat_count if catalog is None else catalog


@dataclass(frozen=True)
class SxidCheck:
    enabled: bool = True


@dataclass(frozen=True)
class AerCheck:
    enabled: bool = True
    # Corrected PCIe errors per hour (kernel AER reports and sysfs counters) above which a
    # GPU is WARN; any uncorrectable (non-fatal or fatal) error is CRITICAL.
    corrected_rate_per_hour: Annotated[float, NON_NEGATIVE] = 60.0
    rate_window_seconds: Annotated[float, POSITIVE] = 3600.0


@dataclass(frozen=True)
class BusCheck:
    # "GPU has fallen off the bus" in the kernel log, or the GPU removed from PCI (udev).
    enabled: bool = True


@dataclass(frozen=True)
class ProcessesCheck:
    # GPU memory held with no process, processes gone from /proc, and hung jobs: WARN only.
    enabled: bool = True
    # Framebuffer in use (beyond the driver's reserved share) with no process, above which
    # the memory counts as held by a leaked context; idle GPUs hold a few hundred MiB.
    leak_threshold_mib: Annotated[float, NON_NEGATIVE] = 1024.0
    # How long memory must stay held with no process before it is WARN.
    leak_seconds: Annotated[float, NON_NEGATIVE] = 60.0
    # How long a process NVML lists must be missing from /proc before it is WARN.
    gone_seconds: Annotated[float, NON_NEGATIVE] = 30.0
    # GPU utilization at or below which a GPU with processes counts as doing nothing, and
    # for how long without a break before its processes count as hung.
    hung_utilization_pct: Annotated[float, PERCENT] = 1.0
    hung_seconds: Annotated[float, NON_NEGATIVE] = 1800.0


@dataclass(frozen=True)
class InfinibandCheck:
    # RDMA ports (InfiniBand, or RoCE on Ethernet) from /sys/class/infiniband: a port down
    # or an expected HCA missing is CRITICAL; a slow link, link errors, a flapping link or
    # GPUDirect RDMA without nvidia_peermem are WARN. Expectations: [inventory.expected].
    enabled: bool = True
    # Physical-layer errors (symbol errors, receive errors, link recoveries, ...) summed
    # over a port, per minute, above which the port is WARN. A healthy link counts none.
    link_errors_per_minute: Annotated[float, NON_NEGATIVE] = 1.0
    # Window over which the error rate is measured and a link-down counts as new.
    rate_window_seconds: Annotated[float, POSITIVE] = 600.0


@dataclass(frozen=True)
class KubernetesCheck:
    # The Kubernetes GPU stack seen from the node: the device plugin registered, the Node
    # advertising every healthy GPU, the container toolkit's runtime and CDI spec. "auto":
    # on when remediation.cordon.backends has "kubernetes"; true or false decide alone.
    enabled: Literal["auto", True, False] = "auto"
    # The extended resource the device plugin advertises, and how many it advertises per
    # GPU (more than 1 with time-slicing replicas).
    resource: str = "nvidia.com/gpu"
    replicas_per_gpu: Annotated[int, POSITIVE] = 1
    # kubelet's device plugin directory: the plugin's socket (file names matching
    # device_plugin_sockets) and kubelet's kubelet_internal_checkpoint.
    device_plugin_dir: Path = Path("/var/lib/kubelet/device-plugins")
    device_plugin_sockets: list[str] = field(default_factory=lambda: ["nvidia*.sock"])
    # Where CDI specs are looked for (*.yaml, *.yml, *.json); a spec of kind
    # nvidia.com/gpu must name every GPU (by index or UUID) once one exists.
    cdi_dirs: list[str] = field(default_factory=lambda: ["/etc/cdi", "/var/run/cdi"])
    # true: no CDI spec at all is WARN too (clusters that inject GPUs by CDI only).
    require_cdi: bool = False
    # The NVIDIA container runtime: any of these files, or a containerd config naming a
    # runtime "nvidia". Empty lists: the runtime is not checked.
    runtime_paths: list[str] = field(
        default_factory=lambda: [
            "/usr/bin/nvidia-container-runtime",
            "/usr/local/nvidia/toolkit/nvidia-container-runtime",
        ]
    )
    containerd_configs: list[str] = field(default_factory=lambda: ["/etc/containerd/config.toml"])
    # The device plugin needs time to start and register (after a boot, a driver reload or
    # its own restart): fewer GPUs advertised than healthy, or no plugin, is WARN, not
    # CRITICAL, until the agent has run, and that state has held, this long.
    registration_grace_seconds: Annotated[float, NON_NEGATIVE] = 300.0
    # The device plugin directory, the CDI specs and the Node object (read-only, one GET,
    # under node_read_timeout_seconds) are read this often; an advertised count older than
    # node_stale_seconds is not trusted.
    interval_seconds: Annotated[float, POSITIVE] = 60.0
    node_read_timeout_seconds: Annotated[float, POSITIVE] = 10.0
    node_stale_seconds: Annotated[float, POSITIVE] = 300.0


@dataclass(frozen=True)
class ChecksSection:
    ecc: EccCheck = field(default_factory=EccCheck)
    thermal: ThermalCheck = field(default_factory=ThermalCheck)
    pcie: PcieCheck = field(default_factory=PcieCheck)
    persistence: PersistenceCheck = field(default_factory=PersistenceCheck)
    recovery: RecoveryCheck = field(default_factory=RecoveryCheck)
    fabric_health: FabricHealthCheck = field(default_factory=FabricHealthCheck)
    mig: MigCheck = field(default_factory=MigCheck)
    nvlink: NvlinkCheck = field(default_factory=NvlinkCheck)
    xid: XidCheck = field(default_factory=XidCheck)
    sxid: SxidCheck = field(default_factory=SxidCheck)
    aer: AerCheck = field(default_factory=AerCheck)
    bus: BusCheck = field(default_factory=BusCheck)
    kubernetes: KubernetesCheck = field(default_factory=KubernetesCheck)
    processes: ProcessesCheck = field(default_factory=ProcessesCheck)
    infiniband: InfinibandCheck = field(default_factory=InfinibandCheck)
