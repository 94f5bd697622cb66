"""The node-side sections: [agent], [api], [metrics], [sources], [events]."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

from gpuagent.config.ranges import NON_NEGATIVE, POSITIVE
from gpuagent.config.schema.dcgm import DcgmSourceSection


@dataclass(frozen=True)
class AgentSection:
    node_name: str = ""  # empty: the host name
    cluster: str = "default"
    state_dir: Path = Path("/var/lib/gpuagent")
    # Where the node sits, beyond what NVML knows: free-form location labels such as
    # {rack = "r129", leaf = "leaf-07", power_feed = "b"}, reported with the node's state
    # so the fleet can join what nodes of one rack, switch or feed see.
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def resolved_node_name(self) -> str:
        return self.node_name or socket.gethostname()


@dataclass(frozen=True)
class ApiSection:
    socket: Path = Path("/run/gpuagent/gpuagent.sock")
    # Group allowed to read status through the socket; empty: owner only (mode 0600).
    group: str = ""


@dataclass(frozen=True)
class MetricsSection:
    listen: str = "0.0.0.0:19400"
    # /healthz fails once the event loop has not turned for this long, or no snapshot was
    # taken for this long plus the NVML poll interval (the probes a kubelet or a load
    # balancer asks; systemd's watchdog judges the loop the same way).
    health_stall_seconds: Annotated[float, POSITIVE] = 60.0
    # /metrics is rendered after a snapshot that changed what the node is judged (a
    # finding, an event, a GPU or NVML lost or back) at once, and otherwise at most this
    # often: a 1 s poll need not pay for rendering every second what is scraped every
    # 15-30 s. 0: after every snapshot. Values served are then at most this old.
    render_interval_seconds: Annotated[float, NON_NEGATIVE] = 15.0

    @property
    def host_port(self) -> tuple[str, int]:
        return split_listen(self.listen)


def split_listen(listen: str) -> tuple[str, int]:
    """ "HOST:PORT" (validated at load) → (host, port); "[::1]:1" → ("::1", 1)."""
    host, _, port = listen.rpartition(":")
    return host.strip("[]"), int(port)


@dataclass(frozen=True)
class NvmlSourceSection:
    interval_seconds: Annotated[float, POSITIVE] = 5.0
    call_timeout_seconds: Annotated[float, POSITIVE] = 2.0
    # Values that rarely change (persistence, MIG and ECC mode, memory clock) and the
    # counters that are costly to read (energy, throttle durations) are read on this slower
    # cadence to keep NVML's CPU per poll low.
    slow_interval_seconds: Annotated[float, POSITIVE] = 30.0
    # After NVML fails to initialise (driver not loaded, ...), retry this often.
    init_retry_seconds: Annotated[float, POSITIVE] = 30.0
    # Profiling metrics (DCGM_FI_PROF_*) from GPM on GPUs that have it (Hopper and later):
    # one sample and one metrics call per GPU and MIG instance, at most this often (the
    # metrics call costs 1.5 ms of CPU on a real H200); values are averages over it.
    profiling: bool = True
    profiling_interval_seconds: Annotated[float, POSITIVE] = 30.0
    # procfs as the agent sees it: each GPU process's owner, and whether it still exists.
    # An agent in a container sees only its own PID namespace unless it shares the host's
    # (hostPID) or is given the host's /proc mounted elsewhere (then point this there).
    proc_root: Path = Path("/proc")


@dataclass(frozen=True)
class KmsgSourceSection:
    enabled: bool = True
    # /dev/kmsg on a node; a regular file or a FIFO is followed the same way (tests, drills).
    path: Path = Path("/dev/kmsg")
    # At start the current boot's buffer is read once; records older than this (relative
    # to the agent's start) are skipped.
    lookback_seconds: Annotated[float, NON_NEGATIVE] = 86400.0


@dataclass(frozen=True)
class NvmlEventsSourceSection:
    # XID events straight from the driver (nvmlEventSetWait), beside the kernel log.
    enabled: bool = True
    # NVIDIA's GPU operational events too (drivers R615 and later; a preview, so off by
    # default): each becomes an event with its legacy Xid. Where the driver lacks them,
    # nothing changes.
    operational: bool = False


@dataclass(frozen=True)
class SysfsSourceSection:
    enabled: bool = True
    # sysfs mount point (tests point this at a fixture tree).
    root: Path = Path("/sys")
    interval_seconds: Annotated[float, POSITIVE] = 30.0


@dataclass(frozen=True)
class UdevSourceSection:
    # PCI add/remove and driver bind/unbind of NVIDIA devices, as they happen (netlink).
    enabled: bool = True
    # udevd's control socket: where it is missing no udevd runs, and the source is
    # unavailable (not failing) until it appears.
    control: Path = Path("/run/udev/control")


@dataclass(frozen=True)
class SourcesSection:
    nvml: NvmlSourceSection = field(default_factory=NvmlSourceSection)
    nvml_events: NvmlEventsSourceSection = field(default_factory=NvmlEventsSourceSection)
    kmsg: KmsgSourceSection = field(default_factory=KmsgSourceSection)
    sysfs: SysfsSourceSection = field(default_factory=SysfsSourceSection)
    udev: UdevSourceSection = field(default_factory=UdevSourceSection)
    dcgm: DcgmSourceSection = field(default_factory=DcgmSourceSection)


@dataclass(frozen=True)
class EventsSection:
    # Events are kept this long (and at most max_events), for checks, status and reports.
    retention_seconds: Annotated[float, POSITIVE] = 86400.0
    max_events: Annotated[int, POSITIVE] = 10000
    # The same XID on the same GPU from the kernel log and from NVML within this many
    # seconds is one fault.
    dedup_window_seconds: Annotated[float, NON_NEGATIVE] = 10.0
    # Records of one GPU, kind, XID, root XID and process less than this many seconds
    # apart are one incident: its first records are kept, the rest counted.
    incident_gap_seconds: Annotated[float, POSITIVE] = 60.0
