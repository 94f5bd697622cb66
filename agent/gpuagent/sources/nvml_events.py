"""NVML XID events: the driver's own report of critical XIDs, beside the kernel log.

`nvmlEventSetWait` blocks, so it runs on a dedicated daemon thread that waits in short
slices (so it can stop) and hands each event to the event loop. The kernel log usually
carries the same XID; the event log keeps whichever arrives first.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import pynvml

from gpuagent.model import GpuEvent

log = logging.getLogger(__name__)

_WAIT_MS = 500
# After an error (a lost GPU makes every wait fail at once), wait before trying again.
_ERROR_BACKOFF_SECONDS = 1.0


class NvmlEventWatcher:
    """Registers XID events for ``devices`` ((handle, canonical bus id) pairs) and calls
    ``on_event`` on the event loop for each one."""

    def __init__(
        self,
        devices: Sequence[tuple[Any, str]],
        on_event: Callable[[GpuEvent], None],
        loop: asyncio.AbstractEventLoop,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._devices = list(devices)
        self._on_event = on_event
        self._loop = loop
        self._clock = clock
        self._wall = wall_clock
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nvml-events", daemon=True)
        self.registered = 0
        self.error: str | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        try:
            event_set = pynvml.nvmlEventSetCreate()
        except pynvml.NVMLError as exc:
            self.error = f"nvmlEventSetCreate: {exc}"
            log.warning("NVML XID events unavailable: %s", self.error)
            return
        by_address: dict[int, str] = {}
        for handle, bus_id in self._devices:
            try:
                pynvml.nvmlDeviceRegisterEvents(
                    handle, pynvml.nvmlEventTypeXidCriticalError, event_set
                )
            except pynvml.NVMLError as exc:
                log.info("no XID events from %s: %s", bus_id, exc)
                continue
            by_address[_address(handle)] = bus_id
            self.registered += 1
        try:
            while not self._stop.is_set():
                self._wait_once(event_set, by_address)
        finally:
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlEventSetFree(event_set)

    def _wait_once(self, event_set: Any, by_address: dict[int, str]) -> None:
        try:
            data = pynvml.nvmlEventSetWait_v2(event_set, _WAIT_MS)
        except pynvml.NVMLError_Timeout:
            return
        except pynvml.NVMLError as exc:
            self.error = str(exc)
            self._stop.wait(_ERROR_BACKOFF_SECONDS)
            return
        self.error = None
        bus_id = by_address.get(_address(data.device))
        xid = int(data.eventData)
        now, wall = self._clock(), self._wall()
        event = GpuEvent(
            event_id=f"nvml:{bus_id}:{xid}:{int(wall * 1000)}",
            source="nvml",
            kind="xid",
            gpu=bus_id,
            time=wall,
            monotonic=now,
            pci=bus_id,
            code=xid,
            line=f"NVML XID event {xid} on {bus_id}",
        )
        self._loop.call_soon_threadsafe(self._on_event, event)


def _address(handle: Any) -> int:
    """A device handle's identity: the address it points at (handles are pointers)."""
    return ctypes.addressof(handle.contents)
