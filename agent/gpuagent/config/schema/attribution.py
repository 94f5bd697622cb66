"""[attribution]: who each GPU belongs to (Kubernetes pods, Slurm jobs); see docs/attribution.md."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from gpuagent.config.ranges import POSITIVE


@dataclass(frozen=True)
class AttributionSection:
    # The kubelet's pod-resources API: pod, namespace and container of each GPU, as labels
    # on the per-GPU series (dcgm-exporter's --kubernetes) and in status, findings, audit.
    kubernetes: bool = False
    pod_resources_socket: str = "/var/lib/kubelet/pod-resources/kubelet.sock"
    # Slurm: the job of each GPU process, from its cgroup under sources.nvml.proc_root
    # (dcgm-exporter's hpc_job label).
    slurm: bool = False
    # How often the kubelet is asked; also asked whenever a GPU's processes change.
    interval_seconds: Annotated[float, POSITIVE] = 10.0
    # One call to the kubelet taking longer counts as a failure (owners unknown).
    timeout_seconds: Annotated[float, POSITIVE] = 5.0

    @property
    def enabled(self) -> bool:
        return self.kubernetes or self.slurm
