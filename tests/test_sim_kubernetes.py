"""The simulated node's Kubernetes GPU stack: scenario keys and the `device_plugin_down`
and `cdi_stale` faults, as the agent's kubernetes watch reads them."""

from __future__ import annotations

from gpuagent.sim import SimulatedNode, parse_scenario

H100 = '[node]\ngpus = 4\nmodel = "NVIDIA H100 80GB HBM3"\n'


def _node(extra: str = "") -> SimulatedNode:
    return SimulatedNode(parse_scenario(H100 + extra))


def test_by_default_the_stack_is_installed_and_names_every_gpu() -> None:
    node = _node()
    plugin, toolkit = node.kubernetes_host()
    assert plugin.socket == "nvidia-gpu.sock"
    assert plugin.registered is not None
    assert len(plugin.registered) == 4
    assert all(uuid.startswith("GPU-") for uuid in plugin.registered)
    (spec,) = toolkit.specs
    assert spec.kind == "nvidia.com/gpu"
    assert {"0", "1", "2", "3", "all", *plugin.registered} == set(spec.devices)
    assert toolkit.runtime == "/usr/bin/nvidia-container-runtime"


def test_scenario_keys_leave_parts_out() -> None:
    node = _node("k8s_device_plugin = false\nk8s_cdi_spec = false\nk8s_runtime = false\n")
    plugin, toolkit = node.kubernetes_host()
    assert plugin.socket is None
    assert plugin.registered is None
    assert toolkit.specs == ()
    assert toolkit.runtime is None


def test_device_plugin_down_is_node_wide_until_cleared() -> None:
    node = _node()
    node.inject("device_plugin_down", 2, {})
    plugin, _ = node.kubernetes_host()
    assert plugin.socket is None
    assert plugin.registered is not None  # kubelet's checkpoint keeps what it had
    assert len(plugin.registered) == 4
    node.inject("clear", 1, {})  # another GPU's clear does not bring it back
    assert node.kubernetes_host()[0].socket is None
    node.inject("clear", 2, {})
    assert node.kubernetes_host()[0].socket == "nvidia-gpu.sock"


def test_cdi_stale_drops_the_gpu_from_the_spec_until_cleared() -> None:
    node = _node()
    uuid = node.kubernetes_host()[0].registered[1]  # type: ignore[index]
    node.inject("cdi_stale", 1, {})
    (spec,) = node.kubernetes_host()[1].specs
    assert "1" not in spec.devices
    assert uuid not in spec.devices
    assert "0" in spec.devices
    node.inject("clear", 1, {})
    (spec,) = node.kubernetes_host()[1].specs
    assert {"1", uuid} <= set(spec.devices)


def test_a_gpu_off_the_bus_is_not_registered() -> None:
    node = _node()
    node.inject("pci_remove", 3, {})
    plugin, _ = node.kubernetes_host()
    assert plugin.registered is not None
    assert len(plugin.registered) == 3
