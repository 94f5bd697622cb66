"""Prometheus families for the Kubernetes GPU stack, from the `kubernetes` finding's
evidence: the snapshot (and the fleet) carry the numbers once, in the finding."""

from __future__ import annotations

from prometheus_client.core import Metric

from gpuagent.metrics import names
from gpuagent.model import EvidenceValue, NodeSnapshot

CHECK = "kubernetes"


def _number(value: EvidenceValue) -> float | None:
    # bool is an int: registered is exported as 0/1 on purpose.
    return float(value) if isinstance(value, int | float) else None


def kubernetes_families(snapshot: NodeSnapshot) -> list[Metric]:
    finding = next((f for f in snapshot.health.node_findings() if f.check == CHECK), None)
    if finding is None:
        return []  # the check does not apply on this node
    evidence = finding.evidence_dict()
    resource = str(evidence.get("resource") or "")
    families: list[Metric] = []
    for spec, key, labels in (
        (names.KUBERNETES_GPUS_ALLOCATABLE, "gpus_allocatable", [resource]),
        (names.KUBERNETES_GPUS_CAPACITY, "gpus_capacity", [resource]),
        (names.KUBERNETES_GPUS_EXPECTED, "gpus_advertised_expected", [resource]),
        (names.KUBERNETES_DEVICE_PLUGIN_REGISTERED, "device_plugin_registered", []),
        (names.CDI_GPUS_MISSING, "cdi_gpus_missing", []),
    ):
        family = spec.gauge()
        value = _number(evidence.get(key))
        if value is not None:
            family.add_metric(labels, value)
        families.append(family)
    return families
