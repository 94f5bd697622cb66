"""The Kubernetes cordon backend, with the real client library talking HTTP to a small
in-memory API server that applies strategic merge patches to one Node (kubernetes_api.py)."""

from __future__ import annotations

import re
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from gpuagent.remediation.backend import BackendConfigError
from gpuagent.remediation.kubernetes import (
    KubernetesBackend,
    KubernetesBackendError,
)
from gpuagent.remediation.types import CordonRequest
from kubernetes_api import (
    MAINTENANCE_TAINT,
    NODE,
    NODE_PATH,
    SMP,
    STATUS_PATH,
    FakeApiServer,
    make_node,
    serve,
    write_kubeconfig,
)

TAINT = "gpuagent.io/gpu-unhealthy"
TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")

CORDON = CordonRequest(
    node=NODE,
    cluster="train-a",
    reason="GPU 0000:3b:00.0: 1 uncorrectable ECC error (ecc)",
    request_id="gpu-node-1:1700000000000",
    gpus=("0000:3b:00.0",),
    findings=(("0000:3b:00.0", "ecc", "1 uncorrectable ECC error"),),
)
UNCORDON = CordonRequest(NODE, "train-a", "healthy for 1800 s", "gpu-node-1:1700000900000")


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with serve(FakeApiServer(make_node())) as fake:
        yield fake


@pytest.fixture
def api_client(api: FakeApiServer) -> Iterator[client.ApiClient]:
    with client.ApiClient(client.Configuration(host=f"http://127.0.0.1:{api.port}")) as c:
        yield c


@pytest.fixture
def backend(api_client: client.ApiClient) -> KubernetesBackend:
    return KubernetesBackend(NODE, api_client=api_client, timeout=5.0)


def calls(api: FakeApiServer) -> list[tuple[str, str]]:
    return [(r.method, r.path) for r in api.requests]


# --- cordon -------------------------------------------------------------------------------


async def test_cordon_patches_spec_taint_annotations_then_the_condition(
    api: FakeApiServer, backend: KubernetesBackend
) -> None:
    result = await backend.cordon(CORDON)

    assert result.ok
    assert result.changed
    assert result.detail == f"cordoned, tainted {TAINT}; condition GpuHealthy=False"
    assert calls(api) == [("GET", NODE_PATH), ("PATCH", NODE_PATH), ("PATCH", STATUS_PATH)]
    spec_patch, status_patch = api.requests[1], api.requests[2]
    assert spec_patch.content_type == SMP
    assert spec_patch.body == {
        "metadata": {
            "resourceVersion": "100",
            "annotations": {
                "gpuagent.io/cordoned-by": "gpuagent",
                "gpuagent.io/cordon-reason": CORDON.reason,
            },
        },
        "spec": {
            "unschedulable": True,
            "taints": [MAINTENANCE_TAINT, {"key": TAINT, "value": "true", "effect": "NoSchedule"}],
        },
    }
    assert status_patch.content_type == SMP
    [condition] = status_patch.body["status"]["conditions"]
    assert set(status_patch.body) == {"status"}
    assert condition.pop("lastHeartbeatTime") == condition.pop("lastTransitionTime")
    assert condition == {
        "type": "GpuHealthy",
        "status": "False",
        "reason": "GpuUnhealthy",
        "message": CORDON.reason,
    }
    # On the node: cordoned, both taints, the kubelet's condition kept next to ours.
    node = api.node
    assert node["spec"]["unschedulable"] is True
    assert [t["key"] for t in node["spec"]["taints"]] == ["example.com/maintenance", TAINT]
    assert [c["type"] for c in node["status"]["conditions"]] == ["Ready", "GpuHealthy"]
    assert TIME.match(api.condition()["lastTransitionTime"])


async def test_with_the_conditions_output_the_cordon_leaves_the_condition_to_it(
    api: FakeApiServer, api_client: client.ApiClient
) -> None:
    backend = KubernetesBackend(NODE, taint_key=TAINT, api_client=api_client, node_condition=False)
    result = await backend.cordon(CORDON)
    assert (result.ok, result.changed) == (True, True)
    assert result.detail == f"cordoned, tainted {TAINT}"
    assert calls(api) == [("GET", NODE_PATH), ("PATCH", NODE_PATH)]
    assert api.condition() is None
    await backend.uncordon(CORDON)
    assert ("PATCH", STATUS_PATH) not in calls(api)


async def test_a_second_cordon_sends_no_patch(
    api: FakeApiServer, backend: KubernetesBackend
) -> None:
    await backend.cordon(CORDON)
    api.requests.clear()

    result = await backend.cordon(CORDON)

    assert result.ok
    assert not result.changed
    assert result.detail == "already cordoned by gpuagent"
    assert calls(api) == [("GET", NODE_PATH)]


async def test_our_cordon_without_its_condition_gets_the_condition_back(
    api: FakeApiServer, backend: KubernetesBackend
) -> None:
    api.failures[("PATCH", STATUS_PATH)] = 500
    first = await backend.cordon(CORDON)
    assert first.ok  # the node is out of scheduling; the condition is extra
    assert first.changed
    assert "condition GpuHealthy=False not set: Kubernetes API: HTTP 500" in first.detail
    del api.failures[("PATCH", STATUS_PATH)]
    api.requests.clear()

    second = await backend.cordon(CORDON)

    assert second.ok
    assert not second.changed
    assert calls(api) == [("GET", NODE_PATH), ("PATCH", STATUS_PATH)]
    assert api.condition()["status"] == "False"


async def test_someone_elses_cordon_is_left_alone(
    api: FakeApiServer, backend: KubernetesBackend
) -> None:
    api.node = make_node(unschedulable=True)

    result = await backend.cordon(CORDON)

    assert result.ok
    assert not result.changed
    assert "cordoned by someone else" in result.detail
    assert "condition GpuHealthy=False" in result.detail
    # Only our informational condition: no spec, taint or annotation change.
    assert calls(api) == [("GET", NODE_PATH), ("PATCH", STATUS_PATH)]
    assert api.node["spec"] == make_node(unschedulable=True)["spec"]
    assert api.node["metadata"]["annotations"] == {"node.alpha.kubernetes.io/ttl": "0"}

    again = await backend.uncordon(UNCORDON)

    assert not again.ok
    assert not again.changed
    assert "cordoned by someone else" in again.detail
    assert api.node["spec"]["unschedulable"] is True
    assert api.condition()["status"] == "True"  # what we see now, theirs still stands


async def test_a_node_that_changed_meanwhile_is_read_again(
    api: FakeApiServer, backend: KubernetesBackend
) -> None:
    api.interfere = 1

    result = await backend.cordon(CORDON)

    assert result.ok
    assert result.changed
    methods = [("GET", NODE_PATH), ("PATCH", NODE_PATH)] * 2 + [("PATCH", STATUS_PATH)]
    assert calls(api) == methods
    assert api.requests[1].body["metadata"]["resourceVersion"] == "100"
    assert api.requests[3].body["metadata"]["resourceVersion"] == "101"
    # The taint added in between survives.
    keys = [t["key"] for t in api.node["spec"]["taints"]]
    assert keys == ["example.com/maintenance", "other/taint", TAINT]


async def test_a_node_that_keeps_changing_fails_after_three_attempts(
    api: FakeApiServer, backend: KubernetesBackend
) -> None:
    api.interfere = 3

    result = await backend.cordon(CORDON)

    assert not result.ok
    assert "409 Conflict" in result.detail
    assert calls(api) == [("GET", NODE_PATH), ("PATCH", NODE_PATH)] * 3
    assert "unschedulable" not in api.node["spec"]


# --- uncordon -----------------------------------------------------------------------------


async def test_uncordon_undoes_only_our_cordon(
    api: FakeApiServer, backend: KubernetesBackend
) -> None:
    await backend.cordon(CORDON)
    cordoned_at = api.condition()["lastTransitionTime"]
    api.requests.clear()

    result = await backend.uncordon(UNCORDON)

    assert result.ok
    assert result.changed
    assert result.detail == f"uncordoned, taint {TAINT} removed; condition GpuHealthy=True"
    assert calls(api) == [("GET", NODE_PATH), ("PATCH", NODE_PATH), ("PATCH", STATUS_PATH)]
    spec_patch, status_patch = api.requests[1], api.requests[2]
    assert spec_patch.content_type == SMP
    assert spec_patch.body == {
        "metadata": {
            "resourceVersion": "102",
            "annotations": {"gpuagent.io/cordoned-by": None, "gpuagent.io/cordon-reason": None},
        },
        "spec": {"unschedulable": False, "taints": [MAINTENANCE_TAINT]},
    }
    [condition] = status_patch.body["status"]["conditions"]
    assert condition["status"] == "True"
    assert condition["reason"] == "GpuHealthy"
    assert condition["message"] == UNCORDON.reason
    assert TIME.match(condition["lastTransitionTime"])
    assert condition["lastTransitionTime"] >= cordoned_at
    node = api.node
    assert node["spec"]["unschedulable"] is False
    assert node["spec"]["taints"] == [MAINTENANCE_TAINT]
    assert node["metadata"]["annotations"] == {"node.alpha.kubernetes.io/ttl": "0"}
    assert [c["type"] for c in node["status"]["conditions"]] == ["Ready", "GpuHealthy"]


async def test_uncordon_removes_the_taints_field_when_ours_was_the_only_one(
    api: FakeApiServer, backend: KubernetesBackend
) -> None:
    del api.node["spec"]["taints"]
    await backend.cordon(CORDON)

    result = await backend.uncordon(UNCORDON)

    assert result.ok
    assert api.requests[-2].body["spec"] == {"unschedulable": False, "taints": None}
    assert "taints" not in api.node["spec"]


async def test_uncordon_of_a_node_nobody_cordoned_is_refused(
    api: FakeApiServer, backend: KubernetesBackend
) -> None:
    result = await backend.uncordon(UNCORDON)

    assert not result.ok
    assert not result.changed
    assert result.detail == "the node is not cordoned; left alone"
    assert calls(api) == [("GET", NODE_PATH)]


# --- state --------------------------------------------------------------------------------


async def test_state_tells_ours_from_someone_elses(
    api: FakeApiServer, backend: KubernetesBackend
) -> None:
    free = await backend.state()
    assert (free.cordoned, free.owned, free.reason) == (False, False, "")
    assert dict(free.extra) == {"tainted": "false", "GpuHealthy": ""}

    await backend.cordon(CORDON)
    ours = await backend.state()
    assert (ours.cordoned, ours.owned, ours.reason) == (True, True, CORDON.reason)
    assert dict(ours.extra) == {"tainted": "true", "GpuHealthy": "False"}

    api.node = make_node(unschedulable=True)
    theirs = await backend.state()
    assert (theirs.cordoned, theirs.owned, theirs.reason) == (True, False, "")


async def test_state_raises_when_the_node_cannot_be_read(
    api: FakeApiServer, backend: KubernetesBackend
) -> None:
    api.failures[("GET", NODE_PATH)] = 500
    with pytest.raises(KubernetesBackendError, match="HTTP 500"):
        await backend.state()


# --- failures -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "status", "words"),
    [
        ("GET", NODE_PATH, 500, "HTTP 500 Internal Server Error"),
        ("GET", NODE_PATH, 404, "no node named 'gpu-node-1'"),
        ("PATCH", NODE_PATH, 403, "HTTP 403 Forbidden"),
        ("PATCH", NODE_PATH, 403, "docs/kubernetes-rbac.yaml"),
        ("PATCH", NODE_PATH, 500, 'nodes "gpu-node-1" is forbidden or broken'),
    ],
)
async def test_api_errors_fail_the_cordon(
    api: FakeApiServer,
    backend: KubernetesBackend,
    method: str,
    path: str,
    status: int,
    words: str,
) -> None:
    api.failures[(method, path)] = status

    result = await backend.cordon(CORDON)

    assert not result.ok
    assert not result.changed
    assert words in result.detail
    assert ("PATCH", STATUS_PATH) not in calls(api)


async def test_api_errors_fail_the_uncordon(api: FakeApiServer, backend: KubernetesBackend) -> None:
    await backend.cordon(CORDON)
    api.failures[("PATCH", NODE_PATH)] = 403

    result = await backend.uncordon(UNCORDON)

    assert not result.ok
    assert "HTTP 403" in result.detail
    assert api.node["spec"]["unschedulable"] is True


async def test_an_answer_that_is_not_a_node_fails_the_cordon(
    api: FakeApiServer, backend: KubernetesBackend
) -> None:
    api.node = ["not", "a", "node"]

    result = await backend.cordon(CORDON)

    assert not result.ok
    assert "unexpected answer from the Kubernetes API" in result.detail


async def test_an_unreachable_api_server_fails_the_cordon() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    configuration = client.Configuration(host=f"http://127.0.0.1:{port}")
    configuration.retries = 0
    with client.ApiClient(configuration) as api_client:
        backend = KubernetesBackend(NODE, api_client=api_client, timeout=5.0)
        result = await backend.cordon(CORDON)

    assert not result.ok
    assert result.detail.startswith("cannot reach the Kubernetes API")
    assert "Connection refused" in result.detail


async def test_a_slow_api_server_times_out(
    api: FakeApiServer, api_client: client.ApiClient
) -> None:
    api.hold = threading.Event()
    backend = KubernetesBackend(NODE, api_client=api_client, timeout=0.3)

    result = await backend.cordon(CORDON)
    api.hold.set()

    assert not result.ok
    assert result.detail.startswith("no answer from the Kubernetes API within 0.3 s")


# --- configuration ------------------------------------------------------------------------


async def test_a_kubeconfig_file_is_used(api: FakeApiServer, tmp_path: Path) -> None:
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api)
    backend = KubernetesBackend(NODE, kubeconfig=str(kubeconfig), timeout=5.0)
    try:
        result = await backend.cordon(CORDON)
    finally:
        backend.close()

    assert result.ok
    assert result.changed


def test_a_missing_kubeconfig_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(BackendConfigError, match="cannot use kubeconfig"):
        KubernetesBackend(NODE, kubeconfig=str(tmp_path / "nope"))


def test_outside_a_cluster_the_service_account_is_a_configuration_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(BackendConfigError, match="in-cluster service account"):
        KubernetesBackend(NODE)


def test_without_the_kubernetes_package_the_backend_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "kubernetes", None)
    with pytest.raises(BackendConfigError, match="needs the kubernetes package"):
        KubernetesBackend(NODE)
