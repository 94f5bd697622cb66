"""Rules over each GPU's and node's history: a repeat offender, remediation that does not
work, a die defect suspected (docs/fleet.md#fleet-rules).

The rules read facts (`facts`: what nodes reported, in `gpu_history`).

Each fact is judged once, after the batch that stored it is committed, by reading the rows
of its own GPU or node within the rule's window (an index each): a rule costs the same
with a day of history as with a year, and several aggregators sharing one database see
each other's facts. What the rules conclude goes to `rule_findings`, which no rule reads:
a conclusion never becomes the input of another, and once the sources stop nothing more
follows. A finding's id names its rule, GPU or node and the fact that raised it, so two
aggregators judging the same fact store one finding.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from gpuagent.aggregator.facts import Fact, FactKind
from gpuagent.config.schema.aggregator import RulesSection

Rule = Literal["repeat_offender", "remediation_not_working", "die_defect"]
RULES: Final[tuple[Rule, ...]] = ("repeat_offender", "remediation_not_working", "die_defect")

# Rows one rule reads at most: enough for any threshold a person would set.
READ_LIMIT: Final = 1000

_FACTS_OF_GPU = (
    "SELECT time, node, body FROM gpu_history WHERE gpu = ? AND kind = ? "
    "AND time >= ? AND time <= ? ORDER BY time DESC LIMIT ?"
)
_FACTS_OF_NODE = (
    "SELECT time, node, body FROM gpu_history WHERE cluster = ? AND node = ? AND kind = ? "
    "AND time >= ? AND time <= ? ORDER BY time DESC LIMIT ?"
)
# The node's own facts (its node-level findings; gpu = ''), not its GPUs'.
_OWN_FACTS_OF_NODE = (
    "SELECT time, node, body FROM gpu_history WHERE cluster = ? AND node = ? AND kind = ? "
    "AND time >= ? AND time <= ? AND gpu = '' ORDER BY time DESC LIMIT ?"
)
SELECT_OPEN = "SELECT body FROM rule_findings WHERE state = 'open' ORDER BY time DESC LIMIT ?"
SELECT_RECENT = "SELECT body FROM rule_findings WHERE time >= ? ORDER BY time DESC LIMIT ?"
SELECT_FINDING = "SELECT body FROM rule_findings WHERE id = ?"
# A finding's row is written again when it is cleared.
INSERT_FINDING = (
    "INSERT INTO rule_findings (id, cluster, node, gpu, rule, state, time, body) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET state = excluded.state, "
    "time = excluded.time, body = excluded.body"
)
Read = Callable[[str, tuple[Any, ...]], Awaitable[list[Any]]]


@dataclass(slots=True)
class RuleFinding:
    id: str
    rule: Rule
    cluster: str
    node: str
    gpu: str  # UUID; "" for the node
    time: float  # when the fact that raised it happened
    summary: str
    recommendation: str
    evidence: dict[str, Any]
    state: Literal["open", "cleared"] = "open"
    cleared: dict[str, Any] | None = None  # time, by, reason
    # What the aggregator did for it (remediation_not_working: the node's previous mode).
    done: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        rule: Rule,
        fact: Fact,
        summary: str,
        recommendation: str,
        evidence: dict[str, Any],
        *,
        gpu: str | None = None,
    ) -> RuleFinding:
        """What ``fact`` raised: its id names the rule and the fact; on the fact's GPU
        unless ``gpu`` says otherwise ("": the node's)."""
        return cls(f"{rule}/{fact.id}", rule, fact.cluster, fact.node,
                   fact.gpu if gpu is None else gpu, fact.time, summary, recommendation,
                   evidence)  # fmt: skip

    def json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "rule": self.rule,
            "cluster": self.cluster,
            "node": self.node,
            "gpu": self.gpu,
            "time": self.time,
            "state": self.state,
            "summary": self.summary,
            "recommendation": self.recommendation,
            "evidence": self.evidence,
            "cleared": self.cleared,
            "done": self.done,
        }

    def row(self) -> tuple[Any, ...]:
        when = self.cleared["time"] if self.cleared else self.time
        body = json.dumps(self.json(), separators=(",", ":"))
        return (self.id, self.cluster, self.node, self.gpu, self.rule, self.state, when, body)


def finding_from_json(doc: dict[str, Any]) -> RuleFinding:
    return RuleFinding(
        id=doc["id"],
        rule=doc["rule"],
        cluster=doc["cluster"],
        node=doc["node"],
        gpu=doc["gpu"],
        time=float(doc["time"]),
        summary=doc["summary"],
        recommendation=doc["recommendation"],
        evidence=doc.get("evidence") or {},
        state=doc.get("state", "open"),
        cleared=doc.get("cleared"),
        done=doc.get("done") or {},
    )


def _days(seconds: float) -> str:
    return f"{seconds / 86400:g} days" if seconds >= 86400 else f"{seconds / 3600:g} h"


class FleetRules:
    """Judges facts (`judge`), keeps the open findings in memory (there are few)."""

    def __init__(
        self, config: RulesSection, read: Read, clock: Callable[[], float] = time.time
    ) -> None:
        self.config = config
        self.read = read
        self.clock = clock
        self.open: dict[str, RuleFinding] = {}
        # (cluster, node) -> when a person last cleared its remediation finding: attempts
        # before it do not count again.
        self.last_cleared: dict[tuple[str, str], float] = {}
        # Seconds each judgement took (read by the metrics, then emptied).
        self.judged: list[float] = []

    def load(self, docs: Iterable[dict[str, Any]]) -> None:
        """Take findings as stored (at start, and from other aggregators): the open ones,
        and when each node's remediation finding was last cleared."""
        for doc in docs:
            finding = finding_from_json(doc)
            if finding.state == "open":
                self.open.setdefault(finding.id, finding)
                continue
            self.open.pop(finding.id, None)
            if finding.rule == "remediation_not_working" and finding.cleared:
                key = (finding.cluster, finding.node)
                when = float(finding.cleared["time"])
                self.last_cleared[key] = max(self.last_cleared.get(key, when), when)

    def clear(self, finding_id: str, *, by: str, reason: str, now: float) -> RuleFinding:
        """A person says the finding is dealt with; KeyError if it is not open."""
        finding = self.open.pop(finding_id)
        finding.state = "cleared"
        finding.cleared = {"time": now, "by": by, "reason": reason}
        if finding.rule == "remediation_not_working":
            self.last_cleared[(finding.cluster, finding.node)] = now
        return finding

    def open_for(self, rule: Rule, cluster: str, node: str, gpu: str = "") -> RuleFinding | None:
        for finding in self.open.values():
            if (finding.rule, finding.cluster, finding.node, finding.gpu) == (
                rule, cluster, node, gpu,
            ):  # fmt: skip
                return finding
        return None

    def _open_for_gpu(self, rule: Rule, gpu: str, key: str = "") -> RuleFinding | None:
        for finding in self.open.values():
            if (
                finding.rule == rule
                and finding.gpu == gpu
                and finding.evidence.get("key", "") == key
            ):
                return finding
        return None

    async def judge(self, fact: Fact) -> list[RuleFinding]:
        """New findings ``fact`` raises (its rows and those before it are committed)."""
        began = time.perf_counter()
        try:
            if fact.kind == "critical":
                found = await self._repeat_offender(fact)
            elif fact.kind == "action":
                found = await self._remediation_not_working(fact)
            elif fact.kind == "xid13":
                found = await self._die_defect(fact)
            else:
                found = None
        finally:
            self.judged.append(time.perf_counter() - began)
        if found is None or found.id in self.open:
            return []
        self.open[found.id] = found
        return [found]

    async def _gpu_facts(
        self, gpu: str, kind: FactKind, since: float, until: float, limit: int = READ_LIMIT
    ) -> list[Any]:
        """The GPU's facts of ``kind`` between the times, the latest first."""
        return await self.read(_FACTS_OF_GPU, (gpu, kind, since, until, limit))

    async def _history(self, fact: Fact, kind: FactKind, since: float, until: float) -> list[Any]:
        """The latest of ``kind`` of the fact's GPU (or, for a node fact, of the node)."""
        if fact.gpu:
            return await self._gpu_facts(fact.gpu, kind, since, until, 1)
        args = (fact.cluster, fact.node, kind, since, until, 1)
        return await self.read(_OWN_FACTS_OF_NODE, args)

    async def _repeat_offender(self, fact: Fact) -> RuleFinding | None:
        if (
            self._open_for_gpu("repeat_offender", fact.gpu)
            if fact.gpu
            else self.open_for("repeat_offender", fact.cluster, fact.node)
        ) is not None:
            return None
        window = self.config.repeat_window_seconds
        recoveries = await self._history(fact, "recovered", fact.time - window, fact.time)
        if not recoveries:
            return None
        recovered_at, recovered_on, _ = recoveries[0]
        before = await self._history(fact, "critical", recovered_at - window, recovered_at)
        evidence_rows = (
            await self._gpu_facts(fact.gpu, "evidence", 0.0, fact.time, 1) if fact.gpu else []
        )
        evidence: dict[str, Any] = {
            "critical": {"time": fact.time, **fact.detail},
            "recovered": {"time": float(recovered_at), "node": recovered_on},
        }
        if before:
            t, on, body = before[0]
            evidence["previous"] = {"time": float(t), "node": on, **json.loads(body)}
        if evidence_rows:
            t, on, body = evidence_rows[0]
            evidence["rma_bundle"] = {"time": float(t), "node": on, **json.loads(body)}
        index = fact.detail.get("index")
        gap = (fact.time - float(recovered_at)) / 3600
        reason = fact.detail.get("reason") or "CRITICAL"
        if not fact.gpu:
            return RuleFinding.of(
                "repeat_offender",
                fact,
                f"{fact.node} is CRITICAL again {gap:.1f} h after it recovered "
                f"(the node, not one GPU): {reason}",
                f"repair the node: failing again within {_days(window)} of a recovery, by "
                "its own findings (its board, PCIe switches, NVSwitches, fabric), makes it a "
                "repeat offender; take it out of service",
                evidence,
            )
        bundle = (
            f"the node's RMA evidence bundle: {evidence['rma_bundle'].get('detail')}"
            if "rma_bundle" in evidence
            else "no RMA evidence bundle came from the node: run nvidia-bug-report.sh there "
            "before the GPU is pulled"
        )
        return RuleFinding.of(
            "repeat_offender",
            fact,
            f"GPU {index} ({fact.gpu}) on {fact.node} is CRITICAL again {gap:.1f} h after it "
            f"recovered: {reason}",
            f"replace the GPU: a GPU failing again within {_days(window)} of a recovery is a "
            f"repeat offender; {bundle}",
            evidence,
        )

    async def _remediation_not_working(self, fact: Fact) -> RuleFinding | None:
        if self.open_for("remediation_not_working", fact.cluster, fact.node) is not None:
            return None
        window = self.config.remediation_window_seconds
        # Attempts before a person last cleared this node's finding do not count again.
        since = max(fact.time - window, self._cleared_at(fact.cluster, fact.node))
        rows = await self.read(
            _FACTS_OF_NODE,
            (fact.cluster, fact.node, "action", since, fact.time, READ_LIMIT),
        )
        attempts = [json.loads(body) | {"time": float(t)} for t, _, body in rows]
        if len(attempts) < self.config.remediation_attempts:
            return None
        kinds = sorted({str(a.get("action")) for a in attempts})
        return RuleFinding.of(
            "remediation_not_working",
            fact,
            f"{len(attempts)} automatic remediation attempts ({', '.join(kinds)}) on "
            f"{fact.node} within {_days(window)}: remediation is not fixing it",
            "automatic remediation is stopped for this node (observe mode) until a person "
            "clears this finding; take the node out of service and investigate "
            "(gpuagent-aggregator rules clear ID --reason TEXT when done)",
            {"attempts": attempts[: self.config.remediation_attempts * 4]},
            gpu="",  # the node's finding, whichever GPUs the attempts were on
        )

    def _cleared_at(self, cluster: str, node: str) -> float:
        return self.last_cleared.get((cluster, node), float("-inf"))

    async def _die_defect(self, fact: Fact) -> RuleFinding | None:
        gpc, tpc = fact.detail["gpc"], fact.detail["tpc"]
        key = f"GPC {gpc}, TPC {tpc}"
        if self._open_for_gpu("die_defect", fact.gpu, key) is not None:
            return None
        window = self.config.die_defect_window_seconds
        rows = await self._gpu_facts(fact.gpu, "xid13", fact.time - window, fact.time)
        same = [
            {"time": float(t), **detail}
            for t, _, body in rows
            if (detail := json.loads(body)).get("gpc") == gpc and detail.get("tpc") == tpc
        ]
        if len(same) < self.config.die_defect_count:
            return None
        return RuleFinding.of(
            "die_defect",
            fact,
            f"{len(same)} Xid 13 on {key} of GPU {fact.gpu} on {fact.node} within "
            f"{_days(window)}: a die defect is suspected",
            "one application's bad kernel hits any GPC; the same GPC and TPC again points at "
            "the GPU: drain it, run DCGM diagnostics (level 3) and open an RMA if they fail",
            {"key": key, "xid13": same[: self.config.die_defect_count * 4]},
        )
