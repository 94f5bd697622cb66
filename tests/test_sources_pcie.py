"""The sysfs PCIe source, read from fixture trees laid out like a real HGX H100 node's sysfs."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from conftest import require_that
from gpuagent.model import PcieLink, PciePath
from gpuagent.sources import pcie
from gpuagent.sources.pcie import canonical_bus_id, read_pcie_paths, speed_to_generation

# The error names the kernel prints in aer_dev_* files, in its order.
AER_CORRECTABLE = (
    "RxErr",
    "BadTLP",
    "BadDLLP",
    "Rollover",
    "Timeout",
    "NonFatalErr",
    "CorrIntErr",
    "HeaderOF",
)
AER_UNCORRECTABLE = (
    "Undefined",
    "DLP",
    "SDES",
    "TLP",
    "FCP",
    "CmpltTO",
    "CmpltAbrt",
    "UnxCmplt",
    "RxOF",
    "MalfTLP",
    "ECRC",
    "UnsupReq",
    "ACSViol",
    "UncorrIntErr",
    "BlockedTLP",
    "AtomicOpBlocked",
    "TLPBlockedErr",
    "PoisonTLPBlocked",
)

INTEL, BROADCOM, MELLANOX, NVIDIA = 0x8086, 0x1000, 0x15B3, 0x10DE
PCI_BRIDGE, HOST_BRIDGE, NIC, AUDIO = 0x060400, 0x060000, 0x020000, 0x040300
GPU_3D, GPU_VGA, NVSWITCH = 0x030200, 0x030000, 0x068000


def aer_text(names: tuple[str, ...], total: str, counts: dict[str, int]) -> str:
    lines = [f"{name} {counts.get(name, 0)}" for name in names]
    return "\n".join([*lines, f"{total} {sum(counts.values())}"]) + "\n"


@dataclass
class Aer:
    correctable: dict[str, int] = field(default_factory=dict)
    nonfatal: dict[str, int] = field(default_factory=dict)
    fatal: dict[str, int] = field(default_factory=dict)

    def files(self) -> dict[str, str]:
        return {
            "aer_dev_correctable": aer_text(AER_CORRECTABLE, "TOTAL_ERR_COR", self.correctable),
            "aer_dev_nonfatal": aer_text(AER_UNCORRECTABLE, "TOTAL_ERR_NONFATAL", self.nonfatal),
            "aer_dev_fatal": aer_text(AER_UNCORRECTABLE, "TOTAL_ERR_FATAL", self.fatal),
        }


@dataclass
class Link:
    """What the link attributes say, exactly as sysfs writes them."""

    speed: str = "32.0 GT/s PCIe"
    max_speed: str = "32.0 GT/s PCIe"
    width: str = "16"
    max_width: str = "16"

    def files(self) -> dict[str, str]:
        return {
            "current_link_speed": f"{self.speed}\n",
            "max_link_speed": f"{self.max_speed}\n",
            "current_link_width": f"{self.width}\n",
            "max_link_width": f"{self.max_width}\n",
        }


def add_function(
    root: Path,
    chain: str,
    vendor: int,
    device_class: int,
    link: Link | None = None,
    aer: Aer | None = None,
    **extra: str,
) -> Path:
    """One PCI function at devices/CHAIN, linked from bus/pci/devices as the kernel does."""
    directory = root / "devices" / chain
    directory.mkdir(parents=True, exist_ok=True)
    files = {"vendor": f"{vendor:#06x}\n", "class": f"{device_class:#08x}\n"}
    files.update(link.files() if link else {})
    files.update(aer.files() if aer else {})
    files.update(extra)
    for name, text in files.items():
        (directory / name).write_text(text)
    devices = root / "bus" / "pci" / "devices"
    devices.mkdir(parents=True, exist_ok=True)
    (devices / directory.name).symlink_to(f"../../../devices/{chain}")
    return directory


# One PCIe complex of an HGX H100 board: root port -> PEX switch upstream port -> switch
# downstream ports -> GPUs and a NIC; a second complex with an NVSwitch and a GPU that fell
# off the bus; and, under the host bridge, a passthrough-style GPU without PCIe capability.
ROOT_PORT = "pci0000:15/0000:15:01.0"
SWITCH_UP = f"{ROOT_PORT}/0000:16:00.0"
GPU_OK = f"{SWITCH_UP}/0000:17:00.0/0000:18:00.0"
NIC_PATH = f"{SWITCH_UP}/0000:17:01.0/0000:19:00.0"
GPU_NARROW = f"{SWITCH_UP}/0000:17:02.0/0000:1a:00.0"
ROOT_PORT_2 = "pci0000:b7/0000:b7:01.0"
SWITCH_UP_2 = f"{ROOT_PORT_2}/0000:b8:00.0"
GPU_GONE = f"{SWITCH_UP_2}/0000:b9:00.0/0000:ba:00.0"
NVSWITCH_PATH = f"{SWITCH_UP_2}/0000:b9:01.0/0000:bb:00.0"

NARROW = Link(speed="16.0 GT/s PCIe", width="8")
# A function that fell off the bus reads all ones from config space.
GONE = Link(speed="Unknown", max_speed="Unknown", width="63", max_width="63")
# The switch port above it: link down, trained at the lowest speed with no lanes.
PORT_LINK_DOWN = Link(speed="2.5 GT/s PCIe", width="0")


def build_board(root: Path) -> Path:
    bridge, gen4_x2 = Link(), Link("16.0 GT/s PCIe", "16.0 GT/s PCIe", "2", "2")
    add_function(root, "pci0000:00/0000:00:00.0", INTEL, HOST_BRIDGE)
    add_function(root, "pci0000:00/0000:00:05.0", NVIDIA, GPU_3D)
    add_function(root, "pci0000:00/0000:00:06.0", NVIDIA, GPU_VGA, Link("8.0 GT/s PCIe"))
    add_function(root, "pci0000:00/0000:00:06.1", NVIDIA, AUDIO, Link("8.0 GT/s PCIe"))
    add_function(root, ROOT_PORT, INTEL, PCI_BRIDGE, bridge, Aer())
    add_function(root, SWITCH_UP, BROADCOM, PCI_BRIDGE, bridge, Aer())
    for port in ("0000:17:00.0", "0000:17:01.0"):
        add_function(root, f"{SWITCH_UP}/{port}", BROADCOM, PCI_BRIDGE, bridge, Aer())
    narrow_errors = Aer(correctable={"RxErr": 12, "BadTLP": 3, "BadDLLP": 5})
    add_function(root, f"{SWITCH_UP}/0000:17:02.0", BROADCOM, PCI_BRIDGE, NARROW, narrow_errors)
    add_function(root, GPU_OK, NVIDIA, GPU_3D, Link(), Aer(correctable={"BadDLLP": 1}))
    add_function(root, NIC_PATH, MELLANOX, NIC, Link(), Aer())
    add_function(root, GPU_NARROW, NVIDIA, GPU_3D, NARROW, Aer(correctable={"RxErr": 7}))
    add_function(root, ROOT_PORT_2, INTEL, PCI_BRIDGE, bridge, Aer())
    add_function(root, SWITCH_UP_2, BROADCOM, PCI_BRIDGE, bridge, Aer())
    gone_errors = Aer(nonfatal={"CmpltTO": 2}, fatal={"DLP": 1})
    add_function(
        root, f"{SWITCH_UP_2}/0000:b9:00.0", BROADCOM, PCI_BRIDGE, PORT_LINK_DOWN, gone_errors
    )
    add_function(root, f"{SWITCH_UP_2}/0000:b9:01.0", BROADCOM, PCI_BRIDGE, bridge, Aer())
    add_function(root, GPU_GONE, NVIDIA, GPU_3D, GONE, Aer())
    add_function(root, NVSWITCH_PATH, NVIDIA, NVSWITCH, gen4_x2, Aer())
    return root


@pytest.fixture
def board(tmp_path: Path) -> Path:
    return build_board(tmp_path / "sys")


def by_address(root: Path) -> dict[str, PciePath]:
    return {p.device.address: p for p in read_pcie_paths(root)}


def addresses(links: tuple[PcieLink, ...]) -> list[str]:
    return [link.address for link in links]


# --- what is found --------------------------------------------------------------------


def test_finds_nvidia_gpus_and_nvswitches_in_address_order(board):
    paths = read_pcie_paths(board)
    assert [(p.device.address, p.device.role) for p in paths] == [
        ("0000:00:05.0", "gpu"),
        ("0000:00:06.0", "gpu"),
        ("0000:18:00.0", "gpu"),
        ("0000:1a:00.0", "gpu"),
        ("0000:ba:00.0", "gpu"),
        ("0000:bb:00.0", "nvswitch"),
    ]


def test_other_functions_are_left_out(board):
    found = by_address(board)
    # The NIC, the bridges as devices, the host bridge and the GPU's audio function.
    for address in ("0000:19:00.0", "0000:17:00.0", "0000:15:01.0", "0000:00:00.0"):
        assert address not in found
    assert "0000:00:06.1" not in found


def test_path_runs_device_first_root_port_last(board):
    path = by_address(board)["0000:18:00.0"]
    assert addresses(path.bridges) == ["0000:17:00.0", "0000:16:00.0", "0000:15:01.0"]
    assert {link.role for link in path.bridges} == {"bridge"}


def test_healthy_link_values(board):
    device = by_address(board)["0000:18:00.0"].device
    assert device == PcieLink(
        address="0000:18:00.0",
        role="gpu",
        current_speed_gts=32.0,
        max_speed_gts=32.0,
        current_width=16,
        max_width=16,
        aer_correctable=1,
        aer_nonfatal=0,
        aer_fatal=0,
    )


def test_a_link_trained_narrow_and_slow_is_seen_from_both_ends(board):
    path = by_address(board)["0000:1a:00.0"]
    port = path.bridges[0]
    for link in (path.device, port):
        assert (link.current_width, link.max_width) == (8, 16)
        assert speed_to_generation(link.current_speed_gts or 0) == 4
        assert speed_to_generation(link.max_speed_gts or 0) == 5
    assert (port.address, port.aer_correctable) == ("0000:17:02.0", 20)
    assert path.device.aer_correctable == 7


def test_a_gpu_off_the_bus_is_still_found_with_its_bridge_side(board):
    path = by_address(board)["0000:ba:00.0"]
    device, port = path.device, path.bridges[0]
    assert (device.current_speed_gts, device.max_speed_gts) == (None, None)
    assert (device.current_width, device.max_width) == (None, None)
    # The switch port still reports: link down, and the errors that took it down.
    assert port.address == "0000:b9:00.0"
    assert (port.current_speed_gts, port.max_speed_gts) == (2.5, 32.0)
    assert (port.current_width, port.max_width) == (None, 16)
    assert (port.aer_correctable, port.aer_nonfatal, port.aer_fatal) == (0, 2, 1)


def test_nvswitch_path(board):
    path = by_address(board)["0000:bb:00.0"]
    assert path.device.role == "nvswitch"
    assert (path.device.current_speed_gts, path.device.current_width) == (16.0, 2)
    assert addresses(path.bridges) == ["0000:b9:01.0", "0000:b8:00.0", "0000:b7:01.0"]


def test_a_function_without_pcie_capability_has_no_values_and_no_bridges(board):
    path = by_address(board)["0000:00:05.0"]
    assert path.bridges == ()
    assert path.device == PcieLink(address="0000:00:05.0", role="gpu")


def test_bridges_shared_by_two_gpus_read_the_same(board):
    found = by_address(board)
    ok, narrow = found["0000:18:00.0"].bridges, found["0000:1a:00.0"].bridges
    assert ok[1:] == narrow[1:]
    assert addresses(ok[1:]) == ["0000:16:00.0", "0000:15:01.0"]


# --- attribute parsing ----------------------------------------------------------------


SINGLE_GPU = "pci0000:00/0000:00:01.0/0000:01:00.0"


def single_gpu(root: Path, **files: str) -> PcieLink:
    add_function(root, SINGLE_GPU, NVIDIA, GPU_3D, **files)
    (path,) = read_pcie_paths(root)
    return path.device


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2.5 GT/s PCIe\n", 2.5),
        ("5.0 GT/s PCIe\n", 5.0),
        ("8.0 GT/s PCIe\n", 8.0),
        ("16.0 GT/s PCIe\n", 16.0),
        ("32.0 GT/s PCIe\n", 32.0),
        ("64.0 GT/s PCIe\n", 64.0),
        ("8 GT/s\n", 8.0),  # older kernels
        ("Unknown\n", None),
        ("", None),
        ("fast\n", None),
    ],
)
def test_link_speed(tmp_path, text, expected):
    assert single_gpu(tmp_path, current_link_speed=text).current_speed_gts == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("16\n", 16),
        ("8\n", 8),
        ("1\n", 1),
        ("0\n", None),  # a port whose link is down
        ("255\n", None),
        ("63\n", None),  # all ones: a function that fell off the bus
        ("x16\n", None),
        ("", None),
        ("-4\n", None),
    ],
)
def test_link_width(tmp_path, text, expected):
    assert single_gpu(tmp_path, max_link_width=text).max_width == expected


def test_aer_totals_are_read_from_the_total_line(tmp_path):
    files = Aer(correctable={"RxErr": 3}, nonfatal={"UnsupReq": 4}, fatal={"MalfTLP": 5}).files()
    device = single_gpu(tmp_path, **files)
    assert (device.aer_correctable, device.aer_nonfatal, device.aer_fatal) == (3, 4, 5)


def test_aer_file_without_its_total_line_is_none(tmp_path):
    truncated = "RxErr 3\nBadTLP 0\n"
    wrong_total = "RxErr 3\nTOTAL_ERR_FATAL 3\n"
    device = single_gpu(tmp_path, aer_dev_correctable=truncated, aer_dev_nonfatal=wrong_total)
    assert (device.aer_correctable, device.aer_nonfatal, device.aer_fatal) == (None, None, None)


def test_unreadable_attributes_are_none(tmp_path):
    directory = tmp_path / "devices" / SINGLE_GPU
    (directory / "current_link_speed").mkdir(parents=True)  # reading it fails with EISDIR
    (directory / "aer_dev_fatal").mkdir()
    device = single_gpu(tmp_path, max_link_speed="\xff\xfe GT/s\n")
    assert device.address == "0000:01:00.0"
    assert (device.current_speed_gts, device.max_speed_gts, device.aer_fatal) == (None,) * 3


# --- devices that vanish, and odd trees -----------------------------------------------


def test_a_dangling_entry_is_skipped(board):
    entry = board / "bus/pci/devices/0000:00:09.0"
    entry.symlink_to("../../../devices/pci0000:00/0000:00:09.0")
    assert "0000:00:09.0" not in by_address(board)


def test_a_function_without_vendor_or_class_is_skipped(board):
    (board / "devices" / GPU_OK / "class").unlink()
    (board / "devices" / GPU_NARROW / "vendor").write_text("garbage\n")
    found = by_address(board)
    assert "0000:18:00.0" not in found
    assert "0000:1a:00.0" not in found
    assert "0000:ba:00.0" in found


def test_a_device_removed_while_it_is_read_is_skipped(board, monkeypatch):
    read_link = pcie._read_link

    def vanishing(directory: Path, address: str, role: str) -> PcieLink:
        if address == "0000:18:00.0":
            shutil.rmtree(directory)
        return read_link(directory, address, role)  # type: ignore[arg-type]

    monkeypatch.setattr(pcie, "_read_link", vanishing)
    found = by_address(board)
    assert "0000:18:00.0" not in found
    assert "0000:1a:00.0" in found


def test_entries_that_are_not_bus_ids_are_ignored(board):
    (board / "bus/pci/devices/README").write_text("not a device\n")
    assert len(read_pcie_paths(board)) == 6


def test_a_root_without_pci_devices_raises(tmp_path):
    with pytest.raises(FileNotFoundError, match="bus/pci/devices"):
        read_pcie_paths(tmp_path)


def test_a_bus_without_nvidia_devices_is_empty(tmp_path):
    add_function(tmp_path, NIC_PATH, MELLANOX, NIC, Link())
    assert read_pcie_paths(tmp_path) == ()


def test_this_machines_sysfs_reads_without_error():
    root = Path("/sys")
    require_that((root / "bus/pci/devices").is_dir(), "a PCI bus in /sys")
    for path in read_pcie_paths(root):
        for link in (path.device, *path.bridges):
            assert canonical_bus_id(link.address) == link.address


# --- helpers --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gts", "generation"),
    [
        (2.5, 1),
        (5.0, 2),
        (8.0, 3),
        (16.0, 4),
        (32.0, 5),
        (64.0, 6),
        (5, 2),
        (0.0, None),
        (20.0, None),
        (128.0, None),
    ],
)
def test_speed_to_generation(gts, generation):
    assert speed_to_generation(gts) == generation


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("0000:3b:00.0", "0000:3b:00.0"),
        ("0000:3B:00.0", "0000:3b:00.0"),
        ("10000:e1:00.0", "10000:e1:00.0"),  # VMD domains have five digits
        ("pci0000:00", None),
        ("0000:3b:00", None),
        ("0000:3b:00.8", None),
    ],
)
def test_canonical_bus_id(name, expected):
    assert canonical_bus_id(name) == expected
