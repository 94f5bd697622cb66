"""NVML XID events: the driver's own report of critical XIDs, beside the kernel log.

`nvmlEventSetWait` blocks, so the watcher has its own NVML worker (`CallWorker`): one job
that waits in short slices (so it can stop) and hands each event to the event loop. Each
call in it is timed like any other NVML call: a wait that runs past its slice plus the call
timeout is reported (logged, and `error` says so) while the daemon carries on. `stop` ends
the job and joins the thread with a bound. The kernel log usually carries the same XID; the
event log keeps one event, with the kernel line's content.

With ``operational`` on, the GPUs are also registered for NVIDIA's GPU operational events
(drivers R615 and later) and the set is waited on with nvmlEventSetWait_v3, which returns
both kinds. Each operational event becomes an XID event with its legacy Xid (so the same
fault from the kernel line and the classic event is still one event); one without a
legacy Xid is logged once per module and code. A driver without them is told once, and
the classic events go on as before.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

from gpuagent.config import NvmlSourceSection
from gpuagent.model import EventSource, GpuEvent
from gpuagent.nvml.errors import GpuLostError, NvmlCallError, NvmlUnavailableError
from gpuagent.nvml.events import (
    EventKind,
    OperationalEvent,
    create_event_set,
    describe_operational,
    device_uuid,
    free_event_set,
    register_events,
    register_operational_events,
    wait_event,
    wait_event_v3,
)
from gpuagent.nvml.worker import CallWorker

log = logging.getLogger(__name__)

_WAIT_MS = 500
# After an error (a lost GPU makes every wait fail at once), wait before trying again.
_ERROR_BACKOFF_SECONDS = 1.0
_DEFAULT_CALL_TIMEOUT = NvmlSourceSection().call_timeout_seconds


class NvmlEventWatcher:
    """Registers XID events for ``devices`` ((handle, canonical bus id) pairs) and calls
    ``on_event`` on the event loop for each one; where the driver offers recovery-action
    events, ``on_recovery_action`` (with the GPU's bus id) when a GPU's action changes, so
    the new action is read at once rather than at the next slow poll."""

    def __init__(
        self,
        devices: Sequence[tuple[Any, str]],
        on_event: Callable[[GpuEvent], None],
        loop: asyncio.AbstractEventLoop,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        call_timeout: float = _DEFAULT_CALL_TIMEOUT,
        on_recovery_action: Callable[[str], None] = lambda _bus_id: None,
        operational: bool = False,
    ) -> None:
        self._devices = list(devices)
        self._operational = operational
        self._unexplained: set[tuple[str, int]] = set()  # operational events without an Xid
        self._on_event = on_event
        self._on_recovery_action = on_recovery_action
        self._loop = loop
        self._clock = clock
        self._wall = wall_clock
        self._call_timeout = call_timeout
        self._stop = threading.Event()
        self._worker: CallWorker | None = None
        self._watch: asyncio.Task[None] | None = None
        self._stopping: asyncio.Future[bool] | None = None
        self._error: str | None = None
        self.registered = 0
        self.operational_registered = 0  # GPUs registered for operational events

    @property
    def error(self) -> str | None:
        """Why no events arrive: a wedged wait, else the last NVML error (None once an
        event arrives again)."""
        worker = self._worker
        wedged = None if worker is None else worker.wedged(self._call_timeout)
        if wedged is not None:
            return f"nvml_timeout: {wedged[0]} blocked for {wedged[1]:.1f} s"
        return self._error

    def start(self) -> None:
        """Start the event worker; on the event loop's thread."""
        self._worker = CallWorker("nvml-events")
        job = self._worker.submit(self._serve)
        self._watch = self._loop.create_task(self._watch_job(self._worker, job))

    def stop(self) -> None:
        """Stop waiting for events and join the event thread, with a bound, without
        blocking the caller: `stopped` is awaited for the outcome."""
        self._stop.set()
        worker = self._worker
        if worker is None or self._stopping is not None:
            return
        worker.close()
        try:
            on_loop = asyncio.get_running_loop() is self._loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            self._stopping = self._loop.create_task(self._join(worker))
        elif not self._loop.is_closed():
            self._stopping = asyncio.wrap_future(
                asyncio.run_coroutine_threadsafe(self._join(worker), self._loop),
                loop=self._loop,
            )

    async def stopped(self) -> bool:
        """Stop (if not yet) and wait, up to `stop_timeout`, for the event thread to end:
        whether it has."""
        worker = self._worker
        if worker is None:
            return True
        if self._stopping is None:
            self.stop()
        if self._stopping is not None and await self._stopping:
            return True
        return await worker.join(self.stop_timeout)  # again, for a thread left behind

    @property
    def stop_timeout(self) -> float:
        """How long a stop waits for the thread: the wait slice, then the call timeout."""
        return _WAIT_MS / 1000 + self._call_timeout

    async def _join(self, worker: CallWorker) -> bool:
        ended = await worker.join(self.stop_timeout)
        if not ended:
            log.warning(
                "NVML event thread did not stop within %.1f s (%s); left behind",
                self.stop_timeout,
                self.error or "busy",
            )
        if self._watch is not None:
            self._watch.cancel()
        return ended

    async def _watch_job(self, worker: CallWorker, job: Future[None]) -> None:
        """Time every call the event job makes; wedged ones are logged and shown in
        `error` until they return."""
        try:
            await worker.wait(job, self._call_timeout, on_wedged=lambda _: None)
        except Exception as exc:  # the job's bug must not go unseen
            self._error = f"{type(exc).__name__}: {exc}"
            log.exception("NVML XID event watcher failed")

    # --- on the event worker's thread ----------------------------------------------------

    def _serve(self) -> None:
        worker = self._worker
        assert worker is not None
        try:
            event_set = create_event_set(worker)
        except (NvmlCallError, GpuLostError, NvmlUnavailableError) as exc:
            self._error = str(exc)
            log.warning("NVML XID events unavailable: %s", self._error)
            return
        by_address: dict[int, str] = {}
        for handle, bus_id in self._devices:
            try:
                by_address[register_events(worker, event_set, handle)] = bus_id
            except (NvmlCallError, GpuLostError) as exc:
                log.info("no XID events from %s: %s", bus_id, exc)
                continue
            except NvmlUnavailableError:
                break
            self.registered += 1
        by_uuid = self._register_operational(worker, event_set) if self._operational else {}
        try:
            while not self._stop.is_set():
                self._wait_once(worker, event_set, by_address, by_uuid)
        except NvmlUnavailableError as exc:
            log.info("NVML XID events stop: %s", exc)
        finally:
            free_event_set(worker, event_set)

    def _register_operational(self, worker: CallWorker, event_set: Any) -> dict[str, str]:
        """Every GPU's UUID → bus id once one GPU's operational events are registered (the
        v3 wait names GPUs by UUID); {} where the driver lacks them."""
        by_uuid: dict[str, str] = {}
        registered = 0
        for handle, bus_id in self._devices:
            try:
                uuid = device_uuid(worker, handle)
                registered += register_operational_events(worker, event_set, uuid)
            except (NvmlCallError, GpuLostError) as exc:
                log.info("no GPU operational events from %s: %s", bus_id, exc)
                continue
            by_uuid[uuid] = bus_id
        if not registered:
            log.info(
                "GPU operational events are not offered by this driver: XID events and the "
                "kernel log stand"
            )
            return {}
        self.operational_registered = registered
        log.info("GPU operational events registered on %d GPUs", registered)
        return by_uuid

    def _operational_event(self, event: OperationalEvent, bus_id: str | None) -> None:
        if event.xid is None:
            key = (event.module, event.code)
            if key not in self._unexplained:
                self._unexplained.add(key)
                log.info(
                    "GPU operational event without a legacy Xid on %s: module %s code %d "
                    "(further ones of this code are not logged)",
                    bus_id,
                    event.module,
                    event.code,
                )
            return
        self._hand_over_xid(
            "nvml_operational",
            f"nvml-op:{bus_id}:{event.instance}:{event.timestamp_usec}",
            bus_id,
            event.xid,
            describe_operational(event, bus_id),
        )

    def _wait_once(
        self,
        worker: CallWorker,
        event_set: Any,
        by_address: dict[int, str],
        by_uuid: dict[str, str],
    ) -> None:
        """One wait: v3 (naming GPUs by UUID) once operational events are registered."""
        got: tuple[int | str, EventKind, int] | OperationalEvent | None
        try:
            if by_uuid:
                got = wait_event_v3(worker, event_set, _WAIT_MS)
            else:
                got = wait_event(worker, event_set, _WAIT_MS)
        except NvmlCallError as exc:
            self._error = str(exc)
            self._stop.wait(_ERROR_BACKOFF_SECONDS)
            return
        if got is None:
            return
        self._error = None
        if isinstance(got, OperationalEvent):
            self._operational_event(got, by_uuid.get(got.uuid))
            return
        gpu, kind, data = got
        self._deliver(by_uuid.get(gpu) if isinstance(gpu, str) else by_address.get(gpu), kind, data)

    def _deliver(self, bus_id: str | None, kind: str, xid: int) -> None:
        """A classic event: an XID, or a recovery action that changed."""
        if kind == "recovery_action":
            if bus_id is not None:
                self._loop.call_soon_threadsafe(self._on_recovery_action, bus_id)
            return
        self._hand_over_xid("nvml", None, bus_id, xid, f"NVML XID event {xid} on {bus_id}")

    def _hand_over_xid(
        self, source: EventSource, event_id: str | None, bus_id: str | None, xid: int, line: str
    ) -> None:
        """An XID from NVML, to the event loop; ``event_id`` None: one from the time."""
        now, wall = self._clock(), self._wall()
        event = GpuEvent(
            event_id=event_id or f"nvml:{bus_id}:{xid}:{int(wall * 1000)}",
            source=source,
            kind="xid",
            gpu=bus_id,
            time=wall,
            monotonic=now,
            pci=bus_id,
            code=xid,
            line=line,
        )
        self._loop.call_soon_threadsafe(self._on_event, event)
