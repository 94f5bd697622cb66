"""The Kubernetes API client as every part of the agent builds it (kubeconfig or the
in-cluster service account), and the node name it uses.

The cordon backend and the GPU stack watch share this, so both talk to the same API
server as the same identity, under the same RBAC.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from gpuagent.config import Config

if TYPE_CHECKING:
    from kubernetes.client import ApiClient


class KubernetesConfigError(ValueError):
    """The kubeconfig or the in-cluster service account cannot be used."""


def kubernetes_node_name(config: Config) -> str:
    """The Node this agent runs on: remediation.cordon.kubernetes.node_name, else
    agent.node_name (else the host name)."""
    return config.remediation.cordon.kubernetes.node_name or config.agent.resolved_node_name


def load_api_client(kubeconfig: str) -> ApiClient:
    """A client for ``kubeconfig``, or for the in-cluster service account when empty.

    Needs the kubernetes package (ImportError without it); KubernetesConfigError when the
    configuration cannot be used.
    """
    from kubernetes import client, config  # noqa: PLC0415 - only when Kubernetes is used

    # The loaders have no type hints; these names give them the one we rely on.
    load_kube_config: Callable[..., None] = config.load_kube_config
    load_incluster_config: Callable[..., None] = config.load_incluster_config
    configuration = client.Configuration()
    try:
        if kubeconfig:
            load_kube_config(config_file=kubeconfig, client_configuration=configuration)
        else:
            load_incluster_config(client_configuration=configuration)
    except (config.ConfigException, OSError, ValueError) as exc:
        where = f"kubeconfig {kubeconfig}" if kubeconfig else "the in-cluster service account"
        raise KubernetesConfigError(f"cannot use {where}: {exc}") from exc
    return client.ApiClient(configuration)
