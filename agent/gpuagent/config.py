"""Configuration: TOML, validated at load against frozen dataclasses.

Unknown keys and wrong types are rejected with a `ConfigError` that names the dotted key
and, where the key appears in the file, its line, so `gpuagent config check` and
`gpuagent run` can print one clear line and exit 2.
"""

from __future__ import annotations

import dataclasses
import re
import socket
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from gpuagent.fleet.topics import AGGREGATOR_IDENTITY, NAME_RE, is_aggregator_identity

T = TypeVar("T")


class ConfigError(ValueError):
    """An invalid configuration: ``key`` is dotted ("sources.nvml.interval_seconds")."""

    def __init__(self, message: str, *, key: str = "", line: int | None = None) -> None:
        self.key = key
        self.line = line
        self.problem = message
        where = f" (line {line})" if line is not None else ""
        prefix = f"{key}{where}: " if key else (f"line {line}: " if line is not None else "")
        super().__init__(prefix + message)


# --- schema ---------------------------------------------------------------------------


@dataclass(frozen=True)
class AgentSection:
    node_name: str = ""  # empty: the host name
    cluster: str = "default"
    state_dir: Path = Path("/var/lib/gpuagent")

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

    @property
    def host_port(self) -> tuple[str, int]:
        return split_listen(self.listen)


def split_listen(listen: str) -> tuple[str, int]:
    """ "HOST:PORT" (validated at load) → (host, port); "[::1]:1" → ("::1", 1)."""
    host, _, port = listen.rpartition(":")
    return host.strip("[]"), int(port)


@dataclass(frozen=True)
class TextfileOutput:
    # node_exporter's textfile collector directory (e.g.
    # /var/lib/prometheus/node-exporter); empty: off. gpuagent.prom is written atomically.
    dir: str = ""
    # At most one write per this many seconds.
    min_interval_seconds: float = 5.0


@dataclass(frozen=True)
class MqttConnection:
    """How to reach the MQTT broker (the agent's reporter and the aggregator alike)."""

    host: str = "localhost"
    port: int = 8883
    # TLS (on by default: credentials and node reports never cross the network in clear).
    tls: bool = True
    # CA bundle to verify the broker with; empty: the system's.
    ca_file: str = ""
    # Client certificate and key (with the broker's use_identity_as_username, the
    # certificate's CN is the MQTT user name, and must be the node name).
    cert_file: str = ""
    key_file: str = ""
    # Username/password authentication; the password is read from a file (mode 0600).
    username: str = ""
    password_file: str = ""
    # Empty: "gpuagent-<node>" for an agent, "gpuagent-aggregator-<host>" for the aggregator.
    client_id: str = ""
    topic_prefix: str = "gpuagent/v1"
    keepalive_seconds: int = 30
    # Reconnect backoff: doubles from min to max, with jitter.
    reconnect_min_seconds: float = 1.0
    reconnect_max_seconds: float = 60.0


@dataclass(frozen=True)
class SpoolSection:
    # Events and action records wait here (SQLite under agent.state_dir) until the broker
    # acknowledges them. The oldest are dropped (and counted) past either bound.
    max_bytes: int = 64 * 1024 * 1024
    max_age_seconds: float = 7 * 86400.0


@dataclass(frozen=True)
class MqttOutput:
    enabled: bool = False
    broker: MqttConnection = field(default_factory=MqttConnection)
    # The retained state report is sent on every change and at least this often.
    state_interval_seconds: float = 30.0
    # MQTT 5 message expiry of events and action records (a broker drops older ones for
    # a subscriber that was away longer).
    event_expiry_seconds: int = 86400
    spool: SpoolSection = field(default_factory=SpoolSection)
    # Remote commands that can destroy work (GPU reset) are refused unless this is true.
    allow_remote_reset: bool = False
    # Largest command payload accepted from the broker.
    max_command_bytes: int = 65536
    # Commands sent longer ago than this (or this far in the future: clock skew) are
    # refused, so one queued for a node that was away does not run when it returns.
    max_command_age_seconds: float = 300.0
    # A spooled message leaves the spool once the aggregator acknowledges storing it; one
    # not acknowledged within this is sent again (the wait doubling with each try, up to
    # 32x). 0: the broker's acknowledgement is enough (for a consumer that sends no acks).
    ack_timeout_seconds: float = 30.0


@dataclass(frozen=True)
class OutputsSection:
    textfile: TextfileOutput = field(default_factory=TextfileOutput)
    mqtt: MqttOutput = field(default_factory=MqttOutput)


@dataclass(frozen=True)
class NvmlSourceSection:
    interval_seconds: float = 5.0
    call_timeout_seconds: float = 2.0
    # Values that rarely change (persistence, MIG and ECC mode, memory clock) are read on
    # this slower cadence to keep NVML calls per poll low.
    slow_interval_seconds: float = 30.0
    # After NVML fails to initialise (driver not loaded, ...), retry this often.
    init_retry_seconds: float = 30.0


@dataclass(frozen=True)
class KmsgSourceSection:
    enabled: bool = True
    # /dev/kmsg on a node; a regular file or a FIFO is followed the same way (tests, drills).
    path: Path = Path("/dev/kmsg")
    # At start the current boot's buffer is read once; records older than this (relative
    # to the agent's start) are skipped.
    lookback_seconds: float = 86400.0


@dataclass(frozen=True)
class NvmlEventsSourceSection:
    # XID events straight from the driver (nvmlEventSetWait), beside the kernel log.
    enabled: bool = True


@dataclass(frozen=True)
class SysfsSourceSection:
    enabled: bool = True
    # sysfs mount point (tests point this at a fixture tree).
    root: Path = Path("/sys")
    interval_seconds: float = 30.0


@dataclass(frozen=True)
class UdevSourceSection:
    # PCI add/remove and driver bind/unbind of NVIDIA devices, as they happen (netlink).
    enabled: bool = True


@dataclass(frozen=True)
class SourcesSection:
    nvml: NvmlSourceSection = field(default_factory=NvmlSourceSection)
    nvml_events: NvmlEventsSourceSection = field(default_factory=NvmlEventsSourceSection)
    kmsg: KmsgSourceSection = field(default_factory=KmsgSourceSection)
    sysfs: SysfsSourceSection = field(default_factory=SysfsSourceSection)
    udev: UdevSourceSection = field(default_factory=UdevSourceSection)


@dataclass(frozen=True)
class EventsSection:
    # Events are kept this long (and at most max_events), for checks, status and reports.
    retention_seconds: float = 86400.0
    max_events: int = 10000
    # The same XID on the same GPU from the kernel log and from NVML within this many
    # seconds is one fault.
    dedup_window_seconds: float = 10.0


@dataclass(frozen=True)
class EccCheck:
    enabled: bool = True
    # Corrected (single-bit) errors per hour above which the GPU is WARN.
    sbe_rate_per_hour: float = 100.0
    # Window over which the SBE rate is measured.
    rate_window_seconds: float = 3600.0


@dataclass(frozen=True)
class ThermalCheck:
    enabled: bool = True
    # WARN when the GPU is within this many degrees of its slowdown threshold.
    slowdown_margin_c: float = 5.0
    # CRITICAL when the GPU is within this many degrees of its shutdown threshold.
    shutdown_margin_c: float = 5.0
    # Used when NVML does not report thresholds (H100 SXM defaults).
    fallback_slowdown_c: float = 87.0
    fallback_shutdown_c: float = 92.0
    # Throttling is a finding only while it costs performance: the GPU at least this busy,
    # and heat or the power brake holding its clocks back for at least
    # throttle_min_fraction of the last throttle_window_seconds (NVML's duration counters).
    throttle_window_seconds: float = 300.0
    throttle_min_fraction: float = 0.25
    throttle_min_utilization_pct: float = 50.0


@dataclass(frozen=True)
class PcieCheck:
    enabled: bool = True
    # A link below its maximum generation or width for longer than this is WARN.
    # (GPUs drop the link speed at idle to save power, so a short dip is normal.)
    degraded_hold_seconds: float = 300.0
    # Only flag a lower generation when the GPU is busy enough that it should be at speed.
    degraded_min_utilization_pct: float = 10.0
    # PCIe replays per minute above which the GPU is WARN.
    replay_rate_per_minute: float = 10.0


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
    crc_rate_per_second: float = 100.0
    # Window over which the CRC rate is measured and replay or recovery errors count as new.
    rate_window_seconds: float = 60.0


@dataclass(frozen=True)
class XidCheck:
    enabled: bool = True
    # Application XIDs (the catalog's RESTART_APP bucket) make a GPU WARN for this long
    # after the last one...
    app_error_hold_seconds: float = 3600.0
    # ...and CRITICAL when they come faster than this.
    app_error_rate_per_hour: float = 6.0


@dataclass(frozen=True)
class SxidCheck:
    enabled: bool = True


@dataclass(frozen=True)
class AerCheck:
    enabled: bool = True
    # Corrected PCIe errors per hour (kernel AER reports and sysfs counters) above which a
    # GPU is WARN; any uncorrectable (non-fatal or fatal) error is CRITICAL.
    corrected_rate_per_hour: float = 60.0
    rate_window_seconds: float = 3600.0


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


@dataclass(frozen=True)
class ExpectedGpu:
    """One GPU, by NVML index, whose MIG set-up differs from the node-wide expectation."""

    index: int
    # Unset: checks.mig.expected applies to this GPU.
    mig_mode: Literal["any", "enabled", "disabled"] | None = None
    # Unset: inventory.expected.mig_profiles applies; []: no expectation for this GPU.
    mig_profiles: list[str] | None = None


@dataclass(frozen=True)
class InventoryExpected:
    """What this node should be; empty strings and 0 mean "no expectation"."""

    gpus: int = 0
    # Substring of the NVML product name, e.g. "H100".
    model: str = ""
    # Exact ("550.54.15") or a prefix ending in a dot or a major version ("550." or "550").
    driver_version: str = ""
    cuda_driver_version: str = ""
    vbios_version: str = ""
    kernel_release: str = ""
    # 0: the GPU's default power limit.
    power_limit_watts: float = 0.0
    # Kernel modules that must be loaded (nvidia_peermem on GPUDirect RDMA nodes).
    modules: list[str] = field(default_factory=lambda: ["nvidia"])
    # GPU-instance profiles every GPU with MIG enabled should carry, as a multiset
    # (["1g.10gb", "1g.10gb", "3g.40gb"]); empty: no expectation. (The MIG mode itself is
    # checks.mig.expected.)
    mig_profiles: list[str] = field(default_factory=list)
    # Persistence mode every GPU should be in; "any": no expectation beyond the persistence
    # check's. "disabled" needs checks.persistence.enabled = false (that check wants it on).
    persistence: Literal["any", "enabled", "disabled"] = "any"
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
    refresh_seconds: float = 300.0
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
    # Record the first healthy inventory as the baseline (in agent.state_dir) and report
    # any later change from it (a GPU fewer than learned when expected.gpus is 0).
    learn: bool = False
    expected: InventoryExpected = field(default_factory=InventoryExpected)


@dataclass(frozen=True)
class RemediationRule:
    """Findings → actions. A rule matches a finding by check and minimum severity, and,
    for the xid check, optionally by the XID catalog's action bucket or the XIDs."""

    check: str
    actions: list[Literal["enable_persistence", "cordon", "reset_gpu", "cap_power"]]
    severity: Literal["WARN", "CRITICAL"] = "CRITICAL"
    # xid findings only: match when the finding's bucket is one of these ("" = any).
    xid_buckets: list[str] = field(default_factory=list)
    xids: list[int] = field(default_factory=list)
    # Reason given with a cordon request (default: the finding's reason).
    cordon_reason: str = ""


def _default_rules() -> list[RemediationRule]:
    # The runbooks' defaults; config.example.toml shows them as [[remediation.rules]].
    return [
        RemediationRule("persistence", ["enable_persistence"], "WARN"),
        RemediationRule("ecc", ["cordon", "reset_gpu"]),
        RemediationRule("row_remap", ["cordon"]),
        RemediationRule(
            "row_remap", ["cordon", "reset_gpu"], "WARN", cordon_reason="reset required"
        ),
        RemediationRule(
            "retired_pages", ["cordon", "reset_gpu"], "WARN", cordon_reason="reset required"
        ),
        RemediationRule("xid", ["cordon", "reset_gpu"], xid_buckets=["RESET_GPU"]),
        RemediationRule("xid", ["cordon"], xids=[79, 95, 119, 120]),
        RemediationRule("availability", ["cordon"]),
        RemediationRule("bus", ["cordon"]),
        RemediationRule("nvlink", ["cordon"]),
        RemediationRule("thermal", ["cap_power"]),
    ]


@dataclass(frozen=True)
class RemediationBudgets:
    # At most this many GPU resets per GPU within the window...
    reset_per_gpu: int = 1
    reset_per_gpu_window_seconds: float = 21600.0
    # ...and per node within its window.
    reset_per_node: int = 3
    reset_per_node_window_seconds: float = 86400.0
    # Cordon requests per node within the window (a flapping finding must not spam).
    cordon_per_node: int = 3
    cordon_per_node_window_seconds: float = 86400.0
    # Every other action (persistence, power cap) per GPU within the window.
    other_per_gpu: int = 6
    other_per_gpu_window_seconds: float = 3600.0
    # The same action on the same target is not attempted again sooner than this.
    cooldown_seconds: float = 300.0


@dataclass(frozen=True)
class RemediationReset:
    # {bus_id} is replaced by the GPU's bus id. Under the simulator the simulated GPU is reset.
    command: str = "nvidia-smi --gpu-reset -i {bus_id}"
    timeout_seconds: float = 120.0
    # Only reset a GPU once the node is cordoned (when a cordon backend is configured).
    require_cordon: bool = True
    # Resetting a GPU with MIG instances destroys them; refuse unless allowed.
    allow_mig: bool = False
    # After a reset the GPU must answer and be healthy for this many polls.
    verify_polls: int = 3
    # Run `dcgmi diag -r 1` after a reset when dcgmi is installed.
    dcgm_diag: bool = True


@dataclass(frozen=True)
class RemediationPower:
    # Thermal emergency: cap the power limit to this fraction of the default limit...
    cap_fraction: float = 0.7
    # ...and restore it once the GPU has been cool (no thermal finding) this long.
    restore_after_seconds: float = 600.0


@dataclass(frozen=True)
class RemediationKubernetes:
    # Empty: the in-cluster service account.
    kubeconfig: str = ""
    # Kubernetes node name; empty: agent.node_name.
    node_name: str = ""
    taint_key: str = "gpuagent.io/gpu-unhealthy"


@dataclass(frozen=True)
class RemediationSlurm:
    scontrol: str = "scontrol"
    # Slurm node name; empty: agent.node_name.
    node_name: str = ""


@dataclass(frozen=True)
class RemediationCordon:
    # Any of "kubernetes", "slurm", "command", "aggregator"; empty: no cordon requests.
    backends: list[Literal["kubernetes", "slurm", "command", "aggregator"]] = field(
        default_factory=list
    )
    # For the "command" backend: run with the request as JSON on stdin.
    command: str = ""
    timeout_seconds: float = 30.0
    # Uncordon (only a node we cordoned) after every finding has been OK this long.
    uncordon_after_recovery: bool = False
    healthy_hold_seconds: float = 1800.0
    kubernetes: RemediationKubernetes = field(default_factory=RemediationKubernetes)
    slurm: RemediationSlurm = field(default_factory=RemediationSlurm)


@dataclass(frozen=True)
class RemediationSection:
    # "observe": plan, log and audit what would be done; "enforce": do it.
    mode: Literal["observe", "enforce"] = "observe"
    # While this file exists every action is paused (`gpuagent remediation pause`).
    kill_switch: Path = Path("/etc/gpuagent/remediation.paused")
    rules: list[RemediationRule] = field(default_factory=_default_rules)
    budgets: RemediationBudgets = field(default_factory=RemediationBudgets)
    reset: RemediationReset = field(default_factory=RemediationReset)
    power: RemediationPower = field(default_factory=RemediationPower)
    cordon: RemediationCordon = field(default_factory=RemediationCordon)


@dataclass(frozen=True)
class CordonBudgetSection:
    # Approve a cordon request only while, counting it, at most max_nodes nodes and at most
    # max_percent of the cluster's known nodes were cordoned within window_seconds.
    max_nodes: int = 2
    max_percent: float = 10.0
    window_seconds: float = 3600.0
    # Whether this aggregator decides cordon requests. Exactly one of the aggregators in a
    # share group must (docs/fleet.md): the budget lives in its memory.
    arbiter: bool = True


@dataclass(frozen=True)
class AggregatorHttpSection:
    # A connection that has not sent a whole request head (request line and headers) this
    # long after it opened, or after its previous request, is closed.
    header_timeout_seconds: float = 10.0
    # A request body not received within this many seconds is answered 408.
    body_timeout_seconds: float = 10.0
    # An idle keep-alive connection is closed after this many seconds.
    keepalive_timeout_seconds: float = 15.0
    # At most this many connections are open at once; further ones are closed at accept.
    max_connections: int = 256


# Where systemd hands the aggregator its command token (LoadCredential= in its unit).
DEFAULT_COMMAND_TOKEN_FILE = "/run/credentials/gpuagent-aggregator.service/command-token"  # noqa: S105


@dataclass(frozen=True)
class AggregatorSection:
    # HTTP: the JSON API (/api/v1/...), the fleet page (/) and fleet metrics (/metrics).
    listen: str = "127.0.0.1:19500"
    # Fleet state (SQLite).
    database: Path = Path("/var/lib/gpuagent-aggregator/fleet.sqlite")
    # Shared-subscription group: every aggregator with the same group splits the fleet's
    # messages; empty: plain subscriptions (one aggregator sees everything).
    share_group: str = "gpuagent"
    # A node whose last report is older than this is shown as stale (offline comes from
    # its Last Will at once).
    stale_after_seconds: float = 120.0
    # History (events, action records, replies, commands, cordon decisions) older than this
    # is deleted; cordon decisions are kept at least for the cordon budget's window.
    events_retention_seconds: float = 7 * 86400.0
    max_events: int = 1_000_000
    # Sending commands to nodes (POST .../commands) needs "Authorization: Bearer <token>"
    # with the token in this file; without a readable token (empty, missing file), commands
    # are refused.
    command_token_file: str = DEFAULT_COMMAND_TOKEN_FILE
    # Host header names (with or without a port) the HTTP server answers besides the
    # listen address, localhost, 127.0.0.1 and [::1]; others get 421 (DNS rebinding).
    http_hosts: list[str] = field(default_factory=list)
    # MQTT 5 message expiry of commands and cordon decisions: the broker drops one that has
    # waited this long for a node that is away, rather than deliver it when the node comes
    # back (the node's session lasts a day).
    command_expiry_seconds: int = 300
    broker: MqttConnection = field(default_factory=MqttConnection)
    cordon_budget: CordonBudgetSection = field(default_factory=CordonBudgetSection)
    http: AggregatorHttpSection = field(default_factory=AggregatorHttpSection)

    @property
    def host_port(self) -> tuple[str, int]:
        return split_listen(self.listen)


@dataclass(frozen=True)
class Config:
    agent: AgentSection = field(default_factory=AgentSection)
    api: ApiSection = field(default_factory=ApiSection)
    metrics: MetricsSection = field(default_factory=MetricsSection)
    outputs: OutputsSection = field(default_factory=OutputsSection)
    sources: SourcesSection = field(default_factory=SourcesSection)
    events: EventsSection = field(default_factory=EventsSection)
    checks: ChecksSection = field(default_factory=ChecksSection)
    inventory: InventorySection = field(default_factory=InventorySection)
    remediation: RemediationSection = field(default_factory=RemediationSection)
    aggregator: AggregatorSection = field(default_factory=AggregatorSection)


# --- extra rules beyond types ----------------------------------------------------------

_POSITIVE = {
    "sources.nvml.interval_seconds",
    "sources.nvml.call_timeout_seconds",
    "sources.nvml.slow_interval_seconds",
    "sources.nvml.init_retry_seconds",
    "checks.ecc.rate_window_seconds",
    "checks.aer.rate_window_seconds",
    "checks.nvlink.rate_window_seconds",
    "sources.sysfs.interval_seconds",
    "events.retention_seconds",
    "events.max_events",
    "outputs.mqtt.state_interval_seconds",
    "outputs.mqtt.event_expiry_seconds",
    "outputs.mqtt.max_command_bytes",
    "outputs.mqtt.max_command_age_seconds",
    "outputs.mqtt.spool.max_bytes",
    "outputs.mqtt.spool.max_age_seconds",
    "aggregator.stale_after_seconds",
    "aggregator.events_retention_seconds",
    "aggregator.max_events",
    "aggregator.command_expiry_seconds",
    "aggregator.cordon_budget.window_seconds",
    "aggregator.http.header_timeout_seconds",
    "aggregator.http.body_timeout_seconds",
    "aggregator.http.keepalive_timeout_seconds",
    "aggregator.http.max_connections",
    *(
        f"{section}.{key}"
        for section in ("outputs.mqtt.broker", "aggregator.broker")
        for key in ("keepalive_seconds", "reconnect_min_seconds", "reconnect_max_seconds")
    ),
    "inventory.refresh_seconds",
    "checks.thermal.throttle_window_seconds",
}
_NON_NEGATIVE = {
    "checks.ecc.sbe_rate_per_hour",
    "checks.thermal.slowdown_margin_c",
    "checks.thermal.shutdown_margin_c",
    "checks.pcie.degraded_hold_seconds",
    "checks.pcie.degraded_min_utilization_pct",
    "checks.thermal.throttle_min_utilization_pct",
    "checks.pcie.replay_rate_per_minute",
    "outputs.textfile.min_interval_seconds",
    "checks.xid.app_error_hold_seconds",
    "checks.xid.app_error_rate_per_hour",
    "checks.aer.corrected_rate_per_hour",
    "outputs.mqtt.ack_timeout_seconds",
    "checks.nvlink.crc_rate_per_second",
    "sources.kmsg.lookback_seconds",
    "events.dedup_window_seconds",
    "aggregator.cordon_budget.max_nodes",
    "aggregator.cordon_budget.max_percent",
    "inventory.expected.gpus",
    "inventory.expected.power_limit_watts",
    "inventory.expected.gpu.index",
}
# A GPU-instance profile as nvidia-smi names it: slices "g", memory "gb", and a variant.
_MIG_PROFILE_RE = re.compile(r"^[1-9]\d*g\.[1-9]\d*gb([+-][a-z]+(\.[a-z]+)?)?$")
# Levels of letters, digits, '.', '_', '-' joined by '/': no wildcard, no empty level, no
# leading '$' (reserved for the broker's own topics).
_TOPIC_PREFIX_RE = re.compile(r"^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$")
_HTTP_HOST_RE = re.compile(r"^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.\-]+)(:\d{1,5})?$")
_LISTEN_RE = re.compile(r"^(\[[0-9a-fA-F:]+\]|[A-Za-z0-9.\-]*):(\d{1,5})$")


def _check_value(key: str, value: object) -> str | None:
    """Return a problem with an already type-checked value, or None."""
    if key in _POSITIVE and isinstance(value, int | float) and value <= 0:
        return "must be greater than 0"
    if key in _NON_NEGATIVE and isinstance(value, int | float) and value < 0:
        return "must not be negative"
    if key.endswith("_fraction") and isinstance(value, int | float) and not 0 < value <= 1:
        return "must be greater than 0 and at most 1"
    if key.endswith(".port") and isinstance(value, int) and not 0 < value < 65536:
        return "must be a port number, 1 to 65535"
    return _check_text(key, value)


def _check_text(key: str, value: object) -> str | None:
    """Problems with names, addresses and profile lists."""
    if key.startswith("inventory.expected.") and key.endswith(".mig_profiles") and value:
        odd = [p for p in typing.cast("list[str]", value) if not _MIG_PROFILE_RE.match(p)]
        if odd:
            return f'{odd[0]!r} is not a GPU-instance profile name like "1g.10gb" or "1g.10gb+me"'
    if key == "aggregator.http_hosts":
        odd = [h for h in typing.cast("list[str]", value) if not _HTTP_HOST_RE.match(h)]
        if odd:
            return f'{odd[0]!r} is not a host name, "name:port", "[v6 address]" or "[...]:port"'
    if key in ("metrics.listen", "aggregator.listen"):
        match = _LISTEN_RE.match(str(value))
        if match is None or not 0 < int(match.group(2)) < 65536:
            return 'must be "HOST:PORT", e.g. "0.0.0.0:19400" or "[::1]:19400"'
    return _check_topic_name(key, value)


def _check_topic_name(key: str, value: object) -> str | None:
    """Names that become MQTT topic levels and ACL user names in fleet reports."""
    if key in ("agent.node_name", "agent.cluster") and value and not NAME_RE.match(str(value)):
        return "must be 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit"
    if key == "agent.node_name" and is_aggregator_identity(str(value)):
        # The broker's ACL gives these identities the right to send commands to every node.
        return (
            f'"{AGGREGATOR_IDENTITY}" and "{AGGREGATOR_IDENTITY}-*" are aggregator identities '
            "on the broker"
        )
    if key == "aggregator.share_group" and value and not NAME_RE.match(str(value)):
        return "must be 1-128 letters, digits, '.', '_' or '-' (it is one topic level)"
    if key.endswith(".topic_prefix") and not _TOPIC_PREFIX_RE.match(str(value)):
        return 'must be topic levels without wildcards, e.g. "gpuagent/v1"'
    return None


# --- loading ------------------------------------------------------------------------------


def load_config(path: Path | None) -> Config:
    """Load and validate ``path``; None gives the defaults."""
    if path is None:
        return Config()
    return parse_config(read_text(path))


def read_text(path: Path) -> str:
    """A configuration-like file's text, or a ConfigError saying why it can't be had."""
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not UTF-8 text") from None


def parse_config(text: str) -> Config:
    data = parse_toml(text)
    config = build_dataclass(Config, data, text)
    _check_consistency(config, text)
    return config


def _check_consistency(config: Config, text: str) -> None:
    """Rules that span keys: what one key says must not contradict another."""
    expected = config.inventory.expected
    _check_expected_gpus(expected, text)
    if expected.persistence == "disabled" and config.checks.persistence.enabled:
        key = "inventory.expected.persistence"
        raise ConfigError(
            '"disabled" contradicts the persistence check, which wants persistence on: '
            "set checks.persistence.enabled = false as well",
            key=key,
            line=find_line(text, key),
        )


def _check_expected_gpus(expected: InventoryExpected, text: str) -> None:
    seen: set[int] = set()
    for gpu in expected.gpu:
        if gpu.index in seen:
            key = "inventory.expected.gpu.index"
            raise ConfigError(
                f"GPU {gpu.index} is listed twice", key=key, line=_nth_line(text, key, gpu.index)
            )
        seen.add(gpu.index)
        if gpu.mig_mode == "disabled" and gpu.mig_profiles:
            key = "inventory.expected.gpu.mig_profiles"
            raise ConfigError(
                f"GPU {gpu.index}: GPU instances need MIG mode enabled, not disabled",
                key=key,
                line=_nth_line(text, "inventory.expected.gpu.index", gpu.index),
            )


def _nth_line(text: str, key: str, value: int) -> int | None:
    """The line of the last ``key = value`` (an entry of an array of tables), else the key's."""
    name = key.rsplit(".", 1)[-1]
    pattern = re.compile(rf"^\s*{re.escape(name)}\s*=\s*{value}\s*(#.*)?$")
    lines = [n for n, raw in enumerate(text.splitlines(), start=1) if pattern.match(raw)]
    return lines[-1] if lines else find_line(text, key)


def parse_toml(text: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        line_match = re.search(r"line (\d+)", str(exc))
        message = re.sub(r"\s*\(at line \d+, column \d+\)", "", str(exc))
        line = int(line_match.group(1)) if line_match else None
        raise ConfigError(f"invalid TOML: {message}", line=line) from None


def build_dataclass(cls: type[T], data: dict[str, Any], text: str, prefix: str = "") -> T:
    """Build dataclass ``cls`` from a TOML table, rejecting unknown keys and wrong types."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if key not in names:
            known = ", ".join(sorted(names))
            raise ConfigError(
                f"unknown key (known here: {known})", key=dotted, line=find_line(text, dotted)
            )
        kwargs[key] = _convert(hints[key], value, dotted, text)
        problem = _check_value(dotted, kwargs[key])
        if problem:
            raise ConfigError(problem, key=dotted, line=find_line(text, dotted))
    for field_ in dataclasses.fields(cls):  # type: ignore[arg-type]
        required = (
            field_.default is dataclasses.MISSING and field_.default_factory is dataclasses.MISSING
        )
        if required and field_.name not in kwargs:
            table = prefix.rstrip(".")
            raise ConfigError(
                "missing required key", key=f"{prefix}{field_.name}", line=find_line(text, table)
            )
    return cls(**kwargs)


def _convert(hint: Any, value: Any, key: str, text: str) -> Any:  # noqa: PLR0911, PLR0912, C901
    def fail(expected: str) -> ConfigError:
        shown = f"{type(value).__name__} {value!r}"
        return ConfigError(f"expected {expected}, got {shown}", key=key, line=find_line(text, key))

    if dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise fail("a table")
        return build_dataclass(typing.cast("type[Any]", hint), value, text, prefix=f"{key}.")
    origin = typing.get_origin(hint)
    if origin is Literal:
        choices = typing.get_args(hint)
        if value not in choices:
            raise fail("one of " + ", ".join(repr(c) for c in choices))
        return value
    if origin in (types.UnionType, typing.Union):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return _convert(args[0], value, key, text)
    if origin is list:
        (item,) = typing.get_args(hint)
        if not isinstance(value, list):
            raise fail("a list")
        return [_convert(item, v, key, text) for v in value]
    if hint is bool:
        if not isinstance(value, bool):
            raise fail("true or false")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise fail("an integer")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise fail("a number")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise fail("a string")
        return value
    if hint is Path:
        if not isinstance(value, str) or not value:
            raise fail("a non-empty path string")
        return Path(value)
    raise fail(str(hint))  # pragma: no cover - a schema type this loader does not know


_HEADER_RE = re.compile(r"^\s*\[\[?\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")
_KEY_RE = re.compile(r"^\s*([A-Za-z0-9_\-\"'.]+?)\s*=")


def find_line(text: str, dotted: str) -> int | None:
    """Line (1-based) where ``dotted`` is set or its table opens; None if not found.

    TOML parsers do not report positions, so this walks table headers and key lines,
    which covers the plain files people write.
    """
    target = dotted.split(".")
    table: list[str] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        header = _HEADER_RE.match(raw)
        if header:
            table = [p.strip().strip("\"'") for p in header.group(1).split(".")]
            if table == target:
                return number
            continue
        key = _KEY_RE.match(raw)
        if key:
            path = table + [p.strip().strip("\"'") for p in key.group(1).split(".")]
            if path == target or path == target[: len(path)]:
                return number
    return None
