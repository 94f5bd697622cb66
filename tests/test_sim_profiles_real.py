"""The simulator's GPU models against the real hosts they were taken from.

Each row pairs a real `nvidia-smi -q` capture (tests/data/real-hosts) with the catalog
model it describes: the capture replayed (`gpuagent.sim.replay_scenario`, which serves
exactly what the host reported) and a node of that model, read through the same pynvml
calls, must agree on what does not move (identity, limits, thresholds, memory, PCIe,
the row remapper's banks, what is N/A) and, at idle, on temperature and power within what
separates two idle GPUs.
"""

from __future__ import annotations

import ctypes
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pynvml
import pytest

from conftest import MakeNode
from gpuagent.config import ConfigError
from gpuagent.sim import SimulatedNode, catalog, parse_scenario
from gpuagent.smi import load_capture
from hardware_profiles_doc import REAL_HOSTS
from test_sim_profiles import answers

THRESHOLDS = (
    pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN,
    pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN,
    pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX,
    pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX,
)
TLIMIT_FIELDS = (
    pynvml.NVML_FI_DEV_TEMPERATURE_SHUTDOWN_TLIMIT,
    pynvml.NVML_FI_DEV_TEMPERATURE_SLOWDOWN_TLIMIT,
    pynvml.NVML_FI_DEV_TEMPERATURE_GPU_MAX_TLIMIT,
)


@dataclass(frozen=True)
class Pair:
    capture: str
    model: str
    # Node keys that are how that host ran, not what the model is.
    node: str = ""


PAIRS = (
    Pair("h200-x1.580.159.04.nvidia-smi-q.xml", "h200", 'driver_version = "580.159.04"\n'),
    Pair("h200-x1.580.159.04.nvidia-smi-q.txt", "h200", 'driver_version = "580.159.04"\n'),
    Pair(
        "b200-x8.580.105.08.nvidia-smi-q.xml",
        "b200",
        'driver_version = "580.105.08"\npersistence = false\nfabric_state = "completed"\n'
        "host_id = 1\n",
    ),
    Pair(
        "gb200-x4-arm64.580.173.02.nvidia-smi-q.xml",
        "gb200",
        'driver_version = "580.173.02"\nfabric_state = "completed"\n'
        'chassis_serial = "1820000000001"\nslot_number = 14\ntray_index = 4\nhost_id = 1\n',
    ),
)


def field(handle: Any, field_id: int) -> int | None:
    (value,) = pynvml.nvmlDeviceGetFieldValues(handle, [field_id])
    if value.nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED:
        return None
    result: int = value.value.siVal if field_id in TLIMIT_FIELDS else value.value.uiVal
    return result


def threshold(handle: Any, which: int) -> int | None:
    try:
        result: int = pynvml.nvmlDeviceGetTemperatureThreshold(handle, which)
    except pynvml.NVMLError_NotSupported:
        return None
    return result


def fabric(handle: Any) -> tuple[int, str, int] | None:
    """The fabric's state and the NVLink domain it names (cluster UUID, clique id)."""
    info = pynvml.c_nvmlGpuFabricInfo_t()
    try:
        pynvml.nvmlDeviceGetGpuFabricInfo(handle, ctypes.byref(info))
    except pynvml.NVMLError_NotSupported:
        return None
    return int(info.state), bytes(info.clusterUuid).hex(), int(info.cliqueId)


def platform(handle: Any) -> tuple[str, ...] | None:
    """Where the GPU sits, but its module id (a capture's order is not the model's)."""
    info = pynvml.c_nvmlPlatformInfo_v2_t()
    try:
        pynvml.nvmlDeviceGetPlatformInfo(handle, ctypes.byref(info))
    except pynvml.NVMLError_NotSupported:
        return None
    return (info.chassisSerialNumber, info.slotNumber, info.trayIndex, info.hostId, info.peerType)


def fixed(index: int) -> dict[str, object]:
    """What a GPU reports that does not move with time or load."""
    h = pynvml.nvmlDeviceGetHandleByIndex(index)
    pci = pynvml.nvmlDeviceGetPciInfo(h)
    memory = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
    histogram = pynvml.nvmlDeviceGetRowRemapperHistogram(h)
    return {
        "name": pynvml.nvmlDeviceGetName(h),
        "pci device": pci.pciDeviceId,
        "pci subsystem": pci.pciSubSystemId,
        "vbios": pynvml.nvmlDeviceGetVbiosVersion(h),
        "inforom": pynvml.nvmlDeviceGetInforomImageVersion(h),
        "thresholds": [threshold(h, which) for which in THRESHOLDS],
        "tlimit": [field(h, f) for f in TLIMIT_FIELDS],
        "power limits": pynvml.nvmlDeviceGetPowerManagementLimitConstraints(h),
        "power default": pynvml.nvmlDeviceGetPowerManagementDefaultLimit(h),
        "power limit": pynvml.nvmlDeviceGetEnforcedPowerLimit(h),
        "memory total": memory.total,
        "memory reserved": memory.reserved,
        "pcie max": (
            pynvml.nvmlDeviceGetMaxPcieLinkGeneration(h),
            pynvml.nvmlDeviceGetMaxPcieLinkWidth(h),
        ),
        "pcie now": (
            pynvml.nvmlDeviceGetCurrPcieLinkGeneration(h),
            pynvml.nvmlDeviceGetCurrPcieLinkWidth(h),
        ),
        "banks": (histogram.max, histogram.high, histogram.partial, histogram.low, histogram.none),
        "clocks": tuple(
            pynvml.nvmlDeviceGetClockInfo(h, clock)
            for clock in (pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_MEM, pynvml.NVML_CLOCK_VIDEO)
        ),
        "max clocks": tuple(
            pynvml.nvmlDeviceGetMaxClockInfo(h, clock)
            for clock in (pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_MEM, pynvml.NVML_CLOCK_VIDEO)
        ),
        "pstate": pynvml.nvmlDeviceGetPerformanceState(h),
        "idle reason": pynvml.nvmlDeviceGetCurrentClocksEventReasons(h),
        "ecc": pynvml.nvmlDeviceGetEccMode(h),
        "persistence": pynvml.nvmlDeviceGetPersistenceMode(h),
        "fabric": fabric(h),
        "platform": platform(h),
        "mig": answers(pynvml.nvmlDeviceGetMigMode, h),
        "retired pages": answers(pynvml.nvmlDeviceGetRetiredPagesPendingStatus, h),
        "remapped rows": answers(pynvml.nvmlDeviceGetRemappedRows, h),
        "gsp": answers(pynvml.nvmlDeviceGetGspFirmwareVersion, h),
        "fan": answers(pynvml.nvmlDeviceGetFanSpeed, h),
        "serial": answers(pynvml.nvmlDeviceGetSerial, h),
    }


@dataclass(frozen=True)
class Idle:
    temperature: float
    memory_temperature: float
    power_w: float


def idle(count: int) -> Idle:
    """The node's mean idle temperature (GPU and memory) and power."""
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    memory = [field(h, pynvml.NVML_FI_DEV_MEMORY_TEMP) for h in handles]
    assert None not in memory
    return Idle(
        statistics.fmean(
            pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU) for h in handles
        ),
        statistics.fmean(m for m in memory if m is not None),
        statistics.fmean(pynvml.nvmlDeviceGetPowerUsage(h) / 1000 for h in handles),
    )


def read_node(make_node: MakeNode, text: str) -> tuple[list[dict[str, object]], Idle]:
    node = make_node(text)
    count = pynvml.nvmlDeviceGetCount()
    values = [fixed(i) for i in range(count)], idle(count)
    node.uninstall()
    return values


@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: p.capture)
def test_the_model_reads_as_its_capture(make_node: MakeNode, pair: Pair) -> None:
    path = REAL_HOSTS / pair.capture
    gpus = len(load_capture(path).gpus)
    captured, captured_idle = read_node(make_node, f'[node]\nnvidia_smi = "{path}"\n')
    modelled, model_idle = read_node(
        make_node, f'[node]\nmodel = "{pair.model}"\ngpus = {gpus}\n{pair.node}'
    )
    assert len(modelled) == len(captured) == gpus
    for index, (want, got) in enumerate(zip(captured, modelled, strict=True)):
        assert got == want, f"GPU {index}: " + ", ".join(
            f"{key}: model {got[key]!r}, capture {want[key]!r}"
            for key in want
            if got[key] != want[key]
        )
    # Idle GPUs of one model differ by a few degrees and watts (the B200 capture's by up
    # to 16 °C, in two groups): the node's means agree.
    assert model_idle.temperature == pytest.approx(captured_idle.temperature, abs=3)
    assert model_idle.memory_temperature == pytest.approx(captured_idle.memory_temperature, abs=3)
    assert model_idle.power_w == pytest.approx(captured_idle.power_w, rel=0.05)


@pytest.mark.parametrize(
    ("capture", "model"),
    [
        ("h200-x1.580.159.04.nvidia-smi-q.xml", catalog.H200),
        ("h200-x1-idle.590.48.01.nvidia-smi-q.txt", catalog.H200),
        ("b200-x8.580.105.08.nvidia-smi-q.xml", catalog.B200),
        ("gb200-x4-arm64.580.173.02.nvidia-smi-q.xml", catalog.GB200),
    ],
)
def test_the_profile_holds_every_gpu_of_its_capture(capture: str, model: Any) -> None:
    """The profile's values against each captured GPU, as `nvidia-smi -q` printed them."""
    found = catalog.find_profile(load_capture(REAL_HOSTS / capture).gpus[0].product_name)
    assert found is not None
    assert found[0] is model
    for gpu in load_capture(REAL_HOSTS / capture).gpus:
        assert (gpu.architecture, gpu.pci_device_id) == (model.architecture, model.pci_device_id)
        assert gpu.fb_total_mib == model.memory_total_mib
        assert gpu.fb_reserved_mib is not None
        assert abs(gpu.fb_reserved_mib - model.memory_reserved_mib) <= 2
        limits = (gpu.power_min_limit_w, gpu.power_default_limit_w, gpu.power_max_limit_w)
        assert limits == (
            model.power_min_limit_w,
            model.power_default_limit_w,
            model.power_max_limit_w,
        )
        # T.Limit: degrees beyond the max operating point, which is temperature + margin.
        t = gpu.thresholds
        assert t.tlimit is model.tlimit_fields
        assert t.margin is not None
        assert gpu.temperature_c is not None
        point = gpu.temperature_c + t.margin
        assert point == model.temperature_gpu_max_c
        assert (point - (t.shutdown or 0), point - (t.slowdown or 0)) == (
            model.temperature_shutdown_c,
            model.temperature_slowdown_c,
        )
        assert (gpu.pcie_generation_max, gpu.pcie_width_max) == (
            model.pcie_max_generation,
            model.pcie_max_width,
        )
        assert gpu.pcie_generation_current == model.pcie_max_generation  # no idle train-down
        assert gpu.remap_histogram == (model.remap_banks, 0, 0, 0, 0)
        assert (gpu.clock_sm_mhz, gpu.max_clock_sm_mhz) == (
            model.sm_clock_idle_mhz,
            model.sm_clock_max_mhz,
        )
        assert gpu.max_clock_memory_mhz == model.memory_clock_max_mhz
        assert gpu.max_clock_video_mhz == model.video_clock_max_mhz
        assert gpu.performance_state == model.idle_pstate
        # What is N/A there is N/A in the model, and the other way round.
        assert (gpu.mig_current is not None) is model.mig
        assert (gpu.retired_pages_sbe is not None) is model.retired_pages
        assert (gpu.remapped_rows_correctable is not None) is model.row_remapping
        assert (gpu.memory_temperature_c is not None) is (
            model.memory_temperature_offset_c is not None
        )
        assert (gpu.fan_speed_pct is not None) is (model.fan_idle_pct is not None)
        assert (gpu.gsp_firmware_version is not None) is model.gsp_firmware
        assert (gpu.ecc_current is not None) is model.ecc


@pytest.mark.parametrize("model", ["h200", "b200", "gb200", "gb300"])
def test_a_single_gpu_of_an_nvlink_model_has_no_nvlinks(make_node: MakeNode, model: str) -> None:
    # As the live H200 and H100 (pass-through VMs) answered: NvLinkState NOT_SUPPORTED.
    node = make_node(f'[node]\nmodel = "{model}"\ngpus = 1\n')
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert node.hardware.nvlinks == 0
    assert field(h, pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT) == 0
    assert not answers(pynvml.nvmlDeviceGetNvLinkState, h, 0)
    node.uninstall()
    # Two GPUs sit on the model's baseboard; a scenario that says so gets links anyway.
    for text in ("gpus = 2\n", "gpus = 1\nnvlinks = 18\n"):
        node = make_node(f'[node]\nmodel = "{model}"\n{text}')
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        assert node.hardware.nvlinks == 18
        assert pynvml.nvmlDeviceGetNvLinkState(h, 17) == pynvml.NVML_FEATURE_ENABLED
        node.uninstall()


def bus_ids(count: int) -> list[str]:
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    return [pynvml.nvmlDeviceGetPciInfo(h).busId for h in handles]


@pytest.mark.parametrize(
    ("model", "capture"),
    [
        ("b200", "b200-x8.580.105.08.nvidia-smi-q.xml"),
        ("gb200", "gb200-x4-arm64.580.173.02.nvidia-smi-q.xml"),
    ],
)
def test_the_gpus_sit_where_the_capture_has_them(
    make_node: MakeNode, model: str, capture: str
) -> None:
    gpus = load_capture(REAL_HOSTS / capture).gpus
    make_node(f'[node]\nmodel = "{model}"\ngpus = {len(gpus)}\n')
    assert bus_ids(len(gpus)) == [gpu.bus_id for gpu in gpus]
    # An HGX B200 holds eight GPUs, a Grace-Blackwell compute tray four: no wider layout.
    most = rf"node\.gpus \(line 3\): must be 1\.\.{len(gpus)} \({model} layouts\)"
    with pytest.raises(ConfigError, match=most):
        parse_scenario(f'[node]\nmodel = "{model}"\ngpus = {len(gpus) + 1}\n')


def test_gpus_in_pci_domains_of_their_own_replay_at_their_bus_ids(tmp_path: Path) -> None:
    # A GB300 tray puts each GPU in a PCI domain of its own, all at 06:00.0 (k8s-test-infra's
    # qx-gb300.xml: domains 0008, 0009, 0018, 0019). The GB200 capture, moved there.
    text = (REAL_HOSTS / "gb200-x4-arm64.580.173.02.nvidia-smi-q.xml").read_text()
    domains = {"29": "0008", "3F": "0009", "9C": "0018", "B2": "0019"}
    for bus, domain in domains.items():
        text = text.replace(f"00000000:{bus}:00.0", f"0000{domain}:06:00.0")
    capture = tmp_path / "gb300-like.xml"
    capture.write_text(text)
    scenario = parse_scenario(f'[node]\nnvidia_smi = "{capture}"\n')
    with SimulatedNode(scenario):
        pynvml.nvmlInit()
        try:
            found = []
            for index in range(4):
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                info = pynvml.nvmlDeviceGetPciInfo(handle)
                found.append((info.domain, info.busId))
                again = pynvml.nvmlDeviceGetHandleByPciBusId(info.busId)
                assert pynvml.nvmlDeviceGetIndex(again) == index
        finally:
            pynvml.nvmlShutdown()
    assert found == [(int(d, 16), f"0000{d}:06:00.0") for d in domains.values()]


def _module_power(handle: Any) -> tuple[float, float] | None:
    """NVML's module-scope average power and limit in watts; None where not supported."""
    scope = pynvml.NVML_POWER_SCOPE_MODULE
    values = pynvml.nvmlDeviceGetFieldValues(
        handle,
        [
            (pynvml.NVML_FI_DEV_POWER_AVERAGE, scope),
            (pynvml.NVML_FI_DEV_POWER_CURRENT_LIMIT, scope),
        ],
    )
    if any(v.nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED for v in values):
        return None
    average, limit = (v.value.uiVal / 1000 for v in values)
    return average, limit


@pytest.mark.parametrize(
    ("capture", "model"),
    [
        ("gb200-x4-arm64.580.173.02.nvidia-smi-q.xml", "gb200"),
        ("b200-x8.580.105.08.nvidia-smi-q.xml", "b200"),
        ("h200-x1.580.159.04.nvidia-smi-q.txt", "h200"),
    ],
)
def test_module_power_as_the_capture_has_it(tmp_path: Path, capture: str, model: str) -> None:
    """Grace-Blackwell reports the module's power beside the GPU's; other GPUs answer the
    module scope NOT_SUPPORTED (nvidia-smi: N/A). Replayed, NVML serves the captured value;
    the model, the GPU's idle power plus the module's rest, within what separates two of
    the capture's modules."""
    captured = load_capture(REAL_HOSTS / capture).gpus
    with SimulatedNode(parse_scenario(f'[node]\nnvidia_smi = "{REAL_HOSTS / capture}"\n')):
        pynvml.nvmlInit()
        try:
            replayed = [_module_power(pynvml.nvmlDeviceGetHandleByIndex(0))]
        finally:
            pynvml.nvmlShutdown()
    with SimulatedNode(parse_scenario(f'[node]\nmodel = "{model}"\ngpus = 1\n')):
        pynvml.nvmlInit()
        try:
            modelled = _module_power(pynvml.nvmlDeviceGetHandleByIndex(0))
            gpu_scope = field(
                pynvml.nvmlDeviceGetHandleByIndex(0), pynvml.NVML_FI_DEV_POWER_AVERAGE
            )
        finally:
            pynvml.nvmlShutdown()
    if captured[0].module_power_w is None:
        assert replayed == [None]
        assert modelled is None
        assert gpu_scope is not None  # the GPU's own power is there all the same
        return
    first = captured[0]
    assert replayed[0] == pytest.approx((first.module_power_w, first.module_power_limit_w))
    assert modelled is not None
    modules = [g.module_power_w for g in captured if g.module_power_w is not None]
    assert min(modules) - 20 <= modelled[0] <= max(modules) + 20
    assert modelled[1] == first.module_power_limit_w


# --- a replay answers what its capture prints, and nothing else ----------------------------


def edited(tmp_path: Path, name: str, values: dict[int, str]) -> Path:
    """The capture ``name`` with the values on the given lines (1-based) replaced."""
    lines = (REAL_HOSTS / name).read_text().split("\n")
    for number, value in values.items():
        key, colon, _old = lines[number - 1].partition(" : ")
        assert colon, lines[number - 1]
        lines[number - 1] = f"{key} : {value}"
    path = tmp_path / name
    path.write_text("\n".join(lines))
    return path


def replay(make_node: MakeNode, path: Path) -> SimulatedNode:
    return make_node(f'[node]\nnvidia_smi = "{path}"\n')


POWER_FIELDS = (pynvml.NVML_FI_DEV_POWER_AVERAGE, pynvml.NVML_FI_DEV_POWER_INSTANT)


@pytest.mark.parametrize(
    ("capture", "usage", "average", "instant"),
    [
        # Before 550 one draw, the average; GA100 and older GPUs on 550+ print the average
        # N/A and an instantaneous draw, which is what their power usage reports.
        ("h100-sxm-x8.535.161.08.nvidia-smi-q.txt", 67_740, 67_740, None),
        ("h200-x1.580.159.04.nvidia-smi-q.txt", 82_650, 82_650, 82_810),
        ("RTX2080S-idle.610.57.04.nvidia-smi-q.txt", 38_890, None, 38_890),
        ("T4-aws.595.91.07.nvidia-smi-q.xml", 33_510, None, 33_510),
    ],
)
def test_the_power_drawn_is_answered_as_printed(
    make_node: MakeNode, capture: str, usage: int, average: int | None, instant: int | None
) -> None:
    replay(make_node, REAL_HOSTS / capture)
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceGetPowerUsage(h) == usage
    assert [field(h, f) for f in POWER_FIELDS] == [average, instant]


def limits(h: Any) -> tuple[int, int, int]:
    """(requested, enforced, field 190) in mW."""
    return (
        pynvml.nvmlDeviceGetPowerManagementLimit(h),
        pynvml.nvmlDeviceGetEnforcedPowerLimit(h),
        field(h, pynvml.NVML_FI_DEV_POWER_CURRENT_LIMIT) or 0,
    )


def test_r610_nested_limits_are_answered_as_printed(make_node: MakeNode) -> None:
    replay(make_node, REAL_HOSTS / "RTX2080S-idle.610.57.04.nvidia-smi-q.txt")
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert limits(h) == (250_000, 250_000, 250_000)
    assert pynvml.nvmlDeviceGetPowerManagementDefaultLimit(h) == 250_000
    assert pynvml.nvmlDeviceGetPowerManagementLimitConstraints(h) == [105_000, 350_000]


def test_a_current_limit_below_the_requested_one_stays_below_it(
    make_node: MakeNode, tmp_path: Path
) -> None:
    # As a GH200 prints it: the module shares its power, so 700 W of the 900 W asked for.
    name = "h200-x1-idle.590.48.01.nvidia-smi-q.txt"
    replay(make_node, edited(tmp_path, name, {196: "900.00 W", 197: "900.00 W", 199: "900.00 W"}))
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert limits(h) == (900_000, 700_000, 700_000)
    assert pynvml.nvmlDeviceGetPowerManagementDefaultLimit(h) == 900_000
    pynvml.nvmlDeviceSetPowerManagementLimit(h, 800_000)
    assert limits(h) == (800_000, 700_000, 700_000)
    pynvml.nvmlDeviceSetPowerManagementLimit(h, 600_000)
    assert limits(h) == (600_000, 600_000, 600_000)


def test_framebuffer_use_is_answered_as_printed_until_a_process_starts(
    make_node: MakeNode,
) -> None:
    # 211 MiB used, of which its two processes hold 176 MiB.
    node = replay(make_node, REAL_HOSTS / "RTX2080S-idle.610.57.04.nvidia-smi-q.txt")
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    mib = 1024 * 1024
    v2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
    assert (v2.total, v2.reserved, v2.used, v2.free) == (
        8192 * mib,
        400 * mib,
        211 * mib,
        7582 * mib,
    )
    v1 = pynvml.nvmlDeviceGetMemoryInfo(h)
    assert (v1.total, v1.used, v1.free) == (8192 * mib, 611 * mib, 7582 * mib)
    node.inject("process", 0, {"pid": 4242, "name": "train", "used_mib": 1000})
    v2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
    assert v2.used == (176 + 1000) * mib  # the live model: what the processes hold


def test_a_driver_without_reserved_memory_has_no_v2_memory_info(
    make_node: MakeNode, tmp_path: Path
) -> None:
    # Before R510 nvidia-smi prints no Reserved (and counts it in Used): NVML had no v2.
    name = "a10.535.129.03.nvidia-smi-q.txt"
    text = (REAL_HOSTS / name).read_text()
    path = tmp_path / name
    path.write_text(text.replace("        Reserved                          : 512 MiB\n", ""))
    replay(make_node, path)
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert not answers(pynvml.nvmlDeviceGetMemoryInfo, h, pynvml.nvmlMemory_v2)
    v1 = pynvml.nvmlDeviceGetMemoryInfo(h)
    mib = 1024 * 1024
    assert (v1.total, v1.used, v1.free) == (23028 * mib, 4 * mib, 22511 * mib)


# A10 capture lines, and the NVML call (with its arguments after the handle) that answers each.
NOT_PRINTED: list[tuple[int, Any, tuple[int, ...]]] = [
    (63, pynvml.nvmlDeviceGetMaxPcieLinkGeneration, ()),
    (69, pynvml.nvmlDeviceGetMaxPcieLinkWidth, ()),
    (70, pynvml.nvmlDeviceGetCurrPcieLinkWidth, ()),
    (74, pynvml.nvmlDeviceGetPcieReplayCounter, ()),
    (80, pynvml.nvmlDeviceGetFanSpeed, ()),
    (81, pynvml.nvmlDeviceGetPerformanceState, ()),
    (93, pynvml.nvmlDeviceGetMemoryInfo, ()),
    (105, pynvml.nvmlDeviceGetComputeMode, ()),
    (151, pynvml.nvmlDeviceGetTemperature, (pynvml.NVML_TEMPERATURE_GPU,)),
    (153, pynvml.nvmlDeviceGetTemperatureThreshold, (pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN,)),
    (154, pynvml.nvmlDeviceGetTemperatureThreshold, (pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN,)),
    (155, pynvml.nvmlDeviceGetTemperatureThreshold, (pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX,)),
    (160, pynvml.nvmlDeviceGetPowerUsage, ()),
    (161, pynvml.nvmlDeviceGetEnforcedPowerLimit, ()),
    (162, pynvml.nvmlDeviceGetPowerManagementLimit, ()),
    (163, pynvml.nvmlDeviceGetPowerManagementDefaultLimit, ()),
    (164, pynvml.nvmlDeviceGetPowerManagementLimitConstraints, ()),
    (174, pynvml.nvmlDeviceGetClockInfo, (pynvml.NVML_CLOCK_GRAPHICS,)),
    (175, pynvml.nvmlDeviceGetClockInfo, (pynvml.NVML_CLOCK_SM,)),
    (176, pynvml.nvmlDeviceGetClockInfo, (pynvml.NVML_CLOCK_MEM,)),
    (188, pynvml.nvmlDeviceGetMaxClockInfo, (pynvml.NVML_CLOCK_SM,)),
    (189, pynvml.nvmlDeviceGetMaxClockInfo, (pynvml.NVML_CLOCK_MEM,)),
]


def test_what_a_capture_shows_as_na_is_not_supported(make_node: MakeNode, tmp_path: Path) -> None:
    name = "a10.535.129.03.nvidia-smi-q.txt"
    node = replay(make_node, REAL_HOSTS / name)
    printed = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert [line for line, call, args in NOT_PRINTED if not answers(call, printed, *args)] == []
    node.uninstall()
    replay(make_node, edited(tmp_path, name, {line: "N/A" for line, _call, _args in NOT_PRINTED}))
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert [line for line, call, args in NOT_PRINTED if answers(call, h, *args)] == []
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceSetPowerManagementLimit(h, 120_000)  # no limits: no power management


@pytest.mark.parametrize(
    ("printed", "mode"),
    [
        ("Default", pynvml.NVML_COMPUTEMODE_DEFAULT),
        ("Exclusive_Process", pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS),
        ("Prohibited", pynvml.NVML_COMPUTEMODE_PROHIBITED),
    ],
)
def test_the_compute_mode_is_answered_as_printed(
    make_node: MakeNode, tmp_path: Path, printed: str, mode: int
) -> None:
    replay(make_node, edited(tmp_path, "a10.535.129.03.nvidia-smi-q.txt", {105: printed}))
    assert pynvml.nvmlDeviceGetComputeMode(pynvml.nvmlDeviceGetHandleByIndex(0)) == mode


@pytest.mark.parametrize(
    "capture", ["h100-sxm-x8.535.161.08.nvidia-smi-q.txt", "a10g.nvidia-smi-q.xml"]
)
def test_no_capture_prints_the_default_ecc_mode(make_node: MakeNode, capture: str) -> None:
    # ECC Mode shows Current and Pending only: the default is the board's class to judge.
    replay(make_node, REAL_HOSTS / capture)
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceGetEccMode(h) == [1, 1]
    assert not answers(pynvml.nvmlDeviceGetDefaultEccMode, h)


ECC_COUNTS = [
    pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL,
    pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL,
    pynvml.NVML_FI_DEV_ECC_SBE_AGG_TOTAL,
    pynvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL,
]


def test_an_ecc_count_shown_na_with_ecc_on_is_not_supported(
    make_node: MakeNode, tmp_path: Path
) -> None:
    # The A10's volatile DRAM counts N/A (as a lost GPU prints them), the aggregate ones 0.
    name = "a10.535.129.03.nvidia-smi-q.txt"
    replay(make_node, edited(tmp_path, name, {128: "N/A", 129: "N/A"}))
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert [field(h, f) for f in ECC_COUNTS] == [None, None, 0, 0]


def test_ecc_turned_on_in_a_replay_has_counts(make_node: MakeNode) -> None:
    # The RTX 4090 runs ECC off, so its capture shows every count N/A.
    node = replay(make_node, REAL_HOSTS / "rtx4090-x8.535.154.05.nvidia-smi-q.txt")
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert [field(h, f) for f in ECC_COUNTS] == [None] * 4
    node.inject("process_exit", 0, {"pid": 2010222})
    node.inject("ecc_mode", 0, {"enabled": True})
    node.reset_gpu(0)
    assert [field(h, f) for f in ECC_COUNTS] == [0] * 4
