"""An NVML session: initialise the library, enumerate GPUs, read identities.

Blocking; the NVML source runs it on a worker thread under a timeout. Initialisation
failures are classified (driver not loaded, library not found, version mismatch, no
permission) so the node-level finding can say what to do.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

import pynvml

from gpuagent.model import NvmlStatus
from gpuagent.nvml.device import Device
from gpuagent.nvml.errors import GpuLostError, NvmlCallError, classify_init_error, optional, text
from gpuagent.nvml.worker import CallWorker


@dataclass
class Session:
    status: NvmlStatus
    devices: list[Device] = field(default_factory=list)
    # GPUs whose handle could not be had (index → reason), e.g. lost before we started.
    unreachable: dict[int, str] = field(default_factory=dict)


def open_session(
    worker: CallWorker,
    make_worker: Callable[[int], CallWorker],
    process_name: Callable[[int], str | None],
) -> Session:
    """Initialise NVML and get a handle per GPU (identities are read per GPU later, on
    each GPU's own worker, so one wedged GPU cannot stall the others' start)."""
    try:
        worker.track("nvmlInit", pynvml.nvmlInit)
    except pynvml.NVMLError as exc:
        return Session(NvmlStatus(ok=False, problem=classify_init_error(exc), message=str(exc)))
    try:
        count = int(worker.track("nvmlDeviceGetCount", pynvml.nvmlDeviceGetCount))
        status = NvmlStatus(
            ok=True,
            driver_version=text(optional("driver", pynvml.nvmlSystemGetDriverVersion)),
            nvml_version=text(optional("nvml", pynvml.nvmlSystemGetNVMLVersion)),
            cuda_driver_version=_cuda_version(
                optional("cuda", pynvml.nvmlSystemGetCudaDriverVersion)
            ),
        )
    except (pynvml.NVMLError, NvmlCallError, GpuLostError) as exc:
        close_session()
        return Session(NvmlStatus(ok=False, problem="other", message=str(exc)))
    session = Session(status)
    for index in range(count):
        try:
            handle = worker.track(
                "nvmlDeviceGetHandleByIndex", pynvml.nvmlDeviceGetHandleByIndex, index
            )
        except pynvml.NVMLError as exc:
            session.unreachable[index] = str(exc)
            continue
        session.devices.append(Device(index, handle, make_worker(index), process_name))
    return session


def close_session() -> None:
    with contextlib.suppress(pynvml.NVMLError):
        pynvml.nvmlShutdown()


def _cuda_version(raw: int | None) -> str | None:
    """12040 → "12.4", as nvidia-smi prints it."""
    if not raw:
        return None
    return f"{raw // 1000}.{raw % 1000 // 10}"
