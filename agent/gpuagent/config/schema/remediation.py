"""[remediation]: rules, budgets and how each action is done."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

from gpuagent.config.ranges import AT_LEAST_ONE, FRACTION, NON_NEGATIVE, POSITIVE, Range

# What a finding recommends: the values of gpuagent.checks.vocabulary.Action, spelled out
# here because the checks import the configuration (a test keeps the two the same).
FindingAction = Literal[
    "none",
    "investigate",
    "restart_app",
    "reset_gpu",
    "drain_and_reset",
    "drain_and_reboot",
    "check_cooling",
    "check_power",
    "reseat_or_replace",
    "contact_support",
    "enable_ecc",
    "enable_persistence",
    "set_mig_mode",
    "set_mig_layout",
    "disable_persistence",
    "load_driver",
    "install_driver",
    "reboot",
    "run_as_root",
    "start_service",
    "restart_fabric_manager",
    "restore_settings",
    "fix_state_dir",
    "restart_device_plugin",
    "fix_container_toolkit",
]


@dataclass(frozen=True)
class RemediationRule:
    """Findings → actions. A rule matches a finding by check and minimum severity,
    optionally by the action the finding recommends, and, for the xid check, optionally by
    the XID catalog's action bucket or the XIDs."""

    check: str
    actions: list[Literal["enable_persistence", "cordon", "reset_gpu", "cap_power"]]
    severity: Literal["WARN", "CRITICAL"] = "CRITICAL"
    # xid findings only: match when the finding's bucket is one of these ("" = any).
    xid_buckets: list[str] = field(default_factory=list)
    xids: list[Annotated[int, AT_LEAST_ONE]] = field(default_factory=list)
    # Match only findings whose recommended action is one of these (none listed: any),
    # e.g. "drain_and_reboot": the action `gpuagent status` shows with each finding.
    finding_actions: list[FindingAction] = field(default_factory=list)
    # Reason given with a cordon request (default: the finding's reason).
    cordon_reason: str = ""


# The recommended actions (gpuagent.checks.vocabulary.Action) of findings the defaults
# cordon for even where no rule for the whole check does.
_OUT_OF_SERVICE: tuple[FindingAction, ...] = (
    "reset_gpu",
    "drain_and_reset",
    "drain_and_reboot",
    "reseat_or_replace",  # an Xid 74 whose registers point at the link's hardware
    "contact_support",
)
_DRIVER_BROKEN: tuple[FindingAction, ...] = ("load_driver", "install_driver", "reboot")


def _default_rules() -> list[RemediationRule]:
    # The runbooks' defaults; config.example.toml shows them as [[remediation.rules]] and
    # docs/remediation-policy.md says why each is there. Every CRITICAL a check can report
    # has a rule, except those no cordon helps (see that page).
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
        # Every other XID that takes the GPU out of service: Xid 48 alone, 74, 79, 154,
        # fatal NVLink5 XIDs, "contact support". Not the application-error rate, whose
        # cause is more often the workload than the GPU.
        RemediationRule("xid", ["cordon"], finding_actions=list(_OUT_OF_SERVICE)),
        RemediationRule("availability", ["cordon"]),
        RemediationRule("bus", ["cordon"]),
        RemediationRule("nvlink", ["cordon"]),
        RemediationRule("aer", ["cordon"]),
        RemediationRule("sxid", ["cordon"]),
        RemediationRule("dcgm", ["cordon"]),
        RemediationRule("kernel", ["cordon"]),
        # The driver cannot serve the GPUs; not the agent's own trouble (no permission,
        # a timeout), which no cordon fixes.
        RemediationRule("nvml", ["cordon"], finding_actions=list(_DRIVER_BROKEN)),
        RemediationRule("gpu_count", ["cordon"]),
        RemediationRule("driver", ["cordon"]),
        RemediationRule("fabric", ["cordon"]),
        RemediationRule("kubernetes", ["cordon"]),
        RemediationRule("infiniband", ["cordon"]),
        RemediationRule("thermal", ["cap_power"]),
    ]


@dataclass(frozen=True)
class RemediationBudgets:
    # A budget of 0 allows none of that action. At most this many GPU resets per GPU
    # within the window...
    reset_per_gpu: Annotated[int, NON_NEGATIVE] = 1
    reset_per_gpu_window_seconds: Annotated[float, POSITIVE] = 21600.0
    # ...and per node within its window.
    reset_per_node: Annotated[int, NON_NEGATIVE] = 3
    reset_per_node_window_seconds: Annotated[float, POSITIVE] = 86400.0
    # Cordon requests per node within the window (a flapping finding must not spam).
    cordon_per_node: Annotated[int, NON_NEGATIVE] = 3
    cordon_per_node_window_seconds: Annotated[float, POSITIVE] = 86400.0
    # Every other action (persistence, power cap) per GPU within the window.
    other_per_gpu: Annotated[int, NON_NEGATIVE] = 6
    other_per_gpu_window_seconds: Annotated[float, POSITIVE] = 3600.0
    # The same action on the same target is not attempted again sooner than this.
    cooldown_seconds: Annotated[float, NON_NEGATIVE] = 300.0


@dataclass(frozen=True)
class RemediationReset:
    # {bus_id} is replaced by the GPU's bus id. Under the simulator the simulated GPU is reset.
    command: str = "nvidia-smi --gpu-reset -i {bus_id}"
    timeout_seconds: Annotated[float, POSITIVE] = 120.0
    # Only reset a GPU once the node is cordoned (when a cordon backend is configured).
    require_cordon: bool = True
    # Resetting a GPU with MIG instances destroys them; refuse unless allowed.
    allow_mig: bool = False
    # After a reset the GPU must answer and be healthy for this many polls.
    verify_polls: Annotated[int, AT_LEAST_ONE] = 3


DIAG_LEVEL = Range(ge=0, le=3)


@dataclass(frozen=True)
class RemediationDiag:
    """DCGM's diagnostic as a gate: a GPU passes it before it counts as repaired, and a
    node before it returns to service (see docs/diagnostics.md)."""

    # After a reset, once the GPU was healthy for reset.verify_polls polls: this level on
    # that GPU (1 quick, 2 medium, 3 long; 0: none). A failure escalates like a failed reset.
    after_reset_level: Annotated[int, DIAG_LEVEL] = 1
    # Before an uncordon: this level on the GPUs the cordon was for (0: none). A failure
    # leaves the node cordoned.
    before_uncordon_level: Annotated[int, DIAG_LEVEL] = 1
    # Neither DCGM nor dcgmi on the node: "pass" lets the gate through, "block" stops it.
    when_unavailable: Literal["pass", "block"] = "pass"
    # How long each level may run before it is stopped (and counts as failed).
    level1_timeout_seconds: Annotated[float, POSITIVE] = 300.0
    level2_timeout_seconds: Annotated[float, POSITIVE] = 1800.0
    level3_timeout_seconds: Annotated[float, POSITIVE] = 7200.0

    def timeout(self, level: int) -> float:
        return {1: self.level1_timeout_seconds, 2: self.level2_timeout_seconds}.get(
            level, self.level3_timeout_seconds
        )


@dataclass(frozen=True)
class RemediationPower:
    # Thermal emergency: cap the power limit to this fraction of the default limit...
    cap_fraction: Annotated[float, FRACTION] = 0.7
    # ...and restore it once the GPU has been cool (no thermal finding) this long.
    restore_after_seconds: Annotated[float, NON_NEGATIVE] = 600.0


@dataclass(frozen=True)
class RemediationEvidence:
    """RMA evidence bundles under <state_dir>/evidence (see docs/remediation.md): collected
    when a reset is escalated, rows can no longer be remapped or retired pages reach the
    limit; read-only, so collected in observe mode too."""

    enabled: bool = True
    # Run with "--output-file FILE" added when installed; "" never runs it.
    bug_report_command: str = "nvidia-bug-report.sh"
    # A wedged GPU can hang it: stopped after this long, what it wrote so far kept.
    bug_report_timeout_seconds: Annotated[float, POSITIVE] = 600.0
    # Bundles older than this are removed, then the oldest while all exceed the size.
    max_age_days: Annotated[float, POSITIVE] = 90.0
    max_total_mib: Annotated[int, AT_LEAST_ONE] = 2048


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
    timeout_seconds: Annotated[float, POSITIVE] = 30.0
    # Uncordon (only a node we cordoned) after every finding has been OK this long.
    uncordon_after_recovery: bool = False
    healthy_hold_seconds: Annotated[float, NON_NEGATIVE] = 1800.0
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
    diag: RemediationDiag = field(default_factory=RemediationDiag)
    power: RemediationPower = field(default_factory=RemediationPower)
    cordon: RemediationCordon = field(default_factory=RemediationCordon)
    evidence: RemediationEvidence = field(default_factory=RemediationEvidence)
