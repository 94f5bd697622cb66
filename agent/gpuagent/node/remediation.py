"""Remediation beside publishing: one cycle at a time, on the newest snapshot, and the
remote remediation commands (mode, GPU reset) through the same rails; DCGM's diagnostic
on request (`gpuagent diag`), audited like the ones remediation runs itself."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from gpuagent.config import Config
from gpuagent.dcgm.control import DcgmControl
from gpuagent.dcgm.runner import DiagRunner
from gpuagent.fleet.commands import CommandRefusedError
from gpuagent.model import DiagResult, NodeSnapshot, RemediationStatus
from gpuagent.remediation.aggregator import Ask
from gpuagent.remediation.audit import AuditError, AuditStore
from gpuagent.remediation.build import build_backends
from gpuagent.remediation.evidence import EvidenceCollector
from gpuagent.remediation.executor import Remediator
from gpuagent.remediation.gpu_ops import GpuOps
from gpuagent.remediation.types import PlannedAction
from gpuagent.sources.nvml import NvmlSource

if TYPE_CHECKING:  # the simulator is imported only under --simulate
    from gpuagent.sim import SimulatedNode

# The daemon's log lines keep the logger name they always had.
log = logging.getLogger("gpuagent.daemon")


def build_remediator(
    config: Config,
    audit: AuditStore,
    *,
    node: str,
    ask: Ask | None,
    simulator: SimulatedNode | None,
    nvml: Callable[[], NvmlSource | None],
    on_reset: Callable[[str, float], None],
    dcgm: Callable[[], DcgmControl | None] = lambda: None,
) -> Remediator:
    remediation = config.remediation
    return Remediator(
        remediation,
        audit=audit,
        backends=build_backends(
            remediation.cordon,
            node,
            config.agent.cluster,
            ask,
            node_condition=not config.outputs.kubernetes.enabled,
        ),
        ops=GpuOps(
            reset_command=remediation.reset.command,
            timeout=remediation.reset.timeout_seconds,
            simulator=simulator,
            nvml=nvml,
            dcgm=dcgm,
        ),
        diag=DiagRunner(dcgm=dcgm, timeout=remediation.diag.timeout),
        evidence=EvidenceCollector(
            remediation.evidence, config.agent.state_dir / "evidence", node=node
        )
        if remediation.evidence.enabled
        else None,
        node=node,
        cluster=config.agent.cluster,
        on_reset=on_reset,
        simulated=simulator is not None,
    )


class RemediationScheduler:
    """Holds the remediator (once started) and the one remediation task."""

    def __init__(self) -> None:
        self.remediator: Remediator | None = None
        self.task: asyncio.Task[None] | None = None
        self._pending: NodeSnapshot | None = None

    def status(self) -> RemediationStatus | None:
        remediator = self.remediator
        if remediator is None:
            return None
        try:
            history, budgets = remediator.history(), remediator.budget_remaining()
            cordoned, capped = history.cordoned_by_us, history.power_capped
        except AuditError:  # unknown without the trail (the state_dir finding says why)
            cordoned, capped, budgets = False, (), []
        return RemediationStatus(
            mode=remediator.mode,
            paused=remediator.paused,
            cordoned_by_us=cordoned,
            counts=tuple((a, r, n) for (a, r), n in sorted(remediator.counts.items())),
            budgets=tuple(budgets),
            power_capped=capped,
            plan=tuple(
                (r.kind, r.target, r.result, r.reason, r.detail, r.count)
                for r in remediator.last_plan
            ),
        )

    def diag_results(self) -> tuple[DiagResult, ...]:
        """The latest DCGM diagnostic of each level (for the snapshot)."""
        remediator = self.remediator
        if remediator is None or remediator.diag is None:
            return ()
        return remediator.diag.latest()

    async def run_diag(self, level: int, gpus: tuple[int, ...]) -> DiagResult:
        """A diagnostic asked for (`gpuagent diag`): run and audited. Raises
        DiagUnavailableError when it cannot run here."""
        assert self.remediator is not None
        what = ",".join(map(str, gpus)) or "every GPU"
        return await self.remediator.diagnose(
            level, gpus, self.remediator.node, f"requested: level {level} on {what}"
        )

    def storage_error(self) -> str | None:
        """Why the audit trail cannot be used now, if it cannot."""
        return self.remediator.audit.error if self.remediator is not None else None

    def schedule(self, snapshot: NodeSnapshot) -> None:
        """Remediation runs beside publishing, one cycle at a time, on the newest snapshot."""
        if self.remediator is None:
            return
        self._pending = snapshot
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self._loop(), name="remediation")

    async def _loop(self) -> None:
        assert self.remediator is not None
        while (snapshot := self._pending) is not None:
            self._pending = None
            try:
                await self.remediator.handle(snapshot)
            except Exception:  # a remediation bug must not take monitoring down
                log.exception("remediation cycle failed")

    def set_mode(self, mode: str) -> str:
        assert self.remediator is not None
        return self.remediator.set_mode(mode)

    async def reset_gpu(self, bus_id: str, snapshot: NodeSnapshot | None) -> str:
        """A remote reset request: through every rail local remediation has (mode, kill
        switch, budgets, no process on the GPU, cordoned first), never around them."""
        assert self.remediator is not None
        if snapshot is None or snapshot.gpu(bus_id) is None:
            raise CommandRefusedError(f"no GPU {bus_id} on this node")
        action = PlannedAction("reset_gpu", bus_id, "requested by the aggregator")
        try:
            record = await self.remediator.run_requested(action, snapshot)
        except AuditError as exc:
            raise CommandRefusedError(str(exc)) from None
        if record is None:
            raise CommandRefusedError("not attempted: cooling down after a recent attempt")
        if record.result not in ("succeeded", "planned"):
            raise CommandRefusedError(f"{record.result}: {record.detail}")
        return f"{record.result}: {record.detail}"
