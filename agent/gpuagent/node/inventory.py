"""The node inventory: the host side read off the loop (sysfs, procfs, systemd), merged with
each NVML observation, and the baseline learn mode keeps from the first healthy one."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from gpuagent import __version__
from gpuagent.checks import InventoryView
from gpuagent.config import Config
from gpuagent.inventory import HostFacts, NodeInventory
from gpuagent.inventory.baseline import (
    BASELINE_FILE,
    Baseline,
    learn,
    load_baseline,
    save_baseline,
)
from gpuagent.inventory.build import build_inventory
from gpuagent.inventory.collect import collect_host
from gpuagent.inventory.liveness import ServiceLiveness
from gpuagent.inventory.model import Service
from gpuagent.inventory.services import ImexReadiness, read_services
from gpuagent.model import Severity
from gpuagent.sources.nvml import NvmlObservation
from gpuagent.supervisor import SourceTracker

if TYPE_CHECKING:  # the simulator is imported only under --simulate
    from gpuagent.sim import SimulatedNode

# The daemon's log lines keep the logger name they always had.
log = logging.getLogger("gpuagent.daemon")

_INVENTORY_TIMEOUT_SECONDS = 10.0


class InventoryKeeper:
    def __init__(
        self,
        config: Config,
        trackers: dict[str, SourceTracker],
        simulator: SimulatedNode | None,
        *,
        schedule_publish: Callable[[], None],
    ) -> None:
        self._config = config
        self._trackers = trackers
        self._simulator = simulator
        self._schedule_publish = schedule_publish
        self._host: HostFacts | None = None
        inventory = config.inventory
        self._liveness = ServiceLiveness(
            down_probes=inventory.service_down_probes,
            restart_limit=inventory.service_restart_limit,
            restart_window_seconds=inventory.service_restart_window_seconds,
        )
        self._imex = ImexReadiness(inventory.imex_ctl)
        self.refresh_requested = asyncio.Event()
        self._baseline_path = config.agent.state_dir / BASELINE_FILE
        self._baseline: Baseline | None = None
        # Only the daemon learns a baseline; a one-shot `gpuagent check` just compares.
        self.may_learn = False
        # Only the daemon probes services often enough to tell down from restarting.
        self.track_liveness = False

    def request_refresh(self) -> None:
        self.refresh_requested.set()

    def load_baseline(self) -> None:
        if self._config.inventory.learn:
            self._baseline = load_baseline(self._baseline_path)

    async def refresh(self) -> None:
        """Read the host side of the inventory (sysfs, procfs, systemd) off the loop."""
        tracker = self._trackers.setdefault("inventory", SourceTracker("inventory"))
        config = self._config.inventory
        started = time.monotonic()
        if self._simulator is not None:
            # A simulated node's PCI functions, modules and services are the scenario's.
            host = self._simulator.host_facts()
            self._host = replace(host, services=self._observe(host.services))
            tracker.success(time.monotonic() - started)
            return
        try:
            async with asyncio.timeout(_INVENTORY_TIMEOUT_SECONDS):
                services = self._observe(await self._read_services())
                self._host = await asyncio.to_thread(
                    collect_host,
                    self._config.sources.sysfs.root,
                    config.proc_root,
                    config.os_release,
                    tuple(config.expected.modules),
                    services=services,
                    library_dirs=tuple(config.library_dirs),
                    modules_root=config.modules_root,
                    dkms_root=config.dkms_root,
                )
        except (OSError, TimeoutError) as exc:
            tracker.failure(time.monotonic() - started, str(exc) or type(exc).__name__)
        else:
            tracker.success(time.monotonic() - started)

    def _observe(self, services: tuple[Service, ...]) -> tuple[Service, ...]:
        # A one-shot `gpuagent check` probes once: its services' states are judged as read.
        if not self.track_liveness:
            return services
        return self._liveness.observe(services, time.monotonic())

    async def _read_services(self) -> tuple[Service, ...]:
        services = await read_services(self._config.inventory.systemctl)
        return await self._imex.add_to(services)

    async def probe_services(self) -> None:
        """Probe the NVIDIA services between inventory reads (their liveness needs probes
        closer together than the rest of the inventory does)."""
        if self._simulator is not None:
            probed = self._simulator.services()
        else:
            probed = await self._read_services()
        services = self._observe(probed)
        if self._host is not None and services != self._host.services:
            self._host = replace(self._host, services=services)
            self._schedule_publish()

    async def services_loop(self) -> None:
        while True:
            await asyncio.sleep(self._config.inventory.services_probe_seconds)
            await self.probe_services()

    async def loop(self) -> None:
        interval = self._config.inventory.refresh_seconds
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await self.refresh_requested.wait()
            self.refresh_requested.clear()
            await self.refresh()
            self._schedule_publish()

    def inventory(self, observation: NvmlObservation) -> NodeInventory | None:
        if self._host is None:
            return None
        return build_inventory(
            self._host,
            observation.status,
            observation.gpus,
            __version__,
            self._config.inventory.expected.gpus,
        )

    def view(
        self, inventory: NodeInventory | None, power_capped: tuple[tuple[str, float], ...] = ()
    ) -> InventoryView | None:
        """What the inventory checks judge: the inventory, what is expected, the baseline,
        and the power caps our remediation holds."""
        if inventory is None:
            return None
        expected = self._config.inventory.expected
        return InventoryView(inventory, expected, self._baseline, power_capped)

    def learn(self, inventory: NodeInventory | None, severity: Severity) -> None:
        """Learn mode: the first healthy inventory becomes the baseline drift is judged by."""
        if not self.may_learn or self._baseline is not None or inventory is None:
            return
        if severity is not Severity.OK or not inventory.nvml_ok:
            return
        learned = learn(inventory)
        try:
            save_baseline(self._baseline_path, learned, time.time())
        except OSError as exc:
            log.warning("cannot write inventory baseline %s: %s", self._baseline_path, exc)
            return
        self._baseline = learned
        log.info("learned inventory baseline: %s", learned)
