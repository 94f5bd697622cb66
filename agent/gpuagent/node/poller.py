"""The NVML poll: one observation per interval (or on request), and the NVML XID events
registered for each NVML session the poll opens."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from gpuagent.config import Config
from gpuagent.events import reset_event
from gpuagent.model import RECOVERY_ACTIONS, GpuEvent, GpuState
from gpuagent.sources.nvml import NvmlObservation, NvmlSource, host_process_name
from gpuagent.sources.nvml_events import NvmlEventWatcher
from gpuagent.sources.procfs import ProcessTable
from gpuagent.supervisor import SourceTracker

if TYPE_CHECKING:  # the simulator is imported only under --simulate
    from gpuagent.sim import SimulatedNode

# The daemon's log lines keep the logger name they always had.
log = logging.getLogger("gpuagent.daemon")

_MAX_BACKOFF_SECONDS = 60.0
_RUN_CHECKS_TIMEOUT_SECONDS = 30.0


class NvmlPoller:
    """Owns the NVML source (and the simulator beneath it) and the latest observation."""

    def __init__(
        self,
        config: Config,
        trackers: dict[str, SourceTracker],
        simulator: SimulatedNode | None,
        *,
        publish: Callable[[], None],
        on_event: Callable[[GpuEvent], None],
    ) -> None:
        self._config = config
        self._trackers = trackers
        self._simulator = simulator
        self._publish = publish
        self._on_event = on_event
        self.nvml: NvmlSource | None = None
        self.last_observation: NvmlObservation | None = None
        self.polls = 0
        self.refresh_requested = asyncio.Event()
        self._polled = asyncio.Event()  # set after every NVML poll's snapshot
        self._xid_watcher: NvmlEventWatcher | None = None
        self._xid_generation = 0
        # Each GPU's last recovery action NVML reported, to see one done (a reset).
        self._recovery_actions: dict[str, int] = {}
        # Under --simulate: where the simulator serves what procfs and sysfs would show.
        self.simulated_host: Path | None = None

    def open(self) -> None:
        if self._simulator is not None:
            self._simulator.install()
            log.info("simulating %d GPUs beneath NVML", self._simulator.gpu_count)
        process_name = self._simulator.process_name if self._simulator else host_process_name
        self.nvml = NvmlSource(
            self._config.sources.nvml,
            process_name=process_name,
            process_table=ProcessTable(self._proc_root(), slurm=self._config.attribution.slurm),
        )

    def _proc_root(self) -> Path:
        """procfs for the GPU processes: the host's, or under --simulate the simulator's own
        table (simulated PIDs do not exist on this machine)."""
        if self._simulator is None:
            return self._config.sources.nvml.proc_root
        self.simulated_host = Path(tempfile.mkdtemp(prefix="gpuagent-sim-host-"))
        self._simulator.serve_host_files(self.simulated_host)
        return self.simulated_host / "proc"

    async def close(self) -> None:
        if self._xid_watcher is not None:
            self._xid_watcher.stop()
        if self.nvml is not None:
            await self.nvml.close()
        if self._simulator is not None:
            self._simulator.uninstall()
        if self.simulated_host is not None:
            shutil.rmtree(self.simulated_host, ignore_errors=True)

    def gpu_appeared(self) -> None:
        """A GPU (re)appeared on the bus: enumerate again without restarting the daemon."""
        if self.nvml is not None:
            self.nvml.reopen()
            self.refresh_requested.set()

    async def loop(self) -> None:
        interval = self._config.sources.nvml.interval_seconds
        backoff = interval
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(backoff):
                    await self.refresh_requested.wait()
            self.refresh_requested.clear()
            ok = await self.poll_once()
            backoff = interval if ok else min(backoff * 2, max(_MAX_BACKOFF_SECONDS, interval))

    async def poll_once(self, *, watch_xid_events: bool = True) -> bool:
        """Poll NVML, evaluate checks, publish a snapshot. False when the source failed."""
        assert self.nvml is not None
        tracker = self._trackers["nvml"]
        started = time.monotonic()
        self.polls += 1
        try:
            observation = await self.nvml.poll()
        except Exception as exc:  # a source bug must not take the daemon down
            log.exception("NVML poll failed")
            tracker.failure(time.monotonic() - started, f"{type(exc).__name__}: {exc}")
            self.last_observation = self._without_values(tracker.status.last_error)
            self._publish()
            return False
        duration = time.monotonic() - started
        if observation.status.ok:
            tracker.success(duration)
        else:
            tracker.failure(duration, observation.status.message)
        self.last_observation = observation
        self._record_resets(observation)
        if watch_xid_events and self._config.sources.nvml_events.enabled:
            self._watch_xid_events()
            self._track_xid_watcher()
        self._publish()
        self._polled.set()
        return True

    async def poll_now(self) -> None:
        """Ask for a poll and wait until one has been published after this call."""
        before = self.polls
        self.refresh_requested.set()
        async with asyncio.timeout(_RUN_CHECKS_TIMEOUT_SECONDS):
            while self.polls <= before:
                self._polled.clear()
                await self._polled.wait()

    def _record_resets(self, observation: NvmlObservation) -> None:
        """A recovery action NVML reported back to none: the GPU was reset (an event)."""
        for gpu in observation.gpus:
            bus_id = gpu.identity.pci_bus_id
            action = gpu.readings.recovery_action if gpu.readings is not None else None
            if gpu.status != "ok" or action is None:
                continue  # not known now: what was pending stays remembered
            before = self._recovery_actions.get(bus_id)
            self._recovery_actions[bus_id] = action
            if before not in (None, 0) and action == 0:
                name = RECOVERY_ACTIONS.get(before, str(before))
                line = f"NVML recovery action back to none from {name}"
                self._on_event(reset_event(bus_id, "nvml", time.monotonic(), line))

    def _without_values(self, error: str | None) -> NvmlObservation | None:
        """After a failed poll: the GPUs we know, with no values (nothing stale)."""
        last = self.last_observation
        if last is None:
            return None
        gpus = tuple(GpuState(g.identity, "error", error=error) for g in last.gpus)
        return NvmlObservation(last.status, gpus)

    def _watch_xid_events(self) -> None:
        """(Re)register NVML XID events whenever a new NVML session brings new handles."""
        assert self.nvml is not None
        if self.nvml.generation == self._xid_generation:
            return
        if self._xid_watcher is not None:
            self._xid_watcher.stop()
        self._xid_generation = self.nvml.generation
        self._xid_watcher = NvmlEventWatcher(
            self.nvml.devices(),
            self._on_event,
            asyncio.get_running_loop(),
            call_timeout=self._config.sources.nvml.call_timeout_seconds,
            on_recovery_action=self._recovery_action_changed,
            operational=self._config.sources.nvml_events.operational,
        )
        self._xid_watcher.start()

    def _recovery_action_changed(self, bus_id: str) -> None:
        """The driver changed a GPU's recovery action: poll now, slow readings included."""
        log.info("NVML recovery action changed on %s: reading it now", bus_id)
        if self.nvml is not None:
            self.nvml.read_slow_next()
            self.refresh_requested.set()

    def _track_xid_watcher(self) -> None:
        watcher = self._xid_watcher
        if watcher is None:
            return
        tracker = self._trackers.setdefault("nvml_events", SourceTracker("nvml_events"))
        if watcher.error:
            tracker.failure(0.0, watcher.error)
        elif not tracker.status.up:
            tracker.success(0.0)
