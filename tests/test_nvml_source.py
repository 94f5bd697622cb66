"""The NVML source in-process against the simulator: init retry, the call budget, outcomes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import TEST_DATA, FakeClock
from gpuagent.config import NvmlSourceSection
from gpuagent.nvml.device import mig_profile_name
from gpuagent.sim import SimulatedNode, parse_scenario, replay_scenario
from gpuagent.sim.hardware import mig_device_uuid
from gpuagent.sim.scenario import INIT_ERRORS
from gpuagent.smi import load_capture
from gpuagent.sources.nvml import NvmlSource

SCENARIO = '[node]\ngpus = 8\nmodel = "NVIDIA H100 80GB HBM3"\n'


@pytest.fixture
def node() -> Iterator[SimulatedNode]:
    # The source initialises NVML itself, so not the shared `node` fixture.
    with SimulatedNode(parse_scenario(SCENARIO)) as simulated:
        yield simulated


def _source(node: SimulatedNode, clock: FakeClock, **config: float) -> NvmlSource:
    return NvmlSource(NvmlSourceSection(**config), process_name=node.process_name, clock=clock)


async def test_nvml_calls_per_gpu_per_poll_stay_within_budget(node: SimulatedNode) -> None:
    clock = FakeClock()
    source = _source(node, clock, interval_seconds=5, slow_interval_seconds=30)
    await source.poll()  # identities and the first slow read
    node.reset_call_counts()
    polls = 12  # one minute at the default 5 s: two slow reads among them
    for _ in range(polls):
        clock.now += 5
        observation = await source.poll()
        assert all(gpu.status == "ok" for gpu in observation.gpus)
    per_gpu = node.calls_per_device()
    assert set(per_gpu) == set(range(8))
    # GPM is counted on its own: one sample per GPU every 30 s (profiling_interval_seconds),
    # every sixth poll (docs/benchmarks.md).
    gpm = node.call_counts()["nvmlGpmSampleGet"] / len(per_gpu)
    assert gpm == polls / 6
    for calls in per_gpu.values():
        assert (calls - gpm) / polls <= 12
    await source.close()


async def test_slow_values_are_carried_between_slow_reads(node: SimulatedNode) -> None:
    clock = FakeClock()
    source = _source(node, clock, slow_interval_seconds=30)
    first = await source.poll()
    clock.now += 5
    second = await source.poll()
    for gpu in (first.gpus[0], second.gpus[0]):
        assert gpu.readings is not None
        assert gpu.readings.persistence_mode is True
        assert gpu.readings.pcie_generation == 5
    node.inject("persistence_off", 0, {})
    clock.now += 5
    still = await source.poll()
    assert still.gpus[0].readings is not None
    assert still.gpus[0].readings.persistence_mode is True  # not re-read yet
    clock.now += 30
    later = await source.poll()
    assert later.gpus[0].readings is not None
    assert later.gpus[0].readings.persistence_mode is False
    await source.close()


async def test_init_failure_is_classified_and_retried(node: SimulatedNode) -> None:
    node.set_init_error("driver_not_loaded")
    clock = FakeClock()
    source = _source(node, clock, init_retry_seconds=30)
    failed = await source.poll()
    assert not failed.status.ok
    assert failed.status.problem == "driver_not_loaded"
    assert failed.gpus == ()
    node.set_init_error(None)
    clock.now += 10
    assert (await source.poll()).status.problem == "driver_not_loaded"  # not retried yet
    clock.now += 30
    recovered = await source.poll()
    assert recovered.status.ok
    assert recovered.status.driver_version == "550.54.15"
    assert len(recovered.gpus) == 8
    await source.close()


@pytest.mark.parametrize("problem", INIT_ERRORS)
async def test_each_init_problem_is_named(node: SimulatedNode, problem: str) -> None:
    node.set_init_error(problem)
    # "timeout" blocks nvmlInit past the call timeout; the others fail at once.
    source = _source(node, FakeClock(), call_timeout_seconds=0.3)
    observation = await source.poll()
    node.set_init_error(None)  # lets a blocked nvmlInit return, so its thread ends
    assert observation.status.problem == problem
    assert observation.status.message
    await source.close()


async def test_a_gpu_lost_before_start_is_reported_lost(node: SimulatedNode) -> None:
    node.inject("gpu_lost", 3, {})
    observation = await _source(node, FakeClock()).poll()
    states = {gpu.identity.index: gpu for gpu in observation.gpus}
    assert len(states) == 8
    assert states[3].status == "lost"
    assert states[3].readings is None
    assert all(states[i].status == "ok" for i in states if i != 3)


async def test_identity_matches_what_nvml_reports(node: SimulatedNode) -> None:
    observation = await _source(node, FakeClock()).poll()
    identity = observation.gpus[0].identity
    assert identity.pci_bus_id == "0000:18:00.0"
    assert identity.device == "nvidia0"
    assert identity.temperature_slowdown_c == 87.0
    assert identity.temperature_shutdown_c == 93.0  # T.Limit -8 in the H100 captures
    assert identity.power_default_limit_w == 700.0
    assert (identity.pcie_max_generation, identity.pcie_max_width) == (5, 16)
    assert identity.nvlink_count == 18
    readings = observation.gpus[0].readings
    assert readings is not None
    assert readings.nvlink_up == (True,) * 18
    assert readings.ecc_enabled is True
    assert readings.fb_used_mib is not None
    assert readings.fb_free_mib is not None


async def test_inventory_values_are_read_with_identity_and_slow_readings() -> None:
    scenario = (
        '[node]\ngpus = 2\nfabric_state = "in_progress"\ngsp_firmware_version = "550.1.2"\n'
        '[[fault]]\ngpu = 1\nkind = "ecc_mode"\nenabled = false\n'
        '[[fault]]\ngpu = 1\nkind = "app_clocks"\nmhz = 1500\n'
    )
    with SimulatedNode(parse_scenario(scenario)) as node:
        clock = FakeClock()
        source = _source(node, clock)
        first, second = (await source.poll()).gpus
        await source.close()
    assert first.identity.inforom_version == "G520.0200.00.05"
    assert first.identity.gsp_firmware_version == "550.1.2"
    assert first.identity.applications_clock_default_mhz == 1980
    assert first.readings is not None
    assert second.readings is not None
    assert (first.readings.ecc_enabled, first.readings.ecc_enabled_pending) == (True, True)
    assert (second.readings.ecc_enabled, second.readings.ecc_enabled_pending) == (True, False)
    assert (first.readings.applications_clock_mhz, second.readings.applications_clock_mhz) == (
        1980,
        1500,
    )
    assert (first.readings.fabric_state, first.readings.fabric_ok) == ("in_progress", None)


async def test_fabric_and_gsp_absent_where_not_supported() -> None:
    scenario = '[node]\ngpus = 1\ngsp_firmware_version = "none"\n'
    with SimulatedNode(parse_scenario(scenario)) as node:
        node.inject("fabric", 0, {"state": "completed", "ok": False})
        source = _source(node, FakeClock())
        (gpu,) = (await source.poll()).gpus
        await source.close()
    assert gpu.identity.gsp_firmware_version is None
    assert gpu.readings is not None
    assert (gpu.readings.fabric_state, gpu.readings.fabric_ok) == ("completed", False)


MIG_NODE = '[node]\ngpus = 2\nmig_mode = true\nmig_profiles = ["3g.40gb", "1g.10gb", "1g.10gb"]\n'


async def test_mig_instances_are_read_on_the_slow_cadence_while_mig_is_on() -> None:
    scenario = MIG_NODE + '[[fault]]\ngpu = 1\nkind = "mig_instances"\nprofiles = ["1g.10gb+me"]\n'
    with SimulatedNode(parse_scenario(scenario)) as node:
        clock = FakeClock()
        source = _source(node, clock, slow_interval_seconds=30)
        first, second = (await source.poll()).gpus
        assert first.readings is not None
        assert second.readings is not None
        assert first.readings.mig_instances == ("1g.10gb", "1g.10gb", "3g.40gb")
        assert second.readings.mig_instances == ("1g.10gb+me",)
        # The profiles are read once; later slow reads list the instances only.
        node.reset_call_counts()
        node.inject("mig_instances", 0, {"profiles": ["7g.80gb"]})
        clock.now += 5
        carried = (await source.poll()).gpus[0].readings
        assert carried is not None
        assert carried.mig_instances == ("1g.10gb", "1g.10gb", "3g.40gb")
        clock.now += 30
        fresh = (await source.poll()).gpus[0].readings
        assert fresh is not None
        assert fresh.mig_instances == ("7g.80gb",)
        counts = node.call_counts()
        await source.close()
    assert "nvmlDeviceGetGpuInstanceProfileInfoV" not in counts
    assert counts["nvmlDeviceGetGpuInstances"] == 2 * 7  # one slow read, 7 profiles, 2 GPUs


async def test_no_mig_calls_while_mig_is_off(node: SimulatedNode) -> None:
    source = _source(node, FakeClock())
    observation = await source.poll()
    await source.close()
    assert all(
        g.readings is not None and g.readings.mig_instances is None for g in observation.gpus
    )
    assert all(g.readings is not None and g.readings.mig_devices == () for g in observation.gpus)
    called = node.call_counts()
    assert not {
        "nvmlDeviceGetGpuInstanceProfileInfoV",
        "nvmlDeviceGetGpuInstances",
        "nvmlDeviceGetMaxMigDeviceCount",
        "nvmlDeviceGetMigDeviceHandleByIndex",
        "nvmlDeviceGetGpuInstanceId",
    } & set(called)


async def test_mig_devices_are_read_on_the_slow_cadence_while_mig_is_on() -> None:
    with SimulatedNode(parse_scenario(MIG_NODE)) as node:
        clock = FakeClock()
        source = _source(node, clock, slow_interval_seconds=30)
        first, _second = (await source.poll()).gpus
        assert first.readings is not None
        devices = first.readings.mig_devices
        assert [(d.gpu_instance_id, d.compute_instance_id) for d in devices] == [
            (1, 0),
            (2, 0),
            (3, 0),
        ]
        assert devices[0].uuid == mig_device_uuid(first.identity.uuid, 1, 0)
        assert len({d.uuid for d in devices}) == 3
        # Between slow reads the devices are carried, not asked for.
        node.reset_call_counts()
        node.inject("mig_instances", 0, {"profiles": ["7g.80gb"]})
        clock.now += 5
        carried = (await source.poll()).gpus[0].readings
        assert carried is not None
        assert carried.mig_devices == devices
        assert node.call_counts().get("nvmlDeviceGetMigDeviceHandleByIndex", 0) == 0
        clock.now += 30
        fresh = (await source.poll()).gpus[0].readings
        assert fresh is not None
        assert [(d.gpu_instance_id, d.uuid) for d in fresh.mig_devices] == [
            (1, mig_device_uuid(first.identity.uuid, 1, 0))
        ]
        counts = node.call_counts()
        await source.close()
    # One slow read of two GPUs: every slot of each, and three calls per MIG device.
    assert counts["nvmlDeviceGetMaxMigDeviceCount"] == 2
    assert counts["nvmlDeviceGetMigDeviceHandleByIndex"] == 2 * 7
    assert counts["nvmlDeviceGetGpuInstanceId"] == 1 + 3


@pytest.mark.parametrize(
    ("slices", "memory_mib", "nvml_name", "name"),
    [
        (1, 9984, "MIG 1g.10gb", "1g.10gb"),
        (1, 9984, "MIG 1g.10gb+me", "1g.10gb+me"),
        (1, 9984, "", "1g.10gb"),
        (1, 4864, "", "1g.5gb"),
        (3, 40448, "", "3g.40gb"),
        (4, 40448, "", "4g.40gb"),
        (7, 81152, "", "7g.80gb"),
        (7, 40192, "  ", "7g.40gb"),
        (2, 20480, "", "2g.20gb"),
    ],
)
def test_mig_profile_names(slices: int, memory_mib: int, nvml_name: str, name: str) -> None:
    assert mig_profile_name(slices, memory_mib, nvml_name) == name


@pytest.mark.parametrize(
    ("node", "state", "mask", "calls"),
    [
        pytest.param(
            '[node]\ngpus = 1\nfabric_state = "completed"\n',
            "completed",
            0,
            {"nvmlDeviceGetGpuFabricInfoV": 1},
            id="v3-answers",
        ),
        pytest.param(
            '[node]\ngpus = 1\nfabric_state = "completed"\ndriver_version = "535.161.08"\n',
            "completed",
            None,
            {"nvmlDeviceGetGpuFabricInfoV": 1, "nvmlDeviceGetGpuFabricInfo": 1},
            id="driver-without-v3-asks-v1",
        ),
        pytest.param(
            "[node]\ngpus = 1\n",
            None,
            None,
            {"nvmlDeviceGetGpuFabricInfoV": 1},
            id="no-fabric-one-call",
        ),
    ],
)
async def test_fabric_info_v3_first_and_the_first_version_only_where_it_is_missing(
    node: str, state: str | None, mask: int | None, calls: dict[str, int]
) -> None:
    with SimulatedNode(parse_scenario(node)) as simulated:
        source = _source(simulated, FakeClock())
        (gpu,) = (await source.poll()).gpus
        await source.close()
        made = {k: v for k, v in simulated.call_counts().items() if "FabricInfo" in k}
    assert gpu.readings is not None
    assert (gpu.readings.fabric_state, gpu.readings.fabric_health_mask) == (state, mask)
    assert made == calls


@pytest.mark.parametrize(
    ("capture", "power_w"),
    [
        # No 1 s average on Turing: nvmlDeviceGetPowerUsage answers the instantaneous draw.
        pytest.param("T4-aws.595.91.07.nvidia-smi-q.xml", 33.51, id="t4"),
        pytest.param("RTX2080S-idle.610.57.04.nvidia-smi-q.txt", 38.89, id="r610-2080s"),
        pytest.param("h100-x1.580.159.04.nvidia-smi-q.txt", 75.24, id="h100-average"),
    ],
)
async def test_power_without_the_average_field_is_read_on_every_poll(
    capture: str, power_w: float
) -> None:
    scenario = replay_scenario(load_capture(TEST_DATA / "real-hosts" / capture))
    with SimulatedNode(scenario) as node:
        clock = FakeClock()
        source = _source(node, clock, interval_seconds=5, slow_interval_seconds=30)
        seen = []
        for _ in range(3):
            observation = await source.poll()
            readings = observation.gpus[0].readings
            assert readings is not None
            seen.append(readings.power_w)
            clock.now += 5
        await source.close()
    assert seen == [pytest.approx(power_w)] * 3


async def test_memory_is_read_through_v1_where_the_driver_has_no_v2(tmp_path: Path) -> None:
    # Drivers before R510 print no Reserved line and have no v2 memory call.
    text = (TEST_DATA / "real-hosts" / "a10.535.129.03.nvidia-smi-q.txt").read_text()
    old = tmp_path / "a10-no-reserved.txt"
    old.write_text(text.replace("        Reserved                          : 512 MiB\n", ""))
    with SimulatedNode(replay_scenario(load_capture(old))) as node:
        source = _source(node, FakeClock())
        for _ in range(2):
            readings = (await source.poll()).gpus[0].readings
            assert readings is not None
            assert (readings.fb_used_mib, readings.fb_free_mib) == (4, 22511)
            assert readings.fb_reserved_mib is None  # v1 has none: absent, not 0
        await source.close()
