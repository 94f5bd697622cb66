"""The daemon's local API methods (see docs/api.md), over what ApiTarget lists of the
running daemon (gpuagent.daemon.Agent implements it)."""

from __future__ import annotations

import asyncio
import itertools
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from gpuagent import __version__
from gpuagent.acks import AckError
from gpuagent.api import ApiError, ApiServer
from gpuagent.dcgm.control import DiagUnavailableError
from gpuagent.dcgm.runner import LEVELS, result_json
from gpuagent.drills import DRILL_KINDS, compose_line, write_kernel_line
from gpuagent.kernel.parse import canonical_pci
from gpuagent.model import DiagResult, GpuEvent
from gpuagent.sources.udev import PciChange
from gpuagent.statusview import event_json, status_document

if TYPE_CHECKING:  # only named in ApiTarget's annotations
    from pathlib import Path

    from gpuagent.events import EventLog
    from gpuagent.remediation.executor import Remediator
    from gpuagent.sim import SimulatedNode
    from gpuagent.store import SnapshotStore

log = logging.getLogger(__name__)

_MAX_EVENTS = 1000
# Simulated udev events (a simulated node has no devices on the host's PCI bus).
_SIMULATED_PCI = {"pci_remove": "remove", "pci_add": "add"}
# Finished diagnostics whose results can still be asked for.
_DIAG_KEEP = 16


class ApiTarget(Protocol):
    """What the local API reads and asks of the running daemon, and nothing more."""

    @property
    def node_name(self) -> str: ...

    @property
    def store(self) -> SnapshotStore: ...  # the current snapshot, and the next one

    @property
    def events(self) -> EventLog: ...

    @property
    def remediator(self) -> Remediator | None: ...  # None until remediation runs

    @property
    def simulator(self) -> SimulatedNode | None: ...  # None unless simulated

    @property
    def polls(self) -> int: ...  # NVML polls so far

    @property
    def kmsg_path(self) -> Path: ...  # where drills write kernel-log lines

    def refresh(self) -> None:
        """Poll NVML now (the next snapshot follows)."""

    async def acknowledge(self, bus_id: str, check: str | None, reason: str, by: str) -> str:
        """Hold the GPU's findings at OK until their fault comes again (AckError if not)."""

    async def clear_drills(self, by: str) -> str:
        """Forget every drill's events, audited."""

    def on_pci_change(self, change: PciChange) -> None:
        """A PCI function came or went (udev, or simulated)."""

    async def run_diag(self, level: int, gpus: tuple[int, ...]) -> DiagResult:
        """DCGM's diagnostic, audited (DiagUnavailableError: it cannot run here)."""
        ...


@dataclass
class _DiagJob:
    """One diagnostic asked for over the API. It runs as a task of its own: a level 3
    diagnostic takes longer than any request may stay open, so the client asks for the
    result (``diag_result``) until it is there."""

    id: int
    level: int
    gpus: tuple[int, ...]
    task: asyncio.Task[DiagResult]

    def json(self) -> dict[str, Any]:
        document: dict[str, Any] = {"id": self.id, "level": self.level, "gpus": list(self.gpus)}
        if not self.task.done():
            return {**document, "state": "running"}
        if self.task.cancelled():
            return {**document, "state": "error", "error": "the diagnostic was cancelled"}
        exc = self.task.exception()
        if isinstance(exc, DiagUnavailableError):
            return {**document, "state": "unavailable", "error": str(exc)}
        if exc is not None:
            return {**document, "state": "error", "error": str(exc) or type(exc).__name__}
        return {**document, "state": "done", "result": result_json(self.task.result())}


class AgentApi:
    def __init__(self, agent: ApiTarget) -> None:
        self.agent = agent
        self._diag_jobs: dict[int, _DiagJob] = {}
        self._diag_ids = itertools.count(1)

    def register(self, server: ApiServer) -> None:
        server.route("ping", self.ping)
        server.route("status", self.status)
        server.route("refresh", self.refresh)
        server.route("events", self.events)
        server.route("simulator", self.simulator)
        server.route("actions", self.actions)
        server.route("inject", self.inject, changes_state=True)
        server.route("drill", self.drill, changes_state=True)
        server.route("clear_drills", self.clear_drills, changes_state=True)
        server.route("ack", self.ack, changes_state=True)
        server.route("diag", self.diag, changes_state=True)
        server.route("diag_result", self.diag_result)

    async def ping(self, _params: dict[str, Any]) -> dict[str, Any]:
        return {"version": __version__, "node": self.agent.node_name}

    async def status(self, _params: dict[str, Any]) -> dict[str, Any]:
        snapshot = self.agent.store.current
        if snapshot is None:
            raise ApiError("no snapshot yet: the agent is starting")
        return status_document(snapshot)

    async def refresh(self, _params: dict[str, Any]) -> dict[str, Any]:
        self.agent.refresh()
        async with asyncio.timeout(30):
            snapshot = await self.agent.store.next_update()
        return {"sequence": snapshot.sequence}

    async def events(self, params: dict[str, Any]) -> dict[str, Any]:
        limit = params.get("limit", 50)
        gpu = params.get("gpu")
        if isinstance(limit, bool) or not isinstance(limit, int) or not 0 < limit <= _MAX_EVENTS:
            raise ApiError(f'"limit" must be an integer from 1 to {_MAX_EVENTS}')
        if gpu is not None and not isinstance(gpu, str):
            raise ApiError('"gpu" must be a PCI bus id')
        if gpu is not None:
            # Events carry the canonical form; NVML's (00000000:BA:00.0) or a short one
            # (ba:00.0) names the same GPU.
            gpu = canonical_pci(gpu) or gpu

        def accept(event: GpuEvent) -> bool:
            return gpu is None or event.gpu == gpu

        chosen = self.agent.events.latest(limit, accept)
        return {"events": [event_json(e) for e in chosen]}

    async def actions(self, params: dict[str, Any]) -> dict[str, Any]:
        limit = params.get("limit", 50)
        if isinstance(limit, bool) or not isinstance(limit, int) or not 0 < limit <= _MAX_EVENTS:
            raise ApiError(f'"limit" must be an integer from 1 to {_MAX_EVENTS}')
        remediator = self.agent.remediator
        if remediator is None:
            raise ApiError("remediation is not running")
        return {
            "mode": remediator.mode,
            "paused": remediator.paused,
            "actions": [record.json() for record in remediator.audit.recent(limit)],
        }

    async def diag(self, params: dict[str, Any]) -> dict[str, Any]:
        """Start DCGM's diagnostic; the answer names the job to ask ``diag_result`` about."""
        level, gpus = params.get("level", 1), params.get("gpus", [])
        if isinstance(level, bool) or level not in LEVELS:
            raise ApiError('"level" must be 1, 2 or 3')
        if not isinstance(gpus, list) or any(
            isinstance(g, bool) or not isinstance(g, int) for g in gpus
        ):
            raise ApiError('"gpus" must be a list of GPU indices')
        for gpu in gpus:
            self._bus_id(gpu)  # an unknown index is refused before anything runs
        running = [job.id for job in self._diag_jobs.values() if not job.task.done()]
        if running:
            raise ApiError(f"diagnostic {running[0]} is still running")
        chosen = tuple(sorted(set(gpus)))
        job_id = next(self._diag_ids)
        task = asyncio.get_running_loop().create_task(
            self.agent.run_diag(level, chosen), name=f"diag-{job_id}"
        )
        task.add_done_callback(_retrieve)
        self._diag_jobs[job_id] = _DiagJob(job_id, level, chosen, task)
        for old in sorted(self._diag_jobs)[:-_DIAG_KEEP]:
            if self._diag_jobs[old].task.done():
                del self._diag_jobs[old]
        log.info("diagnostic %d: level %d on %s", job_id, level, list(chosen) or "every GPU")
        return self._diag_jobs[job_id].json()

    async def diag_result(self, params: dict[str, Any]) -> dict[str, Any]:
        job_id = params.get("id")
        job = self._diag_jobs.get(job_id) if isinstance(job_id, int) else None
        if job is None:
            raise ApiError(f"no diagnostic {job_id!r} (the last {_DIAG_KEEP} are kept)")
        return job.json()

    async def simulator(self, _params: dict[str, Any]) -> dict[str, Any]:
        """NVML call counts of a simulated daemon, for benchmarks."""
        simulator = self.agent.simulator
        if simulator is None:
            raise ApiError("not a simulated daemon")
        return {
            "polls": self.agent.polls,
            "calls": simulator.call_counts(),
            "calls_per_device": {str(k): v for k, v in simulator.calls_per_device().items()},
            "charged_cpu_ms": simulator.charged_cpu_ms(),
            "simulator_cpu_ms": simulator.simulator_cpu_ms(),
        }

    def _bus_id(self, index: int) -> str:
        snapshot = self.agent.store.current
        gpu = (
            next((g for g in snapshot.gpus if g.identity.index == index), None)
            if snapshot
            else None
        )
        if gpu is None or gpu.identity.pci_bus_id.startswith("unknown"):
            raise ApiError(f"no GPU with index {index} is known")
        return gpu.identity.pci_bus_id

    async def inject(self, params: dict[str, Any]) -> dict[str, Any]:
        simulator = self.agent.simulator
        if simulator is None:
            raise ApiError("inject into NVML needs a simulated daemon (gpuagent run --simulate)")
        kind, gpu, values = _fault_params(params)
        if kind in _SIMULATED_PCI:
            action = _SIMULATED_PCI[kind]
            # Off the bus (and out of the simulated PCI tree), NVML loses the GPU too; back
            # on it, the GPU answers again.
            simulator.inject("pci_remove" if action == "remove" else "clear", gpu, {})
            change = PciChange(action, self._bus_id(gpu), None, 0x10DE, 0x030200)  # type: ignore[arg-type]
            self.agent.on_pci_change(change)
        else:
            try:
                simulator.inject(kind, gpu, values)
            except ValueError as exc:
                raise ApiError(str(exc)) from None
        log.info("injected %s into simulated GPU %d %s", kind, gpu, values)
        return await self.refresh({})

    async def drill(self, params: dict[str, Any]) -> dict[str, Any]:
        kind, gpu, values = _fault_params(params)
        if kind not in DRILL_KINDS:
            raise ApiError(f"unknown drill {kind!r} (known: {', '.join(DRILL_KINDS)})")
        path = self.agent.kmsg_path
        if self.agent.simulator is None and params.get("yes") is not True:
            # Every reader of this kernel log (node-problem-detector, other health agents,
            # a SIEM) will see the line as a real fault: never without the operator's yes.
            raise ApiError(
                f"a drill writes a real kernel-log line to {path}, which every reader of the "
                "node's kernel log sees; nothing was written (add --yes to write it)"
            )
        try:
            line = compose_line(kind, self._bus_id(gpu), values)
        except ValueError as exc:
            raise ApiError(str(exc)) from None
        try:
            write_kernel_line(path, line)
        except OSError as exc:
            raise ApiError(f"cannot write to {path}: {exc.strerror or exc}") from None
        simulator = self.agent.simulator
        if simulator is not None and kind == "xid":
            # The driver reports an XID through NVML too; the event log keeps one of the two.
            simulator.inject("xid", gpu, {"xid": values["code"]})
        log.info("drill: wrote %r to %s", line, path)
        return {"line": line, "path": str(path)}

    async def clear_drills(self, params: dict[str, Any]) -> dict[str, Any]:
        try:
            detail = await self.agent.clear_drills(_by(params))
        except AckError as exc:
            raise ApiError(str(exc)) from None
        log.info("drills cleared: %s", detail)
        return {"detail": detail}

    async def ack(self, params: dict[str, Any]) -> dict[str, Any]:
        gpu, check, reason = params.get("gpu"), params.get("check"), params.get("reason")
        if isinstance(gpu, bool) or not isinstance(gpu, int):
            raise ApiError('"gpu" must be a GPU index')
        if check is not None and not isinstance(check, str):
            raise ApiError('"check" must be a check name')
        if not isinstance(reason, str):
            raise ApiError('"reason" must be a string')
        try:
            detail = await self.agent.acknowledge(self._bus_id(gpu), check, reason, _by(params))
        except AckError as exc:
            raise ApiError(str(exc)) from None
        log.info("GPU %d: %s: %s", gpu, detail, reason)
        return {"detail": detail}


def _by(params: dict[str, Any]) -> str:
    """Who asked, as the client says (the socket already required root)."""
    by = params.get("by")
    return by[:64] if isinstance(by, str) and by else "root"


def _fault_params(params: dict[str, Any]) -> tuple[str, int, dict[str, Any]]:
    kind, gpu, values = params.get("kind"), params.get("gpu"), params.get("values", {})
    if (
        not isinstance(kind, str)
        or isinstance(gpu, bool)
        or not isinstance(gpu, int)
        or not isinstance(values, dict)
    ):
        raise ApiError('needs "kind" (string), "gpu" (integer) and "values" (object)')
    return kind, gpu, values


def _retrieve(task: asyncio.Task[DiagResult]) -> None:
    """Mark the job's exception as seen: it is answered through ``diag_result``."""
    if not task.cancelled():
        task.exception()
