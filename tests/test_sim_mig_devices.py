"""Simulated MIG devices through the real pynvml wrappers: one per GPU instance, with
stable UUIDs, the driver's errors, and refusals for what a MIG device handle cannot do."""

from __future__ import annotations

import re
from typing import Any

import pynvml
import pytest

from conftest import MakeNode
from gpuagent.sim.hardware import mig_device_uuid

MIG_NODE = '[node]\ngpus = 2\nmig_mode = true\nmig_profiles = ["3g.40gb", "2g.20gb"]\n'
_UUID = re.compile(r"MIG-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def handle(index: int) -> Any:
    return pynvml.nvmlDeviceGetHandleByIndex(index)


def mig_devices(index: int) -> list[tuple[str, int, int]]:
    """(UUID, GPU instance id, compute instance id) of each MIG device, as an agent reads
    them: every slot up to the maximum, skipping the empty ones."""
    gpu = handle(index)
    found = []
    for slot in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(gpu)):
        try:
            mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, slot)
        except pynvml.NVMLError_NotFound:
            continue
        found.append(
            (
                pynvml.nvmlDeviceGetUUID(mig),
                pynvml.nvmlDeviceGetGpuInstanceId(mig),
                pynvml.nvmlDeviceGetComputeInstanceId(mig),
            )
        )
    return found


def test_each_gpu_instance_is_a_mig_device_with_a_stable_uuid(make_node: MakeNode) -> None:
    make_node(MIG_NODE)
    gpu_uuid = pynvml.nvmlDeviceGetUUID(handle(0))
    first, second = mig_devices(0)
    assert (first[1:], second[1:]) == ((1, 0), (2, 0))
    assert first[0] == mig_device_uuid(gpu_uuid, 1, 0)
    assert second[0] == mig_device_uuid(gpu_uuid, 2, 0)
    assert all(_UUID.fullmatch(uuid) for uuid, _gi, _ci in (first, second))
    # Nothing of the GPU's UUID shows, and the other GPU's MIG devices differ.
    assert gpu_uuid.removeprefix("GPU-") not in first[0]
    assert {u for u, _, _ in mig_devices(1)}.isdisjoint({first[0], second[0]})
    assert pynvml.nvmlDeviceGetMaxMigDeviceCount(handle(0)) == 7  # H100: seven 1g slices


def test_mig_devices_follow_the_instances(make_node: MakeNode) -> None:
    node = make_node(MIG_NODE)
    old = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle(0), 0)
    node.inject("mig_instances", 0, {"profiles": ["1g.10gb", "1g.10gb", "1g.10gb"]})
    assert [(gi, ci) for _u, gi, ci in mig_devices(0)] == [(1, 0), (2, 0), (3, 0)]
    # The destroyed instance's handle is no longer a device.
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetUUID(old)
    node.reset_gpu(0)  # a reset destroys the instances: every slot empty
    assert mig_devices(0) == []


def test_mig_device_calls_check_their_arguments(make_node: MakeNode) -> None:
    make_node(MIG_NODE)
    with pytest.raises(pynvml.NVMLError_NotFound):  # a slot with no instance
        pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle(0), 2)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):  # past the maximum
        pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle(0), 7)
    # A whole GPU has no instance ids.
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetGpuInstanceId(handle(0))
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetComputeInstanceId(handle(0))


@pytest.mark.parametrize(
    "node",
    [
        '[node]\ngpus = 1\nmig_mode = false\nmig_profiles = ["3g.40gb"]\n',  # MIG mode off
        '[node]\ngpus = 1\nmodel = "v100-sxm2"\n',  # no MIG on the model
    ],
)
def test_no_mig_devices_without_mig_mode(make_node: MakeNode, node: str) -> None:
    make_node(node)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetMaxMigDeviceCount(handle(0))
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle(0), 0)


def test_a_mig_handle_refuses_what_it_cannot_answer(make_node: MakeNode) -> None:
    make_node(MIG_NODE)
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle(0), 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetTemperature(mig, pynvml.NVML_TEMPERATURE_GPU)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetPowerUsage(mig)
    with pytest.raises(pynvml.NVMLError_NotSupported):  # no MIG devices inside a MIG device
        pynvml.nvmlDeviceGetMigDeviceHandleByIndex(mig, 0)
    # The GPU still answers.
    assert pynvml.nvmlDeviceGetTemperature(handle(0), pynvml.NVML_TEMPERATURE_GPU) > 0


def test_a_lost_gpu_takes_its_mig_devices_along(make_node: MakeNode) -> None:
    node = make_node(MIG_NODE)
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle(0), 0)
    node.inject("gpu_lost", 0, {})
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetUUID(mig)
