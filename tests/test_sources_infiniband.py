"""RDMA devices and ports read from a sysfs tree laid out as mlx5 lays it out."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuagent.sources.infiniband import parse_rate, parse_state, read_infiniband

# A ConnectX-7 port's counters/ and hw_counters/ as the kernel shows them (values made up).
IB_COUNTERS = {
    "VL15_dropped": "0",
    "excessive_buffer_overrun_errors": "0",
    "link_downed": "1",
    "link_error_recovery": "0",
    "local_link_integrity_errors": "0",
    "multicast_rcv_packets": "118",
    "multicast_xmit_packets": "0",
    "port_rcv_constraint_errors": "0",
    "port_rcv_data": "1234567890",
    "port_rcv_errors": "0",
    "port_rcv_packets": "98765432",
    "port_rcv_remote_physical_errors": "0",
    "port_rcv_switch_relay_errors": "0",
    "port_xmit_constraint_errors": "0",
    "port_xmit_data": "2345678901",
    "port_xmit_discards": "3",
    "port_xmit_packets": "87654321",
    "port_xmit_wait": "4231",
    "symbol_error": "0",
    "unicast_rcv_packets": "98765314",
    "unicast_xmit_packets": "87654321",
}
HW_COUNTERS = {
    "duplicate_request": "0",
    "implied_nak_seq_err": "0",
    "lifespan": "10",
    "local_ack_timeout_err": "2",
    "np_cnp_sent": "0",
    "out_of_buffer": "0",
    "out_of_sequence": "0",
    "packet_seq_err": "0",
    "req_cqe_error": "0",
    "resp_cqe_error": "0",
    "rnr_nak_retry_err": "0",
    "rx_icrc_encapsulated": "0",
}


def mlx5_device(
    sys_root: Path,
    name: str,
    address: str,
    *,
    hca_type: str,
    state: str = "4: ACTIVE",
    phys_state: str = "5: LinkUp",
    rate: str = "400 Gb/sec (4X NDR)",
    link_layer: str = "InfiniBand",
    ports: int = 1,
) -> Path:
    """/sys/devices/pci.../<address>/infiniband/<name>, linked from /sys/class/infiniband
    (as the kernel links it); returns the device directory."""
    pci = sys_root / "devices/pci0000:00/0000:00:01.0" / address
    device = pci / "infiniband" / name
    device.mkdir(parents=True)
    for file, text in {
        "hca_type": hca_type,
        "board_id": "MT_0000000838",
        "fw_ver": "28.39.1002",
        "node_type": "1: CA",
        "node_guid": "a088:c203:0045:7a10",
    }.items():
        (device / file).write_text(text + "\n")
    (device / "device").symlink_to(pci)
    for number in range(1, ports + 1):
        port = device / "ports" / str(number)
        (port / "counters").mkdir(parents=True)
        (port / "hw_counters").mkdir()
        (port / "gid_attrs").mkdir()  # and more directories sysfs has, never read
        for file, text in {
            "state": state,
            "phys_state": phys_state,
            "rate": rate,
            "link_layer": link_layer,
            "lid": "0x1a",
            "cap_mask": "0xa751e84a",
        }.items():
            (port / file).write_text(text + "\n")
        for counter, value in IB_COUNTERS.items():
            (port / "counters" / counter).write_text(value + "\n")
        for counter, value in HW_COUNTERS.items():
            (port / "hw_counters" / counter).write_text(value + "\n")
    (sys_root / "class/infiniband").mkdir(parents=True, exist_ok=True)
    (sys_root / "class/infiniband" / name).symlink_to(device)
    return device


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("4: ACTIVE\n", (4, "ACTIVE")),
        ("1: DOWN", (1, "DOWN")),
        ("2: INIT", (2, "INIT")),
        ("3: ARMED", (3, "ARMED")),
        ("5: ACTIVE_DEFER", (5, "ACTIVE_DEFER")),
        ("5: LinkUp", (5, "LinkUp")),
        ("2: Polling", (2, "Polling")),
        ("3: Disabled", (3, "Disabled")),
        ("4: PortConfigurationTraining", (4, "PortConfigurationTraining")),
        ("6: LinkErrorRecovery", (6, "LinkErrorRecovery")),
        ("7: Phy Test", (7, "Phy Test")),
        ("1: DOWN ", (1, "DOWN")),
        ("", (None, "")),
        (None, (None, "")),
        ("ACTIVE", (None, "")),
        ("5 LinkUp", (None, "")),
    ],
)
def test_state_values(text: str | None, parsed: tuple[int | None, str]) -> None:
    assert parse_state(text) == parsed


@pytest.mark.parametrize(
    ("text", "gbps"),
    [
        ("400 Gb/sec (4X NDR)\n", 400.0),
        ("200 Gb/sec (4X HDR)", 200.0),
        ("100 Gb/sec (4X EDR)", 100.0),
        ("56 Gb/sec (4X FDR)", 56.0),
        ("2.5 Gb/sec (1X SDR)", 2.5),
        ("25 Gb/sec (1X EDR)", 25.0),
        ("800 Gb/sec (4X XDR)", 800.0),
        ("", None),
        (None, None),
        ("Unknown", None),
    ],
)
def test_rate_values(text: str | None, gbps: float | None) -> None:
    assert parse_rate(text) == gbps


def test_ports_states_rates_and_counters(tmp_path: Path) -> None:
    mlx5_device(tmp_path, "mlx5_0", "0000:1a:00.0", hca_type="MT4129")
    mlx5_device(
        tmp_path,
        "mlx5_1",
        "0000:3c:00.0",
        hca_type="MT4125",
        rate="100 Gb/sec (4X EDR)",
        link_layer="Ethernet",
        state="1: DOWN",
        phys_state="3: Disabled",
    )
    devices = read_infiniband(tmp_path)
    assert devices is not None
    ib, roce = devices
    assert (ib.name, ib.hca_type, ib.board_id, ib.firmware_version, ib.pci_address) == (
        "mlx5_0",
        "MT4129",
        "MT_0000000838",
        "28.39.1002",
        "0000:1a:00.0",
    )
    (port,) = ib.ports
    assert (port.key, port.state_id, port.state, port.phys_state_id, port.phys_state) == (
        "mlx5_0/1",
        4,
        "ACTIVE",
        5,
        "LinkUp",
    )
    assert port.active
    assert (port.rate_gbps, port.link_layer) == (400.0, "InfiniBand")
    assert port.counter("link_downed") == 1
    assert port.counter("port_xmit_discards") == 3
    assert port.counter("VL15_dropped") == 0
    # The data counters count 4-octet words; they come out in bytes.
    assert port.counter("port_xmit_data") == 2345678901 * 4
    assert port.counter("port_rcv_data") == 1234567890 * 4
    assert port.counter("port_rcv_packets") == 98765432
    hw = dict(port.hw_counters)
    assert hw["local_ack_timeout_err"] == 2
    assert "lifespan" not in hw
    assert len(hw) == len(HW_COUNTERS) - 1
    (down,) = roce.ports
    assert (down.state, down.phys_state, down.link_layer, down.rate_gbps) == (
        "DOWN",
        "Disabled",
        "Ethernet",
        100.0,
    )
    assert not down.active


def test_ports_in_number_order_and_odd_entries_skipped(tmp_path: Path) -> None:
    device = mlx5_device(tmp_path, "mlx5_0", "0000:1a:00.0", hca_type="MT4123", ports=2)
    (device / "ports/10").mkdir()  # numeric order, not name order
    (device / "ports/stray").mkdir()
    devices = read_infiniband(tmp_path)
    assert devices is not None
    assert [p.port for p in devices[0].ports] == [1, 2, 10]
    # A port with none of its files: unknown everything, not zero and not active.
    empty = devices[0].ports[2]
    assert (empty.state_id, empty.rate_gbps, empty.counters, empty.active) == (
        None,
        None,
        (),
        False,
    )


def test_a_software_device_has_no_pci_function(tmp_path: Path) -> None:
    # Soft-RoCE (rxe) devices have no `device` link and no hca_type.
    device = tmp_path / "devices/virtual/infiniband/rxe0"
    (device / "ports/1").mkdir(parents=True)
    (device / "ports/1/state").write_text("4: ACTIVE\n")
    (device / "ports/1/phys_state").write_text("5: LinkUp\n")
    (device / "ports/1/link_layer").write_text("Ethernet\n")
    (tmp_path / "class/infiniband").mkdir(parents=True)
    (tmp_path / "class/infiniband/rxe0").symlink_to(device)
    devices = read_infiniband(tmp_path)
    assert devices is not None
    (rxe,) = devices
    assert (rxe.pci_address, rxe.hca_type, rxe.ports[0].active) == (None, "", True)


def test_no_rdma_driver_means_no_devices(tmp_path: Path) -> None:
    assert read_infiniband(tmp_path) == ()
    (tmp_path / "class/infiniband").mkdir(parents=True)
    assert read_infiniband(tmp_path) == ()


def test_a_class_directory_that_cannot_be_listed_is_unknown(tmp_path: Path) -> None:
    # A file where the directory should be: listing it fails, which is not "no devices".
    (tmp_path / "class").mkdir()
    (tmp_path / "class/infiniband").write_text("")
    assert read_infiniband(tmp_path) is None


@pytest.mark.parametrize(
    ("file", "text"),
    [("state", "garbage"), ("rate", ""), ("phys_state", "5 LinkUp")],
)
def test_unreadable_values_are_unknown_not_zero(tmp_path: Path, file: str, text: str) -> None:
    mlx5_device(tmp_path, "mlx5_0", "0000:1a:00.0", hca_type="MT4129")
    port_dir = tmp_path / "class/infiniband/mlx5_0/ports/1"
    (port_dir / file).write_text(text)
    (port_dir / "counters/symbol_error").write_text("n/a\n")
    (port_dir / "counters/link_downed").unlink()
    devices = read_infiniband(tmp_path)
    assert devices is not None
    (port,) = devices[0].ports
    assert port.active is (file == "rate")  # an unknown state is not active
    assert port.counter("symbol_error") is None
    assert port.counter("link_downed") is None
    known = {"state": port.state_id, "rate": port.rate_gbps, "phys_state": port.phys_state_id}
    assert known[file] is None
