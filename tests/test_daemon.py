"""Integration: the real daemon on simulated nodes, driven through its API, CLI and /metrics."""

from __future__ import annotations

import itertools
import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from conftest import PATIENCE, DaemonProcess, deadline_in, parse_metrics, run_cli, start_daemon

pytestmark = pytest.mark.integration

H100 = '[node]\ngpus = {gpus}\nmodel = "NVIDIA H100 80GB HBM3"\n'
Run = Callable[..., DaemonProcess]


def _gpu(doc: dict[str, Any], index: int) -> dict[str, Any]:
    return next(g for g in doc["gpus"] if g["index"] == index)


def _severity(doc: dict[str, Any], index: int, check: str) -> str:
    findings = _gpu(doc, index)["findings"]
    return next((f["severity"] for f in findings if f["check"] == check), "OK")


def _samples(text: str, name: str) -> list[Any]:
    return [s for fam in parse_metrics(text) for s in fam.samples if s.name == name]


def test_healthy_node_ready_status_metrics_and_clean_stop(run_daemon: Run) -> None:
    daemon = run_daemon(H100.format(gpus=8))
    ready = next(n for n in daemon.notifications if "READY=1" in n)
    assert "STATUS=8 GPUs, health OK" in ready

    result = daemon.cli("status", "--socket", str(daemon.socket), "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["node"]["name"] == "test-node"
    assert doc["node"]["health"] == "OK"
    assert [g["index"] for g in doc["gpus"]] == list(range(8))
    first = doc["gpus"][0]
    assert first["pci_bus_id"] == "0000:18:00.0"
    assert first["uuid"].startswith("GPU-")
    assert first["model"] == "NVIDIA H100 80GB HBM3"
    assert first["health"] == "OK"
    assert first["findings"] == []

    table = daemon.cli("status", "--config", str(daemon.config))
    assert table.returncode == 0, table.stderr
    assert "0000:18:00.0" in table.stdout
    assert "H100 80GB HBM3" in table.stdout

    metrics = daemon.metrics()
    temps = _samples(metrics, "DCGM_FI_DEV_GPU_TEMP")
    assert len(temps) == 8
    assert temps[0].labels["Hostname"] == socket.gethostname()
    assert temps[0].labels["pci_bus_id"] == "00000000:18:00.0"
    assert {s.value for s in _samples(metrics, "gpuagent_gpu_up")} == {1.0}
    assert _samples(metrics, "gpuagent_gpu_module_power_watts") == []  # Grace-Blackwell only
    with urllib.request.urlopen(f"http://127.0.0.1:{daemon.port}/", timeout=5) as r:
        assert b'href="metrics"' in r.read()
    # The probes a kubelet asks: alive (the loop turns, snapshots come) and ready.
    for probe in ("healthz", "readyz"):
        with urllib.request.urlopen(f"http://127.0.0.1:{daemon.port}/{probe}", timeout=5) as r:
            assert (r.status, r.read()) == (200, b"ok\n")

    # The watchdog is pinged from the event loop.
    notes = daemon.read_notifications(1.5)
    assert any("WATCHDOG=1" in n for n in notes)

    started = time.monotonic()
    assert daemon.stop() == 0
    assert time.monotonic() - started < 5
    assert not daemon.socket.exists()


def test_an_nvlink_ber_above_the_limit_is_found_and_exported_per_link(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path, H100.format(gpus=2))
    try:
        daemon.inject("nvlink_ber", 1, link=5, effective_ber=2e-11)
        doc = daemon.wait_for(lambda d: _severity(d, 1, "nvlink") == "WARN")
        finding = next(f for f in _gpu(doc, 1)["findings"] if f["check"] == "nvlink")
        assert finding["reason"] == "NVLink 5 effective bit-error rate 2e-11, above 1e-12"
        assert finding["runbook"] == "gpu-nvlink-ber"
        bers = {
            (s.labels["gpu"], s.labels["link"]): s.value
            for s in _samples(daemon.metrics(), "gpuagent_gpu_nvlink_effective_ber")
        }
        assert bers[("1", "5")] == pytest.approx(2e-11)
        assert bers[("1", "4")] == 0.0
        assert bers[("0", "5")] == 0.0
    finally:
        daemon.stop()


def test_a_healthy_gb200_is_ok_and_c2c_errors_are_found(tmp_path: Path) -> None:
    daemon = start_daemon(
        tmp_path,
        '[node]\ngpus = 4\nmodel = "gb200"\nimex = "active"\n',
        config_extra="[inventory]\nservices_probe_seconds = 0.2\n",
    )
    try:
        doc = daemon.wait_for(
            lambda d: (
                all(_gpu(d, i)["health"] == "OK" for i in range(4))
                and d["node"]["inventory"] is not None
            )
        )
        assert doc["node"]["health"] == "OK"
        metrics = daemon.metrics()
        assert _samples(metrics, "gpuagent_imex_ready")[0].value == 1.0
        # Each GPU's module (its share of the Grace CPU, memory, C2C) beside the GPU.
        modules = {
            s.labels["gpu"]: s.value for s in _samples(metrics, "gpuagent_gpu_module_power_watts")
        }
        powers = {s.labels["gpu"]: s.value for s in _samples(metrics, "DCGM_FI_DEV_POWER_USAGE")}
        assert sorted(modules) == ["0", "1", "2", "3"]
        assert all(250 < modules[g] - powers[g] < 340 for g in modules), (modules, powers)
        limits = _samples(metrics, "gpuagent_gpu_module_power_limit_watts")
        assert {s.value for s in limits} == {2500.0}
        # The IMEX daemon runs but says it is not ready: one node finding, once three
        # probes in a row heard it.
        daemon.inject("fabric_manager", 0, state="not_ready", service="nvidia-imex")
        doc = daemon.wait_for(lambda d: d["node"]["health"] == "CRITICAL")
        assert [(f["check"], f["runbook"]) for f in doc["node"]["findings"]] == [
            ("fabric", "node-imex-not-ready")
        ]
        assert "3 probes in a row" in doc["node"]["findings"][0]["reason"]
        assert _samples(daemon.metrics(), "gpuagent_imex_ready")[0].value == 0.0
        daemon.inject("clear", 0)
        daemon.wait_for(lambda d: d["node"]["health"] == "OK")
        daemon.inject("c2c_errors", 2, count=5)
        doc = daemon.wait_for(lambda d: _severity(d, 2, "nvlink") == "WARN")
        finding = next(f for f in _gpu(doc, 2)["findings"] if f["check"] == "nvlink")
        assert finding["runbook"] == "gpu-c2c-errors"
        assert _gpu(doc, 3)["health"] == "OK"
        errors = {
            (s.labels["gpu"], s.labels["counter"]): s.value
            for s in _samples(daemon.metrics(), "gpuagent_gpu_c2c_errors_total")
        }
        assert errors[("2", "crc")] == 5.0
        assert errors[("3", "crc")] == 0.0
    finally:
        daemon.stop()


B200_NODE = (
    '[node]\ngpus = 8\nmodel = "b200"\ndriver_version = "615.10.01"\n'
    'fabric_state = "completed"\nfabricmanager = "active"\n'
)


def _problems(doc: dict[str, Any]) -> list[tuple[int | None, str, str, str]]:
    """(GPU index or None, check, severity, runbook) of every finding that is not OK."""
    found = [(None, f["check"], f["severity"], f["runbook"]) for f in doc["node"]["findings"]]
    for gpu in doc["gpus"]:
        found += [
            (gpu["index"], f["check"], f["severity"], f["runbook"])
            for f in gpu["findings"]
            if f["severity"] != "OK"
        ]
    return found


def test_a_simulated_b200_gives_one_finding_per_fabric_fault(tmp_path: Path) -> None:
    daemon = start_daemon(
        tmp_path,
        B200_NODE,
        config_extra="[sources.nvml_events]\noperational = true\n"
        "[inventory]\nservices_probe_seconds = 0.2\n",
    )
    try:
        # Healthy first: persistence mode off on every GPU is a setting, not a fault.
        doc = daemon.wait_for(lambda d: d["node"]["inventory"] is not None)
        assert _problems(doc) == []
        steps = [
            (("fabric_health", 0, {"bits": ["route_unhealthy"]}),
             (0, "fabric_health", "CRITICAL", "gpu-fabric-route-unhealthy")),
            (("nvlink_ber", 1, {"link": 7, "effective_ber": 3e-11}),
             (1, "nvlink", "WARN", "gpu-nvlink-ber")),
            (("operational_event", 2, {"xid": 79}),
             (2, "xid", "CRITICAL", "gpu-xid-reboot-required")),
            (("fabric_manager", 3, {"state": "flapping"}),
             (None, "fabric", "CRITICAL", "node-service-flapping")),
        ]  # fmt: skip
        expected: set[tuple[int | None, str, str, str]] = set()
        for (kind, gpu, values), finding in steps:
            daemon.inject(kind, gpu, **values)
            expected.add(finding)
            doc = daemon.wait_for(lambda d: set(_problems(d)) == expected)
        daemon.inject("clear", 3)
        daemon.inject("fabric_manager", 3, state="down")
        down = (None, "fabric", "CRITICAL", "node-fabric-manager")
        expected = (expected - {steps[3][1]}) | {down}
        daemon.wait_for(lambda d: set(_problems(d)) == expected)
    finally:
        daemon.stop()


# (fault kind, values, check that must fire, severity, extra config)
FAULTS: list[tuple[str, dict[str, Any], str, str]] = [
    ("ecc_dbe", {"count": 1}, "ecc", "CRITICAL"),
    ("ecc_sbe", {"count": 100000}, "ecc", "WARN"),
    ("row_remap_pending", {}, "row_remap", "WARN"),
    ("row_remap_failure", {}, "row_remap", "CRITICAL"),
    ("temperature", {"celsius": 84}, "thermal", "WARN"),
    ("temperature", {"celsius": 91}, "thermal", "CRITICAL"),
    ("throttle", {"reasons": ["hw_thermal"]}, "thermal", "WARN"),
    ("pcie_degrade", {"gen": 5, "width": 8}, "pcie", "WARN"),
    ("pcie_replay", {"count": 100000}, "pcie", "WARN"),
    ("gpu_lost", {}, "availability", "CRITICAL"),
    ("persistence_off", {}, "persistence", "WARN"),
    ("nvlink_down", {"link": 3}, "nvlink", "CRITICAL"),
    # NVLink's *_TOTAL error fields sum every link: errors on link 7 count as on link 0.
    ("nvlink_errors", {"link": 7, "replay": 2}, "nvlink", "WARN"),
    ("recovery_action", {"action": "reset"}, "recovery", "CRITICAL"),
]
# Throttling is a finding only on a busy GPU whose throttle-duration counters grew for a
# good share of the window: the GPU that gets the throttle fault runs a job from the start,
# and the window is short enough for a test.
THROTTLED = next(i for i, fault in enumerate(FAULTS) if fault[0] == "throttle")
# Two GPUs past those the faults break, for the tests that follow them.
CLEARED, WITH_PROCESS = len(FAULTS), len(FAULTS) + 1
JOB = '[[fault]]\ngpu = {gpu}\nkind = "process"\npid = 4100\nname = "train.py"\nused_mib = 4096\n'


@pytest.fixture(scope="module")
def faults_node(tmp_path_factory: pytest.TempPathFactory) -> Any:
    daemon = start_daemon(
        tmp_path_factory.mktemp("faults"),
        H100.format(gpus=len(FAULTS) + 2) + JOB.format(gpu=THROTTLED),
        config_extra="[checks.pcie]\ndegraded_hold_seconds = 0\n"
        "[checks.thermal]\nthrottle_window_seconds = 2\n"
        # Persistence off is a fault only where it is expected on.
        '[inventory.expected]\npersistence = "enabled"\n',
    )
    yield daemon
    daemon.stop()


@pytest.mark.parametrize(
    ("gpu", "kind", "values", "check", "severity"),
    [(i, *fault) for i, fault in enumerate(FAULTS)],
    ids=[f"{f[0]}-{f[3]}" for f in FAULTS],
)
def test_each_fault_kind_turns_into_its_finding(
    faults_node: DaemonProcess,
    gpu: int,
    kind: str,
    values: dict[str, Any],
    check: str,
    severity: str,
) -> None:
    daemon = faults_node
    daemon.wait_for(lambda d: _gpu(d, gpu)["health"] == "OK")
    daemon.inject(kind, gpu, **values)
    doc = daemon.wait_for(lambda d: _severity(d, gpu, check) == severity)
    finding = next(f for f in _gpu(doc, gpu)["findings"] if f["check"] == check)
    assert finding["reason"]
    assert finding["runbook"]
    # Only the GPU we broke changed.
    assert _gpu(doc, gpu + 1)["health"] == "OK"
    metrics = daemon.metrics()
    bus = _gpu(doc, gpu)["pci_bus_id"]
    health = [
        s.value
        for s in _samples(metrics, "gpuagent_gpu_health")
        if s.labels["check"] == check and s.labels["pci_bus_id"].lower().endswith(bus[4:])
    ]
    assert health == [{"WARN": 1.0, "CRITICAL": 2.0}[severity]]


def test_retired_pages_on_a_gpu_that_retires_them(run_daemon: Run) -> None:
    # Hopper and Ampere remap rows instead (Retired Pages N/A): page retirement is Volta's.
    daemon = run_daemon('[node]\ngpus = 2\nmodel = "v100-sxm2"\n')
    daemon.wait_for(lambda d: _gpu(d, 1)["health"] == "OK")
    daemon.inject("retired_pages", 1, count=2, pending=True)
    doc = daemon.wait_for(lambda d: _severity(d, 1, "retired_pages") == "WARN")
    finding = next(f for f in _gpu(doc, 1)["findings"] if f["check"] == "retired_pages")
    assert finding["reason"]
    assert _gpu(doc, 0)["health"] == "OK"


def test_lost_gpu_serves_no_stale_values(faults_node: DaemonProcess) -> None:
    daemon = faults_node
    lost = FAULTS.index(("gpu_lost", {}, "availability", "CRITICAL"))
    daemon.inject("gpu_lost", lost)
    doc = daemon.wait_for(lambda d: _gpu(d, lost)["status"] == "lost")
    assert "temperature_c" not in _gpu(doc, lost)
    metrics = daemon.metrics()
    up = {s.labels["gpu"]: s.value for s in _samples(metrics, "gpuagent_gpu_up")}
    assert up[str(lost)] == 0.0
    assert str(lost) not in {s.labels["gpu"] for s in _samples(metrics, "DCGM_FI_DEV_GPU_TEMP")}


def test_process_on_gpu_is_shown_with_its_name(faults_node: DaemonProcess) -> None:
    daemon = faults_node
    daemon.inject("process", WITH_PROCESS, pid=4242, name="train.py", used_mib=1024)
    doc = daemon.wait_for(lambda d: bool(_gpu(d, WITH_PROCESS).get("processes")))
    # Looked up in the simulator's process table: uid 0 by default.
    assert _gpu(doc, WITH_PROCESS)["processes"] == [
        {"pid": 4242, "name": "train.py", "used_mib": 1024.0, "user": "root", "alive": True}
    ]


def test_clear_returns_a_gpu_to_healthy(faults_node: DaemonProcess) -> None:
    daemon = faults_node
    daemon.inject("persistence_off", CLEARED)
    daemon.wait_for(lambda d: _severity(d, CLEARED, "persistence") == "WARN")
    daemon.inject("clear", CLEARED)
    daemon.wait_for(lambda d: _gpu(d, CLEARED)["health"] == "OK")


def test_hang_on_one_gpu_leaves_the_others_and_the_scrape_alive(run_daemon: Run) -> None:
    daemon = run_daemon(H100.format(gpus=8), interval=0.3, call_timeout=0.5)
    daemon.inject("nvml_hang", 2, seconds=4)
    doc = daemon.wait_for(lambda d: _gpu(d, 2)["status"] == "timeout", timeout=5)
    assert _gpu(doc, 2)["health"] == "UNKNOWN"
    assert _gpu(doc, 2)["findings"][0]["reason"].startswith("nvml_timeout")
    # While GPU 2 is wedged, the others keep updating and scrapes keep answering quickly.
    before = _gpu(doc, 5)["sampled_at"]
    started = time.monotonic()
    metrics = daemon.metrics()
    assert time.monotonic() - started < 0.5 * PATIENCE  # GPU 2 hangs for 4 s
    assert {s.labels["gpu"] for s in _samples(metrics, "DCGM_FI_DEV_GPU_TEMP")} == {
        "0",
        "1",
        "3",
        "4",
        "5",
        "6",
        "7",
    }
    later = daemon.wait_for(lambda d: _gpu(d, 5)["sampled_at"] > before + 0.5, timeout=3)
    assert _gpu(later, 2)["status"] == "timeout"
    # When the call returns, the GPU comes back by itself.
    daemon.wait_for(lambda d: _gpu(d, 2)["health"] == "OK", timeout=10)


def test_nvml_that_cannot_start_is_a_node_finding_and_the_daemon_keeps_serving(
    run_daemon: Run,
) -> None:
    daemon = run_daemon('[node]\ngpus = 8\ninit_error = "driver_not_loaded"\n')
    # READY comes once NVML was tried; the kernel log is heard once its buffer was read.
    doc = daemon.wait_for(lambda d: any(s["name"] == "kmsg" and s["up"] for s in d["sources"]))
    assert doc["node"]["health"] == "CRITICAL"
    assert doc["node"]["nvml"]["problem"] == "driver_not_loaded"
    assert doc["node"]["findings"][0]["check"] == "nvml"
    assert doc["gpus"] == []
    metrics = daemon.metrics()
    assert [s.value for s in _samples(metrics, "gpuagent_nvml_up")] == [0.0]
    up = {s.labels["source"]: s.value for s in _samples(metrics, "gpuagent_source_up")}
    assert up["nvml"] == 0.0
    assert up["kmsg"] == 1.0  # the kernel log is heard even without NVML


def test_bad_api_requests_are_rejected_and_the_daemon_carries_on(run_daemon: Run) -> None:
    daemon = run_daemon(H100.format(gpus=2))
    for request in (b"not json\n", b"[1,2]\n", b'{"method": "reboot"}\n', b'{"method": 1}\n'):
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(5)
            sock.connect(str(daemon.socket))
            sock.sendall(request)
            response = json.loads(sock.makefile().readline())
        assert response["ok"] is False
        assert response["error"]
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(5)
        sock.connect(str(daemon.socket))
        sock.sendall(b"x" * (70 * 1024) + b"\n")
        assert json.loads(sock.makefile().readline())["error"] == "request too large"
    assert daemon.status()["node"]["health"] == "OK"
    daemon.call("refresh")
    rejected = {
        s.labels["reason"]: s.value
        for s in _samples(daemon.metrics(), "gpuagent_api_requests_rejected_total")
    }
    assert rejected == {"malformed": 3.0, "unknown_method": 1.0, "oversized": 1.0}
    log = (daemon.workdir / "daemon.log").read_text()
    assert log.count("rejected API request (malformed)") == 1
    bad_inject = daemon.cli("inject", "--socket", str(daemon.socket), "ecc_tbe", "--gpu", "0")
    assert bad_inject.returncode == 1
    assert "ecc_tbe" in bad_inject.stderr


def test_socket_is_owner_only(run_daemon: Run) -> None:
    daemon = run_daemon(H100.format(gpus=1))
    assert daemon.socket.stat().st_mode & 0o777 == 0o600


def _served_snapshot(daemon: DaemonProcess) -> float:
    (taken,) = _samples(daemon.metrics(), "gpuagent_snapshot_timestamp_seconds")
    return taken.value


def test_metrics_render_at_most_every_interval_unless_the_judgement_changes(
    tmp_path: Path,
) -> None:
    """A 0.2 s poll with render_interval_seconds = 60: /metrics keeps the snapshot it
    rendered while the API moves on, and a fault shows at once all the same."""
    daemon = start_daemon(tmp_path, H100.format(gpus=2), interval=0.2, render_interval=60.0)
    try:
        daemon.wait_for(lambda d: d["node"]["health"] == "OK")
        served = _served_snapshot(daemon)
        first = daemon.status()["sequence"]
        daemon.wait_for(lambda d: d["sequence"] >= first + 5)
        assert _served_snapshot(daemon) == served  # values at most 60 s old, as configured
        daemon.inject("ecc_dbe", 1, count=1)
        deadline = deadline_in(2.0)
        while _served_snapshot(daemon) == served:
            assert time.monotonic() < deadline, "the DBE did not reach /metrics"
            time.sleep(0.02)
        health = {
            s.labels["gpu"]: s.value
            for s in _samples(daemon.metrics(), "gpuagent_gpu_health_status")
        }
        assert health == {"0": 0.0, "1": 2.0}
    finally:
        daemon.stop()


def test_metrics_render_again_once_the_interval_has_passed(tmp_path: Path) -> None:
    """Nothing changes on a healthy node: /metrics moves on every render_interval (1 s
    here, a 0.2 s poll), never at every poll."""
    daemon = start_daemon(tmp_path, H100.format(gpus=1), interval=0.2, render_interval=1.0)
    try:
        daemon.wait_for(lambda d: d["node"]["health"] == "OK")
        served: list[float] = []
        started = time.monotonic()
        deadline = deadline_in(3.0)
        while len(set(served)) < 3 or time.monotonic() - started < 3.0:
            assert time.monotonic() < deadline, f"/metrics did not move on: {served}"
            served.append(_served_snapshot(daemon))
            time.sleep(0.05)
        renders = sorted(set(served))
        # At least 0.9 s apart (the interval less half a poll), however busy the machine.
        assert all(b - a >= 0.85 for a, b in itertools.pairwise(renders)), renders
    finally:
        daemon.stop()


def test_metrics_port_in_use_is_a_clear_error(tmp_path: Path, run_daemon: Run) -> None:
    daemon = run_daemon(H100.format(gpus=1))
    config = tmp_path / "clash.toml"
    config.write_text(
        f'[api]\nsocket = "{tmp_path / "other.sock"}"\n'
        f'[metrics]\nlisten = "127.0.0.1:{daemon.port}"\n'
    )
    scenario = tmp_path / "s.toml"
    scenario.write_text(H100.format(gpus=1))
    result = daemon.cli("run", "--config", str(config), "--simulate", str(scenario))
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert str(daemon.port) in result.stderr


def _check(tmp_path: Path, scenario: str, *extra: str) -> tuple[int, dict[str, Any]]:
    path = tmp_path / "check.toml"
    path.write_text(scenario)
    config = tmp_path / "c.toml"
    # Long enough for a healthy call on a busy machine, short of the 3 s hang below.
    config.write_text("[sources.nvml]\ncall_timeout_seconds = 1.5\n")
    result = run_cli("check", "--json", "--config", str(config), "--simulate", str(path), *extra)
    return result.returncode, json.loads(result.stdout)


@pytest.mark.parametrize(
    ("fault", "code"),
    [
        ("", 0),
        ('[[fault]]\ngpu = 1\nkind = "row_remap_pending"\n', 1),
        ('[[fault]]\ngpu = 1\nkind = "ecc_dbe"\ncount = 1\n', 2),
        ('[[fault]]\ngpu = 1\nkind = "nvml_hang"\nseconds = 3\n', 3),
    ],
    ids=["ok", "warn", "critical", "unknown"],
)
def test_check_exit_codes_follow_nagios(tmp_path: Path, fault: str, code: int) -> None:
    returncode, doc = _check(tmp_path, H100.format(gpus=4) + fault)
    assert returncode == code
    assert doc["node"]["health"] == ["OK", "WARN", "CRITICAL", "UNKNOWN"][code]


def test_scrape_before_and_after_404(run_daemon: Run) -> None:
    daemon = run_daemon(H100.format(gpus=1))
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(f"http://127.0.0.1:{daemon.port}/nope", timeout=5)
    assert info.value.code == 404
    info.value.close()
