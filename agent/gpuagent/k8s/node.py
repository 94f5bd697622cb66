"""Reading the Node's advertised GPUs from the API server: one GET, read-only.

The client is built on first use, so an agent without the kubernetes package or without
credentials still starts; each failure is the read's error, tried again next time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpuagent.k8s.client import KubernetesConfigError, load_api_client, read_json

if TYPE_CHECKING:
    from kubernetes.client import ApiClient


class NodeReadError(RuntimeError):
    """The Node could not be read; the message says why, for the finding."""


def gpu_resources(node: object, resource: str) -> tuple[int, int]:
    """(allocatable, capacity) of ``resource`` in a Node's JSON; 0 where the Node does not
    list it (kubelet drops the resource when no plugin ever registered it)."""
    status = node.get("status") if isinstance(node, dict) else None
    if not isinstance(status, dict):
        raise NodeReadError("the answer is not a Node (no status)")
    return _quantity(status, "allocatable", resource), _quantity(status, "capacity", resource)


def _quantity(status: dict[str, Any], field: str, resource: str) -> int:
    resources = status.get(field) or {}
    value = resources.get(resource, "0") if isinstance(resources, dict) else None
    # Extended resources are whole numbers ("8"); the API server refuses any other form.
    if not isinstance(value, str) or not value.isdigit():
        raise NodeReadError(f"status.{field}[{resource!r}] is not a count: {value!r}")
    return int(value)


class NodeReader:
    def __init__(self, node: str, *, kubeconfig: str, resource: str, timeout: float) -> None:
        self.node = node
        self._kubeconfig = kubeconfig
        self._resource = resource
        self._timeout = timeout
        self._client: ApiClient | None = None

    def read(self) -> tuple[int, int]:
        """(allocatable, capacity); blocking, so the daemon runs it in a worker thread.
        NodeReadError for every failure."""
        try:
            from kubernetes import client  # noqa: PLC0415 - only when the check is on
            from urllib3.exceptions import HTTPError  # noqa: PLC0415
        except ImportError:
            raise NodeReadError(
                "the kubernetes package is not installed (pip install 'gpuagent[kubernetes]')"
            ) from None
        try:
            if self._client is None:
                self._client = load_api_client(self._kubeconfig)
            # Raw JSON, as the cordon backend reads it: only two fields are wanted.
            document = read_json(
                client.CoreV1Api(self._client).read_node(
                    self.node, _preload_content=False, _request_timeout=self._timeout
                )
            )
        except KubernetesConfigError as exc:
            raise NodeReadError(str(exc)) from None
        except client.ApiException as exc:
            raise NodeReadError(self._describe_http(exc.status, exc.reason)) from None
        except (HTTPError, OSError, ValueError) as exc:
            cause = getattr(exc, "reason", None) or exc
            raise NodeReadError(f"cannot reach the Kubernetes API: {cause}") from None
        return gpu_resources(document, self._resource)

    def close(self) -> None:
        if self._client is not None:
            close: Callable[[], None] = self._client.close  # the client has no hints
            close()
            self._client = None

    def _describe_http(self, status: object, reason: object) -> str:
        text = f"GET node {self.node}: HTTP {status} {reason}"
        if status == 403:
            text += " (the agent's ClusterRole must allow get on nodes)"
        elif status == 404:
            text += " (no such node; set remediation.cordon.kubernetes.node_name)"
        return text
