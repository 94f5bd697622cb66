"""The agent's own live run on a real H200 (driver 580.159.04, tests/data/live/): the same
GPU's `nvidia-smi -q` capture, replayed, must serve what the live daemon served — the same
series, within what moves between two moments of an idle GPU — except what a capture
cannot hold and what was added since that run, both named here. The simulator's `h200`
model must read as that GPU did: idle as the live daemon served it, and under the run's
bf16 matmul as `nvidia-smi` sampled it (smi-load.csv)."""

from __future__ import annotations

import asyncio
import csv
import statistics

import pynvml
import pytest
from prometheus_client.samples import Sample

from conftest import TEST_DATA, FakeClock, MakeNode
from gpuagent.config import Config
from gpuagent.daemon import Agent
from gpuagent.metrics.collector import build_families
from gpuagent.metrics.exposition import TextRenderer
from gpuagent.sim import parse_scenario
from hardware_profiles_doc import REAL_HOSTS, collect
from test_metrics_support import samples_from_text

LIVE = TEST_DATA / "live" / "h200-580.159.04"

# Served live, never from a capture: `nvidia-smi -q` prints no throttle-duration counters
# and no GPM metrics; sysfs, kernel modules and NVSwitches are host facts a capture lacks;
# remediation state belongs to a running daemon.
NOT_IN_A_CAPTURE = {
    *(
        f"DCGM_FI_DEV_{reason}_VIOLATION"
        for reason in ("BOARD_LIMIT", "LOW_UTIL", "POWER", "RELIABILITY", "SYNC_BOOST", "THERMAL")
    ),
    *(
        f"DCGM_FI_PROF_{name}"
        for name in (
            "DRAM_ACTIVE",
            "GR_ENGINE_ACTIVE",
            "PCIE_RX_BYTES",
            "PCIE_TX_BYTES",
            "PIPE_FP16_ACTIVE",
            "PIPE_FP32_ACTIVE",
            "PIPE_FP64_ACTIVE",
            "PIPE_TENSOR_ACTIVE",
            "SM_ACTIVE",
            "SM_OCCUPANCY",
        )
    ),
    # Untyped in the live run; counters named `..._total` since, which the text parser
    # reads as these same family names.
    "gpuagent_gpu_hw_power_brake_slowdown_seconds",
    "gpuagent_gpu_hw_thermal_slowdown_seconds",
    "gpuagent_gpu_sw_thermal_slowdown_seconds",
    "gpuagent_kernel_module_loaded",
    "gpuagent_nvswitches_seen",
    "gpuagent_pcie_link_max_speed_gts",
    "gpuagent_pcie_link_max_width",
    "gpuagent_pcie_link_speed_gts",
    "gpuagent_pcie_link_width",
    "gpuagent_remediation_budget_remaining",
    "gpuagent_remediation_cordoned",
    "gpuagent_remediation_enforcing",
    "gpuagent_remediation_paused",
}
# Added after that run, from what it showed: the instantaneous power beside the average,
# the recovery state, the requested power limit (also under DCGM's name, with the clock
# event mask) and the compute mode, the sources' availability, the agent's own process.
ADDED_SINCE = {
    "DCGM_FI_DEV_POWER_USAGE_INSTANT",
    "DCGM_FI_DEV_POWER_MGMT_LIMIT",
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
    "gpuagent_gpu_power_limit_requested_watts",
    "gpuagent_gpu_compute_mode",
    "gpuagent_agent_info",
    "gpuagent_gpu_recovery_action",
    "gpuagent_gpu_channel_repair_pending",
    "gpuagent_gpu_tpc_repair_pending",
    "gpuagent_gpu_unrepairable_memory",
    "gpuagent_source_available",
    "process_resident_memory_bytes",
    "process_virtual_memory_bytes",
    "process_cpu_seconds_total",
    "process_open_fds",
    "process_max_fds",
    "process_start_time_seconds",
    "process_threads",
}
# Labels added after that run: dcgm-exporter's XID code and text (no XID: 0, "No Error").
LABELS_ADDED_SINCE = {"DCGM_FI_DEV_XID_ERRORS": {"err_code": "0", "err_msg": "No Error"}}
# How far two moments of the same idle GPU differ (the capture came minutes after the
# scrape): degrees, watts drawn, MiB of framebuffer rounding.
TOLERANCE = {
    "DCGM_FI_DEV_GPU_TEMP": 2.0,
    "DCGM_FI_DEV_MEMORY_TEMP": 2.0,
    "DCGM_FI_DEV_POWER_USAGE": 5.0,
    "DCGM_FI_DEV_FB_FREE": 1.0,
    "DCGM_FI_DEV_FB_RESERVED": 1.0,
}
# A counter since the driver loaded: the replay models its own.
NOT_COMPARED = {"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"}


@pytest.fixture(scope="module", params=["txt", "xml"])
def replayed(request: pytest.FixtureRequest) -> dict[str, list[Sample]]:
    capture = REAL_HOSTS / f"h200-x1.580.159.04.nvidia-smi-q.{request.param}"
    snapshot = collect(capture)
    return samples_from_text(TextRenderer().render(build_families(snapshot, "test")).decode())


@pytest.fixture(scope="module")
def live() -> dict[str, list[Sample]]:
    return samples_from_text((LIVE / "metrics-idle.txt").read_text())


def test_the_replay_serves_the_series_the_live_run_served(
    replayed: dict[str, list[Sample]], live: dict[str, list[Sample]]
) -> None:
    process = {name for name in ADDED_SINCE if name.startswith("process_")}
    assert set(live) - set(replayed) == NOT_IN_A_CAPTURE
    # The process metrics come with the registry, not the snapshot's families.
    assert set(replayed) - set(live) == ADDED_SINCE - process


def test_every_shared_gpu_value_agrees_with_the_live_run(
    replayed: dict[str, list[Sample]], live: dict[str, list[Sample]]
) -> None:
    compared = 0
    for name in sorted(set(live) & set(replayed)):
        if not name.startswith("DCGM_FI_DEV_") or name in NOT_COMPARED:
            continue
        (want,), (got,) = live[name], replayed[name]
        assert got.labels == {**want.labels, **LABELS_ADDED_SINCE.get(name, {})}, name
        assert got.value == pytest.approx(want.value, abs=TOLERANCE.get(name, 0.0)), name
        compared += 1
    assert compared >= 20


def test_power_is_the_average_as_nvidia_smi_reads_it(replayed: dict[str, list[Sample]]) -> None:
    # The text capture's average is 82.65 W, the XML's (a moment later) 82.69 W; both
    # read 82.81 W instantaneous.
    (average,), (instant,) = (
        replayed["DCGM_FI_DEV_POWER_USAGE"],
        replayed["DCGM_FI_DEV_POWER_USAGE_INSTANT"],
    )
    assert average.value in (82.65, 82.69)
    assert instant.value == 82.81


# --- the simulated h200 model against the live GPU ------------------------------------------

# The simulated GPU as the live one ran: one GPU (a pass-through VM), the same driver.
H200_NODE = '[node]\nmodel = "h200"\ngpus = 1\ndriver_version = "580.159.04"\n'
# Counters since the driver loaded (and the throttle durations they sum): the model counts
# its own from the node's start.
COUNTERS = {
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    *(
        f"DCGM_FI_DEV_{reason}_VIOLATION"
        for reason in ("BOARD_LIMIT", "LOW_UTIL", "POWER", "RELIABILITY", "SYNC_BOOST", "THERMAL")
    ),
}


@pytest.fixture(scope="module")
def modelled() -> dict[str, list[Sample]]:
    snapshot = asyncio.run(Agent(Config(), simulate=parse_scenario(H200_NODE)).collect_once())
    return samples_from_text(TextRenderer().render(build_families(snapshot, "test")).decode())


def test_the_h200_model_idles_as_the_live_gpu_did(
    modelled: dict[str, list[Sample]], live: dict[str, list[Sample]]
) -> None:
    live_gpu = {name for name in live if name.startswith("DCGM_FI_DEV_")}
    assert live_gpu <= set(modelled)
    compared = 0
    for name in sorted(live_gpu - COUNTERS):
        (want,), (got,) = live[name], modelled[name]
        assert got.value == pytest.approx(want.value, abs=TOLERANCE.get(name, 0.0)), name
        compared += 1
    assert compared >= 20


def _load_rows() -> list[dict[str, str]]:
    with (LIVE / "smi-load.csv").open(newline="") as handle:
        rows = [{k.strip(): v.strip() for k, v in row.items()} for row in csv.DictReader(handle)]
    # The matmul part of the run: SW Power Cap active (0x4); the copy loop after it is not.
    return [row for row in rows if int(row["clocks_event_reasons.active"], 16) == 0x4]


def _number(text: str) -> float:
    return float(text.split(maxsplit=1)[0])


def test_the_h200_model_at_the_power_cap_reads_as_the_live_matmul(make_node: MakeNode) -> None:
    rows = _load_rows()
    assert len(rows) >= 10
    clock = FakeClock()
    node = make_node(H200_NODE, clock=clock)
    node.inject("process", 0, {"pid": 4242, "name": "matmul", "used_mib": 1139})
    clock.advance(14)  # as far into the load as metrics-matmul.txt was taken
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert (
        pynvml.nvmlDeviceGetCurrentClocksEventReasons(h) == pynvml.nvmlClocksEventReasonSwPowerCap
    )
    sm = pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)
    live_sm = [_number(row["clocks.current.sm [MHz]"]) for row in rows]
    assert min(live_sm) <= sm <= max(live_sm)  # 1470-1530 MHz
    power_w = pynvml.nvmlDeviceGetPowerUsage(h) / 1000
    live_power = statistics.median(_number(row["power.draw [W]"]) for row in rows)
    assert power_w == pytest.approx(live_power, abs=15)  # at the 700 W cap: 689-694 W live
    temperature = pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
    live_temperature = statistics.median(_number(row["temperature.gpu"]) for row in rows)
    assert temperature == pytest.approx(live_temperature, abs=2)  # 56-58 °C live
    assert pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM) == 3201
    assert pynvml.nvmlDeviceGetPerformanceState(h) == pynvml.NVML_PSTATE_0
