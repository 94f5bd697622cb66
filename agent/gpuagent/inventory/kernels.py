"""Which installed kernels have an NVIDIA kernel module: the "driver breaks after a kernel
update" trap, seen before the reboot that would lose every GPU.

A kernel package installs /lib/modules/<release>; the NVIDIA module for it comes from a
DKMS build (updates/dkms/nvidia.ko), a distribution's prebuilt package (kernel/nvidia-*/,
extra/, updates/) or NVIDIA's .run installer (kernel/drivers/video/). depmod lists every
one of them in modules.dep, which DKMS and the packages run after installing, so that file
is read first; a kernel without it (depmod not run yet) is searched instead.
"""

from __future__ import annotations

import re
from pathlib import Path

from gpuagent.inventory.model import KernelModuleState, version_key

# The core module, compressed or not: nvidia.ko, or Debian's renamed builds
# (nvidia-current.ko, nvidia-tesla-535.ko); never nvidia-uvm, -drm, -modeset or -peermem.
_MODULE_FILE = r"nvidia(?:-current|-tesla(?:-\d+)?)?\.ko(?:\.(?:xz|zst|gz))?"
_MODULE_NAME_RE = re.compile(rf"^{_MODULE_FILE}$")
_DEP_LINE_RE = re.compile(rf"^((?:\S*/)?{_MODULE_FILE}):", re.MULTILINE)


def read_kernel_modules(
    modules_root: Path, dkms_root: Path, running: str | None
) -> tuple[KernelModuleState, ...]:
    """Every kernel under ``modules_root`` (oldest first), plus the running kernel when its
    tree is missing (a module tree deleted under a running kernel still matters)."""
    try:
        releases = [entry.name for entry in modules_root.iterdir() if entry.is_dir()]
    except OSError:
        releases = []
    if running and running not in releases:
        releases.append(running)
    return tuple(
        _state(modules_root / release, dkms_root, release)
        for release in sorted(releases, key=version_key)
    )


def _state(tree: Path, dkms_root: Path, release: str) -> KernelModuleState:
    listed = _from_modules_dep(tree / "modules.dep")
    if listed:
        return KernelModuleState(release, has_nvidia=True, where=listed)
    searched = _search_tree(tree)
    if searched:
        return KernelModuleState(release, has_nvidia=True, where=searched)
    built = _dkms_build(dkms_root, release)
    if built:
        return KernelModuleState(release, has_nvidia=True, where=built)
    # A tree that cannot be read is "unknown", never "no module".
    return KernelModuleState(release, has_nvidia=None if searched is None else False)


def _from_modules_dep(path: Path) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    match = _DEP_LINE_RE.search(text)
    return match.group(1) if match else ""


def _search_tree(tree: Path) -> str | None:
    """The module's path in the tree, "" when there is none, None when it cannot be read."""
    if not tree.is_dir():
        return None
    try:
        for path in tree.rglob("nvidia*.ko*"):
            if _MODULE_NAME_RE.search(path.name):
                return str(path.relative_to(tree))
    except OSError:
        return None
    return ""


def _dkms_build(dkms_root: Path, release: str) -> str:
    """A DKMS build of nvidia for ``release`` not yet installed into its tree
    (/var/lib/dkms/nvidia*/<version>/<release>/<arch>/module/nvidia.ko)."""
    try:
        for path in dkms_root.glob(f"nvidia*/*/{release}/*/module/nvidia*.ko*"):
            if _MODULE_NAME_RE.search(path.name):
                return "dkms:" + str(path.relative_to(dkms_root))
    except OSError:
        return ""
    return ""
