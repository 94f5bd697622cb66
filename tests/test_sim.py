"""The simulated NVML library, driven through the real pynvml wrappers."""

from __future__ import annotations

import re
import threading
from typing import Any

import pynvml
import pytest

from conftest import FakeClock, MakeNode
from gpuagent.sim import Scenario, SimulatedNode, parse_scenario

MIB = 1024 * 1024
UUID_RE = re.compile(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def field_values(handle: Any, ids: list[Any]) -> dict[Any, tuple[int, int | float | None]]:
    """(fieldId, scopeId) → (nvmlReturn, value read from the member valueType names)."""
    members = {
        pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
        pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
        pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
        pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
    }
    out = {}
    for v in pynvml.nvmlDeviceGetFieldValues(handle, ids):
        value = getattr(v.value, members[v.valueType]) if v.nvmlReturn == 0 else None
        out[(v.fieldId, v.scopeId)] = (v.nvmlReturn, value)
    return out


# --- library and system -------------------------------------------------------------------


def test_system_queries(node: SimulatedNode) -> None:
    assert pynvml.nvmlSystemGetDriverVersion() == "550.54.15"
    assert pynvml.nvmlSystemGetNVMLVersion() == "12.550.54.15"
    assert pynvml.nvmlSystemGetCudaDriverVersion() == 12040
    assert pynvml.nvmlSystemGetCudaDriverVersion_v2() == 12040
    assert pynvml.nvmlDeviceGetCount() == 8
    assert node.gpu_count == 8


def test_node_values_come_from_the_scenario(make_node: MakeNode) -> None:
    make_node(
        '[node]\ngpus = 2\nmodel = "NVIDIA H100 PCIe"\ndriver_version = "535.161.08"\n'
        "cuda_driver_version = 12020\nnvlinks = 0\n"
    )
    assert pynvml.nvmlDeviceGetCount() == 2
    assert pynvml.nvmlSystemGetNVMLVersion() == "12.535.161.08"
    assert pynvml.nvmlSystemGetCudaDriverVersion() == 12020
    handle = pynvml.nvmlDeviceGetHandleByIndex(1)
    assert pynvml.nvmlDeviceGetName(handle) == "NVIDIA H100 PCIe"
    values = field_values(handle, [pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT])
    assert values[(pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT, 0)] == (0, 0)


def test_error_string_and_error_classes(node: SimulatedNode) -> None:
    assert pynvml.nvmlErrorString(pynvml.NVML_ERROR_GPU_IS_LOST) == "GPU is lost"
    assert pynvml.nvmlErrorString(pynvml.NVML_SUCCESS) == "Success"
    assert pynvml.nvmlErrorString(12345) == "Unknown Error"
    error = pynvml.NVMLError(4321)  # an unknown code: pynvml asks the library for the text
    assert str(error) == "Unknown Error"


def test_calls_before_init_and_after_shutdown_are_uninitialized() -> None:
    node = SimulatedNode(Scenario())
    with node:
        with pytest.raises(pynvml.NVMLError_Uninitialized):
            pynvml.nvmlDeviceGetCount()
        pynvml.nvmlInit()
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        assert pynvml.nvmlDeviceGetCount() == 8  # still one nvmlInit outstanding
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        pynvml.nvmlShutdown()
        with pytest.raises(pynvml.NVMLError_Uninitialized):
            pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)
        with pytest.raises(pynvml.NVMLError_Uninitialized):
            pynvml.nvmlShutdown()


@pytest.mark.parametrize(
    ("problem", "error"),
    [
        ("driver_not_loaded", "NVMLError_DriverNotLoaded"),
        ("library_not_found", "NVMLError_LibraryNotFound"),
        ("version_mismatch", "NVMLError_LibRmVersionMismatch"),
        ("no_permission", "NVMLError_NoPermission"),
        ("other", "NVMLError_Unknown"),
    ],
)
def test_init_error_raises_its_nvml_error(problem: str, error: str) -> None:
    with SimulatedNode(parse_scenario(f'[node]\ninit_error = "{problem}"\n')):
        with pytest.raises(getattr(pynvml, error)):
            pynvml.nvmlInit()
        with pytest.raises(pynvml.NVMLError_Uninitialized):
            pynvml.nvmlDeviceGetCount()


def _init_in_a_thread() -> tuple[threading.Thread, list[object]]:
    """nvmlInit on another thread; the list gets None (success) or the NVMLError."""
    outcome: list[object] = []

    def init() -> None:
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            outcome.append(exc)
        else:
            outcome.append(None)

    thread = threading.Thread(target=init, daemon=True)
    thread.start()
    return thread, outcome


def test_init_timeout_blocks_on_the_node_clock_then_fails() -> None:
    clock = FakeClock()
    scenario = parse_scenario('[node]\ninit_error = "timeout"\n')
    with SimulatedNode(scenario, clock=clock) as node:
        thread, outcome = _init_in_a_thread()
        thread.join(0.3)
        assert thread.is_alive()  # blocked
        assert pynvml.nvmlErrorString(pynvml.NVML_ERROR_TIMEOUT)  # other calls go on
        clock.advance(59)
        thread.join(0.3)
        assert thread.is_alive()
        clock.advance(1)
        thread.join(2)
        assert not thread.is_alive()
        (error,) = outcome
        assert isinstance(error, pynvml.NVMLError_Timeout)
        assert node.call_counts()["nvmlInitWithFlags"] == 1


def test_a_blocked_init_goes_on_when_the_init_error_is_lifted() -> None:
    with SimulatedNode(
        parse_scenario('[node]\ninit_error = "timeout"\n'), clock=FakeClock()
    ) as node:
        thread, outcome = _init_in_a_thread()
        thread.join(0.3)
        assert thread.is_alive()
        node.set_init_error(None)
        thread.join(2)
        assert outcome == [None]
        assert pynvml.nvmlDeviceGetCount() == 8
        pynvml.nvmlShutdown()


def test_init_error_can_be_set_and_lifted() -> None:
    with SimulatedNode(Scenario()) as node:
        node.set_init_error("driver_not_loaded")
        with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
            pynvml.nvmlInit()
        node.set_init_error(None)
        pynvml.nvmlInit()
        assert pynvml.nvmlDeviceGetCount() == 8
        with pytest.raises(ValueError, match="unknown init error 'oops'"):
            node.set_init_error("oops")


def test_unimplemented_function_is_function_not_found(node: SimulatedNode) -> None:
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        pynvml.nvmlDeviceGetBAR1MemoryInfo(handle)


def test_install_and_uninstall_restore_the_previous_library() -> None:
    sentinel = object()
    previous = pynvml.nvmlLib
    pynvml.nvmlLib = sentinel
    try:
        node = SimulatedNode(Scenario())
        node.install()
        node.install()  # twice is harmless
        assert pynvml.nvmlLib is node.library
        node.uninstall()
        assert pynvml.nvmlLib is sentinel
        assert pynvml._nvmlGetFunctionPointer_cache == {}
        node.uninstall()
        assert pynvml.nvmlLib is sentinel
    finally:
        pynvml.nvmlLib = previous


def test_two_nodes_do_not_share_handles(make_node: MakeNode) -> None:
    first = make_node()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    first.uninstall()
    make_node()
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)


# --- handles and identity -----------------------------------------------------------------


def test_handles_by_index_uuid_and_bus_id(node: SimulatedNode) -> None:
    handle = pynvml.nvmlDeviceGetHandleByIndex(3)
    assert pynvml.nvmlDeviceGetIndex(handle) == 3
    uuid = pynvml.nvmlDeviceGetUUID(handle)
    assert pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByUUID(uuid)) == 3
    for bus_id in ("00000000:5D:00.0", "0000:5d:00.0", "5D:00.0"):
        assert pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByPciBusId(bus_id)) == 3
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetHandleByPciBusId("0000:19:00.0")
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetHandleByUUID("GPU-00000000-0000-0000-0000-000000000000")
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetHandleByIndex(8)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetTemperature(pynvml.c_nvmlDevice_t(), pynvml.NVML_TEMPERATURE_GPU)


def test_identity_looks_like_an_hgx_h100_node(node: SimulatedNode) -> None:
    buses = []
    uuids = set()
    for index in range(8):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        assert pynvml.nvmlDeviceGetName(handle) == "NVIDIA H100 80GB HBM3"
        uuid = pynvml.nvmlDeviceGetUUID(handle)
        assert UUID_RE.fullmatch(uuid)
        uuids.add(uuid)
        assert re.fullmatch(r"\d{13}", pynvml.nvmlDeviceGetSerial(handle))
        assert pynvml.nvmlDeviceGetVbiosVersion(handle) == "96.00.99.00.01"
        assert pynvml.nvmlDeviceGetMinorNumber(handle) == index
        pci = pynvml.nvmlDeviceGetPciInfo(handle)
        buses.append(pci.bus)
        assert pci.busId == f"00000000:{pci.bus:02X}:00.0"
        assert pci.busIdLegacy == f"0000:{pci.bus:02X}:00.0"
        assert (pci.domain, pci.device) == (0, 0)
        assert pci.pciDeviceId == 0x233010DE
        assert pynvml.nvmlDeviceGetPowerManagementDefaultLimit(handle) == 700_000
        assert pynvml.nvmlDeviceGetPowerManagementLimitConstraints(handle) == [200_000, 700_000]
        assert pynvml.nvmlDeviceGetMaxPcieLinkGeneration(handle) == 5
        assert pynvml.nvmlDeviceGetMaxPcieLinkWidth(handle) == 16
    assert buses == [0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB]
    assert len(uuids) == 8


def test_identity_is_deterministic_per_seed(make_node: MakeNode) -> None:
    def identities() -> list[tuple[str, str]]:
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(8)]
        return [(pynvml.nvmlDeviceGetUUID(h), pynvml.nvmlDeviceGetSerial(h)) for h in handles]

    first = make_node()
    seed_zero = identities()
    first.uninstall()
    second = make_node()
    assert identities() == seed_zero
    second.uninstall()
    make_node("[node]\nseed = 7\n")
    assert identities() != seed_zero


def test_sixteen_gpus_have_distinct_bus_ids(make_node: MakeNode) -> None:
    make_node("[node]\ngpus = 16\n")
    bus_ids = [
        pynvml.nvmlDeviceGetPciInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).busId for i in range(16)
    ]
    assert len(set(bus_ids)) == 16
    assert bus_ids == sorted(bus_ids)


def test_temperature_thresholds(node: SimulatedNode) -> None:
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    get = pynvml.nvmlDeviceGetTemperatureThreshold
    assert get(handle, pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN) == 87
    assert get(handle, pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN) == 93
    assert get(handle, pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX) == 85
    assert get(handle, pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX) == 95
    with pytest.raises(pynvml.NVMLError_NotSupported):
        get(handle, pynvml.NVML_TEMPERATURE_THRESHOLD_ACOUSTIC_MIN)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        get(handle, 99)


def test_tlimit_fields_convert_to_the_thresholds(node: SimulatedNode) -> None:
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    ids = {
        pynvml.NVML_FI_DEV_TEMPERATURE_SHUTDOWN_TLIMIT: 93,
        pynvml.NVML_FI_DEV_TEMPERATURE_SLOWDOWN_TLIMIT: 87,
        pynvml.NVML_FI_DEV_TEMPERATURE_GPU_MAX_TLIMIT: 85,
    }
    values = pynvml.nvmlDeviceGetFieldValues(handle, list(ids))
    temperature = pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)
    margin = pynvml.nvmlDeviceGetMarginTemperature(handle)
    for value, threshold in zip(values, ids.values(), strict=True):
        assert value.nvmlReturn == pynvml.NVML_SUCCESS
        assert value.valueType == pynvml.NVML_VALUE_TYPE_SIGNED_INT
        assert temperature + margin - value.value.siVal == threshold
    # As the H100 captures print them: shutdown -8, slowdown -2, max operating 0.
    assert [v.value.siVal for v in values] == [-8, -2, 0]
    # The memory's max operating point is on its own scale: 0, as the captures show.
    (memory,) = pynvml.nvmlDeviceGetFieldValues(
        handle, [pynvml.NVML_FI_DEV_TEMPERATURE_MEM_MAX_TLIMIT]
    )
    assert (memory.nvmlReturn, memory.value.siVal) == (pynvml.NVML_SUCCESS, 0)


# --- readings -----------------------------------------------------------------------------

ECC_FIELDS = [
    pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL,
    pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL,
    pynvml.NVML_FI_DEV_ECC_SBE_AGG_TOTAL,
    pynvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL,
]
RETIRED_FIELDS = [
    pynvml.NVML_FI_DEV_RETIRED_SBE,
    pynvml.NVML_FI_DEV_RETIRED_DBE,
    pynvml.NVML_FI_DEV_RETIRED_PENDING,
]
COUNTER_FIELDS = [
    *ECC_FIELDS,
    pynvml.NVML_FI_DEV_REMAPPED_COR,
    pynvml.NVML_FI_DEV_REMAPPED_UNC,
    pynvml.NVML_FI_DEV_REMAPPED_PENDING,
    pynvml.NVML_FI_DEV_REMAPPED_FAILURE,
    pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER,
]


def test_field_values_of_a_healthy_gpu(node: SimulatedNode) -> None:
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    ids: list[Any] = [
        *COUNTER_FIELDS,
        pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION,
        pynvml.NVML_FI_DEV_MEMORY_TEMP,
        pynvml.NVML_FI_DEV_POWER_INSTANT,
        pynvml.NVML_FI_DEV_POWER_CURRENT_LIMIT,
        pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT,
        *[(pynvml.NVML_FI_DEV_NVLINK_GET_STATE, link) for link in range(18)],
        (pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL, 4),
        (pynvml.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL, 4),
        (pynvml.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL, 4),
        (pynvml.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL, 4),
    ]
    raw = pynvml.nvmlDeviceGetFieldValues(handle, ids)
    assert all(v.nvmlReturn == pynvml.NVML_SUCCESS for v in raw)
    assert all(v.timestamp > 1_600_000_000_000_000 for v in raw)  # wall clock, µs
    values = field_values(handle, ids)
    assert all(values[(f, 0)] == (0, 0) for f in COUNTER_FIELDS)
    energy = values[(pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, 0)][1]
    assert isinstance(energy, int)
    assert energy > 1_000_000
    memory_temp = values[(pynvml.NVML_FI_DEV_MEMORY_TEMP, 0)][1]
    gpu_temp = pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)
    assert memory_temp in (gpu_temp + 8, gpu_temp + 9, gpu_temp + 10)  # HBM, as captured
    power = values[(pynvml.NVML_FI_DEV_POWER_INSTANT, 0)][1]
    assert isinstance(power, int)
    assert 66_000 <= power <= 72_000  # an idle H100 SXM, as captured: 67.7-72.0 W
    assert values[(pynvml.NVML_FI_DEV_POWER_CURRENT_LIMIT, 0)] == (0, 700_000)
    assert values[(pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT, 0)] == (0, 18)
    assert all(values[(pynvml.NVML_FI_DEV_NVLINK_GET_STATE, n)] == (0, 1) for n in range(18))
    assert values[(pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL, 4)] == (0, 0)
    # Hopper remaps rows and never retires pages: nvidia-smi shows Retired Pages N/A.
    retired = field_values(handle, RETIRED_FIELDS)
    assert {code for code, _ in retired.values()} == {pynvml.NVML_ERROR_NOT_SUPPORTED}


def test_field_value_types(node: SimulatedNode) -> None:
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    ull = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
    uint = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
    expected = {
        pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL: ull,
        pynvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL: ull,
        pynvml.NVML_FI_DEV_PERF_POLICY_THERMAL: ull,
        pynvml.NVML_FI_DEV_REMAPPED_UNC: uint,
        pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION: ull,
        pynvml.NVML_FI_DEV_POWER_INSTANT: uint,
        pynvml.NVML_FI_DEV_MEMORY_TEMP: uint,
        pynvml.NVML_FI_DEV_NVLINK_GET_STATE: uint,
    }
    values = pynvml.nvmlDeviceGetFieldValues(handle, list(expected))
    assert [v.valueType for v in values] == list(expected.values())


def test_unknown_field_and_bad_link_fail_only_their_entry(node: SimulatedNode) -> None:
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    ids = [
        pynvml.NVML_FI_DEV_PERF_POLICY_TOTAL_APP_CLOCKS,
        (pynvml.NVML_FI_DEV_NVLINK_GET_STATE, 18),
        pynvml.NVML_FI_DEV_MEMORY_TEMP,
    ]
    values = pynvml.nvmlDeviceGetFieldValues(handle, ids)
    assert [v.nvmlReturn for v in values] == [
        pynvml.NVML_ERROR_NOT_SUPPORTED,
        pynvml.NVML_ERROR_INVALID_ARGUMENT,
        pynvml.NVML_SUCCESS,
    ]
    assert pynvml.nvmlDeviceGetFieldValues(handle, []) is not None


def test_ecc_off_makes_ecc_counters_unsupported(make_node: MakeNode) -> None:
    make_node("[node]\necc = false\n")
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceGetEccMode(handle) == [0, 0]
    values = field_values(handle, ECC_FIELDS)
    assert {code for code, _ in values.values()} == {pynvml.NVML_ERROR_NOT_SUPPORTED}
    # Row remapping does not need ECC: the counts stay (the RTX 4090 captures show them).
    assert pynvml.nvmlDeviceGetRemappedRows(handle) == (0, 0, 0, 0)


def test_ecc_off_makes_retired_pages_unsupported_too(make_node: MakeNode) -> None:
    make_node('[node]\nmodel = "v100-sxm2"\necc = false\n')
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    values = field_values(handle, [*ECC_FIELDS, *RETIRED_FIELDS])
    assert {code for code, _ in values.values()} == {pynvml.NVML_ERROR_NOT_SUPPORTED}
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetRetiredPagesPendingStatus(handle)


def test_per_poll_readings_of_an_idle_gpu(node: SimulatedNode) -> None:
    # What the idle H100 SXM captures show (535.183.01): 0 %, Idle active, P0, SM 345 MHz.
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    temperature = pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)
    assert 27 <= temperature <= 33
    util = pynvml.nvmlDeviceGetUtilizationRates(handle)
    assert (util.gpu, util.memory) == (0, 0)
    assert pynvml.nvmlDeviceGetEncoderUtilization(handle) == [0, 167_000]
    assert pynvml.nvmlDeviceGetDecoderUtilization(handle) == [0, 167_000]
    assert pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM) == 345
    assert pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_GRAPHICS) == 345
    assert pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM) == 2619
    assert pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_VIDEO) == 765
    assert pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM) == 1980
    assert pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_VIDEO) == 1545
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetClockInfo(handle, 42)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetTemperature(handle, 5)
    idle = pynvml.nvmlClocksEventReasonGpuIdle
    assert pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle) == idle
    assert pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle) == idle
    assert pynvml.nvmlDeviceGetPerformanceState(handle) == pynvml.NVML_PSTATE_0
    assert pynvml.nvmlDeviceGetComputeRunningProcesses(handle) == []
    assert pynvml.nvmlDeviceGetGraphicsRunningProcesses(handle) == []
    assert pynvml.nvmlDeviceGetCurrPcieLinkGeneration(handle) == 5  # no idle downshift
    assert pynvml.nvmlDeviceGetCurrPcieLinkWidth(handle) == 16
    assert pynvml.nvmlDeviceGetPcieReplayCounter(handle) == 0
    assert pynvml.nvmlDeviceGetPersistenceMode(handle) == pynvml.NVML_FEATURE_ENABLED
    assert pynvml.nvmlDeviceGetMigMode(handle) == [0, 0]
    assert pynvml.nvmlDeviceGetEccMode(handle) == [1, 1]
    assert 66_000 <= pynvml.nvmlDeviceGetPowerUsage(handle) <= 72_000
    assert pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) == 700_000
    assert pynvml.nvmlDeviceGetPowerManagementLimit(handle) == 700_000
    assert pynvml.nvmlDeviceGetRemappedRows(handle) == (0, 0, 0, 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetRetiredPagesPendingStatus(handle)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetFanSpeed(handle)  # cooled by the chassis
    assert pynvml.nvmlDeviceGetNvLinkState(handle, 17) == 1
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetNvLinkState(handle, 18)


def test_per_poll_readings_of_a_busy_gpu(make_node: MakeNode) -> None:
    clock = FakeClock()
    node = make_node(clock=clock)
    handle = pynvml.nvmlDeviceGetHandleByIndex(2)
    node.inject("process", 2, {"pid": 40, "name": "train.py", "used_mib": 70_000})
    clock.advance(1.0)  # a second on, the power average is the busy draw
    util = pynvml.nvmlDeviceGetUtilizationRates(handle)
    assert 88 <= util.gpu <= 96
    assert 0 < util.memory < util.gpu
    assert pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle) == 0
    assert pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM) == 1980
    assert pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_VIDEO) == 1545
    assert pynvml.nvmlDeviceGetPerformanceState(handle) == pynvml.NVML_PSTATE_0
    assert 400_000 < pynvml.nvmlDeviceGetPowerUsage(handle) < 500_000
    assert 50 <= pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU) <= 60
    assert pynvml.nvmlDeviceGetCurrPcieLinkGeneration(handle) == 5


def test_memory_info_v1_counts_reserved_as_used_and_v2_does_not(node: SimulatedNode) -> None:
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    v2 = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
    assert v2.total == 81559 * MIB
    assert v2.reserved == 551 * MIB
    assert v2.used == 0
    assert v2.free == v2.total - v2.reserved
    v1 = pynvml.nvmlDeviceGetMemoryInfo(handle)
    assert (v1.total, v1.used, v1.free) == (v2.total, v2.reserved, v2.free)


def test_memory_info_rejects_an_unknown_struct_version(node: SimulatedNode) -> None:
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch):
        pynvml.nvmlDeviceGetMemoryInfo(handle, version=0x01000028)


def test_mig_mode_hides_whole_gpu_utilization(make_node: MakeNode) -> None:
    make_node("[node]\nmig_mode = true\n")
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceGetMigMode(handle) == [1, 1]
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetUtilizationRates(handle)


def test_readings_drift_slowly_and_deterministically(make_node: MakeNode) -> None:
    clock = FakeClock()
    busy = '[[fault]]\ngpu = 0\nkind = "process"\npid = 9\nname = "job"\nused_mib = 1\n'
    make_node(busy, clock=clock)
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)

    def sample() -> tuple[int, int, int]:
        return (
            pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU),
            pynvml.nvmlDeviceGetPowerUsage(handle),
            pynvml.nvmlDeviceGetUtilizationRates(handle).gpu,
        )

    samples = []
    for _ in range(12):
        samples.append(sample())
        clock.advance(50)
    assert len({s[1] for s in samples}) > 6  # power moves
    assert len({s[2] for s in samples}) > 3  # and so does the load
    assert max(s[0] for s in samples) - min(s[0] for s in samples) <= 8
    other_clock = FakeClock()
    make_node(busy, clock=other_clock)
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    replay = []
    for _ in range(12):
        replay.append(sample())
        other_clock.advance(50)
    assert replay == samples


def test_energy_integrates_power_over_time(make_node: MakeNode) -> None:
    clock = FakeClock()
    make_node(clock=clock)
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    energy = pynvml.nvmlDeviceGetTotalEnergyConsumption
    start = energy(handle)
    clock.advance(10)
    power = pynvml.nvmlDeviceGetPowerUsage(handle)
    gained = energy(handle) - start
    assert power * 10 * 0.98 < gained < power * 10 * 1.02  # mW x s = mJ
    assert energy(handle) == start + gained  # no time passed, no energy


# --- setters ------------------------------------------------------------------------------


def test_persistence_mode_can_be_set(node: SimulatedNode) -> None:
    handle = pynvml.nvmlDeviceGetHandleByIndex(1)
    pynvml.nvmlDeviceSetPersistenceMode(handle, pynvml.NVML_FEATURE_DISABLED)
    assert pynvml.nvmlDeviceGetPersistenceMode(handle) == 0
    pynvml.nvmlDeviceSetPersistenceMode(handle, pynvml.NVML_FEATURE_ENABLED)
    assert pynvml.nvmlDeviceGetPersistenceMode(handle) == 1
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceSetPersistenceMode(handle, 2)


def test_power_limit_is_validated_and_caps_the_draw(make_node: MakeNode) -> None:
    clock = FakeClock()
    node = make_node(clock=clock)
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    for bad in (199_999, 700_001):
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            pynvml.nvmlDeviceSetPowerManagementLimit(handle, bad)
    assert pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) == 700_000
    node.inject("process", 0, {"pid": 10, "name": "burn", "used_mib": 100})
    pynvml.nvmlDeviceSetPowerManagementLimit(handle, 200_000)
    assert pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) == 200_000
    assert _field(handle, pynvml.NVML_FI_DEV_POWER_INSTANT) == 200_000
    clock.advance(1.0)
    assert pynvml.nvmlDeviceGetPowerUsage(handle) == 200_000
    reasons = pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle)
    assert reasons == pynvml.nvmlClocksEventReasonSwPowerCap
    assert pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM) < 1980


def _field(handle: Any, field_id: int) -> int:
    (value,) = pynvml.nvmlDeviceGetFieldValues(handle, [field_id])
    assert value.nvmlReturn == pynvml.NVML_SUCCESS
    return int(value.value.uiVal)


def test_the_power_average_lags_a_step_in_load_and_the_instant_does_not(
    make_node: MakeNode,
) -> None:
    """NVML's power usage (field 185) is the last second's average, as on the real H200
    (79.2 W average beside 81.5 W instantaneous); field 186 is the draw now."""
    clock = FakeClock()
    node = make_node(clock=clock)
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    idle = pynvml.nvmlDeviceGetPowerUsage(handle)
    assert _field(handle, pynvml.NVML_FI_DEV_POWER_AVERAGE) == idle
    assert _field(handle, pynvml.NVML_FI_DEV_POWER_INSTANT) == pytest.approx(idle, rel=0.05)
    node.inject("process", 0, {"pid": 10, "name": "train", "used_mib": 100})
    instant = _field(handle, pynvml.NVML_FI_DEV_POWER_INSTANT)
    average = pynvml.nvmlDeviceGetPowerUsage(handle)
    assert instant > 400_000  # busy at once
    assert idle < average < instant / 2  # still mostly the idle second before
    clock.advance(0.5)
    assert average < pynvml.nvmlDeviceGetPowerUsage(handle) < instant
    clock.advance(0.5)
    caught_up = pynvml.nvmlDeviceGetPowerUsage(handle)
    assert caught_up == pytest.approx(_field(handle, pynvml.NVML_FI_DEV_POWER_INSTANT), rel=0.05)
    node.inject("process_exit", 0, {"pid": 10})
    assert _field(handle, pynvml.NVML_FI_DEV_POWER_INSTANT) < 100_000
    assert pynvml.nvmlDeviceGetPowerUsage(handle) > 300_000  # and lags the drop as well


# --- call counting and threads ------------------------------------------------------------


def test_call_counts_by_c_function_and_device(node: SimulatedNode) -> None:
    node.reset_call_counts()
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in (0, 1)]
    for _ in range(3):
        pynvml.nvmlDeviceGetTemperature(handles[0], pynvml.NVML_TEMPERATURE_GPU)
    pynvml.nvmlDeviceGetFieldValues(handles[1], [pynvml.NVML_FI_DEV_MEMORY_TEMP])
    pynvml.nvmlDeviceGetMemoryInfo(handles[1], version=pynvml.nvmlMemory_v2)
    assert node.call_counts() == {
        "nvmlDeviceGetHandleByIndex_v2": 2,
        "nvmlDeviceGetTemperature": 3,
        "nvmlDeviceGetFieldValues": 1,
        "nvmlDeviceGetMemoryInfo_v2": 1,
    }
    per_device = node.calls_per_device()
    assert per_device == {0: 3, 1: 2, 2: 0, 3: 0, 4: 0, 5: 0, 6: 0, 7: 0}
    node.reset_call_counts()
    assert node.call_counts() == {}
    assert set(node.calls_per_device().values()) == {0}


def test_calls_from_many_threads_are_all_counted(node: SimulatedNode) -> None:
    node.reset_call_counts()
    errors: list[BaseException] = []

    def worker(index: int) -> None:
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            for _ in range(200):
                pynvml.nvmlDeviceGetFieldValues(handle, [pynvml.NVML_FI_DEV_POWER_INSTANT])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert node.call_counts()["nvmlDeviceGetFieldValues"] == 1600
    assert set(node.calls_per_device().values()) == {200}


def test_elapsed_follows_the_clock(make_node: MakeNode) -> None:
    clock = FakeClock()
    node = make_node(clock=clock)
    assert node.elapsed() == 0
    clock.advance(2.5)
    assert node.elapsed() == 2.5
