"""The DCGM source the daemon runs: load the bindings, connect, watch health, reconnect.

States: "absent" (no bindings or no libdcgm: said once in the log, nothing else changes),
"down" (the host engine is unreachable or stopped answering: reconnect after 1 s, then
twice as long each time up to ``reconnect_max_seconds``) and "up". Everything that lives
on a connection (the health group and its watches) is set up again after each reconnect.
Every DCGM call runs on the one DCGM thread (session.DcgmWorker) under
``call_timeout_seconds``; the event loop only awaits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from gpuagent.config import DcgmSourceSection
from gpuagent.dcgm import diag, health
from gpuagent.dcgm.bindings import DcgmAbsentError, DcgmBindings, load_from, require
from gpuagent.dcgm.control import DiagUnavailableError
from gpuagent.dcgm.fields import ProfilingWatch
from gpuagent.dcgm.policy import PolicyWatch
from gpuagent.dcgm.session import (
    DcgmCallTimeoutError,
    DcgmWorker,
    DcgmWorkerClosedError,
    HostEngine,
    connect,
    disconnect,
    parse_hostengine,
)
from gpuagent.model import (
    DcgmIncident,
    DcgmState,
    DcgmStatus,
    DiagResult,
    GpuEvent,
    GpuProfiling,
    SourceStatus,
)

log = logging.getLogger(__name__)

_FIRST_BACKOFF_SECONDS = 1.0
# On the way out, a host engine that does not answer must not eat the daemon's stop budget.
_STOP_DISCONNECT_SECONDS = 1.0


class DcgmSource:
    """Implements gpuagent.dcgm.control.DcgmControl over the bindings."""

    def __init__(
        self,
        config: DcgmSourceSection,
        *,
        changed: Callable[[], None] = lambda: None,
        on_event: Callable[[GpuEvent], None] | None = None,
        profiling_wanted: Callable[[], frozenset[str]] | None = None,
    ) -> None:
        self._config = config
        self._changed = changed
        self._on_event = on_event
        self.policy: PolicyWatch | None = None  # once loaded, with on_event
        # Bus ids of the GPUs GPM does not cover (the latest NVML poll has no profiling).
        self._profiling_wanted = profiling_wanted
        self._profiling_watch: ProfilingWatch | None = None
        self._profiling: tuple[tuple[str, GpuProfiling], ...] = ()
        self._engine: HostEngine = parse_hostengine(config.hostengine)
        # Started with the first DCGM call: a node without the bindings never starts it.
        self._worker: DcgmWorker | None = None
        self._bindings: DcgmBindings | None = None
        self._handle: Any = None
        self._health: health.HealthWatch | None = None
        self._state: DcgmState = "down"
        self._detail = "starting"
        self._incidents: tuple[DcgmIncident, ...] = ()
        self._loaded = asyncio.Event()
        self._last_success: float | None = None
        self._failures = 0
        self.connects = 0  # successful connections so far (reconnects included)

    # --- what the snapshot shows -----------------------------------------------------

    @property
    def present(self) -> bool:
        """False once the bindings turned out to be absent: no source row, no change."""
        return self._state != "absent"

    def snapshot_status(self) -> DcgmStatus | None:
        """What the snapshot shows: None until `load` has run (`gpuagent check` never
        loads DCGM, so its one-shot snapshot is the same as without it)."""
        return self.status() if self._loaded.is_set() else None

    def status(self) -> DcgmStatus:
        return DcgmStatus(
            state=self._state,
            detail=self._detail,
            version=self._bindings.version if self._bindings else None,
            hostengine=self._engine.shown,
            incidents=self._incidents if self._state == "up" else (),
            profiling=self._profiling if self._state == "up" else (),
        )

    def source_status(self) -> SourceStatus | None:
        """The "dcgm" source row; None while DCGM is absent (or not loaded yet)."""
        if self._state == "absent" or self._bindings is None:
            return None
        return SourceStatus(
            name="dcgm",
            up=self._state == "up",
            last_success=self._last_success,
            last_error=None if self._state == "up" else self._detail,
            consecutive_failures=self._failures,
        )

    # --- running ---------------------------------------------------------------------

    async def _call(self, job: Callable[[], Any], seconds: float | None = None) -> Any:
        if self._worker is None or not self._worker.usable:
            self._worker = DcgmWorker()
        return await self._worker.run(job, seconds or self._config.call_timeout_seconds)

    async def load(self) -> bool:
        """Import the bindings and load libdcgm (on the DCGM thread). False: absent."""
        try:
            # Looked for here (two stat calls, once): no DCGM thread where there is no DCGM.
            path = require(self._config.bindings_path)
            self._bindings = await self._call(lambda: load_from(path))
        except DcgmAbsentError as exc:
            self._set("absent", str(exc))
            log.info("DCGM not used: %s", exc)
            return False
        except Exception as exc:  # noqa: BLE001 - broken bindings: the node runs without
            self._set("absent", f"{type(exc).__name__}: {exc}")
            log.warning("DCGM not used: the bindings failed to load: %s", exc)
            return False
        finally:
            self._loaded.set()
        if self._on_event is not None:
            self.policy = PolicyWatch(self._bindings, asyncio.get_running_loop(), self._on_event)
        log.info(
            "DCGM %s bindings from %s",
            self._bindings.version or "(version unknown)",
            self._bindings.path,
        )
        return True

    async def run(self) -> None:
        """Until cancelled: connect, watch health, reconnect with backoff."""
        if self._bindings is None and not await self.load():
            return
        backoff = _FIRST_BACKOFF_SECONDS
        try:
            while True:
                try:
                    await self._connect()
                except Exception as exc:  # noqa: BLE001 - any failure: down, try again
                    self._down(exc)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, self._config.reconnect_max_seconds)
                    continue
                backoff = _FIRST_BACKOFF_SECONDS
                try:
                    await self._watch_loop()
                except Exception as exc:  # noqa: BLE001 - the host engine went away
                    self._down(exc)
                    await self._drop_connection()
                    await asyncio.sleep(backoff)
        finally:
            await self._drop_connection(_STOP_DISCONNECT_SECONDS)

    async def _connect(self) -> None:
        dcgm = self._bindings
        assert dcgm is not None
        timeout = self._config.call_timeout_seconds
        policy = self.policy

        def establish() -> tuple[Any, health.HealthWatch]:
            handle = connect(dcgm, self._engine, timeout)
            try:
                watch = health.watch(dcgm, handle)
                if policy is not None:
                    policy.bus_ids = watch.bus_ids
                    policy.register(handle, watch.group)
            except BaseException:
                with contextlib.suppress(Exception):
                    disconnect(dcgm, self._engine, handle)
                raise
            return handle, watch

        self._handle, self._health = await self._call(establish)
        self._profiling_watch = ProfilingWatch(dcgm, self._config.profiling_interval_seconds)
        self.connects += 1
        log.info("DCGM host engine %s connected", self._engine.shown)

    async def _watch_loop(self) -> None:
        dcgm, watch = self._bindings, self._health
        assert dcgm is not None
        assert watch is not None
        handle = self._handle
        health_every = self._config.health_interval_seconds
        profiling_every = self._config.profiling_interval_seconds
        next_health = next_profiling = time.monotonic()
        while True:
            now = time.monotonic()
            if now >= next_health:
                incidents = await self._call(lambda: health.check(dcgm, handle, watch))
                self._up(incidents)
                next_health = now + health_every
            if now >= next_profiling and self._profiling_wanted is not None:
                await self._read_profiling(handle, watch)
                next_profiling = now + profiling_every
            await asyncio.sleep(max(min(next_health, next_profiling) - time.monotonic(), 0.0))

    async def _read_profiling(self, handle: Any, watch: health.HealthWatch) -> None:
        assert self._profiling_wanted is not None
        profiling = self._profiling_watch
        assert profiling is not None
        wanted = self._profiling_wanted()
        gpus = [gpu for gpu, bus_id in watch.bus_ids.items() if bus_id in wanted]

        def read() -> dict[int, GpuProfiling]:
            profiling.watch(handle, gpus)
            return profiling.read(handle, gpus)

        values = await self._call(read)
        found = tuple(sorted((watch.bus_ids[gpu], p) for gpu, p in values.items()))
        if found != self._profiling:
            self._profiling = found
            self._changed()

    async def _drop_connection(self, seconds: float | None = None) -> None:
        dcgm, handle = self._bindings, self._handle
        self._handle, self._health = None, None
        if dcgm is None or handle is None or self._worker is None or not self._worker.usable:
            return
        with contextlib.suppress(Exception):
            await self._call(lambda: disconnect(dcgm, self._engine, handle), seconds)

    def _up(self, incidents: tuple[DcgmIncident, ...]) -> None:
        changed = self._state != "up" or incidents != self._incidents
        if self._state != "up":
            log.info("DCGM up (host engine %s)", self._engine.shown)
        self._state, self._detail, self._incidents = "up", "", incidents
        self._last_success = time.time()
        self._failures = 0
        if changed:
            self._changed()

    def _down(self, exc: BaseException) -> None:
        detail = str(exc) or type(exc).__name__
        if isinstance(exc, DcgmCallTimeoutError | DcgmWorkerClosedError):
            detail = f"host engine not answering: {detail}"
        if self._state != "down" or self._failures == 0:
            log.warning("DCGM down (host engine %s): %s", self._engine.shown, detail)
        self._failures += 1
        self._set("down", detail)

    def _set(self, state: DcgmState, detail: str) -> None:
        changed = (state, detail) != (self._state, self._detail)
        self._state, self._detail = state, detail
        if state != "up":
            self._incidents, self._profiling = (), ()
        if changed:
            self._changed()

    def close(self) -> None:
        """Stop the DCGM thread (after the task running `run` was cancelled)."""
        if self._worker is not None:
            self._worker.close()

    # --- DcgmControl -------------------------------------------------------------------

    def _connected(self) -> tuple[DcgmBindings, Any]:
        if self._bindings is None or self._handle is None or self._state != "up":
            raise DiagUnavailableError(f"DCGM is {self._state}: {self._detail}".rstrip(": "))
        return self._bindings, self._handle

    async def run_diag(
        self, level: int, gpu_ids: tuple[int, ...], limit_seconds: float
    ) -> DiagResult:
        dcgm, handle = self._connected()
        try:
            result: DiagResult = await self._call(
                lambda: diag.validate(dcgm.agent, dcgm.structs, handle, level, gpu_ids),
                limit_seconds,
            )
        except DcgmCallTimeoutError as exc:
            # It ran and hung: a failure of the diagnostic, not a reason to try dcgmi.
            raise TimeoutError(f"the diagnostic did not finish: {exc}") from exc
        return result

    async def _driver(self, function: str) -> bool:
        dcgm, handle = self._connected()
        if not dcgm.has(function):
            return False
        await self._call(lambda: getattr(dcgm.agent, function)(handle))
        return True

    async def detach_driver(self) -> bool:
        return await self._driver("dcgmDetachDriver")

    async def attach_driver(self) -> bool:
        return await self._driver("dcgmAttachDriver")
