"""The simulated node's RDMA devices: the `ib_*` node keys and fault kinds."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuagent.config import ConfigError
from gpuagent.sim import SimulatedNode, load_scenario, parse_scenario
from gpuagent.sources.infiniband import read_infiniband

HGX = '[node]\ngpus = 8\nmodel = "h100-sxm"\n'


def make(text: str) -> SimulatedNode:
    return SimulatedNode(parse_scenario(text))


def ports(node: SimulatedNode) -> dict[str, tuple[str, str, float | None, str]]:
    return {
        p.key: (p.state, p.phys_state, p.rate_gbps, p.link_layer)
        for d in node.infiniband()
        for p in d.ports
    }


def test_no_hcas_by_default() -> None:
    assert make(HGX).infiniband() == ()


def test_one_active_hca_per_gpu_rail() -> None:
    node = make(HGX + "ib_hcas = 8\n")
    devices = node.infiniband()
    assert [d.name for d in devices] == [f"mlx5_{i}" for i in range(8)]
    assert {d.hca_type for d in devices} == {"MT4129"}
    assert set(ports(node).values()) == {("ACTIVE", "LinkUp", 400.0, "InfiniBand")}
    assert all(p.active for d in devices for p in d.ports)
    counters = dict(devices[0].ports[0].counters)
    assert counters["symbol_error"] == counters["link_downed"] == 0


def test_roce_at_another_rate() -> None:
    node = make(HGX + 'ib_hcas = 2\nib_rate_gbps = 200\nib_link_layer = "Ethernet"\n')
    assert set(ports(node).values()) == {("ACTIVE", "LinkUp", 200.0, "Ethernet")}


@pytest.mark.parametrize(
    ("state", "shown"),
    [
        ("down", ("DOWN", "Disabled")),
        ("polling", ("DOWN", "Polling")),
        ("init", ("INIT", "LinkUp")),
    ],
)
def test_port_down(state: str, shown: tuple[str, str]) -> None:
    node = make(HGX + "ib_hcas = 4\n")
    node.inject("ib_port_down", 2, {"state": state})
    found = ports(node)
    assert found["mlx5_2/1"][:2] == shown
    assert found["mlx5_1/1"][:2] == ("ACTIVE", "LinkUp")
    port = node.infiniband()[2].ports[0]
    assert not port.active
    assert port.counter("link_downed") == 1
    # A port whose link is down shows the lowest rate, as the kernel does.
    assert found["mlx5_2/1"][2] == (400.0 if state == "init" else 2.5)


def test_rate_errors_and_clear() -> None:
    node = make(HGX + "ib_hcas = 4\n")
    node.inject("ib_rate", 1, {"gbps": 200})
    node.inject("ib_errors", 3, {})
    node.inject("ib_errors", 3, {"counter": "port_rcv_errors", "count": 5})
    assert ports(node)["mlx5_1/1"][2] == 200.0
    port = node.infiniband()[3].ports[0]
    assert (port.counter("symbol_error"), port.counter("port_rcv_errors")) == (100, 5)
    node.inject("ib_port_down", 3, {})
    for gpu in (1, 3):
        node.inject("clear", gpu, {})
    assert set(ports(node).values()) == {("ACTIVE", "LinkUp", 400.0, "InfiniBand")}
    # Counters count since the driver loaded: a repair does not zero them.
    assert node.infiniband()[3].ports[0].counter("symbol_error") == 100


def test_scheduled_faults() -> None:
    node = make(HGX + 'ib_hcas = 4\n[[fault]]\ngpu = 0\nkind = "ib_port_down"\n')
    assert not node.infiniband()[0].ports[0].active


@pytest.mark.parametrize(
    ("text", "key", "message"),
    [
        (HGX + "ib_hcas = 9\n", "node.ib_hcas", "0..node.gpus"),
        (HGX + "ib_rate_gbps = 0\n", "node.ib_rate_gbps", "above 0"),
        (HGX + 'ib_link_layer = "Ethernt"\n', "node.ib_link_layer", ""),
        (
            HGX + 'ib_hcas = 2\n[[fault]]\ngpu = 2\nkind = "ib_rate"\ngbps = 100\n',
            "fault[0].gpu",
            "GPU 2 has no HCA",
        ),
        (HGX + '[[fault]]\ngpu = 0\nkind = "ib_port_down"\n', "fault[0].gpu", "no HCAs"),
        (
            HGX + 'ib_hcas = 2\n[[fault]]\ngpu = 0\nkind = "ib_port_down"\nstate = "up"\n',
            "fault[0].state",
            "",
        ),
        (
            HGX
            + 'ib_hcas = 2\n[[fault]]\ngpu = 0\nkind = "ib_errors"\ncounter = "port_xmit_data"\n',
            "fault[0].counter",
            "",
        ),
        (HGX + 'ib_hcas = 2\n[[fault]]\ngpu = 0\nkind = "ib_rate"\n', "fault[0].gbps", "required"),
    ],
)
def test_invalid_scenarios(text: str, key: str, message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_scenario(text)
    assert raised.value.key == key
    assert message in str(raised.value)


def test_inject_refuses_a_gpu_without_an_hca() -> None:
    node = make(HGX + "ib_hcas = 2\n")
    with pytest.raises(ValueError, match="GPU 5 has no HCA"):
        node.inject("ib_port_down", 5, {})
    with pytest.raises(ValueError, match="gbps"):
        node.inject("ib_rate", 0, {"gbps": 0})


def test_the_shipped_rdma_scenario_degrades_over_its_first_minute() -> None:
    clock = [0.0]
    scenario = load_scenario(Path(__file__).resolve().parents[1] / "scenarios" / "h100-rdma.toml")
    node = SimulatedNode(scenario, clock=lambda: clock[0])
    assert all(p.active and p.rate_gbps == 400.0 for d in node.infiniband() for p in d.ports)
    clock[0] = 60.0
    devices = node.infiniband()
    assert devices[1].ports[0].counter("symbol_error") == 500
    assert devices[4].ports[0].rate_gbps == 200.0
    assert not devices[6].ports[0].active


def test_the_served_sysfs_tree_reads_back_as_the_simulators_devices(tmp_path: Path) -> None:
    node = make(HGX + "ib_hcas = 4\n")
    node.serve_host_files(tmp_path)
    assert read_infiniband(tmp_path / "sys") == node.infiniband()
    # Faults rewrite the tree: what the daemon's sysfs reader sees next.
    node.inject("ib_port_down", 1, {"state": "polling"})
    node.inject("ib_rate", 2, {"gbps": 200})
    node.inject("ib_errors", 3, {"count": 7})
    port_dir = tmp_path / "sys" / "class" / "infiniband" / "mlx5_1" / "ports" / "1"
    assert (port_dir / "state").read_text() == "1: DOWN\n"
    assert (port_dir / "phys_state").read_text() == "2: Polling\n"
    assert (port_dir / "rate").read_text() == "2.5 Gb/sec (1X SDR)\n"
    assert read_infiniband(tmp_path / "sys") == node.infiniband()
    node.inject("clear", 1, {})
    assert read_infiniband(tmp_path / "sys") == node.infiniband()
