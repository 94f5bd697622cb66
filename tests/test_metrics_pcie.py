"""PCIe link series from the sysfs paths in the snapshot: labels, values, dedupe, docs."""

from __future__ import annotations

import subprocess
from pathlib import Path

from conftest import require
from gpuagent.metrics import build_registry, names
from gpuagent.metrics.exposition import TextRenderer
from gpuagent.model import PcieLink, PciePath
from test_metrics_support import (
    HOSTNAME,
    VERSION,
    exposition,
    families_by_name,
    prometheus_client_text,
    samples,
    snapshot,
)

PCIE_NAMES = [spec.name for spec, _field in names.PCIE_LINK_GAUGES]
AER = names.PCIE_AER_ERRORS.name


def gen5_x16(address: str, role: str = "bridge", **changes: object) -> PcieLink:
    values: dict[str, object] = {
        "current_speed_gts": 32.0,
        "max_speed_gts": 32.0,
        "current_width": 16,
        "max_width": 16,
        "aer_correctable": 0,
        "aer_nonfatal": 0,
        "aer_fatal": 0,
        **changes,
    }
    return PcieLink(address, role, **values)  # type: ignore[arg-type]


ROOT_PORT = gen5_x16("0000:15:01.0")
SWITCH_UP = gen5_x16("0000:16:00.0")
NARROW = {"current_speed_gts": 16.0, "current_width": 8}
# As the sysfs source returns them, in address order: two GPUs behind one PCIe switch (one
# trained at Gen4 x8), a GPU that fell off the bus behind a port whose link is down, an
# NVSwitch, and a passthrough GPU without PCIe capability.
PATHS = (
    PciePath(PcieLink("0000:00:05.0", "gpu")),
    PciePath(
        gen5_x16("0000:18:00.0", "gpu", aer_correctable=1),
        (gen5_x16("0000:17:00.0"), SWITCH_UP, ROOT_PORT),
    ),
    PciePath(
        gen5_x16("0000:1a:00.0", "gpu", aer_correctable=7, **NARROW),
        (gen5_x16("0000:17:02.0", aer_correctable=20, **NARROW), SWITCH_UP, ROOT_PORT),
    ),
    PciePath(
        PcieLink("0000:ba:00.0", "gpu", aer_correctable=0, aer_nonfatal=0, aer_fatal=0),
        (
            gen5_x16("0000:b9:00.0", current_speed_gts=2.5, current_width=None, aer_nonfatal=2),
            gen5_x16("0000:b8:00.0"),
            gen5_x16("0000:b7:01.0"),
        ),
    ),
    PciePath(
        gen5_x16("0000:bb:00.0", "nvswitch", current_speed_gts=16.0, max_speed_gts=16.0),
        (gen5_x16("0000:b9:01.0"), gen5_x16("0000:b8:00.0"), gen5_x16("0000:b7:01.0")),
    ),
)
ADDRESSES = {
    "0000:00:05.0",
    "0000:18:00.0",
    "0000:17:00.0",
    "0000:16:00.0",
    "0000:15:01.0",
    "0000:1a:00.0",
    "0000:17:02.0",
    "0000:ba:00.0",
    "0000:b9:00.0",
    "0000:b8:00.0",
    "0000:b7:01.0",
    "0000:bb:00.0",
    "0000:b9:01.0",
}


def pcie_snapshot(paths: tuple[PciePath, ...] = PATHS):
    return snapshot(pcie=paths)


def by_link(name: str, paths: tuple[PciePath, ...] = PATHS) -> dict[str, float]:
    """pci_bus_id -> value, for a family with one sample per link."""
    found = samples(pcie_snapshot(paths))[name]
    keyed = {s.labels["pci_bus_id"]: s.value for s in found}
    assert len(keyed) == len(found), f"{name} has a link twice"
    return keyed


def labels_of(address: str, paths: tuple[PciePath, ...] = PATHS) -> dict[str, str]:
    found = samples(pcie_snapshot(paths))["gpuagent_pcie_link_max_speed_gts"]
    (sample,) = [s for s in found if s.labels["pci_bus_id"] == address]
    return sample.labels


def aer_counts(paths: tuple[PciePath, ...] = PATHS) -> dict[tuple[str, str], float]:
    found = samples(pcie_snapshot(paths))["gpuagent_pcie_aer_errors"]
    return {(s.labels["pci_bus_id"], s.labels["severity"]): s.value for s in found}


# --- labels and dedupe ------------------------------------------------------------------


def test_every_link_is_exported_once():
    # All but the two devices that have no link values at all (by_link rejects duplicates).
    with_values = ADDRESSES - {"0000:00:05.0", "0000:ba:00.0"}
    for name in ("gpuagent_pcie_link_max_speed_gts", "gpuagent_pcie_link_max_width"):
        assert set(by_link(name)) == with_values, name


def test_device_series_labels():
    assert labels_of("0000:1a:00.0") == {
        "pci_bus_id": "0000:1a:00.0",
        "role": "gpu",
        "device_pci_bus_id": "00000000:1A:00.0",
        "Hostname": HOSTNAME,
    }
    assert labels_of("0000:bb:00.0")["role"] == "nvswitch"


def test_a_bridge_is_labelled_with_the_device_below_it():
    assert labels_of("0000:17:02.0") == {
        "pci_bus_id": "0000:17:02.0",
        "role": "bridge",
        "device_pci_bus_id": "00000000:1A:00.0",
        "Hostname": HOSTNAME,
    }


def test_a_shared_bridge_is_labelled_with_the_first_path_that_reaches_it():
    assert labels_of("0000:16:00.0")["device_pci_bus_id"] == "00000000:18:00.0"
    assert labels_of("0000:b8:00.0")["device_pci_bus_id"] == "00000000:BA:00.0"
    reversed_paths = PATHS[::-1]
    assert labels_of("0000:16:00.0", reversed_paths)["device_pci_bus_id"] == "00000000:1A:00.0"


def test_no_two_samples_share_a_label_set():
    for name, found in samples(pcie_snapshot()).items():
        keys = [(s.name, tuple(sorted(s.labels.items()))) for s in found]
        assert len(keys) == len(set(keys)), name


# --- values -----------------------------------------------------------------------------


def test_a_narrow_slow_link_shows_on_both_ends():
    for address in ("0000:1a:00.0", "0000:17:02.0"):
        assert by_link("gpuagent_pcie_link_speed_gts")[address] == 16.0
        assert by_link("gpuagent_pcie_link_max_speed_gts")[address] == 32.0
        assert by_link("gpuagent_pcie_link_width")[address] == 8.0
        assert by_link("gpuagent_pcie_link_max_width")[address] == 16.0


def test_unknown_values_are_absent_not_zero():
    # The GPU off the bus has no link values; the port above it still has a speed, but no
    # current width (its link is down).
    for name in PCIE_NAMES:
        assert "0000:ba:00.0" not in by_link(name), name
        assert "0000:00:05.0" not in by_link(name), name
    assert by_link("gpuagent_pcie_link_speed_gts")["0000:b9:00.0"] == 2.5
    assert "0000:b9:00.0" not in by_link("gpuagent_pcie_link_width")
    assert by_link("gpuagent_pcie_link_max_width")["0000:b9:00.0"] == 16.0


def test_aer_errors_are_a_counter_by_severity():
    assert families_by_name(pcie_snapshot())["gpuagent_pcie_aer_errors"] == "counter"
    text = exposition(pcie_snapshot())
    assert "# TYPE gpuagent_pcie_aer_errors_total counter\n" in text
    counts = aer_counts()
    assert counts[("0000:17:02.0", "correctable")] == 20.0
    assert counts[("0000:1a:00.0", "correctable")] == 7.0
    assert counts[("0000:b9:00.0", "nonfatal")] == 2.0
    assert counts[("0000:b9:00.0", "fatal")] == 0.0
    assert {severity for _address, severity in counts} == {"correctable", "nonfatal", "fatal"}


def test_a_function_without_aer_has_no_error_series():
    addresses = {address for address, _severity in aer_counts()}
    assert "0000:00:05.0" not in addresses
    assert "0000:ba:00.0" in addresses  # its counters live in the kernel, not the device


def test_without_paths_there_are_no_pcie_families():
    found = samples(snapshot())
    assert not [name for name in found if name.startswith("gpuagent_pcie_")]


def test_the_fast_renderer_matches_prometheus_client():
    taken = pcie_snapshot()  # one snapshot: the process metrics are sampled once with it
    registry = build_registry(lambda: taken, VERSION)
    assert TextRenderer().render(registry.collect()) == prometheus_client_text(registry)


# --- documentation and promtool ---------------------------------------------------------


def test_every_pcie_sample_name_is_in_the_docs():
    docs = (Path(__file__).resolve().parents[1] / "docs" / "metrics.md").read_text()
    served = {s.name for found in samples(pcie_snapshot()).values() for s in found}
    for name in (n for n in served if n.startswith("gpuagent_pcie_")):
        assert f"| `{name}` |" in docs, name
    for spec in (*(spec for spec, _field in names.PCIE_LINK_GAUGES), names.PCIE_AER_ERRORS):
        assert f"| `{spec.name}` |" in docs
        assert spec.help in docs
    for severity, _field in names.PCIE_AER_SEVERITIES:
        assert f"`{severity}`" in docs


def test_promtool_accepts_the_pcie_series():
    promtool = require("promtool", "checking the exposition (Debian package prometheus)")
    # Without GPUs, so dcgm-exporter's camelCase label is not in the way.
    text = exposition(snapshot(gpus=(), findings=(), pcie=PATHS))
    result = subprocess.run(
        [promtool, "check", "metrics"],
        input=text,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (result.returncode, result.stdout + result.stderr) == (0, "")
