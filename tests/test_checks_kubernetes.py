"""The `kubernetes` node check: the device plugin, the Node's advertised GPUs against the
healthy ones, the CDI spec and the runtime; its place in `evaluate`, and when it applies."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from gpuagent.checks import HealthMemory, evaluate
from gpuagent.checks.common import to_finding
from gpuagent.checks.kubernetes import KubernetesView, check_kubernetes
from gpuagent.config import Config, KubernetesCheck, parse_config
from gpuagent.k8s.model import CdiSpec, DevicePlugin, KubernetesFacts, NodeResources, Toolkit
from gpuagent.model import Finding, Severity
from test_checks_support import DEFAULTS, NVML_OK, gpu, identity

GPUS = tuple(identity(f"0000:{0x18 + i:02x}:00.0", index=i) for i in range(4))
NOW = 10_000.0
GRACE = KubernetesCheck().registration_grace_seconds


def _spec(*gpus: Any) -> CdiSpec:
    names = (*(str(g.index) for g in gpus), *(g.uuid for g in gpus), "all")
    return CdiSpec("/var/run/cdi/nvidia.yaml", "nvidia.com/gpu", names)


def _facts(
    *,
    socket: str | None = "nvidia-gpu.sock",
    registered: tuple[str, ...] | None = tuple(g.uuid for g in GPUS),
    plugin_error: str | None = None,
    allocatable: int | None = 4,
    read_at: float | None = NOW - 5,
    since: float | None = 0.0,
    node_error: str | None = None,
    specs: tuple[CdiSpec, ...] = (_spec(*GPUS),),
    unreadable: tuple[tuple[str, str], ...] = (),
    runtime: str | None = "/usr/bin/nvidia-container-runtime",
    watching_since: float = 0.0,
) -> KubernetesFacts:
    return KubernetesFacts(
        DevicePlugin(socket, registered, plugin_error),
        Toolkit(specs, unreadable, runtime),
        NodeResources(allocatable, allocatable, read_at, since, node_error),
        watching_since,
    )


def _check(
    facts: KubernetesFacts,
    unhealthy: frozenset[str] = frozenset(),
    config: KubernetesCheck | None = None,
    now: float = NOW,
) -> Finding:
    view = KubernetesView(facts, config or KubernetesCheck(), now, GPUS, unhealthy)
    return to_finding("kubernetes", None, check_kubernetes(view))


LOST = frozenset({GPUS[1].pci_bus_id})


@pytest.mark.parametrize(
    ("facts", "unhealthy", "severity", "reason", "runbook"),
    [
        (_facts(), frozenset(), Severity.OK, "4 healthy GPUs, 4 nvidia.com/gpu allocatable", ""),
        # The GPU Operator runbook's case: healthy GPUs, "nvidia.com/gpu: 0".
        (
            _facts(allocatable=0),
            frozenset(),
            Severity.CRITICAL,
            "GPUs healthy but not advertised: nvidia.com/gpu allocatable 0, 4 healthy GPUs want 4",
            "node-k8s-gpus-not-advertised",
        ),
        # The device plugin took out the GPU the agent also finds unhealthy: in order.
        (_facts(allocatable=3), LOST, Severity.OK, "3 healthy GPUs, 3 nvidia.com/gpu", ""),
        (
            _facts(),
            LOST,
            Severity.WARN,
            (
                "unhealthy GPU advertised: nvidia.com/gpu allocatable 4, only 3 of 4 GPUs healthy "
                "(unhealthy: 0000:19:00.0): the scheduler will place work on it"
            ),
            "node-k8s-unhealthy-gpu-advertised",
        ),
        (
            _facts(socket=None),
            frozenset(),
            Severity.CRITICAL,
            (
                "no device plugin socket (nvidia*.sock) in /var/lib/kubelet/device-plugins: "
                "kubelet cannot allocate nvidia.com/gpu"
            ),
            "node-k8s-device-plugin",
        ),
        (
            _facts(registered=()),
            frozenset(),
            Severity.CRITICAL,
            (
                "device plugin socket nvidia-gpu.sock present but kubelet has no nvidia.com/gpu "
                "registered"
            ),
            "node-k8s-device-plugin",
        ),
        # No checkpoint (an older kubelet before the first allocation): the socket counts.
        (_facts(registered=None), frozenset(), Severity.OK, "4 healthy GPUs", ""),
        (
            _facts(plugin_error="/var/lib/kubelet/device-plugins: Permission denied"),
            frozenset(),
            Severity.WARN,
            "device plugin state unknown: /var/lib/kubelet/device-plugins: Permission denied",
            "node-k8s-device-plugin",
        ),
        (
            _facts(allocatable=None, read_at=None, since=None, node_error="GET node n: HTTP 403"),
            frozenset(),
            Severity.WARN,
            "advertised GPUs unknown: GET node n: HTTP 403",
            "node-k8s-api",
        ),
        # Not read yet (the first read is under way): nothing to say.
        (_facts(allocatable=None, read_at=None, since=None), frozenset(), Severity.OK, "4", ""),
        (
            _facts(read_at=NOW - 400, node_error="timed out"),
            frozenset(),
            Severity.WARN,
            "advertised GPUs not read for 400 s; last error: timed out",
            "node-k8s-api",
        ),
        (
            _facts(specs=(_spec(GPUS[0], GPUS[1], GPUS[3]),)),
            frozenset(),
            Severity.WARN,
            (
                f"CDI spec does not name 1 GPU: 2 ({GPUS[2].uuid}); containers given them fail "
                "to start"
            ),
            "node-k8s-cdi",
        ),
        # Named by UUID only (`--device-name-strategy=uuid`) is named.
        (
            _facts(
                specs=(
                    CdiSpec("/etc/cdi/nvidia.yaml", "nvidia.com/gpu", tuple(g.uuid for g in GPUS)),
                )
            ),
            frozenset(),
            Severity.OK,
            "4 healthy GPUs",
            "",
        ),
        # Another vendor's spec does not count; without any NVIDIA spec nothing is required.
        (
            _facts(specs=(CdiSpec("/etc/cdi/x.yaml", "vendor.com/nic", ("0",)),)),
            frozenset(),
            Severity.OK,
            "4",
            "",
        ),
        (
            _facts(unreadable=(("/etc/cdi/nvidia.yaml", "not YAML"),)),
            frozenset(),
            Severity.WARN,
            "CDI spec /etc/cdi/nvidia.yaml unreadable: not YAML",
            "node-k8s-cdi",
        ),
        (
            _facts(runtime=None),
            frozenset(),
            Severity.WARN,
            "NVIDIA container runtime not found",
            "node-k8s-runtime",
        ),
        # Not checked (no places configured) is not missing.
        (_facts(runtime=""), frozenset(), Severity.OK, "4 healthy GPUs", ""),
        # No healthy GPU: a missing plugin loses nothing more.
        (
            _facts(socket=None, allocatable=0),
            frozenset(g.pci_bus_id for g in GPUS),
            Severity.OK,
            "0 healthy GPUs",
            "",
        ),
    ],
)
def test_findings(
    facts: KubernetesFacts, unhealthy: frozenset[str], severity: Severity, reason: str, runbook: str
) -> None:
    finding = _check(facts, unhealthy)
    assert finding.severity is severity, finding.reason
    assert finding.reason.startswith(reason), finding.reason
    assert finding.runbook == runbook


def test_several_problems_are_all_said_worst_first() -> None:
    finding = _check(_facts(socket=None, allocatable=0, runtime=None))
    assert finding.severity is Severity.CRITICAL
    assert finding.reason.count(";") == 2
    assert finding.reason.endswith(
        "NVIDIA container runtime not found (checks.kubernetes.runtime_paths, containerd_configs)"
    )
    assert finding.action == "restart_device_plugin"


@pytest.mark.parametrize(
    ("watching_since", "since", "severity"),
    [
        (NOW - GRACE + 1, 0.0, Severity.WARN),  # the agent just started
        (0.0, NOW - GRACE + 1, Severity.WARN),  # the count just changed (a plugin restart)
        (0.0, NOW - GRACE, Severity.CRITICAL),
        (NOW - GRACE, None, Severity.CRITICAL),
    ],
)
def test_not_advertised_is_critical_only_after_the_grace(
    watching_since: float, since: float | None, severity: Severity
) -> None:
    finding = _check(_facts(allocatable=2, since=since, watching_since=watching_since))
    assert finding.severity is severity
    assert "not advertised" in finding.reason


@pytest.mark.parametrize(
    ("watching_since", "missing_since", "severity"),
    [
        (NOW - 10, None, Severity.WARN),  # the agent just started
        (0.0, NOW - 10, Severity.WARN),  # the plugin's pod is restarting
        (0.0, NOW - GRACE, Severity.CRITICAL),
    ],
)
def test_a_missing_plugin_is_critical_only_after_the_grace(
    watching_since: float, missing_since: float | None, severity: Severity
) -> None:
    facts = replace(
        _facts(socket=None, watching_since=watching_since), plugin_missing_since=missing_since
    )
    finding = _check(facts)
    assert finding.severity is severity
    assert finding.runbook == "node-k8s-device-plugin"


def test_time_slicing_replicas_multiply_what_should_be_advertised() -> None:
    config = KubernetesCheck(replicas_per_gpu=4)
    assert _check(_facts(allocatable=16), config=config).severity is Severity.OK
    finding = _check(_facts(allocatable=4), config=config)
    assert finding.severity is Severity.CRITICAL
    assert finding.reason.endswith("4 healthy GPUs want 16 (4 per GPU)")


def test_require_cdi_makes_a_missing_spec_a_warning() -> None:
    finding = _check(_facts(specs=()), config=KubernetesCheck(require_cdi=True))
    assert finding.severity is Severity.WARN
    assert finding.reason == "no nvidia.com/gpu CDI spec in /etc/cdi, /var/run/cdi"


def test_evidence_carries_the_numbers() -> None:
    evidence = _check(_facts(allocatable=3), LOST).evidence_dict()
    assert evidence["resource"] == "nvidia.com/gpu"
    assert evidence["gpus_healthy"] == 3
    assert evidence["gpus_advertised_expected"] == 3
    assert evidence["gpus_allocatable"] == 3
    assert evidence["device_plugin_registered"] is True
    assert evidence["devices_registered"] == 4
    assert evidence["cdi_gpus_missing"] == 0
    assert _check(_facts(socket=None)).evidence_dict()["device_plugin_registered"] is False
    assert _check(_facts(specs=())).evidence_dict()["cdi_gpus_missing"] is None


# --- in evaluate ---------------------------------------------------------------------------


def _evaluate(*states: Any, kubernetes: KubernetesFacts | None) -> list[Finding]:
    health, _ = evaluate(
        tuple(states), NVML_OK, DEFAULTS, HealthMemory(), NOW, kubernetes=kubernetes
    )
    return list(health.findings)


def test_healthy_means_no_critical_finding_of_its_own() -> None:
    states = [gpu(ident=g, temperature_c=40.0) for g in GPUS]
    states[1] = gpu("lost", ident=GPUS[1])  # availability: CRITICAL
    findings = _evaluate(*states, kubernetes=_facts(allocatable=3))
    node = [f for f in findings if f.gpu is None]
    assert node[-1].check == "kubernetes"  # last of the node findings
    assert findings.index(node[-1]) == len(node) - 1
    assert node[-1].severity is Severity.OK, node[-1].reason
    assert node[-1].evidence_dict()["gpus_healthy"] == 3


def test_without_facts_there_is_no_kubernetes_finding() -> None:
    findings = _evaluate(gpu(ident=GPUS[0]), kubernetes=None)
    assert "kubernetes" not in {f.check for f in findings}


# --- when it applies -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("toml", "enabled"),
    [
        ("", False),
        ('[remediation.cordon]\nbackends = ["kubernetes"]\n', True),
        ('[remediation.cordon]\nbackends = ["slurm"]\n', False),
        ("[checks.kubernetes]\nenabled = true\n", True),
        (
            (
                "[checks.kubernetes]\nenabled = false\n"
                '[remediation.cordon]\nbackends = ["kubernetes"]\n'
            ),
            False,
        ),
    ],
)
def test_the_check_applies_only_on_a_kubernetes_node(toml: str, enabled: bool) -> None:
    assert parse_config(toml).watches_kubernetes is enabled


def test_the_default_is_auto() -> None:
    assert Config().checks.kubernetes.enabled == "auto"
    assert replace(Config().checks.kubernetes, enabled=True).enabled is True
