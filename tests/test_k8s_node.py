"""Reading the Node's GPUs from the test API server, and the watch that reads the host
files and the Node for the daemon."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuagent.config import parse_config
from gpuagent.k8s.host import CHECKPOINT
from gpuagent.k8s.node import NodeReader, NodeReadError, gpu_resources
from gpuagent.node.kubernetes import KubernetesWatch
from gpuagent.supervisor import SourceTracker
from kubernetes_api import NODE, NODE_PATH, FakeApiServer, make_node, serve, write_kubeconfig

GPU = "nvidia.com/gpu"


@pytest.mark.parametrize(
    ("node", "expected"),
    [
        (make_node(allocatable={GPU: "8"}), (8, 8)),
        (make_node(allocatable={GPU: "7"}, capacity={GPU: "8"}), (7, 8)),
        # The GPU Operator runbook's node: the resource there, at 0.
        (make_node(allocatable={GPU: "0"}, capacity={GPU: "8"}), (0, 8)),
        # No device plugin ever registered: kubelet lists no such resource.
        (make_node(), (0, 0)),
    ],
)
def test_gpu_resources(node: object, expected: tuple[int, int]) -> None:
    assert gpu_resources(node, GPU) == expected


@pytest.mark.parametrize(
    "node",
    [
        {"kind": "Status"},
        {"status": {"allocatable": {GPU: "8k"}}},
        {"status": {"allocatable": {GPU: 8}}},
        {"status": {"allocatable": {GPU: "-1"}}},
    ],
)
def test_what_is_not_a_node_count_is_an_error(node: object) -> None:
    with pytest.raises(NodeReadError):
        gpu_resources(node, GPU)


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with serve(FakeApiServer(make_node(allocatable={GPU: "7"}, capacity={GPU: "8"}))) as fake:
        yield fake


def _reader(kubeconfig: Path, node: str = NODE) -> NodeReader:
    return NodeReader(node, kubeconfig=str(kubeconfig), resource=GPU, timeout=5.0)


def test_the_node_is_read_with_one_get(api: FakeApiServer, tmp_path: Path) -> None:
    reader = _reader(write_kubeconfig(tmp_path / "kc", api))
    try:
        assert reader.read() == (7, 8)
        assert reader.read() == (7, 8)
    finally:
        reader.close()
    assert [(r.method, r.path) for r in api.requests] == [("GET", NODE_PATH)] * 2


@pytest.mark.parametrize(
    ("status", "words"),
    [(403, "HTTP 403 Forbidden (the agent's ClusterRole"), (404, "(no such node;")],
)
def test_http_errors_say_what_to_fix(
    api: FakeApiServer, tmp_path: Path, status: int, words: str
) -> None:
    api.failures[("GET", NODE_PATH)] = status
    reader = _reader(write_kubeconfig(tmp_path / "kc", api))
    with pytest.raises(NodeReadError, match=f"^GET node {NODE}: HTTP {status} ") as caught:
        reader.read()
    reader.close()
    assert words in str(caught.value)


def test_an_unreachable_api_server_is_an_error(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    fake = FakeApiServer(make_node())
    fake.port = port  # nothing listens there
    reader = NodeReader(
        NODE, kubeconfig=str(write_kubeconfig(tmp_path / "kc", fake)), resource=GPU, timeout=2.0
    )
    with pytest.raises(NodeReadError, match="cannot reach the Kubernetes API"):
        reader.read()


def test_a_missing_kubeconfig_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(NodeReadError, match="cannot use kubeconfig"):
        _reader(tmp_path / "missing").read()


# --- the watch ----------------------------------------------------------------------------


def _watch(tmp_path: Path, kubeconfig: Path) -> tuple[KubernetesWatch, SourceTracker]:
    plugins = tmp_path / "dp"
    cdi = tmp_path / "cdi"
    config = parse_config(
        f'[checks.kubernetes]\nenabled = true\ndevice_plugin_dir = "{plugins}"\n'
        f'cdi_dirs = ["{cdi}"]\nruntime_paths = []\n'
        f'containerd_configs = ["{tmp_path / "config.toml"}"]\n'
        f'[remediation.cordon.kubernetes]\nkubeconfig = "{kubeconfig}"\nnode_name = "{NODE}"\n'
    )
    trackers: dict[str, SourceTracker] = {}
    watch = KubernetesWatch(config, trackers, None, schedule_publish=lambda: None)
    return watch, trackers["kubernetes"]


async def test_the_watch_reads_host_files_and_the_node(api: FakeApiServer, tmp_path: Path) -> None:
    watch, tracker = _watch(tmp_path, write_kubeconfig(tmp_path / "kc", api))
    (tmp_path / "dp").mkdir()
    (tmp_path / "cdi").mkdir()
    (tmp_path / "cdi" / "nvidia.yaml").write_text(
        'cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: "0"\n  containerEdits: {}\n'
    )
    (tmp_path / "dp" / CHECKPOINT).write_text(
        '{"Data": {"PodDeviceEntries": null, "RegisteredDevices": {"nvidia.com/gpu": ["GPU-a"]}}}'
    )
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(tmp_path / "dp" / "nvidia-gpu.sock"))
    try:
        await watch.refresh()
    finally:
        listener.close()
    facts = watch.facts
    assert facts.device_plugin.socket == "nvidia-gpu.sock"
    assert facts.device_plugin.registered == ("GPU-a",)
    assert [s.devices for s in facts.toolkit.specs] == [("0",)]
    assert facts.toolkit.runtime is None  # no containerd config there
    node = facts.node
    assert (node.allocatable, node.capacity, node.error) == (7, 8, None)
    assert node.read_at is not None
    assert node.allocatable_since == node.read_at
    assert tracker.status.up


async def test_a_failed_read_keeps_the_last_values_and_names_the_error(
    api: FakeApiServer, tmp_path: Path
) -> None:
    watch, tracker = _watch(tmp_path, write_kubeconfig(tmp_path / "kc", api))
    await watch.refresh()
    first = watch.facts.node
    api.failures[("GET", NODE_PATH)] = 403
    await watch.refresh()
    node = watch.facts.node
    assert (node.allocatable, node.read_at, node.allocatable_since) == (
        7,
        first.read_at,
        first.allocatable_since,
    )
    assert node.error is not None
    assert "403" in node.error
    assert not tracker.status.up
    # Back, with a new count: the count's age starts over.
    del api.failures[("GET", NODE_PATH)]
    api.node["status"]["allocatable"][GPU] = "8"
    await watch.refresh()
    node = watch.facts.node
    assert (node.allocatable, node.error) == (8, None)
    assert first.allocatable_since is not None
    assert node.allocatable_since is not None
    assert node.allocatable_since > first.allocatable_since


async def test_the_watch_times_a_missing_plugin(api: FakeApiServer, tmp_path: Path) -> None:
    watch, _ = _watch(tmp_path, write_kubeconfig(tmp_path / "kc", api))
    (tmp_path / "dp").mkdir()
    await watch.read_host()
    missing = watch.facts.plugin_missing_since
    assert missing is not None
    await watch.read_host()
    assert watch.facts.plugin_missing_since == missing  # since the first time, not the last
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(tmp_path / "dp" / "nvidia.sock"))
    try:
        await watch.read_host()
    finally:
        listener.close()
    assert watch.facts.plugin_missing_since is None
