"""The NVML source: one poll per interval per GPU, off the event loop, every call timed.

A GPU whose call blocks longer than `call_timeout_seconds` is reported as "timeout"
(UNKNOWN) while the other GPUs, the scrape, the CLI and the watchdog carry on; its worker
stays busy with the blocked call, and the GPU is skipped until that call returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psutil

from gpuagent.config import NvmlSourceSection
from gpuagent.model import GpuIdentity, GpuState, NvmlStatus
from gpuagent.nvml.device import Device
from gpuagent.nvml.errors import GpuLostError, NvmlCallError
from gpuagent.nvml.session import Session, close_session, open_session
from gpuagent.nvml.worker import CallTimeoutError, CallWorker


@dataclass(frozen=True, slots=True)
class NvmlObservation:
    status: NvmlStatus
    gpus: tuple[GpuState, ...]


def host_process_name(pid: int) -> str | None:
    try:
        return psutil.Process(pid).name()
    except (psutil.Error, OSError):
        return None


class NvmlSource:
    name = "nvml"

    def __init__(
        self,
        config: NvmlSourceSection,
        *,
        process_name: Callable[[int], str | None] = host_process_name,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._config = config
        self._process_name = process_name
        self._clock = clock
        self._wall = wall_clock
        self._session_worker = CallWorker("nvml-session")
        self._session: Session | None = None
        self._next_open = 0.0
        self._last_slow: float | None = None
        self._identities: dict[int, GpuIdentity] = {}
        self._generation = 0
        self._force_reopen = False

    @property
    def status(self) -> NvmlStatus | None:
        return None if self._session is None else self._session.status

    @property
    def generation(self) -> int:
        """Increases whenever a new NVML session (and so new device handles) opens."""
        return self._generation

    def devices(self) -> list[tuple[Any, str]]:
        """(handle, canonical bus id) of every identified GPU in the current session."""
        if self._session is None or not self._session.status.ok:
            return []
        return [
            (device.handle, self._identities[device.index].pci_bus_id)
            for device in self._session.devices
            if device.index in self._identities
        ]

    def reopen(self) -> None:
        """Start a fresh session at the next poll (a GPU appeared or came back on the bus)."""
        self._next_open = 0.0
        self._force_reopen = True

    async def poll(self) -> NvmlObservation:
        session = await self._ensure_session()
        if not session.status.ok:
            return NvmlObservation(session.status, ())
        now = self._clock()
        include_slow = (
            self._last_slow is None or now - self._last_slow >= self._config.slow_interval_seconds
        )
        if include_slow:
            self._last_slow = now
        states = await asyncio.gather(
            *(self._poll_gpu(device, include_slow) for device in session.devices)
        )
        lost = tuple(
            GpuState(_placeholder(index), "lost", error=reason)
            for index, reason in session.unreachable.items()
        )
        gpus = tuple(sorted((*states, *lost), key=lambda g: g.identity.index))
        return NvmlObservation(session.status, gpus)

    async def _ensure_session(self) -> Session:
        session = self._session
        if self._force_reopen and session is not None:
            await self._close_session(session)
            session = self._session = None
        self._force_reopen = False
        if session is not None and (session.status.ok or self._clock() < self._next_open):
            return session
        try:
            session = await self._session_worker.run(
                lambda: open_session(self._session_worker, self._make_worker, self._process_name),
                self._config.call_timeout_seconds,
            )
        except CallTimeoutError as exc:
            session = Session(NvmlStatus(ok=False, problem="timeout", message=str(exc)))
            # The blocked init still owns the session worker: use a fresh one next time.
            self._session_worker = CallWorker("nvml-session")
        if not session.status.ok:
            self._next_open = self._clock() + self._config.init_retry_seconds
        else:
            self._generation += 1
        self._session = session
        self._identities.clear()
        self._last_slow = None
        return session

    def _make_worker(self, index: int) -> CallWorker:
        return CallWorker(f"nvml-gpu{index}")

    async def _poll_gpu(self, device: Device, include_slow: bool) -> GpuState:
        identity = self._identities.get(device.index)
        shown = identity or _placeholder(device.index)
        blocked = device.worker.blocked_call()
        if device.worker.busy:
            call, seconds = blocked or ("nvml", 0.0)
            return GpuState(
                shown, "timeout", error=f"nvml_timeout: {call} still blocked after {seconds:.1f} s"
            )
        timeout = self._config.call_timeout_seconds
        try:
            if identity is None:
                identity = await device.worker.run(device.read_identity, timeout)
                self._identities[device.index] = shown = identity
            readings = await device.worker.run(lambda: device.read(include_slow), timeout)
        except CallTimeoutError as exc:
            return GpuState(shown, "timeout", error=f"nvml_timeout: {exc}")
        except GpuLostError as exc:
            return GpuState(shown, "lost", error=f"GPU is lost ({exc})")
        except NvmlCallError as exc:
            return GpuState(shown, "error", error=str(exc))
        return GpuState(
            identity,
            "ok",
            readings,
            sampled_at=self._wall(),
            sampled_monotonic=self._clock(),
        )

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await self._close_session(session)
        self._session_worker.close()

    async def _close_session(self, session: Session) -> None:
        for device in session.devices:
            device.worker.close()
        if session.status.ok and not self._session_worker.busy:
            # A wedged driver must not hold up shutdown: give up on a clean nvmlShutdown.
            with contextlib.suppress(CallTimeoutError):
                await self._session_worker.run(close_session, self._config.call_timeout_seconds)


def _placeholder(index: int) -> GpuIdentity:
    """A GPU we have a slot for but could not identify (lost or wedged before we could)."""
    return GpuIdentity(index=index, pci_bus_id=f"unknown-{index}", uuid="", name="")
