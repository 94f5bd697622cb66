"""The Kubernetes API client as every part of the agent builds it (kubeconfig or the
in-cluster service account), the node name it uses, and the requests of the Kubernetes
output (NodeApi).

The cordon backend, the GPU stack watch and the output share this, so all talk to the same
API server as the same identity, under the same RBAC.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, cast

from gpuagent.config import Config

if TYPE_CHECKING:
    from kubernetes.client import ApiClient


STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
MERGE_PATCH = "application/merge-patch+json"


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


class _RawResponse(Protocol):
    """The urllib3 response the client returns with ``_preload_content=False``."""

    @property
    def data(self) -> bytes: ...

    def release_conn(self) -> None: ...


def read_json(response: object) -> object:
    """The parsed body of a request made with ``_preload_content=False`` (raw JSON: a model
    would drop fields it does not know), its connection handed back to the pool; None for
    an empty body."""
    raw = cast("_RawResponse", response)
    try:
        data = raw.data
    finally:
        raw.release_conn()
    return json.loads(data) if data else None


def status_message(body: object) -> str:
    """The message of the API server's Status object, if the body is one."""
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if not isinstance(body, str) or not body:
        return ""
    try:
        status = json.loads(body)
    except ValueError:
        return body.strip()[:200]
    message = status.get("message") if isinstance(status, dict) else None
    return message if isinstance(message, str) else ""


class ApiError(Exception):
    """A request failed; ``status`` is the HTTP status (0: no answer)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class NodeApi:
    """The four requests the output makes, each blocking (run in a worker thread)."""

    def __init__(self, client: ApiClient, node: str, namespace: str, timeout: float) -> None:
        from kubernetes.client import CoreV1Api, EventsV1Api  # noqa: PLC0415

        self._client = client
        self._core = CoreV1Api(client)
        self._events = EventsV1Api(client)
        self._node = node
        self._namespace = namespace
        self._timeout = timeout

    def read_node(self) -> dict[str, Any]:
        node = self._call(self._core.read_node, self._node)
        if not isinstance(node, dict) or not isinstance(node.get("metadata"), dict):
            raise ApiError(0, f"GET node {self._node}: the answer is not a Node")
        return node

    def patch_conditions(self, conditions: list[dict[str, str]]) -> None:
        body = {"status": {"conditions": conditions}}
        self._call(
            self._core.patch_node_status, self._node, body, _content_type=STRATEGIC_MERGE_PATCH
        )

    def create_event(self, body: dict[str, Any]) -> None:
        self._call(self._events.create_namespaced_event, self._namespace, body)

    def patch_event(self, name: str, body: dict[str, Any]) -> None:
        self._call(
            self._events.patch_namespaced_event,
            name,
            self._namespace,
            body,
            _content_type=MERGE_PATCH,
        )

    def close(self) -> None:
        close: Callable[[], None] = self._client.close  # the client has no hints
        close()

    def _call(self, method: Any, *args: Any, **kwargs: Any) -> object:
        from kubernetes.client import ApiException  # noqa: PLC0415
        from urllib3.exceptions import HTTPError  # noqa: PLC0415

        try:
            return read_json(
                method(*args, _preload_content=False, _request_timeout=self._timeout, **kwargs)
            )
        except ApiException as exc:
            raise ApiError(exc.status or 0, _describe_http(exc)) from None
        except (HTTPError, OSError, ValueError) as exc:
            cause = getattr(exc, "reason", None) or exc
            raise ApiError(0, f"cannot reach the Kubernetes API: {cause}") from None


def retried(exc: ApiError) -> bool:
    """Worth the same request again later: no answer, throttled, or the server's fault.
    Anything else (refused, invalid, gone) would be refused again."""
    return exc.status in {0, 429} or exc.status >= 500


def _describe_http(exc: Any) -> str:
    text = f"Kubernetes API: HTTP {exc.status} {exc.reason}"
    message = status_message(exc.body)
    if message:
        text += f": {message}"
    if exc.status == 403:
        text += " (the agent's ClusterRole must allow patch on nodes/status, create on events)"
    return text
