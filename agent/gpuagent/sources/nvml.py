"""The NVML source: one poll per interval per GPU, off the event loop, every call timed.

A GPU whose call blocks longer than `call_timeout_seconds` is reported as "timeout"
(UNKNOWN) while the other GPUs, the scrape, the CLI and the watchdog carry on; its worker
stays busy with the blocked call, and the GPU is skipped until that call returns.

The source owns the NVML session and the per-GPU workers, so every NVML call the agent
makes goes through it: the session's open and shutdown on the session worker, the reads
and remediation's setters (`set_persistence_mode`, `set_power_limit`) on the GPU's own
worker, all under the same per-call timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from gpuagent.config import NvmlSourceSection
from gpuagent.model import GpuIdentity, GpuReadings, GpuState, NvmlStatus
from gpuagent.nvml.device import Device
from gpuagent.nvml.errors import GpuLostError, NvmlCallError, NvmlUnavailableError
from gpuagent.nvml.session import Session, open_session, shutdown
from gpuagent.nvml.worker import CallTimeoutError, CallWorker
from gpuagent.sources.procfs import ProcessTable

# The source opened last in this process (NVML is one library per process): where the
# remediation setters find the GPUs' workers unless they are handed a source.
_active: NvmlSource | None = None


def active_source() -> NvmlSource | None:
    return _active


@dataclass(frozen=True, slots=True)
class NvmlObservation:
    status: NvmlStatus
    gpus: tuple[GpuState, ...]


def host_process_name(pid: int) -> str | None:
    # Imported at a GPU's first process: an idle node (and the simulator, which names its
    # own processes) never loads it.
    import psutil  # noqa: PLC0415

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
        process_table: ProcessTable | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._config = config
        self._process_name = process_name
        # None: processes are not looked up in procfs (their alive and user stay None).
        self._process_table = process_table
        self._clock = clock
        self._wall = wall_clock
        self._session_worker = CallWorker("nvml-session")
        self._session: Session | None = None
        self._next_open = 0.0
        self._last_slow: float | None = None
        self._identities: dict[int, GpuIdentity] = {}
        self._generation = 0
        self._force_reopen = False
        global _active  # noqa: PLW0603 - see active_source
        _active = self

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

    def read_slow_next(self) -> None:
        """Include the slow-cadence readings in the next poll (something they hold changed)."""
        self._last_slow = None

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
        worker = self._session_worker
        opening = worker.submit(
            lambda: open_session(worker, self._make_worker, self._process_name, self._clock)
        )
        try:
            session = await worker.wait(opening, self._config.call_timeout_seconds)
        except CallTimeoutError as exc:
            session = Session(NvmlStatus(ok=False, problem="timeout", message=str(exc)))
            opening.add_done_callback(_discard_late_session)
            # The blocked init still owns the session worker: use a fresh one next time
            # (the old one ends when the call returns; until then no nvmlShutdown runs).
            self._session_worker.close()
            self._session_worker = CallWorker("nvml-session")
        except NvmlUnavailableError as exc:  # NVML shutting down meanwhile: try later
            session = Session(NvmlStatus(ok=False, problem="other", message=str(exc)))
        if (
            session.initialised
            and not session.status.ok
            and await shutdown(self._session_worker, self._config.call_timeout_seconds)
        ):
            session.initialised = False
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
            readings = await device.worker.run(lambda: self._read(device, include_slow), timeout)
        except CallTimeoutError as exc:
            return GpuState(shown, "timeout", error=f"nvml_timeout: {exc}")
        except GpuLostError as exc:
            return GpuState(shown, "lost", error=f"GPU is lost ({exc})")
        except (NvmlCallError, NvmlUnavailableError) as exc:
            return GpuState(shown, "error", error=str(exc))
        return GpuState(identity, "ok", readings, sampled_at=self._wall())

    def _read(self, device: Device, include_slow: bool) -> GpuReadings:
        """One poll of ``device``, on its worker: NVML, then procfs for its processes."""
        config = self._config
        readings = device.read(include_slow, config.profiling, config.profiling_interval_seconds)
        table = self._process_table
        return readings if table is None else table.describe_all(readings)

    # --- remediation's setters, on the GPU's worker ---------------------------------------

    async def set_persistence_mode(self, bus_id: str, enabled: bool = True) -> None:
        """Raises CallTimeoutError (a wedged call, or the GPU's worker still blocked),
        GpuLostError, NvmlCallError, or NvmlUnavailableError (GPU not in the session)."""
        device = self._device(bus_id)
        await self._run_setter(device, lambda: device.set_persistence_mode(enabled))

    async def set_power_limit(self, bus_id: str, watts: float) -> None:
        device = self._device(bus_id)
        await self._run_setter(device, lambda: device.set_power_limit(round(watts * 1000)))

    def _device(self, bus_id: str) -> Device:
        session = self._session
        if session is None or not session.status.ok:
            raise NvmlUnavailableError("NVML is not available")
        for device in session.devices:
            identity = self._identities.get(device.index)
            if identity is not None and identity.pci_bus_id == bus_id:
                return device
        raise NvmlUnavailableError(f"{bus_id} is not an identified GPU in the NVML session")

    async def _run_setter(self, device: Device, job: Callable[[], None]) -> None:
        await device.worker.run(job, self._config.call_timeout_seconds)

    async def close(self) -> None:
        global _active  # noqa: PLW0603 - see active_source
        if _active is self:
            _active = None
        session, self._session = self._session, None
        if session is not None:
            await self._close_session(session)
        self._session_worker.close()

    async def _close_session(self, session: Session) -> None:
        for device in session.devices:
            # GPM samples live in the driver: free them, unless a call is in flight on the
            # GPU (nothing waits behind it; nvmlShutdown frees what is left anyway).
            if session.initialised and device.worker.in_flight() is None:
                with contextlib.suppress(CallTimeoutError, NvmlUnavailableError):
                    await device.worker.run(device.release, self._config.call_timeout_seconds)
            device.worker.close()
        if session.initialised:
            # Never while a call is in flight; skipped (logged) if one is wedged.
            await shutdown(self._session_worker, self._config.call_timeout_seconds)


def _discard_late_session(opening: Future[Session]) -> None:
    """An open that timed out and finished later: nobody uses its GPU workers."""
    if not opening.cancelled() and opening.exception() is None:
        for device in opening.result().devices:
            device.worker.close()


def _placeholder(index: int) -> GpuIdentity:
    """A GPU we have a slot for but could not identify (lost or wedged before we could)."""
    return GpuIdentity(index=index, pci_bus_id=f"unknown-{index}", uuid="", name="")
