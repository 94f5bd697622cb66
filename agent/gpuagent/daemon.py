"""The daemon: startup, main loop, shutdown.

sources ──► snapshot store ──► outputs. The poll loop is the only writer: it polls NVML
(off the event loop, every call timed), runs the pure checks, and publishes one complete
snapshot. The metrics endpoint and the local API only read the latest snapshot.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

from gpuagent import __version__
from gpuagent.api import ApiError, ApiServer
from gpuagent.checks import HealthMemory, evaluate
from gpuagent.config import Config
from gpuagent.metrics import MetricsServer, build_registry
from gpuagent.model import GpuState, NodeSnapshot, Severity, SourceStatus
from gpuagent.sdnotify import Notifier
from gpuagent.sim import SimulatedNode, load_scenario
from gpuagent.sources.nvml import NvmlObservation, NvmlSource, host_process_name
from gpuagent.statusview import status_document
from gpuagent.store import SnapshotStore

log = logging.getLogger(__name__)

SHUTDOWN_TIMEOUT_SECONDS = 4.0
_MAX_BACKOFF_SECONDS = 60.0
_GIL_SWITCH_SECONDS = 0.0005


class SourceTracker:
    """Per-source supervisor bookkeeping; logs only when the state changes."""

    def __init__(self, name: str) -> None:
        self.status = SourceStatus(name=name, up=False)

    def success(self, duration: float, *, up: bool = True, error: str | None = None) -> None:
        if up and not self.status.up and self.status.consecutive_failures:
            log.info("source %s recovered", self.status.name)
        if not up and self.status.up:
            log.warning("source %s is down: %s", self.status.name, error)
        self.status = SourceStatus(
            name=self.status.name,
            up=up,
            last_success=time.time() if up else self.status.last_success,
            last_error=error,
            last_duration_seconds=duration,
            consecutive_failures=0 if up else self.status.consecutive_failures + 1,
        )

    def failure(self, duration: float, error: str) -> None:
        self.success(duration, up=False, error=error)


class Agent:
    def __init__(self, config: Config, *, simulate: Path | None = None) -> None:
        self.config = config
        self.simulator: SimulatedNode | None = None
        if simulate is not None:
            self.simulator = SimulatedNode(load_scenario(simulate))
        self.store = SnapshotStore()
        self.notifier = Notifier()
        self._node_name = config.agent.resolved_node_name
        self._hostname = socket.gethostname()
        self._stop = asyncio.Event()
        self._refresh = asyncio.Event()
        self._memory = HealthMemory()
        self._sequence = 0
        self._polls = 0
        self._nvml_tracker = SourceTracker("nvml")
        self._nvml: NvmlSource | None = None
        self._metrics: MetricsServer | None = None
        self._api = ApiServer(config.api.socket, config.api.group)

    # --- phases -----------------------------------------------------------------------

    async def run(self) -> None:
        # The metrics thread must not queue behind a poll's burst of Python work for the
        # interpreter's default 5 ms switch interval: ask for the GIL to change hands sooner.
        sys.setswitchinterval(_GIL_SWITCH_SECONDS)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        started = time.monotonic()
        try:
            await self.startup()
            log.info("ready in %.2f s: %s", time.monotonic() - started, self._summary())
            await self.main_loop()
        finally:
            await self.shutdown()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)

    def stop(self) -> None:
        self._stop.set()

    def _open_sources(self) -> None:
        if self.simulator is not None:
            self.simulator.install()
            log.info("simulating %d GPUs beneath NVML", self.simulator.gpu_count)
        process_name = self.simulator.process_name if self.simulator else host_process_name
        self._nvml = NvmlSource(self.config.sources.nvml, process_name=process_name)

    async def _close_sources(self) -> None:
        if self._nvml is not None:
            await self._nvml.close()
        if self.simulator is not None:
            self.simulator.uninstall()

    async def collect_once(self) -> NodeSnapshot:
        """One poll and one evaluation without serving anything (`gpuagent check`)."""
        self._open_sources()
        try:
            await self.poll_once()
        finally:
            await self._close_sources()
        assert self.store.current is not None
        return self.store.current

    async def startup(self) -> None:
        self._open_sources()
        host, port = self.config.metrics.host_port
        self._metrics = MetricsServer(
            build_registry(lambda: self.store.current, __version__), host, port
        )
        self._metrics.start()
        self._api.route("ping", self._api_ping)
        self._api.route("status", self._api_status)
        self._api.route("refresh", self._api_refresh)
        self._api.route("inject", self._api_inject, changes_state=True)
        self._api.route("simulator", self._api_simulator)
        await self._api.start()
        await self.poll_once()
        self.notifier.ready(self._summary())

    async def main_loop(self) -> None:
        async with asyncio.TaskGroup() as tasks:
            poller = tasks.create_task(self._poll_loop(), name="poll-nvml")
            watchdog = tasks.create_task(self._watchdog_loop(), name="watchdog")
            await self._stop.wait()
            poller.cancel()
            watchdog.cancel()

    async def shutdown(self) -> None:
        self.notifier.stopping()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(SHUTDOWN_TIMEOUT_SECONDS):
                await self._api.stop()
                await self._close_sources()
        if self._metrics is not None:
            self._metrics.stop()
        log.info("stopped")

    # --- loops --------------------------------------------------------------------------

    async def _poll_loop(self) -> None:
        interval = self.config.sources.nvml.interval_seconds
        backoff = interval
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(backoff):
                    await self._refresh.wait()
            self._refresh.clear()
            ok = await self.poll_once()
            backoff = interval if ok else min(backoff * 2, max(_MAX_BACKOFF_SECONDS, interval))

    async def _watchdog_loop(self) -> None:
        # WATCHDOG=1 comes from the event loop itself, so a blocked loop stops the pings
        # and systemd restarts us; a wedged NVML call (on its own thread) does not.
        interval = self.notifier.watchdog_interval
        if interval is None:
            return
        while True:
            self.notifier.watchdog()
            await asyncio.sleep(interval)

    async def poll_once(self) -> bool:
        """Poll NVML, evaluate checks, publish a snapshot. False when the source failed."""
        assert self._nvml is not None
        started = time.monotonic()
        self._polls += 1
        try:
            observation = await self._nvml.poll()
        except Exception as exc:  # a source bug must not take the daemon down
            log.exception("NVML poll failed")
            self._nvml_tracker.failure(time.monotonic() - started, f"{type(exc).__name__}: {exc}")
            self._publish(None)
            return False
        duration = time.monotonic() - started
        if observation.status.ok:
            self._nvml_tracker.success(duration)
        else:
            self._nvml_tracker.failure(duration, observation.status.message)
        self._publish(observation)
        return True

    def _publish(self, observation: NvmlObservation | None) -> None:
        previous = self.store.current
        if observation is None:
            # The source itself failed: keep the GPUs we know, with no values (not stale).
            if previous is None:
                return
            error = self._nvml_tracker.status.last_error
            gpus = tuple(GpuState(g.identity, "error", error=error) for g in previous.gpus)
            nvml = previous.nvml
        else:
            gpus, nvml = observation.gpus, observation.status
        health, self._memory = evaluate(
            gpus, nvml, self.config.checks, self._memory, time.monotonic()
        )
        self._sequence += 1
        snapshot = NodeSnapshot(
            node_name=self._node_name,
            cluster=self.config.agent.cluster,
            hostname=self._hostname,
            sequence=self._sequence,
            taken_at=time.time(),
            nvml=nvml,
            gpus=gpus,
            health=health,
            sources=(self._nvml_tracker.status,),
            simulated=self.simulator is not None,
            rejected_api_requests=tuple(sorted(self._api.rejected.items())),
        )
        self._log_transitions(previous, snapshot)
        self.store.publish(snapshot)
        if self._metrics is not None:
            # Render /metrics now, once per snapshot, so no scrape waits for rendering.
            self._metrics.exposition.refresh()
        self.notifier.status(self._summary())

    def _log_transitions(self, previous: NodeSnapshot | None, current: NodeSnapshot) -> None:
        before = (
            {(f.gpu, f.check): f.severity for f in previous.health.findings} if previous else {}
        )
        for finding in current.health.findings:
            old = before.get((finding.gpu, finding.check), Severity.OK)
            if old is not finding.severity:
                log.warning(
                    "%s %s: %s -> %s: %s",
                    finding.gpu or "node",
                    finding.check,
                    old.name,
                    finding.severity.name,
                    finding.reason,
                )

    def _summary(self) -> str:
        snapshot = self.store.current
        if snapshot is None:
            return "starting"
        problems = len(snapshot.health.problems())
        return (
            f"{len(snapshot.gpus)} GPUs, health {snapshot.health.severity.name}, "
            f"{problems} problem{'s' if problems != 1 else ''}"
        )

    # --- API handlers -------------------------------------------------------------------

    async def _api_ping(self, _params: dict[str, Any]) -> dict[str, Any]:
        return {"version": __version__, "node": self._node_name}

    async def _api_status(self, _params: dict[str, Any]) -> dict[str, Any]:
        snapshot = self.store.current
        if snapshot is None:
            raise ApiError("no snapshot yet: the agent is starting")
        return status_document(snapshot)

    async def _api_refresh(self, _params: dict[str, Any]) -> dict[str, Any]:
        self._refresh.set()
        async with asyncio.timeout(30):
            snapshot = await self.store.next_update()
        return {"sequence": snapshot.sequence}

    async def _api_simulator(self, _params: dict[str, Any]) -> dict[str, Any]:
        """NVML call counts of a simulated daemon, for benchmarks."""
        if self.simulator is None:
            raise ApiError("not a simulated daemon")
        return {
            "polls": self._polls,
            "calls": self.simulator.call_counts(),
            "calls_per_device": {str(k): v for k, v in self.simulator.calls_per_device().items()},
        }

    async def _api_inject(self, params: dict[str, Any]) -> dict[str, Any]:
        if self.simulator is None:
            raise ApiError("inject into NVML needs a simulated daemon (gpuagent run --simulate)")
        kind, gpu, values = params.get("kind"), params.get("gpu"), params.get("values", {})
        if not isinstance(kind, str) or not isinstance(gpu, int) or not isinstance(values, dict):
            raise ApiError('inject needs "kind" (string), "gpu" (integer) and "values" (object)')
        try:
            self.simulator.inject(kind, gpu, values)
        except ValueError as exc:
            raise ApiError(str(exc)) from None
        log.info("injected %s into simulated GPU %d %s", kind, gpu, values)
        return await self._api_refresh({})
