"""The simulated node's RDMA devices: one single-port ConnectX-7 per GPU rail.

As on a rail-optimized HGX node, HCA ``mlx5_<i>`` sits beside GPU ``i`` (the scenario's
`ib_hcas` gives how many GPUs have one), so the `ib_*` faults name the GPU whose HCA they
hit. `write_sysfs` lays them out as /sys/class/infiniband does, and a simulated daemon
reads that tree with the reader it uses on a real node.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from gpuagent.model import IbDevice, IbPort
from gpuagent.sim.files import replace_text
from gpuagent.sources.infiniband import WORD_COUNTERS

LinkLayer = Literal["InfiniBand", "Ethernet"]

ACTIVE = (4, "ACTIVE")
LINK_UP = (5, "LinkUp")
# `ib_port_down` states: (state, phys_state) as the kernel writes them.
DOWN_STATES: dict[str, tuple[tuple[int, str], tuple[int, str]]] = {
    "down": ((1, "DOWN"), (3, "Disabled")),
    "polling": ((1, "DOWN"), (2, "Polling")),
    "init": ((2, "INIT"), (5, "LinkUp")),  # link trained, no subnet manager configured it
}
# The counters the simulated ports have, and those `ib_errors` may raise.
ERROR_COUNTERS = (
    "symbol_error",
    "link_error_recovery",
    "link_downed",
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
)
_OTHER_COUNTERS = ("port_xmit_discards", "port_xmit_data", "port_rcv_data", "VL15_dropped")
_HW_COUNTERS = ("out_of_buffer", "rnr_nak_retry_err", "local_ack_timeout_err")
_HCA_TYPE = "MT4129"  # ConnectX-7
_BOARD_ID = "MT_0000000838"
_FIRMWARE = "28.39.1002"


class SimHca:
    """The port state of one GPU's HCA; faults change it, `clear` restores the link."""

    def __init__(self) -> None:
        self.state = ACTIVE
        self.phys_state = LINK_UP
        self.rate_gbps: float | None = None  # None: the node's rate
        self.counters = dict.fromkeys((*ERROR_COUNTERS, *_OTHER_COUNTERS), 0)

    def port_down(self, how: str) -> None:
        self.state, self.phys_state = DOWN_STATES[how]
        # The port counts the link going down, as the real counter does.
        self.counters["link_downed"] += 1

    def clear(self) -> None:
        """The link back up at the node's rate; counters (since driver load) are kept."""
        self.state, self.phys_state = ACTIVE, LINK_UP
        self.rate_gbps = None


def hca_name(index: int) -> str:
    return f"mlx5_{index}"


def device(index: int, hca: SimHca, rate_gbps: float, link_layer: LinkLayer) -> IbDevice:
    """What sysfs would show for GPU ``index``'s HCA."""
    trained = hca.phys_state == LINK_UP
    port = IbPort(
        device=hca_name(index),
        port=1,
        state_id=hca.state[0],
        state=hca.state[1],
        phys_state_id=hca.phys_state[0],
        phys_state=hca.phys_state[1],
        # A port without a link reports the lowest rate (the kernel's "2.5 Gb/sec (1X SDR)").
        rate_gbps=(hca.rate_gbps or rate_gbps) if trained else 2.5,
        link_layer=link_layer,
        counters=tuple(sorted(hca.counters.items())),
        hw_counters=tuple((name, 0) for name in sorted(_HW_COUNTERS)),
    )
    return IbDevice(
        name=hca_name(index),
        hca_type=_HCA_TYPE,
        board_id=_BOARD_ID,
        firmware_version=_FIRMWARE,
        ports=(port,),
    )


# The speed names the kernel prints after a 4X link's rate (a link down prints 1X SDR).
_SPEEDS = {100.0: "4X EDR", 200.0: "4X HDR", 400.0: "4X NDR", 800.0: "4X XDR"}


def write_sysfs(sys_root: Path, devices: Iterable[IbDevice]) -> None:
    """Make ``sys_root``/class/infiniband show exactly ``devices``, as mlx5 lays it out."""
    class_dir = sys_root / "class" / "infiniband"
    class_dir.mkdir(parents=True, exist_ok=True)
    wanted = {d.name: d for d in devices}
    for entry in class_dir.iterdir():
        if entry.name not in wanted:
            shutil.rmtree(entry, ignore_errors=True)
    for name, dev in wanted.items():
        entry = class_dir / name
        for file, text in (
            ("hca_type", dev.hca_type),
            ("board_id", dev.board_id),
            ("fw_ver", dev.firmware_version),
        ):
            entry.mkdir(exist_ok=True)
            replace_text(entry / file, f"{text}\n")
        for port in dev.ports:
            _write_port(entry / "ports" / str(port.port), port)


def _write_port(directory: Path, port: IbPort) -> None:
    for sub in ("counters", "hw_counters"):
        (directory / sub).mkdir(parents=True, exist_ok=True)
    rate = port.rate_gbps or 0.0
    speed = "1X SDR" if rate <= 2.5 else _SPEEDS.get(rate, "4X")
    for file, text in (
        ("state", f"{port.state_id}: {port.state}"),
        ("phys_state", f"{port.phys_state_id}: {port.phys_state}"),
        ("rate", f"{rate:g} Gb/sec ({speed})"),
        ("link_layer", port.link_layer),
    ):
        replace_text(directory / file, f"{text}\n")
    for name, value in port.counters:
        # sysfs keeps these in 4-octet words; IbPort holds bytes.
        words = value // 4 if name in WORD_COUNTERS else value
        replace_text(directory / "counters" / name, f"{words}\n")
    for name, value in port.hw_counters:
        replace_text(directory / "hw_counters" / name, f"{value}\n")
