"""What the node knows about its Kubernetes GPU stack: immutable facts for the check."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class DevicePlugin:
    """kubelet's device plugin directory."""

    # The plugin's socket (its file name); None: no such socket.
    socket: str | None
    # The device ids kubelet's checkpoint lists as registered for the resource; None: no
    # checkpoint (older kubelets write it at the first allocation only) or unreadable.
    registered: tuple[str, ...] | None = None
    # Why the directory or the checkpoint could not be read; None: it could.
    error: str | None = None


@dataclass(frozen=True, slots=True)
class CdiSpec:
    path: str
    kind: str
    devices: tuple[str, ...]  # device names: "0", "all", "GPU-<uuid>", "0:1" (MIG), ...


@dataclass(frozen=True, slots=True)
class Toolkit:
    """The NVIDIA container toolkit: its CDI specs and its runtime."""

    specs: tuple[CdiSpec, ...] = ()  # every spec found, of any kind
    unreadable: tuple[tuple[str, str], ...] = ()  # (path, why) for specs that did not parse
    # Where the NVIDIA runtime was found (a file, or a containerd config naming it); None:
    # nowhere; "" when the runtime is not checked (no places configured).
    runtime: str | None = ""


@dataclass(frozen=True, slots=True)
class NodeResources:
    """The last read of the Node's GPU resource, and how it went."""

    allocatable: int | None = None  # None: never read
    capacity: int | None = None
    read_at: float | None = None  # monotonic seconds of the last good read
    # Monotonic seconds since which the allocatable count has had its current value.
    allocatable_since: float | None = None
    error: str | None = None  # the last read's failure; None when it succeeded


@dataclass(frozen=True, slots=True)
class KubernetesFacts:
    device_plugin: DevicePlugin
    toolkit: Toolkit
    node: NodeResources
    # Monotonic seconds when the agent began watching: the device plugin's grace runs
    # from here too (it starts with the node, as the agent does).
    watching_since: float
    # Monotonic seconds since which the plugin's socket has been missing (or nothing has
    # been registered); None while it is there. A plugin pod restarting is a short gap.
    plugin_missing_since: float | None = None
