"""The sysfs PCIe source: every NVIDIA GPU and NVSwitch, and the bridges above it.

NVML reports a GPU's link only while the GPU answers. sysfs also has the other end of
each link (the switch or root port above), which still reports after the GPU has fallen
off the bus, and the kernel's AER counters for every function on the way. Reading is
plain file I/O (blocking); the daemon runs `read_pcie_paths` in a thread.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from gpuagent.model import PcieLink, PciePath, PcieRole

NVIDIA_VENDOR = 0x10DE
# PCI class codes (base class, subclass) as the upper 16 bits of sysfs' 24-bit `class`.
_CLASS_ROLES: dict[int, PcieRole] = {
    0x0300: "gpu",  # VGA-compatible controller: GPUs with a display engine
    0x0302: "gpu",  # 3D controller: data-center GPUs (A100, H100, ...)
    0x0680: "nvswitch",  # "other bridge": how NVSwitches enumerate (e.g. 0x068000)
}

_BUS_ID = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
# "16.0 GT/s PCIe" on current kernels, "8 GT/s" on older ones; "Unknown" when the link
# state cannot be read (a device that fell off the bus reads all ones).
_SPEED = re.compile(r"(\d+(?:\.\d+)?) GT/s")
# A dead function reads all ones and a port with its link down reads 0, so widths outside
# the ones PCIe defines (0, 255, 63, ...) mean "no usable value".
_LINK_WIDTHS = frozenset({1, 2, 4, 8, 12, 16, 32})
_GENERATIONS = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}
# aer_dev_* file -> the line holding its total (the other lines count each error type).
_AER_TOTALS = {
    "aer_dev_correctable": "TOTAL_ERR_COR",
    "aer_dev_nonfatal": "TOTAL_ERR_NONFATAL",
    "aer_dev_fatal": "TOTAL_ERR_FATAL",
}


def speed_to_generation(gts: float) -> int | None:
    """PCIe generation for a link speed in GT/s (2.5 -> 1 ... 64 -> 6); None if not one."""
    return _GENERATIONS.get(round(gts, 1))


def canonical_bus_id(name: str) -> str | None:
    """``name`` as a canonical bus id ("0000:3b:00.0"), or None if it is not one."""
    lowered = name.strip().lower()
    return lowered if _BUS_ID.fullmatch(lowered) else None


def role_of(vendor: int | None, device_class: int | None) -> PcieRole | None:
    """The role of a function the agent watches (NVIDIA GPU or NVSwitch), else None."""
    if vendor != NVIDIA_VENDOR or device_class is None:
        return None
    return _CLASS_ROLES.get(device_class >> 8)


def read_pcie_paths(root: Path) -> tuple[PciePath, ...]:
    """Every NVIDIA GPU and NVSwitch under sysfs ``root`` with its bridges, by address.

    Attributes that are missing or unreadable come back as None; a device that vanishes
    while it is read is left out. Only a sysfs without ``bus/pci/devices`` at all raises
    (OSError), since that is a wrong root or a missing mount rather than "no GPUs".
    """
    devices = root / "bus" / "pci" / "devices"
    if not devices.is_dir():
        raise FileNotFoundError(f"no PCI devices directory at {devices}")
    bridges: dict[Path, PcieLink] = {}  # shared bridges are read once per call
    paths = (_read_path(entry, bridges) for entry in _entries(devices))
    return tuple(sorted((p for p in paths if p is not None), key=lambda p: p.device.address))


def _entries(devices: Path) -> Iterator[Path]:
    try:
        yield from devices.iterdir()
    except OSError:
        return


def _read_path(entry: Path, bridges: dict[Path, PcieLink]) -> PciePath | None:
    address = canonical_bus_id(entry.name)
    if address is None:
        return None
    try:
        # The bus/pci/devices entry is a symlink into the device tree, whose parents are
        # the bridges this function hangs off.
        device_dir = entry.resolve(strict=True)
    except (OSError, RuntimeError):
        return None
    role = role_of(read_hex(device_dir / "vendor"), read_hex(device_dir / "class"))
    if role is None:
        return None
    device = _read_link(device_dir, address, role)
    upstream = tuple(_bridge(*parent, bridges) for parent in _pci_parents(device_dir))
    if not device_dir.is_dir():
        # Gone while we read it: its values are a mix of real ones and Nones.
        return None
    return PciePath(device=device, bridges=upstream)


def _pci_parents(device_dir: Path) -> Iterator[tuple[str, Path]]:
    """(address, directory) of the parents that are PCI functions, nearest first.

    The walk ends at the host bridge's directory ("pci0000:00"), which is not a function.
    """
    for parent in device_dir.parents:
        address = canonical_bus_id(parent.name)
        if address is None:
            return
        yield address, parent


def _bridge(address: str, directory: Path, seen: dict[Path, PcieLink]) -> PcieLink:
    link = seen.get(directory)
    if link is None:
        link = seen[directory] = _read_link(directory, address, "bridge")
    return link


def _read_link(directory: Path, address: str, role: PcieRole) -> PcieLink:
    return PcieLink(
        address=address,
        role=role,
        current_speed_gts=_read_speed(directory / "current_link_speed"),
        max_speed_gts=_read_speed(directory / "max_link_speed"),
        current_width=_read_width(directory / "current_link_width"),
        max_width=_read_width(directory / "max_link_width"),
        aer_correctable=_read_aer_total(directory, "aer_dev_correctable"),
        aer_nonfatal=_read_aer_total(directory, "aer_dev_nonfatal"),
        aer_fatal=_read_aer_total(directory, "aer_dev_fatal"),
    )


def read_stripped(path: Path) -> str | None:
    """A sysfs (or procfs) file's text, stripped; None where it cannot be read."""
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii")
    except (OSError, ValueError):
        # ValueError covers bytes that are not ASCII: a sysfs attribute never has them.
        return None


def read_hex(path: Path) -> int | None:
    text = _read_text(path)
    try:
        return None if text is None else int(text.strip(), 16)
    except ValueError:
        return None


def _read_speed(path: Path) -> float | None:
    text = _read_text(path)
    match = None if text is None else _SPEED.match(text.strip())
    return None if match is None else float(match.group(1))


def _read_width(path: Path) -> int | None:
    text = _read_text(path)
    if text is None or not text.strip().isdigit():
        return None
    width = int(text)
    return width if width in _LINK_WIDTHS else None


def _read_aer_total(directory: Path, name: str) -> int | None:
    """The TOTAL_ERR_* line of an aer_dev_* file; None without AER reporting."""
    text = _read_text(directory / name)
    if text is None:
        return None
    total = _AER_TOTALS[name]
    for line in text.splitlines():
        key, _, count = line.partition(" ")
        if key == total and count.strip().isdigit():
            return int(count)
    return None
