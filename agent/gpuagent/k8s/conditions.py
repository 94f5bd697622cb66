"""GPU health as Node conditions, in node-problem-detector's style: one summary condition
(True: healthy) and one condition per problem class (True: the problem is there).

Pure: a snapshot in, the conditions out. A condition's ``key`` is what it says (status,
reason, and which findings at which severity), not its message: a reason whose numbers
change at every poll must not cost a patch at every poll. See docs/kubernetes.md.
"""

from __future__ import annotations

from typing import NamedTuple

from gpuagent.model import Finding, NodeSnapshot, Severity

# Problem classes: (condition type, the checks that feed it, reason when clear). A check in
# none of them counts towards the summary condition only.
PROBLEM_CLASSES: tuple[tuple[str, frozenset[str], str], ...] = (
    ("GpuLost", frozenset({"availability", "bus", "gpu_count"}), "NoGpuLost"),
    ("GpuXidCritical", frozenset({"xid"}), "NoCriticalXid"),
    (
        "GpuMemoryErrors",
        frozenset({"ecc", "retired_pages", "row_remap", "recovery"}),
        "NoGpuMemoryErrors",
    ),
    (
        "GpuFabricDegraded",
        frozenset({"nvlink", "fabric_health", "sxid", "fabric"}),
        "GpuFabricHealthy",
    ),
    (
        "GpuDriverProblem",
        frozenset({"nvml", "kernel", "driver", "kernel_module", "services", "firmware"}),
        "GpuDriverHealthy",
    ),
    ("GpuThermalProblem", frozenset({"thermal"}), "GpuThermalOk"),
    ("GpuPcieDegraded", frozenset({"pcie", "aer"}), "GpuPcieOk"),
)
PROBLEM_CONDITIONS = frozenset(kind for kind, _, _ in PROBLEM_CLASSES)
# The checks that only the summary weighs (settings, inventory drift, the node's own
# plumbing): each is either here or in a class, so a new check is placed on purpose.
SUMMARY_ONLY_CHECKS = frozenset(
    {
        "persistence",
        "mig",
        "processes",
        "state_dir",
        "ecc_mode",
        "mig_layout",
        "settings",
        "drift",
        "infiniband",
        "kubernetes",
        "dcgm",
    }
)
# Enough for `kubectl describe node` to name every GPU's problem; the API server takes more,
# but a longer message is noise.
MAX_MESSAGE = 1024


class Condition(NamedTuple):
    type: str
    status: str  # "True", "False" or "Unknown"
    reason: str
    message: str
    # What the condition says: a change of it is a patch; a change of message alone is not.
    key: tuple[object, ...]


def node_conditions(snapshot: NodeSnapshot, summary_type: str) -> tuple[Condition, ...]:
    """The summary condition, then one per problem class, from ``snapshot``'s findings.

    Summary: False when a finding is CRITICAL, Unknown when one is UNKNOWN (and none is
    CRITICAL), else True. Problem classes: True when one of their findings is CRITICAL,
    else False (a WARN is named in the message of a False one, without a patch of its own).
    Masked findings (a lost GPU's checks that cannot read it) are the availability
    finding's symptoms and count nowhere.
    """
    problems = list(snapshot.health.problems())
    conditions = [_summary(snapshot, problems, summary_type)]
    for kind, checks, clear_reason in PROBLEM_CLASSES:
        mine = [f for f in problems if f.check in checks]
        critical = [f for f in mine if f.severity is Severity.CRITICAL]
        if critical:
            conditions.append(
                Condition(
                    kind,
                    "True",
                    _camel(critical[0].runbook) or kind,
                    _message(snapshot, critical),
                    ("True", _identities(critical)),
                )
            )
        else:
            warned = [f for f in mine if f.severity is Severity.WARN]
            message = "no critical finding"
            if warned:
                message += "; warnings: " + _message(snapshot, warned)
            key = ("False", _identities(warned))
            conditions.append(Condition(kind, "False", clear_reason, message[:MAX_MESSAGE], key))
    return tuple(conditions)


def _summary(snapshot: NodeSnapshot, problems: list[Finding], summary_type: str) -> Condition:
    critical = [f for f in problems if f.severity is Severity.CRITICAL]
    unknown = [f for f in problems if f.severity is Severity.UNKNOWN]
    if critical:
        status, reason, named = "False", "GpuUnhealthy", critical
    elif unknown:
        status, reason, named = "Unknown", "GpuHealthUnknown", unknown
    else:
        warned = [f for f in problems if f.severity is Severity.WARN]
        status, reason, named = "True", "GpuHealthy", warned
    message = _message(snapshot, named) if named else f"all {len(snapshot.gpus)} GPUs healthy"
    return Condition(summary_type, status, reason, message, (status, _identities(named)))


def _identities(findings: list[Finding]) -> tuple[tuple[str, str, str, str], ...]:
    return tuple(sorted((f.gpu or "", f.check, f.cause, f.severity.name) for f in findings))


def _message(snapshot: NodeSnapshot, findings: list[Finding]) -> str:
    """ "GPU 3 (0000:18:00.0) ecc: 1 uncorrectable ECC error since the last reset; node
    sxid: ...", worst first, cut at MAX_MESSAGE."""
    message = "; ".join(f"{_where(snapshot, f.gpu)} {f.check}: {f.reason}" for f in findings)
    return message if len(message) <= MAX_MESSAGE else message[: MAX_MESSAGE - 3] + "..."


def _where(snapshot: NodeSnapshot, bus_id: str | None) -> str:
    if bus_id is None:
        return "node"
    gpu = snapshot.gpu(bus_id)
    return f"GPU {gpu.identity.index} ({bus_id})" if gpu is not None else f"GPU {bus_id}"


def _camel(runbook: str) -> str:
    """A runbook id as a condition reason: "gpu-ecc-dbe" -> "GpuEccDbe"."""
    return "".join(part[:1].upper() + part[1:] for part in runbook.split("-") if part)
