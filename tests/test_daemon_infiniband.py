"""Integration: RDMA port health end to end. The real daemon under the simulator: a fault
in an HCA's port, the `infiniband` finding, node_exporter's series, `gpuagent status`."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from conftest import DaemonProcess, deadline_in, parse_metrics, start_daemon

pytestmark = pytest.mark.integration

HGX = '[node]\ngpus = 4\nmodel = "NVIDIA H100 80GB HBM3"\nib_hcas = 4\n'
PEERMEM = 'modules = ["nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_peermem"]\n'
EXPECTED = (
    '[inventory.expected]\nhcas = ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]\n'
    "ib_rate_gbps = 400.0\ngpudirect = true\n"
    # A short window, so a link-down ages out within the test; long enough that a busy
    # machine still shows the WARN before it does.
    "[checks.infiniband]\nrate_window_seconds = 8.0\n"
)


def _infiniband(doc: dict[str, Any]) -> dict[str, Any] | None:
    return next((f for f in doc["node"]["findings"] if f["check"] == "infiniband"), None)


def _severity(doc: dict[str, Any]) -> str:
    # The status lists problems only: no infiniband entry means OK (or no finding at all,
    # which the metrics tell apart).
    finding = _infiniband(doc)
    return "OK" if finding is None else str(finding["severity"])


def _series(daemon: DaemonProcess, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {
        tuple(sorted(s.labels.items())): s.value
        for family in parse_metrics(daemon.metrics())
        for s in family.samples
        if s.name == name
    }


def _planned_cordons(daemon: DaemonProcess) -> list[str | None]:
    actions = daemon.call("actions", {"limit": 100})["actions"]
    return [a["check"] for a in actions if a["action"] == "cordon" and a["result"] == "planned"]


def _port(device: str) -> tuple[tuple[str, str], ...]:
    return (("device", device), ("port", "1"))


@pytest.fixture(scope="module")
def hgx(tmp_path_factory: pytest.TempPathFactory) -> Any:
    workdir = tmp_path_factory.mktemp("ib")
    textfile = f'[outputs.textfile]\ndir = "{workdir}"\nmin_interval_seconds = 0.1\n'
    # Observe mode (the default) plans and audits the cordon; the command never runs.
    cordon = '[remediation.cordon]\nbackends = ["command"]\ncommand = "/bin/false"\n'
    daemon = start_daemon(workdir, HGX + PEERMEM, config_extra=EXPECTED + textfile + cordon)
    yield daemon
    daemon.stop()


def test_faults_become_findings_metrics_and_status(hgx: DaemonProcess) -> None:
    daemon = hgx
    daemon.wait_for(lambda d: _severity(d) == "OK")
    # The ports come with the sysfs source's first read, which may follow the first OK.
    ports = {_port(f"mlx5_{i}"): 4.0 for i in range(4)}
    deadline = deadline_in(10)
    while _series(daemon, "node_infiniband_state_id") != ports and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _series(daemon, "node_infiniband_state_id") == ports
    assert _series(daemon, "node_infiniband_rate_bytes_per_second")[_port("mlx5_0")] == 5e10
    health = _series(daemon, "gpuagent_node_check_health")
    assert health[(("check", "infiniband"),)] == 0.0

    # A port goes down: CRITICAL, in the status, the metrics and the text view.
    daemon.inject("ib_port_down", 2, state="polling")
    # The port's state and physical state are two sysfs files: a read between the two
    # writes sees DOWN/LinkUp for a moment, as it may on a real port.
    doc = daemon.wait_for(
        lambda d: (
            _severity(d) == "CRITICAL" and "Polling" in (_infiniband(d) or {}).get("reason", "")
        )
    )
    finding = _infiniband(doc)
    assert finding is not None
    assert finding["runbook"] == "node-ib-port-down"
    assert "mlx5_2/1 DOWN/Polling" in finding["reason"]
    assert _series(daemon, "node_infiniband_state_id")[_port("mlx5_2")] == 1.0
    assert _series(daemon, "node_infiniband_physical_state_id")[_port("mlx5_2")] == 2.0
    assert _series(daemon, "gpuagent_node_check_health")[(("check", "infiniband"),)] == 2.0
    text = daemon.cli("status", "--socket", str(daemon.socket))
    assert "CRITICAL infiniband: RDMA port not ACTIVE/LinkUp: mlx5_2/1 DOWN/Polling" in text.stdout
    assert "RDMA: 3 of 4 ports active at 400 Gb/s; down: mlx5_2/1 DOWN/Polling" in text.stdout
    # The default rules take the node out of scheduling for it.
    daemon.wait_for(lambda _d: "infiniband" in _planned_cordons(daemon))
    # node_exporter's textfile gets the health but not the series its own collector has.
    written = (daemon.workdir / "gpuagent.prom").read_text()
    assert 'gpuagent_node_check_health{check="infiniband"}' in written
    assert "node_infiniband_" not in written

    # Repaired: the link-down it counted warns until it leaves the window, then OK.
    daemon.inject("clear", 2)
    doc = daemon.wait_for(lambda d: _severity(d) == "WARN")
    assert _infiniband(doc)["runbook"] == "node-ib-errors"  # type: ignore[index]
    assert "went down and retrained" in _infiniband(doc)["reason"]  # type: ignore[index]
    daemon.wait_for(lambda d: _severity(d) == "OK", timeout=30)

    # A link that trained slow.
    daemon.inject("ib_rate", 1, gbps=200)
    doc = daemon.wait_for(lambda d: _severity(d) == "WARN")
    assert _infiniband(doc)["runbook"] == "node-ib-rate"  # type: ignore[index]
    assert _series(daemon, "node_infiniband_rate_bytes_per_second")[_port("mlx5_1")] == 2.5e10
    assert _series(daemon, "gpuagent_node_check_health")[(("check", "infiniband"),)] == 1.0
    daemon.inject("clear", 1)
    daemon.wait_for(lambda d: _severity(d) == "OK")

    # Symbol errors on a port: WARN while they keep coming within the window.
    daemon.inject("ib_errors", 3, count=500)
    doc = daemon.wait_for(lambda d: _severity(d) == "WARN")
    assert _infiniband(doc)["runbook"] == "node-ib-errors"  # type: ignore[index]
    assert "mlx5_3/1 500 in" in _infiniband(doc)["reason"]  # type: ignore[index]
    assert _series(daemon, "node_infiniband_symbol_error_total")[_port("mlx5_3")] == 500.0
    daemon.wait_for(lambda d: _severity(d) == "OK", timeout=30)


def test_gpudirect_without_peermem_and_a_node_without_rdma(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path / "no-peermem", HGX, config_extra=EXPECTED)
    try:
        doc = daemon.wait_for(lambda d: _severity(d) == "WARN")
        assert _infiniband(doc)["runbook"] == "node-ib-peermem"  # type: ignore[index]
    finally:
        daemon.stop()
    # Most nodes have no RDMA and expect none: no finding and no series at all.
    plain = start_daemon(tmp_path / "plain", '[node]\ngpus = 2\nmodel = "h100-sxm"\n')
    try:
        plain.wait_for(lambda d: len(d["gpus"]) == 2)
        assert (("check", "nvml"),) in _series(plain, "gpuagent_node_check_health")
        assert (("check", "infiniband"),) not in _series(plain, "gpuagent_node_check_health")
        assert "node_infiniband" not in plain.metrics()
    finally:
        plain.stop()
