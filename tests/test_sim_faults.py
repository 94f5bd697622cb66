"""Simulated faults, as the agent sees them through pynvml: kinds, timing, hangs, events."""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable
from typing import Any

import pynvml
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import FakeClock, MakeNode
from gpuagent.model import fabric_conditions
from gpuagent.nvml.device import decode_ber
from gpuagent.sim import (
    FAULT_KINDS,
    Fault,
    GpuResetError,
    Scenario,
    SimulatedNode,
)

MIB = 1024 * 1024
V100 = '[node]\nmodel = "v100-sxm2"\n'


def handle(index: int) -> Any:
    return pynvml.nvmlDeviceGetHandleByIndex(index)


def field(index: int, field_id: int, scope: int = 0) -> int | None:
    (value,) = pynvml.nvmlDeviceGetFieldValues(handle(index), [(field_id, scope)])
    if value.nvmlReturn != pynvml.NVML_SUCCESS:
        return None
    member = {pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal"}.get(value.valueType, "ullVal")
    result: int = getattr(value.value, member)
    return result


def ecc(index: int) -> tuple[int | None, ...]:
    return tuple(
        field(index, f)
        for f in (
            pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL,
            pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL,
            pynvml.NVML_FI_DEV_ECC_SBE_AGG_TOTAL,
            pynvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL,
        )
    )


def temperature(index: int) -> int:
    result: int = pynvml.nvmlDeviceGetTemperature(handle(index), pynvml.NVML_TEMPERATURE_GPU)
    return result


def reasons(index: int) -> int:
    result: int = pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle(index))
    return result


# --- each kind -------------------------------------------------------------------------------


def test_ecc_errors_add_to_volatile_and_aggregate_counts(node: SimulatedNode) -> None:
    node.inject("ecc_sbe", 2, {"count": 5})
    node.inject("ecc_sbe", 2, {})
    node.inject("ecc_dbe", 2, {"count": 2})
    assert ecc(2) == (6, 2, 6, 2)
    assert ecc(3) == (0, 0, 0, 0)


def test_retired_pages(make_node: MakeNode) -> None:
    node = make_node(V100)  # page retirement is Volta's; later GPUs remap rows
    node.inject("retired_pages", 1, {"count": 2, "pending": True})
    node.inject("retired_pages", 1, {"count": 3, "cause": "sbe"})
    assert field(1, pynvml.NVML_FI_DEV_RETIRED_DBE) == 2
    assert field(1, pynvml.NVML_FI_DEV_RETIRED_SBE) == 3
    assert field(1, pynvml.NVML_FI_DEV_RETIRED_PENDING) == 1
    assert pynvml.nvmlDeviceGetRetiredPagesPendingStatus(handle(1)) == 1
    node.reset_gpu(1)  # the retirement takes effect
    assert field(1, pynvml.NVML_FI_DEV_RETIRED_PENDING) == 0
    assert field(1, pynvml.NVML_FI_DEV_RETIRED_DBE) == 2
    node.inject("retired_pages", 1, {"pending": True})
    node.inject("clear", 1, {})  # the retired pages stay, the pending one goes
    assert field(1, pynvml.NVML_FI_DEV_RETIRED_PENDING) == 0
    assert field(1, pynvml.NVML_FI_DEV_RETIRED_DBE) == 3


def test_retired_pages_are_refused_on_a_gpu_that_remaps_rows(node: SimulatedNode) -> None:
    with pytest.raises(ValueError, match="H100 80GB HBM3 does not retire pages"):
        node.inject("retired_pages", 1, {"count": 2})


def test_row_remap_pending_and_failure(node: SimulatedNode) -> None:
    node.inject("row_remap_pending", 4, {})
    assert field(4, pynvml.NVML_FI_DEV_REMAPPED_UNC) == 1
    assert field(4, pynvml.NVML_FI_DEV_REMAPPED_PENDING) == 1
    assert field(4, pynvml.NVML_FI_DEV_REMAPPED_FAILURE) == 0
    histogram = pynvml.nvmlDeviceGetRowRemapperHistogram(handle(4))
    assert (histogram.max, histogram.none) == (2560, 0)  # the H100 captures' 2560 banks
    node.inject("row_remap_failure", 4, {})
    assert pynvml.nvmlDeviceGetRemappedRows(handle(4)) == (0, 1, 1, 1)
    # A failed remap is a bank out of spare rows.
    histogram = pynvml.nvmlDeviceGetRowRemapperHistogram(handle(4))
    assert (histogram.max, histogram.none) == (2559, 1)


def busy(node: SimulatedNode, index: int) -> None:
    """Start a job on GPU ``index``: a busy GPU raises no idle reason of its own."""
    node.inject("process", index, {"pid": 1000 + index, "name": "job", "used_mib": 1024})


def test_temperature_hold_and_the_reasons_a_hot_gpu_raises(node: SimulatedNode) -> None:
    busy(node, 6)
    node.inject("temperature", 6, {"celsius": 84})
    assert temperature(6) == 84
    assert field(6, pynvml.NVML_FI_DEV_MEMORY_TEMP) == 93  # HBM runs 9 °C above
    assert reasons(6) == 0
    node.inject("temperature", 6, {"celsius": 85.4})
    assert reasons(6) == pynvml.nvmlClocksEventReasonSwThermalSlowdown
    node.inject("temperature", 6, {"celsius": 89})
    assert reasons(6) == (
        pynvml.nvmlClocksEventReasonSwThermalSlowdown
        | pynvml.nvmlClocksEventReasonHwSlowdown
        | pynvml.nvmlClocksEventReasonHwThermalSlowdown
    )
    assert pynvml.nvmlDeviceGetClockInfo(handle(6), pynvml.NVML_CLOCK_SM) == 1095
    assert pynvml.nvmlDeviceGetMarginTemperature(handle(6)) == -4
    assert temperature(5) < 50


def test_throttle_sets_the_reason_bitmask(node: SimulatedNode) -> None:
    busy(node, 0)
    node.inject("throttle", 0, {"reasons": ["hw_slowdown"]})
    assert reasons(0) == pynvml.nvmlClocksEventReasonHwSlowdown
    assert pynvml.nvmlDeviceGetClockInfo(handle(0), pynvml.NVML_CLOCK_SM) == 1095
    node.inject("throttle", 0, {"reasons": ["sw_power_cap"]})
    assert pynvml.nvmlDeviceGetClockInfo(handle(0), pynvml.NVML_CLOCK_SM) == 1665
    node.inject("throttle", 0, {"reasons": ["gpu_idle"]})
    assert reasons(0) == pynvml.nvmlClocksEventReasonGpuIdle
    assert pynvml.nvmlDeviceGetClockInfo(handle(0), pynvml.NVML_CLOCK_SM) == 345
    node.inject("throttle", 0, {"reasons": []})
    assert reasons(0) == 0
    assert pynvml.nvmlDeviceGetClockInfo(handle(0), pynvml.NVML_CLOCK_SM) == 1980


def test_hw_slowdown_and_power_brake_on_an_idle_h100_as_captured(node: SimulatedNode) -> None:
    # h100-sxm-x8.535.161.08: every idle GPU shows HW Slowdown and HW Power Brake active,
    # Idle not active, P0, SM at 86 MHz, the video clock at its idle 765 MHz.
    node.inject("throttle", 0, {"reasons": ["hw_slowdown", "power_brake"]})
    assert reasons(0) == (
        pynvml.nvmlClocksEventReasonHwSlowdown | pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown
    )
    assert pynvml.nvmlDeviceGetClockInfo(handle(0), pynvml.NVML_CLOCK_SM) == 86
    assert pynvml.nvmlDeviceGetClockInfo(handle(0), pynvml.NVML_CLOCK_VIDEO) == 765
    assert pynvml.nvmlDeviceGetPerformanceState(handle(0)) == pynvml.NVML_PSTATE_0
    assert pynvml.nvmlDeviceGetUtilizationRates(handle(0)).gpu == 0
    assert 66_000 <= pynvml.nvmlDeviceGetPowerUsage(handle(0)) <= 72_000


@pytest.mark.parametrize(
    ("name", "bit"),
    [
        ("gpu_idle", pynvml.nvmlClocksEventReasonGpuIdle),
        ("applications_clocks", pynvml.nvmlClocksEventReasonApplicationsClocksSetting),
        ("sw_power_cap", pynvml.nvmlClocksEventReasonSwPowerCap),
        ("hw_slowdown", pynvml.nvmlClocksEventReasonHwSlowdown),
        ("sync_boost", pynvml.nvmlClocksEventReasonSyncBoost),
        ("sw_thermal", pynvml.nvmlClocksEventReasonSwThermalSlowdown),
        ("hw_thermal", pynvml.nvmlClocksEventReasonHwThermalSlowdown),
        ("power_brake", pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown),
    ],
)
def test_each_throttle_reason_name(node: SimulatedNode, name: str, bit: int) -> None:
    busy(node, 1)
    node.inject("throttle", 1, {"reasons": [name]})
    assert reasons(1) == bit


def test_pcie_degrade_and_replays(node: SimulatedNode) -> None:
    node.inject("pcie_degrade", 3, {"width": 8})
    assert pynvml.nvmlDeviceGetCurrPcieLinkWidth(handle(3)) == 8
    assert pynvml.nvmlDeviceGetCurrPcieLinkGeneration(handle(3)) == 5
    node.inject("pcie_degrade", 3, {"gen": 3, "width": 4})
    assert pynvml.nvmlDeviceGetCurrPcieLinkGeneration(handle(3)) == 3
    assert pynvml.nvmlDeviceGetMaxPcieLinkGeneration(handle(3)) == 5
    node.inject("pcie_replay", 3, {"count": 40})
    node.inject("pcie_replay", 3, {})
    assert field(3, pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER) == 41
    assert pynvml.nvmlDeviceGetPcieReplayCounter(handle(3)) == 41


def test_lost_gpu_fails_every_handle_call_and_only_that_gpu(node: SimulatedNode) -> None:
    lost = handle(5)
    node.inject("gpu_lost", 5, {})
    calls: list[Callable[[], Any]] = [
        lambda: pynvml.nvmlDeviceGetTemperature(lost, pynvml.NVML_TEMPERATURE_GPU),
        lambda: pynvml.nvmlDeviceGetFieldValues(lost, [pynvml.NVML_FI_DEV_MEMORY_TEMP]),
        lambda: pynvml.nvmlDeviceGetMemoryInfo(lost, version=pynvml.nvmlMemory_v2),
        lambda: pynvml.nvmlDeviceGetComputeRunningProcesses(lost),
        lambda: pynvml.nvmlDeviceGetUUID(lost),
        lambda: pynvml.nvmlDeviceGetPciInfo(lost),
        lambda: pynvml.nvmlDeviceSetPersistenceMode(lost, 1),
        lambda: pynvml.nvmlDeviceGetHandleByIndex(5),
    ]
    for call in calls:
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            call()
    assert pynvml.nvmlDeviceGetCount() == 8  # a lost GPU is still enumerated
    assert temperature(4) > 0


def _pci_gpus(node: SimulatedNode) -> list[str]:
    return [f.address for f in node.host_facts().pci or () if f.role == "gpu"]


def test_pci_remove_takes_the_gpu_off_the_simulated_bus_until_clear(node: SimulatedNode) -> None:
    on_the_bus = _pci_gpus(node)
    assert len(on_the_bus) == 8
    node.inject("pci_remove", 2, {})
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        handle(2)
    assert pynvml.nvmlDeviceGetCount() == 8  # NVML still counts it, as a lost GPU
    assert _pci_gpus(node) == [bus for bus in on_the_bus if bus != "0000:3a:00.0"]
    node.inject("gpu_lost", 4, {})  # lost to NVML, yet still on the bus
    assert "0000:9a:00.0" in _pci_gpus(node)
    node.inject("clear", 2, {})
    assert temperature(2) > 0
    assert _pci_gpus(node) == on_the_bus


def test_pci_remove_keeps_the_pci_only_gpus_where_they_are(make_node: MakeNode) -> None:
    node = make_node(
        '[node]\ngpus = 2\npci_only_gpus = 1\n[[fault]]\ngpu = 0\nkind = "pci_remove"\n'
    )
    assert [(f.address, f.driver) for f in node.host_facts().pci or ()] == [
        ("0000:2a:00.0", "nvidia"),
        ("0000:3a:00.0", None),
    ]


def test_lost_gpu_at_start_has_no_handle(make_node: MakeNode) -> None:
    make_node('[[fault]]\ngpu = 0\nkind = "gpu_lost"\n')
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        handle(0)
    assert temperature(1) > 0


def test_persistence_off(node: SimulatedNode) -> None:
    node.inject("persistence_off", 7, {})
    assert pynvml.nvmlDeviceGetPersistenceMode(handle(7)) == 0
    assert pynvml.nvmlDeviceGetPersistenceMode(handle(6)) == 1


def test_nvlink_down_and_errors(node: SimulatedNode) -> None:
    node.inject("nvlink_down", 2, {"link": 3})
    assert field(2, pynvml.NVML_FI_DEV_NVLINK_GET_STATE, 3) == 0
    assert field(2, pynvml.NVML_FI_DEV_NVLINK_GET_STATE, 4) == 1
    assert pynvml.nvmlDeviceGetNvLinkState(handle(2), 3) == 0
    node.inject("nvlink_errors", 2, {"link": 3, "crc_flit": 5, "replay": 2})
    node.inject("nvlink_errors", 2, {"link": 3, "crc_data": 1, "recovery": 7})
    node.inject("nvlink_errors", 2, {"link": 11, "crc_flit": 4})
    # The *_TOTAL fields are the sum over every link, whatever the scope asks for.
    for scope in (0, 3):
        assert field(2, pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL, scope) == 9
        assert field(2, pynvml.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL, scope) == 1
        assert field(2, pynvml.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL, scope) == 2
        assert field(2, pynvml.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL, scope) == 7
    assert field(1, pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL, 0) == 0


def test_nvlink_ber_is_packed_per_link_as_nvml_packs_it(node: SimulatedNode) -> None:
    effective = pynvml.NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_BER
    zero = (15 << 8) | 255  # mantissa 15, exponent 255
    assert field(2, effective, 5) == zero
    node.inject("nvlink_ber", 2, {"link": 5, "effective_ber": 2e-11, "symbol_ber": 9.6e-12})
    assert field(2, effective, 5) == (2 << 8) | 11
    assert field(2, pynvml.NVML_FI_DEV_NVLINK_COUNT_SYMBOL_BER, 5) == (1 << 8) | 11
    assert decode_ber(field(2, effective, 5)) == pytest.approx(2e-11)
    assert decode_ber(zero) == 0.0
    assert field(2, effective, 4) == zero
    node.inject("clear", 2, {})
    assert field(2, effective, 5) == zero


def test_c2c_links_and_errors_on_grace_blackwell_only(make_node: MakeNode) -> None:
    hopper = make_node('[node]\ngpus = 2\nmodel = "NVIDIA H100 80GB HBM3"\n')
    assert field(0, pynvml.NVML_FI_DEV_C2C_LINK_COUNT) is None  # NOT_SUPPORTED, as on H200
    with pytest.raises(ValueError, match="has no NVLink-C2C"):
        hopper.inject("c2c_errors", 0, {})
    node = make_node('[node]\ngpus = 4\nmodel = "gb200"\n')
    assert field(1, pynvml.NVML_FI_DEV_C2C_LINK_COUNT) == 1
    assert field(1, pynvml.NVML_FI_DEV_C2C_LINK_GET_STATUS, 0) == 1
    node.inject("c2c_errors", 1, {"count": 3})
    node.inject("c2c_errors", 1, {"counter": "replay_b2b"})
    assert field(1, pynvml.NVML_FI_DEV_C2C_LINK_ERROR_INTR, 0) == 3
    assert field(1, pynvml.NVML_FI_DEV_C2C_LINK_ERROR_REPLAY, 0) == 0
    assert field(1, pynvml.NVML_FI_DEV_C2C_LINK_ERROR_REPLAY_B2B, 0) == 1
    assert field(0, pynvml.NVML_FI_DEV_C2C_LINK_ERROR_INTR, 0) == 0
    with pytest.raises(ValueError, match="no such C2C link"):
        node.inject("c2c_errors", 1, {"link": 1})


def test_process_shows_in_processes_memory_and_load(make_node: MakeNode) -> None:
    clock = FakeClock()
    node = make_node(clock=clock)
    idle_power = pynvml.nvmlDeviceGetPowerUsage(handle(1))
    node.inject("process", 1, {"pid": 4242, "name": "train.py", "used_mib": 1024})
    node.inject("process", 1, {"pid": 4243, "name": "eval.py", "used_mib": 512.5})
    clock.advance(1.0)  # the power average has caught up with the load
    processes = pynvml.nvmlDeviceGetComputeRunningProcesses(handle(1))
    assert [(p.pid, p.usedGpuMemory) for p in processes] == [
        (4242, 1024 * MIB),
        (4243, int(512.5 * MIB)),
    ]
    assert {p.gpuInstanceId for p in processes} == {0xFFFFFFFF}
    memory = pynvml.nvmlDeviceGetMemoryInfo(handle(1), version=pynvml.nvmlMemory_v2)
    assert memory.used == 1024 * MIB + int(512.5 * MIB)
    assert memory.free == memory.total - memory.reserved - memory.used
    assert pynvml.nvmlDeviceGetUtilizationRates(handle(1)).gpu >= 80
    assert pynvml.nvmlDeviceGetPowerUsage(handle(1)) > idle_power + 150_000
    assert node.process_name(4242) == "train.py"
    assert pynvml.nvmlSystemGetProcessName(4243) == "eval.py"
    assert node.process_name(1) is None
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlSystemGetProcessName(1)
    assert pynvml.nvmlDeviceGetComputeRunningProcesses(handle(0)) == []


def test_process_exit_ends_only_that_process(node: SimulatedNode) -> None:
    node.inject("process", 2, {"pid": 10, "name": "a", "used_mib": 1})
    node.inject("process", 2, {"pid": 11, "name": "b", "used_mib": 1})
    node.inject("process_exit", 2, {"pid": 10})
    node.inject("process_exit", 2, {"pid": 99})  # not running: nothing happens
    assert [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle(2))] == [11]


def test_process_list_sizing_call(node: SimulatedNode) -> None:
    node.inject("process", 0, {"pid": 7, "name": "a", "used_mib": 1})
    function = node.library.nvmlDeviceGetComputeRunningProcesses_v3
    count = pynvml.c_uint(0)
    code = function(handle(0), pynvml.byref(count), None)
    assert (code, count.value) == (pynvml.NVML_ERROR_INSUFFICIENT_SIZE, 1)
    too_small = (pynvml.c_nvmlProcessInfo_v3_t * 1)()
    node.inject("process", 0, {"pid": 8, "name": "b", "used_mib": 1})
    code = function(handle(0), pynvml.byref(count), too_small)
    assert (code, count.value) == (pynvml.NVML_ERROR_INSUFFICIENT_SIZE, 2)


def test_clear_returns_the_gpu_to_healthy_and_keeps_lifetime_counters(
    node: SimulatedNode,
) -> None:
    for kind, params in [
        ("ecc_sbe", {"count": 3}),
        ("ecc_dbe", {}),
        ("row_remap_pending", {}),
        ("row_remap_failure", {}),
        ("temperature", {"celsius": 95}),
        ("throttle", {"reasons": ["hw_slowdown"]}),
        ("pcie_degrade", {"gen": 2}),
        ("pcie_replay", {"count": 9}),
        ("persistence_off", {}),
        ("nvlink_down", {"link": 0}),
        ("nvlink_errors", {"link": 0, "crc_flit": 4}),
        ("process", {"pid": 99, "name": "x", "used_mib": 10}),
        ("gpu_lost", {}),
    ]:
        node.inject(kind, 3, params)
    node.inject("clear", 3, {})
    h = handle(3)
    assert ecc(3) == (0, 0, 3, 1)
    assert pynvml.nvmlDeviceGetRemappedRows(h) == (0, 1, 0, 0)
    assert temperature(3) < 50
    assert reasons(3) == pynvml.nvmlClocksEventReasonGpuIdle  # no process left: idle
    assert pynvml.nvmlDeviceGetCurrPcieLinkGeneration(h) == 5
    assert pynvml.nvmlDeviceGetPcieReplayCounter(h) == 9
    assert pynvml.nvmlDeviceGetPersistenceMode(h) == 1
    assert pynvml.nvmlDeviceGetNvLinkState(h, 0) == 1
    assert field(3, pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL, 0) == 4
    assert pynvml.nvmlDeviceGetComputeRunningProcesses(h) == []


def test_ecc_and_mig_mode_changes_wait_for_a_reset(node: SimulatedNode) -> None:
    node.inject("ecc_mode", 1, {"enabled": False})
    node.inject("mig_mode", 1, {"enabled": True})
    assert pynvml.nvmlDeviceGetEccMode(handle(1)) == [1, 0]
    assert pynvml.nvmlDeviceGetMigMode(handle(1)) == [0, 1]
    assert pynvml.nvmlDeviceGetEccMode(handle(0)) == [1, 1]
    node.reset_gpu(1)
    assert pynvml.nvmlDeviceGetEccMode(handle(1)) == [0, 0]
    assert pynvml.nvmlDeviceGetMigMode(handle(1)) == [1, 1]


def _instances(index: int) -> list[str]:
    """The GPU's instances as nvidia-smi names their profiles, through the NVML calls."""
    names = []
    for profile in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle(index), profile)
        except pynvml.NVMLError_NotSupported:
            continue
        slots = (pynvml.c_nvmlGpuInstance_t * info.instanceCount)()
        count = ctypes.c_uint()
        pynvml.nvmlDeviceGetGpuInstances(handle(index), info.id, slots, ctypes.byref(count))
        names += [str(info.name).removeprefix("MIG ")] * count.value
    return sorted(names)


def test_mig_instances_follow_the_scenario_faults_and_resets(make_node: MakeNode) -> None:
    node = make_node('[node]\ngpus = 2\nmig_mode = true\nmig_profiles = ["3g.40gb", "2g.20gb"]\n')
    assert _instances(0) == _instances(1) == ["2g.20gb", "3g.40gb"]
    node.inject("mig_instances", 1, {"profiles": ["1g.10gb", "1g.10gb"]})
    assert _instances(1) == ["1g.10gb", "1g.10gb"]
    node.reset_gpu(0)  # a reset destroys the instances
    assert _instances(0) == []
    node.inject("clear", 0, {})
    assert _instances(0) == ["2g.20gb", "3g.40gb"]
    # MIG mode off: no profiles, no instances, and the fault changes nothing.
    node.inject("mig_mode", 1, {"enabled": False})
    node.reset_gpu(1)
    node.inject("mig_instances", 1, {"profiles": ["7g.80gb"]})
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle(1), 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetGpuInstances(handle(1), 0, None, ctypes.byref(ctypes.c_uint()))


def test_gpu_instance_calls_check_their_arguments(make_node: MakeNode) -> None:
    make_node('[node]\nmig_mode = true\nmig_profiles = ["1g.10gb", "1g.10gb"]\n')
    info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle(0), 0)
    assert (info.id, info.sliceCount, info.instanceCount, info.memorySizeMB) == (19, 1, 7, 9984)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle(0), 99)
    with pytest.raises(pynvml.NVMLError_NotSupported):  # an 8-slice profile: not on an H100
        pynvml.nvmlDeviceGetGpuInstanceProfileInfo(
            handle(0), pynvml.NVML_GPU_INSTANCE_PROFILE_8_SLICE
        )
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):  # v1 is not implemented
        pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle(0), 0, version=1)
    one = (pynvml.c_nvmlGpuInstance_t * 1)()
    with pytest.raises(pynvml.NVMLError_InsufficientSize):
        pynvml.nvmlDeviceGetGpuInstances(handle(0), 19, one, ctypes.byref(ctypes.c_uint()))
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetGpuInstances(handle(0), 77, one, ctypes.byref(ctypes.c_uint()))


def test_power_limit_and_app_clocks_stay_until_clear(node: SimulatedNode) -> None:
    graphics = pynvml.NVML_CLOCK_GRAPHICS
    default = pynvml.nvmlDeviceGetDefaultApplicationsClock(handle(2), graphics)
    assert pynvml.nvmlDeviceGetApplicationsClock(handle(2), graphics) == default == 1980
    node.inject("power_limit", 2, {"watts": 450})
    node.inject("app_clocks", 2, {"mhz": 1410})
    assert pynvml.nvmlDeviceGetPowerManagementLimit(handle(2)) == 450_000
    assert pynvml.nvmlDeviceGetApplicationsClock(handle(2), graphics) == 1410
    assert reasons(2) & pynvml.nvmlClocksEventReasonApplicationsClocksSetting
    node.reset_gpu(2)  # a reset keeps settings
    assert pynvml.nvmlDeviceGetApplicationsClock(handle(2), graphics) == 1410
    node.inject("clear", 2, {})
    assert pynvml.nvmlDeviceGetPowerManagementLimit(handle(2)) == 700_000
    assert pynvml.nvmlDeviceGetApplicationsClock(handle(2), graphics) == 1980


def _fabric(index: int) -> tuple[int, int]:
    info = pynvml.c_nvmlGpuFabricInfo_t()
    pynvml.nvmlDeviceGetGpuFabricInfo(handle(index), ctypes.byref(info))
    return int(info.state), int(info.status)


def test_fabric_state_is_unsupported_until_a_fabric_exists(make_node: MakeNode) -> None:
    node = make_node("[node]\ngpus = 2\n")
    with pytest.raises(pynvml.NVMLError_NotSupported):
        _fabric(0)
    node.inject("fabric", 0, {"state": "in_progress"})
    assert _fabric(0) == (pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS, pynvml.NVML_SUCCESS)
    node.inject("fabric", 0, {"state": "completed", "ok": False})
    assert _fabric(0) == (pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, pynvml.NVML_ERROR_UNKNOWN)


def _fabric_health(index: int, version: int = pynvml.nvmlGpuFabricInfo_v3) -> tuple[int, int]:
    info: Any = (
        pynvml.c_nvmlGpuFabricInfo_v3_t()
        if version == pynvml.nvmlGpuFabricInfo_v3
        else pynvml.c_nvmlGpuFabricInfo_v2_t()
    )
    pynvml.nvmlDeviceGetGpuFabricInfoV(handle(index), ctypes.byref(info))
    summary = int(info.healthSummary) if version == pynvml.nvmlGpuFabricInfo_v3 else -1
    return int(info.healthMask), summary


def test_fabric_health_reports_the_named_conditions(make_node: MakeNode) -> None:
    node = make_node('[node]\ngpus = 2\nfabric_state = "completed"\n')
    # Nothing supported until the fabric reports (as an R580 H200 answers v3).
    assert _fabric_health(0) == (0, pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_NOT_SUPPORTED)
    node.inject("fabric_health", 0, {"bits": ["route_unhealthy", "incorrect_configuration"]})
    mask, summary = _fabric_health(0)
    assert summary == pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY
    conditions = fabric_conditions(mask)
    assert conditions == {
        "bandwidth_degraded": False,
        "route_recovery": False,
        "route_unhealthy": True,
        "access_timeout_recovery": False,
        "incorrect_configuration": True,
        "gfm_disconnected": False,
    }
    # NVML's own layout: route unhealthy TRUE at bits 4-5, insufficient NVLinks at 8-11.
    assert (mask >> pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_UNHEALTHY) & 0x3 == (
        pynvml.NVML_GPU_FABRIC_HEALTH_MASK_ROUTE_UNHEALTHY_TRUE
    )
    assert (mask >> pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_INCORRECT_CONFIGURATION) & 0xF == (
        pynvml.NVML_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_INSUFFICIENT_NVLINKS
    )
    assert _fabric_health(0, pynvml.nvmlGpuFabricInfo_v2)[0] == mask  # v2: the mask alone
    assert _fabric_health(1)[0] == 0  # the other GPU's fabric is untouched
    node.inject("clear", 0, {})
    mask, summary = _fabric_health(0)
    assert set(fabric_conditions(mask).values()) == {False}
    assert summary == pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY


def test_fabric_health_needs_a_driver_with_fabric_info_v2(make_node: MakeNode) -> None:
    make_node('[node]\ngpus = 1\nfabric_state = "completed"\ndriver_version = "535.161.08"\n')
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        _fabric_health(0)


def test_node_fabric_state_gsp_and_inforom(make_node: MakeNode) -> None:
    make_node('[node]\ngpus = 2\nfabric_state = "completed"\ngsp_firmware_version = "535.1.2"\n')
    assert _fabric(1) == (pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, pynvml.NVML_SUCCESS)
    # pynvml hands this one back as bytes (no str conversion on that wrapper).
    assert pynvml.nvmlDeviceGetGspFirmwareVersion(handle(1)) == b"535.1.2"
    assert pynvml.nvmlDeviceGetInforomImageVersion(handle(1)) == "G520.0200.00.05"


def test_gsp_firmware_none_is_not_supported(make_node: MakeNode) -> None:
    make_node('[node]\ngpus = 1\ngsp_firmware_version = "none"\n')
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetGspFirmwareVersion(handle(0))


def test_fabric_manager_down_and_flapping_as_systemd_shows_them(make_node: MakeNode) -> None:
    node = make_node('[node]\ngpus = 2\nfabricmanager = "active"\nimex = "active"\n')

    def probe() -> dict[str, tuple[str, int | None]]:
        return {s.name: (s.state, s.restarts) for s in node.host_facts().services}

    assert probe()["nvidia-fabricmanager"] == ("active", 0)
    assert probe()["nvidia-persistenced"] == ("active", 0)
    node.inject("fabric_manager", 1, {"state": "flapping"})
    # Restarted again at every probe, caught starting and running in turn.
    assert [probe()["nvidia-fabricmanager"] for _ in range(3)] == [
        ("activating", 1),
        ("active", 2),
        ("activating", 3),
    ]
    node.inject("fabric_manager", 0, {"state": "down", "service": "nvidia-imex"})
    assert probe()["nvidia-imex"] == ("failed", 0)
    node.inject("clear", 1, {})
    assert probe()["nvidia-fabricmanager"] == ("active", 4)  # NRestarts keeps its count
    node.inject("clear", 0, {})
    assert probe()["nvidia-imex"] == ("active", 0)
    # The IMEX daemon also says whether it is ready, as `nvidia-imex-ctl -q` does.
    readiness = {s.name: s.readiness for s in node.host_facts().services}
    assert readiness == {"nvidia-persistenced": None, "nvidia-fabricmanager": None,
                         "nvidia-imex": "READY"}  # fmt: skip
    node.inject("fabric_manager", 0, {"state": "not_ready", "service": "nvidia-imex"})
    imex = next(s for s in node.host_facts().services if s.name == "nvidia-imex")
    assert (imex.state, imex.readiness) == ("active", "UNAVAILABLE")
    with pytest.raises(ValueError, match="only nvidia-imex says whether it is ready"):
        node.inject("fabric_manager", 0, {"state": "not_ready"})


def test_every_kind_has_a_test_here() -> None:
    tested = {
        "ecc_sbe", "ecc_dbe", "retired_pages", "row_remap_pending", "row_remap_failure",
        "temperature", "throttle", "pcie_degrade", "pcie_replay", "gpu_lost", "pci_remove",
        "nvml_hang",
        "persistence_off", "nvlink_down", "nvlink_errors", "process", "process_exit", "xid",
        "clear", "ecc_mode", "mig_mode", "power_limit", "app_clocks", "fabric", "fabric_health",
        "mig_instances",
        # In test_sim_processes.py, with the node's process table:
        "process_gone", "hung", "memory_leak",
        # In test_sim_infiniband.py, with the node's HCAs:
        "ib_port_down", "ib_rate", "ib_errors",
        # In test_checks_recovery.py, with what a reset completes:
        "recovery_action", "repair_pending", "unrepairable_memory",
        # In test_sim_kubernetes.py, with the node's Kubernetes GPU stack:
        "device_plugin_down", "cdi_stale",
        "fabric_manager", "nvlink_ber", "c2c_errors",
        # In test_nvml_single_path.py, through the event watcher:
        "operational_event",
    }  # fmt: skip
    assert set(FAULT_KINDS) == tested


# --- inject validation --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "gpu", "params", "message"),
    [
        ("ecc_tbe", 0, {}, "unknown fault kind 'ecc_tbe' (known: ecc_sbe, ecc_dbe"),
        ("ecc_dbe", 8, {}, "no GPU 8 (this node has 8: 0..7)"),
        ("ecc_dbe", -1, {}, "no GPU -1"),
        ("ecc_dbe", True, {}, "GPU index must be an integer"),
        ("ecc_dbe", 0, {"count": "1"}, "count: expected an integer, got str '1'"),
        ("ecc_dbe", 0, {"count": 0}, "count: must be at least 1"),
        ("ecc_dbe", 0, {"cnt": 1}, "cnt: unknown key for fault kind 'ecc_dbe' (known: count)"),
        ("gpu_lost", 0, {"count": 1}, "count: unknown key for fault kind 'gpu_lost' (known: none)"),
        ("temperature", 0, {}, "celsius: required by fault kind 'temperature'"),
        ("temperature", 0, {"celsius": True}, "celsius: expected a number, got bool True"),
        ("temperature", 0, {"celsius": 200}, "celsius: must be at most 130"),
        ("throttle", 0, {"reasons": "hw_slowdown"}, "reasons: expected a list of strings"),
        ("throttle", 0, {"reasons": ["melting"]}, "reasons: unknown 'melting' (known: gpu_idle"),
        ("pcie_degrade", 0, {}, "gen: give gen, width or both"),
        ("pcie_degrade", 0, {"width": 3}, "width: expected one of 1, 2, 4, 8, 16, got 3"),
        ("nvlink_down", 0, {"link": 18}, "link: must be at most 17"),
        ("process", 0, {"pid": 1, "name": "", "used_mib": 1}, "name: expected a non-empty string"),
        ("nvml_hang", 0, {"seconds": 0}, "seconds: must be at least 0.001"),
        ("retired_pages", 0, {"cause": "tbe"}, "cause: expected one of 'sbe', 'dbe'"),
        ("retired_pages", 0, {"pending": 1}, "pending: expected true or false, got int 1"),
        (
            "mig_instances",
            0,
            {"profiles": ["1g.5gb"]},
            "profiles: unknown profile '1g.5gb' (known: 1g.",
        ),
        (
            "mig_instances",
            0,
            {"profiles": ["4g.40gb", "4g.40gb"]},
            "profiles: at most 1 4g.40gb instances fit on one GPU",
        ),
        (
            "mig_instances",
            0,
            {"profiles": ["4g.40gb", "3g.40gb", "1g.10gb"]},
            "profiles: 8 slices do not fit on one GPU of 7",
        ),
        (
            "retired_pages",
            0,
            {},
            "kind: the NVIDIA H100 80GB HBM3 does not retire pages (use row_remap_pending",
        ),
        ("power_limit", 0, {"watts": 701}, "watts: must be at most 700 on this GPU model"),
        ("power_limit", 0, {"watts": 150}, "watts: must be at least 200 on this GPU model"),
        ("app_clocks", 0, {"mhz": 2000}, "mhz: must be at most 1980 on this GPU model"),
        ("pcie_degrade", 0, {"gen": 6}, "gen: must be at most 5 on this GPU model"),
        (
            "process",
            0,
            {"pid": 1, "name": "x", "used_mib": 81009},
            "used_mib: must be at most 81008 on this GPU model",
        ),
    ],
)
def test_inject_rejects_invalid_faults(
    node: SimulatedNode, kind: str, gpu: Any, params: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=r"^cannot inject") as caught:
        node.inject(kind, gpu, params)
    assert message in str(caught.value)


def test_nvlink_index_is_checked_against_the_node(make_node: MakeNode) -> None:
    node = make_node("[node]\nnvlinks = 4\n")
    with pytest.raises(ValueError, match="link: no such NVLink: this GPU has 4 links"):
        node.inject("nvlink_down", 0, {"link": 4})


def test_faults_built_in_code_get_defaults() -> None:
    clock = FakeClock()
    scenario = Scenario(
        faults=(Fault("ecc_dbe", 1, at=1.0), Fault("pcie_degrade", 1, params=(("gen", 4),)))
    )
    with SimulatedNode(scenario, clock=clock):
        pynvml.nvmlInit()
        assert pynvml.nvmlDeviceGetCurrPcieLinkGeneration(handle(1)) == 4
        assert pynvml.nvmlDeviceGetCurrPcieLinkWidth(handle(1)) == 16
        clock.advance(1)
        assert ecc(1) == (0, 1, 0, 1)


def test_faults_built_in_code_are_checked() -> None:
    with pytest.raises(ValueError, match="fault 'ecc_dbe' on GPU 0: count: must be at least 1"):
        SimulatedNode(Scenario(faults=(Fault("ecc_dbe", 0, params=(("count", 0),)),)))
    with pytest.raises(ValueError, match="no GPU 9"):
        SimulatedNode(Scenario(faults=(Fault("ecc_dbe", 9),)))


# --- timing -------------------------------------------------------------------------------


def test_scheduled_faults_apply_when_their_time_comes(make_node: MakeNode) -> None:
    clock = FakeClock()
    make_node(
        '[[fault]]\nat = 5\ngpu = 1\nkind = "ecc_sbe"\ncount = 2\n'
        '[[fault]]\nat = 2\ngpu = 1\nkind = "ecc_dbe"\n'
        '[[fault]]\nat = 5\ngpu = 1\nkind = "clear"\n',
        clock=clock,
    )
    assert ecc(1) == (0, 0, 0, 0)
    clock.advance(2)
    assert ecc(1) == (0, 1, 0, 1)
    clock.advance(2.999)
    assert ecc(1) == (0, 1, 0, 1)
    clock.advance(0.001)
    # Same time: file order, so the SBEs land and then clear resets the volatile counts.
    assert ecc(1) == (0, 0, 2, 1)


def test_faults_at_zero_apply_before_the_first_answer(make_node: MakeNode) -> None:
    make_node('[[fault]]\ngpu = 0\nkind = "temperature"\ncelsius = 70\n')
    assert temperature(0) == 70


def test_python_level_calls_apply_due_faults_too(make_node: MakeNode) -> None:
    clock = FakeClock()
    node = make_node(
        '[[fault]]\nat = 1\ngpu = 0\nkind = "process"\npid = 5\nname = "job"\nused_mib = 1\n',
        clock=clock,
    )
    assert node.process_name(5) is None
    clock.advance(1)
    assert node.process_name(5) == "job"


# --- hangs --------------------------------------------------------------------------------


def test_hang_blocks_only_that_gpu_until_the_window_ends(node: SimulatedNode) -> None:
    hung, healthy = handle(2), handle(3)
    node.inject("nvml_hang", 2, {"seconds": 0.6})
    started = time.monotonic()
    answered: list[float] = []

    def call_hung_gpu() -> None:
        pynvml.nvmlDeviceGetTemperature(hung, pynvml.NVML_TEMPERATURE_GPU)
        answered.append(time.monotonic() - started)

    thread = threading.Thread(target=call_hung_gpu)
    thread.start()
    time.sleep(0.1)
    for _ in range(20):
        pynvml.nvmlDeviceGetFieldValues(healthy, [pynvml.NVML_FI_DEV_POWER_INSTANT])
    assert time.monotonic() - started < 0.4  # other GPUs answer while GPU 2 hangs
    assert answered == []
    thread.join(timeout=5)
    assert len(answered) == 1
    assert 0.55 <= answered[0] < 2.0
    # After the window, calls answer at once.
    quick = time.monotonic()
    pynvml.nvmlDeviceGetTemperature(hung, pynvml.NVML_TEMPERATURE_GPU)
    assert time.monotonic() - quick < 0.1


def test_handles_are_handed_out_while_a_gpu_hangs(node: SimulatedNode) -> None:
    node.inject("nvml_hang", 2, {"seconds": 30})
    started = time.monotonic()
    hung = handle(2)  # NVML's handle table does not wait on the GPU
    assert time.monotonic() - started < 0.1
    node.inject("clear", 2, {})
    assert pynvml.nvmlDeviceGetIndex(hung) == 2


def test_hang_window_counts_from_the_scheduled_time(make_node: MakeNode) -> None:
    clock = FakeClock()
    make_node('[[fault]]\nat = 1\ngpu = 0\nkind = "nvml_hang"\nseconds = 2\n', clock=clock)
    h = handle(0)
    clock.advance(2.5)  # applied late, at 2.5 s: only half a second of the window is left
    timer = threading.Timer(0.2, clock.advance, args=(0.5,))
    timer.start()
    started = time.monotonic()
    pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
    assert 0.15 < time.monotonic() - started < 1.0
    timer.join()


def test_clear_and_reset_end_a_hang_early(node: SimulatedNode) -> None:
    h = handle(1)
    for end_it in (lambda: node.inject("clear", 1, {}), lambda: node.reset_gpu(1)):
        node.inject("nvml_hang", 1, {"seconds": 30})
        timer = threading.Timer(0.2, end_it)
        timer.start()
        started = time.monotonic()
        pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
        assert 0.15 < time.monotonic() - started < 2.0
        timer.join()


def test_gpu_lost_during_a_hang_fails_the_blocked_call(node: SimulatedNode) -> None:
    h = handle(4)
    node.inject("nvml_hang", 4, {"seconds": 30})
    timer = threading.Timer(0.2, node.inject, args=("gpu_lost", 4, {}))
    timer.start()
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetPowerUsage(h)
    timer.join()


# --- reset --------------------------------------------------------------------------------


def test_reset_applies_pending_repairs_and_clears_volatile_counts(node: SimulatedNode) -> None:
    node.inject("ecc_sbe", 2, {"count": 4})
    node.inject("ecc_dbe", 2, {})
    node.inject("row_remap_pending", 2, {})
    node.inject("row_remap_failure", 2, {})
    node.inject("temperature", 2, {"celsius": 88})
    node.inject("persistence_off", 2, {})
    node.reset_gpu(2)
    assert ecc(2) == (0, 0, 4, 1)
    # The remap took effect; a failed remap and the heat are not fixed by a reset.
    assert pynvml.nvmlDeviceGetRemappedRows(handle(2)) == (0, 1, 0, 1)
    assert temperature(2) == 88
    assert pynvml.nvmlDeviceGetPersistenceMode(handle(2)) == 0


def test_reset_is_refused_while_in_use_or_lost(node: SimulatedNode) -> None:
    node.inject("process", 1, {"pid": 31, "name": "job", "used_mib": 1})
    with pytest.raises(GpuResetError, match="GPU 1 is in use by processes 31"):
        node.reset_gpu(1)
    node.inject("gpu_lost", 0, {})
    with pytest.raises(GpuResetError, match="fallen off the bus"):
        node.reset_gpu(0)
    with pytest.raises(ValueError, match="no GPU 8"):
        node.reset_gpu(8)


# --- events -------------------------------------------------------------------------------


def test_xid_event_reaches_a_registered_set(node: SimulatedNode) -> None:
    h = handle(3)
    supported = pynvml.nvmlDeviceGetSupportedEventTypes(h)
    assert supported & pynvml.nvmlEventTypeXidCriticalError
    event_set = pynvml.nvmlEventSetCreate()
    pynvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, event_set)
    node.inject("xid", 3, {"xid": 79})
    node.inject("xid", 2, {"xid": 13})  # not registered: not delivered
    data = pynvml.nvmlEventSetWait_v2(event_set, 1000)
    assert data.eventType == pynvml.nvmlEventTypeXidCriticalError
    assert data.eventData == 79
    assert pynvml.nvmlDeviceGetIndex(data.device) == 3
    assert data.gpuInstanceId == 0xFFFFFFFF
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait_v2(event_set, 50)
    pynvml.nvmlEventSetFree(event_set)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlEventSetWait_v2(event_set, 0)


def test_event_wait_wakes_when_an_event_arrives(node: SimulatedNode) -> None:
    event_set = pynvml.nvmlEventSetCreate()
    for index in range(8):
        pynvml.nvmlDeviceRegisterEvents(
            handle(index), pynvml.nvmlEventTypeXidCriticalError, event_set
        )
    timer = threading.Timer(0.2, node.inject, args=("xid", 6, {"xid": 48}))
    timer.start()
    started = time.monotonic()
    data = pynvml.nvmlEventSetWait_v2(event_set, 5000)
    timer.join()
    assert 0.15 < time.monotonic() - started < 1.0
    assert (pynvml.nvmlDeviceGetIndex(data.device), data.eventData) == (6, 48)


def test_scheduled_xid_is_delivered_to_a_waiting_caller(make_node: MakeNode) -> None:
    make_node('[[fault]]\nat = 0.3\ngpu = 1\nkind = "xid"\nxid = 94\n')
    event_set = pynvml.nvmlEventSetCreate()
    pynvml.nvmlDeviceRegisterEvents(handle(1), pynvml.nvmlEventTypeXidCriticalError, event_set)
    assert pynvml.nvmlEventSetWait_v2(event_set, 3000).eventData == 94


def test_ecc_events_go_only_to_sets_that_asked_for_them(node: SimulatedNode) -> None:
    xids, eccs = pynvml.nvmlEventSetCreate(), pynvml.nvmlEventSetCreate()
    pynvml.nvmlDeviceRegisterEvents(handle(0), pynvml.nvmlEventTypeXidCriticalError, xids)
    pynvml.nvmlDeviceRegisterEvents(
        handle(0),
        pynvml.nvmlEventTypeSingleBitEccError | pynvml.nvmlEventTypeDoubleBitEccError,
        eccs,
    )
    node.inject("ecc_dbe", 0, {})
    node.inject("ecc_sbe", 0, {})
    first, second = pynvml.nvmlEventSetWait_v2(eccs, 0), pynvml.nvmlEventSetWait_v2(eccs, 0)
    assert [first.eventType, second.eventType] == [
        pynvml.nvmlEventTypeDoubleBitEccError,
        pynvml.nvmlEventTypeSingleBitEccError,
    ]
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait_v2(xids, 0)


def test_unsupported_event_types_are_refused(node: SimulatedNode) -> None:
    event_set = pynvml.nvmlEventSetCreate()
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceRegisterEvents(
            handle(0), pynvml.nvmlEventTypeGpuUnavailableError, event_set
        )


def test_event_wait_reports_a_lost_gpu(node: SimulatedNode) -> None:
    event_set = pynvml.nvmlEventSetCreate()
    pynvml.nvmlDeviceRegisterEvents(handle(2), pynvml.nvmlEventTypeXidCriticalError, event_set)
    node.inject("xid", 2, {"xid": 79})
    node.inject("gpu_lost", 2, {})
    assert pynvml.nvmlEventSetWait_v2(event_set, 0).eventData == 79  # queued events first
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlEventSetWait_v2(event_set, 1000)


# --- properties ---------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.floats(min_value=0, max_value=500),
            st.sampled_from(["read", "process", "clear", "limit"]),
        ),
        max_size=15,
    )
)
def test_energy_never_decreases(steps: list[tuple[float, str]]) -> None:
    clock = FakeClock()
    with SimulatedNode(Scenario(), clock=clock) as node:
        pynvml.nvmlInit()
        h = handle(0)
        last = pynvml.nvmlDeviceGetTotalEnergyConsumption(h)
        for seconds, action in steps:
            clock.advance(seconds)
            if action == "process":
                node.inject("process", 0, {"pid": 1, "name": "p", "used_mib": 1})
            elif action == "clear":
                node.inject("clear", 0, {})
            elif action == "limit":
                pynvml.nvmlDeviceSetPowerManagementLimit(h, 250_000)
            energy = pynvml.nvmlDeviceGetTotalEnergyConsumption(h)
            assert energy >= last
            last = energy
