"""GPU models in the simulator, through the real pynvml: how a scenario picks a model,
what each model supports, its idle and busy readings, and the throttle-duration counters.

Where a real `nvidia-smi -q` capture exists (tests/data/real-hosts), the expectations
here are what that capture shows.
"""

from __future__ import annotations

import ctypes
import dataclasses
import time
from typing import Any

import pynvml
import pytest

from conftest import FakeClock, MakeNode
from gpuagent.config import ConfigError
from gpuagent.sim import GpuProfile, Scenario, SimulatedNode, catalog, parse_scenario

IDLE = pynvml.nvmlClocksEventReasonGpuIdle
SW_POWER_CAP = pynvml.nvmlClocksEventReasonSwPowerCap
HW_SLOWDOWN = pynvml.nvmlClocksEventReasonHwSlowdown
POWER_BRAKE = pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown
SECOND_NS = 1_000_000_000
JOB = {"pid": 4242, "name": "train.py", "used_mib": 1024}

ECC_FIELDS = (
    pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL,
    pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL,
    pynvml.NVML_FI_DEV_ECC_SBE_AGG_TOTAL,
    pynvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL,
)
RETIRED_FIELDS = (
    pynvml.NVML_FI_DEV_RETIRED_SBE,
    pynvml.NVML_FI_DEV_RETIRED_DBE,
    pynvml.NVML_FI_DEV_RETIRED_PENDING,
)
REMAPPED_FIELDS = (
    pynvml.NVML_FI_DEV_REMAPPED_COR,
    pynvml.NVML_FI_DEV_REMAPPED_UNC,
    pynvml.NVML_FI_DEV_REMAPPED_PENDING,
    pynvml.NVML_FI_DEV_REMAPPED_FAILURE,
)
TLIMIT_FIELDS = (
    pynvml.NVML_FI_DEV_TEMPERATURE_SHUTDOWN_TLIMIT,
    pynvml.NVML_FI_DEV_TEMPERATURE_SLOWDOWN_TLIMIT,
    pynvml.NVML_FI_DEV_TEMPERATURE_GPU_MAX_TLIMIT,
)
POLICY_FIELDS = {
    "power": pynvml.NVML_FI_DEV_PERF_POLICY_POWER,
    "thermal": pynvml.NVML_FI_DEV_PERF_POLICY_THERMAL,
    "sync_boost": pynvml.NVML_FI_DEV_PERF_POLICY_SYNC_BOOST,
    "board_limit": pynvml.NVML_FI_DEV_PERF_POLICY_BOARD_LIMIT,
    "low_utilization": pynvml.NVML_FI_DEV_PERF_POLICY_LOW_UTILIZATION,
    "reliability": pynvml.NVML_FI_DEV_PERF_POLICY_RELIABILITY,
}
REASON_FIELDS = {
    "sw_thermal": pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN,
    "hw_thermal": pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN,
    "power_brake": pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN,
}
COUNTER_FIELDS = {**POLICY_FIELDS, **REASON_FIELDS}
MEMBERS = {
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
}


def handle(index: int = 0) -> Any:
    return pynvml.nvmlDeviceGetHandleByIndex(index)


def fields(ids: tuple[int, ...] | list[int], index: int = 0) -> list[int | None]:
    """Each field's value, None where NVML answered NOT_SUPPORTED for it."""
    out: list[int | None] = []
    for value in pynvml.nvmlDeviceGetFieldValues(handle(index), list(ids)):
        if value.nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED:
            out.append(None)
            continue
        assert value.nvmlReturn == pynvml.NVML_SUCCESS
        out.append(getattr(value.value, MEMBERS[value.valueType]))
    return out


def counters(index: int = 0) -> dict[str, int | None]:
    return dict(zip(COUNTER_FIELDS, fields(list(COUNTER_FIELDS.values()), index), strict=True))


def answers(call: Any, *args: Any) -> bool:
    """Whether the NVML call answers (False: NotSupported, as nvidia-smi's N/A)."""
    try:
        call(*args)
    except pynvml.NVMLError_NotSupported:
        return False
    return True


def model_node(make_node: MakeNode, model: str, extra: str = "", **kwargs: Any) -> SimulatedNode:
    return make_node(f'[node]\ngpus = 2\nmodel = "{model}"\n{extra}', **kwargs)


# --- choosing the model ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "reported", "device_id"),
    [
        ("h100-sxm", "NVIDIA H100 80GB HBM3", 0x233010DE),
        ("NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3", 0x233010DE),
        ("h200", "NVIDIA H200", 0x233510DE),
        ("b200", "NVIDIA B200", 0x290110DE),
        ("NVIDIA GB200", "NVIDIA GB200", 0x294110DE),
        ("gb300", "NVIDIA GB300", 0x31C210DE),
        ("a100-sxm4", "NVIDIA A100-SXM4-80GB", 0x20B210DE),
        ("A100-SXM4-80GB", "A100-SXM4-80GB", 0x20B210DE),  # the older drivers' name
        ("nvidia a10g", "NVIDIA A10G", 0x223710DE),  # names match in any case
        ("RTX-4090", "NVIDIA GeForce RTX 4090", 0x268410DE),
        ("NVIDIA L40S", "NVIDIA L40S", 0x26B910DE),
    ],
)
def test_model_by_key_product_name_or_alias(
    make_node: MakeNode, model: str, reported: str, device_id: int
) -> None:
    model_node(make_node, model)
    assert pynvml.nvmlDeviceGetName(handle()) == reported
    assert pynvml.nvmlDeviceGetPciInfo(handle()).pciDeviceId == device_id


def test_default_node_is_eight_h100_sxm(node: SimulatedNode) -> None:
    assert node.hardware.profile is catalog.H100_SXM
    assert pynvml.nvmlDeviceGetCount() == 8
    assert pynvml.nvmlDeviceGetName(handle(7)) == "NVIDIA H100 80GB HBM3"


def test_unknown_model_names_node_model_and_every_known_key() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_scenario('[node]\ngpus = 2\nmodel = "NVIDIA B300"\n')
    assert (caught.value.key, caught.value.line) == ("node.model", 3)
    message = str(caught.value)
    assert message.startswith("node.model (line 3): unknown GPU model 'NVIDIA B300' (known: ")
    assert all(profile.key in message for profile in catalog.PROFILES)


def test_every_catalog_key_and_name_is_distinct() -> None:
    names = [n.casefold() for p in catalog.PROFILES for n in (p.key, p.name, *p.aliases)]
    assert len(names) == len(set(names))


def test_a_profile_built_in_code_is_used_without_registering_it() -> None:
    custom = dataclasses.replace(catalog.A10, key="a10-capture", name="NVIDIA A10 (captured)")
    with SimulatedNode(Scenario(profile=custom)) as node:
        pynvml.nvmlInit()
        assert node.hardware.profile is custom
        assert pynvml.nvmlDeviceGetName(handle()) == "NVIDIA A10 (captured)"
        assert pynvml.nvmlDeviceGetPowerManagementDefaultLimit(handle()) == 150_000
        pynvml.nvmlShutdown()
    assert catalog.find_profile("a10-capture") is None


def test_a_profile_gives_no_layout_past_its_slots() -> None:
    two = dataclasses.replace(catalog.A10, buses=catalog.A10.buses[:2], wide_buses=())
    assert two.max_gpus == 2
    with pytest.raises(ConfigError, match=r"node\.gpus: must be 1\.\.2"):
        SimulatedNode(Scenario(profile=two))


# --- node keys against the model ----------------------------------------------------------


def test_node_keys_left_out_take_the_model_values(make_node: MakeNode) -> None:
    node = model_node(make_node, "a100-sxm4")
    assert node.hardware.nvlinks == 12
    (links,) = fields([pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT])
    assert links == 12
    assert pynvml.nvmlDeviceGetVbiosVersion(handle()) == "92.00.36.00.02"
    assert pynvml.nvmlDeviceGetInforomImageVersion(handle()) == "G506.0212.00.01"


def test_node_keys_given_override_the_model(make_node: MakeNode) -> None:
    model_node(
        make_node,
        "rtx-4090",
        'nvlinks = 4\necc = true\nvbios_version = "95.02.18.C0.09"\n'
        'gsp_firmware_version = "550.54.15"\n',
    )
    (links,) = fields([pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT])
    assert links == 4
    assert pynvml.nvmlDeviceGetEccMode(handle()) == [1, 1]
    assert fields(ECC_FIELDS) == [0, 0, 0, 0]
    assert pynvml.nvmlDeviceGetVbiosVersion(handle()) == "95.02.18.C0.09"
    assert pynvml.nvmlDeviceGetGspFirmwareVersion(handle()) == b"550.54.15"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            'model = "rtx-4090"\nmig_mode = true\n',
            "node.mig_mode (line 4): the NVIDIA GeForce RTX 4090 has no MIG",
        ),
        (
            'model = "l40s"\nmig_profiles = ["1g.10gb"]\n',
            "node.mig_profiles (line 4): the NVIDIA L40S has no MIG",
        ),
        (
            'model = "h100-sxm"\nmig_profiles = ["1g.18gb"]\n',
            "node.mig_profiles (line 4): unknown profile '1g.18gb' (known: 1g.10gb",
        ),
        (
            'model = "h200"\nmig_profiles = ["1g.10gb"]\n',
            "node.mig_profiles (line 4): unknown profile '1g.10gb' (known: 1g.18gb",
        ),
        (
            'model = "a100-sxm4"\nfabric_state = "completed"\n',
            "node.fabric_state (line 4): the NVIDIA A100-SXM4-80GB is not in an NVSwitch",
        ),
        (
            'model = "l40s"\nnvswitches = 4\n',
            "node.nvswitches (line 4): the NVIDIA L40S is not on an NVSwitch baseboard",
        ),
        ('model = "titan-v"\necc = true\n', "node.ecc (line 4): the NVIDIA TITAN V has no ECC"),
        (
            'model = "a10g"\n[[fault]]\ngpu = 0\nkind = "fabric"\nstate = "completed"\n',
            "fault[0].kind (line 6): the NVIDIA A10G is not in an NVSwitch fabric",
        ),
        (
            'model = "a10"\n[[fault]]\ngpu = 0\nkind = "power_limit"\nwatts = 200\n',
            "fault[0].watts (line 7): must be at most 150 on this GPU model",
        ),
    ],
)
def test_node_keys_and_faults_the_model_cannot_have(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_scenario("[node]\ngpus = 2\n" + text)
    assert str(caught.value).startswith(expected), str(caught.value)


@pytest.mark.parametrize(
    ("model", "kind", "params", "message"),
    [
        ("titan-v", "ecc_sbe", {}, "the NVIDIA TITAN V has no ECC"),
        ("titan-v", "ecc_mode", {"enabled": True}, "the NVIDIA TITAN V has no ECC"),
        ("h100-sxm", "retired_pages", {}, "does not retire pages"),
        ("a100-sxm4", "retired_pages", {}, "does not retire pages"),
        ("v100-sxm2", "row_remap_pending", {}, "Tesla V100-SXM2-32GB does not remap rows"),
        ("rtx-4090", "app_clocks", {"mhz": 1500}, "has no applications clocks"),
        ("l40s", "mig_mode", {"enabled": True}, "the NVIDIA L40S has no MIG"),
        ("a10", "fabric", {"state": "completed"}, "is not in an NVSwitch fabric"),
    ],
)
def test_faults_the_model_cannot_have_are_refused(
    make_node: MakeNode, model: str, kind: str, params: dict[str, Any], message: str
) -> None:
    node = model_node(make_node, model)
    with pytest.raises(ValueError, match=rf"^cannot inject '{kind}' on GPU 0: kind: ") as caught:
        node.inject(kind, 0, params)
    assert message in str(caught.value)


# --- what each model supports ---------------------------------------------------------------


@pytest.mark.parametrize("profile", catalog.PROFILES, ids=lambda p: p.key)
def test_each_model_answers_exactly_what_it_supports(
    make_node: MakeNode, profile: GpuProfile
) -> None:
    model_node(make_node, profile.key)
    h = handle()
    ecc = profile.ecc_default
    assert answers(pynvml.nvmlDeviceGetEccMode, h) is profile.ecc
    assert fields(ECC_FIELDS) == ([0] * 4 if ecc else [None] * 4)
    retired = profile.retired_pages and ecc
    assert fields(RETIRED_FIELDS) == ([0] * 3 if retired else [None] * 3)
    assert answers(pynvml.nvmlDeviceGetRetiredPagesPendingStatus, h) is retired
    assert fields(REMAPPED_FIELDS) == ([0] * 4 if profile.row_remapping else [None] * 4)
    assert answers(pynvml.nvmlDeviceGetRemappedRows, h) is profile.row_remapping
    has_memory_sensor = profile.memory_temperature_offset_c is not None
    (memory_temperature,) = fields([pynvml.NVML_FI_DEV_MEMORY_TEMP])
    assert (memory_temperature is not None) is has_memory_sensor
    assert (
        answers(
            pynvml.nvmlDeviceGetTemperatureThreshold, h, pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX
        )
        is has_memory_sensor
    )
    tlimit = fields(TLIMIT_FIELDS)
    assert all((v is not None) is profile.tlimit_fields for v in tlimit)
    assert answers(pynvml.nvmlDeviceGetMarginTemperature, h) is profile.tlimit_fields
    assert fields([pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT]) == [profile.nvlinks]
    assert answers(pynvml.nvmlDeviceGetNvLinkState, h, 0) is (profile.nvlinks > 0)
    assert answers(pynvml.nvmlDeviceGetMigMode, h) is profile.mig
    assert answers(pynvml.nvmlDeviceGetGspFirmwareVersion, h) is profile.gsp_firmware
    assert not answers(
        pynvml.nvmlDeviceGetGpuFabricInfo, h, ctypes.byref(pynvml.c_nvmlGpuFabricInfo_t())
    )  # no fabric until the scenario starts one
    assert answers(pynvml.nvmlDeviceGetFanSpeed, h) is (profile.fan_idle_pct is not None)
    has_app_clocks = profile.applications_clock_mhz is not None
    assert answers(pynvml.nvmlDeviceGetApplicationsClock, h, 0) is has_app_clocks
    assert answers(pynvml.nvmlDeviceGetSerial, h) is profile.serial_number
    assert all((v is not None) is profile.violation_counters for v in counters().values())
    assert answers(pynvml.nvmlDeviceGetViolationStatus, h, 0) is profile.violation_counters
    events = pynvml.nvmlDeviceGetSupportedEventTypes(h)
    assert bool(events & pynvml.nvmlEventTypeDoubleBitEccError) is profile.ecc
    assert bool(events & pynvml.nvmlEventMigConfigChange) is profile.mig
    memory = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
    mib = 1024 * 1024
    assert (memory.total, memory.reserved) == (
        profile.memory_total_mib * mib,
        profile.memory_reserved_mib * mib,
    )
    limits = pynvml.nvmlDeviceGetPowerManagementLimitConstraints(h)
    assert limits == [profile.power_min_limit_w * 1000, profile.power_max_limit_w * 1000]
    default = round(profile.power_default_limit_w * 1000)
    assert pynvml.nvmlDeviceGetPowerManagementLimit(h) == default
    assert pynvml.nvmlDeviceGetEnforcedPowerLimit(h) == default
    assert fields([pynvml.NVML_FI_DEV_POWER_CURRENT_LIMIT]) == [default]
    assert pynvml.nvmlDeviceGetComputeMode(h) == pynvml.NVML_COMPUTEMODE_DEFAULT
    # The mode the board ships with, where it has an ECC mode at all.
    assert answers(pynvml.nvmlDeviceGetDefaultEccMode, h) is profile.ecc
    if profile.ecc:
        assert pynvml.nvmlDeviceGetDefaultEccMode(h) == [int(profile.ecc_default)]


@pytest.mark.parametrize(
    ("mode", "code"),
    [
        ("default", pynvml.NVML_COMPUTEMODE_DEFAULT),
        ("exclusive_process", pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS),
        ("prohibited", pynvml.NVML_COMPUTEMODE_PROHIBITED),
        ("exclusive_thread", pynvml.NVML_COMPUTEMODE_EXCLUSIVE_THREAD),
    ],
)
def test_the_compute_mode_is_the_nodes(make_node: MakeNode, mode: str, code: int) -> None:
    model_node(make_node, "h100-sxm", f'compute_mode = "{mode}"\n')
    assert [pynvml.nvmlDeviceGetComputeMode(handle(i)) for i in range(2)] == [code, code]


def test_setting_the_power_limit_sets_the_requested_and_the_enforced_one(
    node: SimulatedNode,
) -> None:
    pynvml.nvmlDeviceSetPowerManagementLimit(handle(0), 500_000)
    node.inject("power_limit", 1, {"watts": 450})
    for index, limit in ((0, 500_000), (1, 450_000), (2, 700_000)):
        h = handle(index)
        assert pynvml.nvmlDeviceGetPowerManagementLimit(h) == limit
        assert pynvml.nvmlDeviceGetEnforcedPowerLimit(h) == limit
        assert fields([pynvml.NVML_FI_DEV_POWER_CURRENT_LIMIT], index) == [limit]


def test_h100_sxm_answers_as_its_captures_show(node: SimulatedNode) -> None:
    h = handle()
    # Hopper remaps rows only: Retired Pages N/A, through both calls.
    assert fields(RETIRED_FIELDS) == [None, None, None]
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetRetiredPagesPendingStatus(h)
    assert pynvml.nvmlDeviceGetRemappedRows(h) == (0, 0, 0, 0)
    assert pynvml.nvmlDeviceGetEccMode(h) == [1, 1]
    assert fields(TLIMIT_FIELDS) == [-8, -2, 0]
    assert fields([pynvml.NVML_FI_DEV_TEMPERATURE_MEM_MAX_TLIMIT]) == [0]
    assert pynvml.nvmlDeviceGetGspFirmwareVersion(h) == b"550.54.15"
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetFanSpeed(h)
    assert pynvml.nvmlDeviceGetInforomImageVersion(h) == "G520.0200.00.05"


def test_rtx_4090_answers_as_its_captures_show(make_node: MakeNode) -> None:
    model_node(make_node, "rtx-4090")
    h = handle()
    # ECC mode is there and Disabled; with it off every ECC count is N/A.
    assert pynvml.nvmlDeviceGetEccMode(h) == [0, 0]
    assert fields(ECC_FIELDS) == [None] * 4
    assert fields(RETIRED_FIELDS) == [None] * 3
    assert pynvml.nvmlDeviceGetRemappedRows(h) == (0, 0, 0, 0)
    # GDDR6X: no memory temperature and no memory threshold.
    assert fields([pynvml.NVML_FI_DEV_MEMORY_TEMP]) == [None]
    assert fields([pynvml.NVML_FI_DEV_TEMPERATURE_MEM_MAX_TLIMIT]) == [None]
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetTemperatureThreshold(h, pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX)
    assert fields(TLIMIT_FIELDS) == [-7, -2, 0]
    for call in (
        pynvml.nvmlDeviceGetMigMode,
        pynvml.nvmlDeviceGetSerial,
        pynvml.nvmlDeviceGetGspFirmwareVersion,
    ):
        with pytest.raises(pynvml.NVMLError_NotSupported):
            call(h)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetNvLinkState(h, 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetApplicationsClock(h, pynvml.NVML_CLOCK_GRAPHICS)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetViolationStatus(h, pynvml.NVML_PERF_POLICY_THERMAL)
    assert set(counters().values()) == {None}
    assert 30 <= pynvml.nvmlDeviceGetFanSpeed(h) <= 40
    assert pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM) == 3105
    assert pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM) == 10501


def test_a100_with_mig_on_answers_as_its_capture_shows(make_node: MakeNode) -> None:
    # The capture's layout: four 1g.20gb instances.
    model_node(make_node, "a100-sxm4", f"mig_mode = true\nmig_profiles = {['1g.20gb'] * 4}\n")
    h = handle()
    # Utilization and remapped rows are N/A under MIG; so are retired pages on Ampere.
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetUtilizationRates(h)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetEncoderUtilization(h)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetRemappedRows(h)
    assert fields(REMAPPED_FIELDS) == [None] * 4
    assert fields(RETIRED_FIELDS) == [None] * 3
    assert pynvml.nvmlDeviceGetEccMode(h) == [1, 1]
    # The instances are ready for work: clocks at the applications clock, P0, not idle.
    assert pynvml.nvmlDeviceGetCurrentClocksEventReasons(h) == 0
    assert pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM) == 1275
    assert pynvml.nvmlDeviceGetPerformanceState(h) == pynvml.NVML_PSTATE_0
    assert 59_000 <= pynvml.nvmlDeviceGetPowerUsage(h) <= 65_000
    info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(
        h, pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2
    )
    assert (info.multiprocessorCount, info.memorySizeMB, info.instanceCount) == (14, 19968, 4)
    # Ampere on 535 prints absolute thresholds: no T.Limit fields, no margin.
    assert fields(TLIMIT_FIELDS) == [None] * 3
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetMarginTemperature(h)
    get = pynvml.nvmlDeviceGetTemperatureThreshold
    assert [get(h, t) for t in range(4)] == [92, 89, 95, 85]  # shutdown, slowdown, mem, gpu
    assert pynvml.nvmlDeviceGetPowerManagementDefaultLimit(h) == 500_000


def test_a100_without_mig_reports_remapped_rows_and_idles(make_node: MakeNode) -> None:
    model_node(make_node, "a100-sxm4")
    assert pynvml.nvmlDeviceGetRemappedRows(handle()) == (0, 0, 0, 0)
    assert pynvml.nvmlDeviceGetUtilizationRates(handle()).gpu == 0
    assert pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle()) == IDLE
    assert pynvml.nvmlDeviceGetClockInfo(handle(), pynvml.NVML_CLOCK_SM) == 210


def test_h200_offers_its_own_mig_profiles(make_node: MakeNode) -> None:
    model_node(make_node, "h200", 'mig_mode = true\nmig_profiles = ["3g.71gb", "3g.71gb"]\n')
    names = []
    for index in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle(), index)
        except pynvml.NVMLError_NotSupported:
            continue
        names.append(str(info.name).removeprefix("MIG "))
    assert names == ["1g.18gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb", "1g.18gb+me",
                     "1g.35gb"]  # fmt: skip
    total = pynvml.nvmlDeviceGetMemoryInfo(handle(), version=pynvml.nvmlMemory_v2).total
    assert total == 143771 * 1024 * 1024


def test_titan_v_has_no_ecc_and_v100_retires_pages(make_node: MakeNode) -> None:
    titan = model_node(make_node, "titan-v")
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetEccMode(handle())
    assert fields([pynvml.NVML_FI_DEV_ECC_CURRENT, *ECC_FIELDS]) == [None] * 5
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetRemappedRows(handle())
    (memory_temperature,) = fields([pynvml.NVML_FI_DEV_MEMORY_TEMP])
    assert memory_temperature is not None  # HBM2
    assert pynvml.nvmlDeviceGetCurrPcieLinkGeneration(handle()) == 1  # Gen 1 of 3 at idle
    titan.uninstall()
    v100 = model_node(make_node, "v100-sxm2")
    assert fields(RETIRED_FIELDS) == [0, 0, 0]
    v100.inject("retired_pages", 0, {"count": 2, "cause": "sbe", "pending": True})
    assert fields(RETIRED_FIELDS) == [2, 0, 1]
    assert pynvml.nvmlDeviceGetRetiredPagesPendingStatus(handle()) == 1
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetRemappedRows(handle())


def test_pci_layout_follows_the_model(make_node: MakeNode) -> None:
    node = model_node(make_node, "a10g")
    pci = pynvml.nvmlDeviceGetPciInfo(handle(1))
    assert (pci.bus, pci.device, pci.busId) == (0x00, 0x18, "00000000:00:18.0")
    assert pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByPciBusId("0000:00:18.0")) == 1
    assert [f.address for f in node.host_facts().pci or ()] == ["0000:00:17.0", "0000:00:18.0"]
    assert {f.device_id for f in node.host_facts().pci or ()} == {0x2237}


# --- idle and busy -------------------------------------------------------------------------------


@pytest.mark.parametrize("profile", catalog.PROFILES, ids=lambda p: p.key)
def test_a_gpu_without_a_process_is_idle(make_node: MakeNode, profile: GpuProfile) -> None:
    model_node(make_node, profile.key)
    h = handle()
    util = pynvml.nvmlDeviceGetUtilizationRates(h)
    assert (util.gpu, util.memory) == (0, 0)
    assert pynvml.nvmlDeviceGetCurrentClocksEventReasons(h) == IDLE
    assert pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM) == profile.sm_clock_idle_mhz
    memory_clock = pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM)
    assert memory_clock == profile.memory_clock_idle_mhz
    video_clock = pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_VIDEO)
    assert video_clock == profile.video_clock_idle_mhz
    assert pynvml.nvmlDeviceGetPerformanceState(h) == profile.idle_pstate
    power_w = pynvml.nvmlDeviceGetPowerUsage(h) / 1000
    assert profile.power_idle_w * 0.95 <= power_w <= profile.power_idle_w * 1.05
    temperature = pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
    assert profile.temperature_idle_c - 1 <= temperature <= profile.temperature_idle_c + 4
    generation = pynvml.nvmlDeviceGetCurrPcieLinkGeneration(h)
    assert generation == (profile.pcie_idle_generation or profile.pcie_max_generation)


def test_idle_h100_sxm_reads_as_captured(node: SimulatedNode) -> None:
    # h100-sxm-x8.535.183.01: 0 %, Idle active, P0, SM 345 MHz, 68-72 W, 29-37 °C with
    # HBM 8-10 °C warmer, Gen5 x16.
    for index in range(8):
        h = handle(index)
        assert 66_000 <= pynvml.nvmlDeviceGetPowerUsage(h) <= 72_000
        temperature = pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
        assert 27 <= temperature <= 33
        (memory,) = fields([pynvml.NVML_FI_DEV_MEMORY_TEMP], index)
        assert memory is not None
        assert 36 <= memory <= 42
        assert pynvml.nvmlDeviceGetPerformanceState(h) == 0
        assert pynvml.nvmlDeviceGetCurrentClocksEventReasons(h) == IDLE


def test_idle_power_drifts_a_little_and_deterministically(make_node: MakeNode) -> None:
    clock = FakeClock()
    make_node(clock=clock)
    samples = []
    for _ in range(12):
        samples.append(pynvml.nvmlDeviceGetPowerUsage(handle()))
        clock.advance(50)
    assert len(set(samples)) > 6
    assert all(66_000 <= s <= 72_000 for s in samples)


@pytest.mark.parametrize("profile", catalog.PROFILES, ids=lambda p: p.key)
def test_a_gpu_with_a_process_is_busy(make_node: MakeNode, profile: GpuProfile) -> None:
    clock = FakeClock()
    node = model_node(make_node, profile.key, clock=clock)
    h = handle()
    idle_temperature = pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
    node.inject("process", 0, JOB)
    clock.advance(1.0)  # past the power average's second
    assert 88 <= pynvml.nvmlDeviceGetUtilizationRates(h).gpu <= 96
    reasons = pynvml.nvmlDeviceGetCurrentClocksEventReasons(h)
    assert reasons & ~SW_POWER_CAP == 0  # busy: no idle reason; at most the power cap
    top = profile.applications_clock_mhz or profile.sm_clock_max_mhz
    expected = min(top, profile.sm_clock_power_capped_mhz) if reasons else top
    assert pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM) == expected
    memory_clock = pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM)
    assert memory_clock == profile.memory_clock_max_mhz
    assert pynvml.nvmlDeviceGetPerformanceState(h) == profile.busy_pstate
    assert pynvml.nvmlDeviceGetPowerUsage(h) > profile.power_idle_w * 1000 * 2
    assert pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU) > idle_temperature
    generation = pynvml.nvmlDeviceGetCurrPcieLinkGeneration(h)
    assert generation == profile.pcie_max_generation
    node.inject("process_exit", 0, {"pid": JOB["pid"]})
    assert pynvml.nvmlDeviceGetCurrentClocksEventReasons(h) == IDLE


def test_busy_rtx_4090_reads_as_captured(make_node: MakeNode) -> None:
    # rtx4090-x8-busy: P2, 97-100 %, SW Power Cap active at ~446 W of 450, SM 2520-2640
    # MHz, 72-76 °C, fans 86-98 %.
    clock = FakeClock()
    node = model_node(make_node, "rtx-4090", clock=clock)
    node.inject("process", 0, JOB)
    clock.advance(1.0)
    h = handle()
    assert pynvml.nvmlDeviceGetPerformanceState(h) == pynvml.NVML_PSTATE_2
    assert pynvml.nvmlDeviceGetCurrentClocksEventReasons(h) == SW_POWER_CAP
    assert pynvml.nvmlDeviceGetPowerUsage(h) == 450_000
    assert pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM) == 2640
    assert 72 <= pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU) <= 78
    assert 85 <= pynvml.nvmlDeviceGetFanSpeed(h) <= 100


def test_pcie_trains_down_at_idle_on_an_rtx_4090_not_an_h100(make_node: MakeNode) -> None:
    gen = pynvml.nvmlDeviceGetCurrPcieLinkGeneration
    rtx = model_node(make_node, "rtx-4090")
    assert (gen(handle()), pynvml.nvmlDeviceGetMaxPcieLinkGeneration(handle())) == (1, 4)
    rtx.inject("process", 0, JOB)
    assert gen(handle()) == 4
    rtx.inject("pcie_degrade", 0, {"gen": 3})  # a link that cannot reach Gen4 any more
    assert gen(handle()) == 3
    rtx.inject("process_exit", 0, {"pid": JOB["pid"]})
    assert gen(handle()) == 1
    assert pynvml.nvmlDeviceGetCurrPcieLinkWidth(handle()) == 16  # the width stays
    rtx.uninstall()
    h100 = model_node(make_node, "h100-sxm")
    assert gen(handle()) == 5
    h100.inject("process", 0, JOB)
    assert gen(handle()) == 5


# --- throttle-duration counters -----------------------------------------------------------------


def grown(before: dict[str, int | None], after: dict[str, int | None]) -> dict[str, int]:
    """How much each counter grew (0 for those that did not)."""
    return {k: (after[k] or 0) - (before[k] or 0) for k in before}


def test_a_hot_busy_gpu_counts_thermal_throttle_time_exactly(make_node: MakeNode) -> None:
    clock = FakeClock()
    node = make_node("[node]\ngpus = 2\n", clock=clock)
    node.inject("process", 0, JOB)
    node.inject("temperature", 0, {"celsius": 90})  # past max operating and slowdown
    before = counters()
    clock.advance(60)
    after = counters()
    assert grown(before, after) == {
        "power": 0,
        "thermal": 60 * SECOND_NS,
        "sync_boost": 0,
        "board_limit": 0,
        "low_utilization": 0,
        "reliability": 0,
        "sw_thermal": 60 * SECOND_NS,
        "hw_thermal": 60 * SECOND_NS,
        "power_brake": 0,
    }
    # The classic call reads the same counter, stamped in wall-clock microseconds.
    status = pynvml.nvmlDeviceGetViolationStatus(handle(), pynvml.NVML_PERF_POLICY_THERMAL)
    assert status.violationTime == after["thermal"]
    assert abs(status.referenceTime - time.time() * 1_000_000) < 5_000_000
    # Once repaired the thermal counters stop, and keep what they counted; the GPU, idle
    # now, counts low-utilization time instead.
    node.inject("clear", 0, {})
    clock.advance(30)
    assert grown(after, counters()) == {
        **dict.fromkeys(COUNTER_FIELDS, 0),
        "low_utilization": 30 * SECOND_NS,
    }


def test_an_idle_gpu_counts_low_utilization_time(make_node: MakeNode) -> None:
    clock = FakeClock()
    node = make_node("[node]\ngpus = 2\n", clock=clock)
    before = counters()
    clock.advance(12.5)
    assert grown(before, counters())["low_utilization"] == 12_500_000_000
    node.inject("process", 0, JOB)
    before = counters()
    clock.advance(10)
    assert grown(before, counters())["low_utilization"] == 0


def test_power_cap_sync_boost_and_power_brake_count_their_own_time(make_node: MakeNode) -> None:
    clock = FakeClock()
    node = make_node("[node]\ngpus = 2\n", clock=clock)
    node.inject("process", 0, JOB)
    pynvml.nvmlDeviceSetPowerManagementLimit(handle(), 200_000)
    node.inject("throttle", 0, {"reasons": ["sync_boost"]})
    before = counters()
    clock.advance(7)
    assert grown(before, counters()) == {
        **dict.fromkeys(COUNTER_FIELDS, 0),
        "power": 7 * SECOND_NS,
        "sync_boost": 7 * SECOND_NS,
    }
    # The idle-H100 quirk: HW Slowdown and the power brake on an idle GPU. The brake counts;
    # low utilization does not, since Idle is not asserted under it.
    node.inject("clear", 0, {})
    node.inject("throttle", 0, {"reasons": ["hw_slowdown", "power_brake"]})
    assert pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle()) == HW_SLOWDOWN | POWER_BRAKE
    before = counters()
    clock.advance(3)
    assert grown(before, counters()) == {
        **dict.fromkeys(COUNTER_FIELDS, 0),
        "power_brake": 3 * SECOND_NS,
    }


def test_a_scheduled_fault_counts_from_its_own_time(make_node: MakeNode) -> None:
    clock = FakeClock()
    make_node(
        '[node]\ngpus = 1\n[[fault]]\ngpu = 0\nkind = "process"\npid = 7\nname = "job"\n'
        'used_mib = 1\n[[fault]]\nat = 10\ngpu = 0\nkind = "temperature"\ncelsius = 95\n',
        clock=clock,
    )
    before = counters()
    clock.advance(70)  # nothing read the GPU when the fault came due at 10 s
    assert grown(before, counters())["hw_thermal"] == 60 * SECOND_NS


def test_violation_status_checks_its_policy(node: SimulatedNode) -> None:
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetViolationStatus(handle(), pynvml.NVML_PERF_POLICY_COUNT)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetViolationStatus(handle(), pynvml.NVML_PERF_POLICY_TOTAL_APP_CLOCKS)
    for name, policy in (("power", 0), ("low_utilization", 4), ("reliability", 5)):
        (value,) = fields([POLICY_FIELDS[name]])
        status = pynvml.nvmlDeviceGetViolationStatus(handle(), policy)
        assert value is not None
        assert status.violationTime >= value  # the same counter, read a little later


@pytest.mark.parametrize(
    ("driver", "reason_fields", "tlimit"),
    [("525.147.05", False, False), ("535.161.08", False, True), ("550.54.15", True, True)],
)
def test_what_the_driver_version_brings(
    make_node: MakeNode, driver: str, reason_fields: bool, tlimit: bool
) -> None:
    make_node(f'[node]\ngpus = 1\ndriver_version = "{driver}"\n')
    values = counters()
    assert all(values[name] is not None for name in POLICY_FIELDS)  # every driver
    assert all((values[name] is not None) is reason_fields for name in REASON_FIELDS)
    assert all((v is not None) is tlimit for v in fields(TLIMIT_FIELDS))
    assert answers(pynvml.nvmlDeviceGetMarginTemperature, handle()) is tlimit
