"""The Kubernetes GPU stack's families: from the `kubernetes` finding's evidence, only
where the check applies."""

from __future__ import annotations

from gpuagent.model import Finding, Severity
from test_metrics_support import ok_findings, samples, snapshot


def _finding(**evidence: object) -> Finding:
    return Finding(
        check="kubernetes",
        severity=Severity.CRITICAL,
        reason="GPUs healthy but not advertised",
        evidence=tuple({"resource": "nvidia.com/gpu", **evidence}.items()),
    )


def _values(finding: Finding | None) -> dict[str, list[tuple[dict[str, str], float]]]:
    findings = ok_findings() if finding is None else (*ok_findings(), finding)
    found = samples(snapshot(findings=findings))
    return {
        name: [(dict(s.labels), s.value) for s in got]
        for name, got in found.items()
        if "kubernetes" in name or "cdi" in name
    }


def test_every_number_is_exported() -> None:
    values = _values(
        _finding(
            gpus_advertised_expected=8,
            gpus_allocatable=0,
            gpus_capacity=8,
            device_plugin_registered=False,
            cdi_gpus_missing=1,
        )
    )
    gpu = {"resource": "nvidia.com/gpu"}
    assert values == {
        "gpuagent_kubernetes_gpus_allocatable": [(gpu, 0.0)],
        "gpuagent_kubernetes_gpus_capacity": [(gpu, 8.0)],
        "gpuagent_kubernetes_gpus_expected": [(gpu, 8.0)],
        "gpuagent_kubernetes_device_plugin_registered": [({}, 0.0)],
        "gpuagent_cdi_gpus_missing": [({}, 1.0)],
    }


def test_unknown_numbers_are_absent_not_zero() -> None:
    values = _values(
        _finding(
            gpus_advertised_expected=8,
            gpus_allocatable=None,
            gpus_capacity=None,
            device_plugin_registered=True,
            cdi_gpus_missing=None,
        )
    )
    assert set(values) == {
        "gpuagent_kubernetes_gpus_expected",
        "gpuagent_kubernetes_device_plugin_registered",
    }
    assert values["gpuagent_kubernetes_device_plugin_registered"] == [({}, 1.0)]


def test_nothing_where_the_check_does_not_apply() -> None:
    assert _values(None) == {}
