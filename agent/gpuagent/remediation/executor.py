"""The executor: turns planned actions into guarded, audited attempts.

For every planned action, in order: a cooldown (the same action on the same target is
not tried again sooner than `budgets.cooldown_seconds`), the kill switch, the budget
(counted from the audit trail, so restarts and crash loops cannot exceed it), the
preconditions (a cordon needs a backend; a reset needs an idle GPU, no MIG unless allowed,
and the node cordoned first when configured), then a "started" record, the action, and
its result. Observe mode runs the same rails and stops where the action would start: it
audits "planned" for what enforce would do, and "skipped" or "refused" with the same
reasons where enforce would not (a reset refused because the node is not cordoned reads
"reset: would be refused, ..."), so its trail is what enforce would have done.

After a reset the GPU must come back healthy for `reset.verify_polls` polls and then pass
DCGM's diagnostic (`[remediation.diag]` after_reset_level); if it does not, the reset is
escalated: the node is cordoned with "drain and reboot" and that GPU is never reset again.
Before an uncordon the GPUs the cordon was for must pass the diagnostic
(before_uncordon_level), or the node stays cordoned. Every diagnostic is audited (kind
"diag"). An escalation, a row-remap failure and the retired-page limit collect an RMA
evidence bundle for the GPU, in the background (kind "evidence"; see
gpuagent.remediation.evidence).

A decision a cycle's plan repeats (planned, skipped or refused alike, every cooldown
while a fault lasts) is counted on its audit row, not written again (see
gpuagent.remediation.audit).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, get_args

from gpuagent.config import RemediationSection
from gpuagent.dcgm.control import DiagUnavailableError
from gpuagent.dcgm.runner import DiagRunner, describe, failed_tests
from gpuagent.model import DiagResult, NodeSnapshot, Severity
from gpuagent.remediation.audit import AuditError, AuditRecord, AuditStore
from gpuagent.remediation.backend import CordonBackend
from gpuagent.remediation.evidence import ESCALATED, EvidenceCollector, rma_trigger
from gpuagent.remediation.gpu_ops import GpuOperationError, GpuOps
from gpuagent.remediation.planner import node_is_healthy, plan, thermal_ok
from gpuagent.remediation.types import (
    ActionKind,
    ActionResult,
    CordonRequest,
    History,
    PlannedAction,
)

if TYPE_CHECKING:
    from gpuagent.model import GpuState

log = logging.getLogger(__name__)

# What an attempt looks like in the audit trail (for budgets) and what counts as "this
# action was just looked at" (for cooldowns, so observe mode does not audit every poll).
_ATTEMPTS: tuple[ActionResult, ...] = ("started",)
_ALL_RESULTS: tuple[ActionResult, ...] = get_args(ActionResult)
_COOLDOWN_RESULTS: tuple[ActionResult, ...] = (
    "planned",
    "started",
    "succeeded",
    "failed",
    "refused",
    "skipped",
)
# How soon a bundle that could not be collected is tried again.
_EVIDENCE_RETRY = 3600.0
# How a refusal names the action it refuses.
_LABELS: dict[str, str] = {"reset_gpu": "reset"}
OBSERVED = "observe mode: not done"


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a precondition does not hold. One set of checks serves both modes: enforce
    refuses with it, observe says enforce would."""

    reason: str
    # The configuration rules the action out whatever the node's state (no backend to
    # ask): observe mode states it as it is rather than as a guess of what enforce finds.
    configured: bool = False

    def detail(self, kind: ActionKind, *, observe: bool) -> str:
        label = _LABELS.get(kind, kind)
        if observe and not self.configured:
            return f"{label}: would be refused, {self.reason}"
        return f"{label}: {self.reason}"


@dataclass
class _Verification:
    bus_id: str
    good_polls: int = 0
    bad_polls: int = 0


class Remediator:
    def __init__(
        self,
        config: RemediationSection,
        *,
        audit: AuditStore,
        backends: Sequence[CordonBackend],
        ops: GpuOps,
        node: str,
        cluster: str,
        on_reset: Callable[[str, float], None] = lambda _bus, _when: None,
        diag: DiagRunner | None = None,
        evidence: EvidenceCollector | None = None,
        simulated: bool = False,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.audit = audit
        self._backends = list(backends)
        self._ops = ops
        self._node = node
        self._cluster = cluster
        self._on_reset = on_reset
        # DCGM's diagnostic (None: never available, as on a node without DCGM or dcgmi).
        self.diag = diag
        self.evidence = evidence
        self._collecting: dict[str, asyncio.Task[None]] = {}  # bus id → its bundle's task
        self._snapshot: NodeSnapshot | None = None  # the newest, for bundles
        self._clock = clock
        self._wall = wall_clock
        self._persistenced = not simulated and shutil.which("nvidia-persistenced") is not None
        self._cool_since: dict[str, float] = {}
        self._healthy_since: float | None = None
        self._verifying: dict[str, _Verification] = {}
        self.counts: dict[tuple[str, str], int] = {}
        self._mode: str = config.mode
        # Observe mode, within one cycle: the plan's cordon would have been done, so what
        # follows it (a reset requiring it) is judged on a cordoned node, as in enforce.
        self._would_be_cordoned = False
        # The newest record of each action of the latest plan: what it came to (or, in
        # observe mode, would have), for status.
        self.last_plan: tuple[AuditRecord, ...] = ()
        # One cycle or requested action at a time: two must never act on one GPU at once.
        self._busy = asyncio.Lock()
        self._audit_failing = False  # logged once per episode of an unusable audit trail
        # Called with every audit record (the MQTT reporter and the Kubernetes output
        # forward them).
        self.on_record: Callable[[AuditRecord], None] = lambda _record: None

    @property
    def node(self) -> str:
        return self._node

    @property
    def paused(self) -> bool:
        return self.config.kill_switch.exists()

    @property
    def mode(self) -> str:
        return self._mode

    def set_mode(self, mode: str) -> str:
        """Switch between observe and enforce until the agent restarts (the configuration
        file stays the source of truth); the change is logged."""
        if mode not in ("observe", "enforce"):
            raise ValueError(f"mode must be observe or enforce, not {mode!r}")
        previous, self._mode = self._mode, mode
        log.warning("remediation mode %s -> %s (until restart)", previous, mode)
        return f"remediation mode {previous} -> {mode}"

    # --- history ------------------------------------------------------------------------

    def history(self) -> History:
        audit = self.audit
        cordon = audit.last("cordon", None, ("succeeded",))
        uncordon = audit.last("uncordon", None, ("succeeded",))
        capped: list[tuple[str, float]] = []
        for target in audit.targets("cap_power", "succeeded"):
            cap = audit.last("cap_power", target, ("succeeded",))
            restore = audit.last("restore_power", target, ("succeeded",))
            if cap is not None and (restore is None or restore.id < cap.id):
                params = cap.evidence.get("params", {})
                previous = params.get("previous_w") if isinstance(params, dict) else None
                if isinstance(previous, int | float):
                    capped.append((target, float(previous)))
        return History(
            cordoned_by_us=cordon is not None and (uncordon is None or uncordon.id < cordon.id),
            power_capped=tuple(capped),
            cool_since=tuple(self._cool_since.items()),
            healthy_since=self._healthy_since,
            escalated=audit.targets("reset_gpu", "escalated"),
            persistenced_installed=self._persistenced,
        )

    def _track(self, snapshot: NodeSnapshot, now: float) -> None:
        """Hold timers the planner needs: since when each GPU is cool, the node healthy."""
        for gpu in snapshot.gpus:
            bus = gpu.identity.pci_bus_id
            if thermal_ok(snapshot, bus):
                self._cool_since.setdefault(bus, now)
            else:
                self._cool_since.pop(bus, None)
        if node_is_healthy(snapshot):
            if self._healthy_since is None:
                self._healthy_since = now
        else:
            self._healthy_since = None

    # --- the cycle ----------------------------------------------------------------------

    async def handle(self, snapshot: NodeSnapshot) -> None:
        """Plan for this snapshot and carry the plan out (one cycle at a time). Nothing is
        done while the audit trail cannot be opened: no action without its record."""
        async with self._busy:
            if not await self._audit_ready():
                return
            await self._cycle(snapshot)

    async def _audit_ready(self) -> bool:
        was_ready = self.audit.ready
        if await self.audit.open():
            if self._audit_failing:
                log.warning("remediation resumed: the audit trail can be written again")
            self._audit_failing = False
            return True
        if not self._audit_failing or was_ready:
            log.error("remediation paused: %s", self.audit.error)
        self._audit_failing = True
        return False

    async def run_requested(
        self, action: PlannedAction, snapshot: NodeSnapshot
    ) -> AuditRecord | None:
        """Carry out an action asked for from outside (a remote command) with every guard a
        planned one has; the last audit record it left, or None if it was cooling down."""
        async with self._busy:
            if not await self._audit_ready():
                raise AuditError(self.audit.error)
            last = self.audit.last(action.kind, action.target, _ALL_RESULTS)
            self._snapshot = snapshot
            await self._execute(action, snapshot, planned=False)
            record = self.audit.last(action.kind, action.target, _ALL_RESULTS)
        # A repeat is counted on the row before it: new is a new row or a higher count.
        new = record is not None and (
            last is None or (record.id, record.count) != (last.id, last.count)
        )
        return record if new else None

    async def _cycle(self, snapshot: NodeSnapshot) -> None:
        now = self._clock()
        self._snapshot = snapshot
        self._track(snapshot, now)
        await self._verify(snapshot)
        self._gather_evidence(snapshot)
        actions = plan(snapshot, self.history(), now, self.config)
        try:
            # Whether or not the cordon itself is cooling down: in enforce it would be done.
            self._would_be_cordoned = self.mode == "observe" and any(
                [await self._would_pass(a, snapshot) for a in actions if a.kind == "cordon"]
            )
            for action in actions:
                await self._execute(action, snapshot)
            self.last_plan = self._outcomes(actions)
        except AuditError as exc:
            # Without an audit record nothing is done; try again next cycle.
            log.error("remediation halted: %s", exc)  # noqa: TRY400 - no traceback needed
        finally:
            self._would_be_cordoned = False

    def _outcomes(self, actions: Sequence[PlannedAction]) -> tuple[AuditRecord, ...]:
        newest = (self.audit.last(a.kind, a.target, _ALL_RESULTS) for a in actions)
        return tuple(record for record in newest if record is not None)

    async def _record(
        self, action: PlannedAction, result: ActionResult, detail: str = "", *, fold: bool = False
    ) -> None:
        """``fold``: a decision the plan repeats (every cooldown while a fault lasts) is
        counted on the row it repeats rather than written again."""
        record = await self.audit.record(action, result, mode=self.mode, detail=detail, fold=fold)
        self.on_record(record)
        self.counts[(action.kind, result)] = self.counts.get((action.kind, result), 0) + 1
        level = logging.WARNING if result in ("failed", "refused", "escalated") else logging.INFO
        log.log(
            level,
            "remediation %s %s on %s: %s%s",
            result,
            action.kind,
            action.target,
            action.reason,
            f" ({detail})" if detail else "",
        )

    def _cooling_down(self, action: PlannedAction) -> bool:
        since = self._wall() - self.config.budgets.cooldown_seconds
        return self.audit.count(action.kind, _COOLDOWN_RESULTS, since, action.target) > 0

    async def _execute(
        self, action: PlannedAction, snapshot: NodeSnapshot, *, planned: bool = True
    ) -> None:
        """``planned``: from this cycle's plan (not asked for from outside), so a repeat
        of the same decision is folded into the row before."""
        if self._cooling_down(action):
            return
        action = self._with_cordoned_gpus(action, snapshot)
        observe = self.mode == "observe"
        blocked = self._blocked(action)
        if blocked:
            await self._record(action, "skipped", blocked, fold=planned)
            return
        refusal = await self._precondition_failure(action, snapshot, dry_run=observe)
        if refusal is not None:
            why = refusal.detail(action.kind, observe=observe)
            await self._record(action, "refused", why, fold=planned)
            return
        if observe:
            await self._record(action, "planned", self._would_do(action), fold=planned)
            return
        await self._record(action, "started")
        try:
            detail = await self._perform(action, snapshot)
        except GpuOperationError as exc:
            await self._record(action, "failed", str(exc))
            if action.kind == "reset_gpu":
                await self._escalate(action.target, f"reset failed: {exc}")
            return
        if detail is None:
            return  # _perform recorded a failure itself
        await self._record(action, "succeeded", detail)
        if action.kind == "reset_gpu":
            self._on_reset(action.target, self._clock())
            self._verifying[action.target] = _Verification(action.target)

    def _blocked(self, action: PlannedAction) -> str | None:
        """Why nothing may start now, whatever the action: the kill switch, the budget."""
        if self.paused:
            return f"paused ({self.config.kill_switch} exists)"
        return self._budget_exhausted(action)

    async def _would_pass(self, action: PlannedAction, snapshot: NodeSnapshot) -> bool:
        """Whether every rail but the cooldown lets ``action`` start (nothing is run)."""
        if self._blocked(action):
            return False
        return await self._precondition_failure(action, snapshot, dry_run=True) is None

    def _would_do(self, action: PlannedAction) -> str:
        """Observe mode's detail for an action enforce would start."""
        if action.kind in ("cordon", "uncordon"):
            names = ", ".join(backend.name for backend in self._backends)
            note = f"{OBSERVED}; would ask {names}"
            level = self.config.diag.before_uncordon_level
            if action.kind == "uncordon" and level:
                note += f" after DCGM's diagnostic level {level} passes"
            return note
        return OBSERVED

    def _with_cordoned_gpus(self, action: PlannedAction, snapshot: NodeSnapshot) -> PlannedAction:
        """A cordon keeps the GPUs it is for in its record: the diagnostic before the
        uncordon tests those."""
        if action.kind != "cordon":
            return action
        gpus = self._cordon_request(action.reason, snapshot).gpus
        return dataclasses.replace(action, params=(*action.params, ("gpus", ",".join(gpus))))

    # --- RMA evidence ------------------------------------------------------------------------

    def _gather_evidence(self, snapshot: NodeSnapshot) -> None:
        """A bundle for each GPU a finding says is a replacement case, once while one is
        kept (``evidence.max_age_days``): the same finding every poll asks for nothing new."""
        if self.evidence is None:
            return
        now = self._wall()
        kept_since = now - self.evidence.config.max_age_days * 86400.0
        for finding in snapshot.health.problems():
            trigger = rma_trigger(finding)
            if trigger is None or finding.gpu is None:
                continue
            collected = self.audit.count("evidence", ("succeeded",), kept_since, finding.gpu)
            # A bundle that could not be written (a full disk) is tried again, hourly.
            tried = self.audit.count("evidence", ("started",), now - _EVIDENCE_RETRY, finding.gpu)
            if not collected and not tried:
                self._collect(finding.gpu, trigger, finding.reason)

    def _collect(self, bus_id: str, trigger: str, reason: str) -> None:
        """Collect a bundle in the background: a bug report takes minutes, and remediation
        of the other GPUs (a thermal cap) must not wait for it."""
        running = self._collecting.get(bus_id)
        if self.evidence is None or self._snapshot is None or running is not None:
            return
        task = asyncio.get_running_loop().create_task(
            self._bundle(self.evidence, self._snapshot, bus_id, trigger, reason),
            name=f"evidence {bus_id}",
        )
        self._collecting[bus_id] = task
        task.add_done_callback(lambda _: self._collecting.pop(bus_id, None))

    async def _bundle(
        self,
        evidence: EvidenceCollector,
        snapshot: NodeSnapshot,
        bus_id: str,
        trigger: str,
        reason: str,
    ) -> None:
        action = PlannedAction("evidence", bus_id, reason, params=(("trigger", trigger),))
        try:
            await self._record(action, "started")
            try:
                bundle = await evidence.collect(snapshot, bus_id, trigger, reason)
            except OSError as exc:
                await self._record(action, "failed", f"cannot write the bundle: {exc}")
                return
            except asyncio.CancelledError:
                await self._record(action, "failed", "stopped with the agent")
                raise
            await self._record(action, "succeeded", bundle.describe())
        except AuditError as exc:
            log.error("evidence for %s not recorded: %s", bus_id, exc)  # noqa: TRY400

    async def close(self) -> None:
        """Stop bundles still being collected (their bug reports with them)."""
        tasks = list(self._collecting.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # --- budgets and preconditions -------------------------------------------------------

    def _budget_exhausted(self, action: PlannedAction) -> str | None:
        budgets = self.config.budgets
        now = self._wall()
        limits: list[tuple[int, float, str | None, str]] = []
        if action.kind == "reset_gpu":
            limits = [
                (
                    budgets.reset_per_gpu,
                    budgets.reset_per_gpu_window_seconds,
                    action.target,
                    "per GPU",
                ),
                (budgets.reset_per_node, budgets.reset_per_node_window_seconds, None, "per node"),
            ]
        elif action.kind == "cordon":
            limits = [
                (budgets.cordon_per_node, budgets.cordon_per_node_window_seconds, None, "per node")
            ]
        elif action.kind in ("enable_persistence", "cap_power"):
            limits = [
                (
                    budgets.other_per_gpu,
                    budgets.other_per_gpu_window_seconds,
                    action.target,
                    "per GPU",
                )
            ]
        for limit, window, target, scope in limits:
            used = self.audit.count(action.kind, _ATTEMPTS, now - window, target)
            if used >= limit:
                return f"budget exhausted: {used} of {limit} {scope} in {window / 3600:g} h"
        return None

    def budget_remaining(self) -> list[tuple[str, str, int]]:
        """(action, scope, attempts left) for the node-wide budgets, for metrics."""
        budgets = self.config.budgets
        now = self._wall()
        rows = [
            ("reset_gpu", budgets.reset_per_node, budgets.reset_per_node_window_seconds),
            ("cordon", budgets.cordon_per_node, budgets.cordon_per_node_window_seconds),
        ]
        return [
            (kind, "node", max(0, limit - self.audit.count(kind, _ATTEMPTS, now - window)))  # type: ignore[arg-type]
            for kind, limit, window in rows
        ]

    async def _precondition_failure(
        self, action: PlannedAction, snapshot: NodeSnapshot, *, dry_run: bool
    ) -> Refusal | None:
        """What stops ``action`` on this node now, for enforce and observe alike. A dry
        run (observe mode) runs nothing: no diagnostic before an uncordon."""
        if action.kind in ("cordon", "uncordon") and not self._backends:
            return Refusal("no backend configured", configured=True)
        if action.kind == "uncordon" and not dry_run:
            refused = await self._diag_before_uncordon(snapshot)
            return None if refused is None else Refusal(refused)
        if action.kind == "reset_gpu":
            return await self._reset_refusal(action, snapshot)
        return None

    async def _reset_refusal(  # noqa: PLR0911 - one exit per precondition
        self, action: PlannedAction, snapshot: NodeSnapshot
    ) -> Refusal | None:
        gpu = snapshot.gpu(action.target)
        if gpu is None or gpu.status != "ok" or gpu.readings is None:
            return Refusal(
                "the GPU does not answer; a lost GPU needs drain and reboot, not a reset"
            )
        readings = gpu.readings
        if readings.processes:
            names = ", ".join(f"{p.name} ({p.pid})" for p in readings.processes)
            return Refusal(f"the GPU is busy (NVML compute processes: {names}); waiting until idle")
        holders = await self._ops.device_holders(gpu.identity.minor_number)
        if holders:
            names = ", ".join(f"{name} ({pid})" for pid, name in holders)
            return Refusal(
                f"processes hold {gpu.identity.device} open: {names}; waiting until idle"
            )
        if readings.mig_mode_current and not self.config.reset.allow_mig:
            return Refusal("MIG is enabled: a reset would destroy its instances (reset.allow_mig)")
        if self.config.reset.require_cordon:
            if not self._backends:
                return Refusal(
                    "reset.require_cordon is set but no cordon backend is configured",
                    configured=True,
                )
            if not (self.history().cordoned_by_us or self._would_be_cordoned):
                return Refusal("the node is not cordoned (reset.require_cordon)")
        return None

    # --- performing ------------------------------------------------------------------------

    async def _perform(self, action: PlannedAction, snapshot: NodeSnapshot) -> str | None:
        kind: ActionKind = action.kind
        if kind == "report":
            return "reported"
        if kind in ("cordon", "uncordon"):
            return await self._cordon(action, snapshot)
        if kind == "enable_persistence":
            return await self._ops.enable_persistence(action.target)
        if kind in ("cap_power", "restore_power"):
            limit = action.param("limit_w")
            if not isinstance(limit, float | int):
                raise GpuOperationError("no power limit to set")
            return await self._ops.set_power_limit(action.target, float(limit))
        gpu = snapshot.gpu(action.target)
        assert gpu is not None  # checked by the preconditions
        return await self._ops.reset(action.target, gpu.identity.index)

    async def _cordon(self, action: PlannedAction, snapshot: NodeSnapshot) -> str | None:
        request = self._cordon_request(action.reason, snapshot)
        details = []
        changed = False
        for backend in self._backends:
            call = backend.cordon if action.kind == "cordon" else backend.uncordon
            result = await call(request)
            changed = changed or result.changed
            details.append(
                f"{backend.name}: {result.detail or ('done' if result.changed else 'unchanged')}"
            )
            if not result.ok:
                await self._record(action, "failed", "; ".join(details))
                return None
        if action.kind == "cordon" and not changed and not await self._owned():
            # Someone else had already taken the node out: theirs to undo, not ours.
            details.append("the node is cordoned by someone else: left alone")
            await self._record(action, "skipped", "; ".join(details))
            return None
        return "; ".join(details) or "no backend"

    async def _owned(self) -> bool:
        for backend in self._backends:
            try:
                if (await backend.state()).owned:
                    return True
            except Exception:  # noqa: BLE001, S112 - a backend that cannot tell is not proof
                continue
        return False

    def _cordon_request(self, reason: str, snapshot: NodeSnapshot) -> CordonRequest:
        problems = snapshot.health.problems()
        return CordonRequest(
            node=self._node,
            cluster=self._cluster,
            reason=reason,
            request_id=f"{self._node}:{int(self._wall() * 1000)}",
            gpus=tuple(sorted({f.gpu for f in problems if f.gpu})),
            findings=tuple((f.gpu or "", f.check, f.reason) for f in problems),
        )

    # --- after a reset ---------------------------------------------------------------------

    async def _verify(self, snapshot: NodeSnapshot) -> None:
        for bus_id, state in list(self._verifying.items()):
            gpu: GpuState | None = snapshot.gpu(bus_id)
            healthy = (
                gpu is not None
                and gpu.status == "ok"
                and snapshot.health.gpu_severity(bus_id) in (Severity.OK, Severity.WARN)
            )
            if healthy:
                state.good_polls += 1
            else:
                state.bad_polls += 1
            needed = self.config.reset.verify_polls
            action = PlannedAction("reset_gpu", bus_id, "verification after reset")
            if state.good_polls >= needed:
                del self._verifying[bus_id]
                detail = f"healthy for {needed} polls after the reset"
                level = self.config.diag.after_reset_level
                if level and gpu is not None:
                    reason = f"after the reset of {bus_id}"
                    ok, note = await self._gate(level, (gpu.identity.index,), bus_id, reason)
                    if not ok:
                        await self._escalate(bus_id, f"DCGM diagnostic after the reset: {note}")
                        continue
                    detail += f"; {note}"
                await self._record(action, "verified", detail)
            elif state.bad_polls >= needed:
                del self._verifying[bus_id]
                problems = "; ".join(f.reason for f in snapshot.health.problems(bus_id))
                await self._escalate(bus_id, f"not healthy after the reset: {problems or 'lost'}")

    async def _escalate(self, bus_id: str, why: str) -> None:
        """A reset that did not help: ask for drain and reboot, never reset this GPU again."""
        action = PlannedAction("reset_gpu", bus_id, "drain and reboot required")
        await self._record(action, "escalated", why)
        self._collect(bus_id, ESCALATED, f"reset escalated: {why}")
        if not self._backends:
            return
        cordon = PlannedAction(
            "cordon", self._node, f"GPU {bus_id}: reset did not help, drain and reboot"
        )
        cordon = dataclasses.replace(cordon, params=(("gpus", bus_id),))
        request = CordonRequest(
            node=self._node,
            cluster=self._cluster,
            reason=cordon.reason,
            request_id=f"{self._node}:{int(self._wall() * 1000)}",
            gpus=(bus_id,),
        )
        await self._record(cordon, "started")
        details = []
        ok = True
        for backend in self._backends:
            result = await backend.cordon(request)
            ok = ok and result.ok
            details.append(f"{backend.name}: {result.detail}")
        await self._record(cordon, "succeeded" if ok else "failed", "; ".join(details))

    # --- DCGM's diagnostic -------------------------------------------------------------------

    async def diagnose(
        self, level: int, gpus: tuple[int, ...], target: str, reason: str
    ) -> DiagResult:
        """Run DCGM's diagnostic and audit it (kind "diag", on ``target``): "succeeded" when
        it passed, "failed" when it failed or could not run, "skipped" when it is unavailable
        (then DiagUnavailableError is raised as well)."""
        action = PlannedAction(
            "diag", target, reason, evidence=(("level", level), ("gpus", _ids(gpus)))
        )
        if self.diag is None:
            why = "DCGM's diagnostic is not set up in this agent"
            await self._record(action, "skipped", f"unavailable: {why}")
            raise DiagUnavailableError(why)
        try:
            result = await self.diag.run(level, gpus)
        except DiagUnavailableError as exc:
            await self._record(action, "skipped", f"unavailable: {exc}")
            raise
        evidence = (
            *action.evidence,
            ("via", result.via),
            ("passed", result.passed),
            ("failed_tests", ", ".join(failed_tests(result))),
            ("error", result.error),
        )
        action = dataclasses.replace(action, evidence=evidence)
        await self._record(action, "succeeded" if result.passed else "failed", describe(result))
        return result

    async def _gate(
        self, level: int, gpus: tuple[int, ...], target: str, reason: str
    ) -> tuple[bool, str]:
        """Whether the diagnostic lets remediation go on, and a note saying why."""
        try:
            result = await self.diagnose(level, gpus, target, reason)
        except DiagUnavailableError as exc:
            allowed = self.config.diag.when_unavailable == "pass"
            verdict = "passed" if allowed else "blocked"
            return (
                allowed,
                f"DCGM diagnostic unavailable ({exc}): {verdict} (diag.when_unavailable)",
            )
        return result.passed, f"DCGM diagnostic level {level} {describe(result)}"

    async def _diag_before_uncordon(self, snapshot: NodeSnapshot) -> str | None:
        level = self.config.diag.before_uncordon_level
        if not level:
            return None
        gpus = self._cordoned_gpus(snapshot)
        ok, note = await self._gate(level, gpus, self._node, "before the uncordon")
        return None if ok else f"{note}: the node stays cordoned"

    def _cordoned_gpus(self, snapshot: NodeSnapshot) -> tuple[int, ...]:
        """The indices of the GPUs our last cordon was for; () (every GPU) when it named
        none or none of them is still known."""
        cordon = self.audit.last("cordon", None, ("succeeded",))
        params = cordon.evidence.get("params") if cordon is not None else None
        listed = params.get("gpus") if isinstance(params, dict) else None
        if not isinstance(listed, str):
            return ()
        indices = set()
        for bus in filter(None, listed.split(",")):
            gpu = snapshot.gpu(bus)
            if gpu is not None:
                indices.add(gpu.identity.index)
        return tuple(sorted(indices))


def _ids(gpus: tuple[int, ...]) -> str:
    return ",".join(str(g) for g in gpus) or "all"
