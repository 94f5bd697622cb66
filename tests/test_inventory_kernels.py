"""Which installed kernels have an NVIDIA module, on trees laid out as the packages do."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuagent.inventory.kernels import read_kernel_modules
from gpuagent.inventory.model import newest, version_key

DEBIAN_DKMS = "updates/dkms/nvidia-current.ko"  # nvidia-kernel-dkms on Debian 12
UBUNTU_DKMS = "updates/dkms/nvidia.ko.zst"  # nvidia-dkms-550 on Ubuntu 24.04
UBUNTU_PREBUILT = "kernel/nvidia-550srv/nvidia.ko"  # linux-modules-nvidia-550-server-*
RHEL_KMOD = "extra/nvidia.ko.xz"  # kmod-nvidia-latest-dkms / precompiled streams
RUNFILE = "kernel/drivers/video/nvidia.ko"  # NVIDIA's .run installer
NOT_THE_DRIVER = (
    "updates/dkms/nvidia-uvm.ko",
    "updates/dkms/nvidia-current-uvm.ko",
    "updates/dkms/nvidia-drm.ko.zst",
    "updates/dkms/nvidia-peermem.ko",
    "kernel/drivers/net/ethernet/nvidia/forcedeth.ko",
)


def kernel(root: Path, release: str, *modules: str, depmod: bool = True) -> Path:
    tree = root / release
    (tree / "kernel/fs").mkdir(parents=True)
    (tree / "kernel/fs/ext4.ko").write_bytes(b"")
    lines = ["kernel/fs/ext4.ko:"]
    for module in modules:
        (tree / module).parent.mkdir(parents=True, exist_ok=True)
        (tree / module).write_bytes(b"")
        lines.append(f"{module}: kernel/fs/ext4.ko" if "drm" in module else f"{module}:")
    if depmod:
        (tree / "modules.dep").write_text("\n".join(lines) + "\n")
    return tree


@pytest.mark.parametrize("module", [DEBIAN_DKMS, UBUNTU_DKMS, UBUNTU_PREBUILT, RHEL_KMOD, RUNFILE])
@pytest.mark.parametrize("depmod", [True, False], ids=["modules.dep", "tree"])
def test_each_packaging_of_the_module_is_found(tmp_path, module, depmod):
    kernel(tmp_path, "6.1.0-28-amd64", module, depmod=depmod)
    (state,) = read_kernel_modules(tmp_path, tmp_path / "dkms", "6.1.0-28-amd64")
    assert state.has_nvidia is True
    assert state.where == module


@pytest.mark.parametrize("depmod", [True, False], ids=["modules.dep", "tree"])
def test_other_nvidia_modules_are_not_the_driver(tmp_path, depmod):
    kernel(tmp_path, "6.8.0-49-generic", *NOT_THE_DRIVER, depmod=depmod)
    (state,) = read_kernel_modules(tmp_path, tmp_path / "dkms", "6.8.0-49-generic")
    assert state.has_nvidia is False


def test_a_newer_kernel_without_the_module_is_the_newest(tmp_path):
    kernel(tmp_path, "6.1.0-9-amd64", DEBIAN_DKMS)
    kernel(tmp_path, "6.1.0-28-amd64")  # installed by an upgrade; DKMS failed to build
    states = read_kernel_modules(tmp_path, tmp_path / "dkms", "6.1.0-9-amd64")
    assert [s.release for s in states] == ["6.1.0-9-amd64", "6.1.0-28-amd64"]
    latest = newest(states)
    assert latest is not None
    assert (latest.release, latest.has_nvidia) == ("6.1.0-28-amd64", False)


def test_a_dkms_build_not_yet_installed_counts(tmp_path):
    kernel(tmp_path / "modules", "6.8.0-50-generic")
    build = tmp_path / "dkms/nvidia/550.127.05/6.8.0-50-generic/x86_64/module/nvidia.ko"
    build.parent.mkdir(parents=True)
    build.write_bytes(b"")
    (state,) = read_kernel_modules(tmp_path / "modules", tmp_path / "dkms", None)
    assert state.has_nvidia is True
    assert state.where == "dkms:nvidia/550.127.05/6.8.0-50-generic/x86_64/module/nvidia.ko"


def test_a_running_kernel_whose_tree_is_gone_is_unknown_not_missing(tmp_path):
    kernel(tmp_path, "6.1.0-28-amd64", DEBIAN_DKMS)
    states = read_kernel_modules(tmp_path, tmp_path / "dkms", "6.1.0-27-amd64")
    assert [(s.release, s.has_nvidia) for s in states] == [
        ("6.1.0-27-amd64", None),
        ("6.1.0-28-amd64", True),
    ]


def test_no_modules_root_gives_only_the_running_kernel_as_unknown(tmp_path):
    states = read_kernel_modules(tmp_path / "missing", tmp_path / "dkms", "6.1.0-28-amd64")
    assert [(s.release, s.has_nvidia) for s in states] == [("6.1.0-28-amd64", None)]
    assert read_kernel_modules(tmp_path / "missing", tmp_path / "dkms", None) == ()


@pytest.mark.parametrize(
    ("older", "newer"),
    [
        ("6.1.0-9-amd64", "6.1.0-28-amd64"),
        ("5.15.0-125-generic", "6.8.0-49-generic"),
        ("6.8.0-49-generic", "6.8.0-50-generic"),
        ("5.14.0-427.13.1.el9_4.x86_64", "5.14.0-503.11.1.el9_5.x86_64"),
        ("6.1.0-28-amd64", "6.1.0-28-cloud-amd64"),
    ],
)
def test_kernel_releases_sort_by_version(older, newer):
    assert version_key(older) < version_key(newer)
