"""The simulated node's Kubernetes GPU stack, as the host would show it: kubelet's device
plugin directory and the NVIDIA container toolkit's CDI spec and runtime.

The `[node]` keys `k8s_device_plugin`, `k8s_cdi_spec` and `k8s_runtime` say whether each is
installed; the faults `device_plugin_down` (the plugin's socket gone: node-wide, kept on
the GPU the fault names until `clear` there) and `cdi_stale` (the GPU missing from the
spec) change it. The Node object's counts come from the API server the agent talks to.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuagent.k8s.model import CdiSpec, DevicePlugin, Toolkit
from gpuagent.sim.gpu import SimGpu
from gpuagent.sim.scenario import NodeSpec

SOCKET = "nvidia-gpu.sock"
CDI_PATH = "/var/run/cdi/nvidia.yaml"
CDI_KIND = "nvidia.com/gpu"
RUNTIME = "/usr/bin/nvidia-container-runtime"


def kubernetes_host(spec: NodeSpec, gpus: Sequence[SimGpu]) -> tuple[DevicePlugin, Toolkit]:
    listed = [g for g in gpus if g.on_pci_bus]
    up = spec.k8s_device_plugin and not any(g.device_plugin_down for g in gpus)
    # kubelet's checkpoint keeps the devices it last had registered, socket or not; the
    # plugin registers GPUs by UUID (its default device id strategy).
    registered = tuple(g.uuid.decode() for g in listed) if spec.k8s_device_plugin else None
    plugin = DevicePlugin(SOCKET if up else None, registered)
    specs: tuple[CdiSpec, ...] = ()
    if spec.k8s_cdi_spec:
        named = [g for g in gpus if g.in_cdi_spec]
        # What `nvidia-ctk cdi generate` names: each GPU by index and by UUID, and "all".
        names = (*(str(g.index) for g in named), *(g.uuid.decode() for g in named), "all")
        specs = (CdiSpec(CDI_PATH, CDI_KIND, names),)
    return plugin, Toolkit(specs, (), RUNTIME if spec.k8s_runtime else None)
