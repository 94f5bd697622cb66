"""Acknowledgements: an operator's word that a finding is known and has been dealt with.

`gpuagent ack --gpu N [--check C] --reason TEXT` (root, audited) takes the GPU's findings
that are not OK (or only check C's) and holds each at OK, saying who acknowledged it and
why, until its fault comes again:

- it gets worse (a higher severity than the one acknowledged);
- an event of a kind its check reads arrives after the acknowledgement (a new XID, GSP
  message, AER report or bus event; for a check that owns an XID's fault, that XID);
- or it clears on its own: the acknowledgement has done its job, and the next such fault
  is a new one.

A finding held at OK is one the outputs no longer count: its alert resolves, the
Kubernetes condition clears, and `remediation.uncordon_after_recovery` may uncordon. The
book is kept in ``acks.json`` in `agent.state_dir`, so a restart does not bring an
acknowledged alert back (after a start, an acknowledgement read from the file waits
`STARTUP_GRACE_SECONDS` for its finding to show again before it counts as cleared).
A book that cannot be written still holds in memory; why it cannot is logged.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from gpuagent.checks.same_fault import SAME_FAULTS
from gpuagent.model import Finding, GpuEvent, NodeHealth, Severity
from gpuagent.remediation.audit import AuditError, AuditStore
from gpuagent.remediation.types import PlannedAction
from gpuagent.textfile import write_atomically

log = logging.getLogger("gpuagent.acks")

FILE_NAME = "acks.json"
# How long after a start an acknowledgement read from the file waits for its finding to
# show again (the kernel log read again, the first polls) before it counts as cleared.
STARTUP_GRACE_SECONDS = 300.0
# The event kinds each event-reading check judges: one after the acknowledgement is its
# fault coming again.
_CHECK_KINDS: dict[str, frozenset[str]] = {
    "xid": frozenset({"xid", "gsp"}),
    "aer": frozenset({"aer"}),
    "bus": frozenset({"fallen_off_bus", "gpu_removed", "driver_unbound"}),
}
# Checks that own an XID's fault (gpuagent.checks.same_fault): that XID again is the fault.
_OWNED_XIDS: dict[str, frozenset[int]] = {}
for _same in SAME_FAULTS:
    _OWNED_XIDS[_same.owner] = _OWNED_XIDS.get(_same.owner, frozenset()) | _same.xids

_Key = tuple[str, str, str]  # (GPU bus id, check, cause): a finding's identity on a GPU


@dataclass(frozen=True, slots=True)
class Ack:
    gpu: str
    check: str
    cause: str
    severity: str  # the severity acknowledged (its name); worse brings the finding back
    time: float  # wall clock: events after it are the fault again
    reason: str  # the operator's words
    by: str  # who: "root (uid 0)", "aggregator", ...

    @property
    def key(self) -> _Key:
        return (self.gpu, self.check, self.cause)


class AckError(ValueError):
    """An acknowledgement that cannot be made; the text says why."""


class AckBook:
    def __init__(
        self, state_dir: Path | None, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._dir = state_dir
        self._clock = clock
        self._acks: dict[_Key, Ack] = {}
        self._by_gpu: dict[str, set[_Key]] = {}
        # Held in this process at least once: only those can be seen to clear. One read
        # from the file waits for its finding for a while after a start, as the kernel
        # log's records of it are read again.
        self._held: set[_Key] = set()
        self._loaded_at = clock()
        self.error = ""  # why the book cannot be written, while it cannot
        if state_dir is not None:
            self._load(state_dir / FILE_NAME)

    def __len__(self) -> int:
        return len(self._acks)

    def acks(self) -> tuple[Ack, ...]:
        return tuple(self._acks.values())

    async def acknowledge(
        self,
        audit: AuditStore,
        health: NodeHealth,
        bus_id: str,
        check: str | None,
        *,
        reason: str,
        by: str,
    ) -> str:
        """Acknowledge GPU ``bus_id``'s findings in ``health`` (only ``check``'s when
        given): each audited first, then held. AckError when there is nothing to
        acknowledge, no reason, or no audit trail to write to."""
        chosen = [f for f in health.problems(bus_id) if check is None or f.check == check]
        if not chosen:
            which = f"{check} finding" if check else "finding that is not OK"
            raise AckError(f"GPU {bus_id} has no {which} to acknowledge")
        if not reason.strip():
            raise AckError("an acknowledgement needs a reason (--reason TEXT)")
        for finding in chosen:
            what = (("finding", finding.reason), ("by", by))
            action = PlannedAction(
                "acknowledge", bus_id, reason, finding.check, finding.severity.name, what
            )
            try:
                await audit.record(action, "succeeded", mode="operator")
            except AuditError as exc:
                raise AckError(f"not acknowledged: {exc}") from None
        self.add(chosen, reason, by, time.time())
        return "acknowledged " + "; ".join(f"{f.check} ({f.severity.name})" for f in chosen)

    def add(self, findings: Iterable[Finding], reason: str, by: str, now: float) -> list[Ack]:
        """Acknowledge ``findings`` (the not-OK ones on a GPU); the acknowledgements made."""
        reason = reason.strip()
        if not reason:
            raise AckError("an acknowledgement needs a reason (--reason TEXT)")
        made = []
        for finding in findings:
            if finding.gpu is None or finding.severity is Severity.OK or finding.masked:
                continue
            ack = Ack(
                finding.gpu,
                finding.check,
                finding.cause,
                finding.severity.name,
                now,
                reason,
                by,
            )
            self._put(ack)
            self._held.add(ack.key)  # made from the finding as it stands: it can clear
            made.append(ack)
        if made:
            self._save()
        return made

    def offer_event(self, event: GpuEvent) -> None:
        """A new event: the fault of any acknowledgement it concerns came again."""
        keys = self._by_gpu.get(event.gpu or "")
        if not keys:
            return
        again = [
            key
            for key in keys
            if _is_fault_again(self._acks[key], event) and event.time > self._acks[key].time
        ]
        for key in again:
            log.info("acknowledgement of %s %s lifted: %s", key[0], key[1], event.line[:200])
            self._drop(key)
        if again:
            self._save()

    def apply(self, health: NodeHealth) -> NodeHealth:
        """``health`` with acknowledged findings held at OK; acknowledgements whose finding
        cleared or got worse are dropped."""
        if not self._acks:
            return health
        seen: set[_Key] = set()
        worse: set[_Key] = set()
        findings = []
        for finding in health.findings:
            key = (finding.gpu or "", finding.check, finding.cause)
            ack = self._acks.get(key)
            if ack is None or finding.severity is Severity.OK or finding.masked:
                findings.append(finding)
                continue
            if finding.severity.rank > Severity[ack.severity].rank:
                log.info("acknowledgement of %s %s lifted: it got worse", key[0], key[1])
                worse.add(key)
                findings.append(finding)
                continue
            seen.add(key)
            findings.append(_held(finding, ack))
        self._held |= seen
        waiting = self._clock() - self._loaded_at < STARTUP_GRACE_SECONDS
        gone = [
            key
            for key in self._acks
            if key in worse or (key not in seen and (key in self._held or not waiting))
        ]
        for key in gone:
            self._drop(key)
        if gone:
            self._save()
        return NodeHealth(tuple(findings))

    def _put(self, ack: Ack) -> None:
        self._acks[ack.key] = ack
        self._by_gpu.setdefault(ack.gpu, set()).add(ack.key)

    def _drop(self, key: _Key) -> None:
        self._acks.pop(key, None)
        self._held.discard(key)
        keys = self._by_gpu.get(key[0])
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._by_gpu[key[0]]

    def _load(self, path: Path) -> None:
        try:
            document = json.loads(path.read_text())
            for item in document["acks"]:
                self._put(Ack(**item))
        except FileNotFoundError:
            return
        except (OSError, ValueError, KeyError, TypeError) as exc:
            # Lost acknowledgements bring their alerts back: loud, never silent.
            log.warning("cannot read the acknowledgements in %s: %s", path, exc)

    def _save(self) -> None:
        if self._dir is None:
            return
        data = json.dumps({"acks": [asdict(a) for a in self._acks.values()]}, indent=1)
        try:
            write_atomically(self._dir, FILE_NAME, data.encode())
            self.error = ""
        except OSError as exc:
            self.error = f"cannot write {self._dir / FILE_NAME}: {exc.strerror or exc}"
            log.warning("%s", self.error)


def _is_fault_again(ack: Ack, event: GpuEvent) -> bool:
    if event.kind in _CHECK_KINDS.get(ack.check, ()):
        return True
    return event.kind == "xid" and event.code in _OWNED_XIDS.get(ack.check, ())


def _held(finding: Finding, ack: Ack) -> Finding:
    return replace(
        finding,
        severity=Severity.OK,
        reason=f"acknowledged by {ack.by}: {ack.reason} (was {ack.severity}: {finding.reason})",
        action="none",
        evidence=(
            *finding.evidence,
            ("acknowledged", True),
            ("acknowledged_reason", ack.reason),
            ("acknowledged_at", ack.time),
        ),
    )
