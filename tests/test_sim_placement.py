"""Where a simulated GPU belongs and sits, read through pynvml: its NVLink domain (the
fabric info's cluster UUID and clique id) and its platform info (chassis, slot, tray,
host, module), in plain simulations of each model and in replays of real captures."""

from __future__ import annotations

import ctypes
from typing import Any

import pynvml
import pytest

from conftest import MakeNode
from gpuagent.config import ConfigError
from gpuagent.sim import catalog, parse_scenario
from hardware_profiles_doc import REAL_HOSTS

ZERO_UUID = "00000000-0000-0000-0000-000000000000"
GB200_CAPTURE = REAL_HOSTS / "gb200-x4-arm64.580.173.02.nvidia-smi-q.xml"
B200_CAPTURE = REAL_HOSTS / "b200-x8.580.105.08.nvidia-smi-q.xml"
H100_CAPTURE = REAL_HOSTS / "h100-x1-idle.590.48.01.nvidia-smi-q.txt"
RTX2080S_CAPTURE = REAL_HOSTS / "RTX2080S-idle.610.57.04.nvidia-smi-q.txt"
# Platform info: (chassis serial, slot, tray, host, peer type, module id).
Placement = tuple[str, int, int, int, int, int]
SWITCH_CONNECTED = 1
TRAY = 'model = "gb200"\ngpus = 4\n'  # a GB200 compute tray's [node] keys


def uuid_text(raw: Any) -> str:
    hexed = bytes(raw).hex()
    return f"{hexed[:8]}-{hexed[8:12]}-{hexed[12:16]}-{hexed[16:20]}-{hexed[20:]}"


def domain_v3(index: int) -> tuple[str, int]:
    """(cluster UUID, clique id) from nvmlDeviceGetGpuFabricInfoV with the v3 struct."""
    info = pynvml.c_nvmlGpuFabricInfo_v3_t()
    pynvml.nvmlDeviceGetGpuFabricInfoV(pynvml.nvmlDeviceGetHandleByIndex(index), ctypes.byref(info))
    return uuid_text(info.clusterUuid), int(info.cliqueId)


def domain_v2(index: int) -> tuple[str, int]:
    info = pynvml.c_nvmlGpuFabricInfo_v2_t()
    pynvml.nvmlDeviceGetGpuFabricInfoV(pynvml.nvmlDeviceGetHandleByIndex(index), ctypes.byref(info))
    return uuid_text(info.clusterUuid), int(info.cliqueId)


def domain_v1(index: int) -> tuple[str, int]:
    """The same from the older nvmlDeviceGetGpuFabricInfo (no version field)."""
    info = pynvml.c_nvmlGpuFabricInfo_t()
    pynvml.nvmlDeviceGetGpuFabricInfo(pynvml.nvmlDeviceGetHandleByIndex(index), ctypes.byref(info))
    return uuid_text(info.clusterUuid), int(info.cliqueId)


def placement(index: int) -> Placement:
    info = pynvml.c_nvmlPlatformInfo_v2_t()
    pynvml.nvmlDeviceGetPlatformInfo(pynvml.nvmlDeviceGetHandleByIndex(index), ctypes.byref(info))
    # pynvml's structs hand c_char fields back as strings ("" for a NUL byte).

    def byte(value: str) -> int:
        return ord(value) if value else 0

    return (
        info.chassisSerialNumber,
        byte(info.slotNumber),
        byte(info.trayIndex),
        byte(info.hostId),
        byte(info.peerType),
        byte(info.moduleId),
    )


def platform_supported(index: int) -> bool:
    try:
        placement(index)
    except pynvml.NVMLError_NotSupported:
        return False
    return True


# --- plain simulations ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "uuid", "clique"),
    [
        ("h100-sxm", ZERO_UUID, 0),  # the HGX H100 captures: clique 0, zero UUID
        ("h200", ZERO_UUID, 0),
        ("b200", ZERO_UUID, 0),
        ("gb200", "00000001-0000-0000-0000-000000000001", 2),
        ("gb300", "00000001-0000-0000-0000-000000000001", 32766),
    ],
)
def test_the_fabric_names_the_models_domain_by_default(
    make_node: MakeNode, model: str, uuid: str, clique: int
) -> None:
    make_node(f'[node]\nmodel = "{model}"\ngpus = 4\nfabric_state = "completed"\n')
    for index in range(4):
        assert domain_v3(index) == domain_v2(index) == domain_v1(index) == (uuid, clique)


def test_the_scenario_sets_the_domain(make_node: MakeNode) -> None:
    make_node(
        '[node]\nmodel = "gb200"\ngpus = 4\nfabric_state = "completed"\n'
        'fabric_cluster_uuid = "A1B2C3D4-0000-4000-8000-00000000ABCD"\nfabric_clique_id = 9\n'
    )
    assert domain_v3(3) == domain_v1(3) == ("a1b2c3d4-0000-4000-8000-00000000abcd", 9)


def test_a_fabric_fault_leaves_the_domain_as_it_is(make_node: MakeNode) -> None:
    make_node(
        '[node]\nmodel = "h100-sxm"\nfabric_state = "completed"\nfabric_clique_id = 5\n'
        'fabric_cluster_uuid = "a1b2c3d4-0000-4000-8000-00000000abcd"\n'
        '[[fault]]\nkind = "fabric"\ngpu = 0\nstate = "in_progress"\nok = false\n'
        '[[fault]]\nkind = "clear"\ngpu = 0\nat = 0.0\n'
    )
    assert domain_v3(0) == ("a1b2c3d4-0000-4000-8000-00000000abcd", 5)


def test_the_fabric_fault_changes_the_state_only(make_node: MakeNode) -> None:
    make_node(
        '[node]\nmodel = "gb200"\ngpus = 4\nfabric_state = "completed"\n'
        '[[fault]]\nkind = "fabric"\ngpu = 1\nstate = "in_progress"\nok = false\n'
    )
    info = pynvml.c_nvmlGpuFabricInfo_v3_t()
    pynvml.nvmlDeviceGetGpuFabricInfoV(pynvml.nvmlDeviceGetHandleByIndex(1), ctypes.byref(info))
    assert info.state == pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS
    assert domain_v3(1) == ("00000001-0000-0000-0000-000000000001", 2)


def test_the_scenario_places_a_gb200_tray(make_node: MakeNode) -> None:
    make_node(
        '[node]\nmodel = "gb200"\ngpus = 4\nchassis_serial = "1820000000001"\n'
        "slot_number = 14\ntray_index = 4\nhost_id = 1\n"
    )
    assert [placement(i) for i in range(4)] == [
        ("1820000000001", 14, 4, 1, SWITCH_CONNECTED, module) for module in (1, 2, 3, 4)
    ]


def test_a_sixteen_character_serial_fills_its_buffer(make_node: MakeNode) -> None:
    make_node('[node]\nmodel = "gb300"\ngpus = 4\nchassis_serial = "ABCDEFGHIJKLMNOP"\n')
    assert placement(0)[0] == "ABCDEFGHIJKLMNOP"


@pytest.mark.parametrize(
    ("model", "supported"),
    [
        ("gb200", True),
        ("gb300", True),
        ("b200", True),  # its capture prints a platform block (host, peer type)
        ("h100-sxm", False),
        ("h200", False),
        ("a100-sxm4", False),
        ("rtx-4090", False),
    ],
)
def test_platform_info_where_real_drivers_answer_it(
    make_node: MakeNode, model: str, supported: bool
) -> None:
    assert catalog.find_profile(model) is not None
    make_node(f'[node]\nmodel = "{model}"\ngpus = 1\n')
    assert platform_supported(0) is supported


def test_platform_info_left_out_reads_as_unset(make_node: MakeNode) -> None:
    make_node('[node]\nmodel = "gb200"\ngpus = 4\n')
    assert placement(2) == ("", 0, 0, 0, SWITCH_CONNECTED, 3)


def test_platform_info_answers_v2_only(make_node: MakeNode) -> None:
    make_node('[node]\nmodel = "gb200"\ngpus = 4\n')
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch):
        pynvml.nvmlDeviceGetPlatformInfo(handle, ctypes.byref(pynvml.c_nvmlPlatformInfo_v1_t()))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            TRAY + 'fabric_cluster_uuid = "cluster-1"\n',
            "node.fabric_cluster_uuid (line 4): must be a UUID like",
        ),
        (
            TRAY + 'fabric_cluster_uuid = "a1b2c3d4-0000-4000-8000-00000000abc"\n',
            "node.fabric_cluster_uuid (line 4): must be a UUID like",
        ),
        (
            TRAY + "fabric_clique_id = -1\n",
            "node.fabric_clique_id (line 4): must be 0..",
        ),
        (
            'model = "a100-sxm4"\nfabric_clique_id = 3\n',
            "node.fabric_clique_id (line 3): the NVIDIA A100-SXM4-80GB is not in an NVSwitch",
        ),
        (
            'model = "l40s"\nfabric_cluster_uuid = "a1b2c3d4-0000-4000-8000-00000000abcd"\n',
            "node.fabric_cluster_uuid (line 3): the NVIDIA L40S is not in an NVSwitch fabric",
        ),
        (
            TRAY + "tray_index = 256\n",
            "node.tray_index (line 4): must be 0..255",
        ),
        (
            TRAY + "slot_number = -1\n",
            "node.slot_number (line 4): must be 0..255",
        ),
        (TRAY + "host_id = 300\n", "node.host_id (line 4): must be 0..255"),
        (
            TRAY + 'chassis_serial = "12345678901234567"\n',
            "node.chassis_serial (line 4): must be at most 16 printable ASCII characters",
        ),
        (
            TRAY + 'chassis_serial = "rack 7"\n',
            "node.chassis_serial (line 4): must be at most 16 printable ASCII characters",
        ),
        (
            'model = "h100-sxm"\nchassis_serial = "1820000000001"\n',
            "node.chassis_serial (line 3): the NVIDIA H100 80GB HBM3 reports no platform info",
        ),
        (
            'model = "h100-sxm"\ntray_index = 4\n',
            "node.tray_index (line 3): the NVIDIA H100 80GB HBM3",
        ),
        (
            TRAY + 'tray_index = "4"\n',
            "node.tray_index (line 4): expected an integer",
        ),
    ],
)
def test_bad_placement_keys_name_the_key(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_scenario("[node]\n" + text)
    assert str(caught.value).startswith(expected), str(caught.value)


# --- replays ----------------------------------------------------------------------------


def test_a_replayed_gb200_answers_its_domain_and_platform(make_node: MakeNode) -> None:
    make_node(f'[node]\nnvidia_smi = "{GB200_CAPTURE}"\n')
    for index in range(4):
        assert domain_v3(index) == domain_v1(index) == ("00000001-0000-0000-0000-000000000001", 2)
    # The capture's module ids, in its GPU order.
    assert [placement(i) for i in range(4)] == [
        ("1820000000001", 14, 4, 1, SWITCH_CONNECTED, module) for module in (2, 1, 4, 3)
    ]


def test_a_replayed_b200_answers_its_empty_serial(make_node: MakeNode) -> None:
    # Slot and tray printed N/A beside a printed (empty) serial: 0.
    make_node(f'[node]\nnvidia_smi = "{B200_CAPTURE}"\n')
    assert placement(0) == ("", 0, 0, 1, SWITCH_CONNECTED, 6)
    assert domain_v3(0) == (ZERO_UUID, 0)


@pytest.mark.parametrize("capture", [H100_CAPTURE, RTX2080S_CAPTURE], ids=lambda p: p.name)
def test_a_replay_whose_platform_is_na_answers_not_supported(
    make_node: MakeNode, capture: Any
) -> None:
    make_node(f'[node]\nnvidia_smi = "{capture}"\n')
    assert not platform_supported(0)


def test_a_replayed_h100_answers_an_unassigned_domain(make_node: MakeNode) -> None:
    make_node(f'[node]\nnvidia_smi = "{H100_CAPTURE}"\n')
    assert domain_v3(0) == domain_v1(0) == (ZERO_UUID, 0)


def test_a_replay_without_a_fabric_answers_not_supported(make_node: MakeNode) -> None:
    make_node(f'[node]\nnvidia_smi = "{RTX2080S_CAPTURE}"\n')
    with pytest.raises(pynvml.NVMLError_NotSupported):
        domain_v3(0)


def test_a_clique_na_beside_a_fabric_answers_zeros(make_node: MakeNode, tmp_path: Any) -> None:
    text = GB200_CAPTURE.read_text(encoding="utf-8")
    text = text.replace("<cliqueId>2</cliqueId>", "<cliqueId>N/A</cliqueId>", 1)
    text = text.replace(
        "<clusterUuid>00000001-0000-0000-0000-000000000001</clusterUuid>",
        "<clusterUuid>N/A</clusterUuid>",
        1,
    )
    capture = tmp_path / "gb200-na.xml"
    capture.write_text(text, encoding="utf-8")
    make_node(f'[node]\nnvidia_smi = "{capture}"\n')
    assert domain_v3(0) == (ZERO_UUID, 0)
    assert domain_v3(1) == ("00000001-0000-0000-0000-000000000001", 2)
