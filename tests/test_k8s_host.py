"""The host side of the Kubernetes GPU stack: kubelet's checkpoint, CDI specs, the device
plugin socket and the container runtime, parsed from real files."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuagent.k8s.host import (
    CHECKPOINT,
    find_runtime,
    find_socket,
    parse_cdi_spec,
    parse_checkpoint,
    read_cdi_specs,
    read_device_plugin,
)

UUID_0 = "GPU-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c"
UUID_1 = "GPU-72cbf723-9f70-7d49-a6bb-626fcb3f8c30"

# kubelet >= 1.20: DeviceIDs by NUMA node.
CHECKPOINT_NUMA = json.dumps(
    {
        "Data": {
            "PodDeviceEntries": [
                {
                    "PodUID": "9a422c32-4fc2-11e9-bb64-505dac4c3a38",
                    "ContainerName": "trainer",
                    "ResourceName": "nvidia.com/gpu",
                    "DeviceIDs": {"0": [UUID_0]},
                    "AllocResp": "CkIKFk5WSURJQV9WSVNJQkxFX0RFVklDRVMSKEdQVS1hZDYzYzY4NA==",
                }
            ],
            "RegisteredDevices": {"nvidia.com/gpu": [UUID_0, UUID_1]},
        },
        "Checksum": 3364951114,
    }
)
# kubelet < 1.20: DeviceIDs a flat list (as `python -m json.tool` shows it).
CHECKPOINT_FLAT = """{
    "Checksum": 3364951114,
    "Data": {
        "PodDeviceEntries": [
            {
                "AllocResp": "CkIKFk5WSURJQV9WSVNJQkxFX0RFVklDRVM=",
                "ContainerName": "notebook",
                "DeviceIDs": [
                    "GPU-ad63c684-5593-111a-cbb1-c1451ebcd0aa"
                ],
                "PodUID": "368e63c4-2d97-11e9-8954-505dac4a7d28",
                "ResourceName": "nvidia.com/gpu"
            }
        ],
        "RegisteredDevices": {
            "nvidia.com/gpu": [
                "GPU-ad63c684-5593-111a-cbb1-c1451ebcd0aa",
                "GPU-72cbf723-9f70-7d49-a6bb-626fcb3f8c30"
            ]
        }
    }
}"""
# Time-slicing: each GPU registered as several replicas.
CHECKPOINT_SHARED = json.dumps(
    {
        "Data": {
            "PodDeviceEntries": None,
            "RegisteredDevices": {"nvidia.com/gpu": [f"{UUID_0}::0", f"{UUID_0}::1"]},
        },
        "Checksum": 1,
    }
)
# Only another vendor's plugin registered.
CHECKPOINT_OTHER = json.dumps(
    {"Data": {"PodDeviceEntries": [], "RegisteredDevices": {"rdma/hca_shared": ["1"]}}}
)
CHECKPOINT_NONE = json.dumps({"Data": {"PodDeviceEntries": None, "RegisteredDevices": None}})


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (CHECKPOINT_NUMA, (UUID_0, UUID_1)),
        (CHECKPOINT_FLAT, ("GPU-ad63c684-5593-111a-cbb1-c1451ebcd0aa", UUID_1)),
        (CHECKPOINT_SHARED, (f"{UUID_0}::0", f"{UUID_0}::1")),
        (CHECKPOINT_OTHER, ()),
        (CHECKPOINT_NONE, ()),
    ],
    ids=["numa", "flat", "time-slicing", "other-resource", "null"],
)
def test_checkpoint_registered_devices(text: str, expected: tuple[str, ...]) -> None:
    assert parse_checkpoint(text, "nvidia.com/gpu") == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "not json",
        "[]",
        '{"Checksum": 1}',
        '{"Data": {"RegisteredDevices": ["GPU-1"]}}',
        '{"Data": {"RegisteredDevices": {"nvidia.com/gpu": "GPU-1"}}}',
        '{"Data": {"RegisteredDevices": {"nvidia.com/gpu": [0]}}}',
    ],
)
def test_a_checkpoint_that_is_not_one_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_checkpoint(text, "nvidia.com/gpu")


# What `nvidia-ctk cdi generate` writes (shortened: fewer mounts and hooks).
CDI_YAML = f"""---
cdiVersion: 0.5.0
containerEdits:
  deviceNodes:
  - path: /dev/nvidia-modeset
  - path: /dev/nvidia-uvm
  - path: /dev/nvidia-uvm-tools
  - path: /dev/nvidiactl
  env:
  - NVIDIA_VISIBLE_DEVICES=void
  hooks:
  - args:
    - nvidia-cdi-hook
    - create-symlinks
    - --link
    - libglxserver_nvidia.so.550.54.15::/usr/lib/xorg/modules/extensions/libglxserver_nvidia.so
    hookName: createContainer
    path: /usr/bin/nvidia-cdi-hook
  mounts:
  - containerPath: /usr/bin/nvidia-smi
    hostPath: /usr/bin/nvidia-smi
    options:
    - ro
    - nosuid
    - nodev
    - bind
devices:
- containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
  name: "0"
- containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
  name: {UUID_0}
- containerEdits:
    deviceNodes:
    - path: /dev/nvidia1
  name: "1"
- containerEdits:
    deviceNodes:
    - path: /dev/nvidia1
  name: {UUID_1}
- containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
    - path: /dev/nvidia1
  name: all
kind: nvidia.com/gpu
"""
# The JSON form (`--format=json`), with MIG devices.
CDI_JSON = json.dumps(
    {
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": [
            {"name": "0:0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}},
            {
                "name": "MIG-5c1d3ab7-2d36-5b0e-9f6c-0f0b0d3c6a11",
                "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]},
            },
            {"name": "all", "containerEdits": {}},
        ],
        "containerEdits": {"deviceNodes": [{"path": "/dev/nvidiactl"}]},
    }
)
# Another vendor's spec, with an unquoted numeric name.
CDI_OTHER = (
    "cdiVersion: 0.6.0\nkind: vendor.com/device\ndevices:\n- name: 0\n  containerEdits: {}\n"
)


@pytest.mark.parametrize(
    ("text", "kind", "devices"),
    [
        (CDI_YAML, "nvidia.com/gpu", ("0", UUID_0, "1", UUID_1, "all")),
        (
            CDI_JSON,
            "nvidia.com/gpu",
            ("0:0", "MIG-5c1d3ab7-2d36-5b0e-9f6c-0f0b0d3c6a11", "all"),
        ),
        (CDI_OTHER, "vendor.com/device", ("0",)),
        ("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices: []\n", "nvidia.com/gpu", ()),
    ],
    ids=["nvidia-ctk-yaml", "nvidia-ctk-json-mig", "other-vendor", "no-devices"],
)
def test_cdi_spec_kind_and_device_names(text: str, kind: str, devices: tuple[str, ...]) -> None:
    spec = parse_cdi_spec(text, "/etc/cdi/x.yaml")
    assert (spec.path, spec.kind, spec.devices) == ("/etc/cdi/x.yaml", kind, devices)


@pytest.mark.parametrize(
    "text",
    ["", "just words", "kind: [1, 2]", "kind: nvidia.com/gpu\ndevices: {}\n", "a: [unclosed"],
)
def test_a_cdi_spec_that_is_not_one_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_cdi_spec(text, "/etc/cdi/x.yaml")


def test_cdi_specs_from_every_directory_and_their_errors(tmp_path: Path) -> None:
    etc, run = tmp_path / "etc", tmp_path / "run"
    etc.mkdir()
    run.mkdir()
    (etc / "nvidia.yaml").write_text(CDI_YAML)
    (etc / "README").write_text("not a spec, not read")
    (run / "nvidia.json").write_text(CDI_JSON)
    (run / "broken.yml").write_text("kind: [")
    specs, unreadable = read_cdi_specs([etc, run, tmp_path / "missing"])
    assert [Path(s.path).name for s in specs] == ["nvidia.yaml", "nvidia.json"]
    assert [Path(path).name for path, _ in unreadable] == ["broken.yml"]


@pytest.fixture
def plugin_dir(tmp_path: Path) -> Iterator[Path]:
    # A short path: unix socket names are limited to about 100 bytes.
    directory = tmp_path / "dp"
    directory.mkdir()
    sockets = []
    for name in ("kubelet.sock", "nvidia-gpu.sock"):
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(directory / name))
        sockets.append(listener)
    yield directory
    for listener in sockets:
        listener.close()


def test_the_plugin_socket_is_found_by_pattern(plugin_dir: Path) -> None:
    assert find_socket(plugin_dir, ["nvidia*.sock"]) == "nvidia-gpu.sock"
    assert find_socket(plugin_dir, ["nvidia.sock"]) is None
    assert find_socket(plugin_dir.parent / "missing", ["nvidia*.sock"]) is None


def test_a_regular_file_is_not_a_socket(tmp_path: Path) -> None:
    (tmp_path / "nvidia-gpu.sock").write_text("")
    assert find_socket(tmp_path, ["nvidia*.sock"]) is None


def test_the_device_plugin_with_its_checkpoint(plugin_dir: Path) -> None:
    assert read_device_plugin(plugin_dir, ["nvidia*.sock"], "nvidia.com/gpu").registered is None
    (plugin_dir / CHECKPOINT).write_text(CHECKPOINT_NUMA)
    plugin = read_device_plugin(plugin_dir, ["nvidia*.sock"], "nvidia.com/gpu")
    assert (plugin.socket, plugin.registered, plugin.error) == (
        "nvidia-gpu.sock",
        (UUID_0, UUID_1),
        None,
    )
    (plugin_dir / CHECKPOINT).write_text("{")
    plugin = read_device_plugin(plugin_dir, ["nvidia*.sock"], "nvidia.com/gpu")
    assert plugin.socket == "nvidia-gpu.sock"
    assert plugin.registered is None
    assert plugin.error is not None
    assert plugin.error.startswith(CHECKPOINT)


# containerd 1.x (config version 2), as `nvidia-ctk runtime configure` writes it.
CONTAINERD_V2 = """version = 2
[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    [plugins."io.containerd.grpc.v1.cri".containerd]
      default_runtime_name = "nvidia"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes]
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
          privileged_without_host_devices = false
          runtime_type = "io.containerd.runc.v2"
          [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
            BinaryName = "/usr/bin/nvidia-container-runtime"
"""
# containerd 2.x (config version 3).
CONTAINERD_V3 = """version = 3
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia]
  runtime_type = 'io.containerd.runc.v2'
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia.options]
    BinaryName = '/usr/bin/nvidia-container-runtime'
"""
CONTAINERD_RUNC_ONLY = """version = 2
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
  # a comment naming nvidia is not a runtime
"""


@pytest.mark.parametrize(
    ("config", "found"),
    [(CONTAINERD_V2, True), (CONTAINERD_V3, True), (CONTAINERD_RUNC_ONLY, False)],
    ids=["containerd-v2", "containerd-v3", "runc-only"],
)
def test_the_runtime_named_in_containerd(tmp_path: Path, config: str, found: bool) -> None:
    path = tmp_path / "config.toml"
    path.write_text(config)
    assert find_runtime([tmp_path / "no-binary"], [path]) == (str(path) if found else None)


def test_the_runtime_binary_wins_and_nothing_configured_is_not_checked(tmp_path: Path) -> None:
    binary = tmp_path / "nvidia-container-runtime"
    binary.write_text("#!/bin/sh\n")
    assert find_runtime([binary], [tmp_path / "missing.toml"]) == str(binary)
    assert find_runtime([], []) == ""
    assert find_runtime([tmp_path / "missing"], [tmp_path / "missing.toml"]) is None
