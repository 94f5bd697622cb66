"""The node inventory: host facts from fixture sysfs/procfs trees, systemd service state,
the learned baseline, the fingerprint and the inventory's JSON form."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shutil
import stat
from pathlib import Path

import pytest

from gpuagent.checks import InventoryView
from gpuagent.checks.common import to_finding
from gpuagent.checks.inventory import check_gpu_count
from gpuagent.config import ConfigError, InventoryExpected, parse_config
from gpuagent.inventory import (
    HostFacts,
    NodeInventory,
    PciFunction,
    Service,
    fingerprint,
    fingerprint_hash,
)
from gpuagent.inventory.baseline import (
    Baseline,
    LearnedSettings,
    learn,
    load_baseline,
    save_baseline,
)
from gpuagent.inventory.build import build_inventory
from gpuagent.inventory.collect import (
    collect_host,
    read_library_version,
    read_os_release,
    read_pci_functions,
)
from gpuagent.inventory.model import UNKNOWN_DRIVER, KernelModuleState
from gpuagent.inventory.services import ImexReadiness, parse_show, read_services
from gpuagent.metrics.inventory import inventory_families
from gpuagent.model import GpuIdentity, GpuReadings, GpuState, NvmlStatus, Severity
from gpuagent.render import render_status

NVIDIA, INTEL = 0x10DE, 0x8086


def add_function(
    sys_root: Path,
    address: str,
    *,
    vendor: int,
    device_class: int,
    device: int = 0x2330,
    driver: str | None = None,
    physfn: str | None = None,
) -> None:
    """A PCI function laid out as sysfs does: the device tree, and a bus/pci symlink.
    ``physfn``: the address of the physical function this one is an SR-IOV slice of."""
    directory = sys_root / "devices" / "pci0000:00" / "0000:00:01.0" / address
    directory.mkdir(parents=True)
    if physfn is not None:
        (directory / "physfn").symlink_to(directory.parent / physfn)
    (directory / "vendor").write_text(f"0x{vendor:04x}\n")
    (directory / "device").write_text(f"0x{device:04x}\n")
    (directory / "class").write_text(f"0x{device_class:06x}\n")
    if driver is not None:
        drivers = sys_root / "bus" / "pci" / "drivers" / driver
        drivers.mkdir(parents=True, exist_ok=True)
        (directory / "driver").symlink_to(drivers)
    devices = sys_root / "bus" / "pci" / "devices"
    devices.mkdir(parents=True, exist_ok=True)
    (devices / address).symlink_to(directory)


def hgx_tree(root: Path, *, module_version: str | None = "550.54.15") -> Path:
    """Two H100s (one without a driver), an NVSwitch, an Intel bridge, modules, procfs."""
    sys_root = root / "sys"
    add_function(sys_root, "0000:18:00.0", vendor=NVIDIA, device_class=0x030200, driver="nvidia")
    add_function(sys_root, "0000:2a:00.0", vendor=NVIDIA, device_class=0x030200)
    add_function(
        sys_root,
        "0000:05:00.0",
        vendor=NVIDIA,
        device_class=0x068000,
        device=0x22A3,
        driver="nvidia",
    )
    add_function(sys_root, "0000:00:01.1", vendor=INTEL, device_class=0x060400)
    add_function(sys_root, "0000:18:00.1", vendor=NVIDIA, device_class=0x040300)  # audio
    for module in ("nvidia", "nvidia_uvm"):
        (sys_root / "module" / module).mkdir(parents=True)
    if module_version is not None:
        (sys_root / "module" / "nvidia" / "version").write_text(f"{module_version}\n")
    proc = root / "proc" / "sys" / "kernel"
    proc.mkdir(parents=True)
    (proc / "osrelease").write_text("6.1.0-18-amd64\n")
    (root / "os-release").write_text(
        'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nNAME="Debian GNU/Linux"\nID=debian\n'
    )
    return root


def test_collect_host_from_a_fixture_tree(tmp_path: Path) -> None:
    root = hgx_tree(tmp_path)
    services = (Service("nvidia-persistenced", "active"),)
    facts = collect_host(
        root / "sys", root / "proc", root / "os-release", ("nvidia", "ib_core"), services=services
    )
    assert facts.pci == (
        PciFunction("0000:05:00.0", "nvswitch", 0x22A3, "nvidia"),
        PciFunction("0000:18:00.0", "gpu", 0x2330, "nvidia"),
        PciFunction("0000:2a:00.0", "gpu", 0x2330, None),
    )
    assert dict(facts.modules) == {
        "nvidia": True,
        "nvidia_uvm": True,
        "nvidia_modeset": False,
        "nvidia_drm": False,
        "nvidia_peermem": False,
        "ib_core": False,
    }
    assert facts.module_version == "550.54.15"
    assert facts.kernel_release == "6.1.0-18-amd64"
    assert facts.os_release == "Debian GNU/Linux 12 (bookworm)"
    assert facts.services == services
    assert facts.collected_at > 0


def test_collect_host_without_sysfs_or_procfs_says_not_reported(tmp_path: Path) -> None:
    facts = collect_host(tmp_path / "nosys", tmp_path / "noproc", tmp_path / "none", ("nvidia",))
    assert facts.pci is None  # could not look: not "no GPUs"
    assert facts.module_loaded("nvidia") is None  # could not look: not "not loaded"
    assert (facts.module_version, facts.kernel_release, facts.os_release) == (None, None, None)


@pytest.mark.parametrize("module_dir", ["missing", "a-file"])
def test_modules_are_unknown_when_sys_module_cannot_be_listed(
    tmp_path: Path, module_dir: str
) -> None:
    root = hgx_tree(tmp_path)
    shutil.rmtree(root / "sys" / "module")
    if module_dir == "a-file":
        (root / "sys" / "module").write_text("")
    facts = collect_host(root / "sys", root / "proc", root / "os-release", ("nvidia",))
    assert facts.pci is not None  # the rest of sysfs still reads
    assert dict(facts.modules) == dict.fromkeys(
        ("nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm", "nvidia_peermem")
    )
    assert facts.module_version is None


def test_a_driver_link_that_loops_is_an_unknown_driver(tmp_path: Path) -> None:
    root = hgx_tree(tmp_path)
    # An odd sysfs: the unbound GPU's driver link points at itself.
    link = root / "sys" / "bus" / "pci" / "devices" / "0000:2a:00.0" / "driver"
    link.symlink_to(link)
    pci = read_pci_functions(root / "sys")
    assert pci is not None
    assert {f.address: f.driver for f in pci} == {
        "0000:05:00.0": "nvidia",
        "0000:18:00.0": "nvidia",
        "0000:2a:00.0": UNKNOWN_DRIVER,
    }


def _passthrough_tree(root: Path) -> Path:
    """hgx_tree plus a GPU bound to vfio-pci and two SR-IOV virtual functions of it."""
    hgx_tree(root)
    sys_root = root / "sys"
    add_function(sys_root, "0000:3a:00.0", vendor=NVIDIA, device_class=0x030200, driver="vfio-pci")
    for vf in ("0000:3a:00.4", "0000:3a:00.5"):
        add_function(
            sys_root,
            vf,
            vendor=NVIDIA,
            device_class=0x030200,
            driver="nvidia",
            physfn="0000:3a:00.0",
        )
    return root


@pytest.mark.parametrize(
    ("listed", "expected", "severity", "reason_has"),
    [
        pytest.param(
            ("0000:18:00.0", "0000:2a:00.0"),
            3,
            Severity.OK,
            "2 GPUs and 1 bound to vfio-pci, 3 expected",
            id="vfio-gpu-counted-apart-virtual-functions-left-out",
        ),
        pytest.param(
            ("0000:18:00.0",),
            3,
            Severity.CRITICAL,
            "1 GPU on the PCI bus but not in NVML (0000:2a:00.0)",
            id="only-the-unbound-gpu-is-missing-from-nvml",
        ),
        pytest.param(
            ("0000:18:00.0", "0000:2a:00.0"),
            4,
            Severity.CRITICAL,
            "1 of 4 expected GPUs missing: 3 on the PCI bus",
            id="virtual-functions-do-not-make-up-a-missing-gpu",
        ),
    ],
)
def test_gpu_count_from_a_passthrough_tree(
    tmp_path: Path, listed: tuple[str, ...], expected: int, severity: Severity, reason_has: str
) -> None:
    root = _passthrough_tree(tmp_path)
    facts = collect_host(root / "sys", root / "proc", root / "os-release", ("nvidia",))
    assert [(f.address, f.driver) for f in facts.pci or () if f.role == "gpu"] == [
        ("0000:18:00.0", "nvidia"),
        ("0000:2a:00.0", None),
        ("0000:3a:00.0", "vfio-pci"),
    ]
    states = tuple(_state(i, "96.00.99.00.01", bus=bus) for i, bus in enumerate(listed))
    inventory = build_inventory(facts, STATUS, states, "1.2.3", expected)
    assert inventory.to_json()["gpus_other_driver"] == {"0000:3a:00.0": "vfio-pci"}
    finding = to_finding(
        "gpu_count",
        None,
        check_gpu_count(InventoryView(inventory, InventoryExpected(gpus=expected))),
    )
    assert finding.severity is severity
    assert reason_has in finding.reason
    assert finding.evidence_dict()["pci_other_driver"] == "0000:3a:00.0 vfio-pci"


def test_status_and_metrics_show_the_gpus_other_drivers_hold(tmp_path: Path) -> None:
    root = _passthrough_tree(tmp_path)
    facts = collect_host(root / "sys", root / "proc", root / "os-release", ("nvidia",))
    states = (_state(0, "96.00.99.00.01", bus="0000:18:00.0"),)
    inventory = build_inventory(facts, STATUS, states, "1.2.3")
    doc = {
        "taken_at": 0.0,
        "node": {"name": "n", "cluster": "c", "health": "OK", "inventory": inventory.to_json()},
        "gpus": [],
    }
    assert "GPUs: NVML 1, PCI 3 (1 on vfio-pci)  NVSwitches 1" in render_status(doc, now=0.0)
    seen = {labels["source"]: value for labels, value in _families(inventory)["gpuagent_gpus_seen"]}
    assert seen == {"nvml": 1.0, "pci": 3.0, "pci_other_driver": 1.0}


def _library(directory: Path, target: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / target).touch()
    (directory / "libnvidia-ml.so.1").symlink_to(target)


def test_library_version_from_the_installed_library_file(tmp_path: Path) -> None:
    root = hgx_tree(tmp_path)
    # The first directory has no NVML library; the second one has it, as a driver installs it.
    lib64, multiarch = tmp_path / "usr" / "lib64", tmp_path / "usr" / "lib" / "x86_64-linux-gnu"
    _library(multiarch, "libnvidia-ml.so.550.54.15")
    facts = collect_host(
        root / "sys",
        root / "proc",
        root / "os-release",
        ("nvidia",),
        library_dirs=(lib64, multiarch),
    )
    assert facts.library_version == "550.54.15"


@pytest.mark.parametrize(
    "layout", ["no-library", "not-a-link", "unversioned-target", "loop", "dangling"]
)
def test_library_version_unknown_without_a_versioned_link(tmp_path: Path, layout: str) -> None:
    lib = tmp_path / "lib"
    lib.mkdir()
    link = lib / "libnvidia-ml.so.1"
    if layout == "not-a-link":
        link.touch()
    elif layout == "unversioned-target":
        _library(lib, "libnvidia-ml.so")
    elif layout == "loop":
        link.symlink_to(link.name)
    elif layout == "dangling":
        link.symlink_to("libnvidia-ml.so.550.54.15")  # the file itself is gone
    assert read_library_version((lib,)) is None


def test_no_gpus_on_a_readable_bus_is_an_empty_tuple(tmp_path: Path) -> None:
    (tmp_path / "bus" / "pci" / "devices").mkdir(parents=True)
    assert read_pci_functions(tmp_path) == ()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('PRETTY_NAME="Ubuntu 22.04.4 LTS"\n', "Ubuntu 22.04.4 LTS"),
        ('NAME="Rocky Linux"\nVERSION="9.3 (Blue Onyx)"\n', "Rocky Linux 9.3 (Blue Onyx)"),
        ("# comment\nPRETTY_NAME='single quoted'\n", "single quoted"),
        ('PRETTY_NAME="unbalanced\nNAME=x\n', "x"),
        ("ID=debian\n", None),
    ],
)
def test_os_release(tmp_path: Path, text: str, expected: str | None) -> None:
    path = tmp_path / "os-release"
    path.write_text(text)
    assert read_os_release(path) == expected


# --- services ------------------------------------------------------------------------------

SHOW = (
    "Id=nvidia-persistenced.service\nLoadState=loaded\nActiveState=failed\nNRestarts=4\n\n"
    "Id=nvidia-fabricmanager.service\nLoadState=not-found\nActiveState=inactive\n\n"
    "Id=nvidia-imex.service\nLoadState=loaded\nActiveState=active\nNRestarts=0\n"
)
MASKED = "Id=nvidia-persistenced.service\nLoadState=masked\nActiveState=inactive\n"


def test_parse_show() -> None:
    names = ("nvidia-persistenced", "nvidia-fabricmanager", "nvidia-imex", "extra")
    assert parse_show(SHOW, names) == (
        Service("nvidia-persistenced", "failed", restarts=4),
        Service("nvidia-fabricmanager", "not_installed"),
        Service("nvidia-imex", "active", restarts=0),
        Service("extra", "unknown"),
    )
    assert parse_show(MASKED, names[:1]) == (Service("nvidia-persistenced", "masked"),)


def _fake_systemctl(tmp_path: Path, body: str) -> str:
    script = tmp_path / "systemctl"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def test_read_services_runs_systemctl_show(tmp_path: Path) -> None:
    output = tmp_path / "out.txt"
    output.write_text(SHOW)
    args = tmp_path / "args.txt"
    systemctl = _fake_systemctl(tmp_path, f'echo "$@" > {args}\ncat {output}')
    services = asyncio.run(read_services(systemctl, runtime_dir=tmp_path))
    assert [s.state for s in services] == ["failed", "not_installed", "active"]
    assert args.read_text().split() == [
        "show",
        "--property=Id,LoadState,ActiveState,NRestarts",
        "--",
        "nvidia-persistenced.service",
        "nvidia-fabricmanager.service",
        "nvidia-imex.service",
    ]


@pytest.mark.parametrize(
    "case", ["no-systemd", "missing-command", "fails", "hangs"], ids=lambda c: c
)
def test_services_are_unknown_when_systemd_cannot_tell(tmp_path: Path, case: str) -> None:
    runtime = tmp_path if case != "no-systemd" else tmp_path / "not-there"
    systemctl = {
        "no-systemd": "systemctl",
        "missing-command": str(tmp_path / "nope"),
        "fails": _fake_systemctl(tmp_path, "exit 1"),
        "hangs": _fake_systemctl(tmp_path, "exec sleep 5"),
    }[case]
    services = asyncio.run(read_services(systemctl, runtime_dir=runtime, limit_seconds=0.2))
    assert {s.state for s in services} == {"unknown"}


@pytest.mark.parametrize(
    ("body", "readiness"),
    [
        ('[ "$1" = -q ] && echo READY', "READY"),
        ("echo '  NOT READY  '", "NOT READY"),  # whatever else it says, in one line
        ("echo 'Failed to connect to the command service' >&2; exit 1", None),
        ("exec sleep 5", None),
    ],
    ids=["ready", "not-ready", "no-command-service", "hangs"],
)
def test_the_imex_daemon_is_asked_whether_it_is_ready(
    tmp_path: Path, body: str, readiness: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    imex_ctl = _fake_systemctl(tmp_path, body)
    asker = ImexReadiness(imex_ctl, limit_seconds=0.3)
    running = (Service("nvidia-persistenced", "active"), Service("nvidia-imex", "active"))
    for _ in range(3):
        services = asyncio.run(asker.add_to(running))
    assert [s.readiness for s in services] == [None, readiness]
    # No answer is said once, not at every probe.
    assert len([r for r in caplog.records if "IMEX readiness unknown" in r.message]) == (
        1 if readiness is None else 0
    )


def test_a_stopped_imex_daemon_is_not_asked(tmp_path: Path) -> None:
    asked = tmp_path / "asked"
    asker = ImexReadiness(_fake_systemctl(tmp_path, f"touch {asked}; echo READY"))
    services = (Service("nvidia-imex", "failed"),)
    assert asyncio.run(asker.add_to(services)) == services
    assert not asked.exists()


# --- baseline ------------------------------------------------------------------------------


def test_baseline_round_trip_and_atomic_write(tmp_path: Path) -> None:
    path = tmp_path / "state" / "inventory-baseline.json"
    assert load_baseline(path) is None
    baseline = Baseline(
        {"driver": "550.54.15", "kernel": "6.1"},
        gpus=8,
        nvswitches=4,
        models="NVIDIA H100 80GB HBM3",
        modules=("nvidia", "nvidia_uvm"),
        settings=(
            LearnedSettings(0, persistence=False, power_limit_w=650.0, compute_mode="default"),
            LearnedSettings(1, persistence=True, applications_clock_mhz=1755),
        ),
    )
    save_baseline(path, baseline, 1000.0)
    assert load_baseline(path) == baseline
    assert json.loads(path.read_text())["learned_at"] == 1000.0
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary left


def test_baseline_written_before_the_node_fields_is_read_as_unknown(tmp_path: Path) -> None:
    path = tmp_path / "inventory-baseline.json"
    path.write_text('{"learned_at": 1000.0, "fingerprint": {"driver": "550.54.15"}}')
    assert load_baseline(path) == Baseline({"driver": "550.54.15"})


@pytest.mark.parametrize(
    "fields",
    [
        '"gpus": -1, "nvswitches": true, "models": "", "modules": "nvidia"',
        '"gpus": "8", "nvswitches": 1.5, "models": 3, "modules": [1]',
    ],
)
def test_baseline_node_fields_of_the_wrong_type_are_unknown(tmp_path: Path, fields: str) -> None:
    path = tmp_path / "inventory-baseline.json"
    path.write_text(f'{{"fingerprint": {{"driver": "550.54.15"}}, {fields}}}')
    assert load_baseline(path) == Baseline({"driver": "550.54.15"})


def test_learned_settings_of_the_wrong_type_are_unknown(tmp_path: Path) -> None:
    path = tmp_path / "inventory-baseline.json"
    entries = (
        '{"index": 0, "persistence": 1, "power_limit_w": true, "compute_mode": 3}, '
        '{"index": -1, "persistence": true}, "gpu 2", '
        '{"index": 3, "power_limit_w": 700, "applications_clock_mhz": 1.5}'
    )
    path.write_text(f'{{"fingerprint": {{"driver": "550.54.15"}}, "settings": [{entries}]}}')
    loaded = load_baseline(path)
    assert loaded is not None
    assert loaded.settings == (LearnedSettings(0), LearnedSettings(3, power_limit_w=700.0))


@pytest.mark.parametrize("text", ["{", "[]", '{"fingerprint": {"driver": 1}}', "{}"])
def test_damaged_baseline_is_ignored(tmp_path: Path, text: str) -> None:
    path = tmp_path / "inventory-baseline.json"
    path.write_text(text)
    assert load_baseline(path) is None


def test_learn_records_the_fingerprint_gpus_switches_models_and_modules() -> None:
    host = dataclasses.replace(
        HOST,
        pci=(*(HOST.pci or ()), PciFunction("0000:05:00.0", "nvswitch", 0x22A3, "nvidia")),
        modules=(("nvidia", True), ("nvidia_peermem", False), ("nvidia_uvm", True)),
    )
    inventory = build_inventory(host, STATUS, (_state(0, "96.00.99.00.01"),), "1.2.3")
    assert learn(inventory) == Baseline(
        fingerprint(inventory),
        gpus=1,
        nvswitches=1,
        models="NVIDIA H100 80GB HBM3",
        modules=("nvidia", "nvidia_uvm"),
        # What the GPU answered: its settings are expected to stay (ECC and MIG have
        # expectations of their own).
        settings=(
            LearnedSettings(
                0, persistence=True, power_limit_w=650.0, applications_clock_mhz=1980,
                compute_mode="default",
            ),
        ),
    )  # fmt: skip
    unread = dataclasses.replace(host, pci=None, modules=(("nvidia", None),))
    blind = learn(build_inventory(unread, STATUS, (_state(0, "96.00.99.00.01"),), "1.2.3"))
    assert (blind.gpus, blind.nvswitches, blind.modules) == (1, None, None)  # NVML's count


# --- building, fingerprint, JSON -------------------------------------------------------------

HOST = HostFacts(
    pci=(PciFunction("0000:18:00.0", "gpu", 0x2330, "nvidia"),),
    modules=(("nvidia", True),),
    module_version="550.54.15",
    kernel_release="6.1.0-18-amd64",
    os_release="Debian GNU/Linux 12 (bookworm)",
    services=(Service("nvidia-persistenced", "active", restarts=2),),
)
STATUS = NvmlStatus(
    ok=True, driver_version="550.54.15", nvml_version="12.550.54.15", cuda_driver_version="12.4"
)


def _state(index: int, vbios: str, *, status: str = "ok", bus: str | None = None) -> GpuState:
    identity = GpuIdentity(
        index=index,
        pci_bus_id=bus or f"0000:{0x18 + index:02x}:00.0",
        uuid=f"GPU-{index}",
        name="NVIDIA H100 80GB HBM3",
        vbios_version=vbios,
        gsp_firmware_version="550.54.15",
        applications_clock_default_mhz=1980,
    )
    readings = GpuReadings(
        ecc_enabled=True,
        ecc_enabled_pending=False,
        persistence_mode=True,
        power_limit_w=650.0,
        power_requested_limit_w=650.0,
        applications_clock_mhz=1980,
        compute_mode="default",
        clock_event_reasons=0x2,
        fabric_state="completed",
        fabric_ok=True,
    )
    if status != "ok":
        return GpuState(identity, "lost")
    return GpuState(identity, "ok", readings)


def test_build_inventory_takes_modes_only_from_answering_gpus() -> None:
    states = (_state(0, "96.00.99.00.01"), _state(1, "96.00.99.00.01", status="lost"))
    inventory = build_inventory(HOST, STATUS, states, "1.2.3", expected_gpus=8)
    first, lost = inventory.gpus
    assert (first.ecc_current, first.ecc_pending, first.clocks_set_by_user) == (True, False, True)
    assert (first.fabric_state, first.fabric_ok) == ("completed", True)
    assert (lost.ecc_current, lost.fabric_state) == (None, None)
    assert lost.vbios_version == "96.00.99.00.01"  # identity outlives the readings
    assert inventory.nvml_library_version == "550.54.15"
    assert inventory.expected_gpus == 8


def test_fingerprint_is_order_free_and_its_hash_stable() -> None:
    a = build_inventory(
        HOST, STATUS, (_state(0, "96.00.99.00.01"), _state(1, "96.00.74.00.01")), "1.2.3"
    )
    b = build_inventory(
        HOST, STATUS, (_state(0, "96.00.74.00.01"), _state(1, "96.00.99.00.01")), "1.2.3"
    )
    print_ = fingerprint(a)
    assert print_ == {
        "driver": "550.54.15",
        "cuda": "12.4",
        "kernel": "6.1.0-18-amd64",
        "vbios": "96.00.74.00.01,96.00.99.00.01",
        "gsp_firmware": "550.54.15",
        "agent": "1.2.3",
    }
    assert fingerprint(b) == print_
    digest = fingerprint_hash(print_)
    assert len(digest) == 12
    assert fingerprint_hash(dict(reversed(print_.items()))) == digest
    assert fingerprint_hash({**print_, "kernel": "6.1.0-21-amd64"}) != digest


def test_inventory_json_carries_fingerprint_and_hash() -> None:
    inventory = build_inventory(HOST, STATUS, (_state(0, "96.00.99.00.01"),), "1.2.3")
    doc = inventory.to_json()
    assert doc["fingerprint"] == fingerprint(inventory)
    assert doc["fingerprint_id"] == fingerprint_hash(fingerprint(inventory))
    assert doc["pci"] == [
        {"address": "0000:18:00.0", "role": "gpu", "device_id": "0x2330", "driver": "nvidia"}
    ]
    assert doc["modules"] == {"nvidia": True}
    assert doc["services"] == {"nvidia-persistenced": "active"}
    assert doc["gpus"][0]["ecc"] == {"current": True, "pending": False}
    assert json.loads(json.dumps(doc)) == doc


# --- metrics -------------------------------------------------------------------------------


def _families(inventory: NodeInventory | None) -> dict[str, list[tuple[dict[str, str], float]]]:
    def labels(bus_id: str) -> tuple[str, ...]:
        return ("0", "GPU-0", bus_id, "nvidia0", "H100", "host")

    return {
        family.name: [(s.labels, s.value) for s in family.samples]
        for family in inventory_families(inventory, labels)
    }


def test_inventory_metrics() -> None:
    inventory = build_inventory(HOST, STATUS, (_state(0, "96.00.99.00.01"),), "1.2.3", 8)
    found = _families(inventory)
    ((node_labels, node_value),) = found["gpuagent_node_info"]
    assert node_value == 1.0
    assert node_labels["fingerprint"] == fingerprint_hash(fingerprint(inventory))
    assert node_labels["module_version"] == "550.54.15"
    ((gpu_labels, _),) = found["gpuagent_gpu_inventory_info"]
    assert gpu_labels["vbios_version"] == "96.00.99.00.01"
    assert gpu_labels["gsp_firmware_version"] == "550.54.15"
    assert found["gpuagent_gpus_expected"] == [({}, 8.0)]
    assert found["gpuagent_gpus_seen"] == [
        ({"source": "nvml"}, 1.0),
        ({"source": "pci"}, 1.0),
        ({"source": "pci_other_driver"}, 0.0),
    ]
    assert found["gpuagent_kernel_module_loaded"] == [({"module": "nvidia"}, 1.0)]
    assert found["gpuagent_service_state"] == [
        ({"service": "nvidia-persistenced", "state": "active"}, 1.0)
    ]
    assert found["gpuagent_service_restarts"] == [({"service": "nvidia-persistenced"}, 2.0)]


def test_inventory_metrics_leave_out_what_is_not_known() -> None:
    host = HostFacts(pci=None, modules=(("nvidia", None), ("nvidia_uvm", None)))
    inventory = build_inventory(host, NvmlStatus(ok=False), (), "1.2.3")
    found = _families(inventory)
    assert found["gpuagent_gpus_expected"] == []
    assert found["gpuagent_gpus_seen"] == []
    assert found["gpuagent_nvswitches_seen"] == []
    assert found["gpuagent_kernel_module_loaded"] == []
    assert _families(None) == {}


def test_installed_kernels_are_exported_with_the_newest_and_running_marked() -> None:
    host = dataclasses.replace(
        HOST,
        kernel_release="6.1.0-18-amd64",
        kernels=(
            KernelModuleState("6.1.0-18-amd64", has_nvidia=True),
            KernelModuleState("6.1.0-21-amd64", has_nvidia=None),
            KernelModuleState("6.1.0-28-amd64", has_nvidia=False),
        ),
    )
    found = _families(build_inventory(host, STATUS, (), "1.2.3"))
    assert found["gpuagent_kernel_nvidia_module_installed"] == [
        ({"kernel": "6.1.0-18-amd64", "newest": "false", "running": "true"}, 1.0),
        ({"kernel": "6.1.0-28-amd64", "newest": "true", "running": "false"}, 0.0),
    ]


@pytest.mark.parametrize(
    ("text", "key", "line"),
    [
        ("[inventory]\nrefresh_seconds = 0\n", "inventory.refresh_seconds", 2),
        ("[inventory.expected]\n\ngpus = -1\n", "inventory.expected.gpus", 3),
        ("[inventory.expected]\nmodules = 'nvidia'\n", "inventory.expected.modules", 2),
        ("[inventory]\nlern = true\n", "inventory.lern", 2),
        (
            "[inventory.expected]\nmig_profiles = ['1g.10gb', '3g40gb']\n",
            "inventory.expected.mig_profiles",
            2,
        ),
        ("[inventory.expected]\npersistence = true\n", "inventory.expected.persistence", 2),
        (
            "[[inventory.expected.gpu]]\nindex = 0\nmig_profiles = ['1g.10gb', '3g40gb']\n",
            "inventory.expected.gpu.mig_profiles",
            3,
        ),
        ("[[inventory.expected.gpu]]\nindex = -1\n", "inventory.expected.gpu.index", 2),
        ("[[inventory.expected.gpu]]\nmig_mode = 'enabled'\n", "inventory.expected.gpu.index", 1),
        (
            "[[inventory.expected.gpu]]\nindex = 0\nmig_mode = 'on'\n",
            "inventory.expected.gpu.mig_mode",
            3,
        ),
        # The same GPU twice: the second entry is named.
        (
            (
                "[[inventory.expected.gpu]]\nindex = 2\n[[inventory.expected.gpu]]\nindex = 3\n"
                "[[inventory.expected.gpu]]\nindex = 2\n"
            ),
            "inventory.expected.gpu.index",
            6,
        ),
        # Instances on a GPU expected to have MIG off.
        (
            (
                "[[inventory.expected.gpu]]\nindex = 5\nmig_mode = 'disabled'\n"
                "mig_profiles = ['7g.80gb']\n"
            ),
            "inventory.expected.gpu.mig_profiles",
            2,
        ),
        (
            "[inventory.expected]\ncompute_mode = 'exclusive'\n",
            "inventory.expected.compute_mode",
            2,
        ),
    ],
)
def test_inventory_config_errors_name_key_and_line(text: str, key: str, line: int) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(text)
    assert (info.value.key, info.value.line) == (key, line)


def test_inventory_expectations_are_read() -> None:
    config = parse_config(
        "[inventory.expected]\npersistence = 'disabled'\ncompute_mode = 'exclusive_process'\n"
        "applications_clocks = 'default'\nmig_profiles = ['1g.10gb', '1g.10gb+me', '3g.40gb']\n"
    )
    expected = config.inventory.expected
    assert (expected.persistence, expected.compute_mode, expected.applications_clocks) == (
        "disabled",
        "exclusive_process",
        "default",
    )
    assert expected.mig_profiles == ["1g.10gb", "1g.10gb+me", "3g.40gb"]


def test_per_gpu_mig_expectations_override_the_node_wide_ones() -> None:
    expected = parse_config(
        "[inventory.expected]\nmig_profiles = ['1g.10gb', '3g.40gb']\n"
        "[[inventory.expected.gpu]]\nindex = 0\nmig_profiles = ['7g.80gb']\n"
        "[[inventory.expected.gpu]]\nindex = 1\nmig_profiles = []\n"
        "[[inventory.expected.gpu]]\nindex = 2\nmig_mode = 'enabled'\n"
    ).inventory.expected
    assert expected.mig_profiles_for(0) == ["7g.80gb"]
    assert expected.mig_profiles_for(1) == []  # exempt
    assert expected.mig_profiles_for(2) == ["1g.10gb", "3g.40gb"]  # mode only: inherits
    assert expected.mig_profiles_for(7) == ["1g.10gb", "3g.40gb"]
    assert [g.mig_mode for g in expected.gpu] == [None, None, "enabled"]
