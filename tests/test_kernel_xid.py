"""The XID catalog: the packaged file, its build script, and what it says."""

from __future__ import annotations

import dataclasses
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from conftest import REPO, TEST_DATA
from gpuagent.kernel.xid import XidInfo, action_hint, all_xids, is_hopper, lookup, nvlink_error

SCRIPT = REPO / "scripts" / "build_xid_catalog.py"
WRAPPER = REPO / "scripts" / "build-xid-catalog"
PACKAGED = REPO / "agent" / "gpuagent" / "data" / "xid_catalog.csv"
# A copy of ../shared/data/xid_catalog.csv (tests/data/README.md): the script's default
# source, which a fresh clone may not have.
SHARED_CATALOG = TEST_DATA / "xid_catalog.csv"


def _build_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_xid_catalog", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


builder = _build_script()


def _shared_catalog() -> str:
    return SHARED_CATALOG.read_text(encoding="utf-8")


# --- the packaged file is what the script builds ----------------------------------------------


def test_packaged_catalog_is_built_from_the_shared_one() -> None:
    built = builder.build(_shared_catalog())
    assert PACKAGED.read_text(encoding="utf-8") == built, "run scripts/build-xid-catalog"


def test_build_script_check_mode(tmp_path: Path) -> None:
    source = ("--source", str(SHARED_CATALOG))
    current = subprocess.run(
        [str(WRAPPER), "--check", *source], capture_output=True, text=True, check=False, timeout=30
    )
    assert current.returncode == 0, current.stderr
    stale = tmp_path / "stale.csv"
    stale.write_text("xid\n")
    outdated = subprocess.run(
        [str(WRAPPER), "--check", *source, "--output", str(stale)],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    assert outdated.returncode == 1
    assert "out of date" in outdated.stderr


def test_build_script_writes(tmp_path: Path) -> None:
    source = tmp_path / "source.csv"
    source.write_text(SOURCE_HEADER + "79,GONE,GPU has fallen off the bus,own,bus,crit,RESTART_BM,")
    output = tmp_path / "out" / "xid_catalog.csv"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--source", str(source), "--output", str(output)],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    assert result.returncode == 2  # the row is short: no app-error column
    source.write_text(SOURCE_HEADER + _source_row())
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--source", str(source), "--output", str(output)],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    assert output.read_text().splitlines()[-1] == (
        "79,ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS,GPU has fallen off the bus,bus,"
        "critical-node,RESTART_BM,CONTACT_SUPPORT,no"
    )


# --- the build's normalisations ----------------------------------------------------------------

SOURCE_HEADER = (
    "xid,mnemonic,nvidia_description,description_own_words,category,severity,"
    "immediate_action,investigatory_action,nvsentinel_default_action,nvsentinel_fatal,"
    "old_table_name,old_table_possible_causes,k8s_device_plugin_app_error,notes\n"
)


def _source_row(
    xid: str = "79",
    nvidia: str = "GPU has fallen off the bus",
    own: str = "GPU unreachable over PCIe",
    action: str = "RESTART_BM",
    app_error: str = "no",
) -> str:
    return (
        f"{xid},ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS,{nvidia},{own},bus,critical-node,"
        f"{action},CONTACT_SUPPORT,RESTART_BM,FATAL,,,{app_error},a note\n"
    )


def _built_rows(*rows: str) -> list[str]:
    return builder.build(SOURCE_HEADER + "".join(rows)).splitlines()


def test_build_keeps_only_what_the_agent_needs() -> None:
    lines = _built_rows(_source_row())
    assert [line for line in lines if line.startswith("#")] == builder.HEADER.splitlines()
    assert lines[2] == (
        "xid,mnemonic,description,category,severity,immediate_action,investigatory_action,app_error"
    )
    assert lines[3].endswith(",RESTART_BM,CONTACT_SUPPORT,no")


@pytest.mark.parametrize("nvidia", ["Unused", "unused", "", "  "])
def test_build_falls_back_to_own_words(nvidia: str) -> None:
    row = _built_rows(_source_row(nvidia=nvidia))[3]
    assert ",GPU unreachable over PCIe," in row


def test_build_normalises_blank_actions_and_whitespace() -> None:
    row = _built_rows(_source_row(action="(blank in catalog)", own="x", nvidia='"a\n  b "'))[3]
    assert row.split(",")[2] == "a b"
    assert ",critical-node,,CONTACT_SUPPORT," in row


def test_build_sorts_by_xid() -> None:
    lines = _built_rows(_source_row(xid="120"), _source_row(xid="9"), _source_row(xid="79"))
    assert [line.split(",")[0] for line in lines[3:]] == ["9", "79", "120"]


@pytest.mark.parametrize(
    ("rows", "problem"),
    [
        ((_source_row(xid="x"),), "bad xid"),
        ((_source_row(app_error="maybe"),), "k8s_device_plugin_app_error"),
        ((_source_row(), _source_row()), "duplicate"),
    ],
)
def test_build_refuses_a_bad_source(rows: tuple[str, ...], problem: str) -> None:
    with pytest.raises(builder.CatalogError, match=problem):
        builder.build(SOURCE_HEADER + "".join(rows))


# --- what the catalog says ----------------------------------------------------------------------


def test_catalog_lists_xids_1_to_172() -> None:
    assert [info.xid for info in all_xids()] == list(range(1, 173))


@pytest.mark.parametrize(
    ("xid", "action"),
    [
        (79, "RESTART_BM"),
        (95, "RESET_GPU"),
        (119, "RESET_GPU"),
        (120, "RESET_GPU"),
        (64, "RESET_GPU"),
        (13, "RESTART_APP"),
        (31, "RESTART_APP"),
        (94, "RESTART_APP"),
        (43, "IGNORE"),
        (63, "IGNORE"),
        (48, "WORKFLOW_XID_48"),
        (149, "WORKFLOW_NVLINK5_ERR"),
        (154, "XID_154"),
        (151, "RESTART_VM"),
        (162, ""),  # no bucket in the catalog yet
        (172, ""),
    ],
)
def test_immediate_actions(xid: int, action: str) -> None:
    info = lookup(xid)
    assert info is not None
    assert info.action == action


def test_app_errors_are_the_device_plugins() -> None:
    assert {info.xid for info in all_xids() if info.app_error} == {13, 31, 43, 45, 68, 109}


def test_xid_79() -> None:
    assert lookup(79) == XidInfo(
        xid=79,
        mnemonic="ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS",
        description="GPU has fallen off the bus",
        category="bus",
        severity="critical-node (reboot/power-cycle)",
        action="RESTART_BM",
        investigatory_action="CONTACT_SUPPORT",
        app_error=False,
    )


def test_unused_xids_are_described_in_own_words() -> None:
    info = lookup(1)
    assert info is not None
    assert info.severity == "unused"
    assert "Invalid or corrupted push buffer stream" in info.description


def test_every_xid_has_a_description_and_mnemonic() -> None:
    for info in all_xids():
        assert info.description
        assert info.description.lower() != "unused"
        assert info.mnemonic
        assert info.category


@pytest.mark.parametrize("xid", [0, -1, 173, 10**6])
def test_unknown_xids(xid: int) -> None:
    assert lookup(xid) is None


def test_every_action_has_a_hint() -> None:
    for info in all_xids():
        hint = action_hint(info.action)
        assert hint
        assert hint != info.action.lower().replace("_", " "), info.action


@pytest.mark.parametrize(
    ("action", "hint"),
    [
        ("RESTART_BM", "reboot the node"),
        ("RESET_GPU", "drain and reset the GPU"),
        ("WORKFLOW_XID_45", "follow NVIDIA's decode workflow for this XID"),
        ("", "the catalog names no action yet"),
        ("SOMETHING_NEW", "something new"),
    ],
)
def test_action_hints(action: str, hint: str) -> None:
    assert action_hint(action) == hint


def test_catalog_entries_are_immutable() -> None:
    info = lookup(79)
    assert info is not None
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.action = "IGNORE"  # type: ignore[misc]


# --- Xid 74: the register dump, classed by NVIDIA's WORKFLOW_NVLINK_ERR -----------------------

# NVIDIA/NVSentinel's parser test (csv_test.go at 3e97fd0; tests/data/kmsg_corpus.tsv).
XID_74 = (
    "NVRM: Xid (PCI:0003:00:00): 74, pid='<unknown>', name=<unknown>, NVLink: fatal error "
    "detected on link 14(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)"
)


def _dump(*registers: int, link: int = 6) -> str:
    """An Xid 74 line in the driver's format (XID_74's) with other register values."""
    shown = ", ".join(hex(value) for value in registers)
    return f"NVRM: Xid (PCI:0000:b9:00): 74, NVLink: fatal error detected on link {link}({shown})"


@pytest.mark.parametrize(
    ("line", "link", "bits", "ignored"),
    [
        pytest.param(XID_74, 14, ((3, 16, "report_if_repeated"),), 0, id="nvsentinel-line"),
        pytest.param(_dump(0x10000, 0, 0, 0, 0, 0, 0), 6, ((1, 16, "hardware"),), 0, id="hw"),
        pytest.param(
            _dump(0x100002, 0, 0, 0x30000, 0, 0, 0),
            6,
            (
                (1, 1, "sympathetic"),
                (1, 20, "sympathetic"),
                (4, 16, "sympathetic"),
                (4, 17, "sympathetic"),
            ),
            0,
            id="sympathetic",
        ),
        pytest.param(
            _dump(0x30, 0, 0x47, 0, 0x1B6C0000, 0, 0),
            6,
            (
                (1, 4, "ecc_parity"),
                (1, 5, "ecc_parity"),
                (3, 0, "ecc_parity"),
                (3, 1, "ecc_parity"),
                (3, 2, "ecc_parity"),
                (3, 6, "ecc_parity"),
                (5, 18, "ecc_parity"),
                (5, 19, "ecc_parity"),
                (5, 21, "ecc_parity"),
                (5, 22, "ecc_parity"),
                (5, 24, "ecc_parity"),
                (5, 25, "ecc_parity"),
                (5, 27, "ecc_parity"),
                (5, 28, "ecc_parity"),
            ),
            0,
            id="ecc-parity-in-three-registers",
        ),
        pytest.param(
            _dump(0x600000, 0, 0, 0, 0x24900000, 0, 0),
            6,
            (
                (1, 21, "signal_integrity"),
                (1, 22, "signal_integrity"),
                (5, 20, "ecc_threshold"),
                (5, 23, "ecc_threshold"),
                (5, 26, "ecc_threshold"),
                (5, 29, "ecc_threshold"),
            ),
            0,
            id="signal-integrity-and-ecc-threshold",
        ),
        pytest.param(
            _dump(0x40800001, 0, 0x2000, 0, 0, 0, 0),
            6,
            ((3, 13, "unexpected"),),
            3,
            id="ignorable-bits-are-counted-not-classed",
        ),
        pytest.param(
            # The second, sixth and seventh registers are not the catalog's: not read.
            _dump(0x2, 0xFFFF, 0, 0, 0x1, 0xFFFF, 0xFFFF),
            6,
            ((1, 1, "sympathetic"), (5, 0, "undocumented")),
            0,
            id="an-unlisted-bit-is-undocumented",
        ),
    ],
)
def test_nvlink_error_classes_each_set_bit(
    line: str, link: int, bits: tuple[tuple[int, int, str], ...], ignored: int
) -> None:
    found = nvlink_error(line)
    assert found is not None
    assert (found.link, found.decoded, found.bits, found.ignored_bits) == (
        link,
        True,
        bits,
        ignored,
    )


def test_nvlink_error_reads_the_registers_as_printed() -> None:
    found = nvlink_error(XID_74)
    assert found is not None
    assert found.registers == (0, 0, 0x10000, 0, 0, 0, 0)
    assert found.bits_text() == "register 3 bit 16"
    assert found.classes == {"report_if_repeated"}
    two = nvlink_error(_dump(0x2, 0, 0x2001, 0x40000, 0, 0, 0))
    assert two is not None
    assert two.bits_text() == "register 1 bit 1; register 3 bits 0, 13; register 4 bit 18"
    assert two.fabric_reset


@pytest.mark.parametrize(
    ("line", "link"),
    [
        # The HyperPod documentation's example of the bare form (no register dump).
        ("NVRM: Xid (PCI:0000:b9:00): 74, NVLink: fatal error detected on link 6", 6),
        ("NVRM: Xid (PCI:0000:b9:00): 74, NVLink: fatal error detected on link 6(0x1, 0x2)", 6),
    ],
)
def test_nvlink_error_without_a_whole_dump_is_not_decoded(line: str, link: int) -> None:
    found = nvlink_error(line)
    assert found is not None
    assert (found.link, found.decoded, found.bits) == (link, False, ())


def test_nvlink_error_needs_a_link() -> None:
    assert nvlink_error("NVRM: Xid (PCI:0000:b9:00): 74, NVLink error") is None


@pytest.mark.parametrize(
    ("name", "hopper"),
    [
        ("NVIDIA H100 80GB HBM3", True),
        ("NVIDIA H100 PCIe", True),
        ("NVIDIA H200", True),
        ("NVIDIA H200 NVL", True),
        ("NVIDIA H800", True),
        ("NVIDIA H20", True),
        ("NVIDIA GH200 480GB", True),
        ("NVIDIA A100-SXM4-80GB", False),
        ("NVIDIA B200", False),
        ("NVIDIA GB200", False),
        ("NVIDIA L40S", False),
        ("NVIDIA H2000", False),
    ],
)
def test_is_hopper(name: str, hopper: bool) -> None:
    assert is_hopper(name) is hopper
