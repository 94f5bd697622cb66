"""RDMA devices and ports from sysfs (/sys/class/infiniband), as mlx5 lays them out.

Each device (mlx5_0, ...) has ports/<n>/ with `state` ("4: ACTIVE"), `phys_state`
("5: LinkUp"), `rate` ("400 Gb/sec (4X NDR)"), `link_layer` ("InfiniBand", or
"Ethernet" for RoCE), the InfiniBand port counters under counters/ and the driver's RDMA
counters under hw_counters/. Plain file I/O (blocking): the daemon runs `read_infiniband`
in a thread. A value that cannot be read is left out, never taken for zero.
"""

from __future__ import annotations

import re
from pathlib import Path

from gpuagent.model import IbDevice, IbPort
from gpuagent.sources.pcie import read_stripped

_STATE_RE = re.compile(r"^\s*(\d+)\s*:\s*(\S.*?)\s*$")
_RATE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*Gb/sec")
# Counters the InfiniBand specification counts in 4-octet words; kept in bytes.
WORD_COUNTERS = frozenset({"port_rcv_data", "port_xmit_data"})
# hw_counters/lifespan is how long (ms) the driver caches the counters: a setting.
_NOT_COUNTERS = frozenset({"lifespan"})


def read_infiniband(sys_root: Path) -> tuple[IbDevice, ...] | None:
    """Every RDMA device under sysfs ``sys_root`` and its ports, by name.

    () when the node has none (no class directory: no RDMA driver loaded), None when the
    class directory exists but cannot be listed.
    """
    class_dir = sys_root / "class" / "infiniband"
    if not class_dir.exists():
        return ()
    try:
        entries = sorted(class_dir.iterdir(), key=lambda p: p.name)
    except OSError:
        return None
    return tuple(_device(entry) for entry in entries)


def parse_state(text: str | None) -> tuple[int | None, str]:
    """`state` and `phys_state` ("4: ACTIVE") as (4, "ACTIVE"); (None, "") if not one."""
    match = _STATE_RE.match(text or "")
    return (int(match.group(1)), match.group(2)) if match else (None, "")


def parse_rate(text: str | None) -> float | None:
    """`rate` ("400 Gb/sec (4X NDR)", "2.5 Gb/sec (1X SDR)") in Gb/s; None if not one."""
    match = _RATE_RE.match(text or "")
    return float(match.group(1)) if match else None


def _device(entry: Path) -> IbDevice:
    return IbDevice(
        name=entry.name,
        hca_type=read_stripped(entry / "hca_type") or "",
        board_id=read_stripped(entry / "board_id") or "",
        firmware_version=read_stripped(entry / "fw_ver") or "",
        pci_address=_pci_address(entry / "device"),
        ports=tuple(_port(entry.name, number, path) for number, path in _ports(entry / "ports")),
    )


def _ports(directory: Path) -> list[tuple[int, Path]]:
    try:
        found = [(p.name, p) for p in directory.iterdir()]
    except OSError:
        return []
    return sorted((int(name), path) for name, path in found if name.isdigit())


def _port(device: str, number: int, directory: Path) -> IbPort:
    state_id, state = parse_state(read_stripped(directory / "state"))
    phys_id, phys = parse_state(read_stripped(directory / "phys_state"))
    return IbPort(
        device=device,
        port=number,
        state_id=state_id,
        state=state,
        phys_state_id=phys_id,
        phys_state=phys,
        rate_gbps=parse_rate(read_stripped(directory / "rate")),
        link_layer=read_stripped(directory / "link_layer") or "",
        counters=_counters(directory / "counters"),
        hw_counters=_counters(directory / "hw_counters"),
    )


def _counters(directory: Path) -> tuple[tuple[str, int], ...]:
    try:
        files = sorted(directory.iterdir(), key=lambda p: p.name)
    except OSError:
        return ()
    found: list[tuple[str, int]] = []
    for path in files:
        text = read_stripped(path)
        if path.name in _NOT_COUNTERS or text is None or not text.isdigit():
            continue
        value = int(text)
        found.append((path.name, value * 4 if path.name in WORD_COUNTERS else value))
    return tuple(found)


def _pci_address(device_link: Path) -> str | None:
    # `device` links to the PCI function (…/0000:1a:00.0); virtual devices (rxe) have none.
    try:
        return device_link.resolve(strict=True).name
    except (OSError, RuntimeError):
        return None
