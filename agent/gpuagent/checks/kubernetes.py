"""``kubernetes`` (node level): can the scheduler use this node's healthy GPUs, and only them?

The chain from GPU to pod, as the node sees it: the NVIDIA device plugin's socket in
kubelet's device plugin directory and its registration in kubelet's checkpoint; the
Node's allocatable count of the resource (read from the API server), against the GPUs the
agent calls healthy; the container toolkit's CDI spec naming every GPU and its runtime.

Healthy GPUs are the GPUs NVML lists this poll that have no CRITICAL finding of their
own: the device plugin takes a GPU out on the same kind of faults (fatal XIDs, a lost
GPU), and a WARN GPU still runs work. Fewer GPUs advertised than healthy is CRITICAL
("nvidia.com/gpu: 0", pods pending) once the device plugin has had its grace; more
advertised than healthy is WARN: the scheduler will place work on an unhealthy GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuagent.checks.common import Evidence, Outcome, Problem, fmt, plural
from gpuagent.checks.vocabulary import Action, Runbook
from gpuagent.config import KubernetesCheck
from gpuagent.k8s.model import CdiSpec, KubernetesFacts, Toolkit
from gpuagent.model import GpuIdentity, Severity

# The kind of the NVIDIA container toolkit's CDI specs (other vendors' specs are ignored).
NVIDIA_CDI_KIND = "nvidia.com/gpu"


@dataclass(frozen=True, slots=True)
class KubernetesView:
    facts: KubernetesFacts
    config: KubernetesCheck
    now: float  # monotonic seconds, the clock of the facts' times
    gpus: tuple[GpuIdentity, ...]  # every GPU NVML lists this poll
    unhealthy: frozenset[str]  # bus ids of those with a CRITICAL finding of their own

    @property
    def healthy(self) -> tuple[GpuIdentity, ...]:
        return tuple(g for g in self.gpus if g.pci_bus_id not in self.unhealthy)


def check_kubernetes(view: KubernetesView) -> Outcome:
    facts, config = view.facts, view.config
    plugin, node = facts.device_plugin, facts.node
    wanted = len(view.healthy) * config.replicas_per_gpu
    missing_cdi = _not_in_cdi(view)
    evidence: Evidence = (
        ("resource", config.resource),
        ("gpus_healthy", len(view.healthy)),
        ("gpus_advertised_expected", wanted),
        ("gpus_allocatable", node.allocatable),
        ("gpus_capacity", node.capacity),
        ("device_plugin_socket", plugin.socket),
        ("device_plugin_registered", _registered(facts)),
        ("devices_registered", None if plugin.registered is None else len(plugin.registered)),
        ("cdi_specs", ",".join(s.path for s in _nvidia_specs(facts.toolkit)) or None),
        ("cdi_gpus_missing", None if missing_cdi is None else len(missing_cdi)),
        ("runtime", facts.toolkit.runtime or None),
        ("node_read_error", node.error),
    )
    problems = [
        *_device_plugin_problems(view),
        *_advertised_problems(view, wanted),
        *_toolkit_problems(view, missing_cdi),
    ]
    ok = plural(len(view.healthy), "healthy GPU")
    if node.allocatable is not None:
        ok += f", {node.allocatable} {config.resource} allocatable"
    return Outcome(ok, evidence, tuple(problems))


def _registered(facts: KubernetesFacts) -> bool | None:
    """The device plugin is registered: its socket is there and kubelet's checkpoint (when
    there is one) lists devices for the resource. None: the directory could not be read."""
    plugin = facts.device_plugin
    if plugin.error is not None and plugin.socket is None:
        return None
    return plugin.socket is not None and (plugin.registered is None or bool(plugin.registered))


def _held(view: KubernetesView, since: float | None) -> bool:
    """Whether the device plugin has had its grace: the agent has been watching, and the
    state has held, for registration_grace_seconds."""
    start = max(view.facts.watching_since, since if since is not None else 0.0)
    return view.now - start >= view.config.registration_grace_seconds


def _not_advertised_severity(view: KubernetesView, since: float | None) -> Severity:
    return Severity.CRITICAL if _held(view, since) else Severity.WARN


def _device_plugin_problems(view: KubernetesView) -> list[Problem]:
    plugin, config = view.facts.device_plugin, view.config
    if plugin.error is not None:
        return [
            Problem(
                Severity.WARN,
                f"device plugin state unknown: {plugin.error}",
                Action.INVESTIGATE,
                Runbook.NODE_K8S_DEVICE_PLUGIN,
            )
        ]
    if not view.healthy:
        return []  # no GPU to advertise: nothing is lost without the plugin
    severity = _not_advertised_severity(view, view.facts.plugin_missing_since)
    if plugin.socket is None:
        reason = (
            f"no device plugin socket ({', '.join(config.device_plugin_sockets)}) in "
            f"{config.device_plugin_dir}: kubelet cannot allocate {config.resource}"
        )
    elif plugin.registered == ():
        reason = (
            f"device plugin socket {plugin.socket} present but kubelet has no "
            f"{config.resource} registered"
        )
    else:
        return []
    return [Problem(severity, reason, Action.RESTART_DEVICE_PLUGIN, Runbook.NODE_K8S_DEVICE_PLUGIN)]


def _advertised_problems(view: KubernetesView, wanted: int) -> list[Problem]:
    node, config = view.facts.node, view.config
    if node.allocatable is None or node.read_at is None:
        if node.error is None:
            return []  # not read yet: the first read is under way
        return [_api_problem(f"advertised GPUs unknown: {node.error}")]
    age = view.now - node.read_at
    if age > config.node_stale_seconds:
        why = f"; last error: {node.error}" if node.error else ""
        return [_api_problem(f"advertised GPUs not read for {fmt(age)} s{why}")]
    have = node.allocatable
    per_gpu = f" ({config.replicas_per_gpu} per GPU)" if config.replicas_per_gpu > 1 else ""
    if have < wanted:
        return [
            Problem(
                _not_advertised_severity(view, node.allocatable_since),
                f"GPUs healthy but not advertised: {config.resource} allocatable {have}, "
                f"{len(view.healthy)} healthy GPUs want {wanted}{per_gpu}",
                Action.RESTART_DEVICE_PLUGIN,
                Runbook.NODE_K8S_GPUS_NOT_ADVERTISED,
            )
        ]
    if have > wanted:
        unhealthy = sorted(g.pci_bus_id for g in view.gpus if g.pci_bus_id in view.unhealthy)
        which = f" (unhealthy: {', '.join(unhealthy)})" if unhealthy else ""
        return [
            Problem(
                Severity.WARN,
                f"unhealthy GPU advertised: {config.resource} allocatable {have}, only "
                f"{len(view.healthy)} of {len(view.gpus)} GPUs healthy{which}{per_gpu}: "
                "the scheduler will place work on it",
                Action.INVESTIGATE,
                Runbook.NODE_K8S_UNHEALTHY_GPU_ADVERTISED,
            )
        ]
    return []


def _api_problem(reason: str) -> Problem:
    return Problem(Severity.WARN, reason, Action.INVESTIGATE, Runbook.NODE_K8S_API)


def _nvidia_specs(toolkit: Toolkit) -> tuple[CdiSpec, ...]:
    return tuple(s for s in toolkit.specs if s.kind == NVIDIA_CDI_KIND)


def _not_in_cdi(view: KubernetesView) -> tuple[GpuIdentity, ...] | None:
    """The GPUs no NVIDIA CDI spec names, by index or UUID; None: there is no such spec."""
    specs = _nvidia_specs(view.facts.toolkit)
    if not specs:
        return None
    names = {name for spec in specs for name in spec.devices}
    return tuple(
        g for g in view.gpus if str(g.index) not in names and (not g.uuid or g.uuid not in names)
    )


def _toolkit_problems(
    view: KubernetesView, missing: tuple[GpuIdentity, ...] | None
) -> list[Problem]:
    toolkit, config = view.facts.toolkit, view.config
    problems = []
    if missing:
        gpus = ", ".join(f"{g.index} ({g.uuid or g.pci_bus_id})" for g in missing)
        problems.append(
            _toolkit_problem(
                f"CDI spec does not name {plural(len(missing), 'GPU')}: {gpus}; "
                "containers given them fail to start",
                Runbook.NODE_K8S_CDI,
            )
        )
    elif missing is None and config.require_cdi:
        problems.append(
            _toolkit_problem(
                f"no {NVIDIA_CDI_KIND} CDI spec in {', '.join(config.cdi_dirs)}",
                Runbook.NODE_K8S_CDI,
            )
        )
    for path, why in toolkit.unreadable:
        problems.append(
            _toolkit_problem(f"CDI spec {path} unreadable: {why}", Runbook.NODE_K8S_CDI)
        )
    if toolkit.runtime is None:
        problems.append(
            _toolkit_problem(
                "NVIDIA container runtime not found (checks.kubernetes.runtime_paths, "
                "containerd_configs)",
                Runbook.NODE_K8S_RUNTIME,
            )
        )
    return problems


def _toolkit_problem(reason: str, runbook: Runbook) -> Problem:
    return Problem(Severity.WARN, reason, Action.FIX_CONTAINER_TOOLKIT, runbook)
