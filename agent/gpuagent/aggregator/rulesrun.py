"""The fleet rules at work in the aggregator: facts judged as they are committed, findings
stored and audited, and what a finding asks of the aggregator done.

Remediation that does not work stops: the node is told to go to observe mode (the
allowlisted `set_remediation_mode` command, stored and audited like any other), and its
finding stays open, paged (`gpuagent_fleet_remediation_stopped`), until a person clears it.
Clearing puts the node back in the mode it had, and only if the aggregator is what
changed it. A command the broker could not take is tried again at the next tick.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final

from gpuagent.aggregator.commands import command
from gpuagent.aggregator.fleetrules import FleetRules, RuleFinding
from gpuagent.aggregator.ingest import Ingest, Outgoing
from gpuagent.aggregator.records import status_of
from gpuagent.aggregator.store import FleetStore

log = logging.getLogger(__name__)
audit = logging.getLogger("gpuagent.aggregator.audit")

TICK_SECONDS: Final = 0.5
# With a shared database: how often the findings other aggregators raised or cleared are
# read (the metrics and the API of each show them all).
REFRESH_SECONDS: Final = 10.0
OBSERVE: Final = "observe"


class RulesRunner:
    def __init__(
        self,
        rules: FleetRules,
        ingest: Ingest,
        store: FleetStore,
        *,
        publish: Callable[[Outgoing], Awaitable[None]],
        prefix: str,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.rules = rules
        self.ingest = ingest
        self.store = store
        self.publish = publish
        self.prefix = prefix
        self.clock = clock
        # Findings whose mode command has still to reach the broker: (finding, mode).
        self._unsent: list[tuple[RuleFinding, str]] = []

    async def restore(self) -> None:
        """The open findings, and the cleared ones recent enough to matter, as stored."""
        window = self.rules.config.remediation_window_seconds
        self.rules.load(reversed(await self.store.rule_findings(since=self.clock() - window)))
        self.rules.load(await self.store.rule_findings())

    async def run(self) -> None:
        next_refresh = time.monotonic() + REFRESH_SECONDS
        while True:
            await asyncio.sleep(TICK_SECONDS)
            await self.tick()
            if self.store.shared and time.monotonic() >= next_refresh:
                next_refresh = time.monotonic() + REFRESH_SECONDS
                since = self.clock() - 2 * REFRESH_SECONDS
                self.rules.load(reversed(await self.store.rule_findings(since=since)))

    async def tick(self) -> None:
        """Judge the facts committed since the last tick; send what could not be sent."""
        facts, self.ingest.facts = self.ingest.facts, []
        for fact in facts:
            for finding in await self.rules.judge(fact):
                await self._raised(finding)
        unsent, self._unsent = self._unsent, []
        for finding, mode in unsent:
            await self._set_mode(finding, mode)

    async def _raised(self, finding: RuleFinding) -> None:
        audit.info(
            "fleet rule %s: cluster=%s node=%s gpu=%s finding=%s: %s",
            finding.rule,
            finding.cluster,
            finding.node,
            finding.gpu or "-",
            finding.id,
            finding.summary,
        )
        if finding.rule == "remediation_not_working":
            mode = await self._mode_of(finding.cluster, finding.node)
            finding.done["mode_before"] = mode
            if mode is not None and mode != OBSERVE:
                await self._set_mode(finding, OBSERVE)
        self.store.queue_finding(finding)

    async def _mode_of(self, cluster: str, node: str) -> str | None:
        """The node's remediation mode, as its last state report said."""
        status = status_of(await self.store.node_document(cluster, node))
        remediation = status.get("remediation") if status else None
        mode = remediation.get("mode") if isinstance(remediation, dict) else None
        return mode if isinstance(mode, str) else None

    async def _set_mode(self, finding: RuleFinding, mode: str) -> None:
        out, message = command(
            self.prefix, finding.cluster, finding.node, "set_remediation_mode", {"mode": mode}
        )
        try:
            await self.publish(out)
        except ConnectionError as exc:
            log.warning(
                "fleet rule %s: cannot tell %s to go to %s mode yet (%s); trying again",
                finding.rule,
                finding.node,
                mode,
                exc,
            )
            self._unsent.append((finding, mode))
            return
        self.store.queue_command(message)
        finding.done["mode_set"] = mode
        finding.done["command"] = message["id"]
        self.store.queue_finding(finding)
        audit.info(
            "command sent: node=%s cluster=%s command=set_remediation_mode mode=%s id=%s "
            "(fleet rule finding %s)",
            finding.node,
            finding.cluster,
            mode,
            message["id"],
            finding.id,
        )

    async def clear(self, finding_id: str, *, by: str, reason: str) -> dict[str, Any]:
        """A person clears an open finding (KeyError: none open with that id). A node the
        aggregator put in observe mode goes back to the mode it had."""
        finding = self.rules.clear(finding_id, by=by, reason=reason, now=self.clock())
        self._unsent = [(f, m) for f, m in self._unsent if f.id != finding_id]
        audit.info("fleet rule finding cleared: %s by %s: %s", finding.id, by, json.dumps(reason))
        before = finding.done.get("mode_before")
        ours = finding.done.get("mode_set") == OBSERVE and isinstance(before, str)
        # Only what we did is undone: not a mode a person set since.
        if ours and await self._mode_of(finding.cluster, finding.node) == OBSERVE:
            await self._set_mode(finding, str(before))
        self.store.queue_finding(finding)
        return finding.json()
