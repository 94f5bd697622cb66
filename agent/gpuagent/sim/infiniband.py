"""The simulated node's RDMA devices: one single-port ConnectX-7 per GPU rail.

As on a rail-optimized HGX node, HCA ``mlx5_<i>`` sits beside GPU ``i`` (the scenario's
`ib_hcas` gives how many GPUs have one), so the `ib_*` faults name the GPU whose HCA they
hit. A simulated daemon takes these devices instead of reading the host's sysfs.
"""

from __future__ import annotations

from typing import Literal

from gpuagent.model import IbDevice, IbPort

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
        hw_counters=tuple((name, 0) for name in _HW_COUNTERS),
    )
    return IbDevice(
        name=hca_name(index),
        hca_type=_HCA_TYPE,
        board_id=_BOARD_ID,
        firmware_version=_FIRMWARE,
        ports=(port,),
    )
