"""The one path every NVML call takes: a worker thread, a recorded call, a timeout.

NVML can block for tens of seconds on a wedged GPU. Each GPU gets its own worker so a hang
on one never delays the others, and the threads are daemons so a call that never returns
cannot hold up the agent's exit. The session (init, enumeration, shutdown) and the XID
event wait have workers of their own.

Every NVML call is made with `CallWorker.call`, on its worker's thread (a call from any
other thread is refused), inside a job the event loop submitted with `CallWorker.run` (or
`submit` and `wait`). `call` records the call's name, start and expected duration as one
tuple, so the watcher on the event loop never sees a new name with an old start; the
watcher times out the *call* (not the whole job) and reports the wedged call. The workers
are registered here, so `drained` can hold new calls back and wait for the ones in flight
before `nvmlShutdown`, or tell which call is wedged so the shutdown is skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from typing import TypeVar

from gpuagent.jobthread import Job, serve_jobs
from gpuagent.nvml.errors import NvmlUnavailableError

T = TypeVar("T")
log = logging.getLogger(__name__)

# How often `drained` looks at the calls in flight while it waits for them to return.
_QUIET_POLL_SECONDS = 0.01

# A call in flight: (name, monotonic start, seconds it may take by design). One tuple,
# written and read whole, so a reader never pairs one call's name with another's start.
_Call = tuple[str, float, float]


class CallTimeoutError(Exception):
    def __init__(self, call: str, seconds: float, worker: str = "") -> None:
        self.call = call
        self.seconds = seconds
        self.worker = worker
        super().__init__(f"{call} blocked for {seconds:.1f} s")


class WorkerClosedError(NvmlUnavailableError):
    """A job submitted to a worker that has been closed (its NVML session is over)."""


class NvmlDrainingError(NvmlUnavailableError):
    """An NVML call refused because NVML is being shut down."""


_registry_lock = threading.Lock()
_workers: weakref.WeakSet[CallWorker] = weakref.WeakSet()
# Guards `_draining` and every worker's recorded call, so that a drain and a new call's
# start are ordered: after `drained` has raised the count, no new call starts.
_gate = threading.Lock()
_draining = 0


class CallWorker:
    def __init__(self, name: str) -> None:
        self.name = name
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._call: _Call | None = None  # written by the worker thread only, under `_gate`
        self._abandoned: Future[object] | None = None  # a job whose waiter timed out
        self._lock = threading.Lock()
        self._closed = False
        self._exited: Future[None] = Future()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        with _registry_lock:
            _workers.add(self)
        self._thread.start()

    # --- on the worker thread -----------------------------------------------------------

    def call(
        self,
        name: str,
        fn: Callable[..., T],
        *args: object,
        expected: float = 0.0,
        during_drain: bool = False,
    ) -> T:
        """Make one NVML call, recorded for the timeout watcher. Only on this worker's
        thread, in a job given to `run` or `submit`. ``expected``: seconds the call takes
        by design (a blocking event wait), added to the timeout."""
        if threading.get_ident() != self._thread.ident:
            raise RuntimeError(f"{name}: NVML calls are made on their worker ({self.name})")
        with _gate:
            if _draining and not during_drain:
                raise NvmlDrainingError(f"{name}: NVML is shutting down")
            self._call = (name, time.monotonic(), expected)
        try:
            return fn(*args)
        finally:
            self._call = None

    # --- on the event loop ----------------------------------------------------------------

    @property
    def busy(self) -> bool:
        """True while a job whose waiter timed out (a wedged call) is still running."""
        return self._abandoned is not None and not self._abandoned.done()

    def in_flight(self) -> tuple[str, float] | None:
        """The call in flight now and how long it has run, if any."""
        current = self._call
        if current is None:
            return None
        name, started, _ = current
        return name, time.monotonic() - started

    def blocked_call(self) -> tuple[str, float] | None:
        """The call a timed-out job is still blocked in."""
        return self.in_flight() if self.busy else None

    def wedged(self, call_timeout: float) -> tuple[str, float] | None:
        """The call in flight if it has run past its time plus ``call_timeout``."""
        current = self._call
        if current is None:
            return None
        name, started, expected = current
        seconds = time.monotonic() - started
        return (name, seconds) if seconds > expected + call_timeout else None

    def submit(self, job: Callable[[], T]) -> Future[T]:
        """Queue ``job`` for the worker thread; see `wait`."""
        future: Future[object] = Future()
        future.add_done_callback(_consume_exception)
        with self._lock:
            if self._closed:
                raise WorkerClosedError(f"NVML worker {self.name} is closed")
            self._jobs.put((job, future))
        return future  # type: ignore[return-value]

    async def wait(
        self,
        future: Future[T],
        call_timeout: float,
        *,
        on_wedged: Callable[[CallTimeoutError], None] | None = None,
    ) -> T:
        """Await a submitted job; raise CallTimeoutError (the worker stays busy until the
        job ends) as soon as any one call it makes runs longer than its expected time plus
        ``call_timeout``. With ``on_wedged``, report each wedged call to it instead and
        keep waiting."""
        waiter = asyncio.wrap_future(future)
        reported: _Call | None = None
        while True:
            current = self._call
            now = time.monotonic()
            remaining = call_timeout
            if current is not None:
                name, started, expected = current
                remaining = started + expected + call_timeout - now
                if remaining <= 0:
                    error = CallTimeoutError(name, now - started, self.name)
                    if current is not reported:
                        reported = current
                        log.warning("NVML call on %s wedged: %s", self.name, error)
                        if on_wedged is not None:
                            on_wedged(error)
                    if on_wedged is None:
                        self._abandoned = future  # type: ignore[assignment]
                        raise error
                    remaining = call_timeout  # look again later; the call may return
            done, _ = await asyncio.wait({waiter}, timeout=max(remaining, 0.001))
            if done:
                return waiter.result()

    async def run(self, job: Callable[[], T], call_timeout: float) -> T:
        """Run ``job`` on the worker; raise CallTimeoutError if any one call it makes
        takes longer than ``call_timeout`` seconds, or at once while an earlier job is
        still blocked (nothing queues behind a wedged call). The job keeps running in its
        thread after a timeout; until it finishes the worker reports itself busy."""
        if self.busy:
            name, seconds = self.blocked_call() or ("nvml", 0.0)
            raise CallTimeoutError(name, seconds, self.name)
        return await self.wait(self.submit(job), call_timeout)

    def close(self) -> None:
        """Refuse new jobs; the thread ends after the ones queued."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._jobs.put(None)

    async def join(self, bound: float) -> bool:
        """After `close`: wait up to ``bound`` s for the thread to end; whether it has."""
        if self._exited.done():
            return True
        done, _ = await asyncio.wait({asyncio.wrap_future(self._exited)}, timeout=bound)
        return bool(done)

    def _serve(self) -> None:
        try:
            serve_jobs(self._jobs)
        finally:
            self._exited.set_result(None)


def calls_in_flight() -> list[tuple[str, str, float]]:
    """(worker, call, seconds so far) of every NVML call in flight in this process."""
    with _registry_lock:
        workers = list(_workers)
    return [(w.name, *call) for w in workers if (call := w.in_flight()) is not None]


def draining() -> bool:
    """Whether new NVML calls are held back (an nvmlShutdown is waiting to run)."""
    return _draining > 0


@contextlib.asynccontextmanager
async def drained(call_timeout: float) -> AsyncIterator[list[tuple[str, str, float]]]:
    """Hold back new NVML calls (they fail with NvmlDrainingError) and wait for the ones
    in flight to return. Yields the wedged calls, (worker, call, seconds): empty once
    nothing is in flight, else those that ran past their time plus ``call_timeout``.
    Inside, only a call made with ``during_drain=True`` (nvmlShutdown) goes through."""
    global _draining  # noqa: PLW0603 - one NVML library per process, one gate
    with _gate:
        _draining += 1
    try:
        yield await _wait_quiet(call_timeout)
    finally:
        with _gate:
            _draining -= 1


async def _wait_quiet(call_timeout: float) -> list[tuple[str, str, float]]:
    while True:
        with _registry_lock:
            workers = list(_workers)
        if all(w.in_flight() is None for w in workers):
            return []
        wedged = [(w.name, *call) for w in workers if (call := w.wedged(call_timeout))]
        if wedged:
            return wedged
        await asyncio.sleep(_QUIET_POLL_SECONDS)


def _consume_exception(future: Future[object]) -> None:
    # A job abandoned after a timeout may fail later; nobody awaits it any more.
    if not future.cancelled():
        future.exception()
