"""Building the configured cordon backends (each imported only when configured).

The factory sits above the backends: it imports them, they import only
`gpuagent.remediation.backend` (the protocol and `BackendConfigError`), never this.
"""

from __future__ import annotations

from gpuagent.config import RemediationCordon
from gpuagent.remediation.aggregator import Ask
from gpuagent.remediation.backend import BackendConfigError, CordonBackend

__all__ = ["BackendConfigError", "build_backends"]


def build_backends(
    config: RemediationCordon,
    node: str,
    cluster: str,
    ask_aggregator: Ask | None = None,
    *,
    node_condition: bool = True,
) -> list[CordonBackend]:
    """``node_condition``: the Kubernetes backend writes the GpuHealthy condition with a
    cordon (false when outputs.kubernetes writes every condition itself)."""
    backends: list[CordonBackend] = []
    for name in config.backends:
        if name == "slurm":
            from gpuagent.remediation.slurm import SlurmBackend  # noqa: PLC0415

            backends.append(
                SlurmBackend(
                    config.slurm.node_name or node,
                    scontrol=config.slurm.scontrol,
                    timeout=config.timeout_seconds,
                )
            )
        elif name == "kubernetes":
            from gpuagent.remediation.kubernetes import KubernetesBackend  # noqa: PLC0415

            backends.append(
                KubernetesBackend(
                    config.kubernetes.node_name or node,
                    kubeconfig=config.kubernetes.kubeconfig,
                    taint_key=config.kubernetes.taint_key,
                    timeout=config.timeout_seconds,
                    node_condition=node_condition,
                )
            )
        elif name == "command":
            if not config.command:
                raise BackendConfigError(
                    'remediation.cordon.command: the "command" backend needs a program'
                )
            from gpuagent.remediation.command import CommandBackend  # noqa: PLC0415

            backends.append(
                CommandBackend(
                    config.command, timeout=config.timeout_seconds, node=node, cluster=cluster
                )
            )
        else:
            if ask_aggregator is None:
                raise BackendConfigError(
                    'remediation.cordon.backends: the "aggregator" backend asks the aggregator '
                    "over MQTT: enable [outputs.mqtt]"
                )
            from gpuagent.remediation.aggregator import AggregatorBackend  # noqa: PLC0415

            backends.append(AggregatorBackend(ask_aggregator, timeout=config.timeout_seconds))
    return backends
