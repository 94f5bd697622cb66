"""Inventory checks: tables of node inventories and what each check makes of them."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from gpuagent.checks import (
    INVENTORY_CHECK_NAMES,
    INVENTORY_NODE_CHECK_NAMES,
    NODE_CHECK_NAMES,
    HealthMemory,
    InventoryView,
    evaluate,
)
from gpuagent.checks.common import Outcome, SinceBoot, to_finding
from gpuagent.checks.daemons import check_fabric, check_services
from gpuagent.checks.inventory import (
    check_drift,
    check_driver,
    check_firmware,
    check_gpu_count,
    check_mig_layout,
    layout_text,
    version_matches,
)
from gpuagent.config import ChecksSection, ExpectedGpu, InventoryExpected
from gpuagent.inventory.baseline import Baseline, learn
from gpuagent.inventory.model import (
    GpuInventory,
    HostFacts,
    NodeInventory,
    PciFunction,
    Service,
    ServiceState,
    fingerprint,
)
from gpuagent.model import (
    Finding,
    GpuIdentity,
    GpuReadings,
    GpuState,
    NvmlStatus,
    Severity,
)

CHECKS = ChecksSection()
BUSES = ("0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0")
DRIVER = "550.54.15"


def gpu(index: int, **changes: Any) -> GpuInventory:
    base = GpuInventory(
        index=index,
        pci_bus_id=BUSES[index],
        uuid=f"GPU-{index}",
        model="NVIDIA H100 80GB HBM3",
        vbios_version="96.00.99.00.01",
        gsp_firmware_version=DRIVER,
        ecc_current=True,
        ecc_pending=True,
        power_limit_w=700.0,
        power_default_limit_w=700.0,
        applications_clock_mhz=1980,
        applications_clock_default_mhz=1980,
        clocks_set_by_user=False,
    )
    return dataclasses.replace(base, **changes)


def pci_gpu(bus: str, driver: str | None = "nvidia") -> PciFunction:
    return PciFunction(bus, "gpu", 0x2330, driver)


def switch(n: int) -> PciFunction:
    return PciFunction(f"0000:0{5 + n}:00.0", "nvswitch", 0x22A3, "nvidia")


def host(**changes: Any) -> HostFacts:
    base = HostFacts(
        pci=tuple(pci_gpu(b) for b in BUSES),
        modules=(("nvidia", True), ("nvidia_uvm", True), ("nvidia_peermem", False)),
        module_version=DRIVER,
        library_version=DRIVER,
        kernel_release="6.1.0-18-amd64",
        os_release="Debian GNU/Linux 12 (bookworm)",
        services=(
            Service("nvidia-persistenced", "active"),
            Service("nvidia-fabricmanager", "not_installed"),
        ),
    )
    return dataclasses.replace(base, **changes)


def node(
    gpus: tuple[GpuInventory, ...] | None = None, *, nvml_ok: bool = True, **host_changes: Any
) -> NodeInventory:
    return NodeInventory(
        host=host(**host_changes),
        agent_version="0.1.0",
        nvml_ok=nvml_ok,
        driver_version=DRIVER if nvml_ok else None,
        nvml_version=f"12.{DRIVER}" if nvml_ok else None,
        cuda_driver_version="12.4" if nvml_ok else None,
        gpus=(tuple(gpu(i) for i in range(4)) if gpus is None else gpus) if nvml_ok else (),
    )


def expect(**values: Any) -> InventoryExpected:
    return InventoryExpected(**values)


def on(expected: InventoryExpected) -> InventoryView:
    """What a per-GPU inventory check sees: a node with these expectations."""
    return InventoryView(node(), expected)


def verdict(outcome: Outcome) -> tuple[Severity, str, str]:
    finding = to_finding("x", None, outcome)
    return finding.severity, finding.runbook, finding.reason


BASELINE = learn(node())
# A baseline file written before the GPU count, models, switches and modules were kept.
OLD_BASELINE = Baseline(fingerprint(node()))


# --- gpu_count -----------------------------------------------------------------------------

# Two GPUs for the host (NVML lists them), two passed through to virtual machines.
PASSTHROUGH = (*(pci_gpu(b) for b in BUSES[:2]), *(pci_gpu(b, "vfio-pci") for b in BUSES[2:]))


@pytest.mark.parametrize(
    ("inventory", "expected", "severity", "runbooks", "reason_has"),
    [
        pytest.param(node(), 0, Severity.OK, "", "4 GPUs", id="all-there-no-expectation"),
        pytest.param(node(), 4, Severity.OK, "", "4 GPUs, 4 expected", id="all-there"),
        pytest.param(
            node(pci=(*(pci_gpu(b) for b in BUSES), pci_gpu("0000:9a:00.0", None))),
            0,
            Severity.CRITICAL,
            "node-gpu-missing-driver",
            "on the PCI bus but not in NVML (0000:9a:00.0)",
            id="pci-only",
        ),
        pytest.param(
            node(gpus=(gpu(0), gpu(1), gpu(2))),
            4,
            Severity.CRITICAL,
            "node-gpu-missing-driver",
            "0000:5d:00.0",
            id="nvml-lost-one-pci-still-has-it",
        ),
        pytest.param(
            node(gpus=(gpu(0), gpu(1), gpu(2)), pci=tuple(pci_gpu(b) for b in BUSES[:3])),
            4,
            Severity.CRITICAL,
            "node-gpu-missing-pci",
            "1 of 4 expected GPUs missing: 3 on the PCI bus",
            id="gone-from-pci",
        ),
        pytest.param(
            node(gpus=(gpu(0), gpu(1)), pci=None),
            4,
            Severity.CRITICAL,
            "node-gpu-missing-pci",
            "2 of 4 expected GPUs missing: 2 in NVML",
            id="no-sysfs-falls-back-on-nvml",
        ),
        pytest.param(
            node(gpus=(gpu(0), gpu(1), gpu(2), gpu(3, pci_bus_id="unknown-3"))),
            4,
            Severity.OK,
            "",
            "4 GPUs, 4 expected",
            id="unidentified-nvml-gpu-may-be-the-pci-one",
        ),
        pytest.param(
            node(nvml_ok=False),
            4,
            Severity.OK,
            "",
            "4 GPUs, 4 expected",
            id="nvml-down-pci-complete",
        ),
        pytest.param(
            node(nvml_ok=False, pci=tuple(pci_gpu(b) for b in BUSES[:2])),
            4,
            Severity.CRITICAL,
            "node-gpu-missing-pci",
            "2 on the PCI bus",
            id="nvml-down-pci-short",
        ),
        pytest.param(
            node(nvml_ok=False, pci=None),
            4,
            Severity.OK,
            "",
            "GPU count not reported, 4 expected",
            id="nothing-to-count",
        ),
        pytest.param(
            node(gpus=(gpu(0), gpu(1)), pci=PASSTHROUGH),
            4,
            Severity.OK,
            "",
            "2 GPUs and 2 bound to vfio-pci, 4 expected",
            id="passed-through-gpus-are-there",
        ),
        pytest.param(
            node(nvml_ok=False, pci=PASSTHROUGH),
            4,
            Severity.OK,
            "",
            "2 GPUs and 2 bound to vfio-pci, 4 expected",
            id="passed-through-gpus-nvml-down",
        ),
        pytest.param(
            node(gpus=(gpu(0),), pci=(*PASSTHROUGH[:2], pci_gpu(BUSES[2], "vfio-pci"))),
            4,
            Severity.CRITICAL,
            "node-gpu-missing-driver",
            "1 GPU on the PCI bus but not in NVML (0000:2a:00.0)",
            id="unbound-gpu-beside-a-passed-through-one",
        ),
        pytest.param(
            node(gpus=(gpu(0), gpu(1)), pci=PASSTHROUGH[:3]),
            4,
            Severity.CRITICAL,
            "node-gpu-missing-pci",
            "1 of 4 expected GPUs missing: 3 on the PCI bus",
            id="passed-through-and-one-gone-from-pci",
        ),
        pytest.param(
            node(gpus=(gpu(0), gpu(1)), pci=(*PASSTHROUGH[:3], pci_gpu(BUSES[3], "unknown"))),
            4,
            Severity.OK,
            "",
            "2 GPUs and 2 bound to unknown, vfio-pci",
            id="driver-link-unreadable-is-not-missing",
        ),
    ],
)
def test_gpu_count(
    inventory: NodeInventory, expected: int, severity: Severity, runbooks: str, reason_has: str
) -> None:
    found, runbook, reason = verdict(
        check_gpu_count(InventoryView(inventory, expect(gpus=expected)))
    )
    assert (found, runbook) == (severity, runbooks)
    assert reason_has in reason


@pytest.mark.parametrize(
    ("inventory", "expected", "baseline", "severity", "runbook", "reason_has"),
    [
        pytest.param(
            node(),
            0,
            BASELINE,
            Severity.OK,
            "",
            "4 GPUs, 4 in the learned baseline",
            id="as-learned",
        ),
        pytest.param(
            node(gpus=(gpu(0), gpu(1), gpu(2)), pci=tuple(pci_gpu(b) for b in BUSES[:3])),
            0,
            BASELINE,
            Severity.CRITICAL,
            "node-gpu-missing-pci",
            "1 of 4 GPUs of the learned baseline missing: 3 on the PCI bus",
            id="gone-from-pci-and-nvml",
        ),
        pytest.param(
            node(gpus=(gpu(0), gpu(1), gpu(2))),
            0,
            BASELINE,
            Severity.CRITICAL,
            "node-gpu-missing-driver",
            "1 GPU on the PCI bus but not in NVML (0000:5d:00.0)",
            id="on-pci-not-in-nvml",
        ),
        pytest.param(
            node(gpus=(gpu(0), gpu(1)), pci=None),
            0,
            BASELINE,
            Severity.CRITICAL,
            "node-gpu-missing-pci",
            "2 of 4 GPUs of the learned baseline missing: 2 in NVML",
            id="no-sysfs-nvml-short",
        ),
        pytest.param(
            node(gpus=(gpu(0), gpu(1), gpu(2)), pci=tuple(pci_gpu(b) for b in BUSES[:3])),
            3,
            BASELINE,
            Severity.OK,
            "",
            "3 GPUs, 3 expected",
            id="configured-count-wins",
        ),
        pytest.param(
            node(gpus=(gpu(0), gpu(1), gpu(2)), pci=tuple(pci_gpu(b) for b in BUSES[:3])),
            0,
            OLD_BASELINE,
            Severity.OK,
            "",
            "3 GPUs",
            id="old-baseline-without-a-count",
        ),
    ],
)
def test_gpu_count_against_the_baseline(
    inventory: NodeInventory,
    expected: int,
    baseline: Baseline,
    severity: Severity,
    runbook: str,
    reason_has: str,
) -> None:
    outcome = check_gpu_count(InventoryView(inventory, expect(gpus=expected), baseline))
    assert verdict(outcome)[:2] == (severity, runbook)
    assert reason_has in verdict(outcome)[2]


def test_gpu_count_names_both_cases_worst_first() -> None:
    inventory = node(
        gpus=(gpu(0), gpu(1)), pci=(pci_gpu(BUSES[0]), pci_gpu(BUSES[1]), pci_gpu(BUSES[2]))
    )
    finding = to_finding(
        "gpu_count", None, check_gpu_count(InventoryView(inventory, expect(gpus=4)))
    )
    assert finding.reason.count("; ") == 1
    assert "0000:3a:00.0" in finding.reason
    assert "1 of 4 expected GPUs missing" in finding.reason
    assert finding.evidence_dict()["gpus_pci"] == 3


# --- driver --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "modules", "severity", "action", "reason_has"),
    [
        pytest.param({}, ["nvidia"], Severity.OK, "none", f"kernel module {DRIVER}", id="ok"),
        pytest.param(
            {"module_version": "535.104.05"},
            ["nvidia"],
            Severity.CRITICAL,
            "reboot",
            "driver/library mismatch: kernel module 535.104.05, NVML library 550.54.15",
            id="mismatch",
        ),
        pytest.param(
            {"modules": (("nvidia", False),), "module_version": None},
            ["nvidia"],
            Severity.CRITICAL,
            "load_driver",
            "kernel module not loaded: nvidia",
            id="not-loaded",
        ),
        pytest.param(
            {},
            ["nvidia", "nvidia_uvm", "nvidia_peermem"],
            Severity.CRITICAL,
            "load_driver",
            "kernel module not loaded: nvidia_peermem",
            id="peermem-expected",
        ),
        pytest.param(
            {"module_version": None},
            ["nvidia"],
            Severity.OK,
            "none",
            "version not reported",
            id="version-unknown",
        ),
        pytest.param(
            {"modules": (("nvidia", None), ("nvidia_peermem", None)), "module_version": None},
            ["nvidia", "nvidia_peermem"],
            Severity.OK,
            "none",
            "kernel modules not reported (/sys/module cannot be read)",
            id="sys-module-unreadable",
        ),
    ],
)
def test_driver(
    changes: dict[str, Any], modules: list[str], severity: Severity, action: str, reason_has: str
) -> None:
    outcome = check_driver(InventoryView(node(**changes), expect(modules=modules)))
    finding = to_finding("driver", None, outcome)
    assert (finding.severity, finding.action) == (severity, action)
    assert finding.runbook == ("node-driver-module" if severity is Severity.CRITICAL else "")
    assert reason_has in finding.reason


@pytest.mark.parametrize(
    ("nvml_ok", "module", "installed", "severity", "reason_has"),
    [
        pytest.param(
            False,
            "535.104.05",
            DRIVER,
            Severity.CRITICAL,
            "driver/library mismatch: kernel module 535.104.05, NVML library 550.54.15",
            id="nvml-down-installed-library-differs",
        ),
        pytest.param(
            False, DRIVER, DRIVER, Severity.OK, f"kernel module {DRIVER}", id="nvml-down-agree"
        ),
        pytest.param(
            False,
            "535.104.05",
            None,
            Severity.OK,
            "kernel module 535.104.05",
            id="nvml-down-no-library-file-left-to-the-nvml-check",
        ),
        pytest.param(
            True,
            DRIVER,
            "535.104.05",
            Severity.OK,
            f"kernel module {DRIVER}",
            id="nvml-running-its-version-wins",
        ),
    ],
)
def test_driver_against_the_installed_library(
    nvml_ok: bool, module: str, installed: str | None, severity: Severity, reason_has: str
) -> None:
    inventory = node(nvml_ok=nvml_ok, module_version=module, library_version=installed)
    finding = to_finding("driver", None, check_driver(InventoryView(inventory, expect())))
    assert finding.severity is severity
    assert finding.runbook == ("node-driver-module" if severity is Severity.CRITICAL else "")
    assert reason_has in finding.reason
    assert finding.evidence_dict()["installed_library_version"] == installed


# --- firmware ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gsp", "severity", "reason_has"),
    [
        pytest.param((DRIVER,) * 4, Severity.OK, "GSP firmware 550.54.15 on 4 GPUs", id="ok"),
        pytest.param((None,) * 4, Severity.OK, "not reported", id="no-gsp"),
        pytest.param(
            (DRIVER, "535.104.05", DRIVER, None),
            Severity.WARN,
            "GPU 1 535.104.05",
            id="one-differs",
        ),
    ],
)
def test_firmware(gsp: tuple[str | None, ...], severity: Severity, reason_has: str) -> None:
    gpus = tuple(gpu(i, gsp_firmware_version=v) for i, v in enumerate(gsp))
    found, runbook, reason = verdict(check_firmware(InventoryView(node(gpus), expect())))
    assert found is severity
    assert runbook == ("node-gsp-firmware-mismatch" if severity is Severity.WARN else "")
    assert reason_has in reason


# --- services ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "severity"),
    [
        ("active", Severity.OK),
        ("activating", Severity.OK),
        ("not_installed", Severity.OK),
        ("masked", Severity.OK),
        ("unknown", Severity.OK),
        ("inactive", Severity.WARN),
        ("failed", Severity.WARN),
        ("deactivating", Severity.WARN),
    ],
)
def test_services_persistenced(state: ServiceState, severity: Severity) -> None:
    services = (Service("nvidia-persistenced", state),)
    found, runbook, _ = verdict(check_services(InventoryView(node(services=services), expect())))
    assert found is severity
    assert runbook == ("node-persistenced-down" if severity is Severity.WARN else "")


# --- fabric --------------------------------------------------------------------------------

SWITCHES = tuple(switch(n) for n in range(4))


def fabric_node(manager: ServiceState, *states: tuple[str | None, bool | None]) -> NodeInventory:
    gpus = tuple(gpu(i, fabric_state=state, fabric_ok=ok) for i, (state, ok) in enumerate(states))
    services = (Service("nvidia-fabricmanager", manager),)
    pci = (*SWITCHES, *(pci_gpu(b) for b in BUSES[: len(gpus)]))
    return node(gpus, services=services, pci=pci)


@pytest.mark.parametrize(
    ("inventory", "severity", "reason_has"),
    [
        pytest.param(node(), Severity.OK, "no NVSwitch fabric", id="no-switches"),
        pytest.param(
            fabric_node("active", ("completed", True), ("completed", True)),
            Severity.OK,
            "NVSwitch fabric up (4 NVSwitches, nvidia-fabricmanager active)",
            id="healthy",
        ),
        pytest.param(
            fabric_node("failed", ("completed", True)),
            Severity.CRITICAL,
            "nvidia-fabricmanager is failed on an NVSwitch system",
            id="manager-failed",
        ),
        pytest.param(
            fabric_node("not_installed", ("not_started", None)),
            Severity.CRITICAL,
            "nvidia-fabricmanager is not installed",
            id="manager-missing",
        ),
        pytest.param(
            fabric_node("not_installed", ("completed", True), ("completed", True)),
            Severity.OK,
            "NVSwitch fabric up (4 NVSwitches, every GPU registered; "
            "nvidia-fabricmanager not on the host)",
            id="manager-not-on-the-host-fabric-up",
        ),
        pytest.param(
            fabric_node("not_installed", ("completed", True), ("completed", False)),
            Severity.CRITICAL,
            "nvidia-fabricmanager is not installed",
            id="manager-not-on-the-host-registration-failed",
        ),
        pytest.param(
            dataclasses.replace(fabric_node("not_installed"), nvml_ok=False),
            Severity.CRITICAL,
            "nvidia-fabricmanager is not installed",
            id="manager-not-on-the-host-nvml-down",
        ),
        pytest.param(
            fabric_node("masked", ("completed", True)),
            Severity.OK,
            "every GPU registered; nvidia-fabricmanager not on the host",
            id="manager-masked-on-the-host-fabric-up",
        ),
        pytest.param(
            fabric_node("inactive", ("completed", True)),
            Severity.CRITICAL,
            "nvidia-fabricmanager is inactive",
            id="manager-installed-but-stopped",
        ),
        pytest.param(
            fabric_node("unknown", ("completed", True)),
            Severity.OK,
            "nvidia-fabricmanager unknown",
            id="no-systemd-gpus-registered",
        ),
        pytest.param(
            fabric_node("unknown", ("completed", True), ("in_progress", None)),
            Severity.CRITICAL,
            "GPU 1 in progress",
            id="no-systemd-gpu-not-registered",
        ),
        pytest.param(
            fabric_node("active", ("completed", False)),
            Severity.CRITICAL,
            "GPU 0 failed",
            id="registration-failed",
        ),
        pytest.param(
            node((gpu(0, fabric_state="not_started"),), pci=(pci_gpu(BUSES[0]),)),
            Severity.CRITICAL,
            "GPU 0 not started",
            id="fabric-gpu-without-visible-switches",
        ),
    ],
)
def test_fabric(inventory: NodeInventory, severity: Severity, reason_has: str) -> None:
    found, runbook, reason = verdict(check_fabric(InventoryView(inventory, expect())))
    assert found is severity
    assert runbook == ("node-fabric-manager" if severity is Severity.CRITICAL else "")
    assert reason_has in reason


@pytest.mark.parametrize(
    ("inventory", "boot", "severity", "reason_has"),
    [
        pytest.param(
            fabric_node("active", ("completed", True), ("in_progress", None)),
            SinceBoot(42.0, 300.0),
            Severity.OK,
            "NVSwitch fabric registering after boot (42 s ago, grace 300 s) (4 NVSwitches; "
            "GPU 1 in progress)",
            id="registering-after-boot",
        ),
        pytest.param(
            # The GPU Operator's Fabric Manager, not on the host, has not placed them yet.
            fabric_node("not_installed", ("not_started", None), ("in_progress", None)),
            SinceBoot(10.0, 300.0),
            Severity.OK,
            "GPU 0 not started, GPU 1 in progress",
            id="manager-off-the-host-still-starting",
        ),
        pytest.param(
            fabric_node("active", ("completed", True), ("in_progress", None)),
            SinceBoot(300.0, 300.0),
            Severity.CRITICAL,
            "GPU fabric registration not completed: GPU 1 in progress",
            id="grace-over",
        ),
        pytest.param(
            fabric_node("active", ("completed", False), ("in_progress", None)),
            SinceBoot(42.0, 300.0),
            Severity.CRITICAL,
            "GPU fabric registration not completed: GPU 0 failed",
            id="a-failed-registration-is-never-held-back",
        ),
        pytest.param(
            fabric_node("failed", ("in_progress", None)),
            SinceBoot(42.0, 300.0),
            Severity.CRITICAL,
            "nvidia-fabricmanager is failed",
            id="a-failed-manager-is-never-held-back",
        ),
    ],
)
def test_fabric_after_boot(
    inventory: NodeInventory, boot: SinceBoot, severity: Severity, reason_has: str
) -> None:
    outcome = check_fabric(InventoryView(inventory, expect(), boot=boot))
    found, _, reason = verdict(outcome)
    assert found is severity
    assert reason_has in reason
    evidence = dict(outcome.evidence)
    assert (evidence["seconds_since_boot"], evidence["boot_grace_seconds"]) == (
        boot.seconds,
        boot.grace_seconds,
    )


def _with_services(inventory: NodeInventory, *services: Service) -> NodeInventory:
    host = dataclasses.replace(inventory.host, services=services)
    return dataclasses.replace(inventory, host=host)


FM, IMEX, PD = "nvidia-fabricmanager", "nvidia-imex", "nvidia-persistenced"


@pytest.mark.parametrize(
    ("services", "severity", "runbook", "reason_has"),
    [
        pytest.param(
            (Service(FM, "failed", down_probes=1, pending=True),),
            Severity.OK,
            "",
            "stopped at 1 probe in a row, not yet down",
            id="manager-stopped-once-is-not-down-yet",
        ),
        pytest.param(
            (Service(FM, "failed", down_probes=3),),
            Severity.CRITICAL,
            "node-fabric-manager",
            "nvidia-fabricmanager is failed on an NVSwitch system (3 probes in a row)",
            id="manager-down-at-three-probes",
        ),
        pytest.param(
            (Service(FM, "active", restarts=12, recent_restarts=3, flapping=True),),
            Severity.CRITICAL,
            "node-service-flapping",
            "nvidia-fabricmanager restarted 3 times recently: flapping",
            id="manager-flapping-while-active",
        ),
        pytest.param(
            (Service(FM, "active"), Service(IMEX, "failed", down_probes=3)),
            Severity.CRITICAL,
            "node-imex-down",
            "nvidia-imex is failed (3 probes in a row): multi-node NVLink",
            id="imex-down",
        ),
        pytest.param(
            (Service(FM, "active"), Service(IMEX, "activating", recent_restarts=4, flapping=True)),
            Severity.CRITICAL,
            "node-service-flapping",
            "nvidia-imex restarted 4 times recently: flapping",
            id="imex-flapping",
        ),
        pytest.param(
            (Service(FM, "active"), Service(IMEX, "failed", down_probes=1, pending=True)),
            Severity.OK,
            "",
            "NVSwitch fabric up",
            id="imex-stopped-once",
        ),
        pytest.param(
            (Service(FM, "active"), Service(IMEX, "active", readiness="READY")),
            Severity.OK,
            "",
            "NVSwitch fabric up",
            id="imex-ready",
        ),
        pytest.param(
            (
                Service(FM, "active"),
                Service(IMEX, "active", readiness="UNAVAILABLE", unready_probes=3),
            ),
            Severity.CRITICAL,
            "node-imex-not-ready",
            "nvidia-imex runs but is not ready (nvidia-imex-ctl -q: 'UNAVAILABLE', 3 probes",
            id="imex-not-ready",
        ),
        pytest.param(
            (
                Service(FM, "active"),
                Service(
                    IMEX,
                    "active",
                    readiness="UNAVAILABLE",
                    unready_probes=1,
                    readiness_pending=True,
                ),
            ),
            Severity.OK,
            "",
            "NVSwitch fabric up",
            id="imex-not-ready-once-is-a-start",
        ),
    ],
)
def test_fabric_daemons_liveness(
    services: tuple[Service, ...], severity: Severity, runbook: str, reason_has: str
) -> None:
    inventory = _with_services(fabric_node("active", ("completed", True)), *services)
    found = to_finding("fabric", None, check_fabric(InventoryView(inventory, expect())))
    assert (found.severity, found.runbook) == (severity, runbook)
    assert reason_has in found.reason
    if severity is Severity.CRITICAL:
        assert "; " not in found.reason  # one fault, one problem


def test_imex_is_judged_without_nvswitches_too() -> None:
    # GB200 NVL racks: the switches are in the rack, not on the node's PCI bus.
    inventory = _with_services(node(), Service(IMEX, "failed", down_probes=3))
    found = to_finding("fabric", None, check_fabric(InventoryView(inventory, expect())))
    assert (found.severity, found.runbook) == (Severity.CRITICAL, "node-imex-down")


@pytest.mark.parametrize(
    ("service", "severity", "runbook"),
    [
        (Service(PD, "failed", down_probes=1, pending=True), Severity.OK, ""),
        (Service(PD, "failed", down_probes=3), Severity.WARN, "node-persistenced-down"),
        (
            Service(PD, "active", recent_restarts=3, flapping=True),
            Severity.WARN,
            "node-service-flapping",
        ),
    ],
)
def test_persistenced_liveness(service: Service, severity: Severity, runbook: str) -> None:
    inventory = _with_services(node(), service)
    found = to_finding("services", None, check_services(InventoryView(inventory, expect())))
    assert (found.severity, found.runbook) == (severity, runbook)


# --- drift ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("actual", "expected", "matches"),
    [
        ("550.54.15", "", True),
        ("550.54.15", "550.54.15", True),
        ("550.54.15", "550", True),
        ("550.54.15", "550.", True),
        ("550.54.15", "550.54", True),
        ("550.54.15", "55", False),
        ("550.54.15", "550.54.1", False),
        ("550.54.15", "535", False),
    ],
)
def test_version_matches(actual: str, expected: str, matches: bool) -> None:
    assert version_matches(actual, expected) is matches


@pytest.mark.parametrize(
    ("inventory", "expected", "baseline", "severity", "reason_has"),
    [
        pytest.param(node(), expect(), None, Severity.OK, "inventory as expected", id="nothing"),
        pytest.param(
            node(),
            expect(
                driver_version="550",
                cuda_driver_version="12.4",
                kernel_release="6.1.0-18-amd64",
                vbios_version="96.00.99.00.01",
                model="H100",
            ),
            BASELINE,
            Severity.OK,
            "inventory as expected and baseline",
            id="all-match",
        ),
        pytest.param(
            node(),
            expect(driver_version="535"),
            None,
            Severity.WARN,
            "driver 550.54.15, expected 535",
            id="driver",
        ),
        pytest.param(
            node(), expect(cuda_driver_version="12.2"), None, Severity.WARN, "cuda 12.4", id="cuda"
        ),
        pytest.param(
            node(kernel_release="6.1.0-21-amd64"),
            expect(kernel_release="6.1.0-18-amd64"),
            None,
            Severity.WARN,
            "kernel 6.1.0-21-amd64, expected 6.1.0-18-amd64",
            id="kernel",
        ),
        pytest.param(
            node((gpu(0), gpu(1, vbios_version="96.00.74.00.01"))),
            expect(vbios_version="96.00.99.00.01"),
            None,
            Severity.WARN,
            "VBIOS 96.00.74.00.01,96.00.99.00.01",
            id="vbios",
        ),
        pytest.param(
            node((gpu(0, model="NVIDIA A100-SXM4-80GB"),)),
            expect(model="H100"),
            None,
            Severity.WARN,
            "GPU model NVIDIA A100-SXM4-80GB, expected H100",
            id="model",
        ),
        pytest.param(
            node(kernel_release="6.1.0-21-amd64"),
            expect(),
            BASELINE,
            Severity.WARN,
            "kernel 6.1.0-21-amd64, baseline 6.1.0-18-amd64",
            id="baseline-kernel",
        ),
        pytest.param(
            node(kernel_release=None),
            expect(kernel_release="6.1"),
            BASELINE,
            Severity.OK,
            "inventory as expected",
            id="unreported-is-not-compared",
        ),
        pytest.param(
            node(tuple(gpu(i, model="NVIDIA H200") for i in range(4))),
            expect(),
            BASELINE,
            Severity.WARN,
            "GPU model NVIDIA H200, baseline NVIDIA H100 80GB HBM3",
            id="baseline-model",
        ),
        pytest.param(
            node(pci=(*(pci_gpu(b) for b in BUSES), *SWITCHES[:3])),
            expect(),
            dataclasses.replace(BASELINE, nvswitches=4),
            Severity.WARN,
            "NVSwitches 3, baseline 4",
            id="baseline-nvswitch-gone",
        ),
        pytest.param(
            node(pci=None),
            expect(),
            dataclasses.replace(BASELINE, nvswitches=4),
            Severity.OK,
            "inventory as expected and baseline",
            id="nvswitches-unread-not-compared",
        ),
        pytest.param(
            node(pci=(*(pci_gpu(b) for b in BUSES), pci_gpu("0000:9a:00.0", "vfio-pci"))),
            expect(),
            BASELINE,
            Severity.WARN,
            "GPUs 5, baseline 4",
            id="baseline-gpu-more",
        ),
        pytest.param(
            node(gpus=(gpu(0), gpu(1), gpu(2)), pci=tuple(pci_gpu(b) for b in BUSES[:3])),
            expect(),
            BASELINE,
            Severity.OK,
            "inventory as expected and baseline",
            id="baseline-gpu-fewer-is-gpu-count-s",
        ),
        pytest.param(
            node(modules=(("nvidia", True), ("nvidia_uvm", False), ("nvidia_peermem", False))),
            expect(),
            BASELINE,
            Severity.WARN,
            "kernel modules nvidia, baseline nvidia,nvidia_uvm",
            id="baseline-module-unloaded",
        ),
        pytest.param(
            node(modules=(("nvidia", True), ("nvidia_uvm", True), ("nvidia_peermem", True))),
            expect(),
            BASELINE,
            Severity.WARN,
            "kernel modules nvidia,nvidia_peermem,nvidia_uvm, baseline nvidia,nvidia_uvm",
            id="baseline-module-loaded",
        ),
        pytest.param(
            node(modules=(("nvidia", True), ("nvidia_uvm", False), ("nvidia_peermem", False))),
            expect(modules=["nvidia", "nvidia_uvm"]),
            BASELINE,
            Severity.OK,
            "inventory as expected and baseline",
            id="required-module-unloaded-is-the-driver-check-s",
        ),
        pytest.param(
            node(modules=(("nvidia", None), ("nvidia_uvm", None))),
            expect(),
            BASELINE,
            Severity.OK,
            "inventory as expected and baseline",
            id="modules-unread-not-compared",
        ),
        pytest.param(
            node(
                tuple(gpu(i, model="NVIDIA H200") for i in range(2)),
                pci=(pci_gpu(BUSES[0]), pci_gpu(BUSES[1]), *SWITCHES),
                modules=(("nvidia", True),),
            ),
            expect(),
            OLD_BASELINE,
            Severity.OK,
            "inventory as expected and baseline",
            id="old-baseline-compares-versions-only",
        ),
    ],
)
def test_drift(
    inventory: NodeInventory,
    expected: InventoryExpected,
    baseline: Baseline | None,
    severity: Severity,
    reason_has: str,
) -> None:
    found, runbook, reason = verdict(check_drift(InventoryView(inventory, expected, baseline)))
    assert found is severity
    assert runbook == ("node-inventory-drift" if severity is Severity.WARN else "")
    assert reason_has in reason


def test_drift_lists_every_difference() -> None:
    inventory = node(kernel_release="6.1.0-21-amd64")
    view = InventoryView(inventory, expect(driver_version="535"), BASELINE)
    reason = verdict(check_drift(view))[2]
    assert reason.startswith("inventory drifted: ")
    assert reason.count("; ") == 1


# --- per GPU -------------------------------------------------------------------------------


LAYOUT = ("1g.10gb", "1g.10gb", "3g.40gb")


@pytest.mark.parametrize(
    ("profiles", "mig", "instances", "severity", "reason"),
    [
        pytest.param([], False, None, Severity.OK, "MIG mode off: no GPU instances", id="mig-off"),
        pytest.param(
            list(LAYOUT),
            None,
            None,
            Severity.OK,
            "MIG mode off: no GPU instances",
            id="mig-not-supported",
        ),
        pytest.param(list(LAYOUT), True, None, Severity.OK, "not reported", id="not-reported"),
        pytest.param(
            [],
            True,
            ("1g.10gb", "1g.10gb", "3g.40gb"),
            Severity.OK,
            "MIG layout 2x 1g.10gb, 3g.40gb",
            id="no-expectation",
        ),
        pytest.param(
            ["3g.40gb", "1g.10gb", "1g.10gb"],
            True,
            ("1g.10gb", "1g.10gb", "3g.40gb"),
            Severity.OK,
            "MIG layout 2x 1g.10gb, 3g.40gb, as expected",
            id="same-multiset-other-order",
        ),
        pytest.param(
            list(LAYOUT),
            True,
            ("1g.10gb", "3g.40gb"),
            Severity.WARN,
            "MIG layout 1g.10gb, 3g.40gb, expected 2x 1g.10gb, 3g.40gb (missing 1g.10gb)",
            id="one-missing",
        ),
        pytest.param(
            list(LAYOUT),
            True,
            ("1g.10gb", "1g.10gb", "1g.10gb", "3g.40gb"),
            Severity.WARN,
            "(unexpected 1g.10gb)",
            id="one-extra",
        ),
        pytest.param(
            list(LAYOUT),
            True,
            ("7g.80gb",),
            Severity.WARN,
            "MIG layout 7g.80gb, expected 2x 1g.10gb, 3g.40gb "
            "(missing 2x 1g.10gb, 3g.40gb; unexpected 7g.80gb)",
            id="other-layout",
        ),
        pytest.param(
            list(LAYOUT),
            True,
            (),
            Severity.WARN,
            "MIG layout no GPU instances, expected 2x 1g.10gb, 3g.40gb",
            id="instances-gone-after-reset",
        ),
        pytest.param(
            ["1g.10gb"],
            True,
            ("1g.10gb+me",),
            Severity.WARN,
            "missing 1g.10gb; unexpected 1g.10gb+me",
            id="variant-is-another-profile",
        ),
    ],
)
def test_mig_layout(
    profiles: list[str],
    mig: bool | None,
    instances: tuple[str, ...] | None,
    severity: Severity,
    reason: str,
) -> None:
    outcome = check_mig_layout(
        gpu(0, mig_current=mig, mig_instances=instances),
        on(expect(mig_profiles=profiles)),
        CHECKS,
    )
    found, runbook, text = verdict(outcome)
    assert (found, runbook) == (severity, "gpu-mig-layout" if severity is Severity.WARN else "")
    assert reason in text


@pytest.mark.parametrize(
    ("index", "severity"),
    [(0, Severity.OK), (1, Severity.OK), (2, Severity.WARN)],
)
def test_mig_layout_per_gpu(index: int, severity: Severity) -> None:
    # GPU 0 is expected whole (7g.80gb), GPU 1 is exempt, GPU 2 keeps the node-wide layout.
    expected = expect(
        mig_profiles=list(LAYOUT),
        gpu=[
            ExpectedGpu(0, mig_profiles=["7g.80gb"]),
            ExpectedGpu(1, mig_profiles=[]),
        ],
    )
    outcome = check_mig_layout(
        gpu(index, mig_current=True, mig_instances=("7g.80gb",)), on(expected), CHECKS
    )
    assert verdict(outcome)[0] is severity


@pytest.mark.parametrize(
    ("profiles", "text"),
    [
        ((), "no GPU instances"),
        (("3g.40gb",), "3g.40gb"),
        (("3g.40gb", "1g.10gb", "1g.10gb"), "2x 1g.10gb, 3g.40gb"),
    ],
)
def test_layout_text(profiles: tuple[str, ...], text: str) -> None:
    assert layout_text(profiles) == text


# --- the engine ----------------------------------------------------------------------------


def _states(count: int, *, answering: bool = True) -> tuple[GpuState, ...]:
    return tuple(
        GpuState(
            GpuIdentity(index=i, pci_bus_id=BUSES[i], uuid=f"GPU-{i}", name="H100"),
            "ok" if answering else "lost",
            GpuReadings() if answering else None,
        )
        for i in range(count)
    )


def _evaluate(states: tuple[GpuState, ...], view: InventoryView | None) -> tuple[Finding, ...]:
    health, _ = evaluate(
        states, NvmlStatus(ok=True), ChecksSection(), HealthMemory(), 0.0, inventory=view
    )
    return health.findings


def test_engine_runs_inventory_checks_in_order_only_with_an_inventory() -> None:
    states = _states(2)
    without = _evaluate(states, None)
    assert not {f.check for f in without} & {*INVENTORY_NODE_CHECK_NAMES, *INVENTORY_CHECK_NAMES}
    inventory = node(
        (gpu(0), gpu(1, ecc_pending=False)), pci=(pci_gpu(BUSES[0]), pci_gpu(BUSES[1]))
    )
    found = _evaluate(states, InventoryView(inventory, expect()))
    node_checks = [f.check for f in found if f.gpu is None]
    assert node_checks == [*NODE_CHECK_NAMES, *INVENTORY_NODE_CHECK_NAMES]
    for bus in BUSES[:2]:
        checks = [f.check for f in found if f.gpu == bus]
        assert checks[-len(INVENTORY_CHECK_NAMES) :] == list(INVENTORY_CHECK_NAMES)
    ecc = next(f for f in found if f.gpu == BUSES[1] and f.check == "ecc_mode")
    assert (ecc.severity, ecc.runbook) == (Severity.WARN, "gpu-ecc-pending")


def test_engine_gives_no_data_for_gpus_that_did_not_answer() -> None:
    states = _states(1, answering=False)
    view = InventoryView(node((gpu(0),), pci=(pci_gpu(BUSES[0]),)), expect())
    found = [f for f in _evaluate(states, view) if f.check in INVENTORY_CHECK_NAMES]
    assert [f.severity for f in found] == [Severity.UNKNOWN] * len(INVENTORY_CHECK_NAMES)
    assert all(f.runbook == "gpu-lost" for f in found)
