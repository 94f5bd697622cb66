"""One thread for every DCGM call, each under a timeout, and the host-engine connection.

DCGM calls block (a host engine that went away answers only when the client library
times out), so none runs on the event loop. They all run on one daemon thread, in order;
a call that outlives its timeout leaves its thread behind (a daemon: it never holds up
the exit) and the worker refuses further jobs, so the source drops it and starts a fresh
one for the next connection. NVML's CallWorker is not reused: its calls take part in
NVML's shutdown drain, which DCGM calls must neither wait for nor be refused by.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

from gpuagent.dcgm.bindings import DcgmBindings
from gpuagent.jobthread import Job, serve_jobs

T = TypeVar("T")

DEFAULT_PORT = 5555
EMBEDDED = "embedded"


class DcgmCallTimeoutError(Exception):
    """A DCGM call ran past its timeout; its thread is abandoned."""


class DcgmWorkerClosedError(Exception):
    """A job for a worker that was closed or is stuck in an earlier call."""


class DcgmWorker:
    def __init__(self, name: str = "dcgm") -> None:
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._closed = False
        self._stuck = False
        self._thread = threading.Thread(
            target=serve_jobs, args=(self._jobs,), name=name, daemon=True
        )
        self._thread.start()

    @property
    def usable(self) -> bool:
        return not (self._closed or self._stuck)

    def submit(self, job: Callable[[], T]) -> Future[T]:
        if not self.usable:
            raise DcgmWorkerClosedError("DCGM worker closed")
        future: Future[object] = Future()
        self._jobs.put((job, future))
        return future  # type: ignore[return-value]

    async def run(self, job: Callable[[], T], seconds: float) -> T:
        """Run ``job`` on the DCGM thread; DcgmCallTimeoutError after ``seconds``."""
        future = self.submit(job)
        try:
            # Not asyncio.wait_for: on Python 3.11 it can swallow a cancellation that comes
            # as the call returns, and the source's loop would then never stop.
            async with asyncio.timeout(seconds):
                return await asyncio.wrap_future(future)
        except TimeoutError:
            self._stuck = True
            self.close()
            raise DcgmCallTimeoutError(f"DCGM call blocked for {seconds:.1f} s") from None

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._jobs.put(None)


@dataclass(frozen=True, slots=True)
class HostEngine:
    """Where the host engine is: ``address`` as DCGM takes it, ``shown`` as status says."""

    address: str  # "" for embedded
    unix_socket: bool = False
    embedded: bool = False

    @property
    def shown(self) -> str:
        if self.embedded:
            return EMBEDDED
        return f"unix:{self.address}" if self.unix_socket else self.address


def parse_hostengine(spec: str) -> HostEngine:
    """``sources.dcgm.hostengine`` → where to connect (see config.example.toml)."""
    spec = spec.strip()
    if spec in ("", "localhost"):
        return HostEngine(f"127.0.0.1:{DEFAULT_PORT}")
    if spec == EMBEDDED:
        return HostEngine("", embedded=True)
    if spec.startswith("unix:"):
        return HostEngine(spec.removeprefix("unix:"), unix_socket=True)
    host, sep, port = spec.rpartition(":")
    if not sep or not port.isdigit() or host.endswith(":"):  # no port, or bare IPv6
        return HostEngine(f"{spec}:{DEFAULT_PORT}")
    return HostEngine(spec)


def connect(dcgm: DcgmBindings, engine: HostEngine, timeout: float) -> Any:
    """A handle to the host engine (blocking; on the DCGM thread)."""
    structs, agent = dcgm.structs, dcgm.agent
    if engine.embedded:
        return agent.dcgmStartEmbedded(structs.DCGM_OPERATION_MODE_AUTO)
    params = structs.c_dcgmConnectV2Params_v2()
    params.persistAfterDisconnect = 0
    params.timeoutMs = int(timeout * 1000)
    params.addressIsUnixSocket = 1 if engine.unix_socket else 0
    return agent.dcgmConnect_v2(
        engine.address, params, version=structs.c_dcgmConnectV2Params_version2
    )


def disconnect(dcgm: DcgmBindings, engine: HostEngine, handle: Any) -> None:
    if engine.embedded:
        dcgm.agent.dcgmStopEmbedded(handle)
    else:
        dcgm.agent.dcgmDisconnect(handle)
