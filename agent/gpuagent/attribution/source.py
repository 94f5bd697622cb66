"""The attribution source: asks the kubelet periodically and attaches owners to GPU states.

The kubelet is asked on a worker thread, every `attribution.interval_seconds` and as soon
as a GPU's process list changes (a new pod's first CUDA call), never on a scrape. A failed
call (no socket, kubelet down, timeout) marks the Kubernetes owners unknown, shown by the
"kubelet" source row going down, until a call answers again. Slurm jobs need no reading
here: the NVML worker looks each process's cgroup up with the process (sources/procfs.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Protocol

from gpuagent.attribution.owners import DeviceOwner, device_on_gpu
from gpuagent.config import Config
from gpuagent.model import GpuState, NodeHealth, Severity, Workload
from gpuagent.supervisor import SourceTracker

log = logging.getLogger(__name__)


class KubeletLister(Protocol):
    def list(self) -> tuple[DeviceOwner, ...]: ...


TRACKER = "kubelet"


class AttributionSource:
    def __init__(
        self,
        config: Config,
        trackers: dict[str, SourceTracker],
        schedule_publish: Callable[[], None],
    ) -> None:
        self._config = config.attribution
        self._trackers = trackers
        self._schedule_publish = schedule_publish
        # None: not known (not asked yet, or the last call failed).
        self.owners: tuple[DeviceOwner, ...] | None = None
        self._wake = asyncio.Event()
        self._processes: dict[str, frozenset[int]] = {}
        # The owners last attached, by bus id, as text: stamped on events (owners_of).
        self._texts: dict[str, str] = {}

    async def loop(self) -> None:
        """Ask the kubelet forever (only started with attribution.kubernetes on)."""
        # Here, not at the top: with Kubernetes attribution off, grpc is never loaded.
        from gpuagent.attribution.kubelet import KubeletClient  # noqa: PLC0415

        config = self._config
        tracker = self._trackers.setdefault(TRACKER, SourceTracker(TRACKER))
        client = KubeletClient(config.pod_resources_socket, config.timeout_seconds)
        try:
            while True:
                self._wake.clear()
                before = self.owners
                await self._refresh(client, tracker)
                if self.owners != before:  # the NVML polls publish the source row anyway
                    self._schedule_publish()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(config.interval_seconds):
                        await self._wake.wait()
        finally:
            client.close()

    async def _refresh(self, client: KubeletLister, tracker: SourceTracker) -> None:
        started = time.monotonic()
        try:
            # The gRPC deadline bounds the call; this one also bounds the thread's start.
            async with asyncio.timeout(self._config.timeout_seconds + 1.0):
                self.owners = await asyncio.to_thread(client.list)
        except Exception as exc:  # noqa: BLE001 - any failure leaves owners unknown, never fatal
            self.owners = None
            tracker.failure(time.monotonic() - started, _describe(exc))
        else:
            tracker.success(time.monotonic() - started)

    def attach(self, gpus: tuple[GpuState, ...]) -> tuple[GpuState, ...]:
        """``gpus`` with their owners; asks the kubelet again when a process list changed."""
        by_device: dict[str, list[DeviceOwner]] = {}
        for owner in self.owners or ():
            by_device.setdefault(owner.device, []).append(owner)
        attached = []
        for gpu in gpus:
            self._watch_processes(gpu)
            workloads = self._workloads(gpu, by_device)
            attached.append(replace(gpu, workloads=workloads) if workloads else gpu)
        self._texts = owner_texts(attached)
        return tuple(attached)

    def owners_of(self, bus_id: str) -> str:
        """Who was on the GPU at the last snapshot ("" when nobody known)."""
        return self._texts.get(bus_id, "")

    def _workloads(
        self, gpu: GpuState, by_device: dict[str, list[DeviceOwner]]
    ) -> tuple[Workload, ...]:
        workloads: list[Workload] = []
        if self._config.kubernetes:
            uuid = gpu.identity.uuid
            # Read on the slow cadence; none known while the GPU is not read.
            migs = {m.uuid for m in gpu.readings.mig_devices} if gpu.readings else set()
            for device, owners in by_device.items():
                mig = device_on_gpu(device, uuid, migs)
                if mig is not None:
                    workloads.extend(
                        Workload(
                            pod=o.pod, namespace=o.namespace, container=o.container, device=mig
                        )
                        for o in owners
                    )
        if self._config.slurm and gpu.readings is not None:
            processes = (*gpu.readings.processes, *gpu.readings.graphics_processes)
            jobs = sorted({p.job for p in processes if p.job is not None}, key=_job_order)
            workloads.extend(Workload(hpc_job=job) for job in jobs)
        return tuple(workloads)

    def _watch_processes(self, gpu: GpuState) -> None:
        if not self._config.kubernetes or gpu.readings is None:
            return
        pids = frozenset(p.pid for p in gpu.readings.processes)
        before = self._processes.get(gpu.identity.uuid)
        self._processes[gpu.identity.uuid] = pids
        if before is not None and pids - before:
            # A new process: likely a new pod's; ask now rather than up to an interval later.
            self._wake.set()


def _job_order(job: str) -> tuple[int, str]:
    return (int(job), job) if job.isdigit() else (0, job)


def _describe(exc: BaseException) -> str:
    details = getattr(exc, "details", None)
    if callable(details):  # a grpc.RpcError: its status code and the peer's message
        code = getattr(exc, "code", None)
        return f"{code() if callable(code) else 'error'}: {details()}"
    return str(exc) or type(exc).__name__


def workload_text(workload: Workload) -> str:
    """One owner in a line: "pod ml/train-0 (trainer)", "job 42", "... on MIG-..."."""
    parts = []
    if workload.pod:
        parts.append(f"pod {workload.namespace}/{workload.pod} ({workload.container})")
    if workload.hpc_job:
        parts.append(f"job {workload.hpc_job}")
    text = ", ".join(parts)
    return f"{text} on {workload.device}" if workload.device else text


def owner_texts(gpus: Iterable[GpuState]) -> dict[str, str]:
    """Each owned GPU's owners in a line, by bus id: "pod ml/train-0 (trainer); job 42"."""
    return {
        g.identity.pci_bus_id: "; ".join(workload_text(w) for w in g.workloads)
        for g in gpus
        if g.workloads
    }


def with_owner_evidence(health: NodeHealth, gpus: tuple[GpuState, ...]) -> NodeHealth:
    """``health`` with each problem on an owned GPU naming its owners (evidence
    "workloads"), so the finding JSON, the fleet's copy and the audit records say who was
    on the GPU when it went bad."""
    owners = owner_texts(gpus)
    if not owners:
        return health
    findings = tuple(
        replace(f, evidence=(*f.evidence, ("workloads", owners[f.gpu])))
        if f.gpu in owners and f.severity != Severity.OK
        else f
        for f in health.findings
    )
    return replace(health, findings=findings)
