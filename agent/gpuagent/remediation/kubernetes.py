"""Cordon backend for Kubernetes: cordon, taint and a node condition, with ownership.

A cordon is one strategic merge PATCH of the Node (``spec.unschedulable``, our taint, the
ownership annotations, guarded by ``metadata.resourceVersion``) and one strategic merge
PATCH of the Node's status (the ``GpuHealthy`` condition, merged by type so the kubelet's
conditions stay). The node is read as raw JSON, not through the client's models, so other
owners' taints are written back exactly as the API server gave them (a model would drop
fields it does not know). The synchronous client runs in a worker thread.

See docs/remediation-kubernetes.md.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from gpuagent.k8s.client import (
    STRATEGIC_MERGE_PATCH,
    KubernetesConfigError,
    load_api_client,
    read_json,
    status_message,
)
from gpuagent.remediation.backend import BackendConfigError
from gpuagent.remediation.types import CordonRequest, CordonResult, CordonState

if TYPE_CHECKING:
    # For the type checker only: the package is imported in the constructor, so the
    # agent starts without it when this backend is not configured.
    from kubernetes.client import ApiClient, CoreV1Api

# The ownership mark: we only ever undo a cordon that carries it.
OWNER_ANNOTATION = "gpuagent.io/cordoned-by"
OWNER = "gpuagent"
REASON_ANNOTATION = "gpuagent.io/cordon-reason"
CONDITION_TYPE = "GpuHealthy"
# Strategic merge patch: status.conditions merge by type (the kubelet's conditions stay);
# spec.taints is an atomic list, replaced whole, hence the resourceVersion guard.
# A node that changed between our GET and our PATCH (409 Conflict) is read again this often.
CONFLICT_ATTEMPTS = 3

Node = dict[str, Any]  # a Node as the API server's JSON


class KubernetesBackendError(RuntimeError):
    """The node's state could not be read (raised by ``state()`` only)."""


class _Conflict(Exception):  # noqa: N818 - a signal between two methods, not an error
    """The node changed between our GET and our PATCH."""


class KubernetesBackend:
    name = "kubernetes"

    def __init__(
        self,
        node: str,
        *,
        kubeconfig: str = "",
        taint_key: str = "gpuagent.io/gpu-unhealthy",
        api_client: ApiClient | None = None,
        timeout: float = 30.0,
        node_condition: bool = True,
    ) -> None:
        try:
            from kubernetes import client  # noqa: PLC0415
            from urllib3.exceptions import HTTPError  # noqa: PLC0415
        except ImportError as exc:
            raise BackendConfigError(
                'remediation.cordon: the "kubernetes" backend needs the kubernetes package '
                "(pip install 'gpuagent[kubernetes]')"
            ) from exc
        self._node = node
        self._taint_key = taint_key
        self._timeout = timeout
        # False: the conditions output owns GpuHealthy (one writer, one meaning).
        self._node_condition = node_condition
        # A client we made from the configuration is ours to close; an injected one is not.
        self._own_client = None if api_client is not None else _load_config(kubeconfig)
        self._api: CoreV1Api = client.CoreV1Api(api_client or self._own_client)
        self._api_exception = client.ApiException
        # Everything the client raises for a failed call: HTTP errors, connection errors
        # and read timeouts (urllib3), sockets, and JSON that is not a node.
        self._errors: tuple[type[Exception], ...] = (
            client.ApiException,
            HTTPError,
            OSError,
            ValueError,
            TypeError,
        )
        self._patch_errors: tuple[type[Exception], ...] = (*self._errors, _Conflict)

    # --- the contract ------------------------------------------------------------------

    async def cordon(self, request: CordonRequest) -> CordonResult:
        return await self._guarded(lambda: self._cordon(request))

    async def uncordon(self, request: CordonRequest) -> CordonResult:
        return await self._guarded(lambda: self._uncordon(request))

    async def state(self) -> CordonState:
        try:
            node = await asyncio.wait_for(self._read(), self._timeout)
        except TimeoutError as exc:
            raise KubernetesBackendError(self._timed_out()) from exc
        except self._errors as exc:
            raise KubernetesBackendError(self._describe(exc)) from exc
        cordoned = _unschedulable(node)
        owned = cordoned and _owned(node)
        condition = _condition(node) or {}
        return CordonState(
            cordoned=cordoned,
            owned=owned,
            reason=_annotations(node).get(REASON_ANNOTATION, "") if owned else "",
            extra=(
                ("tainted", "true" if self._our_taint(node) else "false"),
                (CONDITION_TYPE, str(condition.get("status", ""))),
            ),
        )

    def close(self) -> None:
        """Close the connection pool of a client this backend made itself."""
        if self._own_client is not None:
            close: Callable[[], None] = self._own_client.close  # the client has no hints
            close()
            self._own_client = None

    # --- cordon and uncordon -----------------------------------------------------------

    async def _cordon(self, request: CordonRequest) -> CordonResult:
        for _ in range(CONFLICT_ATTEMPTS):
            node = await self._read()
            if _unschedulable(node) and _owned(node):
                done = await self._ensure_condition(node, healthy=False, message=request.reason)
                return _unchanged("already cordoned by gpuagent" + done)
            if _unschedulable(node):
                # Someone else's cordon: theirs to undo, so no annotation, taint or spec
                # change; the condition is ours and says what we saw.
                done = await self._ensure_condition(node, healthy=False, message=request.reason)
                return _unchanged(_NOT_OURS + "; left alone" + done)
            try:
                await self._patch(self._cordon_patch(node, request.reason))
            except _Conflict:
                continue
            done = await self._set_condition(node, healthy=False, message=request.reason)
            return _changed(f"cordoned, tainted {self._taint_key}" + done)
        return _failed(_CONFLICTED)

    async def _uncordon(self, request: CordonRequest) -> CordonResult:
        message = request.reason or "GPUs healthy"
        for _ in range(CONFLICT_ATTEMPTS):
            node = await self._read()
            if not _owned(node):
                # Not ours to put back; our condition may still say what we see now.
                done = ""
                if (_condition(node) or {}).get("status") == "False":
                    done = await self._set_condition(node, healthy=True, message=message)
                why = _NOT_OURS if _unschedulable(node) else "the node is not cordoned"
                return _failed(why + "; left alone" + done)
            try:
                await self._patch(self._uncordon_patch(node))
            except _Conflict:
                continue
            done = await self._set_condition(node, healthy=True, message=message)
            return _changed(f"uncordoned, taint {self._taint_key} removed" + done)
        return _failed(_CONFLICTED)

    def _cordon_patch(self, node: Node, reason: str) -> Node:
        taint = {"key": self._taint_key, "value": "true", "effect": "NoSchedule"}
        return {
            "metadata": {
                **_version_guard(node),
                "annotations": {OWNER_ANNOTATION: OWNER, REASON_ANNOTATION: reason},
            },
            "spec": {"unschedulable": True, "taints": [*self._other_taints(node), taint]},
        }

    def _uncordon_patch(self, node: Node) -> Node:
        return {
            "metadata": {
                **_version_guard(node),
                "annotations": {OWNER_ANNOTATION: None, REASON_ANNOTATION: None},
            },
            # None deletes the field when no other taint is left.
            "spec": {"unschedulable": False, "taints": self._other_taints(node) or None},
        }

    def _other_taints(self, node: Node) -> list[Any]:
        return [t for t in _taints(node) if t.get("key") != self._taint_key]

    def _our_taint(self, node: Node) -> bool:
        return any(t.get("key") == self._taint_key for t in _taints(node))

    # --- the GpuHealthy condition ------------------------------------------------------

    async def _ensure_condition(self, node: Node, *, healthy: bool, message: str) -> str:
        """Set the condition only when it does not say so already (a repeated cordon
        sends nothing)."""
        wanted = "True" if healthy else "False"
        if (_condition(node) or {}).get("status") == wanted:
            return ""
        return await self._set_condition(node, healthy=healthy, message=message)

    async def _set_condition(self, node: Node, *, healthy: bool, message: str) -> str:
        """PATCH the condition; returns words for the result's detail. A failure here does
        not fail the cordon: the node's scheduling state, which is what counts, is done."""
        if not self._node_condition:
            return ""
        patch = {"status": {"conditions": [_new_condition(node, healthy, message)]}}
        words = f"condition {CONDITION_TYPE}={'True' if healthy else 'False'}"
        try:
            await self._patch(patch, status=True)
        except self._patch_errors as exc:
            return f"; {words} not set: {self._describe(exc)}"
        return f"; {words}"

    # --- talking to the API server -----------------------------------------------------

    async def _guarded(self, operation: Callable[[], Awaitable[CordonResult]]) -> CordonResult:
        """Run one cordon/uncordon under the timeout; every failure becomes ok=False."""
        try:
            return await asyncio.wait_for(operation(), self._timeout)
        except TimeoutError:
            return _failed(self._timed_out())
        except self._errors as exc:
            return _failed(self._describe(exc))

    async def _read(self) -> Node:
        return await asyncio.to_thread(self._read_sync)

    async def _patch(self, body: Node, *, status: bool = False) -> None:
        await asyncio.to_thread(self._patch_sync, body, status)

    def _read_sync(self) -> Node:
        document = read_json(
            self._api.read_node(self._node, _preload_content=False, _request_timeout=self._timeout)
        )
        if not isinstance(document, dict) or not isinstance(document.get("metadata"), dict):
            raise TypeError(f"GET node {self._node}: the answer is not a Node")
        return document

    def _patch_sync(self, body: Node, status: bool) -> None:
        patch = self._api.patch_node_status if status else self._api.patch_node
        try:
            response = patch(
                self._node,
                body,
                _content_type=STRATEGIC_MERGE_PATCH,
                _preload_content=False,
                _request_timeout=self._timeout,
            )
        except self._api_exception as exc:
            if exc.status == 409:
                raise _Conflict from exc
            raise
        read_json(response)  # read to the end so the connection goes back to the pool

    def _timed_out(self) -> str:
        return (
            f"no answer from the Kubernetes API within {self._timeout:g} s; "
            f"node {self._node} may or may not have changed"
        )

    def _describe(self, exc: BaseException) -> str:
        if isinstance(exc, _Conflict):
            return "409 Conflict: the node changed meanwhile"
        if isinstance(exc, self._api_exception):
            return self._describe_http(exc.status, exc.reason, exc.body)
        if isinstance(exc, ValueError | TypeError):
            return f"unexpected answer from the Kubernetes API: {exc}"
        # urllib3's MaxRetryError keeps the underlying cause in .reason.
        cause = getattr(exc, "reason", None) or exc
        return f"cannot reach the Kubernetes API: {cause}"

    def _describe_http(self, status: object, reason: object, body: object) -> str:
        if status == 0:  # the client's own failures (TLS, bad config) carry status 0
            return f"Kubernetes API client error: {reason}"
        text = f"Kubernetes API: HTTP {status} {reason}"
        message = status_message(body)
        if message:
            text += f": {message}"
        if status == 403:
            text += " (the agent's ClusterRole: see docs/kubernetes-rbac.yaml)"
        elif status == 404:
            text += f" (no node named {self._node!r}; set remediation.cordon.kubernetes.node_name)"
        return text


_NOT_OURS = "cordoned by someone else (no gpuagent.io/cordoned-by annotation)"
_CONFLICTED = f"the node changed under every one of {CONFLICT_ATTEMPTS} attempts (409 Conflict)"


def _load_config(kubeconfig: str) -> ApiClient:
    try:
        return load_api_client(kubeconfig)
    except KubernetesConfigError as exc:
        raise BackendConfigError(f"remediation.cordon.kubernetes: {exc}") from exc


def _changed(detail: str) -> CordonResult:
    return CordonResult(ok=True, changed=True, detail=detail)


def _unchanged(detail: str) -> CordonResult:
    return CordonResult(ok=True, changed=False, detail=detail)


def _failed(detail: str) -> CordonResult:
    return CordonResult(ok=False, changed=False, detail=detail)


def _version_guard(node: Node) -> dict[str, str]:
    """resourceVersion in a patch makes the API server refuse it (409) if the node changed
    since we read it: the taint list is replaced whole, so a taint added meanwhile by
    someone else would otherwise be lost."""
    version = node["metadata"].get("resourceVersion")
    return {"resourceVersion": version} if isinstance(version, str) and version else {}


def _annotations(node: Node) -> dict[str, str]:
    annotations = node["metadata"].get("annotations")
    return annotations if isinstance(annotations, dict) else {}


def _owned(node: Node) -> bool:
    return _annotations(node).get(OWNER_ANNOTATION) == OWNER


def _unschedulable(node: Node) -> bool:
    spec = node.get("spec")
    return isinstance(spec, dict) and spec.get("unschedulable") is True


def _taints(node: Node) -> list[dict[str, Any]]:
    spec = node.get("spec")
    taints = spec.get("taints") if isinstance(spec, dict) else None
    return [t for t in taints if isinstance(t, dict)] if isinstance(taints, list) else []


def _condition(node: Node) -> dict[str, Any] | None:
    status = node.get("status")
    conditions = status.get("conditions") if isinstance(status, dict) else None
    for condition in conditions if isinstance(conditions, list) else []:
        if isinstance(condition, dict) and condition.get("type") == CONDITION_TYPE:
            return condition
    return None


def _new_condition(node: Node, healthy: bool, message: str) -> dict[str, str]:
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    status = "True" if healthy else "False"
    previous = _condition(node) or {}
    # The transition time only moves when the status does (as the kubelet keeps it).
    transition = previous.get("lastTransitionTime")
    if previous.get("status") != status or not isinstance(transition, str):
        transition = now
    return {
        "type": CONDITION_TYPE,
        "status": status,
        "reason": "GpuHealthy" if healthy else "GpuUnhealthy",
        "message": message,
        "lastHeartbeatTime": now,
        "lastTransitionTime": transition,
    }
