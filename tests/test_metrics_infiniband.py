"""RDMA port series from snapshot.infiniband: node_exporter's names, labels and units."""

from __future__ import annotations

import subprocess
from pathlib import Path

from prometheus_client import generate_latest

from conftest import require
from gpuagent.metrics import build_registry, names
from gpuagent.metrics.exposition import TextRenderer
from gpuagent.metrics.infiniband import without_node_exporter_families
from gpuagent.model import IbDevice, IbPort
from test_metrics_support import VERSION, exposition, families_by_name, samples, snapshot

NDR = IbPort(
    "mlx5_0",
    1,
    4,
    "ACTIVE",
    5,
    "LinkUp",
    400.0,
    "InfiniBand",
    counters=(
        ("link_downed", 1),
        ("port_rcv_data", 4_000),
        ("port_xmit_discards", 3),
        ("symbol_error", 7),
        ("unicast_xmit_packets", 12),
        ("a_counter_node_exporter_does_not_name", 5),
    ),
    hw_counters=(("local_ack_timeout_err", 2), ("out_of_buffer", 0)),
)
# A RoCE port that is down, whose state files could not be read.
UNREAD = IbPort("mlx5_1", 1, None, "", None, "", None, "Ethernet")
DEVICES = (
    IbDevice("mlx5_0", "MT4129", "MT_0000000838", "28.39.1002", "0000:1a:00.0", (NDR,)),
    IbDevice("mlx5_1", "MT4125", "MT_0000000359", "22.36.1010", "0000:3c:00.0", (UNREAD,)),
)


def ib_snapshot():  # type: ignore[no-untyped-def]
    return snapshot(gpus=(), findings=(), infiniband=DEVICES)


def _values(name: str) -> dict[tuple[str, ...], float]:
    found = samples(ib_snapshot()).get(name.removesuffix("_total"), [])
    return {
        tuple(v for k, v in sorted(s.labels.items())): s.value
        for s in found
        if s.name == name or not name.endswith("_total")
    }


def test_port_state_and_rate_under_node_exporter_names() -> None:
    assert _values("node_infiniband_state_id") == {("mlx5_0", "1"): 4.0}
    assert _values("node_infiniband_physical_state_id") == {("mlx5_0", "1"): 5.0}
    # 400 Gb/s in bytes per second, as node_exporter exports it.
    assert _values("node_infiniband_rate_bytes_per_second") == {("mlx5_0", "1"): 5e10}


def test_counters_are_counters_with_device_and_port() -> None:
    types = families_by_name(ib_snapshot())
    assert types["node_infiniband_link_downed"] == "counter"
    assert _values("node_infiniband_link_downed_total") == {("mlx5_0", "1"): 1.0}
    assert _values("node_infiniband_symbol_error_total") == {("mlx5_0", "1"): 7.0}
    assert _values("node_infiniband_port_discards_transmitted_total") == {("mlx5_0", "1"): 3.0}
    # Already in bytes in the model (the reader multiplies the 4-octet words).
    assert _values("node_infiniband_port_data_received_bytes_total") == {("mlx5_0", "1"): 4000.0}
    assert _values("node_infiniband_unicast_packets_transmitted_total") == {("mlx5_0", "1"): 12.0}


def test_hw_counters_by_counter_label() -> None:
    assert _values("gpuagent_infiniband_hw_events_total") == {
        ("local_ack_timeout_err", "mlx5_0", "1"): 2.0,
        ("out_of_buffer", "mlx5_0", "1"): 0.0,
    }


def test_info_carries_the_identity() -> None:
    assert _values("node_infiniband_info") == {
        ("MT_0000000838", "mlx5_0", "28.39.1002", "MT4129"): 1.0,
        ("MT_0000000359", "mlx5_1", "22.36.1010", "MT4125"): 1.0,
    }


def test_unknown_values_are_absent_not_zero() -> None:
    found = samples(ib_snapshot())
    for family in found.values():
        for sample in family:
            if sample.name != "node_infiniband_info":
                assert sample.labels.get("device") != "mlx5_1", sample


def test_no_rdma_no_families() -> None:
    for devices in (None, ()):
        found = samples(snapshot(infiniband=devices))
        assert not [n for n in found if "infiniband" in n]


def test_every_infiniband_family_is_in_the_docs() -> None:
    docs = (Path(__file__).resolve().parents[1] / "docs" / "metrics.md").read_text()
    specs = [
        names.IB_INFO,
        names.IB_STATE,
        names.IB_PHYSICAL_STATE,
        names.IB_RATE,
        names.IB_HW_COUNTERS,
        *(spec for _file, spec in names.IB_PORT_COUNTERS),
    ]
    for spec in specs:
        assert f"| `{spec.name}` |" in docs, spec.name
        assert spec.help in docs, spec.name
    served = {s.name for found in samples(ib_snapshot()).values() for s in found}
    assert {n for n in served if "infiniband" in n} <= {s.name for s in specs}


def test_the_fast_renderer_matches_prometheus_client() -> None:
    taken = ib_snapshot()  # one snapshot: the process metrics are sampled once with it
    registry = build_registry(lambda: taken, VERSION)
    assert TextRenderer().render(registry.collect()) == generate_latest(registry)


def test_promtool_accepts_the_infiniband_series() -> None:
    promtool = require("promtool", "checking the exposition (Debian package prometheus)")
    result = subprocess.run(
        [promtool, "check", "metrics"],
        input=exposition(ib_snapshot()),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


def test_the_textfile_leaves_node_exporters_own_families_out() -> None:
    body = exposition(ib_snapshot()).encode()
    kept = without_node_exporter_families(body).decode()
    assert "node_infiniband_" in body.decode()
    assert "node_infiniband_" not in kept
    # Everything else stays, byte for byte: gpuagent's own RDMA series and the rest.
    assert "gpuagent_infiniband_hw_events_total{" in kept
    assert "gpuagent_build_info" in kept
    others = [line for line in body.decode().splitlines() if "node_infiniband_" not in line]
    assert kept.splitlines() == others
    plain = exposition(snapshot()).encode()
    assert without_node_exporter_families(plain) is plain
