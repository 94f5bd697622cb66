"""Integration: the inventory checks end to end, through `gpuagent check --simulate` and
the real daemon (status, metrics, learn mode, PCI changes)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import DaemonProcess, parse_metrics, run_cli, start_daemon

pytestmark = pytest.mark.integration

H100 = '[node]\ngpus = {gpus}\nmodel = "NVIDIA H100 80GB HBM3"\n'
HGX = H100.format(gpus=8) + (
    'nvswitches = 4\nfabric_state = "completed"\nfabricmanager = "active"\n'
)


def _check(tmp_path: Path, scenario: str, config: str = "") -> tuple[int, dict[str, Any]]:
    path = tmp_path / "scenario.toml"
    path.write_text(scenario)
    config_path = tmp_path / "config.toml"
    config_path.write_text(f"[sources.nvml]\ncall_timeout_seconds = 5\n{config}")
    result = run_cli("check", "--json", "--config", str(config_path), "--simulate", str(path))
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode, json.loads(result.stdout)


def _findings(doc: dict[str, Any]) -> list[tuple[str | None, str, str, str]]:
    """(GPU index or None, check, severity, runbook) of every problem in a status document."""
    found = [(None, f["check"], f["severity"], f["runbook"]) for f in doc["node"]["findings"]]
    for gpu in doc["gpus"]:
        found += [(gpu["index"], f["check"], f["severity"], f["runbook"]) for f in gpu["findings"]]
    return found


def _fault(kind: str, gpu: int, **values: object) -> str:
    lines = "".join(
        f"{k} = {json.dumps(v) if not isinstance(v, bool) else str(v).lower()}\n"
        for k, v in values.items()
    )
    return f'[[fault]]\ngpu = {gpu}\nkind = "{kind}"\n{lines}'


MIG_NODE = H100.format(gpus=2) + (
    'mig_mode = true\nmig_profiles = ["3g.40gb", "1g.10gb", "1g.10gb", "2g.20gb"]\n'
)
MIG_EXPECTED = '[inventory.expected]\nmig_profiles = ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"]\n'

# (id, scenario, config, expected problems, exit code)
CASES: list[tuple[str, str, str, set[tuple[int | None, str, str, str]], int]] = [
    ("healthy-hgx", HGX, "[inventory.expected]\ngpus = 8\n", set(), 0),
    (
        "gpu-on-pci-not-in-nvml",
        H100.format(gpus=7) + "pci_only_gpus = 1\n",
        "[inventory.expected]\ngpus = 8\n",
        {(None, "gpu_count", "CRITICAL", "node-gpu-missing-driver")},
        2,
    ),
    (
        "gpu-gone-from-pci",
        H100.format(gpus=7),
        "[inventory.expected]\ngpus = 8\n",
        {(None, "gpu_count", "CRITICAL", "node-gpu-missing-pci")},
        2,
    ),
    (
        "module-library-mismatch",
        H100.format(gpus=2) + 'module_version = "535.104.05"\n',
        "",
        {(None, "driver", "CRITICAL", "node-driver-module")},
        2,
    ),
    (
        "module-not-loaded",
        H100.format(gpus=2) + 'modules = []\ninit_error = "driver_not_loaded"\n',
        "",
        {
            (None, "nvml", "CRITICAL", "nvml-driver-not-loaded"),
            (None, "driver", "CRITICAL", "node-driver-module"),
        },
        2,
    ),
    (
        "nvml-version-mismatch",
        H100.format(gpus=2) + 'init_error = "version_mismatch"\n',
        "",
        {(None, "nvml", "CRITICAL", "nvml-version-mismatch")},
        2,
    ),
    (
        # A driver upgraded without a reboot: the old module under the new library, so
        # nvmlInit fails; the installed library file still shows the two disagree.
        "nvml-version-mismatch-module-differs",
        H100.format(gpus=2) + 'init_error = "version_mismatch"\nmodule_version = "535.104.05"\n',
        "",
        {
            (None, "nvml", "CRITICAL", "nvml-version-mismatch"),
            (None, "driver", "CRITICAL", "node-driver-module"),
        },
        2,
    ),
    (
        "nvml-library-not-found",
        H100.format(gpus=2) + 'init_error = "library_not_found"\n',
        "",
        {(None, "nvml", "CRITICAL", "nvml-library-not-found")},
        2,
    ),
    (
        "nvml-no-permission",
        H100.format(gpus=2) + 'init_error = "no_permission"\n',
        "",
        {(None, "nvml", "CRITICAL", "nvml-no-permission")},
        2,
    ),
    (
        "nvml-init-timeout",
        H100.format(gpus=2) + 'init_error = "timeout"\n',
        "",
        {(None, "nvml", "CRITICAL", "nvml-timeout")},
        2,
    ),
    (
        "nvml-init-other-error",
        H100.format(gpus=2) + 'init_error = "other"\n',
        "",
        {(None, "nvml", "CRITICAL", "nvml-error")},
        2,
    ),
    (
        "gsp-firmware-differs",
        H100.format(gpus=2) + 'gsp_firmware_version = "550.40.07"\n',
        "",
        {(None, "firmware", "WARN", "node-gsp-firmware-mismatch")},
        1,
    ),
    (
        "persistenced-failed",
        H100.format(gpus=2) + 'persistenced = "failed"\n',
        "",
        {(None, "services", "WARN", "node-persistenced-down")},
        1,
    ),
    (
        "persistenced-masked",
        H100.format(gpus=2) + 'persistenced = "masked"\n',
        "",
        set(),
        0,
    ),
    (
        "fabric-manager-down",
        HGX.replace('fabricmanager = "active"', 'fabricmanager = "inactive"'),
        "",
        {(None, "fabric", "CRITICAL", "node-fabric-manager")},
        2,
    ),
    (
        "fabric-manager-off-the-host-fabric-up",
        HGX.replace('fabricmanager = "active"', 'fabricmanager = "not_installed"'),
        "",
        set(),
        0,
    ),
    (
        "fabric-manager-off-the-host-fabric-not-started",
        HGX.replace('fabricmanager = "active"', 'fabricmanager = "not_installed"').replace(
            'fabric_state = "completed"', 'fabric_state = "not_started"'
        ),
        "",
        {(None, "fabric", "CRITICAL", "node-fabric-manager")},
        2,
    ),
    (
        "fabric-registration-stuck",
        HGX + _fault("fabric", 3, state="in_progress"),
        "",
        {(None, "fabric", "CRITICAL", "node-fabric-manager")},
        2,
    ),
    (
        "ecc-pending",
        H100.format(gpus=2) + _fault("ecc_mode", 1, enabled=False),
        "",
        {(1, "ecc_mode", "WARN", "gpu-ecc-pending")},
        1,
    ),
    (
        "mig-pending",
        H100.format(gpus=2) + _fault("mig_mode", 0, enabled=True),
        "",
        {(0, "mig", "WARN", "gpu-mig-pending")},
        1,
    ),
    # A limit or clocks someone set are facts; a finding only against an expectation.
    (
        "power-limit-set",
        H100.format(gpus=2) + _fault("power_limit", 1, watts=500),
        "",
        set(),
        0,
    ),
    (
        "power-limit-against-the-expected",
        H100.format(gpus=2) + _fault("power_limit", 1, watts=500),
        "[inventory.expected]\npower_limit_watts = 700\n",
        {(1, "settings", "WARN", "gpu-power-limit-changed")},
        1,
    ),
    (
        "clocks-set",
        H100.format(gpus=2) + _fault("app_clocks", 0, mhz=1410),
        "",
        set(),
        0,
    ),
    (
        "clocks-against-their-default",
        H100.format(gpus=2) + _fault("app_clocks", 0, mhz=1410),
        '[inventory.expected]\napplications_clocks = "default"\n',
        {(0, "settings", "WARN", "gpu-clocks-set")},
        1,
    ),
    (
        "mig-layout-as-expected",
        MIG_NODE,
        MIG_EXPECTED,
        set(),
        0,
    ),
    (
        "mig-layout-stale",
        MIG_NODE + _fault("mig_instances", 1, profiles=["1g.10gb", "2g.20gb"]),
        MIG_EXPECTED,
        {(1, "mig_layout", "WARN", "gpu-mig-layout")},
        1,
    ),
    (
        "mig-layout-of-its-own-on-one-gpu",
        MIG_NODE + _fault("mig_instances", 1, profiles=["7g.80gb"]),
        MIG_EXPECTED + '[[inventory.expected.gpu]]\nindex = 1\nmig_profiles = ["7g.80gb"]\n',
        set(),
        0,
    ),
    (
        "mig-mode-of-its-own-on-one-gpu",
        H100.format(gpus=2),
        (
            '[checks.mig]\nexpected = "disabled"\n'
            '[[inventory.expected.gpu]]\nindex = 0\nmig_mode = "enabled"\n'
        ),
        {(0, "mig", "WARN", "gpu-mig-mismatch")},
        1,
    ),
    (
        "persistence-on-expected-off",
        H100.format(gpus=2),
        '[inventory.expected]\npersistence = "disabled"\n',
        {
            (0, "persistence", "WARN", "gpu-persistence-mismatch"),
            (1, "persistence", "WARN", "gpu-persistence-mismatch"),
        },
        1,
    ),
    (
        "persistence-off-expected-on-reported-once",
        H100.format(gpus=2) + _fault("persistence_off", 0),
        '[inventory.expected]\npersistence = "enabled"\n',
        {(0, "persistence", "WARN", "gpu-persistence-off")},
        1,
    ),
    (
        "persistence-off-without-expectation",
        H100.format(gpus=2) + _fault("persistence_off", 0),
        "",
        set(),
        0,
    ),
    (
        "persistence-off-expected-on-check-disabled",
        H100.format(gpus=2) + _fault("persistence_off", 0),
        '[checks.persistence]\nenabled = false\n[inventory.expected]\npersistence = "enabled"\n',
        set(),
        0,
    ),
    (
        "drift-from-expected",
        H100.format(gpus=2) + 'kernel_release = "6.1.0-21-amd64"\n',
        '[inventory.expected]\ndriver_version = "550"\nkernel_release = "6.1.0-18-amd64"\n',
        {(None, "drift", "WARN", "node-inventory-drift")},
        1,
    ),
    (
        "kernel-update-without-module",
        H100.format(gpus=2)
        + 'installed_kernels = ["6.1.0-28-amd64"]\nkernels_without_module = ["6.1.0-28-amd64"]\n',
        "",
        {(None, "kernel_module", "WARN", "node-kernel-without-module")},
        1,
    ),
    (
        "kernel-update-with-module",
        H100.format(gpus=2) + 'installed_kernels = ["6.1.0-28-amd64"]\n',
        "",
        set(),
        0,
    ),
]


@pytest.mark.parametrize(
    ("scenario", "config", "problems", "code"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_check_finds_each_inventory_problem(
    tmp_path: Path,
    scenario: str,
    config: str,
    problems: set[tuple[int | None, str, str, str]],
    code: int,
) -> None:
    returncode, doc = _check(tmp_path, scenario, config)
    assert set(_findings(doc)) == problems
    assert returncode == code
    assert doc["node"]["inventory"]["fingerprint_id"]


def test_check_without_inventory_runs_no_inventory_checks(tmp_path: Path) -> None:
    scenario = H100.format(gpus=2) + 'module_version = "535.104.05"\n'
    returncode, doc = _check(tmp_path, scenario, "[inventory]\nenabled = false\n")
    assert (returncode, doc["node"]["inventory"], _findings(doc)) == (0, None, [])


def _samples(text: str, name: str) -> list[Any]:
    return [s for f in parse_metrics(text) for s in f.samples if s.name == name]


def test_daemon_shows_inventory_in_status_and_metrics(tmp_path: Path) -> None:
    daemon = start_daemon(
        tmp_path / "d",
        HGX.replace("gpus = 8", "gpus = 3") + "pci_only_gpus = 1\n",
        config_extra="[inventory.expected]\ngpus = 4\n",
    )
    try:
        doc = daemon.status()
        inventory = doc["node"]["inventory"]
        assert (inventory["gpus_expected"], inventory["gpus_nvml"]) == (4, 3)
        assert inventory["module_version"] == "550.54.15"
        assert inventory["services"]["nvidia-fabricmanager"] == "active"
        assert inventory["gpus"][0]["inforom_version"] == "G520.0200.00.05"
        assert (None, "gpu_count", "CRITICAL", "node-gpu-missing-driver") in _findings(doc)

        table = daemon.cli("status", "--socket", str(daemon.socket))
        assert "GPUs: NVML 3, PCI 4  NVSwitches 4  module 550.54.15" in table.stdout
        assert f"fingerprint {inventory['fingerprint_id']}" in table.stdout
        assert "nvidia-fabricmanager active" in table.stdout

        metrics = daemon.metrics()
        (info,) = _samples(metrics, "gpuagent_node_info")
        assert info.value == 1.0
        assert info.labels["driver_version"] == "550.54.15"
        assert info.labels["kernel_release"] == "6.1.0-18-amd64"
        assert info.labels["fingerprint"] == inventory["fingerprint_id"]
        gpus = _samples(metrics, "gpuagent_gpu_inventory_info")
        assert len(gpus) == 3
        assert gpus[0].labels["vbios_version"] == "96.00.99.00.01"
        assert gpus[0].labels["pci_bus_id"] == "00000000:18:00.0"
        assert [s.value for s in _samples(metrics, "gpuagent_gpus_expected")] == [4.0]
        seen = {s.labels["source"]: s.value for s in _samples(metrics, "gpuagent_gpus_seen")}
        assert seen == {"nvml": 3.0, "pci": 4.0, "pci_other_driver": 0.0}
        assert [s.value for s in _samples(metrics, "gpuagent_nvswitches_seen")] == [4.0]
        checks = {
            s.labels["check"]: s.value for s in _samples(metrics, "gpuagent_node_check_health")
        }
        assert checks["gpu_count"] == 2.0
    finally:
        daemon.stop()


def _drifted(daemon: DaemonProcess) -> list[str]:
    return [f["reason"] for f in daemon.status()["node"]["findings"] if f["check"] == "drift"]


def test_learn_mode_records_the_first_healthy_inventory_and_reports_drift(
    tmp_path: Path,
) -> None:
    workdir = tmp_path / "d"
    learn = "[inventory]\nlearn = true\n"
    daemon = start_daemon(workdir, H100.format(gpus=2), config_extra=learn)
    try:
        baseline = workdir / "state" / "inventory-baseline.json"
        assert json.loads(baseline.read_text())["fingerprint"]["kernel"] == "6.1.0-18-amd64"
        assert _drifted(daemon) == []
    finally:
        daemon.stop()
    # The node comes back with a new kernel and driver: drift against the baseline.
    upgraded = H100.format(gpus=2) + (
        'kernel_release = "6.1.0-21-amd64"\ndriver_version = "550.90.07"\n'
    )
    daemon = start_daemon(workdir, upgraded, config_extra=learn)
    try:
        (reason,) = _drifted(daemon)
        assert "kernel 6.1.0-21-amd64, baseline 6.1.0-18-amd64" in reason
        assert "driver 550.90.07, baseline 550.54.15" in reason
        # The baseline is kept, not relearned from the drifted node.
        assert json.loads(baseline.read_text())["fingerprint"]["driver"] == "550.54.15"
    finally:
        daemon.stop()


def test_learn_mode_reports_a_gpu_gone_after_a_restart(tmp_path: Path) -> None:
    workdir = tmp_path / "d"
    learn = "[inventory]\nlearn = true\n"  # and no inventory.expected.gpus
    daemon = start_daemon(workdir, HGX, config_extra=learn)
    try:
        learned = json.loads((workdir / "state" / "inventory-baseline.json").read_text())
        assert (learned["gpus"], learned["nvswitches"]) == (8, 4)
        assert learned["models"] == "NVIDIA H100 80GB HBM3"
        assert learned["modules"] == ["nvidia", "nvidia_modeset", "nvidia_uvm"]
    finally:
        daemon.stop()
    # After a kernel upgrade the node comes back with a GPU gone from PCI and from NVML.
    daemon = start_daemon(
        workdir,
        HGX.replace("gpus = 8", "gpus = 7") + 'kernel_release = "6.1.0-21-amd64"\n',
        config_extra=learn,
    )
    try:
        doc = daemon.status()
        (count,) = [f for f in doc["node"]["findings"] if f["check"] == "gpu_count"]
        assert (count["severity"], count["runbook"]) == ("CRITICAL", "node-gpu-missing-pci")
        assert count["reason"] == "1 of 8 GPUs of the learned baseline missing: 7 on the PCI bus"
        assert count["evidence"]["gpus_baseline"] == 8
        (reason,) = _drifted(daemon)
        assert "kernel 6.1.0-21-amd64, baseline 6.1.0-18-amd64" in reason
    finally:
        daemon.stop()


def test_daemon_with_a_hanging_nvml_init_reports_it_and_still_stops(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path / "d", H100.format(gpus=2) + 'init_error = "timeout"\n')
    try:
        doc = daemon.wait_for(lambda d: d["node"]["nvml"]["problem"] == "timeout")
        (finding,) = [f for f in doc["node"]["findings"] if f["check"] == "nvml"]
        assert (finding["severity"], finding["runbook"]) == ("CRITICAL", "nvml-timeout")
    finally:
        started = time.monotonic()
        returncode = daemon.stop()
    # Blocked nvmlInit calls sit on worker threads; they must not hold up the exit.
    assert returncode == 0
    assert time.monotonic() - started < 5


def _pci_gpus(doc: dict[str, Any]) -> list[str]:
    return [f["address"] for f in doc["node"]["inventory"]["pci"] if f["role"] == "gpu"]


def _gpu_count(doc: dict[str, Any]) -> list[tuple[str, str]]:
    return [
        (f["severity"], f["runbook"]) for f in doc["node"]["findings"] if f["check"] == "gpu_count"
    ]


def test_pci_changes_refresh_the_inventory(tmp_path: Path) -> None:
    daemon = start_daemon(
        tmp_path / "d", H100.format(gpus=2), config_extra="[inventory.expected]\ngpus = 2\n"
    )
    try:
        doc = daemon.status()
        assert (_pci_gpus(doc), _gpu_count(doc)) == (["0000:18:00.0", "0000:2a:00.0"], [])
        before = doc["node"]["inventory"]["collected_at"]
        daemon.inject("pci_remove", 1)
        doc = daemon.wait_for(lambda d: d["node"]["inventory"]["collected_at"] > before)
        assert _pci_gpus(doc) == ["0000:18:00.0"]
        assert _gpu_count(doc) == [("CRITICAL", "node-gpu-missing-pci")]
        before = doc["node"]["inventory"]["collected_at"]
        daemon.inject("pci_add", 1)
        doc = daemon.wait_for(
            lambda d: d["node"]["inventory"]["collected_at"] > before and not _gpu_count(d)
        )
        assert _pci_gpus(doc) == ["0000:18:00.0", "0000:2a:00.0"]
    finally:
        daemon.stop()


def test_check_names_a_mismatch_nvml_cannot_start_with(tmp_path: Path) -> None:
    scenario = H100.format(gpus=2) + (
        'init_error = "version_mismatch"\nmodule_version = "535.104.05"\n'
    )
    _, doc = _check(tmp_path, scenario)
    inventory = doc["node"]["inventory"]
    assert (inventory["module_version"], inventory["library_version"]) == (
        "535.104.05",
        "550.54.15",
    )
    (driver,) = [f for f in doc["node"]["findings"] if f["check"] == "driver"]
    assert driver["reason"] == (
        "driver/library mismatch: kernel module 535.104.05, NVML library 550.54.15"
    )
    assert driver["evidence"]["nvml_library_version"] is None  # NVML did not start


def test_check_shows_the_mig_instances_and_the_stale_layout(tmp_path: Path) -> None:
    scenario = MIG_NODE + _fault("mig_instances", 1, profiles=["7g.80gb"])
    _, doc = _check(tmp_path, scenario, MIG_EXPECTED)
    gpus = doc["node"]["inventory"]["gpus"]
    assert gpus[0]["mig"]["instances"] == ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"]
    assert gpus[1]["mig"] == {"current": True, "pending": True, "instances": ["7g.80gb"]}
    (finding,) = [f for f in doc["gpus"][1]["findings"] if f["check"] == "mig_layout"]
    assert finding["reason"] == (
        "MIG layout 7g.80gb, expected 2x 1g.10gb, 2g.20gb, 3g.40gb "
        "(missing 2x 1g.10gb, 2g.20gb, 3g.40gb; unexpected 7g.80gb)"
    )
    assert finding["action"] == "set_mig_layout"


def _fabric_finding(doc: dict[str, Any]) -> tuple[str, str, str]:
    """The fabric check's problem: (severity, runbook, reason); OK when it has none."""
    found = next((f for f in doc["node"]["findings"] if f["check"] == "fabric"), None)
    return (
        ("OK", "", "") if found is None else (found["severity"], found["runbook"], found["reason"])
    )


def test_fabric_manager_down_after_three_probes_and_flapping(tmp_path: Path) -> None:
    daemon = start_daemon(
        tmp_path / "d", HGX, config_extra="[inventory]\nservices_probe_seconds = 0.2\n"
    )
    try:
        assert _fabric_finding(daemon.status())[0] == "OK"
        daemon.inject("fabric_manager", 3, state="flapping")
        doc = daemon.wait_for(lambda d: _fabric_finding(d)[1] == "node-service-flapping")
        severity, _, reason = _fabric_finding(doc)
        assert severity == "CRITICAL"
        assert "nvidia-fabricmanager restarted" in reason
        assert reason.endswith("recently: flapping")
        daemon.inject("clear", 3)
        daemon.inject("fabric_manager", 3, state="down")
        doc = daemon.wait_for(lambda d: "failed on an NVSwitch system" in _fabric_finding(d)[2])
        # Down is named only once three probes in a row found it stopped.
        assert "probes in a row)" in _fabric_finding(doc)[2]
        assert _fabric_finding(doc)[0] == "CRITICAL"
    finally:
        daemon.stop()
