"""[checks]: the health checks and their thresholds."""

from __future__ import annotations

from dataclasses import dataclass, field
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


@dataclass(frozen=True)
class PersistenceCheck:
    enabled: bool = True


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


@dataclass(frozen=True)
class XidCheck:
    enabled: bool = True
    # Application XIDs (the catalog's RESTART_APP bucket) make a GPU WARN for this long
    # after the last one...
    app_error_hold_seconds: Annotated[float, NON_NEGATIVE] = 3600.0
    # ...and CRITICAL when they come faster than this.
    app_error_rate_per_hour: Annotated[float, NON_NEGATIVE] = 6.0


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
class ChecksSection:
    ecc: EccCheck = field(default_factory=EccCheck)
    thermal: ThermalCheck = field(default_factory=ThermalCheck)
    pcie: PcieCheck = field(default_factory=PcieCheck)
    persistence: PersistenceCheck = field(default_factory=PersistenceCheck)
    mig: MigCheck = field(default_factory=MigCheck)
    nvlink: NvlinkCheck = field(default_factory=NvlinkCheck)
    xid: XidCheck = field(default_factory=XidCheck)
    sxid: SxidCheck = field(default_factory=SxidCheck)
    aer: AerCheck = field(default_factory=AerCheck)
    bus: BusCheck = field(default_factory=BusCheck)
