"""An NVML session: initialise the library, enumerate GPUs, read identities, shut down.

Blocking, except `shutdown`; the NVML source runs `open_session` on its session worker
under the per-call timeout, and every call here goes through that worker's `call`.
Initialisation failures are classified (driver not loaded, library not found, version
mismatch, no permission) so the node-level finding can say what to do.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pynvml

from gpuagent.model import NvmlStatus
from gpuagent.nvml.device import Device
from gpuagent.nvml.errors import (
    GpuLostError,
    NvmlCallError,
    NvmlUnavailableError,
    classify_init_error,
    optional,
    text,
)
from gpuagent.nvml.worker import CallTimeoutError, CallWorker, drained

log = logging.getLogger(__name__)


@dataclass
class Session:
    status: NvmlStatus
    devices: list[Device] = field(default_factory=list)
    # GPUs whose handle could not be had (index → reason), e.g. lost before we started.
    unreachable: dict[int, str] = field(default_factory=dict)
    # nvmlInit succeeded: the session needs an nvmlShutdown, even if it is not usable.
    initialised: bool = False


def open_session(
    worker: CallWorker,
    make_worker: Callable[[int], CallWorker],
    process_name: Callable[[int], str | None],
    clock: Callable[[], float],
) -> Session:
    """Initialise NVML and get a handle per GPU (identities are read per GPU later, on
    each GPU's own worker, so one wedged GPU cannot stall the others' start)."""
    try:
        worker.call("nvmlInit", pynvml.nvmlInit)
    except pynvml.NVMLError as exc:
        return Session(NvmlStatus(ok=False, problem=classify_init_error(exc), message=str(exc)))

    def system(call: str, what: str) -> Any:
        return worker.call(call, optional, what, getattr(pynvml, call))

    try:
        count = int(worker.call("nvmlDeviceGetCount", pynvml.nvmlDeviceGetCount))
        status = NvmlStatus(
            ok=True,
            driver_version=text(system("nvmlSystemGetDriverVersion", "driver")),
            nvml_version=text(system("nvmlSystemGetNVMLVersion", "nvml")),
            cuda_driver_version=_cuda_version(system("nvmlSystemGetCudaDriverVersion", "cuda")),
        )
    except (pynvml.NVMLError, NvmlCallError, GpuLostError) as exc:
        # Initialised but unusable: the caller shuts NVML down again (see `shutdown`).
        return Session(NvmlStatus(ok=False, problem="other", message=str(exc)), initialised=True)
    session = Session(status, initialised=True)
    for index in range(count):
        try:
            handle = worker.call(
                "nvmlDeviceGetHandleByIndex", pynvml.nvmlDeviceGetHandleByIndex, index
            )
        except pynvml.NVMLError as exc:
            session.unreachable[index] = str(exc)
            continue
        session.devices.append(Device(index, handle, make_worker(index), process_name, clock))
    return session


async def shutdown(worker: CallWorker, call_timeout: float) -> bool:
    """nvmlShutdown on ``worker``, never while another NVML call is in flight: new calls
    are held back, the ones in flight are waited for, and if one of them is wedged (past
    ``call_timeout``) the shutdown is skipped and logged. Whether NVML was shut down."""
    async with drained(call_timeout) as in_flight:
        wedged = list(in_flight)
        if worker.busy:
            name, seconds = worker.blocked_call() or ("nvml", 0.0)
            wedged.append((worker.name, name, seconds))
        if wedged:
            log.warning(
                "not calling nvmlShutdown: %s",
                "; ".join(f"{call} on {name} blocked for {s:.1f} s" for name, call, s in wedged),
            )
            return False
        try:
            await worker.run(
                lambda: worker.call("nvmlShutdown", _shutdown_call, during_drain=True),
                call_timeout,
            )
        except (CallTimeoutError, NvmlUnavailableError) as exc:
            log.warning("nvmlShutdown did not complete: %s", exc)
            return False
    return True


def _shutdown_call() -> None:
    try:
        pynvml.nvmlShutdown()
    except pynvml.NVMLError as exc:
        log.info("nvmlShutdown: %s", exc)


def _cuda_version(raw: int | None) -> str | None:
    """12040 → "12.4", as nvidia-smi prints it."""
    if not raw:
        return None
    return f"{raw // 1000}.{raw % 1000 // 10}"
