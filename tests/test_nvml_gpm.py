"""GPM through the NVML source: samples ping-pong, DCGM field ids and units, call cost."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from conftest import FakeClock
from gpuagent.config import NvmlSourceSection
from gpuagent.model import GpuState
from gpuagent.nvml.gpm import GPM_TO_DCGM
from gpuagent.sim import SimulatedNode, parse_scenario
from gpuagent.sources.nvml import NvmlSource

GR_ENGINE, SM_ACTIVE, TENSOR, DRAM = 1001, 1002, 1004, 1005
PCIE_TX, PCIE_RX, NVLINK_TX, NVLINK_RX, NVLINK_BANDWIDTH = 1009, 1010, 1011, 1012, 449
RATIOS = (1001, 1002, 1003, 1004, 1005, 1006, 1007, 1008, 1013, 1014, 1015, 1016)
_BUSY = {"pid": 7, "name": "train.py", "used_mib": 2000}
_GPM_SAMPLING = ("nvmlGpmSampleGet", "nvmlGpmMigSampleGet", "nvmlGpmMetricsGet")


class Rig:
    """A simulated node on a hand-moved clock and the NVML source polling it."""

    def __init__(self, scenario: str, **config: object) -> None:
        self.clock = FakeClock()
        # A sample every 1 s poll unless a test asks otherwise (the default is 30 s).
        config.setdefault("profiling_interval_seconds", 1.0)
        self.node = SimulatedNode(parse_scenario(scenario), clock=self.clock)
        self.node.install()
        self.source = NvmlSource(
            NvmlSourceSection(**config),  # type: ignore[arg-type]
            process_name=self.node.process_name,
            clock=self.clock,
        )

    async def poll(self, seconds: float = 1.0) -> tuple[GpuState, ...]:
        self.clock.advance(seconds)
        observation = await self.source.poll()
        assert all(gpu.status == "ok" for gpu in observation.gpus)
        return observation.gpus

    async def close(self) -> None:
        await self.source.close()
        self.node.uninstall()


@pytest.fixture
def rigs() -> Iterator[list[Rig]]:
    made: list[Rig] = []
    yield made
    for rig in made:
        rig.node.uninstall()


def whole_gpu(gpu: GpuState) -> dict[int, float]:
    assert gpu.readings is not None
    (entry,) = [p for p in gpu.readings.profiling if p.gpu_instance_id is None]
    assert entry.source == "gpm"
    return dict(entry.values)


async def test_rates_need_two_samples_then_come_every_poll(rigs: list[Rig]) -> None:
    rig = Rig('[node]\ngpus = 2\nmodel = "h100-sxm"\n')
    rigs.append(rig)
    first = await rig.poll()
    assert all(gpu.readings is not None and gpu.readings.profiling == () for gpu in first)
    for _ in range(3):
        for gpu in await rig.poll():
            values = whole_gpu(gpu)
            assert set(values) == {field for field, _ in GPM_TO_DCGM.values()} | {NVLINK_BANDWIDTH}
    await rig.close()


async def test_units_are_dcgm_units(rigs: list[Rig]) -> None:
    rig = Rig('[node]\ngpus = 1\nmodel = "h100-sxm"\nnvlinks = 18\n')
    rigs.append(rig)
    rig.node.inject("process", 0, _BUSY)
    await rig.poll()
    (gpu,) = await rig.poll(2.0)
    values = whole_gpu(gpu)
    for field in RATIOS:
        assert 0.0 <= values[field] <= 1.0, field  # GPM's percent as DCGM's ratio
    assert 0.85 <= values[GR_ENGINE] <= 1.0
    # PCIe and NVLink in bytes/s (GPM gives MiB/s): a Gen5 x16 link moves gigabytes.
    assert values[PCIE_RX] > 1e9
    assert values[NVLINK_RX] > 1e10
    rig.node.inject("process_exit", 0, {"pid": 7})
    await rig.poll()
    (gpu,) = await rig.poll(2.0)
    idle = whole_gpu(gpu)
    # Idle, PCIe carries the simulator's housekeeping trickle: 64 KiB/s each way.
    assert idle[PCIE_RX] == pytest.approx(64 * 1024)
    assert idle[SM_ACTIVE] == 0.0
    await rig.close()


async def test_rising_load_raises_sm_and_tensor_activity(rigs: list[Rig]) -> None:
    rig = Rig('[node]\ngpus = 2\nmodel = "h200"\n')
    rigs.append(rig)
    await rig.poll()
    before = whole_gpu((await rig.poll())[0])
    rig.node.inject("process", 0, _BUSY)
    during = [whole_gpu(gpu) for gpu in await rig.poll()]
    after = [whole_gpu(gpu) for gpu in await rig.poll()]
    assert before[SM_ACTIVE] == before[TENSOR] == 0.0
    # The process started between two samples: half an interval of work, then all of it.
    assert 0.0 < during[0][SM_ACTIVE] < after[0][SM_ACTIVE]
    assert 0.0 < during[0][TENSOR] < after[0][TENSOR]
    assert after[0][DRAM] > 0.0
    assert after[1][SM_ACTIVE] == 0.0  # the other GPU has nothing running
    await rig.close()


async def test_each_poll_costs_one_sample_and_one_metrics_call_per_gpu(rigs: list[Rig]) -> None:
    rig = Rig('[node]\ngpus = 4\nmodel = "h100-sxm"\n')
    rigs.append(rig)
    await rig.poll()
    await rig.poll()
    rig.node.reset_call_counts()
    polls = 5
    for _ in range(polls):
        await rig.poll()
    counts = rig.node.call_counts()
    assert counts["nvmlGpmSampleGet"] == 4 * polls
    assert counts["nvmlGpmMetricsGet"] == 4 * polls
    # Samples are allocated once, support asked once: nothing else from GPM per poll.
    gpm = {name: n for name, n in counts.items() if "Gpm" in name}
    assert set(gpm) == {"nvmlGpmSampleGet", "nvmlGpmMetricsGet"}
    await rig.close()
    freed = rig.node.call_counts()
    assert freed["nvmlGpmSampleFree"] == 2 * 4  # two samples per GPU, given back


async def test_samples_come_at_the_profiling_interval_and_polls_between_carry_them(
    rigs: list[Rig],
) -> None:
    rig = Rig('[node]\ngpus = 1\nmodel = "h100-sxm"\n', profiling_interval_seconds=10.0)
    rigs.append(rig)
    (first,) = await rig.poll(5)
    assert first.readings is not None
    assert first.readings.profiling == ()
    # The first values need a second sample: it is taken at the next poll, not 10 s on.
    (second,) = await rig.poll(5)
    assert second.readings is not None
    assert second.readings.profiling
    samples = rig.node.call_counts()["nvmlGpmSampleGet"]
    (third,) = await rig.poll(5)  # 5 s later: carried, no call
    assert third.readings is not None
    assert third.readings.profiling == second.readings.profiling
    assert rig.node.call_counts()["nvmlGpmSampleGet"] == samples
    (fourth,) = await rig.poll(5)  # 10 s after the last sample: a new one
    assert rig.node.call_counts()["nvmlGpmSampleGet"] == samples + 1
    assert rig.node.call_counts()["nvmlGpmMetricsGet"] == 2
    assert fourth.readings is not None
    assert fourth.readings.profiling
    await rig.close()


async def test_a_gpu_without_gpm_costs_one_support_query_and_exports_nothing(
    rigs: list[Rig],
) -> None:
    rig = Rig('[node]\ngpus = 2\nmodel = "a100-sxm4"\n')
    rigs.append(rig)
    for _ in range(4):
        gpus = await rig.poll()
        assert all(gpu.readings is not None and gpu.readings.profiling == () for gpu in gpus)
    gpm = {name: n for name, n in rig.node.call_counts().items() if "Gpm" in name}
    assert gpm == {"nvmlGpmQueryDeviceSupport": 2}
    await rig.close()


async def test_profiling_off_makes_no_gpm_calls(rigs: list[Rig]) -> None:
    rig = Rig('[node]\ngpus = 2\nmodel = "h100-sxm"\n', profiling=False)
    rigs.append(rig)
    for _ in range(3):
        gpus = await rig.poll()
        assert all(gpu.readings is not None and gpu.readings.profiling == () for gpu in gpus)
    assert not [name for name in rig.node.call_counts() if "Gpm" in name]
    await rig.close()


async def test_no_nvlink_no_nvlink_values(rigs: list[Rig]) -> None:
    rig = Rig('[node]\ngpus = 1\nmodel = "h100-pcie"\n')
    rigs.append(rig)
    await rig.poll()
    values = whole_gpu((await rig.poll())[0])
    assert PCIE_TX in values
    assert not {NVLINK_TX, NVLINK_RX, NVLINK_BANDWIDTH} & set(values)
    await rig.close()


async def test_nvlink_bandwidth_follows_the_load(rigs: list[Rig]) -> None:
    rig = Rig('[node]\ngpus = 1\nmodel = "h100-sxm"\nnvlinks = 18\n')
    rigs.append(rig)
    await rig.poll()
    idle = whole_gpu((await rig.poll())[0])
    rig.node.inject("process", 0, _BUSY)
    await rig.poll()
    busy = whole_gpu((await rig.poll())[0])
    assert idle[NVLINK_BANDWIDTH] == 0.0
    assert busy[NVLINK_BANDWIDTH] > 0.0
    await rig.close()


async def test_mig_instances_get_their_own_values(rigs: list[Rig]) -> None:
    rig = Rig(
        '[node]\ngpus = 1\nmodel = "h100-sxm"\nnvlinks = 18\nmig_mode = true\n'
        'mig_profiles = ["3g.40gb", "2g.20gb", "1g.10gb"]\n'
    )
    rigs.append(rig)
    rig.node.inject("process", 0, _BUSY)
    await rig.poll()
    (gpu,) = await rig.poll()
    assert gpu.readings is not None
    entries = {p.gpu_instance_id: p for p in gpu.readings.profiling}
    assert set(entries) == {None, 1, 2, 3}
    assert gpu.readings.profiling[0].gpu_instance_id is None  # the whole GPU first
    profiles = {gi: p.gpu_instance_profile for gi, p in entries.items()}
    assert profiles == {None: None, 1: "3g.40gb", 2: "2g.20gb", 3: "1g.10gb"}
    busy, idle = dict(entries[1].values), dict(entries[2].values)
    assert busy[SM_ACTIVE] > 0.5
    assert idle[SM_ACTIVE] == 0.0
    assert NVLINK_RX not in busy  # NVLink is the whole GPU's
    counts = rig.node.call_counts()
    assert counts["nvmlGpmMigSampleGet"] == 2 * 3
    await rig.close()


def test_every_mapping_is_a_dcgm_profiling_field() -> None:
    fields = [field for field, _ in GPM_TO_DCGM.values()]
    assert sorted(fields) == list(range(1001, 1017))
    ratio = {f for f, factor in GPM_TO_DCGM.values() if factor == 0.01}
    assert ratio == set(RATIOS)
    assert all(factor == 1024 * 1024 for f, factor in GPM_TO_DCGM.values() if f not in ratio)
