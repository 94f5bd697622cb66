"""A small in-memory Kubernetes API server that applies strategic merge patches to one
Node and keeps events.k8s.io/v1 events, for the Kubernetes cordon backend's and output's
tests (the real client library talks HTTP to it)."""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

NODE = "gpu-node-1"
NODE_PATH = f"/api/v1/nodes/{NODE}"
STATUS_PATH = f"{NODE_PATH}/status"
SMP = "application/strategic-merge-patch+json"
MERGE_PATCH = "application/merge-patch+json"
EVENTS_PATH = "/apis/events.k8s.io/v1/namespaces/default/events"

# Someone else's taint, with a field this client's models do not know: it must come
# back exactly as it was.
MAINTENANCE_TAINT = {
    "key": "example.com/maintenance",
    "value": "planned",
    "effect": "NoExecute",
    "timeAdded": "2024-05-01T10:00:00Z",
    "futureField": "kept",
}
READY = {
    "type": "Ready",
    "status": "True",
    "reason": "KubeletReady",
    "message": "kubelet is posting ready status",
    "lastHeartbeatTime": "2024-05-01T10:00:00Z",
    "lastTransitionTime": "2024-04-01T10:00:00Z",
}


def make_node(
    *,
    unschedulable: bool = False,
    annotations: dict[str, str] | None = None,
    allocatable: dict[str, str] | None = None,
    capacity: dict[str, str] | None = None,
) -> Any:
    """A Node; ``allocatable`` and ``capacity`` add to the CPU and memory every node has
    (``{"nvidia.com/gpu": "8"}``), capacity defaulting to allocatable."""
    spec: dict[str, Any] = {"podCIDR": "10.0.3.0/24", "taints": [dict(MAINTENANCE_TAINT)]}
    if unschedulable:
        spec["unschedulable"] = True
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": NODE,
            "resourceVersion": "100",
            "uid": "9f3c2a1e-5b7d-4c0e-8a61-2f0d3c4b5a69",
            "labels": {"kubernetes.io/hostname": NODE},
            "annotations": {"node.alpha.kubernetes.io/ttl": "0", **(annotations or {})},
        },
        "spec": spec,
        "status": {
            "conditions": [dict(READY)],
            "allocatable": {"cpu": "95", "memory": "2113309504Ki", **(allocatable or {})},
            "capacity": {
                "cpu": "96",
                "memory": "2113411904Ki",
                **(allocatable or {}),
                **(capacity or {}),
            },
        },
    }


@dataclass
class Recorded:
    method: str
    path: str
    content_type: str
    body: Any


@dataclass
class FakeApiServer:
    """One Node behind GET/PATCH /api/v1/nodes/NAME and PATCH .../status."""

    node: Any
    port: int = 0
    requests: list[Recorded] = field(default_factory=list)
    # (method, path) → HTTP status to answer with instead.
    failures: dict[tuple[str, str], int] = field(default_factory=dict)
    # This many GETs are followed by someone else changing the node (a new taint and a
    # new resourceVersion) before our PATCH arrives.
    interfere: int = 0
    # While set, requests are held until it is released (or 10 s pass).
    hold: threading.Event | None = None
    # events.k8s.io/v1 events in the default namespace, by name.
    events: dict[str, Any] = field(default_factory=dict)

    def handle(self, method: str, path: str, content_type: str, raw: bytes) -> tuple[int, Any]:
        body = json.loads(raw) if raw else None
        self.requests.append(Recorded(method, path, content_type, body))
        if self.hold is not None:
            self.hold.wait(10)
        if (method, path) in self.failures:
            status = self.failures[(method, path)]
            return status, _status(status, f'nodes "{NODE}" is forbidden or broken')
        if path == EVENTS_PATH and method == "POST":
            return self._create_event(body)
        if path.startswith(EVENTS_PATH + "/") and method == "PATCH":
            return self._patch_event(path.removeprefix(EVENTS_PATH + "/"), content_type, body)
        if path not in (NODE_PATH, STATUS_PATH):
            return 404, _status(404, f"{path} not found")
        if method == "GET" and path == NODE_PATH:
            answer = copy.deepcopy(self.node)
            if self.interfere:
                self.interfere -= 1
                self._someone_else_changes_the_node()
            return 200, answer
        if method == "PATCH" and content_type == SMP:
            return self._patch(body, status=path == STATUS_PATH)
        return 415, _status(415, "unsupported")

    def _patch(self, patch: Any, *, status: bool) -> tuple[int, Any]:
        patch = copy.deepcopy(patch)
        version = patch.get("metadata", {}).pop("resourceVersion", None)
        if version is not None and version != self.node["metadata"]["resourceVersion"]:
            return 409, _status(409, "the object has been modified")
        # Like the API server: the status subresource changes only status, the node
        # itself everything but status.
        parts = {k: v for k, v in patch.items() if (k == "status") == status}
        _merge(self.node, parts, ())
        self._bump()
        return 200, copy.deepcopy(self.node)

    def _create_event(self, event: Any) -> tuple[int, Any]:
        # What the API server's validation asks of a new event.
        required = ("eventTime", "reportingController", "reportingInstance", "action", "reason")
        missing = [key for key in required if not event.get(key)]
        name = event.get("metadata", {}).get("name", "")
        if missing or event.get("type") not in ("Normal", "Warning") or not name:
            return 422, _status(422, f"Event is invalid: {missing or 'type or name'}")
        if len(event.get("note", "").encode()) > 1024:
            return 422, _status(422, "note: must have at most 1024 bytes")
        if name in self.events:
            return 409, _status(409, f'events.events.k8s.io "{name}" already exists')
        self.events[name] = copy.deepcopy(event)
        return 201, event

    def _patch_event(self, name: str, content_type: str, patch: Any) -> tuple[int, Any]:
        if content_type != MERGE_PATCH:
            return 415, _status(415, "unsupported")
        if name not in self.events:
            return 404, _status(404, f'events.events.k8s.io "{name}" not found')
        series = patch.get("series")
        if series is not None and (series.get("count", 0) < 2 or "lastObservedTime" not in series):
            return 422, _status(422, "series: count must be at least 2, with lastObservedTime")
        _merge(self.events[name], patch, ())
        return 200, copy.deepcopy(self.events[name])

    def _someone_else_changes_the_node(self) -> None:
        self.node["spec"]["taints"].append({"key": "other/taint", "effect": "NoSchedule"})
        self._bump()

    def _bump(self) -> None:
        metadata = self.node["metadata"]
        metadata["resourceVersion"] = str(int(metadata["resourceVersion"]) + 1)

    def condition(self, kind: str = "GpuHealthy") -> Any:
        conditions = self.node["status"]["conditions"]
        return next((c for c in conditions if c["type"] == kind), None)

    def requests_to(self, method: str, path: str) -> int:
        return sum(1 for r in list(self.requests) if (r.method, r.path) == (method, path))


def _status(code: int, message: str) -> Any:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
            "code": code}  # fmt: skip


def _merge(target: Any, patch: Any, path: tuple[str, ...]) -> None:
    """Strategic merge as Kubernetes does it for a Node: null deletes, maps merge,
    status.conditions merge by type, other lists (taints) are replaced."""
    for key, value in patch.items():
        here = (*path, key)
        if value is None:
            target.pop(key, None)
        elif here == ("status", "conditions"):
            by_type = {c["type"]: c for c in target.get(key, [])}
            for condition in value:
                by_type[condition["type"]] = {**by_type.get(condition["type"], {}), **condition}
            target[key] = list(by_type.values())
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value, here)
        else:
            target[key] = value


def _handler(server: FakeApiServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self._answer("GET")

        def do_PATCH(self) -> None:
            self._answer("PATCH")

        def do_POST(self) -> None:
            self._answer("POST")

        def do_DELETE(self) -> None:
            self._answer("DELETE")

        def _answer(self, method: str) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            content_type = self.headers.get("Content-Type") or ""
            status, body = server.handle(method, self.path, content_type, raw)
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


@contextmanager
def serve(fake: FakeApiServer) -> Iterator[FakeApiServer]:
    """``fake`` on a free loopback port (``fake.port``) while the block runs."""
    httpd = HTTPServer(("127.0.0.1", 0), _handler(fake))
    fake.port = httpd.server_address[1]
    # A short poll interval: shutdown() waits for one.
    thread = threading.Thread(target=httpd.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        if fake.hold is not None:
            fake.hold.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def write_kubeconfig(path: Path, fake: FakeApiServer) -> Path:
    """A kubeconfig (YAML) for ``fake``, with a bearer token."""
    path.write_text(
        "apiVersion: v1\n"
        "kind: Config\n"
        "clusters:\n"
        f"- name: c\n  cluster:\n    server: http://127.0.0.1:{fake.port}\n"
        "users:\n"
        "- name: u\n  user:\n    token: secret-token\n"
        "contexts:\n"
        "- name: x\n  context:\n    cluster: c\n    user: u\n"
        "current-context: x\n"
    )
    return path
