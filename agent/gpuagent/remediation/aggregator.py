"""The "aggregator" cordon backend: the fleet's circuit breaker.

Before the node is taken out of scheduling, the aggregator (which sees the whole fleet)
must approve: it denies once too many nodes of the cluster were cordoned within its window.
Listed first in `remediation.cordon.backends`, a denial stops the backends after it (the
executor stops at the first backend that fails), so Slurm or Kubernetes is never asked.
Messages: docs/fleet.md.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from gpuagent.remediation.types import CordonRequest, CordonResult, CordonState

# (request, "cordon" or "uncordon", seconds to wait) -> the decision; TimeoutError: none.
Ask = Callable[[CordonRequest, str, float], Awaitable[dict[str, Any]]]


class AggregatorBackend:
    name = "aggregator"

    def __init__(self, ask: Ask, *, timeout: float) -> None:
        self._ask = ask
        self._timeout = timeout
        self._approved = False  # the aggregator holds a cordon slot for us

    async def _decide(self, request: CordonRequest, action: str) -> CordonResult:
        try:
            async with asyncio.timeout(self._timeout):
                decision = await self._ask(request, action, self._timeout)
        except TimeoutError:
            return CordonResult(
                ok=False,
                changed=False,
                detail=f"no decision from the aggregator within {self._timeout:g} s",
            )
        verdict = decision.get("decision")
        reason = str(decision.get("reason", ""))
        if verdict != "approved":
            retry = decision.get("retry_after_seconds")
            after = f" (retry after {retry:.0f} s)" if isinstance(retry, int | float) else ""
            return CordonResult(ok=False, changed=False, detail=f"{verdict}: {reason}{after}")
        changed = self._approved != (action == "cordon")
        self._approved = action == "cordon"
        return CordonResult(ok=True, changed=changed, detail=f"approved: {reason}")

    async def cordon(self, request: CordonRequest) -> CordonResult:
        return await self._decide(request, "cordon")

    async def uncordon(self, request: CordonRequest) -> CordonResult:
        return await self._decide(request, "uncordon")

    async def state(self) -> CordonState:
        return CordonState(cordoned=self._approved, owned=self._approved)
