"""The Kubernetes GPU stack watch: kubelet's device plugin directory, the CDI specs and
the container runtime (host files, or the simulated node's), and the Node's advertised
GPUs from the API server, read every `checks.kubernetes.interval_seconds` off the event
loop. A failed read makes that part unknown (and the `kubernetes` source says why); it
never stops the daemon."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from gpuagent.config import Config
from gpuagent.k8s.client import kubernetes_node_name
from gpuagent.k8s.host import read_device_plugin, read_toolkit
from gpuagent.k8s.model import DevicePlugin, KubernetesFacts, NodeResources, Toolkit
from gpuagent.k8s.node import NodeReader, NodeReadError
from gpuagent.supervisor import SourceTracker

log = logging.getLogger("gpuagent.daemon")

# The host side is a directory listing and a few small files; this bounds a hung mount.
_HOST_TIMEOUT_SECONDS = 10.0


class SimulatedStack(Protocol):
    """A simulated node's device plugin directory and container toolkit."""

    def kubernetes_host(self) -> tuple[DevicePlugin, Toolkit]: ...


class KubernetesWatch:
    def __init__(
        self,
        config: Config,
        trackers: dict[str, SourceTracker],
        simulator: SimulatedStack | None,
        *,
        schedule_publish: Callable[[], None],
    ) -> None:
        self._config = config.checks.kubernetes
        self._tracker = trackers.setdefault("kubernetes", SourceTracker("kubernetes"))
        self._simulator = simulator
        self._schedule_publish = schedule_publish
        self._reader = NodeReader(
            kubernetes_node_name(config),
            kubeconfig=config.remediation.cordon.kubernetes.kubeconfig,
            resource=self._config.resource,
            timeout=self._config.node_read_timeout_seconds,
        )
        self._started = time.monotonic()
        self._device_plugin = DevicePlugin(None, None, "not read yet")
        self._toolkit = Toolkit()
        self._node = NodeResources()
        self._plugin_missing_since: float | None = None

    @property
    def facts(self) -> KubernetesFacts:
        return KubernetesFacts(
            self._device_plugin,
            self._toolkit,
            self._node,
            self._started,
            self._plugin_missing_since,
        )

    async def refresh(self) -> None:
        """Read the host side and the Node once."""
        started = time.monotonic()
        await self.read_host()
        error = await self._read_node()
        duration = time.monotonic() - started
        if error is None:
            self._tracker.success(duration)
        else:
            self._tracker.failure(duration, error)

    async def loop(self) -> None:
        try:
            while True:
                await self.refresh()
                self._schedule_publish()
                await asyncio.sleep(self._config.interval_seconds)
        finally:
            self._reader.close()

    async def read_host(self) -> None:
        """Read the host side only (at startup: no wait on the API server)."""
        await self._read_host_files()
        plugin = self._device_plugin
        if plugin.error is not None:
            return  # unknown: neither missing nor back
        if plugin.socket is not None and plugin.registered != ():
            self._plugin_missing_since = None
        elif self._plugin_missing_since is None:
            self._plugin_missing_since = time.monotonic()

    async def _read_host_files(self) -> None:
        config = self._config
        if self._simulator is not None:
            self._device_plugin, self._toolkit = self._simulator.kubernetes_host()
            return
        try:
            async with asyncio.timeout(_HOST_TIMEOUT_SECONDS):
                self._device_plugin = await asyncio.to_thread(
                    read_device_plugin,
                    config.device_plugin_dir,
                    tuple(config.device_plugin_sockets),
                    config.resource,
                )
                self._toolkit = await asyncio.to_thread(
                    read_toolkit,
                    tuple(Path(p) for p in config.cdi_dirs),
                    tuple(Path(p) for p in config.runtime_paths),
                    tuple(Path(p) for p in config.containerd_configs),
                )
        except TimeoutError:
            why = f"host files not read within {_HOST_TIMEOUT_SECONDS:g} s"
            self._device_plugin = DevicePlugin(None, None, why)

    async def _read_node(self) -> str | None:
        """Read the Node; the error (also kept for the finding), or None."""
        timeout = self._config.node_read_timeout_seconds
        try:
            # The client's own timeout covers the request; this one covers the thread too.
            async with asyncio.timeout(timeout + 1.0):
                allocatable, capacity = await asyncio.to_thread(self._reader.read)
        except TimeoutError:
            error = f"no answer from the Kubernetes API within {timeout:g} s"
        except NodeReadError as exc:
            error = str(exc)
        else:
            now = time.monotonic()
            previous = self._node
            since = previous.allocatable_since
            if since is None or previous.allocatable != allocatable:
                since = now
            self._node = NodeResources(allocatable, capacity, now, since)
            return None
        if self._node.error != error:
            log.warning("cannot read node %s from the Kubernetes API: %s", self._reader.node, error)
        self._node = NodeResources(
            self._node.allocatable,
            self._node.capacity,
            self._node.read_at,
            self._node.allocatable_since,
            error,
        )
        return error
