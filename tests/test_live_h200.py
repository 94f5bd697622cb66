"""The agent's own live run on a real H200 (driver 580.159.04, tests/data/live/): the same
GPU's `nvidia-smi -q` capture, replayed, must serve what the live daemon served — the same
series, within what moves between two moments of an idle GPU — except what a capture
cannot hold and what was added since that run, both named here."""

from __future__ import annotations

import pytest
from prometheus_client.samples import Sample

from conftest import TEST_DATA
from gpuagent.metrics.collector import build_families
from gpuagent.metrics.exposition import TextRenderer
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
# the recovery state, the sources' availability, the agent's own process.
ADDED_SINCE = {
    "DCGM_FI_DEV_POWER_USAGE_INSTANT",
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
        assert got.labels == want.labels, name
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
